//! Drawing the live view with ratatui. Layout degrades with the terminal: below 20 rows only
//! the peers table is shown, and every size down to 1x1 draws without panicking (ratatui
//! clips; nothing here subtracts from a width or height without saturating).
use ratatui::{
    layout::{Constraint, Direction, Layout, Rect},
    style::{Color, Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Sparkline, Table, TableState, Wrap},
    Frame as Term,
};

use super::{
    app::{App, Status},
    fmt as f,
    frame::Frame,
};

/// The first line: where, which tick, and whether the data is live.
pub fn title(app: &App) -> String {
    let status = match (&app.status, app.paused) {
        (Status::Reconnecting(e), _) => format!("reconnecting ({e})"),
        (Status::Connecting, _) => "connecting".to_string(),
        (Status::Live, true) => "paused".to_string(),
        (Status::Live, false) => "live".to_string(),
    };
    let (tick, clock, version) = match &app.frame {
        Some(fr) => (
            fr.tick.map_or(f::DASH.into(), |t| t.to_string()),
            clock(fr.time_unix),
            match fr.api_version {
                Some(v) if v > super::model::KNOWN_API_VERSION => format!("  api v{v} (newer)"),
                _ => String::new(),
            },
        ),
        None => (f::DASH.into(), f::DASH.into(), String::new()),
    };
    // Names sort ascending, numbers descending; `r` flips either.
    let ascending = (app.sort == super::app::SortBy::Peer) != app.reverse;
    let dir = if ascending { "asc" } else { "desc" };
    let mut t = format!(
        "probe top  {}  tick {tick}  {clock} UTC  {status}  sort: {} {dir}{version}",
        app.url,
        app.sort.name()
    );
    if !app.filter.is_empty() || app.editing_filter {
        t.push_str(&format!("  filter: {}", app.filter));
    }
    t
}

/// `HH:MM:SS` of a Unix time.
fn clock(t: f64) -> String {
    let s = t.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// The probe's own health and cost, as short lines.
pub fn self_lines(fr: &Frame) -> Vec<String> {
    let p = &fr.probe;
    let opt = |v: Option<f64>| v.map_or(f::DASH.into(), |x| format!("{x:.0}"));
    let mut v = vec![
        format!(
            "hooks {}/{} attached{}",
            p.hooks_attached,
            p.hooks,
            if p.hooks_missing.is_empty() {
                String::new()
            } else {
                format!(" (missing: {})", p.hooks_missing.join(", "))
            }
        ),
        format!(
            "daemon cpu {}  rss {}",
            f::percent(p.cpu_per_s),
            f::si(p.rss_bytes, "B")
        ),
        format!(
            "flows tracked {}  evicted {}  peers folded {}",
            opt(p.flows_tracked),
            opt(p.flow_evictions),
            opt(p.peers_folded)
        ),
        format!("events lost {}", opt(p.events_lost)),
    ];
    if !p.stages.is_empty() {
        let t: Vec<String> = p
            .stages
            .iter()
            .map(|(s, secs)| format!("{s} {}", f::secs(Some(*secs))))
            .collect();
        v.push(format!("tick {}", t.join("  ")));
    }
    if let Some(j) = &fr.job {
        v.push(job_line(j));
    }
    let full: Vec<String> = p.map_full.iter().map(|(m, n)| format!("{m}={n}")).collect();
    v.push(format!(
        "map full {}",
        if full.is_empty() {
            f::DASH.to_string()
        } else {
            full.join(" ")
        }
    ));
    v
}

/// The host's own early warning: its score against its threshold (the alert also needs the
/// host to stand out against the job's others, which only Prometheus sees).
fn job_line(j: &super::model::Job) -> String {
    let score = match (j.warning_score, j.warning_threshold) {
        (Some(s), Some(t)) if s >= t => {
            let dir = j
                .direction_score
                .iter()
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(String::new(), |(d, _)| format!(" {d}"));
            format!("warning {s:.2} >= {t:.2} WARNING{dir}")
        }
        (Some(s), Some(t)) => format!("warning {s:.2} < {t:.2}"),
        _ => "no job model".to_string(),
    };
    format!("job peers {}  {score}", j.peers)
}

fn block(title: &str) -> Block<'_> {
    Block::default().borders(Borders::TOP).title(title)
}

fn header<const N: usize>(h: [&str; N]) -> Row<'static> {
    Row::new(h.map(|s| Cell::from(s.to_string())))
        .style(Style::default().add_modifier(Modifier::BOLD))
}

fn widths(w: &[u16]) -> Vec<Constraint> {
    w.iter().map(|w| Constraint::Min(*w)).collect()
}

pub fn draw(t: &mut Term, app: &App) {
    let area = t.area();
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .split(area);
    t.render_widget(
        Paragraph::new(title(app)).style(Style::default().add_modifier(Modifier::REVERSED)),
        rows[0],
    );
    t.render_widget(Paragraph::new(footer(app)), rows[2]);
    let body = rows[1];
    match (&app.frame, app.detail_peer()) {
        (None, _) => t.render_widget(Paragraph::new("waiting for the daemon..."), body),
        (Some(_), Some(_)) => draw_detail(t, app, body),
        (Some(fr), None) => {
            if body.height >= 18 {
                let split = Layout::default()
                    .direction(Direction::Vertical)
                    .constraints([Constraint::Percentage(55), Constraint::Percentage(45)])
                    .split(body);
                draw_peers(t, app, split[0]);
                draw_lower(t, fr, split[1]);
            } else {
                draw_peers(t, app, body);
            }
        }
    }
    if app.help {
        draw_help(t, area);
    }
}

fn footer(app: &App) -> String {
    if app.editing_filter {
        format!("filter peers: {}_   (Enter keep, Esc clear)", app.filter)
    } else {
        "q quit  s/S sort  r reverse  / filter  p pause  ↑↓ select  Enter detail  ? help".into()
    }
}

/// Columns of the peers table that fit a narrow terminal: peer, srtt, p99, tx, rx, flag.
const NARROW: [usize; 6] = [0, 1, 2, 5, 6, 12];

fn draw_peers(t: &mut Term, app: &App, area: Rect) {
    let peers = app.visible_peers();
    let all: Vec<usize> = (0..f::PEER_HEADER.len()).collect();
    let cols: &[usize] = if area.width < 110 { &NARROW } else { &all };
    let pick = |cells: [String; 13]| cols.iter().map(|i| cells[*i].clone()).collect::<Vec<_>>();
    let rows: Vec<Row> = peers
        .iter()
        .map(|p| {
            let r = Row::new(pick(f::peer_cells(p, &app.history(&p.peer))));
            if p.is_straggler() {
                r.style(Style::default().fg(Color::Red))
            } else {
                r
            }
        })
        .collect();
    let title = format!("Peers ({})", peers.len());
    let head = Row::new(pick(f::PEER_HEADER.map(String::from)))
        .style(Style::default().add_modifier(Modifier::BOLD));
    let w: Vec<u16> = cols.iter().map(|i| f::PEER_WIDTHS[*i]).collect();
    let table = Table::new(rows, widths(&w))
        .header(head)
        .block(block(&title))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    let mut state = TableState::default().with_selected(Some(app.selected));
    t.render_stateful_widget(table, area, &mut state);
}

fn draw_lower(t: &mut Term, fr: &Frame, area: Rect) {
    let cols = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(55), Constraint::Percentage(45)])
        .split(area);
    let left = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(fr.ifaces.len().min(6) as u16 + 2),
            Constraint::Min(0),
        ])
        .split(cols[0]);
    let ifaces = fr.ifaces.iter().map(|i| Row::new(f::iface_cells(i)));
    t.render_widget(
        Table::new(ifaces, widths(&[10, 9, 9, 6, 6]))
            .header(header(f::IFACE_HEADER))
            .block(block("Interfaces")),
        left[0],
    );
    let mut q: Vec<Row> = fr
        .qdiscs
        .iter()
        .map(|q| Row::new(f::qdisc_cells(q)))
        .collect();
    q.extend(fr.drops.iter().map(|(r, v)| {
        Row::new([
            format!("drop {r}"),
            String::new(),
            String::new(),
            String::new(),
            f::rate(*v),
            String::new(),
        ])
    }));
    t.render_widget(
        Table::new(q, widths(&[18, 9, 8, 5, 6, 7]))
            .header(header(f::QDISC_HEADER))
            .block(block("Queues and drops")),
        left[1],
    );
    let right = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(fr.rdma.len().clamp(1, 4) as u16 + 2),
            Constraint::Min(0),
        ])
        .split(cols[1]);
    if fr.rdma.is_empty() {
        t.render_widget(Paragraph::new("no ports").block(block("RDMA")), right[0]);
    } else {
        let r = fr.rdma.iter().map(|r| Row::new(f::rdma_cells(r)));
        t.render_widget(
            Table::new(r, widths(&[8, 8, 8, 6, 6, 6, 6, 5]))
                .header(header(f::RDMA_HEADER))
                .block(block("RDMA")),
            right[0],
        );
    }
    let mut lines: Vec<Line> = self_lines(fr).into_iter().map(Line::from).collect();
    for p in &fr.probe.programs {
        lines.push(Line::from(format!(
            "{:<24} {:>6} ns/run {:>7} runs/s",
            p.program,
            p.ns_per_run.map_or(f::DASH.into(), |n| format!("{n:.0}")),
            f::rate(p.runs_per_s)
        )));
    }
    t.render_widget(
        Paragraph::new(lines)
            .block(block("probe"))
            .wrap(Wrap { trim: true }),
        right[1],
    );
}

fn draw_detail(t: &mut Term, app: &App, area: Rect) {
    let Some(p) = app.detail_peer() else {
        return;
    };
    let hist = app.history(&p.peer);
    let parts = Layout::default()
        .direction(Direction::Vertical)
        .constraints([Constraint::Length(7), Constraint::Min(0)])
        .split(area);
    // Sparkline takes integers: microseconds.
    let data: Vec<u64> = hist.iter().map(|s| (s * 1e6) as u64).collect();
    let spark_title = format!(
        "Peer {}  srtt {}  (last {} ticks, max {})",
        p.peer,
        f::secs(p.srtt),
        hist.len(),
        f::secs(hist.iter().copied().reduce(f64::max))
    );
    let shown = &data[data.len().saturating_sub(parts[0].width as usize)..];
    t.render_widget(
        Sparkline::default().block(block(&spark_title)).data(shown),
        parts[0],
    );
    let mut lines = vec![
        format!(
            "p99 {}  min {}  connections {}  retx/s {}",
            f::secs(p.rtt_p99),
            f::secs(p.min_rtt),
            p.connections.map_or(f::DASH.into(), |c| format!("{c:.0}")),
            f::rate(p.retransmits_per_s)
        ),
        format!(
            "tx {}  rx {}  bursts/s {}  burst {}",
            f::bytes_rate(p.tx_bytes_per_s),
            f::bytes_rate(p.rx_bytes_per_s),
            f::rate(p.bursts_per_s),
            f::si(p.burst_bytes, "B")
        ),
        format!(
            "straggler ratio {}{}  RTT forecast {}",
            p.straggler_ratio
                .map_or(f::DASH.into(), |r| format!("{r:.2}")),
            if p.is_straggler() { " (straggler)" } else { "" },
            f::secs(p.rtt_forecast)
        ),
    ];
    for (h, v, alarm) in &p.spike {
        lines.push(format!(
            "spike within {}: {}{}",
            f::secs(Some(*h)),
            f::percent(Some(*v)),
            if *alarm {
                " (at or above the model's threshold)"
            } else {
                ""
            }
        ));
    }
    lines.push(String::new());
    if p.features.is_empty() {
        lines.push("features: - (the daemon sends none)".into());
    }
    for (k, v) in &p.features {
        lines.push(format!("{k:<32} {v:.6}"));
    }
    let text: Vec<Line> = lines.into_iter().map(Line::from).collect();
    t.render_widget(
        Paragraph::new(text)
            .block(block("Detail (Esc back)"))
            .wrap(Wrap { trim: true }),
        parts[1],
    );
}

fn draw_help(t: &mut Term, area: Rect) {
    let text = [
        "q, Ctrl-C   quit",
        "s / S       next / previous sort column",
        "r           reverse the sort",
        "/           filter peers by text (Enter keep, Esc clear)",
        "p, space    pause / resume",
        "↑ ↓, j k    select a peer",
        "Enter       detail of the selected peer",
        "Esc         back / clear the filter",
        "? h         this help",
        "",
        "A peer in red is a straggler (RTT >= 3x the host's median).",
        "\"-\" means the daemon did not send the value.",
    ];
    let w = 64.min(area.width);
    let h = (text.len() as u16 + 2).min(area.height);
    let r = Rect {
        x: area.x + (area.width - w) / 2,
        y: area.y + (area.height - h) / 2,
        width: w,
        height: h,
    };
    t.render_widget(Clear, r);
    t.render_widget(
        Paragraph::new(text.map(Line::from).to_vec())
            .block(Block::default().borders(Borders::ALL).title("Help")),
        r,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::model::Snapshot;
    use crossterm::event::{KeyCode, KeyEvent};
    use ratatui::{backend::TestBackend, Terminal};

    fn app() -> App {
        let mut a = App::new("http://127.0.0.1:9464");
        let s: Snapshot = serde_json::from_value(serde_json::json!({
            "tick": 7, "time_unix": 3661.0,
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.002},
                      {"peer": "fd00:231:1::2", "srtt_seconds": 0.0001}],
            "qdiscs": [{"iface": "eth0", "kind": "tbf", "handle": "1:", "backlog_bytes": 1000}],
            "rdma": {"ports": [{"device": "mlx5_0", "port": 1, "rates": {"cnp_sent": 5.0}}]},
            "hooks": [{"hook": "tc", "attached": true}, {"hook": "sock_ops", "attached": false}],
            "job": {"peers": 3, "warning_score": 0.81, "warning_threshold": 0.68}
        }))
        .unwrap();
        a.on_snapshot(s);
        a
    }

    fn screen(a: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, a)).unwrap();
        let buf = t.backend().buffer().clone();
        let mut s = String::new();
        for y in 0..h {
            for x in 0..w {
                s.push_str(buf[(x, y)].symbol());
            }
            s.push('\n');
        }
        s
    }

    /// Every size down to 1x1 draws, in every view.
    #[test]
    fn any_size_draws() {
        let mut a = app();
        for view in 0..3 {
            for (w, h) in [(1, 1), (5, 3), (40, 12), (80, 24), (200, 60)] {
                screen(&a, w, h);
            }
            match view {
                0 => a.on_key(KeyEvent::from(KeyCode::Enter)),
                _ => a.on_key(KeyEvent::from(KeyCode::Char('?'))),
            }
        }
    }

    #[test]
    fn panes_and_detail() {
        let mut a = app();
        let s = screen(&a, 150, 40);
        assert!(s.contains("tick 7  01:01:01 UTC  live"), "{s}");
        for want in [
            "10.0.0.2",
            "fd00:231:1::2",
            "eth0/tbf/1:",
            "mlx5_0/1",
            "hooks 1/2",
            "job peers 3  warning 0.81 >= 0.68 WARNING",
        ] {
            assert!(s.contains(want), "{want} missing:\n{s}");
        }
        assert!(s.contains("missing: sock_ops"), "{s}");
        a.on_key(KeyEvent::from(KeyCode::Enter));
        let s = screen(&a, 100, 30);
        assert!(s.contains("Peer 10.0.0.2"), "{s}");
        a.on_error("connection refused".into());
        assert!(screen(&a, 100, 30).contains("reconnecting (connection refused)"));
    }
}
