//! Shared helpers: where the workspace and its build outputs are, how child commands run,
//! and the builds of `probe` that `run`, `bench`, `model` and `dist` start from.
use anyhow::{bail, Context as _, Result};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (the parent of xtask/). `cargo run` (what `cargo xtask` is) sets
/// CARGO_MANIFEST_DIR for the process; the path compiled in is only the fallback, since cargo
/// reuses a binary across checkouts that share a target directory (git worktrees).
pub fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` (made absolute) or `<root>/target`.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                std::env::current_dir().unwrap_or_else(|_| root()).join(dir)
            }
        }
        _ => root().join("target"),
    }
}

/// True when this process runs as root (the owner of /proc/self is the effective uid).
pub fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Prepares the environment every child command inherits, once, before any other thread
/// exists: cargo's bin directory on PATH (where `cargo install` puts bpf-linker, which the
/// eBPF build invokes as a linker), an absolute CARGO_TARGET_DIR, and bindgen's libclang.
pub fn prepare_env() {
    let mut path: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    let cargo_bin = cargo_home().join("bin");
    if !path.contains(&cargo_bin) {
        path.insert(0, cargo_bin);
        if let Ok(joined) = std::env::join_paths(path) {
            std::env::set_var("PATH", joined);
        }
    }
    if std::env::var_os("CARGO_TARGET_DIR").is_some_and(|d| !d.is_empty()) {
        std::env::set_var("CARGO_TARGET_DIR", target_dir());
    }
    // Debian 12's libclang 14 is the one bindgen (ibverbs-sys) handles; a newer libclang
    // pulled in beside it (clang-22) yields broken struct layouts. See shared PLATFORM notes.
    let clang14 = Path::new("/usr/lib/llvm-14/lib");
    if std::env::var_os("LIBCLANG_PATH").is_none() && clang14.join("libclang.so.1").exists() {
        std::env::set_var("LIBCLANG_PATH", clang14);
    }
}

fn cargo_home() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| OsString::from("/root"));
    PathBuf::from(home).join(".cargo")
}

/// `cargo` as the one that started xtask (`$CARGO`), run from the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// A command as a shell-like string, for headers and error messages.
pub fn display(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd
        .get_envs()
        .filter_map(|(k, v)| Some(format!("{}={}", k.to_string_lossy(), v?.to_string_lossy())))
        .collect();
    let program = cmd.get_program().to_string_lossy();
    parts.push(if program.ends_with("/cargo") {
        "cargo".into()
    } else {
        program.into_owned()
    });
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// Runs a command with inherited stdio and fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(cmd));
    }
    Ok(())
}

/// The target of the static build: musl's libc linked in, no ELF interpreter, so the binary
/// starts on any x86_64 Linux whatever its libc (`cargo xtask dist`).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// Builds `probe` in release (probe-user's build.rs builds the eBPF object) with the default
/// features (the daemon: no training, no libibverbs) and returns the binary's path.
pub fn release_probe() -> Result<PathBuf> {
    build_probe(&["--release"], &target_dir().join("release"))
}

/// `probe` in release with `probe train` (LightGBM): what `cargo xtask model` trains with.
pub fn release_probe_with_training() -> Result<PathBuf> {
    build_probe(
        &["--release", "--features", "train"],
        &target_dir().join("release"),
    )
}

/// The static `probe` (target [`STATIC_TARGET`], default features): release, or a debug
/// build for the tests (minutes faster).
pub fn static_probe(release: bool) -> Result<PathBuf> {
    let dir = target_dir().join(STATIC_TARGET);
    if release {
        build_probe(
            &["--release", "--target", STATIC_TARGET],
            &dir.join("release"),
        )
    } else {
        build_probe(&["--target", STATIC_TARGET], &dir.join("debug"))
    }
}

/// `cargo build -p probe-user ARGS` and the path of the `probe` it made in `out_dir`.
fn build_probe(args: &[&str], out_dir: &Path) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "-p", "probe-user"]).args(args);
    println!("build: {}", display(&cmd));
    run(&mut cmd)?;
    let bin = out_dir.join("probe");
    if !bin.is_file() {
        bail!("the build finished but {} is missing", bin.display());
    }
    Ok(bin)
}
