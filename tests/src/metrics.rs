//! A small OpenMetrics / Prometheus text parser: samples with name, labels and value.
use anyhow::{bail, Context, Result};
use std::collections::{BTreeMap, BTreeSet};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// Whether every `(label, value)` of `filter` matches.
    pub fn matches(&self, filter: &[(&str, &str)]) -> bool {
        filter
            .iter()
            .all(|(k, v)| self.labels.get(*k).map(String::as_str) == Some(*v))
    }
}

/// A parsed scrape.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    /// `# TYPE` lines: metric family -> type.
    pub types: BTreeMap<String, String>,
}

impl Metrics {
    pub fn parse(text: &str) -> Result<Metrics> {
        let mut m = Metrics::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix('#') {
                let mut f = rest.split_whitespace();
                if f.next() == Some("TYPE") {
                    if let (Some(n), Some(t)) = (f.next(), f.next()) {
                        m.types.insert(n.to_owned(), t.to_owned());
                    }
                }
                continue;
            }
            m.samples
                .push(parse_sample(line).with_context(|| format!("line {}: {line:?}", i + 1))?);
        }
        Ok(m)
    }

    /// Samples named `name` whose labels match `filter`.
    pub fn select<'a>(
        &'a self,
        name: &'a str,
        filter: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && s.matches(filter))
    }

    /// Sum of the matching samples (0 when none match).
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.select(name, filter).map(|s| s.value).sum()
    }

    /// The value of the one matching sample; None if none matches; an error if several do.
    pub fn get(&self, name: &str, filter: &[(&str, &str)]) -> Result<Option<f64>> {
        let v: Vec<f64> = self.select(name, filter).map(|s| s.value).collect();
        match v.len() {
            0 => Ok(None),
            1 => Ok(Some(v[0])),
            n => bail!("{n} samples of {name} match {filter:?}"),
        }
    }

    /// The distinct values of `label` over the samples named `name`.
    pub fn label_values(&self, name: &str, label: &str) -> BTreeSet<String> {
        self.select(name, &[])
            .filter_map(|s| s.labels.get(label).cloned())
            .collect()
    }

    /// Whether any sample is named `name`.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

fn parse_value(s: &str) -> Result<f64> {
    Ok(match s {
        "+Inf" | "Inf" | "inf" => f64::INFINITY,
        "-Inf" | "-inf" => f64::NEG_INFINITY,
        "NaN" | "nan" => f64::NAN,
        _ => s.parse().with_context(|| format!("bad value {s:?}"))?,
    })
}

/// `name{a="x",b="y\"z"} 1.5 [timestamp] [# exemplar]`.
fn parse_sample(line: &str) -> Result<Sample> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .context("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        bail!("no metric name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let end;
        loop {
            // Skip separators.
            while let Some((_, c)) = chars.peek() {
                if *c == ',' || c.is_whitespace() {
                    chars.next();
                } else {
                    break;
                }
            }
            let Some(&(start, c)) = chars.peek() else {
                bail!("unterminated labels");
            };
            if c == '}' {
                end = start + 1;
                break;
            }
            let mut key_end = start;
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    key_end = i;
                    break;
                }
            }
            let key = r[start..key_end].trim().to_owned();
            if !matches!(chars.next(), Some((_, '"'))) {
                bail!("label {key} has no quoted value");
            }
            let mut val = String::new();
            let mut closed = false;
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some((_, 'n')) => val.push('\n'),
                        Some((_, c)) => val.push(c),
                        None => bail!("dangling escape"),
                    },
                    '"' => {
                        closed = true;
                        break;
                    }
                    c => val.push(c),
                }
            }
            if !closed {
                bail!("unterminated label value");
            }
            labels.insert(key, val);
        }
        rest = &r[end..];
    }
    let value = rest
        .split_whitespace()
        .next()
        .context("no value after name")?;
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value: parse_value(value)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP probe_flow_bytes Bytes per flow.
# TYPE probe_flow_bytes counter
probe_flow_bytes_total{iface="veth1a",direction="egress",peer="10.231.1.2"} 123456
probe_flow_bytes_total{iface="veth1a",direction="ingress",peer="10.231.1.2"} 789
probe_flow_bytes_total{iface="veth1a",direction="egress",peer="fd00:231:1::2"} 44
probe_flow_bytes_created{iface="veth1a",direction="egress",peer="10.231.1.2"} 1.7e9
# TYPE probe_tcp_srtt_seconds gauge
probe_tcp_srtt_seconds{peer="10.231.1.2"} 0.0213
# TYPE probe_tcp_rtt_seconds histogram
probe_tcp_rtt_seconds_bucket{peer="10.231.1.2",le="0.001"} 0
probe_tcp_rtt_seconds_bucket{peer="10.231.1.2",le="+Inf"} 17 # {trace_id="x"} 0.02 1.7e9
probe_tcp_rtt_seconds_count{peer="10.231.1.2"} 17
probe_tcp_rtt_seconds_sum{peer="10.231.1.2"} 0.35
probe_build_info{version="0.1.0"} 1
probe_odd{msg="a \"quoted\", {braced} \\ value\n"} NaN
probe_flows_tracked 3 1700000000
# EOF
"#;

    #[test]
    fn parses_samples_and_labels() {
        let m = Metrics::parse(TEXT).unwrap();
        assert_eq!(m.samples.len(), 12);
        assert_eq!(m.types["probe_tcp_rtt_seconds"], "histogram");
        assert_eq!(
            m.sum(
                "probe_flow_bytes_total",
                &[("iface", "veth1a"), ("direction", "egress")]
            ),
            123500.0
        );
        assert_eq!(m.sum("probe_flow_bytes_total", &[]), 124289.0);
        assert_eq!(m.sum("probe_nothing", &[]), 0.0);
        assert_eq!(
            m.get("probe_tcp_srtt_seconds", &[("peer", "10.231.1.2")])
                .unwrap(),
            Some(0.0213)
        );
        assert!(m.get("probe_flow_bytes_total", &[]).is_err());
        assert_eq!(
            m.get("probe_tcp_srtt_seconds", &[("peer", "1.1.1.1")])
                .unwrap(),
            None
        );
        assert_eq!(
            m.get(
                "probe_tcp_rtt_seconds_bucket",
                &[("peer", "10.231.1.2"), ("le", "+Inf")]
            )
            .unwrap(),
            Some(17.0)
        );
        let peers = m.label_values("probe_flow_bytes_total", "peer");
        assert_eq!(peers.len(), 2);
        assert!(peers.contains("fd00:231:1::2"));
        let odd = m.select("probe_odd", &[]).next().unwrap();
        assert_eq!(odd.labels["msg"], "a \"quoted\", {braced} \\ value\n");
        assert!(odd.value.is_nan());
        assert_eq!(m.get("probe_flows_tracked", &[]).unwrap(), Some(3.0));
        assert!(m.has("probe_build_info"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Metrics::parse("probe_x{a=\"b\" 1\n").is_err());
        assert!(Metrics::parse("probe_x{a=b} 1\n").is_err());
        assert!(Metrics::parse("probe_x\n").is_err());
        assert!(Metrics::parse("probe_x abc\n").is_err());
    }
}
