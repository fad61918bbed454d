//! Builds the eBPF object (probe-ebpf's `probe-ebpf` binary, target bpfel-unknown-none) with
//! aya-build, so `cargo build -p probe-user` is the only build command. Needs the nightly
//! toolchain with rust-src and bpf-linker: `cargo xtask setup` installs both.
use anyhow::{anyhow, Context as _};

/// The nightly that builds the eBPF object. Its LLVM (22) must match the one bpf-linker is
/// built against: newer nightlies emit bitcode bpf-linker 0.13 cannot read ("Invalid
/// record"). `cargo xtask setup` reads this name and installs that toolchain.
const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";

fn main() -> anyhow::Result<()> {
    embed_default_model()?;
    // cargo-fuzz builds with `--cfg fuzzing` and sanitizer flags the bpfel build cannot take;
    // the parsers the fuzz targets call never load the object, so an empty one stands in.
    println!("cargo:rustc-check-cfg=cfg(fuzzing)");
    if std::env::var_os("CARGO_CFG_FUZZING").is_some() {
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("probe-ebpf");
        std::fs::write(&out, b"").with_context(|| format!("cannot write {}", out.display()))?;
        return Ok(());
    }
    let root = manifest_dir()?
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
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )
    .with_context(|| format!("building the eBPF programs failed (run `cargo xtask setup` to install {EBPF_TOOLCHAIN} with rust-src and bpf-linker)"))?;
    strip_dwarf(&std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("probe-ebpf"))
}

/// LLVM's objcopy: the one of the LLVM bpf-linker is built against (`cargo xtask setup`),
/// else whichever is on PATH.
const LLVM_OBJCOPY: [&str; 2] = ["/usr/lib/llvm-22/bin/llvm-objcopy", "llvm-objcopy"];

/// The eBPF object without its DWARF (`.debug_*` sections): bpf-linker makes the BTF from it,
/// and the kernel and aya read only the BTF (`.BTF`, `.BTF.ext`: kept, with the symbols). It
/// was 80% of the object embedded in every probe binary (955 KB, 192 KB without), which the
/// static binary's 15 MB bound (`cargo xtask dist`) feels. Without an llvm-objcopy the object
/// stays as it is, with a warning.
fn strip_dwarf(object: &std::path::Path) -> anyhow::Result<()> {
    for objcopy in LLVM_OBJCOPY {
        match std::process::Command::new(objcopy)
            .arg("--strip-debug")
            .arg(object)
            .status()
        {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => anyhow::bail!(
                "`{objcopy} --strip-debug {}` failed ({s})",
                object.display()
            ),
            Err(_) => continue,
        }
    }
    println!(
        "cargo:warning=no llvm-objcopy (apt package llvm-22; `cargo xtask setup`): the embedded eBPF object keeps its DWARF, 0.75 MB of the binary"
    );
    Ok(())
}

/// The built-in spike model: every file of `probe-user/model/` embedded as text
/// (`cargo xtask model` writes it; `model::builtin` reads the list).
fn embed_default_model() -> anyhow::Result<()> {
    let dir = manifest_dir()?.join("model");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files = Vec::new();
    let rd = std::fs::read_dir(&dir).with_context(|| {
        format!(
            "cannot read {} (the built-in model is part of the source tree: git checkout probe-user/model)",
            dir.display()
        )
    })?;
    for e in rd {
        let p = e?.path();
        if p.is_file() {
            println!("cargo:rerun-if-changed={}", p.display());
            files.push(p);
        }
    }
    if files.is_empty() {
        anyhow::bail!(
            "{} holds no model files (git checkout probe-user/model, or `cargo xtask model`)",
            dir.display()
        );
    }
    files.sort();
    let mut code = String::from("pub const FILES: &[(&str, &str)] = &[\n");
    for p in &files {
        let name = p
            .file_name()
            .and_then(|n| n.to_str())
            .context("a model file name is not UTF-8")?;
        code += &format!(
            "    ({name:?}, include_str!({:?})),\n",
            p.display().to_string()
        );
    }
    code += "];\n";
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("builtin_model.rs");
    std::fs::write(out, code)?;
    Ok(())
}

/// This package's directory, read when the script runs. Not `env!`: cargo reuses a compiled
/// build script across checkouts that share a target directory (git worktrees), and a path
/// baked in at compile time then points into another checkout, or one since deleted (a
/// release build once embedded no model that way).
fn manifest_dir() -> anyhow::Result<std::path::PathBuf> {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .context("CARGO_MANIFEST_DIR is not set (build probe-user with cargo)")
}
