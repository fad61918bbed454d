//! `cargo xtask setup`: installs what a new Debian 12 x86_64 machine lacks to build and test
//! probe, and nothing that is already there. Safe to run any number of times.
use crate::build;
use anyhow::{anyhow, bail, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Debian packages: LLVM 22 for bpf-linker, the C libraries -sys crates link, and the tools
/// the integration tests and the lab drive (iperf3, nft, tc/ip, bpftool, promtool, tmux...).
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "iperf3",
    "nftables",
    "bpftool",
    "ethtool",
    "iproute2",
    "procps",
    "cmake",
    "libclang-dev",
    "libibverbs-dev",
    "ibverbs-providers",
    "rdma-core",
    "prometheus",
    "tmux",
    "util-linux",
    // probe analyze: its HTML report is opened and screenshotted headless in a test.
    "chromium",
    // --web.config.file tests: certificates from openssl, a bcrypt hash from htpasswd, curl
    // as the scraper.
    "openssl",
    "apache2-utils",
    "curl",
    // cargo xtask dist: objcopy strips the binary, dpkg-shlibdeps computes Depends.
    "binutils",
    "dpkg-dev",
    // cargo xtask dist: musl-gcc compiles the C parts of the static build (zstd-sys, ring)
    // against musl.
    "musl-tools",
];

/// Debian's LLVM 22, which bpf-linker links against; the eBPF toolchain's LLVM must be 22 too.
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";
const LLVM_MAJOR: u32 = 22;
const BPF_LINKER_INSTALL: &str = "cargo install bpf-linker --version ^0.13 --no-default-features --features llvm-22 --locked --force";
const CARGO_FUZZ_INSTALL: &str = "cargo install cargo-fuzz --version ^0.13 --locked";
/// LightGBM 4.x (built from source by lightgbm3-sys) needs a newer CMake than Debian 12's 3.25.
const CMAKE_MIN: (u32, u32) = (3, 28);

pub fn run() -> Result<()> {
    build::prepare_env();
    let mut acted = false;
    acted |= apt()?;
    acted |= rust_components()?;
    acted |= static_target()?;
    acted |= nightly()?;
    acted |= bpf_linker()?;
    acted |= cargo_fuzz()?;
    acted |= cmake_for_lightgbm()?;
    // libclang may have arrived just now: pick it up for the builds that follow.
    build::prepare_env();
    if !acted {
        println!("setup: everything present");
    }
    Ok(())
}

/// Runs a command quietly and returns its stdout when it exits 0.
pub(crate) fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .current_dir(build::root())
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command with inherited output; Ok(true) when it exits 0.
fn status(cmd: &mut Command) -> Result<bool> {
    cmd.stdin(Stdio::null());
    Ok(cmd
        .status()
        .map_err(|e| anyhow!("could not start `{}`: {e}", build::display(cmd)))?
        .success())
}

fn apt() -> Result<bool> {
    if output("dpkg-query", &["--version"]).is_none() {
        bail!(
            "setup: dpkg-query not found: setup supports Debian 12; install by hand: {}",
            APT_PACKAGES.join(" ")
        );
    }
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output("dpkg-query", &["-W", "-f=${Status}", p]).as_deref()
                != Some("install ok installed")
        })
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    let list = missing.join(" ");
    let try_cmd = format!(
        "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {list}"
    );
    if !build::is_root() {
        bail!("setup: missing apt packages: {list}; as root, run: {try_cmd}");
    }
    println!("setup: installing apt packages: {list}");
    println!("setup: apt-get update");
    let mut update = Command::new("apt-get");
    update.args(["update", "-q"]);
    if !status(update.env("DEBIAN_FRONTEND", "noninteractive"))? {
        bail!("setup: `apt-get update` failed, so apt packages {list} could not be installed; try: {try_cmd}");
    }
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive");
    if !status(&mut install)? {
        bail!("setup: could not install apt packages: {list}; try: {try_cmd}");
    }
    Ok(true)
}

fn rustup_installed_components(toolchain: Option<&str>) -> Option<Vec<String>> {
    let mut args = vec!["component", "list", "--installed"];
    if let Some(t) = toolchain {
        args.extend(["--toolchain", t]);
    }
    let out = output("rustup", &args)?;
    Some(out.lines().map(|l| l.trim().to_owned()).collect())
}

fn has_component(components: &[String], name: &str) -> bool {
    components
        .iter()
        .any(|c| c == name || c.starts_with(&format!("{name}-")))
}

/// clippy and rustfmt on the toolchain that builds the workspace (`cargo xtask test` runs both).
fn rust_components() -> Result<bool> {
    if output("rustup", &["--version"]).is_none() {
        bail!("setup: rustup not found; install Rust with rustup (https://rustup.rs), then run: cargo xtask setup");
    }
    let Some(installed) = rustup_installed_components(None) else {
        bail!("setup: `rustup component list --installed` failed; try: rustup component add clippy rustfmt");
    };
    let missing: Vec<&str> = ["clippy", "rustfmt"]
        .into_iter()
        .filter(|c| !has_component(&installed, c))
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    println!(
        "setup: adding rust components to the default toolchain: {}",
        missing.join(" ")
    );
    let mut cmd = Command::new("rustup");
    cmd.current_dir(build::root())
        .args(["component", "add"])
        .args(&missing);
    if !status(&mut cmd)? {
        bail!(
            "setup: could not add rust components {0}; try: rustup component add {0}",
            missing.join(" ")
        );
    }
    Ok(true)
}

/// The musl target of the static build (`cargo xtask dist`) on the toolchain that builds the
/// workspace: its self-contained musl libc is what the static binary links.
fn static_target() -> Result<bool> {
    let target = build::STATIC_TARGET;
    let installed = output("rustup", &["target", "list", "--installed"]).unwrap_or_default();
    if installed.lines().any(|l| l.trim() == target) {
        return Ok(false);
    }
    println!("setup: adding the {target} target (the static build of cargo xtask dist)");
    let mut cmd = Command::new("rustup");
    cmd.current_dir(build::root())
        .args(["target", "add", target]);
    if !status(&mut cmd)? {
        bail!("setup: could not add the {target} target; try: rustup target add {target}");
    }
    Ok(true)
}

/// The toolchain probe-user/build.rs hands aya-build: a dated nightly
/// (`Toolchain::Custom("nightly-YYYY-MM-DD")`, possibly through a const) when build.rs names
/// one, else aya-build's default, `nightly`. Reading it from build.rs keeps the two in step.
pub fn ebpf_toolchain() -> String {
    let build_rs = build::root().join("probe-user").join("build.rs");
    let text = std::fs::read_to_string(build_rs).unwrap_or_default();
    dated_nightly(&text).unwrap_or_else(|| "nightly".to_owned())
}

/// The first `"nightly-YYYY-MM-DD"` string literal outside line comments.
fn dated_nightly(source: &str) -> Option<String> {
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(|l| l.split('"').skip(1).step_by(2))
        .find(|lit| {
            lit.strip_prefix("nightly-").is_some_and(|date| {
                date.len() == 10
                    && date.char_indices().all(|(i, c)| {
                        if i == 4 || i == 7 {
                            c == '-'
                        } else {
                            c.is_ascii_digit()
                        }
                    })
            })
        })
        .map(str::to_owned)
}

/// The eBPF toolchain with rust-src: aya-build runs
/// `rustup run TOOLCHAIN cargo build --target bpfel-unknown-none -Z build-std=core`, and
/// bpf-linker must read the bitcode that toolchain's LLVM writes, so their majors must match.
fn nightly() -> Result<bool> {
    let toolchain = ebpf_toolchain();
    let acted = match rustup_installed_components(Some(&toolchain)) {
        Some(c) if has_component(&c, "rust-src") => false,
        Some(_) => {
            println!("setup: adding rust-src to the {toolchain} toolchain");
            let try_cmd = format!("rustup component add rust-src --toolchain {toolchain}");
            let mut cmd = Command::new("rustup");
            cmd.args(try_cmd.split(' ').skip(1));
            if !status(&mut cmd)? {
                bail!("setup: could not add rust-src to the {toolchain} toolchain; try: {try_cmd}");
            }
            true
        }
        None => {
            println!("setup: installing the {toolchain} toolchain with rust-src");
            let try_cmd = format!(
                "rustup toolchain install {toolchain} --profile minimal --component rust-src"
            );
            let mut cmd = Command::new("rustup");
            cmd.args(try_cmd.split(' ').skip(1));
            if !status(&mut cmd)? {
                bail!("setup: could not install the {toolchain} toolchain; try: {try_cmd}");
            }
            true
        }
    };
    let llvm = output("rustup", &["run", &toolchain, "rustc", "-vV"]).and_then(|v| {
        v.lines()
            .find_map(|l| l.strip_prefix("LLVM version:"))
            .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
    });
    match llvm {
        Some(LLVM_MAJOR) => {}
        Some(other) => bail!(
            "setup: the {toolchain} toolchain uses LLVM {other} but bpf-linker is built for LLVM {LLVM_MAJOR}, so the eBPF link would fail; pin a nightly with LLVM {LLVM_MAJOR} in probe-user/build.rs (aya_build::Toolchain::Custom(\"nightly-2026-05-20\")) and run: cargo xtask setup"
        ),
        None => bail!("setup: could not read the LLVM version of the {toolchain} toolchain; try: rustup run {toolchain} rustc -vV"),
    }
    Ok(acted)
}

/// bpf-linker 0.13, built against Debian's LLVM 22 (the same major as rustc's LLVM).
fn bpf_linker() -> Result<bool> {
    if output("bpf-linker", &["--version"]).is_some() {
        return Ok(false);
    }
    println!("setup: installing bpf-linker 0.13 (cargo install, about 2 minutes)");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![PathBuf::from(LLVM_BIN)];
    dirs.extend(std::env::split_paths(&path));
    let mut cmd = Command::new("cargo");
    cmd.args(BPF_LINKER_INSTALL.split(' ').skip(1))
        .env("PATH", std::env::join_paths(dirs)?)
        // Build in cargo's own temporary directory, not the workspace's target/.
        .env_remove("CARGO_TARGET_DIR")
        // Not the workspace: its toolchain settings must not apply to the install.
        .current_dir(std::env::temp_dir());
    let try_cmd = format!("PATH={LLVM_BIN}:$PATH {BPF_LINKER_INSTALL}");
    if !status(&mut cmd)? || output("bpf-linker", &["--version"]).is_none() {
        bail!("setup: could not install bpf-linker 0.13 (needs apt package llvm-22-dev); try: {try_cmd}");
    }
    Ok(true)
}

/// cargo-fuzz (`cargo xtask fuzz`; the short runs are part of `cargo xtask test`).
fn cargo_fuzz() -> Result<bool> {
    if output("cargo", &["fuzz", "--version"]).is_some() {
        return Ok(false);
    }
    println!("setup: installing cargo-fuzz 0.13 (cargo install, about a minute)");
    let mut cmd = Command::new("cargo");
    cmd.args(CARGO_FUZZ_INSTALL.split(' ').skip(1))
        .env_remove("CARGO_TARGET_DIR")
        .current_dir(std::env::temp_dir());
    if !status(&mut cmd)? || output("cargo", &["fuzz", "--version"]).is_none() {
        bail!("setup: could not install cargo-fuzz; try: {CARGO_FUZZ_INSTALL}");
    }
    Ok(true)
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    // "cmake version 3.25.1" -> (3, 25)
    let word = text
        .split_whitespace()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
    let mut parts = word.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    Some((major, minor))
}

fn cmake_ok(program: &Path) -> bool {
    output(program.to_str().unwrap_or("cmake"), &["--version"])
        .and_then(|v| parse_version(&v))
        .is_some_and(|v| v >= CMAKE_MIN)
}

/// Where setup keeps a private CMake from PyPI: a venv, so the machine's `cmake` stays as is.
fn cmake_venv() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        });
    cache.join("probe-xtask").join("cmake")
}

/// Only once the workspace depends on LightGBM (lightgbm3-sys builds LightGBM 4, which needs
/// CMake 3.28 or newer; Debian 12 ships 3.25): a CMake 3.x from PyPI in a private venv, handed to the
/// builds that follow through `$CMAKE`, which the cmake crate honours. 3.x, not 4.x: the
/// other cmake builds (ibverbs-sys) declare minimum versions that CMake 4 refuses.
fn cmake_for_lightgbm() -> Result<bool> {
    let lock = std::fs::read_to_string(build::root().join("Cargo.lock")).unwrap_or_default();
    if !lock.contains("name = \"lightgbm") || cmake_ok(Path::new("cmake")) {
        return Ok(false);
    }
    let venv = cmake_venv();
    let bin = venv.join("bin").join("cmake");
    let mut acted = false;
    if !cmake_ok(&bin) {
        println!(
            "setup: installing cmake >= 3.28 from PyPI into {} for LightGBM (Debian 12 has 3.25)",
            venv.display()
        );
        acted = true;
        let try_cmd = format!(
            "python3 -m venv {0} && {0}/bin/pip install 'cmake>=3.28,<4'",
            venv.display()
        );
        let mut create = Command::new("python3");
        create.arg("-m").arg("venv").arg(&venv);
        let mut install = Command::new(venv.join("bin").join("python"));
        install.args(["-m", "pip", "install", "--quiet", "cmake>=3.28,<4"]);
        if !(status(&mut create)? && status(&mut install)? && cmake_ok(&bin)) {
            bail!("setup: could not install cmake >= 3.28 for LightGBM; try: {try_cmd}");
        }
    }
    std::env::set_var("CMAKE", &bin);
    Ok(acted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cmake_versions() {
        assert_eq!(parse_version("cmake version 3.25.1\n"), Some((3, 25)));
        assert_eq!(parse_version("cmake version 4.4.4"), Some((4, 4)));
        assert_eq!(parse_version("cmake version 3.28.0-rc1"), Some((3, 28)));
        assert_eq!(parse_version("nothing"), None);
    }

    #[test]
    fn reads_the_dated_nightly_from_build_rs() {
        let custom = "// aya_build::Toolchain::Custom(\"nightly-2020-01-01\")\n\
                      const T: &str = \"nightly-2026-05-20\";\n\
                      aya_build::build_ebpf([p], aya_build::Toolchain::Custom(T))";
        assert_eq!(dated_nightly(custom).as_deref(), Some("nightly-2026-05-20"));
        let default = "aya_build::build_ebpf([p], aya_build::Toolchain::default())\n\
                       .context(\"install the nightly toolchain\")";
        assert_eq!(dated_nightly(default), None);
        assert_eq!(dated_nightly("x(\"nightly-2026-5-20\")"), None);
    }

    #[test]
    fn finds_components_with_or_without_target() {
        let c = vec![
            "rust-src".to_owned(),
            "clippy-x86_64-unknown-linux-gnu".to_owned(),
        ];
        assert!(has_component(&c, "rust-src"));
        assert!(has_component(&c, "clippy"));
        assert!(!has_component(&c, "rustfmt"));
    }
}
