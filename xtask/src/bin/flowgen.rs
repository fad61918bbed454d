//! flowgen: many concurrent, long-lived, lightly active TCP connections, for `cargo xtask
//! bench` (the daemon's cost with 10,000 active flows).
//!
//! Two roles, each run in its own network namespace:
//! - `flowgen serve --ports 5300-5303`: listens on every given port (all addresses of the
//!   namespace), accepts everything and echoes what it reads (`--no-echo`: reads only). One
//!   thread, epoll.
//! - `flowgen connect --to 10.231.201.2,10.231.201.100-163 --conns 10000`: opens the
//!   connections (connection i goes to address i mod |to|, port (i / |to|) mod |ports|, from
//!   source address i mod |from| when `--from` is given), then every `--interval-ms` sends a
//!   `--size`-byte message on each of them (spread evenly over the interval, so the load is
//!   smooth) and drains the echoes, for `--seconds`; then closes them all. `--idle` keeps
//!   them open without sending anything.
//!
//! Both raise RLIMIT_NOFILE as far as needed (root may raise the hard limit too). Both are
//! bounded: `serve` exits after `--seconds` (default 600), `connect` after its connect phase
//! (bounded by `--connect-timeout-s`) plus `--seconds`.
//!
//! Output (stdout, one line each, for the bench to follow): `listening on N ports`,
//! `established K/N in T s (F failed)`, a progress line every 10 rounds, and a final
//! `done: ...` line.
use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "flowgen",
    version,
    about = "many concurrent, lightly active TCP flows"
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Accept connections on the given ports and echo (or discard) what arrives.
    Serve(ServeArgs),
    /// Open the connections and keep them active (or idle) for a while.
    Connect(ConnectArgs),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    bind: Ipv4Addr,
    /// Ports: `5300`, `5300-5303` or a comma list of both.
    #[arg(long, default_value = "5300-5303")]
    ports: String,
    /// Read and discard instead of echoing.
    #[arg(long)]
    no_echo: bool,
    /// Exit after this many seconds.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Connections to expect (sizes the fd limit).
    #[arg(long, default_value_t = 10_000)]
    max_conns: usize,
}

#[derive(clap::Args, Debug)]
struct ConnectArgs {
    /// Destination addresses: `10.0.0.2`, `10.0.0.100-163` (a last-octet range) or a comma
    /// list of both.
    #[arg(long)]
    to: String,
    /// Destination ports (as for `serve`).
    #[arg(long, default_value = "5300-5303")]
    ports: String,
    /// Source addresses to bind (as for `--to`); the kernel's choice when absent.
    #[arg(long)]
    from: Option<String>,
    /// Connections to open.
    #[arg(long, default_value_t = 10_000)]
    conns: usize,
    /// How long to keep them after they are all established.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Each connection sends one message per interval.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Bytes per message.
    #[arg(long, default_value_t = 32)]
    size: usize,
    /// Keep the connections open but send nothing.
    #[arg(long)]
    idle: bool,
    /// Give up on connections not established within this time.
    #[arg(long, default_value_t = 30)]
    connect_timeout_s: u64,
    /// Connections whose handshakes are in flight at once.
    #[arg(long, default_value_t = 512)]
    batch: usize,
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.role {
        Role::Serve(a) => serve(&a),
        Role::Connect(a) => connect(&a),
    };
    if let Err(e) = r {
        eprintln!("flowgen: error: {e:#}");
        std::process::exit(1);
    }
}

/// `a`, `a-b` or a comma list of both.
fn parse_ports(s: &str) -> Result<Vec<u16>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u16, u16) = (a.trim().parse()?, b.trim().parse()?);
                if a > b {
                    bail!("empty port range {part}");
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().with_context(|| format!("bad port {part:?}"))?),
        }
    }
    if out.is_empty() {
        bail!("no ports in {s:?}");
    }
    Ok(out)
}

/// `10.0.0.2`, `10.0.0.100-163` (last octet) or a comma list of both.
fn parse_addrs(s: &str) -> Result<Vec<Ipv4Addr>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, last)) => {
                let a: Ipv4Addr = a.trim().parse().with_context(|| format!("bad {part:?}"))?;
                let last: u8 = last
                    .trim()
                    .parse()
                    .with_context(|| format!("bad {part:?}"))?;
                let o = a.octets();
                if o[3] > last {
                    bail!("empty address range {part}");
                }
                out.extend((o[3]..=last).map(|h| Ipv4Addr::new(o[0], o[1], o[2], h)));
            }
            None => out.push(
                part.parse()
                    .with_context(|| format!("bad address {part:?}"))?,
            ),
        }
    }
    if out.is_empty() {
        bail!("no addresses in {s:?}");
    }
    Ok(out)
}

/// Raises RLIMIT_NOFILE to at least `need` (the hard limit too, which needs root).
fn raise_nofile(need: u64) -> Result<()> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        if rl.rlim_cur >= need {
            return Ok(());
        }
        rl.rlim_cur = need;
        rl.rlim_max = rl.rlim_max.max(need);
        if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
            bail!(
                "cannot raise RLIMIT_NOFILE to {need}: {} (run as root, or `ulimit -n {need}`)",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

fn check(rc: libc::c_int, what: &str) -> Result<libc::c_int> {
    if rc < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(rc)
}

fn sockaddr(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

fn set_int_opt(fd: RawFd, level: libc::c_int, opt: libc::c_int, v: libc::c_int) -> Result<()> {
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(rc, "setsockopt").map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// serve

const TOKEN_LISTENER: u64 = 1 << 40;

fn serve(a: &ServeArgs) -> Result<()> {
    let ports = parse_ports(&a.ports)?;
    raise_nofile((a.max_conns + ports.len() + 64) as u64)?;
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    // SAFETY: epoll_create1 has no preconditions; the fd is owned from here on.
    let ep = unsafe {
        OwnedFd::from_raw_fd(check(
            libc::epoll_create1(libc::EPOLL_CLOEXEC),
            "epoll_create1",
        )?)
    };
    let mut listeners = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let l = listen(SocketAddrV4::new(a.bind, *port))?;
        epoll_add(&ep, l.as_raw_fd(), TOKEN_LISTENER | i as u64)?;
        listeners.push(l);
    }
    println!("listening on {} ports", listeners.len());
    let _ = std::io::stdout().flush();

    // Connections by slot; the epoll token is the slot index.
    let mut conns: Vec<Option<TcpStream>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut buf = vec![0u8; 64 * 1024];
    let (mut accepted, mut closed, mut bytes) = (0u64, 0u64, 0u64);
    while Instant::now() < deadline {
        // SAFETY: events is a valid buffer of events.len() entries.
        let n = unsafe {
            libc::epoll_wait(
                ep.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                200,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            bail!("epoll_wait: {e}");
        }
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token & TOKEN_LISTENER != 0 {
                let l = &listeners[(token & !TOKEN_LISTENER) as usize];
                loop {
                    // SAFETY: accept4 on a listening socket; no peer address wanted.
                    let fd = unsafe {
                        libc::accept4(
                            l.as_raw_fd(),
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        )
                    };
                    if fd < 0 {
                        let e = std::io::Error::last_os_error();
                        match e.kind() {
                            ErrorKind::WouldBlock => break,
                            ErrorKind::Interrupted | ErrorKind::ConnectionAborted => continue,
                            _ => bail!("accept4: {e}"),
                        }
                    }
                    // SAFETY: fd is a new socket we own.
                    let s = unsafe { TcpStream::from_raw_fd(fd) };
                    let slot = match free.pop() {
                        Some(i) => i,
                        None => {
                            conns.push(None);
                            conns.len() - 1
                        }
                    };
                    epoll_add(&ep, fd, slot as u64)?;
                    conns[slot] = Some(s);
                    accepted += 1;
                }
                continue;
            }
            let slot = token as usize;
            let mut close = false;
            if let Some(s) = conns.get_mut(slot).and_then(Option::as_mut) {
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => {
                            close = true;
                            break;
                        }
                        Ok(k) => {
                            bytes += k as u64;
                            // Small messages: the send buffer always has room; a short or
                            // refused echo is dropped, never waited for.
                            if !a.no_echo {
                                let _ = s.write(&buf[..k]);
                            }
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(_) => {
                            close = true;
                            break;
                        }
                    }
                }
            }
            if close {
                // Dropping the stream closes it, which also removes it from the epoll set.
                conns[slot] = None;
                free.push(slot);
                closed += 1;
            }
        }
    }
    println!("done: accepted {accepted}, closed by peer {closed}, received {bytes} bytes");
    Ok(())
}

fn listen(addr: SocketAddrV4) -> Result<OwnedFd> {
    // SAFETY: plain socket calls on a socket we create and own.
    unsafe {
        let fd = OwnedFd::from_raw_fd(check(
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            ),
            "socket",
        )?);
        set_int_opt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        let sa = sockaddr(addr);
        check(
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            &format!("bind {addr}"),
        )?;
        // The kernel caps the backlog at net.core.somaxconn.
        check(libc::listen(fd.as_raw_fd(), 65_535), "listen")?;
        Ok(fd)
    }
}

fn epoll_add(ep: &OwnedFd, fd: RawFd, token: u64) -> Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: token,
    };
    // SAFETY: valid epoll fd, valid fd, pointer to a live event.
    let rc = unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    check(rc, "epoll_ctl").map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// connect

/// Where connection `i` goes: (source, destination).
fn plan(
    i: usize,
    to: &[Ipv4Addr],
    ports: &[u16],
    from: &[Ipv4Addr],
) -> (Option<Ipv4Addr>, SocketAddrV4) {
    let dst = SocketAddrV4::new(to[i % to.len()], ports[(i / to.len()) % ports.len()]);
    let src = (!from.is_empty()).then(|| from[i % from.len()]);
    (src, dst)
}

/// A non-blocking socket with its connect started.
fn start_connect(src: Option<Ipv4Addr>, dst: SocketAddrV4) -> Result<TcpStream> {
    // SAFETY: plain socket calls on a socket we create and own (wrapped at once).
    unsafe {
        let fd = check(
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            ),
            "socket",
        )?;
        let s = TcpStream::from_raw_fd(fd);
        if let Some(src) = src {
            // Let connect() pick the port for the full 4-tuple, not bind() for the address.
            set_int_opt(fd, libc::IPPROTO_IP, libc::IP_BIND_ADDRESS_NO_PORT, 1)?;
            let sa = sockaddr(SocketAddrV4::new(src, 0));
            check(
                libc::bind(
                    fd,
                    (&sa as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ),
                &format!("bind {src}"),
            )?;
        }
        let sa = sockaddr(dst);
        let rc = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                bail!("connect {dst}: {e}");
            }
        }
        s.set_nodelay(true)?;
        Ok(s)
    }
}

/// Waits until every socket of `batch` has finished its handshake (or `deadline`); returns
/// the established ones and the number that failed.
fn finish_batch(batch: Vec<TcpStream>, deadline: Instant) -> (Vec<TcpStream>, usize) {
    let mut pending: Vec<TcpStream> = batch;
    let mut done = Vec::with_capacity(pending.len());
    let mut failed = 0;
    while !pending.is_empty() {
        let now = Instant::now();
        if now >= deadline {
            failed += pending.len();
            break;
        }
        let mut pfds: Vec<libc::pollfd> = pending
            .iter()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        let wait = (deadline - now).as_millis().min(1000) as libc::c_int;
        // SAFETY: pfds is a valid array of pfds.len() entries.
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, wait) };
        if n <= 0 {
            continue;
        }
        let mut still = Vec::with_capacity(pending.len());
        for (s, p) in pending.into_iter().zip(&pfds) {
            if p.revents == 0 {
                still.push(s);
            } else if matches!(s.take_error(), Ok(None)) && s.peer_addr().is_ok() {
                done.push(s);
            } else {
                failed += 1;
            }
        }
        pending = still;
    }
    (done, failed)
}

fn connect(a: &ConnectArgs) -> Result<()> {
    let to = parse_addrs(&a.to)?;
    let ports = parse_ports(&a.ports)?;
    let from = match &a.from {
        Some(f) => parse_addrs(f)?,
        None => Vec::new(),
    };
    if a.conns == 0 || a.interval_ms == 0 || a.batch == 0 {
        bail!("--conns, --interval-ms and --batch must be at least 1");
    }
    raise_nofile((a.conns + 64) as u64)?;

    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(a.connect_timeout_s);
    let mut conns: Vec<TcpStream> = Vec::with_capacity(a.conns);
    let mut failed = 0;
    let mut i = 0;
    while i < a.conns {
        let end = (i + a.batch).min(a.conns);
        let mut batch = Vec::with_capacity(end - i);
        for j in i..end {
            let (src, dst) = plan(j, &to, &ports, &from);
            match start_connect(src, dst) {
                Ok(s) => batch.push(s),
                Err(e) => {
                    if failed == 0 {
                        eprintln!("flowgen: {e:#}");
                    }
                    failed += 1;
                }
            }
        }
        let (ok, bad) = finish_batch(batch, deadline);
        conns.extend(ok);
        failed += bad;
        i = end;
    }
    println!(
        "established {}/{} in {:.2} s ({failed} failed)",
        conns.len(),
        a.conns,
        t0.elapsed().as_secs_f64()
    );
    let _ = std::io::stdout().flush();
    if conns.is_empty() {
        bail!("no connection could be established");
    }

    let start = Instant::now();
    let end = start + Duration::from_secs(a.seconds);
    let (mut sent, mut send_errors, mut received, mut lost) = (0u64, 0u64, 0u64, 0u64);
    if a.idle {
        while Instant::now() < end {
            std::thread::sleep((end - Instant::now()).min(Duration::from_millis(500)));
        }
    } else {
        let msg = vec![b'x'; a.size.max(1)];
        let mut buf = vec![0u8; 64 * 1024];
        let interval = Duration::from_millis(a.interval_ms);
        // The interval is cut into steps; each step serves its share of the connections.
        let steps = 20usize.min(conns.len());
        let step = interval / steps as u32;
        let mut alive = vec![true; conns.len()];
        let mut round = 0u64;
        'rounds: while Instant::now() < end {
            let round_start = Instant::now();
            for k in 0..steps {
                let target = round_start + step * k as u32;
                let now = Instant::now();
                if now >= end {
                    break 'rounds;
                }
                if target > now {
                    std::thread::sleep(target - now);
                }
                let lo = k * conns.len() / steps;
                let hi = (k + 1) * conns.len() / steps;
                for (s, alive) in conns[lo..hi].iter_mut().zip(&mut alive[lo..hi]) {
                    if !*alive {
                        continue;
                    }
                    // The echo of the previous round.
                    loop {
                        match s.read(&mut buf) {
                            Ok(0) => {
                                *alive = false;
                                lost += 1;
                                break;
                            }
                            Ok(n) => received += n as u64,
                            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                            Err(_) => {
                                *alive = false;
                                lost += 1;
                                break;
                            }
                        }
                    }
                    if !*alive {
                        continue;
                    }
                    // A short write (a full send buffer) counts as refused, like an error.
                    match s.write(&msg) {
                        Ok(n) if n == msg.len() => sent += 1,
                        Ok(_) | Err(_) => send_errors += 1,
                    }
                }
            }
            round += 1;
            if round.is_multiple_of(10) {
                println!(
                    "round {round}: {sent} messages sent, {received} bytes back, {} connections alive",
                    alive.iter().filter(|a| **a).count()
                );
                let _ = std::io::stdout().flush();
            }
            // The last step sleeps until the next round starts.
            let next = round_start + interval;
            let now = Instant::now();
            if next > now {
                std::thread::sleep((next - now).min(end.saturating_duration_since(now)));
            }
        }
    }
    let held = start.elapsed().as_secs_f64();
    let n = conns.len();
    drop(conns);
    println!(
        "done: {n} connections held {held:.1} s, {sent} messages sent ({send_errors} refused), \
         {received} bytes echoed back, {lost} connections lost"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_and_addresses() {
        assert_eq!(
            parse_ports("5300-5302,6000").unwrap(),
            vec![5300, 5301, 5302, 6000]
        );
        assert!(parse_ports("5302-5300").is_err());
        assert!(parse_ports("").is_err());
        let a = parse_addrs("10.0.0.2, 10.0.0.100-102").unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a[3], Ipv4Addr::new(10, 0, 0, 102));
        assert!(parse_addrs("10.0.0.9-3").is_err());
        assert!(parse_addrs("banana").is_err());
    }

    #[test]
    fn plan_spreads_over_addresses_then_ports() {
        let to = [Ipv4Addr::new(10, 0, 0, 2), Ipv4Addr::new(10, 0, 0, 3)];
        let ports = [5300, 5301];
        let d: Vec<_> = (0..4).map(|i| plan(i, &to, &ports, &[]).1).collect();
        assert_eq!(d[0], SocketAddrV4::new(to[0], 5300));
        assert_eq!(d[1], SocketAddrV4::new(to[1], 5300));
        assert_eq!(d[2], SocketAddrV4::new(to[0], 5301));
        assert_eq!(plan(0, &to, &ports, &[]).0, None);
        let from = [Ipv4Addr::new(10, 0, 0, 1)];
        assert_eq!(plan(3, &to, &ports, &from).0, Some(from[0]));
    }

    #[test]
    fn echoes_over_loopback() {
        // A listener and a few connections on loopback, end to end through the same code.
        let l = listen(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        // SAFETY: borrow the fd only to read its address.
        let port = unsafe {
            let s = std::mem::ManuallyDrop::new(std::net::TcpListener::from_raw_fd(l.as_raw_fd()));
            s.local_addr().unwrap().port()
        };
        let dst = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let batch: Vec<_> = (0..3).map(|_| start_connect(None, dst).unwrap()).collect();
        let (ok, failed) = finish_batch(batch, Instant::now() + Duration::from_secs(5));
        assert_eq!((ok.len(), failed), (3, 0));
    }
}
