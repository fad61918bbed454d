//! The HTTP endpoints behind `--web.config.file` (the exporter-toolkit's YAML), checked with
//! the tools operators use: certificates made by `openssl`, a password hashed by Apache's
//! `htpasswd`, and `curl` as the scraper.
//!
//! - TLS + basic auth: the right password scrapes /metrics over HTTPS (the CA made here
//!   verifies the server); no password and a wrong one get 401 with a Basic challenge; plain
//!   HTTP to the TLS port gets no metrics.
//! - Mutual TLS (RequireAndVerifyClientCert): a client certificate from the CA scrapes; no
//!   client certificate, or one from another CA, is refused in the handshake.
//! - probe's own client: `probe record` over HTTPS with a password file records the
//!   interface (a wrong user fails with 401); `probe top --once` works with the client
//!   certificate.
//! - `--web.disable-snapshot`: /api/v1/snapshot answers 404, /metrics still serves.
//! - A bad web config stops the start with one line that names the problem.
use std::path::Path;
use std::time::{Duration, Instant};

use probe_tests::cmd::{self, output_within, Output};
use probe_tests::probe::{assert_cli_error, probe_command, run_to_exit};
use probe_tests::process::Child;
use probe_tests::{Pair, ProbeOpts};

const USER: &str = "prometheus";
const PASSWORD: &str = "scrape-me";
const START_TIMEOUT: Duration = Duration::from_secs(30);

fn sh(dir: &Path, argv: &[&str]) {
    let mut c = cmd::command(argv);
    c.current_dir(dir);
    cmd::run(&mut c).unwrap();
}

/// A CA, a server certificate for 127.0.0.1 signed by it, a client certificate signed by it,
/// and a client certificate of a second, untrusted CA.
fn make_pki(dir: &Path) {
    let ossl = |args: &str| {
        let argv: Vec<&str> = std::iter::once("openssl")
            .chain(args.split_whitespace())
            .collect();
        sh(dir, &argv)
    };
    for ca in ["ca", "rogue-ca"] {
        ossl(&format!("req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN={ca} -keyout {ca}.key -out {ca}.pem"));
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, ca, ext) in [
        ("server", "ca", "server.ext"),
        ("client", "ca", "client.ext"),
        ("rogue-client", "rogue-ca", "client.ext"),
    ] {
        ossl(&format!("req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN={name} -keyout {name}.key -out {name}.csr"));
        ossl(&format!("x509 -req -in {name}.csr -CA {ca}.pem -CAkey {ca}.key -CAcreateserial -days 2 -extfile {ext} -out {name}.pem"));
    }
}

/// `htpasswd -nbBC 10 USER PASSWORD`'s hash.
fn bcrypt_hash() -> String {
    let line = cmd::run(&mut cmd::command(&[
        "htpasswd", "-nbBC", "10", USER, PASSWORD,
    ]))
    .unwrap();
    let hash = line.trim().split_once(':').unwrap().1.to_owned();
    assert!(hash.starts_with("$2"), "htpasswd gave {line}");
    hash
}

/// curl in the pair's A namespace; (HTTP status or 0, body, curl's exit code).
fn curl(pair: &Pair, args: &[&str]) -> (u16, String, i32) {
    let mut argv = vec!["curl", "-sS", "--max-time", "10", "-w", "\n%{http_code}"];
    argv.extend(args);
    let o: Output = output_within(&mut pair.a.command(&argv), Duration::from_secs(15)).unwrap();
    let (body, code) = o.stdout.rsplit_once('\n').unwrap_or(("", &o.stdout));
    (
        code.trim().parse().unwrap_or(0),
        body.to_owned(),
        o.status.code().unwrap_or(-1),
    )
}

/// Starts probe with `extra` and waits until `ready` (a curl argument list for /healthz)
/// answers 200.
fn start(pair: &Pair, extra: &[&str], ready: &[&str]) -> Child {
    let mut opts = ProbeOpts::iface(&pair.veth_a);
    opts.extra = extra.iter().map(|s| s.to_string()).collect();
    let mut child = Child::spawn("probe", &mut probe_command(&pair.a, &opts.args())).unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(st) = child.try_wait() {
            panic!("probe exited with {st}:\n{}", child.stderr());
        }
        if curl(pair, ready).0 == 200 {
            return child;
        }
        assert!(
            Instant::now() < deadline,
            "probe did not answer {ready:?} within {START_TIMEOUT:?}:\n{}",
            child.stderr()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn write_config(dir: &Path, name: &str, yaml: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, yaml).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn tls_and_basic_auth_follow_the_web_config() {
    cmd::require_root_and(&["ip", "nsenter", "openssl", "curl", "htpasswd"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_pki(d);
    // Relative paths: relative to the web config file, as in exporter-toolkit.
    let cfg = write_config(
        d,
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  {USER}: '{}'\nhttp_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
            bcrypt_hash()
        ),
    );
    let pair = Pair::new(97).unwrap();
    let ca = d.join("ca.pem").to_string_lossy().into_owned();
    let url = |path: &str| format!("https://127.0.0.1:9464{path}");
    let auth = format!("{USER}:{PASSWORD}");
    let health = url("/healthz");
    let mut probe = start(
        &pair,
        &["--web.config.file", &cfg],
        &["--cacert", &ca, "-u", &auth, &health],
    );

    // A client that connects and never speaks: scrapes go on, and probe hangs up on it
    // after its 10 s handshake deadline (checked at the end).
    let silent = pair
        .a
        .enter(|| std::net::TcpStream::connect(("127.0.0.1", 9464)))
        .unwrap()
        .unwrap();
    let connected = Instant::now();

    let metrics = url("/metrics");
    let (code, body, _) = curl(&pair, &["--cacert", &ca, "-u", &auth, "-i", &metrics]);
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("probe_build_info") || body.contains("# TYPE probe_"),
        "{body}"
    );
    assert!(
        body.to_ascii_lowercase()
            .contains("x-content-type-options: nosniff"),
        "the configured header is missing: {}",
        &body[..body.len().min(600)]
    );

    let (code, body, _) = curl(&pair, &["--cacert", &ca, "-i", &metrics]);
    assert_eq!(code, 401, "no password: {body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("www-authenticate: basic"),
        "{body}"
    );
    let wrong = format!("{USER}:not-{PASSWORD}");
    assert_eq!(
        curl(&pair, &["--cacert", &ca, "-u", &wrong, &metrics]).0,
        401
    );
    let stranger = format!("nobody:{PASSWORD}");
    assert_eq!(
        curl(&pair, &["--cacert", &ca, "-u", &stranger, &metrics]).0,
        401
    );

    // Plain HTTP to the TLS port: no metrics, whatever the password.
    let (code, body, _) = curl(&pair, &["-u", &auth, "http://127.0.0.1:9464/metrics"]);
    assert_ne!(code, 200, "plain HTTP was served: {body}");
    assert!(!body.contains("probe_"), "{body}");

    // The server's certificate is checked by the client: another CA does not vouch for it.
    let rogue = d.join("rogue-ca.pem").to_string_lossy().into_owned();
    let (code, _, exit) = curl(&pair, &["--cacert", &rogue, "-u", &auth, &metrics]);
    assert!(
        code != 200 && exit != 0,
        "curl trusted a certificate the CA did not sign"
    );

    // probe's own client: `probe record` over HTTPS with the password from a file.
    let pw = d.join("password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    let pw = pw.to_string_lossy().into_owned();
    let out = d.join("rec.parquet");
    let record = |user: &str, out: &Path| {
        let args: Vec<String> = [
            "record",
            "--url",
            &format!("https://{user}@127.0.0.1:9464"),
            "--ca-file",
            &ca,
            "--password-file",
            &pw,
            "--out",
            &out.to_string_lossy(),
            "--duration",
            "3",
            "--max-failures",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        run_to_exit(probe_command(&pair.a, &args), Duration::from_secs(30)).unwrap()
    };
    let o = record(USER, &out);
    assert!(o.status.success(), "probe record over HTTPS: {}", o.stderr);
    let rows = probe_tests::parquet::rows(&out).unwrap();
    assert!(
        rows.iter()
            .any(|r| r.get("entity").and_then(|v| v.as_str()) == Some(pair.veth_a.as_str())),
        "the recording has no row for {}: {} rows",
        pair.veth_a,
        rows.len()
    );
    let o = record("nobody", &d.join("rec2.parquet"));
    assert!(
        !o.status.success(),
        "probe record with a wrong user succeeded"
    );
    assert!(o.stderr.contains("401"), "{}", o.stderr);

    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut buf = [0u8; 64];
    let n = std::io::Read::read(&mut &silent, &mut buf);
    let after = connected.elapsed();
    assert!(
        matches!(n, Ok(0))
            || matches!(&n, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "the silent client was not hung up on: {n:?} after {after:?}"
    );
    assert!(
        after >= Duration::from_secs(9) && after <= Duration::from_secs(15),
        "the silent client was hung up on after {after:?}, not the 10 s deadline"
    );

    probe.terminate(Duration::from_secs(10));
}

#[test]
fn mutual_tls_refuses_clients_without_a_certificate_from_the_ca() {
    cmd::require_root_and(&["ip", "nsenter", "openssl", "curl"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_pki(d);
    let p = |f: &str| d.join(f).to_string_lossy().into_owned();
    let cfg = write_config(
        d,
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n  min_version: TLS12\n",
            p("server.pem"),
            p("server.key"),
            p("ca.pem")
        ),
    );
    let pair = Pair::new(98).unwrap();
    let (ca, cert, key) = (p("ca.pem"), p("client.pem"), p("client.key"));
    let mtls = |path: &str| -> Vec<String> {
        vec![
            "--cacert".into(),
            ca.clone(),
            "--cert".into(),
            cert.clone(),
            "--key".into(),
            key.clone(),
            format!("https://127.0.0.1:9464{path}"),
        ]
    };
    let ready = mtls("/healthz");
    let ready: Vec<&str> = ready.iter().map(String::as_str).collect();
    let mut probe = start(&pair, &["--web.config.file", &cfg], &ready);

    let ok = mtls("/metrics");
    let ok: Vec<&str> = ok.iter().map(String::as_str).collect();
    let (code, body, _) = curl(&pair, &ok);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("# TYPE probe_"), "{body}");

    // probe's own client with the client certificate: `probe top --once`.
    let args: Vec<String> = [
        "top",
        "--once",
        "--url",
        "https://127.0.0.1:9464",
        "--ca-file",
        &ca,
        "--cert-file",
        &cert,
        "--key-file",
        &key,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let o = run_to_exit(probe_command(&pair.a, &args), Duration::from_secs(30)).unwrap();
    assert!(
        o.status.success(),
        "probe top --once over mTLS: {}",
        o.stderr
    );
    assert!(o.stdout.contains(&pair.veth_a), "{}", o.stdout);

    let metrics = "https://127.0.0.1:9464/metrics";
    let (code, body, exit) = curl(&pair, &["--cacert", &ca, metrics]);
    assert!(
        code != 200 && exit != 0,
        "served without a client certificate: {code} {body}"
    );
    let (rc, rk) = (p("rogue-client.pem"), p("rogue-client.key"));
    let (code, body, exit) = curl(
        &pair,
        &["--cacert", &ca, "--cert", &rc, "--key", &rk, metrics],
    );
    assert!(
        code != 200 && exit != 0,
        "served a client certificate from another CA: {code} {body}"
    );
    probe.terminate(Duration::from_secs(10));
}

#[test]
fn the_snapshot_api_can_be_turned_off() {
    cmd::require_root_and(&["ip", "nsenter", "curl"]);
    let pair = Pair::new(99).unwrap();
    let mut probe = start(
        &pair,
        &["--web.disable-snapshot"],
        &["http://127.0.0.1:9464/healthz"],
    );
    let (code, body, _) = curl(&pair, &["http://127.0.0.1:9464/api/v1/snapshot"]);
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("turned off"), "{body}");
    let (code, body, _) = curl(&pair, &["http://127.0.0.1:9464/metrics"]);
    assert_eq!(code, 200, "{body}");
    probe.terminate(Duration::from_secs(10));
}

#[test]
fn a_bad_web_config_stops_the_start_in_one_line() {
    cmd::require_root_and(&["ip", "nsenter"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pair = Pair::new(100).unwrap();
    for (yaml, needle) in [
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
            "missing.pem",
        ),
        ("basic_auth_users:\n  alice: plaintext\n", "bcrypt"),
        ("tls_server_confg: {}\n", "tls_server_confg"),
    ] {
        let cfg = write_config(d, "bad.yml", yaml);
        let mut opts = ProbeOpts::iface(&pair.veth_a);
        opts.extra = vec!["--web.config.file".into(), cfg];
        let out = run_to_exit(
            probe_command(&pair.a, &opts.args()),
            Duration::from_secs(20),
        )
        .unwrap();
        eprintln!("{}", assert_cli_error(&out, &[needle]));
    }
}
