//! A real Prometheus server (Debian's `prometheus` package) for end-to-end tests: started in
//! a test namespace on loopback, with a temporary data directory, scraping the given targets
//! and evaluating the project's `rules/`; stopped and its directory removed on drop.
//!
//! The rule files are loaded as written except for one change: a group's own `interval:` is
//! dropped, so every group is evaluated at the test's short `evaluation_interval` (the
//! recording group says 30 s, which would make a test wait minutes). Expressions, `for:`
//! holds and thresholds are untouched.
use crate::http;
use crate::netns::Netns;
use crate::process::Child;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicUsize = AtomicUsize::new(0);
const READY_TIMEOUT: Duration = Duration::from_secs(30);
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// `<workspace>/rules`.
pub fn rules_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../rules")
}

/// The rule files of `rules/` (not the promtool tests, `*_test.yml`), sorted.
pub fn rule_files() -> Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(rules_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (n.ends_with(".yml") || n.ends_with(".yaml")) && !n.contains("_test.")
        })
        .collect();
    v.sort();
    Ok(v)
}

/// The names every rule file records (`- record: NAME`).
pub fn recorded_names() -> Result<Vec<String>> {
    let mut names = Vec::new();
    for f in rule_files()? {
        for l in std::fs::read_to_string(&f)?.lines() {
            if let Some(n) = l.trim().strip_prefix("- record:") {
                names.push(n.trim().to_string());
            }
        }
    }
    Ok(names)
}

/// A rule file without its groups' `interval:` lines (see the module comment).
fn without_group_intervals(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("interval:"))
        .map(|l| format!("{l}\n"))
        .collect()
}

pub struct Prometheus {
    pub child: Child,
    ns_path: String,
    addr: SocketAddr,
    dir: PathBuf,
}

/// One alert as `/api/v1/alerts` lists it.
#[derive(Debug, Clone)]
pub struct Alert {
    pub name: String,
    /// "pending" or "firing".
    pub state: String,
    pub labels: serde_json::Map<String, Value>,
}

impl Alert {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels.get(k).and_then(Value::as_str)
    }
}

impl Prometheus {
    /// Starts Prometheus in `ns` on 127.0.0.1:`port`, scraping `targets` (in the same
    /// namespace) every `interval` and evaluating `rules/` as often.
    pub fn start(
        ns: &Netns,
        port: u16,
        targets: &[SocketAddr],
        interval: &str,
    ) -> Result<Prometheus> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Self::start_in(&ns.path(), addr, targets, interval)
    }

    /// Starts Prometheus in the namespace at `ns_path` (`/var/run/netns/NAME`) listening on
    /// `addr`, scraping `targets` every `interval` and evaluating `rules/` as often.
    pub fn start_in(
        ns_path: &str,
        addr: SocketAddr,
        targets: &[SocketAddr],
        interval: &str,
    ) -> Result<Prometheus> {
        let dir = std::env::temp_dir().join(format!(
            "probe-prom-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(dir.join("data"))?;
        let mut rule_paths = Vec::new();
        for f in rule_files()? {
            let to = dir.join(f.file_name().context("rule file name")?);
            std::fs::write(&to, without_group_intervals(&std::fs::read_to_string(&f)?))?;
            rule_paths.push(to);
        }
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let rules: Vec<String> = rule_paths
            .iter()
            .map(|p| format!("  - '{}'\n", p.display()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  \
             evaluation_interval: {interval}\nrule_files:\n{}scrape_configs:\n  \
             - job_name: probe\n    static_configs:\n      - targets: [{}]\n",
            rules.concat(),
            targets.join(", ")
        );
        std::fs::write(dir.join("prometheus.yml"), config)?;
        let data = dir.join("data");
        let argv = [
            "prometheus".to_string(),
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", data.display()),
            format!("--web.listen-address={addr}"),
            "--storage.tsdb.retention.time=1h".into(),
            "--log.level=warn".into(),
        ];
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut cmd = std::process::Command::new("nsenter");
        cmd.arg(format!("--net={ns_path}")).args(argv);
        let child = Child::spawn("prometheus", &mut cmd)?;
        let mut p = Prometheus {
            child,
            ns_path: ns_path.to_owned(),
            addr,
            dir,
        };
        p.wait_ready()?;
        Ok(p)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait() {
                bail!("prometheus exited ({st}): {}", self.child.stderr());
            }
            if self.get("/-/ready").is_ok_and(|r| r.status == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!(
            "prometheus not ready after {READY_TIMEOUT:?}: {}",
            self.child.stderr()
        )
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn get(&self, path: &str) -> Result<http::Response> {
        let addr = self.addr;
        crate::netns::enter_path(&self.ns_path, || http::get(addr, path, QUERY_TIMEOUT))?
    }

    /// GET an API path; its `data`, or the API's error (`errorType: error`).
    pub fn api(&self, path: &str) -> Result<Value> {
        let r = self.get(path)?;
        let v: Value = serde_json::from_str(&r.body)
            .with_context(|| format!("{path} answered {}: {}", r.status, r.body))?;
        if v["status"] != "success" {
            bail!(
                "{}: {}",
                v["errorType"].as_str().unwrap_or("error"),
                v["error"].as_str().unwrap_or(&r.body)
            );
        }
        Ok(v["data"].clone())
    }

    /// An instant query; the result vector (`[{metric, value}]`).
    pub fn query(&self, promql: &str) -> Result<Vec<Value>> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .with_context(|| format!("query `{promql}`"))?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// `(labels, value)` of each series an instant query returns.
    pub fn query_values(&self, promql: &str) -> Result<Vec<(serde_json::Map<String, Value>, f64)>> {
        Ok(self
            .query(promql)?
            .into_iter()
            .filter_map(|r| {
                let labels = r["metric"].as_object()?.clone();
                let v = r["value"][1].as_str()?.parse().ok()?;
                Some((labels, v))
            })
            .collect())
    }

    /// Pending and firing alerts.
    pub fn alerts(&self) -> Result<Vec<Alert>> {
        let data = self.api("/api/v1/alerts")?;
        Ok(data["alerts"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|a| {
                        Some(Alert {
                            name: a["labels"]["alertname"].as_str()?.to_string(),
                            state: a["state"].as_str()?.to_string(),
                            labels: a["labels"].as_object()?.clone(),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Rules whose last evaluation failed: (rule name, error).
    pub fn unhealthy_rules(&self) -> Result<Vec<(String, String)>> {
        let data = self.api("/api/v1/rules")?;
        let mut bad = Vec::new();
        for g in data["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                if r["health"] != "ok" && r["health"] != "unknown" {
                    bad.push((
                        r["name"].as_str().unwrap_or("?").to_string(),
                        r["lastError"].as_str().unwrap_or("").to_string(),
                    ));
                }
            }
        }
        Ok(bad)
    }

    /// Whether every scrape target is up.
    pub fn targets_up(&self) -> Result<bool> {
        let data = self.api("/api/v1/targets")?;
        let active = data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(!active.is_empty() && active.iter().all(|t| t["health"] == "up"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.child.terminate(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encoding of a query parameter value (RFC 3986 unreserved characters pass).
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Metric names in a PromQL expression: identifiers that start with `probe_` or `probe:`
/// (probe's metrics and the rules' recorded series), outside string literals.
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_str: Option<char> = None;
    let mut cur = String::new();
    let flush = |cur: &mut String, names: &mut Vec<String>| {
        if cur.starts_with("probe_") || cur.starts_with("probe:") {
            names.push(cur.clone());
        }
        cur.clear();
    };
    for c in expr.chars() {
        if let Some(q) = in_str {
            if c == q {
                in_str = None;
            }
            continue;
        }
        if c == '"' || c == '\'' || c == '`' {
            flush(&mut cur, &mut names);
            in_str = Some(c);
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            cur.push(c);
        } else {
            flush(&mut cur, &mut names);
        }
    }
    flush(&mut cur, &mut names);
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_encoding() {
        assert_eq!(
            metric_names(
                r#"sum by (peer) (rate(probe_flow_bytes_total{peer=~"probe_x"}[1m])) / probe:foo:bar"#
            ),
            ["probe:foo:bar", "probe_flow_bytes_total"]
        );
        assert_eq!(encode("a b{c=\"d\"}"), "a%20b%7Bc%3D%22d%22%7D");
        assert_eq!(
            without_group_intervals("  - name: x\n    interval: 30s\n    rules:\n"),
            "  - name: x\n    rules:\n"
        );
    }
}
