//! The contract: the messages and client stubs generated from
//! `proto/lockside/v1/lockside.proto` (package `lockside.v1`), shared by the sidecar
//! (which generates its server stubs on these messages) and the client core
//! (`lockside-client`), so the codegen runs once. The values the `.proto` states in its
//! comments are the sidecar's `lockside::proto::limits`; the client core keeps the few
//! it needs in its own `limits`.

#[allow(missing_docs, clippy::all)]
mod generated {
    tonic::include_proto!("lockside.v1");
}

pub use generated::*;
pub use prost_types;
