//! Generates the server stubs from `proto/`, on the messages of the `lockside-proto`
//! crate (which generates them and the client stubs once for every member of the
//! workspace), and the descriptors for server reflection. protoc comes from
//! `protoc-bin-vendored` so a fresh machine needs nothing but cargo; `PROTOC` in the
//! environment overrides it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/lockside/v1/lockside.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = tonic_prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    // The descriptors, for server reflection.
    let descriptors = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("lockside.bin");
    tonic_prost_build::configure()
        .file_descriptor_set_path(descriptors)
        // The messages are `lockside-proto`'s: generated once, shared with the client.
        .extern_path(".lockside.v1", "::lockside_proto")
        // Prost's codec with 1 KiB buffers per RPC, not 8 KiB (`src/proto/codec.rs`).
        .codec_path("crate::proto::codec::LeanCodec")
        .build_client(false)
        .build_server(true)
        .compile_with_config(config, &[proto], &["proto"])?;
    Ok(())
}
