//! A client of a running daemon's HTTP API (`probe record`, `probe top`): a minimal blocking
//! HTTP/1.1 GET over a std TcpStream, or over rustls for `https://` URLs (a daemon with
//! `--web.config.file`), with basic auth and a client certificate when it asks for them.
use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs as _},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use rustls::{
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName},
    ClientConfig, RootCertStore,
};

/// A snapshot larger than this is refused (10,000 flows are a few MiB).
const MAX_BODY: usize = 256 << 20;
/// Debian's bundle of the system's trusted CAs: the default for https:// URLs.
const SYSTEM_CAS: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How to reach a daemon that has a web config: its CA, a client certificate, a password.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ApiAuth {
    /// For https:// URLs: the CA certificate(s) that signed the daemon's certificate
    /// (default: the system's, /etc/ssl/certs/ca-certificates.crt).
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for a daemon that requires one (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// Basic-auth password of the user named in the URL (`https://USER@host:9464`). A
    /// password in the URL itself also works, but other users of the host see it in `ps`.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

/// Where the daemon is: `http[s]://[USER[:PASSWORD]@]HOST:PORT[/PREFIX]`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `HOST:PORT` as given (the Host header).
    pub authority: String,
    /// Path prefix without a trailing slash ("" for none).
    pub prefix: String,
    pub https: bool,
    /// `USER` and `PASSWORD` from the URL (or the password file).
    pub user: Option<(String, String)>,
    /// Set by [`Endpoint::with_auth`] for https.
    pub tls: Option<Arc<ClientConfig>>,
}

impl Endpoint {
    /// The URL; `with_auth` must follow for https:// or a password file.
    pub fn parse(url: &str) -> Result<Self> {
        let (https, rest) = if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else {
            bail!("`{url}` is not an http:// or https:// URL like http://127.0.0.1:9464");
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (user, authority) = match authority.rsplit_once('@') {
            Some((u, a)) => {
                let (name, pass) = u.split_once(':').unwrap_or((u, ""));
                (Some((name.to_string(), pass.to_string())), a)
            }
            None => (None, authority),
        };
        if authority.is_empty() {
            bail!("`{url}` has no host");
        }
        // Default port: the daemon's, not HTTP's 80.
        let has_port = match authority.rfind(']') {
            Some(close) => authority[close..].contains(':'),
            None => authority.contains(':'),
        };
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:9464")
        };
        Ok(Self {
            authority,
            prefix: path.trim_end_matches('/').to_string(),
            https,
            user,
            tls: None,
        })
    }

    /// Reads the password file and, for https, the CA and client certificate.
    pub fn with_auth(mut self, auth: &ApiAuth) -> Result<Self> {
        if let Some(p) = &auth.password_file {
            let Some((_, pass)) = &mut self.user else {
                bail!("--password-file needs a user in the URL, like https://USER@host:9464");
            };
            *pass = std::fs::read_to_string(p)
                .with_context(|| format!("reading --password-file {}", p.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_string();
        }
        if !self.https {
            if auth.ca_file.is_some() || auth.cert_file.is_some() {
                bail!("--ca-file and --cert-file are for https:// URLs");
            }
            return Ok(self);
        }
        let ca = auth
            .ca_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(SYSTEM_CAS));
        let mut roots = RootCertStore::empty();
        for c in pem_certs(&ca, "--ca-file")? {
            roots
                .add(c)
                .map_err(|e| anyhow!("--ca-file {}: {e}", ca.display()))?;
        }
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| anyhow!("TLS: {e}"))?
                .with_root_certificates(roots);
        let cfg = match (&auth.cert_file, &auth.key_file) {
            (Some(c), Some(k)) => {
                let key = PrivateKeyDer::from_pem_file(k)
                    .map_err(|e| anyhow!("--key-file {}: {e}", k.display()))?;
                builder
                    .with_client_auth_cert(pem_certs(c, "--cert-file")?, key)
                    .map_err(|e| anyhow!("--cert-file/--key-file: {e}"))?
            }
            _ => builder.with_no_client_auth(),
        };
        self.tls = Some(Arc::new(cfg));
        Ok(self)
    }

    pub fn url(&self, path: &str) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}{path}", self.authority, self.prefix)
    }

    fn addr(&self) -> Result<SocketAddr> {
        self.authority
            .to_socket_addrs()
            .with_context(|| format!("resolving {}", self.authority))?
            .next()
            .ok_or_else(|| anyhow!("{} resolves to no address", self.authority))
    }

    /// The host part of the authority, for TLS's server name.
    fn host(&self) -> &str {
        let a = self.authority.as_str();
        match a.rfind(']') {
            Some(close) => a[..close].trim_start_matches('['),
            None => a.rsplit_once(':').map_or(a, |(h, _)| h),
        }
    }

    /// GET `path` (after the prefix); the body of a 200 response.
    pub fn get(&self, path: &str, timeout: Duration) -> Result<Vec<u8>> {
        let addr = self.addr()?;
        let s = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let auth = match &self.user {
            Some((u, p)) => {
                use base64::Engine as _;
                let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"));
                format!("Authorization: Basic {b64}\r\n")
            }
            None => String::new(),
        };
        let req = format!(
            "GET {}{path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\n{auth}Connection: close\r\n\r\n",
            self.prefix, self.authority
        );
        let raw = if self.https {
            let Some(cfg) = &self.tls else {
                bail!("https:// without TLS settings (Endpoint::with_auth was not called)");
            };
            let name = ServerName::try_from(self.host().to_string())
                .map_err(|e| anyhow!("`{}` is not a TLS server name: {e}", self.host()))?;
            let conn = rustls::ClientConnection::new(cfg.clone(), name)
                .map_err(|e| anyhow!("TLS: {e}"))?;
            exchange(rustls::StreamOwned::new(conn, s), &req)
                .with_context(|| format!("HTTPS exchange with {addr}"))?
        } else {
            exchange(s, &req)?
        };
        let (status, body) = parse_response(&raw)?;
        if status != 200 {
            let text = String::from_utf8_lossy(&body);
            bail!("HTTP {status}: {}", text.trim());
        }
        Ok(body)
    }

    /// GET `path` and decode its JSON body.
    pub fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        timeout: Duration,
    ) -> Result<T> {
        let body = self.get(path, timeout)?;
        serde_json::from_slice(&body).with_context(|| format!("decoding the JSON of {path}"))
    }
}

/// Writes the request, reads the whole response.
fn exchange(mut s: impl Read + Write, req: &str) -> Result<Vec<u8>> {
    s.write_all(req.as_bytes())?;
    s.flush()?;
    let mut raw = Vec::new();
    match s.take(MAX_BODY as u64 + 64 * 1024).read_to_end(&mut raw) {
        Ok(_) => {}
        // Servers often close TLS without close_notify after `Connection: close`; what was
        // read is complete if its length says so, which parse_response checks.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e).context("reading the response"),
    }
    Ok(raw)
}

fn pem_certs(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| anyhow!("{flag} {}: {e}", path.display()))?;
    if certs.is_empty() {
        bail!("{flag} {}: no certificate in it", path.display());
    }
    Ok(certs)
}

/// Status and (de-chunked) body of a complete HTTP/1.x response.
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>)> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the response ended before its headers did")?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    if !parts.next().unwrap_or_default().starts_with("HTTP/1.") {
        bail!("not an HTTP response: {status_line:?}");
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let mut chunked = false;
    let mut length = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if k.eq_ignore_ascii_case("content-length") {
            length = v.parse::<usize>().ok();
        }
    }
    let body = &raw[end + 4..];
    let body = if chunked {
        dechunk(body)?
    } else if let Some(n) = length {
        if body.len() < n {
            bail!("the response body ended after {} of {n} bytes", body.len());
        }
        body[..n].to_vec()
    } else {
        body.to_vec()
    };
    if body.len() > MAX_BODY {
        bail!("the response is larger than {MAX_BODY} bytes");
    }
    Ok((status, body))
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunked body")?;
        let line = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {line:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            bail!("truncated chunked body");
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    #[test]
    fn urls() {
        let e = Endpoint::parse("http://127.0.0.1:9464").unwrap();
        assert_eq!(e.authority, "127.0.0.1:9464");
        assert_eq!(
            e.url("/api/v1/snapshot"),
            "http://127.0.0.1:9464/api/v1/snapshot"
        );
        let e = Endpoint::parse("http://localhost/probe/").unwrap();
        assert_eq!(
            (e.authority.as_str(), e.prefix.as_str()),
            ("localhost:9464", "/probe")
        );
        let e = Endpoint::parse("http://[::1]:9000").unwrap();
        assert_eq!(e.authority, "[::1]:9000");
        assert_eq!(
            Endpoint::parse("http://[::1]").unwrap().authority,
            "[::1]:9464"
        );
        assert!(Endpoint::parse("ftp://x:1").is_err());
        assert!(Endpoint::parse("127.0.0.1:9464").is_err());
        let e = Endpoint::parse("https://prom:s3cret@[::1]:9000/p").unwrap();
        assert!(e.https);
        assert_eq!(e.user, Some(("prom".into(), "s3cret".into())));
        assert_eq!((e.authority.as_str(), e.host()), ("[::1]:9000", "::1"));
        assert_eq!(e.url("/x"), "https://[::1]:9000/p/x");
        assert_eq!(
            Endpoint::parse("https://h.example").unwrap().host(),
            "h.example"
        );
    }

    #[test]
    fn responses() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"ok"[..]));
        let (s, b) = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"abcde"[..]));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nok").is_err());
        assert!(parse_response(b"garbage").is_err());
    }

    /// A real socket: the request line and the decoded body.
    #[test]
    fn get_from_a_local_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0);
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(
                b"HTTP/1.1 200 OK\r\ncontent-length: 24\r\n\r\n{\"time_unix\":12.5,\"x\":1}",
            )
            .unwrap();
            String::from_utf8(req).unwrap()
        });
        let e = Endpoint::parse(&format!("http://{addr}")).unwrap();
        let s: serde_json::Value = e
            .get_json("/api/v1/snapshot", Duration::from_secs(5))
            .unwrap();
        assert_eq!(s["time_unix"], 12.5);
        assert!(srv
            .join()
            .unwrap()
            .starts_with("GET /api/v1/snapshot HTTP/1.1\r\n"));
    }
}
