//! The codec of the generated stubs: prost's, with 1 KiB buffers instead of tonic's
//! 8 KiB.
//!
//! tonic gives every RPC its encode and decode buffers up front, whatever its messages
//! are. A `Lease` stream's messages are a few hundred bytes (a key is at most 512), and
//! one sidecar serves up to `--max-sessions` (10,000) streams at once: 16 KiB each was
//! 160 MiB of buffers at that count, most of the sidecar's memory. A larger message
//! (a holder's value, up to the contract's limit) grows the buffer as before, in steps
//! of the buffer size; a client sees no difference on the wire.
//!
//! Its decoder also keeps one bad request from ending a session. Prost refuses a whole
//! message when a `string` field is not UTF-8 (a JavaScript string cut inside a
//! surrogate pair makes one), and tonic then ends the stream: the session and every
//! lock it held would go. A `LeaseRequest` that is well-formed protobuf but for that
//! is *salvaged* instead ([`Salvage`]): it reaches the API as the same command with its
//! request id and its key marked [`UNREADABLE`], and is answered `Rejected`
//! INVALID_ARGUMENT; the session goes on.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;
use tonic_prost::prost::{self, Message};

use super::{
    Acquire, AcquireAll, DescribeRequest, DescribeResponse, LeaseRequest, LeaseResponse, Proclaim,
    Release, WatchRequest, WatchResponse, lease_request,
};

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
    U: Message + Default + Salvage + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LeanDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        LeanDecoder(PhantomData)
    }
}

/// Prost's decoder, with [`Salvage`] for a message it refuses.
#[derive(Debug)]
pub struct LeanDecoder<U>(PhantomData<U>);

impl<U: Message + Default + Salvage> Decoder for LeanDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        use prost::bytes::Buf;
        // The message's bytes without a copy (tonic's buffer is one contiguous piece).
        let bytes = buf.copy_to_bytes(buf.remaining());
        match U::decode(bytes.clone()) {
            Ok(message) => Ok(Some(message)),
            Err(error) => match U::salvage(&bytes) {
                Some(message) => {
                    tracing::debug!(%error, "a request that cannot be decoded is answered Rejected");
                    Ok(Some(message))
                }
                // As prost's decoder answers (INTERNAL, per gRPC's status code guide).
                None => Err(Status::internal(error.to_string())),
            },
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        settings()
    }
}

/// What a message that prost refuses can still be read as.
pub trait Salvage: Sized {
    /// The message, with whatever could not be decoded marked; `None`: nothing.
    fn salvage(_bytes: &[u8]) -> Option<Self> {
        None
    }
}

impl Salvage for LeaseResponse {}
impl Salvage for DescribeRequest {}
impl Salvage for DescribeResponse {}
impl Salvage for WatchRequest {}
impl Salvage for WatchResponse {}

/// The start of the key of a salvaged command, before what could be read of the
/// real key: NUL, which no valid key holds, so a salvaged command can never be granted
/// even where nothing looks for the mark. The API answers it `Rejected`
/// INVALID_ARGUMENT.
pub const UNREADABLE: char = '\0';

/// A `LeaseRequest` read leniently: every command's `request_id` and its key as bytes;
/// other fields are skipped.
#[derive(Clone, PartialEq, prost::Message)]
struct LenientRequest {
    #[prost(message, optional, tag = "1")]
    acquire: Option<LenientCommand>,
    #[prost(message, optional, tag = "2")]
    release: Option<LenientCommand>,
    #[prost(message, optional, tag = "3")]
    proclaim: Option<LenientCommand>,
    /// An `AcquireAll`: its request id and its keys (field 2, repeated, as its first).
    #[prost(message, optional, tag = "4")]
    acquire_all: Option<LenientAll>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LenientAll {
    #[prost(uint64, tag = "1")]
    request_id: u64,
    #[prost(bytes = "vec", repeated, tag = "2")]
    keys: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LenientCommand {
    #[prost(uint64, tag = "1")]
    request_id: u64,
    #[prost(bytes = "vec", tag = "2")]
    key: Vec<u8>,
}

impl Salvage for LeaseRequest {
    fn salvage(bytes: &[u8]) -> Option<Self> {
        use lease_request::Command;
        let lenient = LenientRequest::decode(bytes).ok()?;
        let marked = |c: &LenientCommand| {
            let readable = String::from_utf8_lossy(&c.key[..c.key.len().min(64)]);
            (c.request_id, format!("{UNREADABLE}{readable}"))
        };
        let command = if let Some(c) = &lenient.acquire {
            let (request_id, key) = marked(c);
            Command::Acquire(Acquire {
                request_id,
                key,
                ..Acquire::default()
            })
        } else if let Some(c) = &lenient.release {
            let (request_id, key) = marked(c);
            Command::Release(Release {
                request_id,
                key,
                ..Release::default()
            })
        } else if let Some(c) = &lenient.proclaim {
            let (request_id, key) = marked(c);
            Command::Proclaim(Proclaim {
                request_id,
                key,
                ..Proclaim::default()
            })
        } else if let Some(all) = &lenient.acquire_all {
            let first = LenientCommand {
                request_id: all.request_id,
                key: all.keys.first().cloned().unwrap_or_default(),
            };
            let (request_id, key) = marked(&first);
            Command::AcquireAll(AcquireAll {
                request_id,
                keys: vec![key],
                ..AcquireAll::default()
            })
        } else {
            return None;
        };
        Some(Self {
            command: Some(command),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::codec::{Decoder, Encoder};

    /// An Acquire whose holder is not UTF-8 (a lone surrogate encoded as WTF-8).
    fn unreadable_acquire() -> Vec<u8> {
        let mut message = LeaseRequest {
            command: Some(lease_request::Command::Acquire(Acquire {
                request_id: 7,
                key: "k".into(),
                holder: "hh".into(),
                ..Acquire::default()
            })),
        }
        .encode_to_vec();
        let at = message.len() - 2;
        message[at..].copy_from_slice(&[0xed, 0xa0]);
        message
    }

    #[test]
    fn a_request_prost_refuses_is_salvaged_with_its_id_and_a_marked_key() {
        let bytes = unreadable_acquire();
        assert!(LeaseRequest::decode(bytes.as_slice()).is_err());
        let salvaged = LeaseRequest::salvage(&bytes).expect("salvaged");
        let Some(lease_request::Command::Acquire(a)) = salvaged.command else {
            panic!("{salvaged:?}");
        };
        assert_eq!((a.request_id, a.key.as_str()), (7, "\0k"));
        assert_eq!(a.holder, "");
        assert!(
            LeaseRequest::salvage(&[0xff, 0xff]).is_none(),
            "not protobuf at all"
        );
    }

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
