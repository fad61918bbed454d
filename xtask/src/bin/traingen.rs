//! traingen: one rank of a synthetic distributed-training job, for the lab (docs/lab.md).
//!
//! Each rank alternates a compute gap (a sleep of `--period-ms`) with the communication of
//! one training iteration over plain TCP, and logs every iteration as a JSON line:
//! `{"t":..,"t_start":..,"t_end":..,"rank":..,"iter":..,"duration_s":..,"compute_s":..,
//! "comm_s":..,"bytes_sent":..,"bytes_recv":..,"pattern":".."}` (times in unix seconds).
//!
//! Patterns:
//! - `ring`: data parallel, a ring all-reduce of `--size` bytes per iteration: 2(N-1) steps,
//!   each sending a chunk of size/N bytes to the next rank while receiving one from the
//!   previous rank (full duplex; a step ends when both are done).
//! - `pipeline`: model/pipeline parallel, rank r receives activations of `--size` bytes from
//!   r-1, computes, sends activations to r+1; then gradients flow back the same way. The
//!   compute gap is split evenly between the forward and the backward pass of each stage.
//! - `ps`: parameter server, rank 0 is the server; each worker pushes `--size` bytes of
//!   gradients and pulls `--size` bytes of parameters per iteration; the server waits for
//!   every push before answering any pull (synchronous SGD).
//!
//! `--straggle FROM:TO:FACTOR` makes this rank a compute straggler: from FROM to TO seconds
//! after its start its compute gap is FACTOR times `--period-ms` (its peers wait on it while
//! the network is innocent; the log's `compute_s` says what it did).
//!
//! The run is bounded by `--iterations` and/or `--duration`; connection setup is bounded by
//! `--connect-timeout-s` and a fixed number of attempts; every socket has a read/write
//! timeout. With `--duration`, a peer that closes its connection within a few seconds of
//! the end is taken as a peer that finished, not as a failure.
use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Parser, ValueEnum};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "traingen/net.rs"]
mod net;
#[path = "traingen/ring.rs"]
mod ring;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pattern {
    Ring,
    Pipeline,
    Ps,
}

impl Pattern {
    fn code(self) -> u8 {
        self as u8
    }
    fn name(self) -> &'static str {
        match self {
            Pattern::Ring => "ring",
            Pattern::Pipeline => "pipeline",
            Pattern::Ps => "ps",
        }
    }
}

/// One rank of a synthetic distributed-training job.
#[derive(Parser, Debug)]
#[command(name = "traingen", version)]
#[command(group(ArgGroup::new("bound").required(true).multiple(true).args(["iterations", "duration"])))]
struct Args {
    /// This process's rank, 0-based.
    #[arg(long)]
    rank: usize,
    /// Number of ranks.
    #[arg(long)]
    world: usize,
    /// Address of every rank, in rank order (comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    peers: Vec<IpAddr>,
    /// TCP port every rank listens on.
    #[arg(long, default_value_t = 29500)]
    port: u16,
    /// Communication pattern.
    #[arg(long, value_enum, default_value_t = Pattern::Ring)]
    pattern: Pattern,
    /// Bytes per iteration: the all-reduce buffer (ring), the activation/gradient (pipeline),
    /// the push and the pull (ps).
    #[arg(long, default_value_t = 4 << 20)]
    size: u64,
    /// Compute gap of every iteration, in milliseconds.
    #[arg(long, default_value_t = 200)]
    period_ms: u64,
    /// Stop after this many iterations.
    #[arg(long)]
    iterations: Option<u64>,
    /// Stop starting new iterations after this many seconds.
    #[arg(long)]
    duration: Option<f64>,
    /// Iteration log (JSON lines); standard output if absent.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Give up connecting to peers after this many seconds.
    #[arg(long, default_value_t = 20.0)]
    connect_timeout_s: f64,
    /// TCP congestion control of the training connections (default: the namespace's).
    #[arg(long)]
    congestion: Option<String>,
    /// Compute FACTOR times slower from FROM to TO seconds after the start (repeatable;
    /// overlapping windows multiply), e.g. `60:120:3`.
    #[arg(long, value_name = "FROM:TO:FACTOR", value_parser = parse_straggle)]
    straggle: Vec<Straggle>,
    /// Read/write timeout of every socket, in seconds.
    #[arg(long, default_value_t = 60.0)]
    io_timeout_s: f64,
}

/// A window of slower compute (`--straggle`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Straggle {
    from_s: f64,
    to_s: f64,
    factor: f64,
}

fn parse_straggle(s: &str) -> Result<Straggle, String> {
    let parts: Vec<f64> = s
        .split(':')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("`{s}`: want FROM:TO:FACTOR, three numbers"))?;
    let [from_s, to_s, factor] = parts[..] else {
        return Err(format!("`{s}`: want FROM:TO:FACTOR, three numbers"));
    };
    if !(from_s >= 0.0 && to_s > from_s && to_s.is_finite()) {
        return Err(format!("`{s}`: want 0 <= FROM < TO seconds"));
    }
    if !(factor > 0.0 && factor <= 100.0) {
        return Err(format!("`{s}`: FACTOR must be above 0 and at most 100"));
    }
    Ok(Straggle {
        from_s,
        to_s,
        factor,
    })
}

/// The compute gap `elapsed_s` after the start: the period, times every straggle window's
/// factor that covers that time.
fn compute_at(period_ms: u64, straggle: &[Straggle], elapsed_s: f64) -> Duration {
    let factor: f64 = straggle
        .iter()
        .filter(|w| w.from_s <= elapsed_s && elapsed_s < w.to_s)
        .map(|w| w.factor)
        .product();
    Duration::from_millis(period_ms).mul_f64(factor)
}

/// How close to the end of a `--duration` run a closed peer counts as a finished one.
const END_SLACK: Duration = Duration::from_secs(3);

fn main() {
    let args = Args::parse();
    let rank = args.rank;
    match run(args) {
        Ok(done) => eprintln!("traingen rank {rank}: done, {done} iterations"),
        Err(e) => {
            eprintln!("traingen rank {rank}: error: {e:#}");
            std::process::exit(1);
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// What one iteration did, besides its times.
#[derive(Default)]
struct IterStats {
    compute: Duration,
    bytes_sent: u64,
    bytes_recv: u64,
}

struct Job {
    args: Args,
    started: Instant,
    log: Box<dyn Write>,
    buf: Vec<u8>,
}

fn run(args: Args) -> Result<u64> {
    if args.world == 0 || args.rank >= args.world {
        bail!("--rank {} is not below --world {}", args.rank, args.world);
    }
    if args.peers.len() != args.world {
        bail!(
            "--peers lists {} addresses, --world is {}",
            args.peers.len(),
            args.world
        );
    }
    if args.pattern == Pattern::Ps && args.world < 2 {
        bail!("the ps pattern needs a server and at least one worker (--world >= 2)");
    }
    if args.duration.is_some_and(|d| !(d.is_finite() && d >= 0.0)) {
        bail!("--duration must be a non-negative number of seconds");
    }
    let log: Box<dyn Write> = match &args.log {
        Some(p) => Box::new(BufWriter::new(
            File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let mut job = Job {
        started: Instant::now(),
        log,
        buf: (0..net::BUF_LEN).map(|i| (i % 251) as u8).collect(),
        args,
    };
    eprintln!(
        "traingen rank {}/{}: pattern {}, {} bytes, compute {} ms",
        job.args.rank,
        job.args.world,
        job.args.pattern.name(),
        job.args.size,
        job.args.period_ms
    );
    match job.args.pattern {
        Pattern::Ring => job.ring(),
        Pattern::Pipeline => job.pipeline(),
        Pattern::Ps => job.ps(),
    }
}

impl Job {
    fn addr(&self, rank: usize) -> SocketAddr {
        SocketAddr::new(self.args.peers[rank], self.args.port)
    }

    fn hello(&self) -> net::Hello {
        net::Hello {
            rank: self.args.rank as u32,
            world: self.args.world as u32,
            pattern: self.args.pattern.code(),
        }
    }

    fn connect_deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs_f64(self.args.connect_timeout_s.max(0.1))
    }

    fn io_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.args.io_timeout_s.max(0.1))
    }

    /// This iteration's compute gap (read it once per iteration: it depends on the time).
    fn compute(&self) -> Duration {
        compute_at(
            self.args.period_ms,
            &self.args.straggle,
            self.started.elapsed().as_secs_f64(),
        )
    }

    /// Listens on this rank's address; accepted connections inherit the congestion control.
    fn listen(&self) -> Result<TcpListener> {
        let a = self.addr(self.args.rank);
        let l = TcpListener::bind(a).with_context(|| format!("listening on {a}"))?;
        if let Some(cc) = &self.args.congestion {
            net::set_congestion(&l, cc)?;
        }
        Ok(l)
    }

    fn connect(&self, rank: usize) -> Result<TcpStream> {
        let s = net::connect(
            self.addr(rank),
            self.hello(),
            self.connect_deadline(),
            self.io_timeout(),
        )
        .with_context(|| format!("rank {rank}"))?;
        if let Some(cc) = &self.args.congestion {
            net::set_congestion(&s, cc)?;
        }
        Ok(s)
    }

    /// Accepts connections from exactly the ranks in `from`, returned in that order.
    fn accept(&self, l: &TcpListener, from: &[usize]) -> Result<Vec<TcpStream>> {
        let got = net::accept(
            l,
            from.len(),
            self.args.world as u32,
            self.args.pattern.code(),
            self.connect_deadline(),
            self.io_timeout(),
        )?;
        let mut slots: Vec<Option<TcpStream>> = from.iter().map(|_| None).collect();
        for (hello, s) in got {
            let Some(i) = from.iter().position(|&r| r == hello.rank as usize) else {
                bail!("unexpected connection from rank {}", hello.rank);
            };
            if slots[i].replace(s).is_some() {
                bail!("rank {} connected twice", hello.rank);
            }
        }
        Ok(slots.into_iter().map(|s| s.unwrap()).collect())
    }

    fn should_stop(&self, done: u64) -> bool {
        self.args.iterations.is_some_and(|k| done >= k)
            || self
                .args
                .duration
                .is_some_and(|d| self.started.elapsed().as_secs_f64() >= d)
    }

    /// True once a `--duration` run is close enough to its end that peers may have stopped.
    fn near_end(&self) -> bool {
        self.args
            .duration
            .is_some_and(|d| self.started.elapsed() + END_SLACK >= Duration::from_secs_f64(d))
    }

    /// Runs iterations until the bound, logging each. `body` does one iteration.
    fn iterate(&mut self, mut body: impl FnMut(&mut Self) -> Result<IterStats>) -> Result<u64> {
        let mut done = 0u64;
        while !self.should_stop(done) {
            let t_start = unix_now();
            let t0 = Instant::now();
            let stats = match body(self) {
                Ok(s) => s,
                Err(e) if net::peer_gone(&e) && self.near_end() => {
                    eprintln!(
                        "traingen rank {}: a peer finished ({e:#}); stopping",
                        self.args.rank
                    );
                    break;
                }
                Err(e) => return Err(e).with_context(|| format!("iteration {done}")),
            };
            let dur = t0.elapsed();
            let t_end = t_start + dur.as_secs_f64();
            let line = serde_json::json!({
                "t": t_end,
                "t_start": t_start,
                "t_end": t_end,
                "rank": self.args.rank,
                "iter": done,
                "duration_s": dur.as_secs_f64(),
                "compute_s": stats.compute.as_secs_f64(),
                "comm_s": dur.saturating_sub(stats.compute).as_secs_f64(),
                "bytes_sent": stats.bytes_sent,
                "bytes_recv": stats.bytes_recv,
                "pattern": self.args.pattern.name(),
            });
            writeln!(self.log, "{line}").context("writing the log")?;
            self.log.flush().context("writing the log")?;
            done += 1;
        }
        Ok(done)
    }

    /// Data parallel: ring all-reduce of `size` bytes per iteration.
    fn ring(&mut self) -> Result<u64> {
        let (rank, world, size) = (self.args.rank, self.args.world, self.args.size);
        if world == 1 {
            return self.iterate(|job| {
                let compute = job.compute();
                thread::sleep(compute);
                Ok(IterStats {
                    compute,
                    ..Default::default()
                })
            });
        }
        let listener = self.listen()?;
        let next = self.connect(ring::next(rank, world))?;
        let mut prev = self
            .accept(&listener, &[ring::prev(rank, world)])?
            .pop()
            .unwrap();
        drop(listener);

        // The writer thread sends to the next rank while this thread receives from the
        // previous one: a step is full duplex and ends when both directions are done.
        let (cmd_tx, cmd_rx) = mpsc::channel::<u64>();
        let (done_tx, done_rx) = mpsc::channel::<std::io::Result<()>>();
        let filler = self.buf.clone();
        let writer = thread::spawn(move || {
            let mut next = next;
            for n in cmd_rx {
                let r = net::send_bytes(&mut next, n, &filler);
                let failed = r.is_err();
                if done_tx.send(r).is_err() || failed {
                    break;
                }
            }
        });

        let done = self.iterate(|job| {
            let compute = job.compute();
            thread::sleep(compute);
            let mut stats = IterStats {
                compute,
                ..Default::default()
            };
            for s in 0..ring::steps(world) {
                let st = ring::step(rank, world, s);
                let send = ring::chunk_len(size, world, st.send_chunk);
                let recv = ring::chunk_len(size, world, st.recv_chunk);
                cmd_tx
                    .send(send)
                    .map_err(|_| anyhow::anyhow!("the sender to the next rank stopped"))?;
                net::recv_bytes(&mut prev, recv, &mut job.buf)
                    .with_context(|| format!("step {s}: receiving from the previous rank"))?;
                done_rx
                    .recv()
                    .map_err(|_| anyhow::anyhow!("the sender to the next rank stopped"))?
                    .with_context(|| format!("step {s}: sending to the next rank"))?;
                stats.bytes_sent += send;
                stats.bytes_recv += recv;
            }
            Ok(stats)
        })?;
        drop(cmd_tx);
        let _ = writer.join();
        Ok(done)
    }

    /// Pipeline parallel: activations forward through the stages, gradients back.
    fn pipeline(&mut self) -> Result<u64> {
        let (rank, world, size) = (self.args.rank, self.args.world, self.args.size);
        let listener = if rank > 0 { Some(self.listen()?) } else { None };
        let mut next = if rank + 1 < world {
            Some(self.connect(rank + 1)?)
        } else {
            None
        };
        let mut prev = match &listener {
            Some(l) => self.accept(l, &[rank - 1])?.pop(),
            None => None,
        };
        drop(listener);
        self.iterate(|job| {
            let half = job.compute() / 2;
            let mut stats = IterStats::default();
            // Forward: activations from the previous stage, compute, on to the next.
            if let Some(p) = prev.as_mut() {
                net::recv_bytes(p, size, &mut job.buf).context("receiving activations")?;
                stats.bytes_recv += size;
            }
            thread::sleep(half);
            if let Some(n) = next.as_mut() {
                net::send_bytes(n, size, &job.buf).context("sending activations")?;
                stats.bytes_sent += size;
            }
            // Backward: gradients from the next stage, compute, back to the previous one.
            if let Some(n) = next.as_mut() {
                net::recv_bytes(n, size, &mut job.buf).context("receiving gradients")?;
                stats.bytes_recv += size;
            }
            thread::sleep(half);
            if let Some(p) = prev.as_mut() {
                net::send_bytes(p, size, &job.buf).context("sending gradients")?;
                stats.bytes_sent += size;
            }
            stats.compute = half * 2;
            Ok(stats)
        })
    }

    /// Parameter server: rank 0 serves, the others push gradients and pull parameters.
    fn ps(&mut self) -> Result<u64> {
        let (rank, world, size) = (self.args.rank, self.args.world, self.args.size);
        if rank == 0 {
            let workers: Vec<usize> = (1..world).collect();
            let listener = self.listen()?;
            let mut conns: Vec<(TcpStream, Vec<u8>)> = self
                .accept(&listener, &workers)?
                .into_iter()
                .map(|s| (s, vec![0u8; net::BUF_LEN]))
                .collect();
            drop(listener);
            self.iterate(|job| {
                // Every push first (synchronous SGD), then every pull, each worker in parallel.
                let n = conns.len() as u64;
                thread::scope(|sc| {
                    let hs: Vec<_> = conns
                        .iter_mut()
                        .map(|(s, b)| sc.spawn(move || net::recv_bytes(s, size, b)))
                        .collect();
                    hs.into_iter()
                        .try_for_each(|h| h.join().expect("push receiver panicked"))
                })
                .context("receiving a push")?;
                let filler = &job.buf;
                thread::scope(|sc| {
                    let hs: Vec<_> = conns
                        .iter_mut()
                        .map(|(s, _)| sc.spawn(move || net::send_bytes(s, size, filler)))
                        .collect();
                    hs.into_iter()
                        .try_for_each(|h| h.join().expect("pull sender panicked"))
                })
                .context("answering a pull")?;
                Ok(IterStats {
                    compute: Duration::ZERO,
                    bytes_sent: size * n,
                    bytes_recv: size * n,
                })
            })
        } else {
            let mut server = self.connect(0)?;
            self.iterate(|job| {
                let compute = job.compute();
                thread::sleep(compute);
                net::send_bytes(&mut server, size, &job.buf).context("pushing gradients")?;
                net::recv_bytes(&mut server, size, &mut job.buf).context("pulling parameters")?;
                Ok(IterStats {
                    compute,
                    bytes_sent: size,
                    bytes_recv: size,
                })
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn straggle_windows_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_straggle("60:120:3"),
            Ok(Straggle {
                from_s: 60.0,
                to_s: 120.0,
                factor: 3.0
            })
        );
        for bad in [
            "60:120",
            "a:b:c",
            "120:60:2",
            "0:10:0",
            "0:10:1000",
            "-1:10:2",
        ] {
            assert!(parse_straggle(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn compute_is_slower_only_inside_the_windows() {
        let w = [
            parse_straggle("1:2:3").unwrap(),
            parse_straggle("1.5:3:2").unwrap(),
        ];
        let at = |t| compute_at(100, &w, t).as_millis();
        assert_eq!(
            [at(0.5), at(1.0), at(1.6), at(2.5), at(3.0)],
            [100, 300, 600, 200, 100]
        );
    }

    /// A one-rank job (no network) with a straggle window over its first iterations: the log
    /// records the slower compute, and the iterations take at least that long.
    #[test]
    fn a_straggling_rank_logs_and_sleeps_its_slower_compute() {
        let log =
            std::env::temp_dir().join(format!("traingen-straggle-{}.jsonl", std::process::id()));
        let args = Args::try_parse_from([
            "traingen",
            "--rank=0",
            "--world=1",
            "--peers=127.0.0.1",
            "--period-ms=20",
            "--iterations=6",
            "--straggle=0:0.15:4",
            "--log",
            log.to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(run(args).unwrap(), 6);
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let compute: Vec<f64> = rows
            .iter()
            .map(|r| r["compute_s"].as_f64().unwrap())
            .collect();
        // 80 ms while inside the first 0.15 s, 20 ms after: the first iteration starts inside,
        // the last after at least 0.16 s; which one crosses depends on the machine's timing.
        assert_eq!(compute[0], 0.08, "{text}");
        assert_eq!(compute[5], 0.02, "{text}");
        assert!(
            compute.windows(2).all(|w| w[0] >= w[1])
                && compute.iter().all(|c| [0.08, 0.02].contains(c)),
            "{text}"
        );
        for r in &rows {
            assert!(r["duration_s"].as_f64().unwrap() >= r["compute_s"].as_f64().unwrap());
        }
    }
}
