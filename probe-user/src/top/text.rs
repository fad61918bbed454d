//! `probe top --once`: one frame as plain text (no colours, no escape codes), for scripts,
//! tests and bug reports. Same sections and columns as the live view.
use std::fmt::Write as _;

use super::{
    app::App,
    fmt::{self as f, DASH},
};

/// Left-aligned columns, each as wide as its widest cell, two spaces apart.
fn table<const N: usize>(out: &mut String, header: [&str; N], rows: &[[String; N]]) {
    let mut w = [0usize; N];
    for (i, h) in header.iter().enumerate() {
        w[i] = h.chars().count();
    }
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            s.push_str(c);
            s.extend(std::iter::repeat_n(' ', pad + 2));
        }
        s.trim_end().to_string()
    };
    let _ = writeln!(out, "{}", line(&mut header.iter().copied()));
    for r in rows {
        let _ = writeln!(out, "{}", line(&mut r.iter().map(String::as_str)));
    }
}

pub fn render(app: &App) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", super::ui::title(app));
    let Some(fr) = &app.frame else {
        let _ = writeln!(out, "no data");
        return out;
    };
    out.push('\n');
    let peers: Vec<[String; 13]> = app
        .visible_peers()
        .iter()
        .map(|p| f::peer_cells(p, &app.history(&p.peer)))
        .collect();
    let _ = writeln!(out, "PEERS ({})", peers.len());
    table(&mut out, f::PEER_HEADER, &peers);
    out.push('\n');
    let ifaces: Vec<_> = fr.ifaces.iter().map(f::iface_cells).collect();
    table(&mut out, f::IFACE_HEADER, &ifaces);
    out.push('\n');
    let qdiscs: Vec<_> = fr.qdiscs.iter().map(f::qdisc_cells).collect();
    table(&mut out, f::QDISC_HEADER, &qdiscs);
    out.push('\n');
    let drops: Vec<[String; 2]> = fr
        .drops
        .iter()
        .map(|(r, v)| [r.clone(), f::rate(*v)])
        .collect();
    table(&mut out, ["DROP REASON", "PKTS/s"], &drops);
    out.push('\n');
    if fr.rdma.is_empty() {
        let _ = writeln!(out, "RDMA: no ports");
    } else {
        let rdma: Vec<_> = fr.rdma.iter().map(f::rdma_cells).collect();
        table(&mut out, f::RDMA_HEADER, &rdma);
    }
    out.push('\n');
    for l in super::ui::self_lines(fr) {
        let _ = writeln!(out, "{l}");
    }
    let programs: Vec<[String; 3]> = fr
        .probe
        .programs
        .iter()
        .map(|p| {
            [
                p.program.clone(),
                p.ns_per_run.map_or(DASH.into(), |n| format!("{n:.0}")),
                f::rate(p.runs_per_s),
            ]
        })
        .collect();
    if !programs.is_empty() {
        table(&mut out, ["PROGRAM", "NS/RUN", "RUNS/s"], &programs);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::Snapshot;

    #[test]
    fn plain_text_with_every_section() {
        let mut a = App::new("http://h:9464");
        assert!(render(&a).contains("no data"));
        let s: Snapshot = serde_json::from_value(serde_json::json!({
            "tick": 1, "time_unix": 10.0,
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.0015}],
            "links": [{"iface": "eth0", "tx_bytes": 100}],
            "programs": [{"program": "tc_egress_eth", "run_seconds": 1e-6, "runs": 2}]
        }))
        .unwrap();
        a.on_snapshot(s);
        let t = render(&a);
        assert!(!t.contains('\x1b'));
        assert!(
            t.lines()
                .any(|l| l.starts_with("10.0.0.2") && l.contains("1.5ms")),
            "{t}"
        );
        assert!(
            t.contains("RDMA: no ports") && t.contains("tc_egress_eth  500"),
            "{t}"
        );
    }
}
