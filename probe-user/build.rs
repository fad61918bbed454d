//! Builds the eBPF object (probe-ebpf's `probe` binary, target bpfel-unknown-none) with
//! aya-build, so `cargo build -p probe-user` is the only build command. Needs the nightly
//! toolchain with rust-src and bpf-linker: `cargo xtask setup` installs both.
use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| anyhow!("probe-user has no parent directory"))?
        .join("probe-ebpf");
    let root = root
        .to_str()
        .context("the probe-ebpf path is not UTF-8")?
        .to_owned();
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: &root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs failed (run `cargo xtask setup` to install the nightly toolchain with rust-src and bpf-linker)")
}
