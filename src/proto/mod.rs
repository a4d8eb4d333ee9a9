//! The contract: the gRPC types generated from `proto/lockside/v1/lockside.proto`
//! (package `lockside.v1`): its messages and client stubs from the `lockside-proto`
//! crate, which the client core shares, and the server stubs generated here on those
//! messages; in [`limits`] the values that the `.proto` states in its comments
//! ([`codec`]: the server stubs' codec, prost's with smaller buffers). The engine, the
//! API and the command line take those values from here, so the contract is written
//! down once.

pub use lockside_proto::*;

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("lockside.v1");
}

pub use generated::lock_service_server;

pub mod codec;
pub mod limits;

/// The encoded descriptors of `lockside.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("lockside");
