//! Generates the messages and the client stubs from `proto/` at the repository's root
//! (the sidecar's build generates the server stubs on these same messages). protoc
//! comes from `protoc-bin-vendored`, so a fresh machine needs nothing but cargo;
//! `PROTOC` in the environment overrides it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = "../../proto";
    let proto = "../../proto/lockside/v1/lockside.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = tonic_prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_with_config(config, &[proto], &[root])?;
    Ok(())
}
