//! `cargo xtask dist`: the static binary and the Debian package, the way operators install
//! host daemons. The daemon is built for x86_64-unknown-linux-musl with the default features
//! (no training, no libibverbs): one statically linked binary, no ELF interpreter and no
//! shared library, that starts on any x86_64 Linux with the kernel requirements whatever its
//! libc. It is stripped and written to target/dist as `probe-<version>-x86_64-linux-musl`
//! with a `.sha256` beside it (sha256sum's format), and the same file goes into the package:
//! /usr/bin/probe, the hardened unit (contrib/systemd) in /lib/systemd/system, a default
//! config (contrib/probe.toml) as a conffile in /etc/probe, the maintainer scripts of
//! contrib/debian. `Depends:` is what `dpkg-shlibdeps` finds in the binary: nothing, for a
//! static binary, so the package has no `Depends:`. Built with `dpkg-deb`: no tool beyond
//! Debian's dpkg-dev and binutils.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::build;

#[cfg(test)]
mod lifecycle_test;

/// The largest stripped release binary `cargo xtask dist` ships, 15 MB of 10^6 bytes
/// (operators copy it to every host; it was 27 MB when it linked LightGBM).
pub const MAX_BINARY_BYTES: u64 = 15_000_000;

#[derive(clap::Args, Debug, Clone)]
pub struct DistArgs {
    /// Where the binary, its checksum and the .deb go (default: target/dist, and
    /// target/dist/debug with --debug).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Package a debug static build instead of a release build (for the tests: a release
    /// build takes minutes). Its size is not checked.
    #[arg(long)]
    pub debug: bool,
    /// The package's version instead of the workspace's (the package test builds an upgrade
    /// with a bumped one); the binary's own `--version` stays the workspace's.
    #[arg(long = "version", value_name = "VERSION")]
    pub pkg_version: Option<String>,
}

/// What `cargo xtask dist` made.
#[derive(Debug)]
pub struct Dist {
    /// The stripped static binary, `probe-<version>-x86_64-linux-musl`.
    pub binary: PathBuf,
    /// Its checksum, `<binary>.sha256`, as `sha256sum` writes it.
    pub checksum: PathBuf,
    pub deb: PathBuf,
}

pub fn run(args: DistArgs) -> Result<()> {
    crate::setup::run()?;
    let dist = build(&args)?;
    let size = std::fs::metadata(&dist.binary)?.len();
    println!(
        "dist: {} ({:.1} MB, static)",
        dist.binary.display(),
        size as f64 / 1e6
    );
    println!("dist: {}", dist.checksum.display());
    println!("dist: {}", dist.deb.display());
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("could not start `{}`", build::display(cmd)))?;
    if !o.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            build::display(cmd),
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// target/dist, or target/dist/debug for a debug build (never mistaken for a release).
pub fn default_out(debug: bool) -> PathBuf {
    let dist = build::target_dir().join("dist");
    if debug {
        dist.join("debug")
    } else {
        dist
    }
}

/// The static binary's file name.
pub fn binary_name(version: &str) -> String {
    format!("probe-{version}-x86_64-linux-musl")
}

/// A Debian version (digits first; then letters, digits and `.+~-`), checked before it
/// lands in a control file and a file name.
fn check_version(v: &str) -> Result<()> {
    let ok = v.starts_with(|c: char| c.is_ascii_digit())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+~-".contains(c));
    if !ok {
        bail!("--version {v:?}: a package version starts with a digit and has only letters, digits and . + ~ -");
    }
    Ok(())
}

/// How a binary links, from its program headers and dynamic section (`readelf`).
#[derive(Debug, PartialEq, Eq)]
pub struct Linkage {
    /// PT_INTERP: the dynamic loader the kernel starts it with, if any.
    pub interpreter: Option<String>,
    /// DT_NEEDED: the shared libraries it loads.
    pub needed: Vec<String>,
}

impl Linkage {
    pub fn of(bin: &Path) -> Result<Linkage> {
        let headers = output(Command::new("readelf").arg("-lW").arg(bin))?;
        let dynamic = output(Command::new("readelf").arg("-dW").arg(bin))?;
        Ok(Linkage::parse(&headers, &dynamic))
    }

    fn parse(headers: &str, dynamic: &str) -> Linkage {
        let between = |l: &str, open: &str| -> Option<String> {
            let rest = &l[l.find(open)? + open.len()..];
            Some(rest[..rest.find(']')?].trim().to_owned())
        };
        Linkage {
            interpreter: headers
                .lines()
                .find_map(|l| between(l, "[Requesting program interpreter:")),
            needed: dynamic
                .lines()
                .filter(|l| l.contains("(NEEDED)"))
                .filter_map(|l| between(l, "Shared library: ["))
                .collect(),
        }
    }

    pub fn is_static(&self) -> bool {
        self.interpreter.is_none() && self.needed.is_empty()
    }
}

/// Builds the static binary (checked static and, for a release, within
/// [`MAX_BINARY_BYTES`]), its checksum and the package.
pub fn build(args: &DistArgs) -> Result<Dist> {
    let version = args
        .pkg_version
        .clone()
        // xtask shares the workspace version.
        .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
    check_version(&version)?;
    let built = build::static_probe(!args.debug)?;
    let linkage = Linkage::of(&built)?;
    if !linkage.is_static() {
        bail!(
            "{} is not static: interpreter {:?}, shared libraries {:?}",
            built.display(),
            linkage.interpreter,
            linkage.needed
        );
    }
    let out = args.out.clone().unwrap_or_else(|| default_out(args.debug));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let name = binary_name(&version);
    let binary = out.join(&name);
    // Symbols and debug information out (what dh_strip does to a package's binaries): the
    // static debug build drops from ~100 MB to ~35 MB; the release build's symbol table
    // alone is 1.7 MB. A panic's backtrace then shows addresses only.
    output(
        Command::new("objcopy")
            .arg("--strip-all")
            .arg(&built)
            .arg(&binary),
    )?;
    let size = std::fs::metadata(&binary)?.len();
    if !args.debug && size > MAX_BINARY_BYTES {
        bail!(
            "the stripped static binary is {:.1} MB, over the {:.0} MB operators were promised: {}",
            size as f64 / 1e6,
            MAX_BINARY_BYTES as f64 / 1e6,
            binary.display()
        );
    }
    let checksum = out.join(format!("{name}.sha256"));
    let sum = output(Command::new("sha256sum").arg(&name).current_dir(&out))?;
    std::fs::write(&checksum, sum)?;
    let deb = build_deb(args, &version, &binary, &out)?;
    Ok(Dist {
        binary,
        checksum,
        deb,
    })
}

/// The package of `binary` (already stripped), in `out`; returns its path.
fn build_deb(args: &DistArgs, version: &str, binary: &Path, out: &Path) -> Result<PathBuf> {
    let root = build::root();
    let stage = out.join("stage");
    let _ = std::fs::remove_dir_all(&stage);
    let dir = |p: &str| -> Result<PathBuf> {
        let d = stage.join(p);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    let staged_bin = dir("usr/bin")?.join("probe");
    std::fs::copy(binary, &staged_bin)?;
    let unit = std::fs::read_to_string(root.join("contrib/systemd/probe.service"))?
        .replace("/usr/local/bin/probe", "/usr/bin/probe");
    std::fs::write(dir("lib/systemd/system")?.join("probe.service"), unit)?;
    std::fs::copy(
        root.join("contrib/probe.toml"),
        dir("etc/probe")?.join("probe.toml"),
    )?;
    std::fs::write(
        dir("usr/share/doc/probe")?.join("copyright"),
        "probe: eBPF network telemetry for distributed training hosts\n\
         License: MIT OR Apache-2.0\nSource: https://github.com/probe-rs/probe\n",
    )?;

    // Asked of dpkg-shlibdeps all the same, so that a binary that did link a library would
    // still get its Depends: for the static binary it finds none, and the field is left out.
    let depends = match shlib_depends(&staged_bin, out)? {
        d if d.is_empty() => String::new(),
        d => format!("Depends: {d}\n"),
    };
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let size_kib: u64 = walk_size(&stage)? / 1024;
    let debian = dir("DEBIAN")?;
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: probe\nVersion: {version}\nArchitecture: {}\nMaintainer: probe developers <probe@example.invalid>\n\
             Installed-Size: {size_kib}\n{depends}Section: net\nPriority: optional\n\
             Homepage: https://github.com/probe-rs/probe\n\
             Description: eBPF network telemetry for distributed training hosts\n \
             Per-peer RTT, retransmits, queue depth, drops, ECN and bursts from eBPF programs,\n \
             RDMA port counters, a latency-spike model, a Prometheus endpoint and a terminal view.\n",
            arch.trim()
        ),
    )?;
    std::fs::write(debian.join("conffiles"), "/etc/probe/probe.toml\n")?;
    for script in ["postinst", "prerm", "postrm"] {
        let to = debian.join(script);
        std::fs::copy(root.join("contrib/debian").join(script), &to)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755))?;
    }
    let deb = out.join(format!("probe_{version}_{}.deb", arch.trim()));
    // xz for the real package; gzip -1 for the tests' debug build (xz takes ~40 s on it).
    let z: &[&str] = if args.debug {
        &["-Zgzip", "-z1"]
    } else {
        &["-Zxz", "-z6"]
    };
    output(
        Command::new("dpkg-deb")
            .arg("--root-owner-group")
            .args(z)
            .arg("--build")
            .arg(&stage)
            .arg(&deb),
    )?;
    let _ = std::fs::remove_dir_all(&stage);
    Ok(deb)
}

/// `Depends:` of the binary, as dpkg-shlibdeps computes it from the libraries it links
/// (it wants a debian/control to exist, so it runs in a scratch directory); empty for a
/// binary that loads no shared library (dpkg-shlibdeps then prints no shlibs:Depends), and
/// an error if a binary that does load some got none.
fn shlib_depends(bin: &Path, scratch: &Path) -> Result<String> {
    let d = scratch.join("shlibdeps");
    std::fs::create_dir_all(d.join("debian"))?;
    std::fs::write(
        d.join("debian/control"),
        "Source: probe\n\nPackage: probe\nArchitecture: any\n",
    )?;
    let text = output(
        Command::new("dpkg-shlibdeps")
            .arg("-O")
            .arg(format!("-e{}", bin.display()))
            .current_dir(&d),
    )?;
    let _ = std::fs::remove_dir_all(&d);
    let depends = text
        .lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .unwrap_or_default()
        .trim()
        .to_owned();
    let needed = Linkage::of(bin)?.needed;
    if depends.is_empty() && !needed.is_empty() {
        bail!(
            "dpkg-shlibdeps found no package for {} although it loads {needed:?}",
            bin.display()
        );
    }
    Ok(depends)
}

fn walk_size(p: &Path) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(p)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() {
            walk_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    //! The package installed with dpkg, run the way its unit runs it (its ExecStart, its
    //! capability sets and no_new_privs, via setpriv: systemd is not PID 1 on CI machines)
    //! in a network namespace, scraped with curl, then purged: nothing of it stays.
    use super::*;

    const FILES: [&str; 3] = [
        "/usr/bin/probe",
        "/lib/systemd/system/probe.service",
        "/etc/probe/probe.toml",
    ];

    /// Purges the package on drop, so that a failed test leaves the machine as it was.
    struct Installed;

    impl Drop for Installed {
        fn drop(&mut self) {
            let _ = Command::new("dpkg").args(["--purge", "probe"]).output();
        }
    }

    struct Netns(String);

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
        }
    }

    #[test]
    fn reads_the_interpreter_and_libraries_of_a_binary() {
        let dynamic = Linkage::parse(
            "  INTERP 0x000318 0x318 0x318 0x00001c 0x00001c R 0x1\n      [Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]\n",
            " 0x0000000000000001 (NEEDED)             Shared library: [libibverbs.so.1]\n 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]\n 0x000000000000000c (INIT)               0x1000\n",
        );
        assert_eq!(
            dynamic.interpreter.as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(dynamic.needed, ["libibverbs.so.1", "libc.so.6"]);
        assert!(!dynamic.is_static());
        // static-pie: a dynamic section (to relocate itself), no interpreter, no library.
        let static_pie = Linkage::parse(
            "Elf file type is DYN (Position-Independent Executable file)\n",
            " 0x000000000000001e (FLAGS)              BIND_NOW\n",
        );
        assert!(static_pie.is_static());
    }

    #[test]
    fn package_versions_are_checked() {
        for ok in ["0.1.0", "0.1.0+lifecycle1", "1.2~rc1-1"] {
            check_version(ok).unwrap();
        }
        for bad in ["", "v1", "0.1 0", "0.1/0", "0.1_0"] {
            assert!(check_version(bad).is_err(), "{bad:?}");
        }
    }

    fn installed() -> bool {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", "probe"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout) == "install ok installed")
    }

    #[test]
    fn the_package_installs_runs_and_purges() {
        if !build::is_root() {
            eprintln!("skipped the_package_installs_runs_and_purges: it needs root");
            return;
        }
        // Not while a lab records: the packaged probe's sock_ops is host-wide.
        let _turn = crate::lab::test_lock();
        assert!(
            !installed(),
            "a probe package is already installed here; the test would remove it"
        );
        let out = std::env::temp_dir().join(format!("probe-dist-test-{}", std::process::id()));
        let dist = build(&DistArgs {
            out: Some(out.clone()),
            debug: true,
            pkg_version: None,
        })
        .unwrap();
        let deb = dist.deb;
        let info = output(Command::new("dpkg-deb").arg("--info").arg(&deb)).unwrap();
        eprintln!("{info}");
        // The static binary: nothing for dpkg to pull in (libstdc++6 came with LightGBM,
        // libibverbs1 with the verbs feature, libc6 with glibc).
        assert!(!info.contains("Depends:"), "a Depends field:\n{info}");
        // The package carries the very binary of the checksum file.
        let sum = std::fs::read_to_string(&dist.checksum).unwrap();
        let (hex, name) = sum.trim_end().split_once("  ").unwrap();
        assert_eq!(Path::new(name), Path::new(dist.binary.file_name().unwrap()));
        let mut x = Command::new("dpkg-deb");
        x.arg("-x").arg(&deb).arg(out.join("x"));
        output(&mut x).unwrap();
        let inside = output(Command::new("sha256sum").arg(out.join("x/usr/bin/probe"))).unwrap();
        assert_eq!(inside.split_whitespace().next(), Some(hex));

        let guard = Installed;
        output(Command::new("dpkg").arg("-i").arg(&deb)).unwrap();
        assert!(installed());
        let listed = output(Command::new("dpkg").args(["-L", "probe"])).unwrap();
        for f in FILES {
            assert!(
                listed.lines().any(|l| l == f),
                "{f} not in dpkg -L:\n{listed}"
            );
            assert!(Path::new(f).exists(), "{f} missing");
        }

        // The unit's ExecStart and capabilities, from the installed unit.
        let unit = std::fs::read_to_string(FILES[1]).unwrap();
        let exec: Vec<&str> = unit
            .lines()
            .find_map(|l| l.strip_prefix("ExecStart="))
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(exec[0], "/usr/bin/probe");
        let caps: Vec<String> = unit
            .lines()
            .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
            .unwrap()
            .split_whitespace()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect();
        let sets = format!("-all,{}", caps.join(","));
        let ns = Netns(format!("prbdist{}", std::process::id()));
        output(Command::new("ip").args(["netns", "add", &ns.0])).unwrap();
        let inns = |argv: &[&str]| {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net=/var/run/netns/{}", ns.0)).args(argv);
            c
        };
        output(&mut inns(&["ip", "link", "set", "lo", "up"])).unwrap();
        output(&mut inns(&[
            "ip", "link", "add", "pd0", "type", "veth", "peer", "name", "pd1",
        ]))
        .unwrap();
        output(&mut inns(&["ip", "link", "set", "pd0", "up"])).unwrap();
        let mut argv = vec![
            "setpriv".to_string(),
            format!("--bounding-set={sets}"),
            format!("--inh-caps={sets}"),
            format!("--ambient-caps={sets}"),
            "--no-new-privs".into(),
        ];
        argv.extend(exec.iter().map(|s| s.to_string()));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut daemon = inns(&argv)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut served = None;
        for _ in 0..100 {
            if let Ok(Some(st)) = daemon.try_wait() {
                panic!("the packaged probe exited: {st}");
            }
            // Ready (attached, first tick done), then scraped.
            let get = |path: &str| {
                inns(&[
                    "curl",
                    "-sf",
                    "--max-time",
                    "2",
                    &format!("http://127.0.0.1:9464{path}"),
                ])
                .output()
                .unwrap()
            };
            if !get("/healthz").status.success() {
                std::thread::sleep(std::time::Duration::from_millis(200));
                continue;
            }
            let o = get("/metrics");
            if o.status.success() {
                served = Some(String::from_utf8_lossy(&o.stdout).into_owned());
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
        let status = daemon.wait().unwrap();
        let served = served.expect("the packaged probe never served /metrics in 20 s");
        assert!(
            served.contains("probe_hook_attached{hook=\"tc\"} 1"),
            "{served}"
        );
        assert!(
            served.contains("iface=\"pd0\""),
            "pd0 is not monitored:\n{served}"
        );
        assert!(status.success(), "SIGTERM: {status}");

        output(Command::new("dpkg").args(["--purge", "probe"])).unwrap();
        assert!(!installed());
        for f in FILES {
            assert!(!Path::new(f).exists(), "{f} is left after the purge");
        }
        assert!(
            !Path::new("/etc/probe").exists(),
            "/etc/probe is left after the purge"
        );
        drop(guard);
        let _ = std::fs::remove_dir_all(&out);
    }
}
