//! probe, scraped by a real Prometheus that evaluates `rules/`, during a congestion episode and
//! during a calm run; and every query of the Grafana dashboard run against it.
//!
//! The lab: three veth pairs (subnets 113, 114, 115), each with a paced iperf3 TCP stream
//! (20 Mbit/s) from A to B. probe and Prometheus run in the first pair's A namespace; probe
//! monitors its veth, and its socket view (sock_ops) is host-wide, so it sees the RTT of all
//! three streams: three peers to take a median of. A tbf on the first veth starts wide open
//! (1 Gbit/s: no queue). The congestion episode tightens it to 8 Mbit/s, below the stream's
//! 20: the queue fills, packets wait there for hundreds of ms, and the RTT to 10.231.113.2
//! rises far above the two calm peers'. This kernel has no RDMA, so probe reads a fake
//! RoCE port (a sysfs tree, `probe_tests::rdma`) whose counters grow at set rates: a few
//! CNPs per second when calm, thousands during the episode.
//!
//! - Congestion: the right alerts go pending or firing, for the right labels: the queue
//!   (`ProbeQueueBuilding{iface="veth113a"}`), the straggler
//!   (`ProbeStragglerPeer{peer="10.231.113.2"}`) and the RDMA port
//!   (`ProbeRdmaCongestion{device="mlx5_0"}`), and no straggler or RTT alert names a calm
//!   peer. The recording rules have values; the straggler ratio Prometheus recorded is > 3,
//!   and the srtt it holds for the congested peer is within 2x of what `ss -ti` says of the
//!   iperf3 connection (the kernel's own view).
//! - Calm: same lab, tbf never tightened: after 40 s no alert is pending or firing for the
//!   lab's entities (alerts naming peers outside the lab's subnets are other tests' traffic,
//!   which probe sees host-wide), and every rule evaluates without error.
//! - Dashboard: every panel query of docs/grafana/probe.json runs without error and names
//!   only metrics probe exports (its /metrics descriptors) or the rules record, apart from
//!   the explicit allow-list below.
use probe_tests::iperf::{self, ClientOpts};
use probe_tests::prometheus::{self, Prometheus};
use probe_tests::rdma::{self, FakePort};
use probe_tests::{cmd, kernel, Pair, Probe, ProbeOpts};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

const SUBNETS: [u8; 3] = [113, 114, 115];
const PROM_PORT: u16 = 9090;
const TRAFFIC_SECONDS: u32 = 120;
const CONGESTED: &str = "10.231.113.2";
const IFACE: &str = "veth113a";

/// Metrics the dashboard may name before probe exports them: the spike model's (issue 9).
/// Empty this list when they land; the test then checks them like every other name.
const NOT_EXPORTED_YET: &[&str] = &[];

struct Lab {
    pairs: Vec<Pair>,
    rdma: FakePort,
    _servers: Vec<iperf::Server>,
    _clients: Vec<iperf::Client>,
    probe: Probe,
    prom: Prometheus,
}

impl Lab {
    fn start() -> Lab {
        cmd::require_root_and(&["ip", "tc", "iperf3", "prometheus"]);
        let pairs: Vec<Pair> = SUBNETS.iter().map(|s| Pair::new(*s).unwrap()).collect();
        let first = &pairs[0];
        // A queueing root qdisc (so sojourn is timed), wide open until the episode.
        first
            .a
            .run(&[
                "tc",
                "qdisc",
                "add",
                "dev",
                &first.veth_a,
                "root",
                "handle",
                "1:",
                "tbf",
                "rate",
                "1gbit",
                "burst",
                "256kb",
                "limit",
                "512kb",
            ])
            .unwrap();
        let rdma = FakePort::start("mlx5_0").unwrap();
        for (file, rate) in [
            (rdma::TRANSMIT_DATA, 2.5e7),
            (rdma::RECEIVE_DATA, 2.5e7),
            (rdma::TRANSMIT_WAIT, 100.0),
            (rdma::CNP_SENT, 3.0),
            (rdma::CNP_HANDLED, 5.0),
            (rdma::ECN_MARKED, 10.0),
        ] {
            rdma.set_rate(file, rate);
        }
        let config = rdma.root().with_file_name("probe.toml");
        std::fs::write(
            &config,
            format!(
                "[rdma]\nsysfs_root = \"{}\"\ninterval = \"500ms\"\n",
                rdma.root().display()
            ),
        )
        .unwrap();
        let mut opts = ProbeOpts::iface(&first.veth_a).tick("500ms");
        opts.extra = vec!["--config".into(), config.display().to_string()];
        let probe = Probe::start(&first.a, opts);
        let prom = Prometheus::start(&first.a, PROM_PORT, &[probe.addr()], "1s").unwrap();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for p in &pairs {
            let ip = IpAddr::V4(p.ip_b);
            servers.push(iperf::Server::start(&p.b, ip, iperf::PORT).unwrap());
            let mut o = ClientOpts::tcp(TRAFFIC_SECONDS);
            o.extra = vec!["-b".into(), "20M".into()];
            clients.push(iperf::Client::start(&p.a, ip, iperf::PORT, &o).unwrap());
        }
        Lab {
            pairs,
            rdma,
            _servers: servers,
            _clients: clients,
            probe,
            prom,
        }
    }

    fn ours(&self, peer: &str) -> bool {
        SUBNETS
            .iter()
            .any(|s| peer.starts_with(&format!("10.231.{s}.")))
    }

    /// Waits (bounded) until Prometheus has scraped probe a few times.
    fn wait_scraped(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let up = self.prom.targets_up().unwrap_or(false);
            let n = self
                .prom
                .query_values("count_over_time(up[1m])")
                .ok()
                .and_then(|v| v.first().map(|x| x.1))
                .unwrap_or(0.0);
            if up && n >= 5.0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "prometheus did not scrape probe: {:?}\n{}",
            self.prom.api("/api/v1/targets"),
            self.prom.child.stderr()
        );
    }

    /// Alerts about the lab's entities: an alert that names a peer outside the lab's
    /// subnets is about another test's traffic.
    fn our_alerts(&self) -> Vec<prometheus::Alert> {
        self.prom
            .alerts()
            .unwrap()
            .into_iter()
            .filter(|a| a.label("peer").is_none_or(|p| self.ours(p)))
            .collect()
    }
}

fn value(prom: &Prometheus, q: &str) -> Option<f64> {
    prom.query_values(q).ok()?.first().map(|x| x.1)
}

#[test]
fn congestion_fires_the_queue_and_straggler_alerts() {
    let lab = Lab::start();
    lab.wait_scraped();
    // Calm first, so the RTT baselines have calm samples.
    std::thread::sleep(Duration::from_secs(10));
    let first = &lab.pairs[0];
    first
        .a
        .run(&[
            "tc",
            "qdisc",
            "change",
            "dev",
            &first.veth_a,
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            "8mbit",
            "burst",
            "32kb",
            "limit",
            "512kb",
        ])
        .unwrap();
    lab.rdma.set_rate(rdma::CNP_HANDLED, 2000.0);
    lab.rdma.set_rate(rdma::ECN_MARKED, 20000.0);
    let episode = Instant::now();

    let want = |a: &prometheus::Alert| {
        (a.name == "ProbeQueueBuilding" && a.label("iface") == Some(IFACE))
            || (a.name == "ProbeStragglerPeer" && a.label("peer") == Some(CONGESTED))
            || (a.name == "ProbeRdmaCongestion" && a.label("device") == Some("mlx5_0"))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut last = Vec::new();
    while Instant::now() < deadline && seen.len() < 3 {
        last = lab.our_alerts();
        for a in last.iter().filter(|a| want(a)) {
            if seen.insert(a.name.clone()) {
                println!(
                    "{} {} after {:.1} s: {:?}",
                    a.name,
                    a.state,
                    episode.elapsed().as_secs_f64(),
                    a.labels
                );
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(
        seen.len(),
        3,
        "expected ProbeQueueBuilding, ProbeStragglerPeer and ProbeRdmaCongestion pending or \
         firing; saw {seen:?}; alerts: {last:#?}\n\
         probe log:\n{}",
        lab.probe.log_tail(20)
    );
    for a in &last {
        assert!(
            !(matches!(a.name.as_str(), "ProbeStragglerPeer" | "ProbePeerRttSpike")
                && a.label("peer") != Some(CONGESTED)),
            "an RTT alert names a calm peer: {a:?}"
        );
    }

    // Recording rules have values, and they agree with the kernel.
    let p = |q: &str| value(&lab.prom, q);
    let sojourn = p(&format!(
        "probe:qdisc_sojourn_seconds:mean5m{{iface=\"{IFACE}\"}}"
    ));
    let ratio = p(&format!(
        "probe:tcp_srtt_seconds:straggler_ratio{{peer=\"{CONGESTED}\"}}"
    ));
    let p99 = p(&format!(
        "probe:tcp_rtt_seconds:p99_5m{{peer=\"{CONGESTED}\"}}"
    ));
    let median = p("probe:tcp_srtt_seconds:host_median");
    let retx = p(&format!(
        "probe:tcp_retransmits:rate5m{{peer=\"{CONGESTED}\"}}"
    ));
    let cnp = p("probe:rdma_cnp_handled:rate2m{device=\"mlx5_0\"}");
    println!(
        "sojourn mean {sojourn:?} s, straggler ratio {ratio:?}, p99 {p99:?} s, \
         host median {median:?} s, retransmits {retx:?}/s, CNPs handled {cnp:?}/s"
    );
    assert!(cnp.is_some_and(|c| c > 100.0), "{cnp:?}");
    assert!(sojourn.is_some_and(|s| s > 0.005), "{sojourn:?}");
    assert!(ratio.is_some_and(|r| r > 3.0), "{ratio:?}");
    assert!(p99.is_some_and(|s| s > 0.005), "{p99:?}");
    assert!(median.is_some() && retx.is_some());
    // Behind the tbf the srtt swings by 3x within seconds, and the scrape and `ss` are not
    // the same instant: compare medians of five readings a second apart.
    let (mut proms, mut sss) = (Vec::new(), Vec::new());
    for i in 0..5 {
        if i > 0 {
            std::thread::sleep(Duration::from_secs(1));
        }
        proms.extend(p(&format!(
            "probe_tcp_srtt_seconds{{peer=\"{CONGESTED}\"}}"
        )));
        let ss = iperf::data_conn(&first.a, IpAddr::V4(first.ip_b), iperf::PORT)
            .unwrap()
            .and_then(|c| c.rtt_ms)
            .expect("ss -ti shows the iperf3 connection's rtt");
        sss.push(ss / 1e3);
    }
    let srtt = probe_tests::median(&proms).expect("probe_tcp_srtt_seconds has a value");
    let ss = probe_tests::median(&sss).unwrap();
    println!("srtt: prometheus {srtt:.4} s, ss -ti {ss:.4} s");
    assert!(
        srtt / ss < 2.0 && ss / srtt < 2.0,
        "prometheus {srtt} s vs ss {ss} s"
    );
    assert_eq!(lab.prom.unhealthy_rules().unwrap(), []);
    let _ = kernel::qdiscs(&first.a, IFACE).map(|q| println!("tc: {q:?}"));
}

#[test]
fn a_calm_run_fires_no_alert() {
    let lab = Lab::start();
    lab.wait_scraped();
    std::thread::sleep(Duration::from_secs(40));
    let alerts = lab.our_alerts();
    assert!(alerts.is_empty(), "alerts in a calm run: {alerts:#?}");
    assert_eq!(lab.prom.unhealthy_rules().unwrap(), []);
    // The recording rules still have values (they did evaluate).
    let median = value(&lab.prom, "probe:tcp_srtt_seconds:host_median");
    let peers = value(&lab.prom, "probe:tcp_active_peers:count");
    println!("calm: host median srtt {median:?} s over {peers:?} peers");
    assert!(peers.is_some_and(|n| n >= 3.0), "{peers:?}");
}

/// The PromQL of every panel (rows nest panels) and every query variable.
fn dashboard_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &serde_json::Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// The queries of the dashboard's variables (`label_values(...)`: Grafana's, not PromQL, so
/// only the metric names they use are checked).
fn variable_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    d["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let q = v["definition"].as_str()?;
            Some((format!("variable {}", v["name"].as_str()?), q.to_string()))
        })
        .collect()
}

/// A panel query as Grafana would send it: its variables substituted.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "5s")
        .replace("$__range", "5m")
        .replace("$instance", ".*")
        .replace("$peer", ".*")
        .replace("$iface", ".*")
        .replace("$horizon", ".*")
        .replace("$job", ".*")
}

/// Families probe's /metrics declares, and the sample names they allow.
fn exported(probe: &Probe) -> BTreeSet<String> {
    let body = probe.get("/metrics").unwrap().body;
    let mut names = BTreeSet::new();
    for l in body.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let fam = rest.split_whitespace().next().unwrap_or("");
            for suffix in [
                "", "_total", "_bucket", "_sum", "_count", "_created", "_info",
            ] {
                names.insert(format!("{fam}{suffix}"));
            }
        }
    }
    names
}

#[test]
fn every_dashboard_query_runs() {
    let path = prometheus::rules_dir().join("../docs/grafana/probe.json");
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let queries = dashboard_queries(&d);
    assert!(queries.len() >= 20, "only {} queries", queries.len());
    let lab = Lab::start();
    lab.wait_scraped();
    std::thread::sleep(Duration::from_secs(5));
    let exported = exported(&lab.probe);
    let recorded: BTreeSet<String> = prometheus::recorded_names().unwrap().into_iter().collect();
    let mut failures = Vec::new();
    let (mut with_data, mut allowed_unknown) = (0, BTreeSet::new());
    for (title, expr) in queries.iter().chain(&variable_queries(&d)) {
        for name in prometheus::metric_names(expr) {
            if NOT_EXPORTED_YET.contains(&name.as_str()) {
                allowed_unknown.insert(name);
            } else if !exported.contains(&name) && !recorded.contains(&name) {
                failures.push(format!("{title}: `{name}` is not a probe metric or rule"));
            }
        }
    }
    for (title, expr) in &queries {
        match lab.prom.query(&substitute(expr)) {
            Ok(r) if !r.is_empty() => with_data += 1,
            Ok(_) => println!("no data yet: {title}: {expr}"),
            Err(e) => failures.push(format!("{title}: {e:#}")),
        }
    }
    println!(
        "{} queries, {with_data} with data now; allowed before they are exported: {allowed_unknown:?}",
        queries.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The allow-list holds only names the dashboard uses and probe does not export yet.
    for n in NOT_EXPORTED_YET {
        assert!(
            !exported.contains(*n),
            "{n} is exported now: remove it from NOT_EXPORTED_YET"
        );
    }
    assert!(
        with_data * 2 >= queries.len(),
        "most panels should have data in this lab: {with_data} of {}",
        queries.len()
    );

    // The job dashboard: its panels need several hosts with --training-job, which this lab
    // has not, so only that every query names probe's metrics or rules and runs.
    let job: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(prometheus::rules_dir().join("../docs/grafana/job.json")).unwrap(),
    )
    .unwrap();
    let job_queries = dashboard_queries(&job);
    assert!(
        job_queries.len() >= 6,
        "only {} job queries",
        job_queries.len()
    );
    for (title, expr) in job_queries.iter().chain(&variable_queries(&job)) {
        for name in prometheus::metric_names(expr) {
            if !exported.contains(&name) && !recorded.contains(&name) {
                failures.push(format!(
                    "job: {title}: `{name}` is not a probe metric or rule"
                ));
            }
        }
    }
    for (title, expr) in &job_queries {
        if let Err(e) = lab.prom.query(&substitute(expr)) {
            failures.push(format!("job: {title}: {e:#}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
