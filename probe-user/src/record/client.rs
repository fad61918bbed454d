//! Fetching a running daemon's `/api/v1/snapshot`: a minimal blocking HTTP/1.1 GET over a
//! std TcpStream, and the JSON as the recorder reads it (the API's contract, not the
//! daemon's in-memory types: unknown fields are ignored, missing ones default).
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream, ToSocketAddrs as _},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use serde::Deserialize;

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

    /// The daemon's latest snapshot.
    pub fn snapshot(&self, timeout: Duration) -> Result<Snapshot> {
        let body = self.get("/api/v1/snapshot", timeout)?;
        serde_json::from_slice(&body).context("decoding the snapshot JSON")
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

// The JSON of /api/v1/snapshot (see src/snapshot.rs): only what the recorder uses.

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub time_unix: f64,
    pub tick_seconds: f64,
    pub interfaces: Vec<String>,
    pub flows: Vec<Flow>,
    pub peers: Vec<Peer>,
    pub flows_tracked: u64,
    pub flow_evictions: u64,
    pub bursts: Vec<Burst>,
    pub qdiscs: Vec<Qdisc>,
    pub sojourn: Vec<Sojourn>,
    pub drops: Vec<Drop>,
    pub links: Vec<Link>,
    pub peers_folded: u64,
    pub rdma: Option<Rdma>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Histogram {
    /// (upper bound, cumulative count).
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Flow {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub bytes: u64,
    pub packets: u64,
    pub ce_packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Peer {
    pub peer: String,
    pub srtt_seconds: Option<f64>,
    pub min_rtt_seconds: Option<f64>,
    pub connections: u32,
    pub rtt: Histogram,
    pub retransmits: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Burst {
    pub iface: String,
    pub direction: String,
    pub peer: String,
    pub count: u64,
    pub bytes: Histogram,
    pub duration: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Qdisc {
    pub iface: String,
    pub kind: String,
    pub handle: String,
    pub backlog_packets: u64,
    pub backlog_bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    pub sent_bytes: u64,
    pub sent_packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Sojourn {
    pub iface: String,
    pub seconds: Histogram,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Drop {
    pub reason: String,
    pub packets: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Link {
    pub iface: String,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Rdma {
    pub ports: Vec<RdmaPort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RdmaPort {
    pub device: String,
    pub port: u32,
    /// Per-second rates over the poller's last interval, by counter key.
    pub rates: BTreeMap<String, f64>,
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

    /// The daemon's own snapshot type, serialized, reads back into the recorder's view.
    #[test]
    fn reads_the_daemons_json() {
        use crate::snapshot as d;
        let snap = d::Snapshot {
            time_unix: 1_700_000_000.5,
            tick_seconds: 1.0,
            flows: vec![d::FlowSeries {
                iface: "eth0".into(),
                direction: "egress",
                peer: "10.0.0.2".into(),
                bytes: 1000,
                packets: 10,
                ce_packets: 1,
                ect_packets: 2,
            }],
            peers: vec![d::PeerSeries {
                peer: "10.0.0.2".into(),
                srtt_seconds: Some(0.003),
                min_rtt_seconds: None,
                connections: 2,
                rtt: d::Histogram::from_log2(&[0, 3, 1], 20, 1e-6),
                retransmits: 4,
            }],
            qdiscs: vec![d::QdiscSeries {
                iface: "eth0".into(),
                stats: crate::collect::netlink::QdiscStats {
                    kind: "tbf".into(),
                    handle: "8001:".into(),
                    backlog_bytes: 77,
                    ..Default::default()
                },
            }],
            links: vec![d::LinkSeries {
                iface: "eth0".into(),
                stats: crate::collect::netlink::LinkStats {
                    tx_bytes: 5,
                    ..Default::default()
                },
            }],
            ..d::Snapshot::default()
        };
        let json = serde_json::to_vec(&snap).unwrap();
        let s: Snapshot = serde_json::from_slice(&json).unwrap();
        assert_eq!(s.time_unix, 1_700_000_000.5);
        assert_eq!(s.flows[0].direction, "egress");
        assert_eq!((s.flows[0].bytes, s.flows[0].ce_packets), (1000, 1));
        assert_eq!(s.peers[0].srtt_seconds, Some(0.003));
        assert_eq!(s.peers[0].rtt.count, 4);
        assert_eq!(s.peers[0].rtt.buckets[1], (4e-6, 3));
        assert_eq!(
            (s.qdiscs[0].kind.as_str(), s.qdiscs[0].backlog_bytes),
            ("tbf", 77)
        );
        assert_eq!(s.links[0].tx_bytes, 5);
        assert!(s.rdma.is_none());
    }

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
        let s = e.snapshot(Duration::from_secs(5)).unwrap();
        assert_eq!(s.time_unix, 12.5);
        assert!(srv
            .join()
            .unwrap()
            .starts_with("GET /api/v1/snapshot HTTP/1.1\r\n"));
    }
}
