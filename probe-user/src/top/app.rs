//! The state of `probe top` and what each key does to it. No terminal I/O here, so that the
//! keys are unit-tested without a terminal.
use std::collections::{HashMap, VecDeque};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::{
    frame::{self, Frame, PeerRow},
    model::Snapshot,
};

/// RTT samples kept per peer for its sparkline (one per tick).
pub const HISTORY: usize = 120;
/// Peers whose history is kept; beyond it, the least recently seen are forgotten, so a host
/// that talks to many short-lived peers does not grow top without bound.
pub const MAX_HISTORIES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    Risk,
    Peer,
    Srtt,
    RttP99,
    Retransmits,
    Tx,
    Rx,
    Bursts,
}

impl SortBy {
    pub const ALL: [SortBy; 8] = [
        SortBy::Risk,
        SortBy::Peer,
        SortBy::Srtt,
        SortBy::RttP99,
        SortBy::Retransmits,
        SortBy::Tx,
        SortBy::Rx,
        SortBy::Bursts,
    ];

    pub fn name(self) -> &'static str {
        match self {
            SortBy::Risk => "risk",
            SortBy::Peer => "peer",
            SortBy::Srtt => "srtt",
            SortBy::RttP99 => "p99",
            SortBy::Retransmits => "retx/s",
            SortBy::Tx => "tx",
            SortBy::Rx => "rx",
            SortBy::Bursts => "bursts/s",
        }
    }

    fn step(self, by: isize) -> SortBy {
        let i = Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as isize;
        let n = Self::ALL.len() as isize;
        Self::ALL[(i + by).rem_euclid(n) as usize]
    }

    fn key(self, p: &PeerRow) -> f64 {
        let v = match self {
            SortBy::Risk => Some(p.risk()),
            SortBy::Peer => None,
            SortBy::Srtt => p.srtt,
            SortBy::RttP99 => p.rtt_p99,
            SortBy::Retransmits => p.retransmits_per_s,
            SortBy::Tx => p.tx_bytes_per_s,
            SortBy::Rx => p.rx_bytes_per_s,
            SortBy::Bursts => p.bursts_per_s,
        };
        // Unknown sorts below every known value.
        v.unwrap_or(f64::NEG_INFINITY)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    Connecting,
    Live,
    /// The last read failed; the screen keeps the last data it had.
    Reconnecting(String),
}

#[derive(Debug)]
pub struct App {
    pub url: String,
    pub frame: Option<Frame>,
    last: Option<Snapshot>,
    /// Recent srtt per peer, oldest first, and the tick it was last updated.
    history: HashMap<String, (VecDeque<f64>, u64)>,
    updates: u64,
    pub status: Status,
    pub sort: SortBy,
    /// Ascending instead of the default (descending; peer names ascending).
    pub reverse: bool,
    pub filter: String,
    pub editing_filter: bool,
    pub paused: bool,
    pub help: bool,
    /// Index into [`App::visible_peers`].
    pub selected: usize,
    /// The peer whose detail view is open.
    pub detail: Option<String>,
    pub quit: bool,
}

impl App {
    pub fn new(url: &str) -> App {
        App {
            url: url.to_string(),
            frame: None,
            last: None,
            history: HashMap::new(),
            updates: 0,
            status: Status::Connecting,
            sort: SortBy::Risk,
            reverse: false,
            filter: String::new(),
            editing_filter: false,
            paused: false,
            help: false,
            selected: 0,
            detail: None,
            quit: false,
        }
    }

    /// A new snapshot arrived. The same tick twice (top polls faster than the daemon ticks)
    /// changes nothing; while paused the screen stays as it is.
    pub fn on_snapshot(&mut self, s: Snapshot) {
        self.status = Status::Live;
        if self.paused {
            return;
        }
        if let Some(l) = &self.last {
            if l.time_unix == s.time_unix && l.tick == s.tick {
                return;
            }
        }
        let f = frame::build(&s, self.last.as_ref());
        self.updates += 1;
        for p in &f.peers {
            let (h, seen) = self.history.entry(p.peer.clone()).or_default();
            *seen = self.updates;
            if let Some(v) = p.srtt {
                if h.len() == HISTORY {
                    h.pop_front();
                }
                h.push_back(v);
            }
        }
        if self.history.len() > MAX_HISTORIES {
            let mut by_age: Vec<(u64, String)> =
                self.history.iter().map(|(k, v)| (v.1, k.clone())).collect();
            by_age.sort();
            for (_, k) in by_age.iter().take(self.history.len() - MAX_HISTORIES) {
                self.history.remove(k);
            }
        }
        self.frame = Some(f);
        self.last = Some(s);
        self.clamp_selection();
    }

    pub fn on_error(&mut self, e: String) {
        self.status = Status::Reconnecting(e);
    }

    pub fn history(&self, peer: &str) -> Vec<f64> {
        self.history
            .get(peer)
            .map(|h| h.0.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The peers shown: filtered by the text (a substring of the address), in sort order.
    pub fn visible_peers(&self) -> Vec<&PeerRow> {
        let Some(f) = &self.frame else {
            return Vec::new();
        };
        let mut v: Vec<&PeerRow> = f
            .peers
            .iter()
            .filter(|p| self.filter.is_empty() || p.peer.contains(self.filter.as_str()))
            .collect();
        let sort = self.sort;
        v.sort_by(|a, b| {
            let ord = if sort == SortBy::Peer {
                a.peer.cmp(&b.peer)
            } else {
                sort.key(b)
                    .total_cmp(&sort.key(a))
                    .then(a.peer.cmp(&b.peer))
            };
            if self.reverse {
                ord.reverse()
            } else {
                ord
            }
        });
        v
    }

    pub fn detail_peer(&self) -> Option<&PeerRow> {
        let name = self.detail.as_ref()?;
        self.frame.as_ref()?.peers.iter().find(|p| &p.peer == name)
    }

    fn clamp_selection(&mut self) {
        let n = self.visible_peers().len();
        self.selected = self.selected.min(n.saturating_sub(1));
    }

    pub fn on_key(&mut self, k: KeyEvent) {
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if self.editing_filter {
            match k.code {
                KeyCode::Enter => self.editing_filter = false,
                KeyCode::Esc => {
                    self.editing_filter = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) if self.filter.len() < 64 => self.filter.push(c),
                _ => {}
            }
            self.clamp_selection();
            return;
        }
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') | KeyCode::Char('h') => self.help = !self.help,
            KeyCode::Esc | KeyCode::Backspace => {
                if self.help {
                    self.help = false;
                } else if self.detail.is_some() {
                    self.detail = None;
                } else {
                    self.filter.clear();
                }
            }
            KeyCode::Char('s') => self.sort = self.sort.step(1),
            KeyCode::Char('S') => self.sort = self.sort.step(-1),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('/') => {
                self.editing_filter = true;
                self.filter.clear();
            }
            KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
            KeyCode::Down | KeyCode::Char('j') => self.selected = self.selected.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => self.selected = self.selected.saturating_sub(1),
            KeyCode::Enter => {
                self.detail = self
                    .visible_peers()
                    .get(self.selected)
                    .map(|p| p.peer.clone())
            }
            _ => {}
        }
        self.clamp_selection();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(c: char) -> KeyEvent {
        KeyEvent::from(KeyCode::Char(c))
    }

    fn app() -> App {
        let mut a = App::new("http://x");
        let s: Snapshot = serde_json::from_value(json!({"tick": 1, "time_unix": 1.0,
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.003},
                      {"peer": "10.0.0.3", "srtt_seconds": 0.001},
                      {"peer": "10.1.0.4", "srtt_seconds": 0.002}]}))
        .unwrap();
        a.on_snapshot(s);
        a
    }

    fn order(a: &App) -> Vec<&str> {
        a.visible_peers().iter().map(|p| p.peer.as_str()).collect()
    }

    #[test]
    fn sort_filter_detail_and_quit() {
        let mut a = app();
        assert_eq!(
            order(&a),
            ["10.0.0.2", "10.1.0.4", "10.0.0.3"],
            "risk = srtt"
        );
        a.on_key(key('s'));
        assert_eq!(a.sort, SortBy::Peer);
        assert_eq!(order(&a), ["10.0.0.2", "10.0.0.3", "10.1.0.4"]);
        a.on_key(key('r'));
        assert_eq!(order(&a), ["10.1.0.4", "10.0.0.3", "10.0.0.2"]);
        for c in "/10.0.".chars() {
            a.on_key(key(c));
        }
        a.on_key(KeyEvent::from(KeyCode::Enter));
        assert_eq!(order(&a), ["10.0.0.3", "10.0.0.2"]);
        a.on_key(KeyEvent::from(KeyCode::Down));
        a.on_key(KeyEvent::from(KeyCode::Down));
        assert_eq!(a.selected, 1, "the selection stays on the list");
        a.on_key(KeyEvent::from(KeyCode::Enter));
        assert_eq!(a.detail.as_deref(), Some("10.0.0.2"));
        a.on_key(KeyEvent::from(KeyCode::Esc));
        assert!(a.detail.is_none());
        a.on_key(key('q'));
        assert!(a.quit);
    }

    #[test]
    fn pause_history_and_reconnect() {
        let mut a = app();
        a.on_key(key('p'));
        let s: Snapshot = serde_json::from_value(json!({"tick": 2, "time_unix": 2.0,
            "peers": [{"peer": "10.0.0.2", "srtt_seconds": 0.5}]}))
        .unwrap();
        a.on_snapshot(s.clone());
        assert_eq!(a.history("10.0.0.2"), [0.003], "paused: nothing changes");
        a.on_key(key('p'));
        a.on_error("connection refused".into());
        assert!(matches!(a.status, Status::Reconnecting(_)));
        assert!(a.frame.is_some(), "the last data stays on screen");
        a.on_snapshot(s.clone());
        a.on_snapshot(s);
        assert_eq!(a.status, Status::Live);
        assert_eq!(a.history("10.0.0.2"), [0.003, 0.5], "one sample per tick");
    }
}
