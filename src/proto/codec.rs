//! The codec of the generated stubs: prost's, with 1 KiB buffers instead of tonic's
//! 8 KiB.
//!
//! tonic gives every RPC its encode and decode buffers up front, whatever its messages
//! are. A `Lease` stream's messages are a few hundred bytes (a key is at most 512), and
//! one sidecar serves up to `--max-sessions` (10,000) streams at once: 16 KiB each was
//! 160 MiB of buffers at that count, most of the sidecar's memory. A larger message
//! (a holder's value, up to the contract's limit) grows the buffer as before, in steps
//! of the buffer size; a client sees no difference on the wire.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::prost::Message;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Bytes of each buffer an RPC starts with.
const BUFFER_BYTES: usize = 1024;
/// How much a streaming RPC batches before it yields: tonic's default, kept.
const YIELD_THRESHOLD: usize = 32 * 1024;

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

/// Prost's codec with [`BUFFER_BYTES`] buffers (the generated code names it in
/// `build.rs`).
#[derive(Debug)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(settings())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    /// The stubs' buffers are the small ones (tonic's default is 8 KiB each).
    /// `BufferSettings` shows its fields only through `Debug`.
    #[test]
    fn buffers_start_small() {
        type Lease = LeanCodec<crate::proto::LeaseResponse, crate::proto::LeaseRequest>;
        let mut codec = Lease::default();
        let wanted = format!("buffer_size: {BUFFER_BYTES},");
        let encoder = format!("{:?}", codec.encoder().buffer_settings());
        let decoder = format!("{:?}", codec.decoder().buffer_settings());
        assert!(encoder.contains(&wanted), "{encoder}");
        assert!(decoder.contains(&wanted), "{decoder}");
    }
}
