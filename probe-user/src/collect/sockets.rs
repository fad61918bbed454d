//! Reads every established TCP socket's queues as `ss` does (sock_diag): the bytes the
//! kernel received and acknowledged that the application has not read yet (`ss`'s Recv-Q),
//! and the bytes the application wrote that the peer has not acknowledged (Send-Q), summed
//! per peer. Data waiting unread on a host is what a host slow to take its job's data
//! leaves while its network is innocent: a compute straggler (docs/job.md).
//!
//! A gauge read once a tick: the rules average it over seconds. A scoped probe (`--cgroup`)
//! counts only the sockets of its cgroup and those below it; the dump covers probe's network namespace. The
//! kernel fills a message per socket (about 0.65 us each here: 13 ms for 20,000 sockets),
//! so a namespace with many sockets is read less often than every tick, keeping the reads
//! under a thousandth of the time ([`READ_SHARE`]); between reads the last one stands.
//!
//! The same dump carries each socket's `tcp_info`, whose `tcpi_bytes_acked` and
//! `tcpi_bytes_received` say how many bytes it carried: summed per peer as deltas of each
//! socket since the last read, they are the bytes *these* sockets (a scoped probe's: the
//! job's) exchanged with the peer, to be held against what TC counts to the same peer
//! (everything on the link): the share of the link the job does not get.
use std::net::IpAddr;

use anyhow::{bail, Context as _, Result};
use netlink_packet_core::{
    NetlinkBuffer, NetlinkHeader, NetlinkMessage, NlasIterator, Parseable, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use netlink_packet_sock_diag::{
    constants::{AF_INET, AF_INET6, IPPROTO_TCP},
    inet::{ExtensionFlags, InetRequest, InetResponseHeader, SocketId, StateFlags},
    SockDiagMessage,
};
use netlink_sys::{protocols::NETLINK_SOCK_DIAG, Socket, SocketAddr};
use rustc_hash::FxHashMap;

use crate::host::cgroup_tree::Subtree;

use super::{
    jobs::JobTally,
    readings::{peer_label, JobSeries, PeerSeries},
};

/// The attribute that carries a socket's cgroup v2 id (linux/inet_diag.h; kernels >= 5.7).
const INET_DIAG_CGROUP_ID: u16 = 21;
/// The attribute that carries a TCP socket's struct tcp_info.
const INET_DIAG_INFO: u16 = 2;
/// Offsets of `tcpi_bytes_acked` and `tcpi_bytes_received` in struct tcp_info
/// (linux/tcp.h, both u64, since Linux 4.1 and 4.2).
const TCPI_BYTES_ACKED: usize = 120;
const TCPI_BYTES_RECEIVED: usize = 128;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// The fixed part of a response (struct inet_diag_msg) before its attributes.
const RESPONSE_HEADER_LEN: usize = 72;
/// The share of the time reading the queues may take on average.
pub const READ_SHARE: f64 = 0.001;
/// The longest a read stands in for the queues (s): with more sockets than a read a
/// minute keeps under READ_SHARE (~90,000 here), reads take more.
const MAX_STALE_S: f64 = 60.0;

/// One peer's queued bytes, summed over its established connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queues {
    pub receive: u64,
    pub send: u64,
}

/// Bytes one peer's sockets carried since probe started reading them: sent (and
/// acknowledged by the peer) and received. Counters; a socket that closes between two reads
/// loses what it carried since the last one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    pub sent: u64,
    pub received: u64,
}

/// One socket at the last read: its peer and its `tcp_info` byte counts.
#[derive(Clone, Copy, Debug)]
struct Seen {
    peer: IpAddr,
    acked: u64,
    received: u64,
}

pub struct SocketQueues {
    socket: Socket,
    /// Only sockets of this cgroup v2 and those below it, when scoped.
    scope: Option<Subtree>,
    buf: Vec<u8>,
    seq: u32,
    peers: FxHashMap<IpAddr, Queues>,
    /// The last read, by peer label, and the ticks to wait before the next one.
    last: FxHashMap<String, Queues>,
    wait: u32,
    /// Each socket of the last read (by its cookie), this read's so far, and whether a read
    /// has happened: the sockets of the first read carried their bytes before probe looked.
    seen: FxHashMap<[u8; 8], Seen>,
    seen_now: FxHashMap<[u8; 8], Seen>,
    reads: u64,
    /// Bytes carried per peer (cumulative), and by label for the series.
    carried: FxHashMap<IpAddr, Carried>,
    carried_by_label: FxHashMap<String, Carried>,
    /// Each socket's job, when jobs are found (collect/jobs.rs), and the last read's jobs.
    jobs: Option<JobTally>,
    last_jobs: (Vec<JobSeries>, u64),
}

impl SocketQueues {
    pub fn new(scope: Option<Subtree>, jobs: Option<JobTally>) -> Result<Self> {
        let mut socket = Socket::new(NETLINK_SOCK_DIAG).context("opening a sock_diag socket")?;
        socket.bind_auto().context("binding the sock_diag socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("connecting the sock_diag socket")?;
        Ok(Self {
            socket,
            scope,
            buf: vec![0; 64 * 1024],
            seq: 0,
            peers: FxHashMap::default(),
            last: FxHashMap::default(),
            wait: 0,
            seen: FxHashMap::default(),
            seen_now: FxHashMap::default(),
            reads: 0,
            carried: FxHashMap::default(),
            carried_by_label: FxHashMap::default(),
            jobs,
            last_jobs: (Vec::new(), 0),
        })
    }

    /// Every peer's queues now: IPv4 then IPv6 sockets (a dual-stack socket's IPv4 peer
    /// comes as a mapped address and is counted as IPv4). A dump walks every bucket of the
    /// kernel's connection hash table, whoever's sockets are in it (0.2-0.45 ms on these
    /// machines with no socket at all), so a family the namespace has no TCP socket of
    /// (`/proc/net/sockstat`, per namespace) is not dumped.
    pub fn read(&mut self) -> Result<&FxHashMap<IpAddr, Queues>> {
        self.peers.clear();
        self.seen_now.clear();
        if let Some(j) = &mut self.jobs {
            j.begin();
        }
        if let Some(s) = &mut self.scope {
            s.begin_read();
        }
        for (family, file, tag) in [
            (AF_INET, "/proc/net/sockstat", "TCP:"),
            (AF_INET6, "/proc/net/sockstat6", "TCP6:"),
        ] {
            if tcp_in_use(file, tag) == Some(0) {
                continue;
            }
            self.dump(family)
                .with_context(|| format!("sock_diag dump of TCP sockets (family {family})"))?;
        }
        self.count_carried();
        if let Some(j) = &self.jobs {
            self.last_jobs = j.finish();
        }
        Ok(&self.peers)
    }

    /// The training jobs of the last read, and how many were past the cap.
    pub fn jobs(&self) -> (&[JobSeries], u64) {
        (&self.last_jobs.0, self.last_jobs.1)
    }

    /// The bytes each peer's sockets carried, summed since the first read.
    pub fn carried(&self) -> &FxHashMap<IpAddr, Carried> {
        &self.carried
    }

    /// Adds each socket's bytes since the last read to its peer. A socket new since then
    /// counts all its bytes (it opened in between), except at the first read, which only
    /// sets where each socket stands. A peer with no socket left is dropped: its counters
    /// start again from zero if it comes back (a counter reset, as Prometheus reads one).
    fn count_carried(&mut self) {
        let first = self.reads == 0;
        self.reads += 1;
        for (cookie, now) in &self.seen_now {
            let (acked, received) = match self.seen.get(cookie) {
                Some(was) => (
                    now.acked.saturating_sub(was.acked),
                    now.received.saturating_sub(was.received),
                ),
                None if first => (0, 0),
                None => (now.acked, now.received),
            };
            let c = self.carried.entry(now.peer).or_default();
            c.sent += acked;
            c.received += received;
        }
        let peers = &self.peers;
        self.carried.retain(|ip, _| peers.contains_key(ip));
        std::mem::swap(&mut self.seen, &mut self.seen_now);
    }

    /// Adds the queues to the peers sock_ops tracks (a peer with no established socket in
    /// the dump has 0), from a new read when it is due (ticks of `tick_s`), else from the
    /// last one. On an error every peer's queues stay unknown, and the next tick reads.
    pub fn add_to(&mut self, peers: &mut [PeerSeries], tick_s: f64) -> Result<()> {
        if self.wait == 0 {
            // The read's CPU time, not its wall-clock time, which on a busy host includes
            // waiting for a CPU: one read that waited long made the next ones wait with it
            // (a straggler's unread bytes went unseen for a whole lab episode).
            let t = thread_cpu_s();
            let read = self.read()?;
            self.last = read.iter().map(|(ip, q)| (peer_label(*ip), *q)).collect();
            self.carried_by_label = self
                .carried
                .iter()
                .map(|(ip, c)| (peer_label(*ip), *c))
                .collect();
            // A walk of the cgroup tree happens when a cgroup is new (a job starting): it
            // does not postpone the next reads, which would see the job's connections late.
            let walk = self.jobs.as_ref().map_or(0.0, JobTally::walk_seconds)
                + self.scope.as_ref().map_or(0.0, Subtree::walk_seconds);
            self.wait = ticks_to_wait(thread_cpu_s() - t - walk, tick_s);
        } else {
            self.wait -= 1;
        }
        for p in peers {
            let q = self.last.get(&p.peer).copied().unwrap_or_default();
            p.receive_queue_bytes = Some(q.receive);
            p.send_queue_bytes = Some(q.send);
            let c = self
                .carried_by_label
                .get(&p.peer)
                .copied()
                .unwrap_or_default();
            p.socket_sent_bytes = c.sent;
            p.socket_received_bytes = c.received;
        }
        Ok(())
    }

    fn dump(&mut self, family: u8) -> Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        header.sequence_number = self.seq;
        let socket_id = if family == AF_INET {
            SocketId::new_v4()
        } else {
            SocketId::new_v6()
        };
        let mut req = NetlinkMessage::new(
            header,
            SockDiagMessage::InetRequest(InetRequest {
                family,
                protocol: IPPROTO_TCP,
                extensions: ExtensionFlags::INFO,
                states: StateFlags::ESTABLISHED,
                socket_id,
            })
            .into(),
        );
        req.finalize();
        let mut out = vec![0; req.buffer_len()];
        req.serialize(&mut out);
        self.socket.send(&out, 0).context("sending the request")?;
        loop {
            let n = self
                .socket
                .recv(&mut &mut self.buf[..], 0)
                .context("receiving")?;
            if n == 0 {
                bail!("the kernel closed the dump");
            }
            if self.parse(n)? {
                return Ok(());
            }
        }
    }

    /// Adds the sockets of one received chunk; true at the end of the dump.
    fn parse(&mut self, n: usize) -> Result<bool> {
        let mut at = 0;
        while at < n {
            let msg = NetlinkBuffer::new_checked(&self.buf[at..n])
                .map_err(|e| anyhow::anyhow!("malformed netlink message: {e}"))?;
            let len = msg.length() as usize;
            if len == 0 {
                break;
            }
            // Messages are 4-byte aligned.
            at += (len + 3) & !3;
            // What is left of an earlier dump that failed halfway is not this one's.
            if msg.sequence_number() != self.seq {
                continue;
            }
            match msg.message_type() {
                NLMSG_DONE => return Ok(true),
                NLMSG_ERROR => {
                    let p = msg.payload();
                    let code = p
                        .get(..4)
                        .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                    if code != 0 {
                        return Err(std::io::Error::from_raw_os_error(-code))
                            .context("the kernel refused the dump");
                    }
                }
                _ => add_socket(
                    &mut self.peers,
                    &mut self.seen_now,
                    self.jobs.as_mut(),
                    msg.payload(),
                    self.scope.as_mut(),
                ),
            }
        }
        Ok(false)
    }
}

/// Adds one socket (struct inet_diag_msg and its attributes) to its peer's queues, and
/// notes its byte counts.
fn add_socket(
    peers: &mut FxHashMap<IpAddr, Queues>,
    seen: &mut FxHashMap<[u8; 8], Seen>,
    jobs: Option<&mut JobTally>,
    payload: &[u8],
    scope: Option<&mut Subtree>,
) {
    let Ok(h) = InetResponseHeader::parse(payload) else {
        return;
    };
    let attrs = payload.get(RESPONSE_HEADER_LEN..).unwrap_or_default();
    // Its cgroup only when something asks (a scan of the socket's attributes).
    let id = (scope.is_some() || jobs.is_some())
        .then(|| socket_cgroup(attrs))
        .flatten();
    if let Some(scope) = scope {
        if !id.is_some_and(|id| scope.contains(id)) {
            return;
        }
    }
    let peer = h.socket_id.destination_address.to_canonical();
    let q = peers.entry(peer).or_default();
    let (receive, send) = (u64::from(h.recv_queue), u64::from(h.send_queue));
    q.receive += receive;
    q.send += send;
    if let Some(j) = jobs {
        let local = h.socket_id.source_address.to_canonical();
        j.add(id, local, peer, receive, send);
    }
    if let Some((acked, received)) = socket_bytes(attrs) {
        seen.insert(
            h.socket_id.cookie,
            Seen {
                peer,
                acked,
                received,
            },
        );
    }
}

/// `tcpi_bytes_acked` and `tcpi_bytes_received` of a socket's INET_DIAG_INFO attribute.
fn socket_bytes(attrs: &[u8]) -> Option<(u64, u64)> {
    let info = NlasIterator::new(attrs)
        .filter_map(Result::ok)
        .find(|a| a.kind() == INET_DIAG_INFO)?;
    let v = info.value();
    let at = |off: usize| Some(u64::from_ne_bytes(v.get(off..off + 8)?.try_into().ok()?));
    Some((at(TCPI_BYTES_ACKED)?, at(TCPI_BYTES_RECEIVED)?))
}

/// Ticks to skip after a read that took `cost_s`, so that reads take at most [`READ_SHARE`]
/// of the time.
fn ticks_to_wait(cost_s: f64, tick_s: f64) -> u32 {
    let tick_s = tick_s.max(1e-3);
    let every = (cost_s / (READ_SHARE * tick_s)).ceil();
    let most = (MAX_STALE_S / tick_s).floor().max(1.0);
    (every.clamp(1.0, most) as u32) - 1
}

/// This thread's CPU time (user and system), in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; the clock always exists on
    // Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The `inuse` count of a sockstat line (`TCP: inuse 4 orphan 0 ...`); None when unknown.
fn tcp_in_use(file: &str, tag: &str) -> Option<u64> {
    parse_in_use(&std::fs::read_to_string(file).ok()?, tag)
}

fn parse_in_use(text: &str, tag: &str) -> Option<u64> {
    let mut f = text
        .lines()
        .find(|l| l.starts_with(tag))?
        .split_whitespace();
    f.find(|w| *w == "inuse")?;
    f.next()?.parse().ok()
}

fn socket_cgroup(attrs: &[u8]) -> Option<u64> {
    NlasIterator::new(attrs)
        .filter_map(Result::ok)
        .find(|a| a.kind() == INET_DIAG_CGROUP_ID)
        .and_then(|a| Some(u64::from_ne_bytes(a.value().get(..8)?.try_into().ok()?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    /// Bytes written to a connection on loopback that the receiver has not read are its
    /// Recv-Q: the dump finds them, on the receiver's socket, under the sender's address.
    #[test]
    fn unread_bytes_are_the_receive_queue() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        tx.write_all(&[7u8; 5000]).unwrap();
        let mut q = SocketQueues::new(None, None).unwrap();
        // Bounded wait for the bytes to cross loopback.
        let mut seen = 0;
        for _ in 0..100 {
            seen = q.read().unwrap()[&IpAddr::from([127, 0, 0, 1])].receive;
            if seen >= 5000 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(seen >= 5000, "unread bytes seen: {seen}");
        let mut b = vec![0; 5000];
        rx.read_exact(&mut b).unwrap();
        let after = q.read().unwrap()[&IpAddr::from([127, 0, 0, 1])].receive;
        assert_eq!(after, seen - 5000, "reading them empties the queue");
    }

    /// Scoped to the test's own cgroup the dump finds its sockets, and scoped to its parent
    /// too (a scope holds the cgroups below it, as sock_ops does); scoped to a directory no
    /// socket's cgroup is in, none.
    #[test]
    fn a_scoped_dump_counts_its_cgroup_and_those_below_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _rx = l.accept().unwrap();
        tx.write_all(&[7u8; 3000]).unwrap();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        let path = own.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
        let mount = crate::host::cgroup::cgroup2_mount().unwrap();
        let dir = mount.join(path.trim_start_matches('/'));
        let mut scopes = vec![dir.clone()];
        // The parent, unless that is the whole tree (the test's cgroup is the root's child).
        scopes.extend(
            dir.parent()
                .filter(|p| *p != mount && p.starts_with(&mount))
                .map(std::path::Path::to_path_buf),
        );
        let lo = IpAddr::from([127, 0, 0, 1]);
        for scope in scopes {
            let mut q = SocketQueues::new(Some(Subtree::new(&scope).unwrap()), None).unwrap();
            let mut seen = 0;
            for _ in 0..100 {
                seen = q.read().unwrap().get(&lo).map_or(0, |q| q.receive);
                if seen >= 3000 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert!(
                seen >= 3000,
                "unread bytes seen scoped to {}: {seen}",
                scope.display()
            );
        }
        let empty = std::env::temp_dir().join(format!("no-sockets-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let mut none = SocketQueues::new(Some(Subtree::new(&empty).unwrap()), None).unwrap();
        assert!(none.read().unwrap().is_empty());
        let _ = std::fs::remove_dir(&empty);
    }

    /// Bytes a connection opened before the first read wrote and read are carried by its
    /// peer exactly (the listener on 127.0.0.77, an address no other test uses; the other
    /// end's socket has 127.0.0.1 as its peer and is not looked at); a connection that opens
    /// after a read counts whole, its SYN as one acknowledged byte, as `ss` shows it.
    #[test]
    fn a_peers_sockets_carry_what_was_written_and_read() {
        let ip = IpAddr::from([127, 0, 0, 77]);
        let l = TcpListener::bind((ip, 0)).unwrap();
        let mut tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut rx, _) = l.accept().unwrap();
        let mut q = SocketQueues::new(None, None).unwrap();
        q.read().unwrap();
        assert_eq!(q.carried().get(&ip).copied(), Some(Carried::default()));
        let mut b = vec![0; 50_000];
        tx.write_all(&b).unwrap();
        rx.read_exact(&mut b).unwrap();
        rx.write_all(&b[..30_000]).unwrap();
        tx.read_exact(&mut b[..30_000]).unwrap();
        let want = Carried {
            sent: 50_000,
            received: 30_000,
        };
        // Bounded wait for the last ACK to come back.
        let settle = |q: &mut SocketQueues, want: Carried| {
            let mut seen = Carried::default();
            for _ in 0..100 {
                q.read().unwrap();
                seen = q.carried()[&ip];
                if seen == want {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            seen
        };
        assert_eq!(settle(&mut q, want), want);
        let mut late = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut late_rx, _) = l.accept().unwrap();
        late.write_all(&b[..1000]).unwrap();
        late_rx.read_exact(&mut b[..1000]).unwrap();
        late_rx.write_all(&b[..500]).unwrap();
        late.read_exact(&mut b[..500]).unwrap();
        let want = Carried {
            sent: 50_000 + 1001,
            received: 30_000 + 500,
        };
        assert_eq!(settle(&mut q, want), want);
        drop((tx, rx, late, late_rx));
        q.read().unwrap();
        assert!(
            q.carried().get(&ip).is_none(),
            "a peer with no socket left is dropped"
        );
    }

    #[test]
    fn sockstat_says_how_many_tcp_sockets_a_family_has() {
        let text =
            "sockets: used 9\nTCP: inuse 4 orphan 0 tw 61 alloc 22 mem 886\nUDP: inuse 0 mem 0\n";
        assert_eq!(parse_in_use(text, "TCP:"), Some(4));
        assert_eq!(
            parse_in_use("TCP6: inuse 0\nUDP6: inuse 0\n", "TCP6:"),
            Some(0)
        );
        assert_eq!(parse_in_use("UDP: inuse 3\n", "TCP:"), None);
    }

    #[test]
    fn many_sockets_are_read_less_often() {
        // 0.4 ms of a 1 s tick: every tick; 13 ms: every 13th; a 100 ms tick: every 4th.
        assert_eq!(ticks_to_wait(0.000_4, 1.0), 0);
        assert_eq!(ticks_to_wait(0.013, 1.0), 12);
        assert_eq!(ticks_to_wait(0.000_4, 0.1), 3);
        assert_eq!(ticks_to_wait(0.0, 1.0), 0);
        // A read of 0.5 s never leaves the queues stale for more than a minute.
        assert_eq!(ticks_to_wait(0.5, 1.0), 59);
        assert_eq!(ticks_to_wait(0.5, 0.1), 599);
    }

    /// The cost that sets the wait is this thread's CPU time: a sleep adds none of it, a
    /// busy loop adds it.
    #[test]
    fn a_read_is_charged_its_cpu_time_only() {
        let t = thread_cpu_s();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = thread_cpu_s() - t;
        assert!(slept < 0.01, "{slept} s of CPU while asleep");
        // Busy until the clock has counted 10 ms (at most 5 s on a crowded machine); it
        // counts no faster than the wall clock.
        let (t, start) = (thread_cpu_s(), std::time::Instant::now());
        while thread_cpu_s() - t < 0.01 && start.elapsed() < std::time::Duration::from_secs(5) {
            std::hint::black_box(0u64);
        }
        let (busy, wall) = (thread_cpu_s() - t, start.elapsed().as_secs_f64());
        assert!(busy >= 0.01, "{busy} s of CPU in {wall} s busy");
        assert!(busy <= wall + 0.002, "{busy} s of CPU in {wall} s");
    }

    #[test]
    fn a_cgroup_id_is_read_from_its_attribute() {
        // nlattr: len 12, type 21, then the u64.
        let mut a = Vec::new();
        a.extend_from_slice(&12u16.to_ne_bytes());
        a.extend_from_slice(&INET_DIAG_CGROUP_ID.to_ne_bytes());
        a.extend_from_slice(&4242u64.to_ne_bytes());
        assert_eq!(socket_cgroup(&a), Some(4242));
        assert_eq!(socket_cgroup(&[]), None);
    }

    /// What a read costs with the bench's 10,000 connections (both ends on loopback in this
    /// namespace: 20,000 sockets), and with none of this process's:
    /// `cargo test --release -p probe-user sockets_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: release, up to 20,000 open files"]
    fn sockets_cost() {
        let mut q = SocketQueues::new(None, None).unwrap();
        let time = |q: &mut SocketQueues| {
            let mut best = f64::INFINITY;
            for _ in 0..20 {
                let t = std::time::Instant::now();
                q.read().unwrap();
                best = best.min(t.elapsed().as_secs_f64());
            }
            best
        };
        let idle = time(&mut q);
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain getrlimit/setrlimit with a valid struct; the soft limit goes up to the
        // hard one, which needs no privilege.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
            limit.rlim_cur = limit.rlim_max;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0);
        }
        let pairs = 10_000.min((limit.rlim_cur as usize).saturating_sub(100) / 2);
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut open = Vec::new();
        for _ in 0..pairs {
            let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            open.push((c, l.accept().unwrap().0));
        }
        let busy = time(&mut q);
        let n = q.read().unwrap()[&IpAddr::from([127, 0, 0, 1])];
        eprintln!(
            "sockets_cost: {:.0} us per read with no socket of ours, {:.0} us with {} ({:?})",
            idle * 1e6,
            busy * 1e6,
            2 * pairs,
            n
        );
    }
}
