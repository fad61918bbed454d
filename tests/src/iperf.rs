//! iperf3 servers and clients between test namespaces, every run bounded in time.
use crate::kernel;
use crate::netns::Netns;
use crate::process::Child;
use anyhow::{bail, Context, Result};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// iperf3's default port.
pub const PORT: u16 = 5201;

/// An `iperf3 -s` in a namespace; stopped on drop.
pub struct Server {
    pub child: Child,
    pub addr: IpAddr,
    pub port: u16,
}

impl Server {
    /// Starts `iperf3 -s -B addr -p port` in `ns` and waits (bounded) until it listens on
    /// that address.
    pub fn start(ns: &Netns, addr: IpAddr, port: u16) -> Result<Server> {
        let a = addr.to_string();
        let p = port.to_string();
        let child = Child::spawn(
            "iperf3 -s",
            &mut ns.command(&["iperf3", "-s", "-B", &a, "-p", &p]),
        )?;
        let mut s = Server { child, addr, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = s.child.try_wait() {
                bail!("iperf3 server exited ({st}): {}", s.child.stderr());
            }
            // The exact address: tests run several servers on one port, and a client that
            // connects before its own server listens is refused.
            let local = match addr {
                IpAddr::V4(a) => format!("{a}:{port}"),
                IpAddr::V6(a) => format!("[{a}]:{port}"),
            };
            let listening = ns.run(&["ss", "-tlnH", "src", &local])?;
            if !listening.trim().is_empty() {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                bail!("iperf3 server not listening on {port} after 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What an iperf3 client run does.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    pub seconds: u32,
    /// `-u -b RATE` (e.g. "200M") for UDP; TCP when None.
    pub udp_rate: Option<String>,
    /// `-C ALGO`: TCP congestion control.
    pub congestion: Option<String>,
    /// `-R`: the server sends.
    pub reverse: bool,
    pub extra: Vec<String>,
}

impl ClientOpts {
    pub fn tcp(seconds: u32) -> ClientOpts {
        ClientOpts {
            seconds,
            udp_rate: None,
            congestion: None,
            reverse: false,
            extra: Vec::new(),
        }
    }

    pub fn udp(seconds: u32, rate: &str) -> ClientOpts {
        ClientOpts {
            udp_rate: Some(rate.to_owned()),
            ..ClientOpts::tcp(seconds)
        }
    }

    pub fn congestion(mut self, algo: &str) -> Self {
        self.congestion = Some(algo.to_owned());
        self
    }
}

/// The summary of a client run (`iperf3 -J`).
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Throughput the receiver saw, bits/s.
    pub received_bps: f64,
    pub sent_bytes: f64,
    pub received_bytes: f64,
    /// TCP sender retransmits (iperf3 reads them from TCP_INFO).
    pub retransmits: Option<u64>,
    /// UDP loss, percent.
    pub lost_percent: Option<f64>,
}

/// Parses `iperf3 -J` output.
pub fn parse_json(text: &str) -> Result<Report> {
    let v: serde_json::Value = serde_json::from_str(text).context("iperf3 -J output")?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {e}");
    }
    let end = v.get("end").context("no end in iperf3 JSON")?;
    let f = |obj: &str, k: &str| end.get(obj).and_then(|o| o.get(k)).and_then(|x| x.as_f64());
    if let Some(bps) = f("sum_received", "bits_per_second") {
        Ok(Report {
            received_bps: bps,
            sent_bytes: f("sum_sent", "bytes").unwrap_or(0.0),
            received_bytes: f("sum_received", "bytes").unwrap_or(0.0),
            retransmits: f("sum_sent", "retransmits").map(|r| r as u64),
            lost_percent: None,
        })
    } else {
        // UDP: one "sum", as the receiver reported it.
        Ok(Report {
            received_bps: f("sum", "bits_per_second").context("no sum in iperf3 JSON")?,
            sent_bytes: f("sum", "bytes").unwrap_or(0.0),
            received_bytes: f("sum", "bytes").unwrap_or(0.0),
            retransmits: None,
            lost_percent: f("sum", "lost_percent"),
        })
    }
}

/// A running iperf3 client.
pub struct Client {
    pub child: Child,
    seconds: u32,
}

impl Client {
    /// Starts `iperf3 -c server ...` in `ns`.
    pub fn start(ns: &Netns, server: IpAddr, port: u16, opts: &ClientOpts) -> Result<Client> {
        let (s, p, t) = (
            server.to_string(),
            port.to_string(),
            opts.seconds.to_string(),
        );
        let mut argv = vec![
            "iperf3",
            "-c",
            &s,
            "-p",
            &p,
            "-t",
            &t,
            "-J",
            "--connect-timeout",
            "5000",
        ];
        if let Some(rate) = &opts.udp_rate {
            argv.extend(["-u", "-b", rate]);
        }
        if let Some(cc) = &opts.congestion {
            argv.extend(["-C", cc]);
        }
        if opts.reverse {
            argv.push("-R");
        }
        argv.extend(opts.extra.iter().map(String::as_str));
        let child = Child::spawn("iperf3 -c", &mut ns.command(&argv))?;
        Ok(Client {
            child,
            seconds: opts.seconds,
        })
    }

    /// Waits for the run to end (at most its duration plus 20 s) and parses its report.
    pub fn finish(mut self) -> Result<Report> {
        let limit = Duration::from_secs(self.seconds as u64 + 20);
        let st = self
            .child
            .wait_timeout(limit)
            .with_context(|| format!("iperf3 client still running after {limit:?}"))?;
        let out = self.child.stdout();
        let report = parse_json(&out);
        if !st.success() {
            bail!(
                "iperf3 client failed ({st}): {}{}",
                report.err().map(|e| format!("{e:#}; ")).unwrap_or_default(),
                self.child.stderr()
            );
        }
        report
    }
}

/// Runs a client to completion.
pub fn run_client(ns: &Netns, server: IpAddr, port: u16, opts: &ClientOpts) -> Result<Report> {
    Client::start(ns, server, port, opts)?.finish()
}

/// The data connection of a running iperf3 client in `ns` towards `server`, as `ss -tin`
/// shows it (the connection to the server port that moved the most bytes).
pub fn data_conn(ns: &Netns, server: IpAddr, port: u16) -> Result<Option<kernel::SsConn>> {
    let conns = kernel::ss_tcp(ns)?;
    Ok(kernel::busiest_conn(&conns, server, Some(port)).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_report_fixture() {
        let r = parse_json(include_str!("fixtures/iperf.json")).unwrap();
        assert_eq!(r.received_bps, 47709637.073819466);
        assert_eq!(r.sent_bytes, 24914288.0);
        assert_eq!(r.received_bytes, 23874624.0);
        assert_eq!(r.retransmits, Some(0));
    }

    #[test]
    fn udp_and_error_reports() {
        let udp = r#"{"start":{},"intervals":[],"end":{"sum":{"start":0,"end":3,"seconds":3,
            "bytes":75000000,"bits_per_second":200000000,"jitter_ms":0.01,"lost_packets":3,
            "packets":51000,"lost_percent":0.0058}}}"#;
        let r = parse_json(udp).unwrap();
        assert_eq!(r.received_bps, 2e8);
        assert_eq!(r.lost_percent, Some(0.0058));
        let err = parse_json(r#"{"start":{},"error":"unable to connect to server"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unable to connect"), "{err}");
    }
}
