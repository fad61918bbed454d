//! `probe record`: polls a running daemon's `/api/v1/snapshot` and writes its observations
//! (one row per entity per tick) to a Parquet file and its burst events to a second one
//! beside it (docs/recording.md). Recording through the daemon keeps one owner of the kernel
//! hooks and records exactly what the feature stage saw.
//!
//! `client` fetches snapshots, `columns` is the schema (two tables), `writer` the Parquet
//! file, `reader` reads tables back (`probe features`).
pub mod client;
pub mod columns;
pub mod reader;
pub mod writer;

use std::{
    io::IsTerminal as _,
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{anyhow, bail, Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::apiclient::Endpoint;
use client::Snapshot;
use columns::{BurstEvent, Row};
use writer::RecordingWriter;

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug, Clone)]
pub struct RecordArgs {
    /// The daemon to record (`probe run`'s --listen address; https:// and USER@ for a
    /// daemon with --web.config.file).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9464")]
    pub url: String,

    #[command(flatten)]
    pub auth: crate::apiclient::ApiAuth,

    /// The Parquet file to write (observations); burst events go beside it, in
    /// FILE.events.parquet for FILE.parquet.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub out: PathBuf,

    /// Stop after this long, e.g. `30s`, `2h` (a bare number is seconds). Default: until
    /// SIGINT/SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = parse_span)]
    pub duration: Option<Duration>,

    /// Poll every DURATION. Default: follow the daemon's tick, polling just after each one.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::parse_duration)]
    pub interval: Option<Duration>,

    /// Write a row group every N ticks: the file on disk is complete up to the last one, so
    /// a killed recorder loses at most N ticks.
    #[arg(long, value_name = "N", default_value_t = 60,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub flush_every: u32,

    /// Give up after this many failed fetches in a row.
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failures: u32,

    /// Overwrite FILE if it exists.
    #[arg(long)]
    pub force: bool,
}

/// `30s`, `2h`, `1.5s`, or a bare number of seconds.
fn parse_span(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.trim().parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("`{s}` must be a positive number of seconds"));
    }
    crate::duration::parse_duration(s)
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set a flag the loop polls, so the file is always finished.
fn install_signal_handlers() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error()).context("installing a signal handler");
            }
        }
    }
    Ok(())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// Sleeps until `until` or a stop signal, whichever comes first.
fn sleep_until(until: Instant) {
    while !STOP.load(Ordering::SeqCst) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        std::thread::sleep((until - now).min(Duration::from_millis(50)));
    }
}

/// Where the burst events of recording `out` are: `run.parquet` -> `run.events.parquet`.
pub fn events_path(out: &std::path::Path) -> PathBuf {
    sibling_path(out, "events")
}

/// A file that goes with recording `rec`: `run.parquet` -> `run.WHAT.parquet`.
pub fn sibling_path(rec: &std::path::Path, what: &str) -> PathBuf {
    let name = rec
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".parquet").unwrap_or(&name);
    rec.with_file_name(format!("{stem}.{what}.parquet"))
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// What the progress line shows.
#[derive(Default)]
struct Progress {
    ticks: u64,
    rows: u64,
    entities: usize,
    events: u64,
    /// Daemon ticks that passed between two polls (their observations are not recorded).
    missed: u64,
}

fn progress_bar(duration: Option<Duration>) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = match duration {
        Some(d) => {
            let b = ProgressBar::with_draw_target(
                Some(d.as_millis().max(1) as u64),
                ProgressDrawTarget::stderr(),
            );
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} recording {elapsed_precise} [{bar:30}] {percent:>3}%  {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            b
        }
        None => {
            let b = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template("{spinner} recording {elapsed_precise}  {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b
        }
    };
    bar.enable_steady_tick(Duration::from_millis(200));
    Some(bar)
}

pub fn main(args: RecordArgs) -> Result<()> {
    let endpoint = Endpoint::parse(&args.url)?.with_auth(&args.auth)?;
    let events_out = events_path(&args.out);
    for p in [&args.out, &events_out] {
        if p.exists() && !args.force {
            bail!(
                "{} exists; choose another --out or pass --force to overwrite it",
                p.display()
            );
        }
    }
    install_signal_handlers()?;
    let meta = [
        (
            "probe.recording.schema",
            columns::SCHEMA_VERSION.to_string(),
        ),
        ("probe.version", env!("CARGO_PKG_VERSION").to_string()),
        ("probe.source", endpoint.url("/api/v1/snapshot")),
        ("probe.recorder_host", hostname()),
    ];
    let mut out = Out {
        rows: RecordingWriter::create(&args.out, columns::observations(), &meta)?,
        events: RecordingWriter::create(&events_out, columns::burst_events(), &meta)?,
        jobs: Default::default(),
    };
    let bar = progress_bar(args.duration);
    if bar.is_none() {
        eprintln!(
            "record: {} -> {}{}",
            endpoint.url("/api/v1/snapshot"),
            args.out.display(),
            args.duration
                .map(|d| format!(" for {}", humantime::format_duration(d)))
                .unwrap_or_default()
        );
    }
    let started = Instant::now();
    let mut progress = Progress::default();
    let result = record(
        &args,
        &endpoint,
        &mut out,
        bar.as_ref(),
        started,
        &mut progress,
    );
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    // Finish the files whatever happened: what was recorded stays readable.
    let finished = out.events.finish().and_then(|_| out.rows.finish());
    if progress.missed > 0 {
        eprintln!(
            "record: {} daemon ticks passed between polls and are not in the file (a slow poll or a busy host)",
            progress.missed
        );
    }
    match (result, finished) {
        // Nothing recorded: leave no empty file behind to trip the next run.
        (Err(e), _) if progress.ticks == 0 => {
            let _ = std::fs::remove_file(&args.out);
            let _ = std::fs::remove_file(&events_out);
            Err(e)
        }
        (Err(e), _) => Err(anyhow!(
            "{e:#}; {} holds the {} ticks recorded before",
            args.out.display(),
            progress.ticks
        )),
        (Ok(()), Err(e)) => Err(e).with_context(|| format!("finishing {}", args.out.display())),
        (Ok(()), Ok(rows)) => {
            let size = std::fs::metadata(&args.out).map(|m| m.len()).unwrap_or(0);
            eprintln!(
                "record: {} ticks, {rows} rows ({} entities per tick), {} burst events in {:.1} s -> {} ({:.1} KiB)",
                progress.ticks,
                progress.entities,
                progress.events,
                started.elapsed().as_secs_f64(),
                args.out.display(),
                size as f64 / 1024.0
            );
            Ok(())
        }
    }
}

struct Out {
    rows: RecordingWriter<Row>,
    events: RecordingWriter<BurstEvent>,
    /// Every training job seen so far, with the addresses its sockets used ([`JOBS_KEY`]).
    jobs: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

/// The daemon's tick in seconds, in both files' metadata (from the first snapshot).
pub const TICK_KEY: &str = "probe.tick_seconds";
/// The file's metadata key for the host's identity: every training job the daemon found
/// while recording, with the addresses its sockets used (JSON, `{"job": ["10.0.0.1"]}`),
/// which `probe analyze` names the host by.
pub const JOBS_KEY: &str = "probe.jobs";

/// The polling loop: until the duration is over, a signal, or too many failures in a row.
fn record(
    args: &RecordArgs,
    endpoint: &Endpoint,
    out: &mut Out,
    bar: Option<&ProgressBar>,
    started: Instant,
    progress: &mut Progress,
) -> Result<()> {
    let deadline = args.duration.map(|d| started + d);
    let mut prev: Option<Snapshot> = None;
    let mut failures = 0u32;
    let mut next_poll = Instant::now();
    let mut since_flush = 0u32;
    loop {
        if let Some(d) = deadline {
            next_poll = next_poll.min(d);
        }
        sleep_until(next_poll);
        if STOP.load(Ordering::SeqCst) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let polled = Instant::now();
        let mut snap = match client::snapshot(endpoint, FETCH_TIMEOUT) {
            Ok(s) => {
                failures = 0;
                s
            }
            Err(e) => {
                failures += 1;
                if failures >= args.max_failures {
                    bail!(
                        "cannot fetch {}: {e:#} ({failures} failures in a row; is `probe run` listening there?)",
                        endpoint.url("/api/v1/snapshot")
                    );
                }
                next_poll = polled + args.interval.unwrap_or(Duration::from_secs(1));
                continue;
            }
        };
        let tick = if snap.tick_seconds > 0.0 {
            snap.tick_seconds
        } else {
            1.0
        };
        let fresh =
            snap.time_unix > 0.0 && prev.as_ref().is_none_or(|p| snap.time_unix > p.time_unix);
        next_poll = match args.interval {
            Some(i) => polled + i,
            // Follow the daemon: poll shortly after its next tick, or retry soon if this
            // snapshot was not new yet.
            // A daemon on another host whose clock is off: just wait a tick.
            None if fresh => {
                let margin = (tick * 0.1).min(0.1);
                let due = snap.time_unix + tick + margin - unix_now();
                let wait = if (0.0..=tick * 1.5).contains(&due) {
                    due
                } else {
                    tick
                };
                polled + Duration::from_secs_f64(wait)
            }
            None => polled + Duration::from_secs_f64((tick * 0.05).clamp(0.01, 0.05)),
        };
        if !fresh {
            continue;
        }
        if let Some(p) = &prev {
            if snap.tick > p.tick + 1 && p.tick > 0 {
                progress.missed += snap.tick - p.tick - 1;
            }
        } else if snap.tick_seconds > 0.0 {
            // The daemon's configured tick, which a replay must use: the median of the
            // measured intervals is off by a millisecond or two on a busy host.
            let tick = snap.tick_seconds.to_string();
            out.rows.set_meta(TICK_KEY, tick.clone());
            out.events.set_meta(TICK_KEY, tick);
        }
        note_jobs(out, &snap.jobs);
        let rows = snap.observations.take().unwrap_or_default();
        if !rows.is_empty() {
            progress.ticks += 1;
            progress.rows += rows.len() as u64;
            progress.entities = rows.len();
            progress.events += snap.burst_events.len() as u64;
            out.rows.push(rows);
            out.events.push(std::mem::take(&mut snap.burst_events));
            since_flush += 1;
            if since_flush >= args.flush_every {
                since_flush = 0;
                out.events.flush()?;
                out.rows.flush()?;
                if out.rows.row_groups() >= writer::MAX_ROW_GROUPS - 1 {
                    eprintln!(
                        "record: the file holds the most row groups Parquet allows; stopping (use a larger --flush-every)"
                    );
                    break;
                }
            }
        }
        prev = Some(snap);
        if let Some(b) = bar {
            b.set_position(started.elapsed().as_millis() as u64);
            b.set_message(format!(
                "{} ticks, {} rows ({} on disk), {} entities",
                progress.ticks,
                progress.rows,
                out.rows.rows_written(),
                progress.entities
            ));
        }
    }
    Ok(())
}

/// Adds a snapshot's jobs and their addresses to what the recording has seen, and to both
/// files' metadata when that grew.
fn note_jobs(out: &mut Out, now: &[client::RecordedJob]) {
    let mut grew = false;
    for j in now {
        let addrs = out.jobs.entry(j.name.clone()).or_insert_with(|| {
            grew = true;
            Default::default()
        });
        for a in &j.addresses {
            grew |= addrs.insert(a.clone());
        }
    }
    if grew {
        let v = serde_json::to_string(&out.jobs).unwrap_or_default();
        out.rows.set_meta(JOBS_KEY, v.clone());
        out.events.set_meta(JOBS_KEY, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans() {
        assert_eq!(parse_span("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_span("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_span("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_span("0").is_err());
        assert!(parse_span("soon").is_err());
    }
}
