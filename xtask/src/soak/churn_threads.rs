//! The soak's background load, each a thread inside one of the soak's namespaces, stopped
//! by a shared flag (every loop checks it at least every second):
//! - a listener in the switch namespace that accepts on every address of an AnyIP range
//!   and echoes a few bytes;
//! - a client in the daemon's namespace that opens and closes short TCP connections to
//!   random addresses of that range: 128 peers at a time (16 times the top-K), and every
//!   5 minutes a new generation of 128, so that peers also come and go for good (a daemon
//!   that never forgets a departed peer grows in runs longer than its idle horizon);
//! - misbehaving scrapers: ones that hang up mid-response, ones that connect and say
//!   nothing, ones that send half a request.
use super::rng::Rng;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Ports the listener serves.
pub const PORTS: std::ops::RangeInclusive<u16> = 7000..=7003;
/// Peers in use at a time; few enough that a fresh daemon has met them all well within
/// its warm-up (about 128 x ln 128 / CONN_RATE = 20 s).
pub const PEERS: u32 = 128;
/// After this long, the next generation of peers replaces the current one.
pub const GENERATION: Duration = Duration::from_secs(300);
/// Connections per second the client aims at.
const CONN_RATE: f64 = 30.0;
/// Connections to this port are held open a while by both ends, so that more are open at
/// once than probe's connection map holds (it fills, and refuses inserts).
const HOLD_PORT: u16 = 7003;
const HOLD: Duration = Duration::from_secs(20);
/// Held connections per end, at most (each is an fd of this process).
const MAX_HELD: usize = 200;
/// At most this many silent scrapers hold a connection at once.
const MAX_SILENT: usize = 6;

/// Peer `i` of 10.240.0.0/16 (AnyIP in the switch namespace), from 10.240.0.1 on.
pub fn peer_addr(i: u32) -> Ipv4Addr {
    let k = 1 + i % 65_000;
    Ipv4Addr::new(10, 240, (k >> 8) as u8, (k & 0xff) as u8)
}

#[derive(Default)]
pub struct Counts {
    pub conns_ok: AtomicU64,
    pub conns_failed: AtomicU64,
    pub accepted: AtomicU64,
    pub scrapes_cut: AtomicU64,
    pub scrapes_silent: AtomicU64,
    pub scrapes_half_request: AtomicU64,
    pub scrapes_refused: AtomicU64,
}

pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The running threads; stopped and joined on drop, whatever the exit path.
pub struct Threads {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    pub counts: Arc<Counts>,
}

impl Threads {
    /// Starts the listener in `server_ns`, the client and the scrapers in `client_ns`
    /// (`/var/run/netns/...` paths); the scrapers aim at `daemon`.
    pub fn start(server_ns: &str, client_ns: &str, daemon: SocketAddr, seed: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Counts::default());
        let mut handles = Vec::new();
        let spawn = |ns: &str, f: Box<dyn FnOnce() + Send>| {
            let ns = ns.to_string();
            thread::spawn(move || {
                if let Err(e) = probe_tests::netns::enter_path(&ns, f) {
                    eprintln!("soak: thread in {ns}: {e:#}");
                }
            })
        };
        {
            let (stop, counts) = (stop.clone(), counts.clone());
            handles.push(spawn(server_ns, Box::new(move || serve(&stop, &counts))));
        }
        {
            let (stop, counts) = (stop.clone(), counts.clone());
            let rng = Rng::new(seed, 101);
            handles.push(spawn(
                client_ns,
                Box::new(move || connect_loop(&stop, &counts, rng)),
            ));
        }
        {
            let (stop, counts) = (stop.clone(), counts.clone());
            let rng = Rng::new(seed, 102);
            handles.push(spawn(
                client_ns,
                Box::new(move || scrapers(&stop, &counts, daemon, rng)),
            ));
        }
        Self {
            stop,
            handles,
            counts,
        }
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// Accepts on every port (non-blocking, so the stop flag is seen), reads a little, echoes it.
fn serve(stop: &AtomicBool, counts: &Counts) {
    let listeners: Vec<TcpListener> = PORTS
        .filter_map(|p| match TcpListener::bind(("0.0.0.0", p)) {
            Ok(l) => l.set_nonblocking(true).ok().map(|_| l),
            Err(e) => {
                eprintln!("soak: listener on port {p}: {e}");
                None
            }
        })
        .collect();
    let mut held: Vec<(TcpStream, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut idle = true;
        held.retain(|(_, until)| Instant::now() < *until);
        for l in &listeners {
            while let Ok((mut s, _)) = l.accept() {
                idle = false;
                bump(&counts.accepted);
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
                let mut buf = [0u8; 64];
                if let Ok(n) = s.read(&mut buf) {
                    let _ = s.write_all(&buf[..n]);
                }
                let hold = s.local_addr().is_ok_and(|a| a.port() == HOLD_PORT);
                if hold && held.len() < MAX_HELD {
                    held.push((s, Instant::now() + HOLD));
                }
            }
        }
        if idle {
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Short connections at about CONN_RATE a second, each to a random peer and port: connect,
/// send, read the echo, close.
fn connect_loop(stop: &AtomicBool, counts: &Counts, mut rng: Rng) {
    let gap = Duration::from_secs_f64(1.0 / CONN_RATE);
    let ports: Vec<u16> = PORTS.collect();
    let t0 = Instant::now();
    let mut held: Vec<(TcpStream, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        held.retain(|(_, until)| started < *until);
        let generation = (t0.elapsed().as_secs() / GENERATION.as_secs()) as u32;
        let ip = peer_addr(generation * PEERS + rng.below(u64::from(PEERS)) as u32);
        let port = ports[rng.below(ports.len() as u64) as usize];
        let addr = SocketAddr::V4(SocketAddrV4::new(ip, port));
        let ok = (|| -> std::io::Result<()> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
            s.set_read_timeout(Some(Duration::from_millis(500)))?;
            let msg = [b'x'; 48];
            s.write_all(&msg[..1 + rng.below(48) as usize])?;
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf)?;
            if port == HOLD_PORT && held.len() < MAX_HELD {
                held.push((s, Instant::now() + HOLD));
            }
            Ok(())
        })()
        .is_ok();
        bump(if ok {
            &counts.conns_ok
        } else {
            &counts.conns_failed
        });
        if let Some(left) = gap.checked_sub(started.elapsed()) {
            thread::sleep(left);
        }
    }
}

/// Misbehaving scrapers, a few a second.
fn scrapers(stop: &AtomicBool, counts: &Counts, daemon: SocketAddr, mut rng: Rng) {
    let mut silent: Vec<(TcpStream, Instant)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        silent.retain(|(_, until)| Instant::now() < *until);
        let connect = || TcpStream::connect_timeout(&daemon, Duration::from_millis(500));
        match rng.below(3) {
            // GET /metrics, read a few bytes of the answer, hang up (unread data: an RST).
            0 => match connect() {
                Ok(mut s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                    let req = "GET /metrics HTTP/1.1\r\nHost: probe\r\n\r\n";
                    if s.write_all(req.as_bytes()).is_ok() {
                        let mut buf = vec![0u8; 1 + rng.below(200) as usize];
                        let _ = s.read(&mut buf);
                    }
                    bump(&counts.scrapes_cut);
                }
                Err(_) => bump(&counts.scrapes_refused),
            },
            // Connect and say nothing for up to 3 s.
            1 if silent.len() < MAX_SILENT => match connect() {
                Ok(s) => {
                    let hold = Duration::from_secs_f64(rng.range_f(0.5, 3.0));
                    silent.push((s, Instant::now() + hold));
                    bump(&counts.scrapes_silent);
                }
                Err(_) => bump(&counts.scrapes_refused),
            },
            // Half a request, then hang up.
            _ => match connect() {
                Ok(mut s) => {
                    let _ = s.write_all(b"GET /metr");
                    thread::sleep(Duration::from_millis(rng.below(300)));
                    bump(&counts.scrapes_half_request);
                }
                Err(_) => bump(&counts.scrapes_refused),
            },
        }
        thread::sleep(Duration::from_millis(100 + rng.below(400)));
    }
}
