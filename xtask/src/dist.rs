//! `cargo xtask dist`: the Debian package, the way operators install host daemons. The
//! release binary (stripped) in /usr/bin, the hardened unit (contrib/systemd) in
//! /lib/systemd/system, a default config (contrib/probe.toml) as a conffile in /etc/probe,
//! and `Depends:` from `dpkg-shlibdeps` on the binary itself (libibverbs1 when built with
//! the RDMA verbs feature, libstdc++6 for LightGBM, ...). Built with `dpkg-deb`: no tool
//! beyond Debian's dpkg-dev.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};

use crate::build;

#[derive(clap::Args, Debug, Clone)]
pub struct DistArgs {
    /// Where the .deb goes (default: target/dist).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Package the debug build instead of a release build (for the package test: a release
    /// build takes minutes).
    #[arg(long)]
    pub debug: bool,
}

pub fn run(args: DistArgs) -> Result<()> {
    let deb = build_deb(&args)?;
    println!("dist: {}", deb.display());
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

/// Builds the package and returns its path.
pub fn build_deb(args: &DistArgs) -> Result<PathBuf> {
    let bin = if args.debug {
        let mut cmd = build::cargo();
        cmd.args(["build", "-p", "probe-user"]);
        build::run(&mut cmd)?;
        build::target_dir().join("debug").join("probe")
    } else {
        build::release_probe()?
    };
    let root = build::root();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| build::target_dir().join("dist"));
    let stage = out.join("stage");
    let _ = std::fs::remove_dir_all(&stage);
    let dir = |p: &str| -> Result<PathBuf> {
        let d = stage.join(p);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };
    let usr_bin = dir("usr/bin")?;
    let staged_bin = usr_bin.join("probe");
    // Debian strips binaries (dh_strip); the debug build drops from ~250 MB to ~30 MB.
    output(
        Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&bin)
            .arg(&staged_bin),
    )?;
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

    let depends = shlib_depends(&staged_bin, &out)?;
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let size_kib: u64 = walk_size(&stage)? / 1024;
    // xtask shares the workspace version.
    let version = env!("CARGO_PKG_VERSION");
    let debian = dir("DEBIAN")?;
    std::fs::write(
        debian.join("control"),
        format!(
            "Package: probe\nVersion: {version}\nArchitecture: {}\nMaintainer: probe developers <probe@example.invalid>\n\
             Installed-Size: {size_kib}\nDepends: {depends}\nSection: net\nPriority: optional\n\
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
    // xz for the real package; gzip -1 for the test's debug build (xz takes ~40 s on it).
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
/// (it wants a debian/control to exist, so it runs in a scratch directory).
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
    text.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_owned)
        .context("dpkg-shlibdeps printed no shlibs:Depends")
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
        let deb = build_deb(&DistArgs {
            out: Some(out.clone()),
            debug: true,
        })
        .unwrap();
        let info = output(Command::new("dpkg-deb").arg("--info").arg(&deb)).unwrap();
        eprintln!("{info}");
        assert!(
            info.contains("libibverbs1"),
            "Depends lacks libibverbs1:\n{info}"
        );

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
