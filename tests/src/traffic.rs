//! Traffic the tests generate themselves, with std::net sockets made inside a namespace (a
//! socket stays in the namespace it was created in): TCP bursts of a known size at a known
//! period, and paced UDP datagrams. Every loop is bounded in count and time.
use crate::netns::Netns;
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// A non-blocking TCP listener on `addr` in `ns` (a socket stays in the namespace it was
/// made in).
fn listen(ns: &Netns, addr: SocketAddr) -> Result<TcpListener> {
    let listener = ns
        .enter(|| TcpListener::bind(addr))?
        .with_context(|| format!("bind {addr} in netns {}", ns.name()))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// A TCP receiver in a namespace: accepts one connection and reads (and discards) until EOF,
/// counting bytes. Its thread stops at EOF, at `stop`, or after its time limit.
pub struct TcpSink {
    pub addr: SocketAddr,
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<u64>>>,
}

impl TcpSink {
    /// Listens on `addr` in `ns`; the reader thread gives up after `limit`.
    pub fn start(ns: &Netns, addr: SocketAddr, limit: Duration) -> Result<TcpSink> {
        let listener = listen(ns, addr)?;
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (received.clone(), stop.clone());
        let thread = thread::spawn(move || -> Result<u64> {
            let deadline = Instant::now() + limit;
            let mut conn = loop {
                match listener.accept() {
                    Ok((c, _)) => break c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if s.load(Ordering::Relaxed) || Instant::now() >= deadline {
                            bail!("no connection to {addr}");
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            conn.set_nonblocking(false)?;
            conn.set_read_timeout(Some(Duration::from_millis(100)))?;
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                if s.load(Ordering::Relaxed) || Instant::now() >= deadline {
                    break;
                }
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        r.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(r.load(Ordering::Relaxed))
        });
        Ok(TcpSink {
            addr,
            received,
            stop,
            thread: Some(thread),
        })
    }

    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until at least `bytes` have been read.
    pub fn wait_for(&self, bytes: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.received() < bytes {
            if Instant::now() >= deadline {
                bail!(
                    "receiver got {} of {bytes} bytes within {timeout:?}",
                    self.received()
                );
            }
            thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Stops the reader and returns the bytes it read.
    pub fn finish(mut self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => bail!("receiver thread panicked"),
            None => Ok(self.received()),
        }
    }
}

impl Drop for TcpSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP receiver in a namespace for many connections: accepts and drains every connection
/// until dropped or its time limit, and closes its end of those the peer closed. It sends
/// nothing but ACKs.
pub struct TcpSinkMany {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpSinkMany {
    pub fn start(ns: &Netns, addr: SocketAddr, limit: Duration) -> Result<TcpSinkMany> {
        let listener = listen(ns, addr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = thread::spawn(move || {
            let deadline = Instant::now() + limit;
            let mut conns: Vec<TcpStream> = Vec::new();
            let mut buf = [0u8; 4096];
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                while let Ok((c, _)) = listener.accept() {
                    let _ = c.set_nonblocking(true);
                    conns.push(c);
                }
                // A closed peer reads 0: drop our end too.
                conns.retain_mut(|c| !matches!(c.read(&mut buf), Ok(0)));
                thread::sleep(Duration::from_millis(5));
            }
        });
        Ok(TcpSinkMany {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for TcpSinkMany {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects from `ns` to `addr` (bounded); the stream stays in `ns`.
pub fn tcp_connect(ns: &Netns, addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let s = ns
        .enter(|| TcpStream::connect_timeout(&addr, timeout))?
        .with_context(|| format!("connect to {addr} from netns {}", ns.name()))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(s)
}

/// The TCP maximum segment size of a connected socket (TCP_MAXSEG): the payload of a full
/// segment, options such as timestamps already taken off.
pub fn tcp_mss(s: &TcpStream) -> Result<u32> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt with a valid fd and an int-sized buffer.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        bail!(
            "getsockopt(TCP_MAXSEG): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(v as u32)
}

/// Writes `count` bursts of `size` bytes on `s`, one every `period` (burst i starts at
/// start + i * period, however long the previous write took). Returns each burst's start
/// and the time its write returned. Fails if a burst's write outlasts the period, which would
/// merge bursts.
pub fn send_bursts(
    s: &mut TcpStream,
    size: usize,
    period: Duration,
    count: usize,
) -> Result<Vec<(Instant, Instant)>> {
    let buf = vec![0x5au8; size];
    let start = Instant::now();
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let due = start + period * i as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        let t0 = Instant::now();
        s.write_all(&buf)
            .with_context(|| format!("writing burst {i}"))?;
        let t1 = Instant::now();
        if t1 - due > period {
            bail!(
                "burst {i} took {:?} to write, longer than the period {period:?}",
                t1 - due
            );
        }
        times.push((t0, t1));
    }
    Ok(times)
}

/// Sends `count` UDP datagrams of `len` bytes from `ns` to `dst`, in groups of `group` with
/// `pause` between groups (so that no queue on the way overflows). Returns how many the
/// socket accepted.
pub fn udp_send(
    ns: &Netns,
    dst: SocketAddr,
    count: usize,
    len: usize,
    group: usize,
    pause: Duration,
) -> Result<usize> {
    let sock = ns
        .enter(|| UdpSocket::bind(SocketAddr::new(unspecified(&dst), 0)))?
        .with_context(|| format!("UDP socket in netns {}", ns.name()))?;
    sock.set_write_timeout(Some(Duration::from_secs(2)))?;
    let payload = vec![0xa5u8; len];
    let mut sent = 0;
    for i in 0..count {
        if sock.send_to(&payload, dst).is_ok() {
            sent += 1;
        }
        if group > 0 && (i + 1) % group == 0 {
            thread::sleep(pause);
        }
    }
    Ok(sent)
}

fn unspecified(dst: &SocketAddr) -> std::net::IpAddr {
    match dst {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    }
}

/// A background UDP sender: one datagram every `interval` until stopped or `limit` passes.
pub struct UdpTrickle {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl UdpTrickle {
    pub fn start(
        ns: &Netns,
        dst: SocketAddr,
        len: usize,
        interval: Duration,
        limit: Duration,
    ) -> Result<UdpTrickle> {
        let sock = ns
            .enter(|| UdpSocket::bind(SocketAddr::new(unspecified(&dst), 0)))?
            .with_context(|| format!("UDP socket in netns {}", ns.name()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (st, se) = (stop.clone(), sent.clone());
        let thread = thread::spawn(move || {
            let payload = vec![0x3cu8; len];
            let deadline = Instant::now() + limit;
            while !st.load(Ordering::Relaxed) && Instant::now() < deadline {
                // A send can fail while the route is not there yet: keep trying.
                if sock.send_to(&payload, dst).is_ok() {
                    se.fetch_add(1, Ordering::Relaxed);
                }
                thread::sleep(interval);
            }
        });
        Ok(UdpTrickle {
            stop,
            sent,
            thread: Some(thread),
        })
    }

    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops the sender; returns how many datagrams it sent.
    pub fn stop(mut self) -> u64 {
        self.halt();
        self.sent()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for UdpTrickle {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_over_loopback() {
        // No namespace needed: the helpers' logic on 127.0.0.1 of the current namespace.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let reader = thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut v = Vec::new();
            c.read_to_end(&mut v).unwrap();
            v.len()
        });
        let mut s = TcpStream::connect(addr).unwrap();
        assert!(tcp_mss(&s).unwrap() > 500);
        let t = send_bursts(&mut s, 10_000, Duration::from_millis(20), 3).unwrap();
        assert_eq!(t.len(), 3);
        assert!(t[2].0 - t[0].0 >= Duration::from_millis(40));
        drop(s);
        assert_eq!(reader.join().unwrap(), 30_000);
    }
}
