//! The user side of the per-CPU burst-end rings: BURST_EVENTS (the records) and
//! BURST_EVENTS_POS (each CPU's head and tail), two mmapable arrays that the daemon maps once
//! and reads in place. A read copies each CPU's records between its tail and its head, then
//! moves the tail: no syscall, and one store per CPU per read rather than one per record.
//! The protocol is in probe_ebpf::RingPos.
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context as _, Result};

use super::mapping::Mapping;
use aya::maps::MapData;
use probe_ebpf::{BurstSlot, RingPos};

pub struct BurstRing {
    slots: Mapping,
    pos: Mapping,
    cpus: usize,
    /// Records per CPU, a power of two.
    len: u64,
    /// The CPU the next read starts at: reads cut short by their limit take turns.
    next_cpu: usize,
}

impl BurstRing {
    /// Maps the two arrays, as the loader sized them: `records` per CPU for `cpus` CPUs.
    pub fn new(slots: &MapData, pos: &MapData, cpus: usize, records: u32) -> Result<Self> {
        if !records.is_power_of_two() {
            bail!("burst ring of {records} records per CPU: not a power of two");
        }
        let slot = std::mem::size_of::<BurstSlot>();
        let slots = Mapping::new(slots, cpus * records as usize * slot, false)
            .context("mapping BURST_EVENTS")?;
        let pos = Mapping::new(pos, cpus * std::mem::size_of::<RingPos>(), true)
            .context("mapping BURST_EVENTS_POS")?;
        Ok(Self {
            slots,
            pos,
            cpus,
            len: records.into(),
            next_cpu: 0,
        })
    }

    /// Records the rings hold, all CPUs together.
    pub fn capacity(&self) -> usize {
        self.cpus * self.len as usize
    }

    /// Hands `f` the records the programs wrote since the last read, CPU by CPU (with the
    /// CPU), at most `max` of them, and frees their slots for the programs. Returns how many
    /// it handed.
    pub fn read(&mut self, max: usize, mut f: impl FnMut(usize, &BurstSlot)) -> usize {
        let mut n = 0usize;
        for i in 0..self.cpus {
            if n >= max {
                break;
            }
            let cpu = (self.next_cpu + i) % self.cpus;
            // SAFETY: cpu < cpus, so the line is inside the mapping; it is 8-byte aligned
            // (page-aligned mapping, 64-byte lines) and only accessed atomically here.
            let (head, tail) = unsafe {
                let p = self.pos.ptr.as_ptr().cast::<RingPos>().add(cpu);
                (
                    AtomicU64::from_ptr(&raw mut (*p).head),
                    AtomicU64::from_ptr(&raw mut (*p).tail),
                )
            };
            // Acquire: the records before `head` were written before it was published.
            let h = head.load(Ordering::Acquire);
            let mut t = tail.load(Ordering::Relaxed);
            // The program never runs more than a ring ahead; if it ever did, what is left is
            // the last ring's worth.
            if h.wrapping_sub(t) > self.len {
                t = h - self.len;
            }
            let take = h.wrapping_sub(t).min((max - n) as u64);
            let base = cpu as u64 * self.len;
            for k in 0..take {
                let slot = base + ((t + k) & (self.len - 1));
                // SAFETY: slot < cpus * len, inside the mapping. The program does not write
                // this slot again before the tail passes it (below); volatile, because the
                // memory is shared with the kernel.
                let r = unsafe {
                    std::ptr::read_volatile(
                        self.slots
                            .ptr
                            .as_ptr()
                            .cast::<BurstSlot>()
                            .add(slot as usize),
                    )
                };
                f(cpu, &r);
            }
            // Release: the copies above are done before the program may reuse the slots.
            tail.store(t + take, Ordering::Release);
            n += take as usize;
        }
        self.next_cpu = (self.next_cpu + 1) % self.cpus.max(1);
        n
    }
}

/// The reader against real kernel arrays (root: it creates the maps; no program is loaded
/// into the kernel's hooks). The test writes records as the programs do: the slot first (a
/// map update), then the head (through its own mapping of the positions).
#[cfg(test)]
mod tests {
    use aya::maps::{Array, Map};
    use probe_ebpf::{names, BurstEnd};

    use super::*;

    const RECORDS: u32 = 8;

    fn rec(n: u64) -> BurstSlot {
        BurstSlot {
            end: BurstEnd {
                start_ns: n,
                bytes: 100 + n,
                ..BurstEnd::default()
            },
            series_slot: n as u32,
            _pad: 0,
        }
    }

    fn read(ring: &mut BurstRing, max: usize) -> Vec<u64> {
        let mut got = Vec::new();
        let n = ring.read(max, |cpu, r| {
            assert_eq!(r.series_slot as u64, r.end.start_ns, "the whole slot");
            got.push(r.end.start_ns + cpu as u64 * 1000)
        });
        assert_eq!(n, got.len());
        got
    }

    #[test]
    fn reads_what_was_published_in_order_and_frees_it() {
        // SAFETY: a plain libc call.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: creating BPF maps needs root (CI runs as root)");
            return;
        }
        let mut ebpf = aya::EbpfLoader::new()
            .map_max_entries(names::BURST_EVENTS, 2 * RECORDS)
            .map_max_entries(names::BURST_EVENTS_POS, 2)
            .load(crate::bpf::load::OBJECT)
            .unwrap();
        let (Some(Map::Array(slots)), Some(Map::Array(pos))) = (
            ebpf.take_map(names::BURST_EVENTS),
            ebpf.take_map(names::BURST_EVENTS_POS),
        ) else {
            panic!("the rings are not arrays");
        };
        let mut ring = BurstRing::new(&slots, &pos, 2, RECORDS).unwrap();
        let mut writer: Array<_, BurstSlot> = Array::try_from(Map::Array(slots)).unwrap();
        let heads = Mapping::new(&pos, 2 * std::mem::size_of::<RingPos>(), true).unwrap();
        let head = |cpu: usize| {
            // SAFETY: cpu < 2, inside the mapping.
            unsafe {
                AtomicU64::from_ptr(&raw mut (*heads.ptr.as_ptr().cast::<RingPos>().add(cpu)).head)
            }
        };
        let mut write = |cpu: usize, n: u64| {
            let slot = cpu as u32 * RECORDS + (n as u32 & (RECORDS - 1));
            writer.set(slot, rec(n), 0).unwrap();
            head(cpu).store(n + 1, Ordering::Release);
        };

        assert!(read(&mut ring, 100).is_empty());
        for n in 0..5 {
            write(0, n);
        }
        write(1, 0);
        // Reads take turns at which CPU they start with (the empty read started at CPU 0):
        // CPU 1's record (seen as 1000 + n), then CPU 0's first two, cut short by the limit;
        // the rest stays for the next read.
        assert_eq!(read(&mut ring, 3), [1000, 0, 1]);
        assert_eq!(read(&mut ring, 100), [2, 3, 4]);
        // Past the end of the ring and round: slots 5..7, then 0..3 again.
        for n in 5..12 {
            write(0, n);
        }
        assert_eq!(read(&mut ring, 100), (5..12).collect::<Vec<_>>());
        // A head more than a ring ahead of the tail (the programs never do it): only the
        // last ring's worth is read.
        for n in 12..30 {
            write(0, n);
        }
        assert_eq!(read(&mut ring, 100), (22..30).collect::<Vec<_>>());
        assert!(read(&mut ring, 100).is_empty());
        // The tail the programs see is where the reader stopped.
        // SAFETY: inside the mapping.
        let tail =
            unsafe { AtomicU64::from_ptr(&raw mut (*heads.ptr.as_ptr().cast::<RingPos>()).tail) };
        assert_eq!(tail.load(Ordering::Acquire), 30);
    }
}
