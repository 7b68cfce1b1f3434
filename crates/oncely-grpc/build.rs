//! Generates the gRPC code of the `.proto` files with protox (a protobuf compiler in Rust) and
//! tonic-prost-build: no system `protoc` is needed to build this crate.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/oncely/payments/v1/payments.proto",
        "proto/oncely/testing/v1/echo.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
