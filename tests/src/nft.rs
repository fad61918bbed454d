//! nftables in a test namespace: a table with one base chain, rules with their own counters,
//! and those counters read back (`nft -j list chain`), the truth for drop tests.
use crate::netns::Netns;
use anyhow::{bail, Context, Result};

/// One rule's counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleCounter {
    pub handle: u64,
    pub packets: u64,
    pub bytes: u64,
}

/// Parses `nft -j list chain|ruleset`: the counters of the rules of `family table chain`, in
/// rule order (rules without a counter are left out).
pub fn parse_rule_counters(
    json: &str,
    family: &str,
    table: &str,
    chain: &str,
) -> Result<Vec<RuleCounter>> {
    let v: serde_json::Value = serde_json::from_str(json).context("nft -j output")?;
    let items = v
        .get("nftables")
        .and_then(|n| n.as_array())
        .context("no nftables array in nft -j output")?;
    let mut out = Vec::new();
    for item in items {
        let Some(rule) = item.get("rule") else {
            continue;
        };
        let s = |k: &str| rule.get(k).and_then(|x| x.as_str());
        if s("family") != Some(family) || s("table") != Some(table) || s("chain") != Some(chain) {
            continue;
        }
        let handle = rule
            .get("handle")
            .and_then(|h| h.as_u64())
            .context("rule without handle")?;
        let counter = rule
            .get("expr")
            .and_then(|e| e.as_array())
            .into_iter()
            .flatten()
            .find_map(|e| e.get("counter"));
        if let Some(c) = counter {
            let n = |k: &str| {
                c.get(k)
                    .and_then(|x| x.as_u64())
                    .with_context(|| format!("counter without {k}"))
            };
            out.push(RuleCounter {
                handle,
                packets: n("packets")?,
                bytes: n("bytes")?,
            });
        }
    }
    Ok(out)
}

/// An `inet` table with one base chain in `ns`; it goes away with the namespace, or on drop.
pub struct Table<'a> {
    ns: &'a Netns,
    pub name: String,
    pub chain: String,
}

impl<'a> Table<'a> {
    /// `nft add table inet NAME` and a filter chain `CHAIN` on `hook` (input, output,
    /// forward, prerouting, postrouting) at priority 0, policy accept.
    pub fn new(ns: &'a Netns, name: &str, chain: &str, hook: &str) -> Result<Table<'a>> {
        ns.run(&["nft", "add", "table", "inet", name])?;
        let t = Table {
            ns,
            name: name.to_owned(),
            chain: chain.to_owned(),
        };
        ns.run(&[
            "nft",
            &format!(
                "add chain inet {name} {chain} {{ type filter hook {hook} priority 0; policy accept; }}"
            ),
        ])?;
        Ok(t)
    }

    /// Appends a rule (`nft add rule inet TABLE CHAIN <rule...>`); returns its handle.
    pub fn add_rule(&self, rule: &[&str]) -> Result<u64> {
        let before: Vec<u64> = self.counters()?.iter().map(|c| c.handle).collect();
        let mut argv = vec!["nft", "add", "rule", "inet", &self.name, &self.chain];
        argv.extend_from_slice(rule);
        self.ns.run(&argv)?;
        let after = self.counters()?;
        match after.iter().find(|c| !before.contains(&c.handle)) {
            Some(c) => Ok(c.handle),
            None => bail!("rule {rule:?} has no counter (add `counter` to it)"),
        }
    }

    /// The counters of the chain's rules.
    pub fn counters(&self) -> Result<Vec<RuleCounter>> {
        let json = self.ns.run(&[
            "nft",
            "-j",
            "list",
            "chain",
            "inet",
            &self.name,
            &self.chain,
        ])?;
        parse_rule_counters(&json, "inet", &self.name, &self.chain)
    }

    /// The counter of the rule with `handle`.
    pub fn counter(&self, handle: u64) -> Result<RuleCounter> {
        self.counters()?
            .into_iter()
            .find(|c| c.handle == handle)
            .with_context(|| format!("no rule with handle {handle} in {}", self.chain))
    }

    /// The chain as `nft list` prints it, for failure messages.
    pub fn listing(&self) -> String {
        self.ns
            .run(&["nft", "list", "chain", "inet", &self.name, &self.chain])
            .unwrap_or_else(|e| format!("{e:#}"))
    }
}

impl Drop for Table<'_> {
    fn drop(&mut self) {
        let _ = self.ns.run(&["nft", "delete", "table", "inet", &self.name]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"chain": {"family": "inet", "table": "t", "name": "c", "handle": 1, "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 2, "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "10.0.0.1"}}, {"match": {"op": "==", "left": {"payload": {"protocol": "udp", "field": "dport"}}, "right": 5201}}, {"counter": {"packets": 1234, "bytes": 56789}}, {"drop": null}]}}, {"rule": {"family": "inet", "table": "t", "chain": "c", "handle": 3, "expr": [{"accept": null}]}}, {"rule": {"family": "inet", "table": "t", "chain": "other", "handle": 4, "expr": [{"counter": {"packets": 9, "bytes": 9}}]}}]}"#;

    #[test]
    fn counters_of_one_chain() {
        let c = parse_rule_counters(JSON, "inet", "t", "c").unwrap();
        assert_eq!(
            c,
            vec![RuleCounter {
                handle: 2,
                packets: 1234,
                bytes: 56789
            }]
        );
        assert!(parse_rule_counters(JSON, "ip", "t", "c")
            .unwrap()
            .is_empty());
        assert_eq!(
            parse_rule_counters(JSON, "inet", "t", "other").unwrap()[0].packets,
            9
        );
        assert!(parse_rule_counters("{}", "inet", "t", "c").is_err());
    }
}
