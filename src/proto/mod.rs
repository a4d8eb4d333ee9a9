//! The contract: the gRPC types and stubs generated from
//! `proto/lockside/v1/lockside.proto` (package `lockside.v1`), and in [`limits`] the
//! values that the `.proto` states in its comments ([`codec`]: the stubs' codec, prost's
//! with smaller buffers). The engine, the API and the Rust
//! client take those values from here, so the contract is written down once.

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("lockside.v1");
}

pub use generated::*;

pub mod codec;
pub mod limits;

/// The encoded descriptors of `lockside.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lockside");
