//! A minimal HTTP/1.0 GET, made from inside a network namespace.
use crate::netns::Netns;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

/// GET `path` from `addr` with a plain HTTP/1.0 request over a std TcpStream.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // One write: a server that answers after the first segment must see the whole request.
    let req = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse_response(&raw)
}

/// [`get`] from a thread inside `ns`.
pub fn get_in(ns: &Netns, addr: SocketAddr, path: &str, timeout: Duration) -> Result<Response> {
    ns.enter(|| get(addr, path, timeout))?
        .with_context(|| format!("GET http://{addr}{path} in netns {}", ns.name()))
}

pub fn parse_response(raw: &[u8]) -> Result<Response> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("no end of headers in HTTP response")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut f = status_line.split_whitespace();
    if !f.next().unwrap_or_default().starts_with("HTTP/1.") {
        bail!("bad status line {status_line:?}");
    }
    let status = f
        .next()
        .context("no status code")?
        .parse()
        .with_context(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(Response {
        status,
        headers,
        body: String::from_utf8(body).context("body is not UTF-8")?,
    })
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("bad chunk")?;
        let size_str = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_str.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("bad chunk size {size_str:?}"))?;
        b = &b[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if b.len() < size + 2 {
            bail!("truncated chunk");
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
    fn parses_plain_and_chunked() {
        let r = parse_response(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nok\n").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "ok\n");
        assert_eq!(r.headers[0], ("content-type".into(), "text/plain".into()));
        let r = parse_response(
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.status, 503);
        assert_eq!(r.body, "abcde");
        assert!(parse_response(b"garbage").is_err());
    }

    #[test]
    fn get_against_a_local_server() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "request ended early");
                req.extend_from_slice(&buf[..n]);
            }
            let req = String::from_utf8_lossy(&req).into_owned();
            s.write_all(b"HTTP/1.0 200 OK\r\n\r\nhello").unwrap();
            req
        });
        let r = get(addr, "/healthz", Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (200, "hello"));
        assert!(srv.join().unwrap().starts_with("GET /healthz HTTP/1.0\r\n"));
    }
}
