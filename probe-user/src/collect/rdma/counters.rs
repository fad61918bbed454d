//! Counter semantics: which files feed which named metric, in which unit, and how raw readings
//! become monotonic totals.
//!
//! Two families of counters live under a port directory, with different rules:
//!
//! * `counters/` (the IB PerfMgt attributes, `PortCounters` and `PortCountersExtended`). The
//!   legacy `PortCounters` fields are 4 to 32 bits wide and **saturate**: they stop at their
//!   maximum (e.g. `port_xmit_data` at 2^32-1) instead of wrapping. On devices with extended
//!   counters the kernel reads `port_{xmit,rcv}_{data,packets}` from the 64-bit attribute instead,
//!   so those four may exceed 32 bits. A value at the legacy maximum is marked saturated and no
//!   longer accumulates; a lower value afterwards is a reset (someone cleared the counters) and
//!   accumulation resumes from it; a higher value proves the counter is 64-bit and accumulation
//!   resumes from the maximum. Any other decrease is a reset.
//! * `hw_counters/` (driver statistics; names differ per driver and are discovered by listing
//!   the directory). They never saturate, but the firmware queue counters behind many of them
//!   (mlx5 `out_of_sequence`, `packet_seq_err`, ...) are 32-bit and **wrap**. A decrease from a
//!   value that fits in 32 bits is a wrap when the wrapped advance is under 2^31 (serial-number
//!   arithmetic, RFC 1982); otherwise it is a reset.
//!
//! Totals accumulate the deltas, so they stay monotonic across wraps, saturation and resets.
//! The first reading of a counter is taken as its starting total (matching what `perfquery` or
//! `cat` shows); rates need two readings.

use std::time::Instant;

/// The two counter directories of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// `ports/N/counters/`: IB PerfMgt port counters (saturating).
    Counters,
    /// `ports/N/hw_counters/`: driver statistics (may wrap at 32 bits).
    HwCounters,
}

impl Group {
    /// The directory name under `ports/N/`.
    pub fn dir(self) -> &'static str {
        match self {
            Group::Counters => "counters",
            Group::HwCounters => "hw_counters",
        }
    }

    /// `counters/<file>` or `hw_counters/<file>`: the key of a counter that has no explicit name.
    pub fn key(self, file: &str) -> String {
        format!("{}/{}", self.dir(), file)
    }
}

/// How a counter file behaves at its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Semantics {
    /// IB `PortCounters` field of `width` bits: stops at `2^width - 1`. The data and packet
    /// counters may be served from the 64-bit `PortCountersExtended` instead and then pass that
    /// maximum, which clears the saturation.
    Saturating { width: u32 },
    /// Driver counter: may wrap at 32 bits, never saturates.
    Wrapping,
    /// A `counters/` file without a legacy width (the 64-bit `PortCountersExtended`-only ones,
    /// or a name the kernel table lacks): never saturates; any decrease is a reset.
    Wide,
}

impl Semantics {
    /// The rules for one counter file.
    pub fn of(group: Group, file: &str) -> Semantics {
        match group {
            Group::HwCounters => Semantics::Wrapping,
            Group::Counters => match legacy_width(file) {
                Some(width) => Semantics::Saturating { width },
                None => Semantics::Wide,
            },
        }
    }

    /// The saturation value, for saturating counters.
    fn max(self) -> Option<u64> {
        match self {
            Semantics::Saturating { width, .. } => Some((1u64 << width) - 1),
            _ => None,
        }
    }
}

/// Widths of the legacy `PortCounters` fields, as the kernel decodes them
/// (drivers/infiniband/core/sysfs.c, `PORT_PMA_ATTR`). With extended width (`PORT_PMA_ATTR_EXT`)
/// the kernel serves `port_{xmit,rcv}_{data,packets}` as 64-bit values instead; the
/// `unicast_*`/`multicast_*` counters exist only as 64-bit ones.
fn legacy_width(file: &str) -> Option<u32> {
    Some(match file {
        "symbol_error" => 16,
        "link_error_recovery" => 8,
        "link_downed" => 8,
        "port_rcv_errors" => 16,
        "port_rcv_remote_physical_errors" => 16,
        "port_rcv_switch_relay_errors" => 16,
        "port_xmit_discards" => 16,
        "port_xmit_constraint_errors" => 8,
        "port_rcv_constraint_errors" => 8,
        "local_link_integrity_errors" => 4,
        "excessive_buffer_overrun_errors" => 4,
        "VL15_dropped" => 16,
        "port_xmit_data" => 32,
        "port_rcv_data" => 32,
        "port_xmit_packets" => 32,
        "port_rcv_packets" => 32,
        "port_xmit_wait" => 32,
        _ => return None,
    })
}

/// A decrease of a counter that fits in 32 bits counts as a wrap only if the wrapped advance is
/// below this (half the 32-bit range); a larger one is a reset.
const WRAP_LIMIT: u64 = 1 << 31;

/// What one reading did to a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Normal advance (possibly zero).
    Advanced,
    /// The value wrapped at 32 bits.
    Wrapped,
    /// The value went down and could not be a wrap: counters were reset.
    Reset,
    /// The value reached the legacy maximum on this reading.
    Saturated,
    /// Still at the legacy maximum.
    StillSaturated,
}

/// Raw readings of one counter turned into a monotonic total.
#[derive(Debug, Clone)]
pub struct Accumulator {
    semantics: Semantics,
    last_raw: u64,
    total: u64,
    saturated: bool,
    last_read: Instant,
}

/// The result of [`Accumulator::observe`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    pub event: Event,
    /// The advance since the previous reading in raw units, when it is exact (not on the first
    /// reading, not while saturated).
    pub delta: Option<u64>,
    /// Seconds since the previous reading (monotonic clock).
    pub elapsed: f64,
}

impl Observation {
    /// Per-second rate of the advance, scaled to base units.
    pub fn rate(&self, scale: u64) -> Option<f64> {
        match self.delta {
            Some(d) if self.elapsed > 0.0 => Some(d as f64 * scale as f64 / self.elapsed),
            _ => None,
        }
    }
}

impl Accumulator {
    /// Starts a counter at its first reading.
    pub fn new(semantics: Semantics, raw: u64, now: Instant) -> Self {
        let saturated = semantics.max() == Some(raw);
        Self {
            semantics,
            last_raw: raw,
            total: raw,
            saturated,
            last_read: now,
        }
    }

    /// The monotonic total in raw units.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Whether the counter sits at its legacy maximum.
    pub fn saturated(&self) -> bool {
        self.saturated
    }

    /// Folds in a new reading taken at `now`.
    pub fn observe(&mut self, raw: u64, now: Instant) -> Observation {
        let elapsed = now.saturating_duration_since(self.last_read).as_secs_f64();
        let prev = self.last_raw;
        let (event, delta) = match self.semantics.max() {
            Some(max) if raw == max => {
                // Count what was certainly seen up to the ceiling, then stop.
                let event = if self.saturated {
                    Event::StillSaturated
                } else {
                    Event::Saturated
                };
                self.add(raw.saturating_sub(prev));
                self.saturated = true;
                (event, None)
            }
            _ => {
                let was_saturated = self.saturated;
                self.saturated = false;
                let (event, delta) = self.step(prev, raw);
                self.add(delta);
                // Leaving saturation: the delta is a lower bound of what happened, not a rate.
                (event, (!was_saturated).then_some(delta))
            }
        };
        self.last_raw = raw;
        self.last_read = now;
        Observation {
            event,
            delta,
            elapsed,
        }
    }

    fn step(&self, prev: u64, raw: u64) -> (Event, u64) {
        if raw >= prev {
            return (Event::Advanced, raw - prev);
        }
        match self.semantics {
            Semantics::Wrapping if prev <= u64::from(u32::MAX) => {
                let wrapped = (1u64 << 32) - prev + raw;
                if wrapped < WRAP_LIMIT {
                    (Event::Wrapped, wrapped)
                } else {
                    (Event::Reset, raw)
                }
            }
            _ => (Event::Reset, raw),
        }
    }

    fn add(&mut self, delta: u64) {
        self.total = self.total.saturating_add(delta);
    }
}

/// Where an explicitly named metric comes from: a counter file and the factor to base units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    pub group: Group,
    pub file: &'static str,
    /// Multiplier from the file's unit to the metric's base unit (4 for 32-bit words).
    pub scale: u64,
}

/// A counter exported under its own name, `probe_rdma_port_<key>_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortMetric {
    /// Key in [`RdmaPort::counters`](super::RdmaPort::counters) and suffix of the metric name.
    pub key: &'static str,
    /// Metric name without the `_total` suffix the encoder appends.
    pub name: &'static str,
    pub help: &'static str,
    /// Candidate files, first present wins (chosen by the directory listing, not by whether a
    /// read succeeded, so a failing read never switches the source).
    pub sources: &'static [Source],
}

/// Keys of the explicitly named counters in `RdmaPort::counters` and `RdmaPort::rates`. Use
/// these rather than string literals when reading a snapshot.
pub mod keys {
    pub const TRANSMIT_BYTES: &str = "transmit_bytes";
    pub const RECEIVE_BYTES: &str = "receive_bytes";
    pub const TRANSMIT_PACKETS: &str = "transmit_packets";
    pub const RECEIVE_PACKETS: &str = "receive_packets";
    pub const TRANSMIT_WAIT_TICKS: &str = "transmit_wait_ticks";
    pub const TRANSMIT_DISCARDS: &str = "transmit_discards";
    pub const CNP_SENT: &str = "cnp_sent";
    pub const CNP_HANDLED: &str = "cnp_handled";
    pub const ECN_MARKED_PACKETS: &str = "ecn_marked_packets";
    pub const OUT_OF_SEQUENCE_PACKETS: &str = "out_of_sequence_packets";
    pub const PACKET_SEQUENCE_ERRORS: &str = "packet_sequence_errors";
    pub const LOCAL_ACK_TIMEOUT_ERRORS: &str = "local_ack_timeout_errors";
    pub const RNR_NAK_RETRY_ERRORS: &str = "rnr_nak_retry_errors";
    pub const LINK_DOWNED: &str = "link_downed";
}

const fn pma(file: &'static str, scale: u64) -> Source {
    Source {
        group: Group::Counters,
        file,
        scale,
    }
}

const fn hw(file: &'static str) -> Source {
    Source {
        group: Group::HwCounters,
        file,
        scale: 1,
    }
}

/// The explicitly named per-port counters, in export order. Counter files that feed one of these
/// are not repeated in the generic `probe_rdma_port_{counter,hw_counter}_total` series.
pub const PORT_METRICS: &[PortMetric] = &[
    PortMetric {
        key: keys::TRANSMIT_BYTES,
        name: "probe_rdma_port_transmit_bytes",
        help: "Bytes transmitted on the port, all VLs (counters/port_xmit_data x 4: the file counts 4-byte words).",
        sources: &[pma("port_xmit_data", 4)],
    },
    PortMetric {
        key: keys::RECEIVE_BYTES,
        name: "probe_rdma_port_receive_bytes",
        help: "Bytes received on the port, all VLs (counters/port_rcv_data x 4: the file counts 4-byte words).",
        sources: &[pma("port_rcv_data", 4)],
    },
    PortMetric {
        key: keys::TRANSMIT_PACKETS,
        name: "probe_rdma_port_transmit_packets",
        help: "Packets transmitted on the port (counters/port_xmit_packets; hw_counters/sent_pkts on rxe).",
        sources: &[pma("port_xmit_packets", 1), hw("sent_pkts")],
    },
    PortMetric {
        key: keys::RECEIVE_PACKETS,
        name: "probe_rdma_port_receive_packets",
        help: "Packets received on the port (counters/port_rcv_packets; hw_counters/rcvd_pkts on rxe).",
        sources: &[pma("port_rcv_packets", 1), hw("rcvd_pkts")],
    },
    PortMetric {
        key: keys::TRANSMIT_WAIT_TICKS,
        name: "probe_rdma_port_transmit_wait_ticks",
        help: "Device sample ticks during which the port had data to send but could not (no credits or arbitration) (counters/port_xmit_wait).",
        sources: &[pma("port_xmit_wait", 1)],
    },
    PortMetric {
        key: keys::TRANSMIT_DISCARDS,
        name: "probe_rdma_port_transmit_discards",
        help: "Outbound packets discarded by the port, e.g. port down or congestion (counters/port_xmit_discards).",
        sources: &[pma("port_xmit_discards", 1)],
    },
    PortMetric {
        key: keys::CNP_SENT,
        name: "probe_rdma_port_cnp_sent",
        help: "RoCE congestion notification packets sent by this port as notification point (hw_counters/np_cnp_sent).",
        sources: &[hw("np_cnp_sent")],
    },
    PortMetric {
        key: keys::CNP_HANDLED,
        name: "probe_rdma_port_cnp_handled",
        help: "RoCE congestion notification packets handled by this port as reaction point, i.e. rate reductions (hw_counters/rp_cnp_handled).",
        sources: &[hw("rp_cnp_handled")],
    },
    PortMetric {
        key: keys::ECN_MARKED_PACKETS,
        name: "probe_rdma_port_ecn_marked_packets",
        help: "RoCE packets received with an ECN congestion mark (hw_counters/np_ecn_marked_roce_packets).",
        sources: &[hw("np_ecn_marked_roce_packets")],
    },
    PortMetric {
        key: keys::OUT_OF_SEQUENCE_PACKETS,
        name: "probe_rdma_port_out_of_sequence_packets",
        help: "Out-of-sequence packets received (hw_counters/out_of_sequence; out_of_seq_request on rxe).",
        sources: &[hw("out_of_sequence"), hw("out_of_seq_request")],
    },
    PortMetric {
        key: keys::PACKET_SEQUENCE_ERRORS,
        name: "probe_rdma_port_packet_sequence_errors",
        help: "NAK sequence error packets received (hw_counters/packet_seq_err; rcvd_seq_err on rxe).",
        sources: &[hw("packet_seq_err"), hw("rcvd_seq_err")],
    },
    PortMetric {
        key: keys::LOCAL_ACK_TIMEOUT_ERRORS,
        name: "probe_rdma_port_local_ack_timeout_errors",
        help: "Times a QP's ACK timer expired on the sender side (hw_counters/local_ack_timeout_err).",
        sources: &[hw("local_ack_timeout_err")],
    },
    PortMetric {
        key: keys::RNR_NAK_RETRY_ERRORS,
        name: "probe_rdma_port_rnr_nak_retry_errors",
        help: "Receiver-not-ready NAK packets received (hw_counters/rnr_nak_retry_err; rcvd_rnr_err on rxe).",
        sources: &[hw("rnr_nak_retry_err"), hw("rcvd_rnr_err")],
    },
    PortMetric {
        key: keys::LINK_DOWNED,
        name: "probe_rdma_port_link_downed",
        help: "Times the link error recovery process failed and the link went down (counters/link_downed; hw_counters/link_downed on rxe).",
        sources: &[pma("link_downed", 1), hw("link_downed")],
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn semantics_follow_the_kernel_tables() {
        assert_eq!(
            Semantics::of(Group::Counters, "port_xmit_data"),
            Semantics::Saturating { width: 32 }
        );
        assert_eq!(
            Semantics::of(Group::Counters, "port_xmit_wait"),
            Semantics::Saturating { width: 32 }
        );
        assert_eq!(
            Semantics::of(Group::Counters, "link_downed"),
            Semantics::Saturating { width: 8 }
        );
        assert_eq!(
            Semantics::of(Group::Counters, "unicast_xmit_packets"),
            Semantics::Wide
        );
        assert_eq!(
            Semantics::of(Group::HwCounters, "out_of_sequence"),
            Semantics::Wrapping
        );
    }

    #[test]
    fn advancing_counter_accumulates_and_rates() {
        let t0 = Instant::now();
        let mut a = Accumulator::new(Semantics::Wrapping, 100, t0);
        assert_eq!(a.total(), 100);
        let o = a.observe(350, at(t0, 2));
        assert_eq!(o.event, Event::Advanced);
        assert_eq!(o.delta, Some(250));
        assert_eq!(o.rate(1), Some(125.0));
        assert_eq!(o.rate(4), Some(500.0));
        assert_eq!(a.total(), 350);
    }

    #[test]
    fn hw_counter_wraps_at_32_bits() {
        let t0 = Instant::now();
        let mut a = Accumulator::new(Semantics::Wrapping, 0xFFFF_FFF0, t0);
        let o = a.observe(0x10, at(t0, 1));
        assert_eq!(o.event, Event::Wrapped);
        assert_eq!(o.delta, Some(0x20));
        assert_eq!(a.total(), 0xFFFF_FFF0 + 0x20);
        // And keeps going after the wrap.
        let o = a.observe(0x30, at(t0, 2));
        assert_eq!(o.delta, Some(0x20));
        assert_eq!(a.total(), 0x1_0000_0030);
    }

    #[test]
    fn implausible_wrap_is_a_reset() {
        let t0 = Instant::now();
        // 1000 -> 10 would be a wrap of almost 2^32: a reset (counters cleared, driver reloaded).
        let mut a = Accumulator::new(Semantics::Wrapping, 1000, t0);
        let o = a.observe(10, at(t0, 1));
        assert_eq!(o.event, Event::Reset);
        assert_eq!(o.delta, Some(10));
        assert_eq!(a.total(), 1010);
        // A 64-bit value going down can never be a 32-bit wrap.
        let mut a = Accumulator::new(Semantics::Wrapping, 1 << 40, t0);
        let o = a.observe(5, at(t0, 1));
        assert_eq!(o.event, Event::Reset);
        assert_eq!(a.total(), (1 << 40) + 5);
    }

    #[test]
    fn legacy_32_bit_counter_saturates_without_jumping() {
        let t0 = Instant::now();
        let sem = Semantics::of(Group::Counters, "port_xmit_wait");
        let mut a = Accumulator::new(sem, 0xFFFF_FF00, t0);
        let o = a.observe(0xFFFF_FFFF, at(t0, 1));
        assert_eq!(o.event, Event::Saturated);
        assert_eq!(o.delta, None, "no rate across the ceiling");
        assert!(a.saturated());
        assert_eq!(a.total(), 0xFFFF_FFFF);
        let o = a.observe(0xFFFF_FFFF, at(t0, 2));
        assert_eq!(o.event, Event::StillSaturated);
        assert_eq!(o.delta, None);
        assert_eq!(a.total(), 0xFFFF_FFFF);
        // Cleared by an operator (perfquery -R): counting resumes from the new value, no wrap.
        let o = a.observe(7, at(t0, 3));
        assert_eq!(o.event, Event::Reset);
        assert_eq!(
            o.delta, None,
            "the first interval after saturation has no exact rate"
        );
        assert!(!a.saturated());
        assert_eq!(a.total(), 0xFFFF_FFFF + 7);
        let o = a.observe(17, at(t0, 4));
        assert_eq!(o.delta, Some(10));
        assert_eq!(a.total(), 0xFFFF_FFFF + 17);
    }

    #[test]
    fn first_reading_at_the_ceiling_is_saturated() {
        let t0 = Instant::now();
        let mut a = Accumulator::new(Semantics::of(Group::Counters, "link_downed"), 255, t0);
        assert!(a.saturated());
        let o = a.observe(255, at(t0, 1));
        assert_eq!(o.event, Event::StillSaturated);
        assert_eq!(a.total(), 255);
    }

    #[test]
    fn extended_data_counter_passing_the_32_bit_maximum_is_not_saturated() {
        let t0 = Instant::now();
        let sem = Semantics::of(Group::Counters, "port_xmit_data");
        let mut a = Accumulator::new(sem, 0xFFFF_FFF0, t0);
        a.observe(0xFFFF_FFFF, at(t0, 1));
        assert!(a.saturated());
        // It kept counting: the device has 64-bit PortCountersExtended.
        let o = a.observe(0x1_0000_0100, at(t0, 2));
        assert_eq!(o.event, Event::Advanced);
        assert!(!a.saturated());
        assert_eq!(a.total(), 0x1_0000_0100);
        let o = a.observe(0x1_0000_0200, at(t0, 3));
        assert_eq!(o.delta, Some(0x100));
    }

    #[test]
    fn legacy_counter_going_down_is_a_reset_not_a_wrap() {
        let t0 = Instant::now();
        let sem = Semantics::of(Group::Counters, "port_xmit_packets");
        let mut a = Accumulator::new(sem, 0xFFFF_FFF0, t0);
        let o = a.observe(0x10, at(t0, 1));
        assert_eq!(o.event, Event::Reset);
        assert_eq!(a.total(), 0xFFFF_FFF0 + 0x10);
    }

    #[test]
    fn sixteen_bit_counter_saturates_at_its_own_width() {
        let t0 = Instant::now();
        let sem = Semantics::of(Group::Counters, "port_xmit_discards");
        let mut a = Accumulator::new(sem, 65_000, t0);
        let o = a.observe(65_535, at(t0, 1));
        assert_eq!(o.event, Event::Saturated);
        // 65_535 on a 32-bit counter is just a value.
        let mut b = Accumulator::new(Semantics::of(Group::Counters, "port_xmit_wait"), 1, t0);
        assert_eq!(b.observe(65_535, at(t0, 1)).event, Event::Advanced);
    }

    #[test]
    fn metric_table_is_consistent() {
        let mut keys = std::collections::HashSet::new();
        for m in PORT_METRICS {
            assert!(keys.insert(m.key), "duplicate key {}", m.key);
            assert_eq!(m.name, format!("probe_rdma_port_{}", m.key));
            assert!(!m.name.ends_with("_total"));
            assert!(!m.sources.is_empty());
            assert!(m.help.ends_with('.'));
        }
        // port_xmit_data / port_rcv_data count 4-byte words.
        let tx = PORT_METRICS.iter().find(|m| m.key == keys::TRANSMIT_BYTES);
        assert_eq!(tx.map(|m| m.sources[0].scale), Some(4));
    }
}
