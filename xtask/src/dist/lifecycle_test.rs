//! The package's life on a host, through dpkg: installed, upgraded twice to rebuilt packages
//! with bumped versions (once while probe runs, once while it is stopped), then purged, with
//! the state checked after each step.
//!
//! Real: dpkg itself (unpacking, its database, the conffile handling that keeps a local edit
//! of /etc/probe/probe.toml across an upgrade, purge), the packages as `cargo xtask dist`
//! builds them (the static debug binary; the second and third differ in version only), and
//! their maintainer scripts (contrib/debian), run by dpkg with the arguments dpkg gives them.
//!
//! Stood in: systemd. It is not PID 1 on CI machines, so `systemctl` is a script (first on
//! dpkg's PATH) that records each call with the service's state at that moment and keeps
//! that state in a file (start, stop, try-restart restarting only an active service, enable
//! making the link `systemctl enable` makes), and `/run/systemd/system`, the scripts' test
//! for a running systemd, is made by the test. What is checked of the service is therefore
//! what the scripts ask of systemctl and when, not what systemd would do with it.
//!
//! Nothing of it reaches the host: every step runs chrooted into an overlay of the host's
//! root file system whose writable layer is a tmpfs, with a tmpfs on /run, in a private
//! mount namespace kept by one holder process. The host's dpkg database never lists the
//! package; ending the holder (on drop, also when the test fails, after a purge; or when the
//! test process dies and the holder's stdin closes) takes all of it away.
use super::*;
use std::io::{BufRead as _, BufReader, Read as _};
use std::process::{Child, Stdio};

/// The stand-in for systemctl (see the module's documentation).
const SYSTEMCTL: &str = r#"#!/bin/sh
# probe's package lifecycle test: a recording stand-in for systemctl (systemd is not PID 1).
state=/run/probe-test/active
if [ -e "$state" ]; then now=active; else now=inactive; fi
echo "$* ($now)" >> /run/probe-test/calls
case "$1" in
    daemon-reload) ;;
    start) : > "$state" ;;
    stop) rm -f "$state" ;;
    try-restart) if [ -e "$state" ]; then echo "$2" >> /run/probe-test/restarts; fi ;;
    enable)
        mkdir -p /etc/systemd/system/multi-user.target.wants
        ln -sf /lib/systemd/system/probe.service \
            /etc/systemd/system/multi-user.target.wants/probe.service ;;
    *) echo "systemctl stand-in: unexpected call: $*" >&2; exit 1 ;;
esac
"#;

/// Sets up the namespace (argv: work dir, packages dir, then mount points of their own that
/// hold paths dpkg writes, each overlaid too), says `ready` and waits for its stdin to close.
const HOLDER: &str = r#"set -e
w=$1; debs=$2; shift 2
mount -t tmpfs -o mode=0755 probe-lifecycle "$w"
mkdir "$w/upper" "$w/work" "$w/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$w/upper,workdir=$w/work" "$w/root"
n=0
for m in "$@"; do
    n=$((n + 1))
    mkdir "$w/upper$n" "$w/work$n"
    mount -t overlay overlay -o "lowerdir=$m,upperdir=$w/upper$n,workdir=$w/work$n" "$w/root$m"
done
mount --bind /proc "$w/root/proc"
mount --bind /dev "$w/root/dev"
mount -t tmpfs -o mode=0755 probe-lifecycle-run "$w/root/run"
mkdir -p "$w/root/run/systemd/system" "$w/root/run/probe-test" "$w/root/debs"
mount --bind "$debs" "$w/root/debs"
echo ready
exec cat >/dev/null
"#;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The private mount namespace and the overlay root inside it.
struct Sandbox {
    holder: Child,
    /// The overlay root, a path inside the namespace.
    root: PathBuf,
    /// The host's temporary directory (the packages, the tmpfs's mount point).
    dir: PathBuf,
}

impl Sandbox {
    fn new(dir: &Path, debs: &Path) -> Result<Sandbox> {
        let work = dir.join("w");
        std::fs::create_dir_all(&work)?;
        let mut holder = Command::new("unshare");
        holder
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                HOLDER,
                "sh",
            ])
            .arg(&work)
            .arg(debs)
            .args(own_mounts()?)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut holder = holder.spawn().context("starting unshare")?;
        let mut line = String::new();
        let stdout = holder.stdout.take().context("the holder's stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "ready" {
            let _ = holder.kill();
            let mut err = String::new();
            if let Some(mut e) = holder.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let _ = holder.wait();
            let _ = std::fs::remove_dir_all(dir);
            bail!("setting up the mount namespace failed: {}", err.trim());
        }
        let sandbox = Sandbox {
            holder,
            root: work.join("root"),
            dir: dir.to_owned(),
        };
        std::fs::create_dir_all(sandbox.path("/usr/local/sbin"))?;
        std::fs::write(sandbox.path("/usr/local/sbin/systemctl"), SYSTEMCTL)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            sandbox.path("/usr/local/sbin/systemctl"),
            std::fs::Permissions::from_mode(0o755),
        )?;
        Ok(sandbox)
    }

    /// A path of the sandbox as this process reaches it: through the holder's root, which
    /// resolves in its mount namespace.
    fn path(&self, p: &str) -> PathBuf {
        let root = self.root.strip_prefix("/").unwrap_or(&self.root);
        PathBuf::from(format!("/proc/{}/root", self.holder.id()))
            .join(root)
            .join(p.trim_start_matches('/'))
    }

    /// `argv` chrooted into the sandbox, with a plain environment.
    fn command(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--target={}", self.holder.id()))
            .args(["--mount", "--", "chroot"])
            .arg(&self.root)
            .args(["/usr/bin/env", "-i", &format!("PATH={PATH}"), "LC_ALL=C"])
            .args(argv);
        c
    }

    fn run(&self, argv: &[&str]) -> String {
        output(&mut self.command(argv)).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `Status Version` of the package, as dpkg-query says (`not-installed` once purged).
    fn package(&self) -> String {
        match output(&mut self.command(&["dpkg-query", "-W", "-f=${Status} ${Version}", "probe"])) {
            Ok(s) if !s.starts_with("unknown ok not-installed") => s,
            _ => "not-installed".into(),
        }
    }

    /// The systemctl calls since the last time, emptied.
    fn calls(&self) -> Vec<String> {
        let p = self.path("/run/probe-test/calls");
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let _ = std::fs::remove_file(&p);
        text.lines().map(str::to_owned).collect()
    }

    fn restarts(&self) -> usize {
        std::fs::read_to_string(self.path("/run/probe-test/restarts"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn active(&self) -> bool {
        self.present("/run/probe-test/active")
    }

    /// Whether `p` exists in the sandbox; a symbolic link is not followed (its target would
    /// resolve on the host).
    fn present(&self, p: &str) -> bool {
        std::fs::symlink_metadata(self.path(p)).is_ok()
    }
}

impl Drop for Sandbox {
    /// Purges (all that happens in the sandbox goes with it anyway), then ends the holder
    /// and with it the namespace, its mounts and the tmpfs.
    fn drop(&mut self) {
        let _ = output(&mut self.command(&["dpkg", "--purge", "probe"]));
        drop(self.holder.stdin.take());
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Mount points other than `/` that hold a path the package or dpkg writes: overlaid too,
/// or the sandbox would write through to the host.
fn own_mounts() -> Result<Vec<String>> {
    let mut mounts = Vec::new();
    for p in [
        "/etc",
        "/usr",
        "/usr/bin",
        "/usr/local/sbin",
        "/usr/share/doc",
        "/lib/systemd/system",
        "/var",
        "/var/lib/dpkg",
    ] {
        if !Path::new(p).exists() {
            continue;
        }
        let m = output(Command::new("findmnt").args(["-n", "-o", "TARGET", "--target", p]))?;
        let m = m.trim().to_owned();
        if m != "/" && !mounts.contains(&m) {
            mounts.push(m);
        }
    }
    mounts.sort_by_key(String::len);
    Ok(mounts)
}

fn read(sb: &Sandbox, p: &str) -> Vec<u8> {
    std::fs::read(sb.path(p)).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// The calls of one step, each with the service's state when it came.
fn count(calls: &[String], prefix: &str) -> usize {
    calls.iter().filter(|c| c.starts_with(prefix)).count()
}

#[test]
fn the_package_installs_upgrades_keeping_the_config_and_purges() {
    if !build::is_root() {
        eprintln!(
            "skipped the_package_installs_upgrades_keeping_the_config_and_purges: it needs root"
        );
        return;
    }
    // Not beside the test that installs on the host: the overlay's lower layer is the host.
    let _turn = crate::lab::test_lock();
    let dir = std::env::temp_dir().join(format!("probe-lifecycle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let debs = dir.join("debs");
    let args = DistArgs {
        out: Some(debs.clone()),
        debug: true,
        pkg_version: None,
    };
    let first = build(&args).unwrap();
    let v1 = env!("CARGO_PKG_VERSION").to_owned();
    let v2 = format!("{v1}+lifecycle1");
    let v3 = format!("{v1}+lifecycle2");
    // The upgrades: rebuilt packages of the same binary, versions bumped.
    build_deb(&args, &v2, &first.binary, &debs).unwrap();
    build_deb(&args, &v3, &first.binary, &debs).unwrap();
    let deb = |v: &str| {
        let name = first.deb.file_name().unwrap().to_string_lossy();
        format!("/debs/{}", name.replacen(&v1, v, 1))
    };
    let sb = Sandbox::new(&dir, &debs).unwrap();
    assert_eq!(
        sb.package(),
        "not-installed",
        "the sandbox starts with probe"
    );
    let shipped_config = std::fs::read(build::root().join("contrib/probe.toml")).unwrap();
    let binary = std::fs::read(&first.binary).unwrap();
    let link = "/etc/systemd/system/multi-user.target.wants/probe.service";

    // 1. Installed: files in place, systemd told of the unit, probe not started.
    sb.run(&["dpkg", "-i", &deb(&v1)]);
    assert_eq!(sb.package(), format!("install ok installed {v1}"));
    assert!(
        read(&sb, "/usr/bin/probe") == binary,
        "/usr/bin/probe is not the binary"
    );
    assert!(sb.path("/lib/systemd/system/probe.service").is_file());
    assert_eq!(read(&sb, "/etc/probe/probe.toml"), shipped_config);
    let version = sb.run(&["/usr/bin/probe", "--version"]);
    assert!(version.starts_with("probe "), "{version}");
    let calls = sb.calls();
    assert_eq!(count(&calls, "daemon-reload"), 1, "{calls:?}");
    assert_eq!(
        calls.len(),
        1,
        "install did more than daemon-reload: {calls:?}"
    );
    assert!(!sb.active());

    // The operator edits the config, enables and starts probe; netlink mode remembers state.
    let mut edited = shipped_config.clone();
    edited.extend_from_slice(b"\n# a local edit, kept across upgrades\n");
    std::fs::write(sb.path("/etc/probe/probe.toml"), &edited).unwrap();
    sb.run(&["systemctl", "enable", "probe.service"]);
    sb.run(&["systemctl", "start", "probe.service"]);
    std::fs::create_dir_all(sb.path("/run/probe")).unwrap();
    std::fs::write(sb.path("/run/probe/clsact"), "pd0\n").unwrap();
    sb.calls();

    // 2. Upgraded while running: not stopped by prerm, restarted once by postinst, the
    // edited conffile kept as it is (no prompt: the package's own copy did not change).
    sb.run(&["dpkg", "-i", &deb(&v2)]);
    assert_eq!(sb.package(), format!("install ok installed {v2}"));
    assert!(read(&sb, "/usr/bin/probe") == binary);
    assert_eq!(read(&sb, "/etc/probe/probe.toml"), edited);
    let calls = sb.calls();
    assert_eq!(count(&calls, "stop"), 0, "stopped on upgrade: {calls:?}");
    assert_eq!(
        count(&calls, "try-restart probe.service (active)"),
        1,
        "{calls:?}"
    );
    assert_eq!(sb.restarts(), 1, "{calls:?}");
    assert!(sb.active());
    assert_eq!(
        std::fs::read_link(sb.path(link)).ok(),
        Some(PathBuf::from("/lib/systemd/system/probe.service")),
        "the enable link went on upgrade"
    );

    // 3. Upgraded while stopped: try-restart leaves it stopped.
    sb.run(&["systemctl", "stop", "probe.service"]);
    sb.calls();
    sb.run(&["dpkg", "-i", &deb(&v3)]);
    assert_eq!(sb.package(), format!("install ok installed {v3}"));
    assert_eq!(read(&sb, "/etc/probe/probe.toml"), edited);
    let calls = sb.calls();
    assert_eq!(count(&calls, "stop"), 0, "{calls:?}");
    assert_eq!(count(&calls, "start"), 0, "{calls:?}");
    assert_eq!(
        count(&calls, "try-restart probe.service (inactive)"),
        1,
        "{calls:?}"
    );
    assert_eq!(sb.restarts(), 1, "a stopped probe was restarted: {calls:?}");
    assert!(!sb.active());
    let leftovers: Vec<String> = std::fs::read_dir(sb.path("/etc/probe"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(leftovers, ["probe.toml"], "dpkg left conffile copies");

    // 4. Purged (running again first): stopped, every file, the config directory, the
    // enable link and /run/probe gone.
    sb.run(&["systemctl", "start", "probe.service"]);
    sb.calls();
    sb.run(&["dpkg", "--purge", "probe"]);
    assert_eq!(sb.package(), "not-installed");
    let calls = sb.calls();
    assert_eq!(
        calls.first().map(String::as_str),
        Some("stop probe.service (active)"),
        "{calls:?}"
    );
    assert!(!sb.active());
    for gone in [
        "/usr/bin/probe",
        "/lib/systemd/system/probe.service",
        "/usr/share/doc/probe",
        "/etc/probe",
        link,
        "/run/probe",
    ] {
        assert!(!sb.present(gone), "{gone} is left after the purge");
    }
    drop(sb);
    assert!(!dir.exists(), "{} is left", dir.display());
}
