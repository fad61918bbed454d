//! `probe top`: a live terminal view of a running daemon (docs/top.md). It reads only the
//! daemon's JSON API (`/api/v1/snapshot`, docs/api.md), never the collectors, so it runs
//! against a daemon on this host or through a tunnel, old or new.
//!
//! A reader thread polls the API and hands snapshots (or errors) to the UI thread over a
//! channel, so a slow or dead daemon never freezes the keys.
pub mod app;
mod fmt;
mod frame;
pub mod model;
pub mod text;
pub mod ui;

use std::{
    io::Write as _,
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use crossterm::{
    event::{self, Event, KeyEventKind},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};

use crate::apiclient::Endpoint;
use app::App;
use model::Snapshot;

const SNAPSHOT: &str = "/api/v1/snapshot";

#[derive(clap::Args, Debug, Clone)]
pub struct TopArgs {
    /// The daemon's HTTP address (https:// and USER@ for a daemon with --web.config.file).
    #[arg(long, default_value = "http://127.0.0.1:9464", value_name = "URL")]
    pub url: String,

    #[command(flatten)]
    pub auth: crate::apiclient::ApiAuth,

    /// How often to read the daemon, e.g. `1s`, `500ms`.
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub interval: std::time::Duration,

    /// Print one frame as plain text and exit (rates need two ticks: it waits for the next).
    #[arg(long)]
    pub once: bool,
}

pub fn main(args: TopArgs) -> Result<()> {
    let ep = Endpoint::parse(&args.url)?.with_auth(&args.auth)?;
    if args.once {
        return once(&ep, &args);
    }
    live(ep, args)
}

fn timeout(args: &TopArgs) -> Duration {
    args.interval.max(Duration::from_secs(2))
}

/// `--once`: read two consecutive ticks, so that what the daemon does not rate itself (an
/// older daemon's counters, program runs) has a rate too. Bounded: a few ticks of waiting.
fn once(ep: &Endpoint, args: &TopArgs) -> Result<()> {
    let get = || -> Result<Snapshot> {
        ep.get_json(SNAPSHOT, timeout(args))
            .with_context(|| format!("reading {}", ep.url(SNAPSHOT)))
    };
    let mut app = App::new(&args.url);
    let first = get()?;
    let wait = first
        .tick_seconds
        .filter(|t| t.is_finite() && *t > 0.0)
        .map_or(Duration::from_secs(1), |t| {
            Duration::from_secs_f64(t.min(10.0))
        });
    let t0 = first.time_unix;
    app.on_snapshot(first);
    let deadline = Instant::now() + wait * 3;
    while Instant::now() < deadline {
        std::thread::sleep(wait / 4);
        let s = get()?;
        if s.time_unix != t0 {
            app.on_snapshot(s);
            break;
        }
    }
    let mut out = std::io::stdout().lock();
    out.write_all(text::render(&app).as_bytes())?;
    Ok(())
}

/// Restores the terminal when dropped: on quit, on error and on panic (the panic hook).
struct TermGuard;

impl TermGuard {
    fn enter() -> Result<TermGuard> {
        terminal::enable_raw_mode().context("the terminal refused raw mode (not a tty?)")?;
        execute!(std::io::stdout(), EnterAlternateScreen)?;
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            hook(info);
        }));
        Ok(TermGuard)
    }
}

fn restore() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        LeaveAlternateScreen,
        crossterm::cursor::Show
    );
}

impl Drop for TermGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// The reader thread: one GET per interval; it ends when the UI is gone.
fn spawn_reader(ep: Endpoint, args: &TopArgs) -> mpsc::Receiver<Result<Snapshot, String>> {
    let (tx, rx) = mpsc::channel();
    let (interval, timeout) = (args.interval, timeout(args));
    std::thread::Builder::new()
        .name("probe-top-read".into())
        .spawn(move || loop {
            let started = Instant::now();
            let r = ep
                .get_json::<Snapshot>(SNAPSHOT, timeout)
                .map_err(|e| format!("{e:#}"));
            if tx.send(r).is_err() {
                return;
            }
            std::thread::sleep(interval.saturating_sub(started.elapsed()));
        })
        .expect("spawning a thread");
    rx
}

fn live(ep: Endpoint, args: TopArgs) -> Result<()> {
    let rx = spawn_reader(ep, &args);
    let mut app = App::new(&args.url);
    let _guard = TermGuard::enter()?;
    let mut term =
        ratatui::Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))?;
    term.clear()?;
    while !app.quit {
        while let Ok(r) = rx.try_recv() {
            match r {
                Ok(s) => app.on_snapshot(s),
                Err(e) => app.on_error(e),
            }
        }
        term.draw(|t| ui::draw(t, &app))?;
        // Keys are read between draws; a resize just redraws at the new size.
        if event::poll(Duration::from_millis(100))? {
            match event::read()? {
                Event::Key(k) if k.kind == KeyEventKind::Press => app.on_key(k),
                _ => {}
            }
        }
    }
    Ok(())
}
