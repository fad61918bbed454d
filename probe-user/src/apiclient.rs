//! A client of a running daemon's HTTP API (`probe record`, `probe top`): a minimal blocking
//! HTTP/1.1 GET over a std TcpStream. Plain HTTP on purpose: the API is read on the host
//! or through a tunnel, and no TLS stack is linked for it.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, ToSocketAddrs as _},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};

/// A snapshot larger than this is refused (10,000 flows are a few MiB).
const MAX_BODY: usize = 256 << 20;

/// Where the daemon is: `http://HOST:PORT[/PREFIX]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `HOST:PORT` as given (the Host header).
    pub authority: String,
    /// Path prefix without a trailing slash ("" for none).
    pub prefix: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("`{url}` is not an http:// URL like http://127.0.0.1:9464"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
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
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}{path}", self.authority, self.prefix)
    }

    fn addr(&self) -> Result<SocketAddr> {
        self.authority
            .to_socket_addrs()
            .with_context(|| format!("resolving {}", self.authority))?
            .next()
            .ok_or_else(|| anyhow!("{} resolves to no address", self.authority))
    }

    /// GET `path` (after the prefix); the body of a 200 response.
    pub fn get(&self, path: &str, timeout: Duration) -> Result<Vec<u8>> {
        let addr = self.addr()?;
        let mut s = TcpStream::connect_timeout(&addr, timeout)
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        let req = format!(
            "GET {}{path} HTTP/1.1\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
            self.prefix, self.authority
        );
        s.write_all(req.as_bytes())?;
        let mut raw = Vec::new();
        s.take(MAX_BODY as u64 + 64 * 1024)
            .read_to_end(&mut raw)
            .context("reading the response")?;
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
        assert!(Endpoint::parse("https://x:1").is_err());
        assert!(Endpoint::parse("127.0.0.1:9464").is_err());
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
