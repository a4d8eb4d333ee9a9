//! The addon's link arguments (napi-build): see Cargo.toml.
fn main() {
    napi_build::setup();
}
