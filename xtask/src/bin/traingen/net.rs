//! TCP plumbing for the generator: bounded connection setup with a small hello, and bulk
//! send/receive of a given number of bytes.
use anyhow::{bail, Context, Result};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

const MAGIC: [u8; 4] = *b"TGN1";
const HELLO_LEN: usize = 16;
/// Pause between connection attempts.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// Upper bound on connection attempts, whatever the time budget.
pub const MAX_CONNECT_ATTEMPTS: u32 = 600;
/// Size of the buffer bulk transfers are written from and read into.
pub const BUF_LEN: usize = 256 * 1024;

/// What a connecting rank announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub rank: u32,
    pub world: u32,
    pub pattern: u8,
}

impl Hello {
    fn encode(self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&self.rank.to_be_bytes());
        b[8..12].copy_from_slice(&self.world.to_be_bytes());
        b[12] = self.pattern;
        b
    }

    fn decode(b: &[u8; HELLO_LEN]) -> Result<Self> {
        if b[..4] != MAGIC {
            bail!("unexpected connection (bad hello magic)");
        }
        Ok(Self {
            rank: u32::from_be_bytes(b[4..8].try_into().unwrap()),
            world: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            pattern: b[12],
        })
    }
}

/// Sets the TCP congestion control of a socket (TCP_CONGESTION). As root (CAP_NET_ADMIN)
/// any loaded algorithm works, even one the namespace may not make its default.
pub fn set_congestion(fd: &impl AsRawFd, name: &str) -> Result<()> {
    // SAFETY: setsockopt reads `name.len()` bytes from a valid buffer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("setting TCP congestion control {name:?}"));
    }
    Ok(())
}

fn tune(s: &TcpStream, io_timeout: Duration) -> io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(io_timeout))?;
    s.set_write_timeout(Some(io_timeout))
}

/// Connects to `addr` and sends `hello`, retrying every 100 ms until `deadline` or
/// `MAX_CONNECT_ATTEMPTS` attempts, whichever comes first.
pub fn connect(
    addr: SocketAddr,
    hello: Hello,
    deadline: Instant,
    io_timeout: Duration,
) -> Result<TcpStream> {
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let err = match TcpStream::connect_timeout(&addr, left.clamp(RETRY_EVERY, RETRY_EVERY * 10))
        {
            Ok(mut s) => {
                tune(&s, io_timeout)?;
                s.write_all(&hello.encode())
                    .with_context(|| format!("sending hello to {addr}"))?;
                return Ok(s);
            }
            Err(e) => e,
        };
        if attempts >= MAX_CONNECT_ATTEMPTS || Instant::now() + RETRY_EVERY >= deadline {
            return Err(err).with_context(|| {
                format!("connecting to {addr}: gave up after {attempts} attempts")
            });
        }
        thread::sleep(RETRY_EVERY);
    }
}

/// Accepts `count` connections on `listener` before `deadline` and returns them with the
/// hello each one sent. Hellos from another world size or pattern are an error.
pub fn accept(
    listener: &TcpListener,
    count: usize,
    expect_world: u32,
    expect_pattern: u8,
    deadline: Instant,
    io_timeout: Duration,
) -> Result<Vec<(Hello, TcpStream)>> {
    listener.set_nonblocking(true)?;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        match listener.accept() {
            Ok((mut s, from)) => {
                s.set_nonblocking(false)?;
                tune(&s, io_timeout)?;
                s.set_read_timeout(Some(Duration::from_secs(5)))?;
                let mut b = [0u8; HELLO_LEN];
                s.read_exact(&mut b)
                    .with_context(|| format!("reading hello from {from}"))?;
                s.set_read_timeout(Some(io_timeout))?;
                let hello = Hello::decode(&b).with_context(|| format!("from {from}"))?;
                if hello.world != expect_world || hello.pattern != expect_pattern {
                    bail!("{from} runs another job: {hello:?}, expected world {expect_world}");
                }
                out.push((hello, s));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!(
                        "timed out waiting for peers: {} of {count} connected",
                        out.len()
                    );
                }
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e).context("accept"),
        }
    }
    Ok(out)
}

/// Writes `n` bytes of filler to `s`.
pub fn send_bytes(s: &mut TcpStream, mut n: u64, buf: &[u8]) -> io::Result<()> {
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        s.write_all(&buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Reads exactly `n` bytes from `s`.
pub fn recv_bytes(s: &mut TcpStream, mut n: u64, buf: &mut [u8]) -> io::Result<()> {
    while n > 0 {
        let k = n.min(buf.len() as u64) as usize;
        s.read_exact(&mut buf[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// True if the error means the peer closed or reset the connection (it finished or died).
pub fn peer_gone(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        c.downcast_ref::<io::Error>().is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            )
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_round_trip() {
        let h = Hello {
            rank: 3,
            world: 8,
            pattern: 2,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = b'X';
        assert!(Hello::decode(&bad).is_err());
    }

    #[test]
    fn congestion_control() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        set_congestion(&l, "reno").unwrap();
        assert!(set_congestion(&l, "no-such-algorithm").is_err());
    }

    #[test]
    fn loopback_transfer() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let io = Duration::from_secs(5);
        let hello = Hello {
            rank: 1,
            world: 2,
            pattern: 0,
        };
        let t = thread::spawn(move || {
            let mut s = connect(addr, hello, deadline, io).unwrap();
            send_bytes(&mut s, 1_000_000, &[7u8; 4096]).unwrap();
        });
        let mut got = accept(&l, 1, 2, 0, deadline, io).unwrap();
        assert_eq!(got[0].0, hello);
        let mut buf = vec![0u8; 1000];
        recv_bytes(&mut got[0].1, 1_000_000, &mut buf).unwrap();
        t.join().unwrap();
        let err = recv_bytes(&mut got[0].1, 1, &mut buf).unwrap_err();
        assert!(peer_gone(&anyhow::Error::new(err)));
    }
}
