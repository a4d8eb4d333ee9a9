//! No code: this crate's dependencies ask for the union of the features the sidecar,
//! the Python binding and the Node binding enable on the crates they share (its
//! Cargo.toml says why).
#![forbid(unsafe_code)]
