//! The poller: one synchronous sysfs pass per call ([`RdmaPoller::poll`]), and a dedicated thread
//! that polls at the configured interval and publishes the latest snapshot ([`spawn`]).
//!
//! Reads of `counters/` issue a MAD to the NIC firmware and `hw_counters/` a firmware command,
//! so a pass can block for as long as the driver takes; it therefore never runs on the async
//! runtime.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::counters::{Accumulator, Event, Group, Semantics, PORT_METRICS};
use super::sysfs::{self, Failure, FailureKind, PortReading};
use super::verbs::{self, VerbsDiscovery};
use super::{RdmaConfig, RdmaDevice, RdmaPort, RdmaSnapshot};

/// Name of the polling thread.
pub const THREAD_NAME: &str = "probe-rdma";

/// Shortest interval [`spawn`] accepts; shorter ones are raised to it.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

type Discover = Box<dyn FnMut() -> VerbsDiscovery + Send>;

/// Reads RDMA counters from a sysfs tree and keeps the state that turns readings into
/// monotonic totals and rates.
pub struct RdmaPoller {
    config: RdmaConfig,
    discover: Discover,
    /// The last verbs discovery; `None` before the first poll.
    verbs: Option<VerbsDiscovery>,
    devices: BTreeMap<String, DeviceState>,
    read_errors_total: u64,
    last_poll: Option<Instant>,
    /// Whether "no RDMA devices" was logged (reset when devices appear).
    said_no_devices: bool,
    /// Failures outside a port (root, device listing) already logged.
    logged: HashSet<String>,
}

impl std::fmt::Debug for RdmaPoller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaPoller")
            .field("config", &self.config)
            .field("devices", &self.devices.keys().collect::<Vec<_>>())
            .field("read_errors_total", &self.read_errors_total)
            .finish_non_exhaustive()
    }
}

struct DeviceState {
    node_guid: Option<String>,
    ports: BTreeMap<u32, PortState>,
}

#[derive(Default)]
struct PortState {
    counters: HashMap<(Group, String), Accumulator>,
    /// Failures (by file) already logged for this port.
    logged: HashSet<String>,
}

impl RdmaPoller {
    /// A poller over `config.sysfs_root`. Does no I/O: device discovery (libibverbs and sysfs)
    /// happens on the first [`poll`](Self::poll).
    pub fn new(config: RdmaConfig) -> Self {
        Self::with_discovery(config, verbs::discover)
    }

    /// A poller with a substitute for libibverbs discovery (tests, or a host where verbs must
    /// not be touched).
    pub fn with_discovery(
        config: RdmaConfig,
        discover: impl FnMut() -> VerbsDiscovery + Send + 'static,
    ) -> Self {
        Self {
            config,
            discover: Box::new(discover),
            verbs: None,
            devices: BTreeMap::new(),
            read_errors_total: 0,
            last_poll: None,
            said_no_devices: false,
            logged: HashSet::new(),
        }
    }

    /// One pass over the sysfs tree: attributes, counters, totals, and rates against the
    /// previous poll (monotonic clock). Never panics on a malformed tree; failed reads are
    /// skipped and counted in `read_errors_total`.
    pub fn poll(&mut self) -> RdmaSnapshot {
        self.poll_at(Instant::now())
    }

    /// [`poll`](Self::poll) with the reading time given (tests drive the clock).
    pub(crate) fn poll_at(&mut self, now: Instant) -> RdmaSnapshot {
        let elapsed_seconds = self
            .last_poll
            .map(|t| now.saturating_duration_since(t).as_secs_f64());
        self.last_poll = Some(now);
        let root = self.config.sysfs_root.clone();

        let names = match sysfs::list_devices(&root) {
            Ok(names) => names,
            Err(e) => {
                self.read_errors_total += 1;
                if self.logged.insert(format!("root:{}", root.display())) {
                    warn!(root = %root.display(), error = %e, "cannot list RDMA devices; skipping RDMA counters");
                }
                Vec::new()
            }
        };
        self.sync_devices(&root, &names);

        let mut ports = Vec::new();
        for name in &names {
            let device_dir = root.join(name);
            let numbers = match sysfs::list_ports(&device_dir) {
                Ok(numbers) => numbers,
                Err(_) if !device_dir.is_dir() => {
                    info!(device = %name, "RDMA device disappeared; dropping its series");
                    self.devices.remove(name);
                    continue;
                }
                Err(e) => {
                    self.read_errors_total += 1;
                    if self.logged.insert(format!("ports:{name}")) {
                        warn!(device = %name, error = %e, "cannot list the ports of an RDMA device");
                    }
                    Vec::new()
                }
            };
            let Some(device) = self.devices.get_mut(name) else {
                continue;
            };
            device.ports.retain(|p, _| numbers.contains(p));
            for number in numbers {
                let reading = sysfs::read_port(&sysfs::port_dir(&root, name, number));
                if reading.vanished {
                    debug!(device = %name, port = number, "RDMA port disappeared during the pass");
                    device.ports.remove(&number);
                    continue;
                }
                let state = device.ports.entry(number).or_default();
                self.read_errors_total += state.note_failures(name, number, &reading.failures);
                ports.push(state.update(name, number, reading, now));
            }
        }

        RdmaSnapshot {
            ports,
            read_errors_total: self.read_errors_total,
            devices_seen: self.devices_seen(),
            elapsed_seconds,
        }
    }

    /// Drops devices that left the tree, adds new ones, and asks libibverbs again whenever the
    /// set changes.
    fn sync_devices(&mut self, root: &Path, names: &[String]) {
        let removed: Vec<String> = self
            .devices
            .keys()
            .filter(|n| !names.contains(n))
            .cloned()
            .collect();
        for name in &removed {
            info!(device = %name, "RDMA device removed; dropping its series");
            self.devices.remove(name);
            self.logged.retain(|k| !k.ends_with(&format!(":{name}")));
        }
        let added: Vec<&String> = names
            .iter()
            .filter(|n| !self.devices.contains_key(*n))
            .collect();
        if self.verbs.is_none() || !removed.is_empty() || !added.is_empty() {
            self.refresh_verbs();
        }
        for name in added {
            let node_guid = match sysfs::read_node_guid(&root.join(name)) {
                Ok(guid) => Some(guid),
                Err(failure) => {
                    self.read_errors_total += 1;
                    debug!(device = %name, file = %failure.what, error = %failure.detail, "cannot read node_guid");
                    None
                }
            };
            let guid = self
                .verbs
                .as_ref()
                .and_then(|v| v.devices().iter().find(|d| &d.name == name))
                .and_then(|d| d.node_guid.clone())
                .or(node_guid);
            info!(device = %name, node_guid = guid.as_deref().unwrap_or("unknown"), "RDMA device found");
            self.devices.insert(
                name.clone(),
                DeviceState {
                    node_guid: guid,
                    ports: BTreeMap::new(),
                },
            );
        }
        if names.is_empty() {
            if !self.said_no_devices {
                let why = match &self.verbs {
                    Some(VerbsDiscovery::NoDevices { reason }) => format!("; ibverbs: {reason}"),
                    _ => String::new(),
                };
                info!(root = %root.display(), "no RDMA devices{why}");
                self.said_no_devices = true;
            }
        } else {
            self.said_no_devices = false;
        }
    }

    fn refresh_verbs(&mut self) {
        let discovery = (self.discover)();
        if self.verbs.as_ref() != Some(&discovery) {
            match &discovery {
                VerbsDiscovery::Disabled => {
                    debug!(
                        "built without the rdma-verbs feature: RDMA devices come from sysfs only"
                    )
                }
                VerbsDiscovery::NoDevices { reason } => debug!(%reason, "ibverbs: no RDMA devices"),
                VerbsDiscovery::Devices(devices) => {
                    for d in devices {
                        let sysfs_dir = self.config.sysfs_root.join(&d.name);
                        info!(
                            device = %d.name,
                            node_guid = d.node_guid.as_deref().unwrap_or("unknown"),
                            index = d.index.unwrap_or(-1),
                            in_sysfs = sysfs_dir.is_dir(),
                            "ibverbs device"
                        );
                    }
                }
                VerbsDiscovery::Failed { error } => {
                    warn!(%error, "ibverbs device discovery failed; reading RDMA counters from sysfs only")
                }
            }
        }
        self.verbs = Some(discovery);
    }

    fn devices_seen(&self) -> Vec<RdmaDevice> {
        let mut seen: BTreeMap<&str, RdmaDevice> = self
            .devices
            .iter()
            .map(|(name, d)| {
                let device = RdmaDevice {
                    name: name.clone(),
                    node_guid: d.node_guid.clone(),
                    in_sysfs: true,
                    in_verbs: false,
                };
                (name.as_str(), device)
            })
            .collect();
        let verbs_devices = self.verbs.as_ref().map(|v| v.devices()).unwrap_or(&[]);
        for d in verbs_devices {
            let entry = seen.entry(d.name.as_str()).or_insert_with(|| RdmaDevice {
                name: d.name.clone(),
                node_guid: None,
                in_sysfs: false,
                in_verbs: false,
            });
            entry.in_verbs = true;
            if d.node_guid.is_some() {
                entry.node_guid = d.node_guid.clone();
            }
        }
        seen.into_values().collect()
    }
}

impl PortState {
    /// Logs each failing file once (per port) and returns how many reads failed.
    fn note_failures(&mut self, device: &str, port: u32, failures: &[Failure]) -> u64 {
        for f in failures {
            if !self.logged.insert(f.what.clone()) {
                continue;
            }
            match f.kind {
                FailureKind::Unsupported => {
                    info!(device, port, file = %f.what, error = %f.detail, "RDMA counter not supported by the device; skipping it")
                }
                _ => {
                    warn!(device, port, file = %f.what, error = %f.detail, kind = ?f.kind, "cannot read RDMA counter; skipping it")
                }
            }
        }
        failures.len() as u64
    }

    /// Folds one reading into the accumulators and builds the port's snapshot entry.
    fn update(&mut self, device: &str, port: u32, reading: PortReading, now: Instant) -> RdmaPort {
        let listed: HashSet<(Group, &str)> = reading
            .counters
            .iter()
            .map(|c| (c.group, c.file.as_str()))
            .collect();
        // Counter files that are no longer listed lose their state.
        self.counters
            .retain(|(g, f), _| listed.contains(&(*g, f.as_str())));

        let mut observed = HashMap::new();
        for c in &reading.counters {
            let Some(raw) = c.value else { continue };
            let key = (c.group, c.file.clone());
            match self.counters.get_mut(&key) {
                Some(acc) => {
                    let obs = acc.observe(raw, now);
                    log_event(device, port, &c.file, obs.event, raw);
                    observed.insert(key, obs);
                }
                None => {
                    let acc = Accumulator::new(Semantics::of(c.group, &c.file), raw, now);
                    if acc.saturated() {
                        log_event(device, port, &c.file, Event::Saturated, raw);
                    }
                    self.counters.insert(key, acc);
                }
            }
        }

        let mut counters = BTreeMap::new();
        let mut rates = BTreeMap::new();
        let mut consumed: HashSet<(Group, &str)> = HashSet::new();
        for metric in PORT_METRICS {
            // The source is chosen by what is listed, so a failing read never switches it.
            let Some(src) = metric
                .sources
                .iter()
                .find(|s| listed.contains(&(s.group, s.file)))
            else {
                continue;
            };
            consumed.insert((src.group, src.file));
            let key = (src.group, src.file.to_owned());
            if let Some(acc) = self.counters.get(&key) {
                counters.insert(metric.key.to_owned(), acc.total().saturating_mul(src.scale));
                if let Some(rate) = observed.get(&key).and_then(|o| o.rate(src.scale)) {
                    rates.insert(metric.key.to_owned(), rate);
                }
            }
        }
        let mut saturated = Vec::new();
        for (key, acc) in &self.counters {
            let (group, file) = key;
            if acc.saturated() {
                saturated.push(file.clone());
            }
            if consumed.contains(&(*group, file.as_str())) {
                continue;
            }
            let name = group.key(file);
            counters.insert(name.clone(), acc.total());
            if let Some(rate) = observed.get(key).and_then(|o| o.rate(1)) {
                rates.insert(name, rate);
            }
        }
        saturated.sort();

        RdmaPort {
            device: device.to_owned(),
            port,
            link_layer: reading.attrs.link_layer,
            state: reading.attrs.state,
            phys_state: reading.attrs.phys_state,
            rate_bits_per_second: reading.attrs.rate_bits_per_second,
            counters,
            rates,
            saturated,
        }
    }
}

fn log_event(device: &str, port: u32, file: &str, event: Event, raw: u64) {
    match event {
        Event::Saturated => warn!(
            device,
            port,
            counter = file,
            value = raw,
            "RDMA counter saturated at its maximum; its total stops advancing until the port counters are reset"
        ),
        Event::Reset => info!(device, port, counter = file, value = raw, "RDMA counter reset"),
        Event::Wrapped => debug!(device, port, counter = file, "RDMA counter wrapped at 32 bits"),
        Event::Advanced | Event::StillSaturated => {}
    }
}

/// Starts the dedicated polling thread (named `probe-rdma`). It polls at once, then every
/// `config.interval`, publishing each snapshot on the returned channel (initially an empty
/// snapshot). It stops when every receiver has been dropped, noticed at the next tick.
pub fn spawn(config: RdmaConfig) -> io::Result<watch::Receiver<Arc<RdmaSnapshot>>> {
    spawn_poller(RdmaPoller::new(config)).map(|(rx, _)| rx)
}

/// [`spawn`] for a ready poller, also returning the thread handle.
pub(crate) fn spawn_poller(
    poller: RdmaPoller,
) -> io::Result<(watch::Receiver<Arc<RdmaSnapshot>>, JoinHandle<()>)> {
    let (tx, rx) = watch::channel(Arc::new(RdmaSnapshot::default()));
    let mut interval = poller.config.interval;
    if interval < MIN_INTERVAL {
        warn!(?interval, min = ?MIN_INTERVAL, "RDMA poll interval too short; using the minimum");
        interval = MIN_INTERVAL;
    }
    let handle = thread::Builder::new()
        .name(THREAD_NAME.into())
        .spawn(move || run(poller, tx, interval))?;
    Ok((rx, handle))
}

fn run(mut poller: RdmaPoller, tx: watch::Sender<Arc<RdmaSnapshot>>, interval: Duration) {
    info!(root = %poller.config.sysfs_root.display(), ?interval, "RDMA counter poller started");
    let mut next = Instant::now();
    loop {
        let snapshot = poller.poll();
        if tx.send(Arc::new(snapshot)).is_err() {
            break;
        }
        next += interval;
        let now = Instant::now();
        if next <= now {
            // A pass took longer than the interval (a slow driver): skip the missed ticks
            // rather than polling back to back.
            debug!(behind = ?(now - next), "RDMA poll overran its interval");
            next = now + interval;
        }
        thread::sleep(next - now);
        if tx.is_closed() {
            break;
        }
    }
    info!("RDMA counter poller stopped: no receivers left");
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::Fixture;
    use super::super::keys;
    use super::super::verbs::VerbsDevice;
    use super::*;

    fn poller(fx: &Fixture) -> RdmaPoller {
        let config = RdmaConfig {
            sysfs_root: fx.root(),
            interval: Duration::from_secs(1),
        };
        // Fixture trees are not the live system: keep the host's libibverbs out of the tests.
        RdmaPoller::with_discovery(config, || VerbsDiscovery::NoDevices {
            reason: "test".into(),
        })
    }

    fn secs(t0: Instant, s: u64) -> Instant {
        t0 + Duration::from_secs(s)
    }

    fn port<'a>(snap: &'a RdmaSnapshot, device: &str, port: u32) -> &'a RdmaPort {
        snap.ports
            .iter()
            .find(|p| p.device == device && p.port == port)
            .unwrap_or_else(|| panic!("no {device}/{port} in {:?}", snap.ports))
    }

    #[test]
    fn mlx5_infiniband_rates_in_base_units() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        let mut p = poller(&fx);
        let t0 = Instant::now();

        let s = p.poll_at(t0);
        assert_eq!(s.elapsed_seconds, None);
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.link_layer.as_deref(), Some("InfiniBand"));
        assert_eq!(port1.state.as_deref(), Some("ACTIVE"));
        assert_eq!(port1.phys_state.as_deref(), Some("LinkUp"));
        assert_eq!(port1.rate_bits_per_second, Some(100_000_000_000));
        // port_xmit_data counts 4-byte words.
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(4_000_000));
        assert_eq!(port1.counter(keys::RECEIVE_BYTES), Some(8_000_000));
        assert_eq!(port1.counter(keys::TRANSMIT_PACKETS), Some(30_000));
        assert!(port1.rates.is_empty(), "no rates on the first poll");

        fx.set("mlx5_0", 1, "counters/port_xmit_data", 1_000_000 + 250_000);
        fx.set("mlx5_0", 1, "counters/port_rcv_data", 2_000_000 + 500_000);
        fx.set("mlx5_0", 1, "counters/port_xmit_packets", 30_000 + 1_000);
        fx.set("mlx5_0", 1, "counters/port_rcv_packets", 40_000 + 2_000);
        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 500 + 300);
        fx.set("mlx5_0", 1, "hw_counters/rx_write_requests", 5_000 + 70);
        let s = p.poll_at(secs(t0, 1));
        assert_eq!(s.elapsed_seconds, Some(1.0));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.rate(keys::TRANSMIT_BYTES), Some(1_000_000.0));
        assert_eq!(port1.rate(keys::RECEIVE_BYTES), Some(2_000_000.0));
        assert_eq!(port1.rate(keys::TRANSMIT_PACKETS), Some(1_000.0));
        assert_eq!(port1.rate(keys::RECEIVE_PACKETS), Some(2_000.0));
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), Some(300.0));
        assert_eq!(port1.rate(keys::TRANSMIT_DISCARDS), Some(0.0));
        assert_eq!(port1.rate("hw_counters/rx_write_requests"), Some(70.0));
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(5_000_000));
        assert_eq!(port1.counter(keys::RECEIVE_BYTES), Some(10_000_000));

        // Rates divide by the real elapsed time.
        fx.set("mlx5_0", 1, "counters/port_xmit_data", 1_250_000 + 100_000);
        let s = p.poll_at(secs(t0, 3));
        assert_eq!(
            port(&s, "mlx5_0", 1).rate(keys::TRANSMIT_BYTES),
            Some(200_000.0)
        );
        assert_eq!(s.read_errors_total, 0);
    }

    #[test]
    fn explicit_and_generic_counters_do_not_overlap() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        let mut p = poller(&fx);
        let s = p.poll_at(Instant::now());
        let port1 = port(&s, "mlx5_0", 1);
        // Files behind a named metric are not repeated generically...
        assert!(port1.counter("counters/port_xmit_data").is_none());
        assert!(port1.counter("counters/link_downed").is_none());
        assert!(port1.counter("hw_counters/out_of_sequence").is_none());
        // ...every other file is, discovered by listing.
        assert_eq!(port1.counter("counters/symbol_error"), Some(0));
        assert_eq!(port1.counter("counters/unicast_xmit_packets"), Some(29_991));
        assert_eq!(port1.counter("hw_counters/rx_read_requests"), Some(100));
        assert!(port1.counter("hw_counters/lifespan").is_none());
        // An InfiniBand port has no RoCE congestion counters.
        assert!(port1.counter(keys::CNP_SENT).is_none());
        assert_eq!(port1.counter(keys::LINK_DOWNED), Some(1));
    }

    #[test]
    fn mlx5_roce_congestion_signals() {
        let fx = Fixture::new();
        fx.mlx5_roce("mlx5_1");
        let mut p = poller(&fx);
        let t0 = Instant::now();
        let s = p.poll_at(t0);
        let port1 = port(&s, "mlx5_1", 1);
        assert_eq!(port1.link_layer.as_deref(), Some("Ethernet"));
        assert_eq!(port1.counter(keys::CNP_SENT), Some(10));
        assert_eq!(port1.counter(keys::ECN_MARKED_PACKETS), Some(20));
        assert_eq!(port1.counter(keys::CNP_HANDLED), Some(30));

        let bumps: &[(&str, u64, &str, f64)] = &[
            ("hw_counters/np_cnp_sent", 10 + 100, keys::CNP_SENT, 50.0),
            (
                "hw_counters/rp_cnp_handled",
                30 + 60,
                keys::CNP_HANDLED,
                30.0,
            ),
            (
                "hw_counters/np_ecn_marked_roce_packets",
                20 + 400,
                keys::ECN_MARKED_PACKETS,
                200.0,
            ),
            (
                "hw_counters/out_of_sequence",
                6,
                keys::OUT_OF_SEQUENCE_PACKETS,
                3.0,
            ),
            (
                "hw_counters/packet_seq_err",
                2,
                keys::PACKET_SEQUENCE_ERRORS,
                1.0,
            ),
            (
                "hw_counters/local_ack_timeout_err",
                4,
                keys::LOCAL_ACK_TIMEOUT_ERRORS,
                2.0,
            ),
            (
                "hw_counters/rnr_nak_retry_err",
                8,
                keys::RNR_NAK_RETRY_ERRORS,
                4.0,
            ),
            (
                "counters/port_xmit_discards",
                10,
                keys::TRANSMIT_DISCARDS,
                5.0,
            ),
            ("counters/link_downed", 1 + 2, keys::LINK_DOWNED, 1.0),
            (
                "counters/port_xmit_wait",
                500 + 1000,
                keys::TRANSMIT_WAIT_TICKS,
                500.0,
            ),
        ];
        for (file, value, _, _) in bumps {
            fx.set("mlx5_1", 1, file, *value);
        }
        let s = p.poll_at(secs(t0, 2));
        let port1 = port(&s, "mlx5_1", 1);
        for (file, _, key, rate) in bumps {
            assert_eq!(port1.rate(key), Some(*rate), "{key} from {file}");
        }
        // Congestion counters not in the explicit list are still exported generically.
        assert_eq!(port1.counter("hw_counters/rp_cnp_ignored"), Some(0));
        assert!(port1.counter("hw_counters/np_cnp_sent").is_none());
    }

    #[test]
    fn rxe_port_with_only_hw_counters() {
        let fx = Fixture::new();
        fx.rxe("rxe0");
        let mut p = poller(&fx);
        let t0 = Instant::now();
        p.poll_at(t0);
        fx.set("rxe0", 1, "hw_counters/sent_pkts", 900 + 40);
        fx.set("rxe0", 1, "hw_counters/rcvd_pkts", 800 + 20);
        fx.set("rxe0", 1, "hw_counters/out_of_seq_request", 5);
        fx.set("rxe0", 1, "hw_counters/rdma_sends", 7);
        let s = p.poll_at(secs(t0, 1));
        assert_eq!(s.read_errors_total, 0);
        let port1 = port(&s, "rxe0", 1);
        assert_eq!(port1.link_layer.as_deref(), Some("Ethernet"));
        assert_eq!(port1.rate_bits_per_second, Some(10_000_000_000));
        // No PMA: no byte counters at all, packets come from the driver counters.
        assert!(port1.counter(keys::TRANSMIT_BYTES).is_none());
        assert!(port1.counter(keys::RECEIVE_BYTES).is_none());
        assert_eq!(port1.rate(keys::TRANSMIT_PACKETS), Some(40.0));
        assert_eq!(port1.rate(keys::RECEIVE_PACKETS), Some(20.0));
        assert_eq!(port1.rate(keys::OUT_OF_SEQUENCE_PACKETS), Some(5.0));
        assert_eq!(port1.counter(keys::LINK_DOWNED), Some(0));
        assert_eq!(port1.rate("hw_counters/rdma_sends"), Some(7.0));
        assert!(port1.counter("hw_counters/sent_pkts").is_none());
        assert!(port1.counters.keys().all(|k| !k.starts_with("counters/")));
    }

    #[test]
    fn hw_counter_wrapping_at_32_bits_stays_monotonic() {
        let fx = Fixture::new();
        fx.mlx5_roce("mlx5_1");
        fx.set("mlx5_1", 1, "hw_counters/out_of_sequence", 0xFFFF_FFF0);
        let mut p = poller(&fx);
        let t0 = Instant::now();
        p.poll_at(t0);
        fx.set("mlx5_1", 1, "hw_counters/out_of_sequence", 0x10);
        let s = p.poll_at(secs(t0, 1));
        let port1 = port(&s, "mlx5_1", 1);
        assert_eq!(
            port1.counter(keys::OUT_OF_SEQUENCE_PACKETS),
            Some(0xFFFF_FFF0 + 0x20)
        );
        assert_eq!(port1.rate(keys::OUT_OF_SEQUENCE_PACKETS), Some(32.0));
    }

    #[test]
    fn saturated_counter_is_marked_and_does_not_jump() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 0xFFFF_FF00);
        fx.set("mlx5_0", 1, "counters/port_xmit_data", 0xFFFF_FFFF);
        let mut p = poller(&fx);
        let t0 = Instant::now();
        let s = p.poll_at(t0);
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.saturated, vec!["port_xmit_data"]);
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(0xFFFF_FFFF * 4));

        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 0xFFFF_FFFF);
        let s = p.poll_at(secs(t0, 1));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.saturated, vec!["port_xmit_data", "port_xmit_wait"]);
        assert_eq!(port1.counter(keys::TRANSMIT_WAIT_TICKS), Some(0xFFFF_FFFF));
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), None);
        assert_eq!(port1.rate(keys::TRANSMIT_BYTES), None);
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(0xFFFF_FFFF * 4));

        let s = p.poll_at(secs(t0, 2));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.counter(keys::TRANSMIT_WAIT_TICKS), Some(0xFFFF_FFFF));
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), None);

        // Cleared (perfquery -R): counting resumes from the new value, without a jump.
        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 40);
        let s = p.poll_at(secs(t0, 3));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.saturated, vec!["port_xmit_data"]);
        assert_eq!(
            port1.counter(keys::TRANSMIT_WAIT_TICKS),
            Some(0xFFFF_FFFF + 40)
        );
        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 90);
        let s = p.poll_at(secs(t0, 4));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), Some(50.0));
        assert_eq!(s.read_errors_total, 0);
    }

    #[test]
    fn unreadable_file_is_skipped_and_counted() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        fx.replace_with_dir("mlx5_0", 1, "counters/symbol_error");
        let mut p = poller(&fx);
        let t0 = Instant::now();
        let s = p.poll_at(t0);
        assert_eq!(s.read_errors_total, 1);
        let port1 = port(&s, "mlx5_0", 1);
        assert!(port1.counter("counters/symbol_error").is_none());
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(4_000_000));

        // A counter that starts failing keeps its last total, without a rate.
        fx.write("mlx5_0", 1, "counters/port_xmit_wait", "N/A (no PMA)\n");
        fx.set("mlx5_0", 1, "counters/port_xmit_data", 1_000_010);
        let s = p.poll_at(secs(t0, 1));
        assert_eq!(
            s.read_errors_total, 3,
            "each failed read counts, every poll"
        );
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.counter(keys::TRANSMIT_WAIT_TICKS), Some(500));
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), None);
        assert_eq!(port1.rate(keys::TRANSMIT_BYTES), Some(40.0));

        // When it reads again, the rate covers the whole gap.
        fx.set("mlx5_0", 1, "counters/port_xmit_wait", 700);
        let s = p.poll_at(secs(t0, 2));
        let port1 = port(&s, "mlx5_0", 1);
        assert_eq!(port1.rate(keys::TRANSMIT_WAIT_TICKS), Some(100.0));
        assert_eq!(s.read_errors_total, 4);
    }

    #[test]
    fn device_removed_between_ticks_is_dropped_cleanly() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        fx.rxe("rxe0");
        let mut p = poller(&fx);
        let t0 = Instant::now();
        let s = p.poll_at(t0);
        assert_eq!(s.ports.len(), 2);
        assert_eq!(s.devices_seen.len(), 2);

        fx.remove_device("mlx5_0");
        let s = p.poll_at(secs(t0, 1));
        assert_eq!(s.ports.len(), 1);
        assert_eq!(s.ports[0].device, "rxe0");
        assert_eq!(
            s.devices_seen
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>(),
            vec!["rxe0"]
        );
        assert_eq!(s.read_errors_total, 0, "a removed device is not an error");

        // It comes back (driver reload): fresh state, no rate until the next poll.
        fx.mlx5_ib("mlx5_0");
        let s = p.poll_at(secs(t0, 2));
        let port1 = port(&s, "mlx5_0", 1);
        assert!(port1.rates.is_empty());
        assert_eq!(port1.counter(keys::TRANSMIT_BYTES), Some(4_000_000));
    }

    #[test]
    fn no_rdma_devices_is_not_an_error() {
        let fx = Fixture::new();
        let mut p = poller(&fx);
        let s = p.poll();
        assert!(s.ports.is_empty());
        assert!(s.devices_seen.is_empty());
        assert_eq!(s.read_errors_total, 0);

        let mut p = RdmaPoller::with_discovery(
            RdmaConfig {
                sysfs_root: fx.root().join("does/not/exist"),
                interval: Duration::from_secs(1),
            },
            || VerbsDiscovery::NoDevices {
                reason: "ENOSYS".into(),
            },
        );
        let s = p.poll();
        assert!(s.ports.is_empty());
        assert_eq!(s.read_errors_total, 0);
    }

    #[test]
    fn malformed_trees_never_panic() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        fx.rxe("rxe0");
        // Garbage of every kind.
        fx.write("mlx5_0", 1, "rate", "");
        fx.write("mlx5_0", 1, "state", "\0\0\0");
        fx.write(
            "mlx5_0",
            1,
            "counters/port_xmit_data",
            "99999999999999999999999\n",
        );
        fx.write("mlx5_0", 1, "hw_counters/out_of_sequence", "12 13\n");
        fx.write("mlx5_0", 2, "link_layer", "InfiniBand\n"); // a port with almost nothing
        std::fs::remove_dir_all(fx.root().join("rxe0/ports/1/hw_counters")).unwrap();
        std::fs::write(fx.root().join("rxe0/ports/1/hw_counters"), "not a dir").unwrap();
        std::fs::create_dir_all(fx.root().join("empty_device")).unwrap();
        std::fs::create_dir_all(fx.root().join("file_ports")).unwrap();
        std::fs::write(fx.root().join("file_ports/ports"), "").unwrap();
        let mut p = poller(&fx);
        let t0 = Instant::now();
        for i in 0..3 {
            let s = p.poll_at(secs(t0, i));
            assert!(s.read_errors_total > 0);
            let port1 = port(&s, "mlx5_0", 1);
            assert_eq!(port1.rate_bits_per_second, None);
            assert!(port1.counter(keys::TRANSMIT_BYTES).is_none());
            assert!(port1.counter(keys::RECEIVE_BYTES).is_some());
            let _ = port(&s, "mlx5_0", 2);
            let _ = port(&s, "rxe0", 1);
        }
        // The whole root replaced by a file.
        let file_root = fx.root().join("mlx5_0/node_guid");
        let mut p = RdmaPoller::with_discovery(
            RdmaConfig {
                sysfs_root: file_root,
                interval: Duration::from_secs(1),
            },
            || VerbsDiscovery::Disabled,
        );
        let s = p.poll();
        assert!(s.ports.is_empty());
        assert_eq!(s.read_errors_total, 1);
    }

    #[test]
    fn verbs_devices_are_merged_into_devices_seen() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        fx.rxe("rxe0");
        let config = RdmaConfig {
            sysfs_root: fx.root(),
            interval: Duration::from_secs(1),
        };
        let mut calls = 0;
        let mut p = RdmaPoller::with_discovery(config, move || {
            calls += 1;
            assert!(
                calls <= 2,
                "verbs is asked again only when the device set changes"
            );
            VerbsDiscovery::Devices(vec![
                VerbsDevice {
                    name: "mlx5_0".into(),
                    node_guid: Some("0c42:a103:0003:55e2".into()),
                    index: Some(0),
                },
                VerbsDevice {
                    name: "mlx5_9".into(),
                    node_guid: Some("0c42:a103:0003:0009".into()),
                    index: Some(9),
                },
            ])
        });
        let t0 = Instant::now();
        let s = p.poll_at(t0);
        p.poll_at(secs(t0, 1));
        assert_eq!(
            s.devices_seen,
            vec![
                RdmaDevice {
                    name: "mlx5_0".into(),
                    node_guid: Some("0c42:a103:0003:55e2".into()),
                    in_sysfs: true,
                    in_verbs: true,
                },
                RdmaDevice {
                    name: "mlx5_9".into(),
                    node_guid: Some("0c42:a103:0003:0009".into()),
                    in_sysfs: false,
                    in_verbs: true,
                },
                RdmaDevice {
                    name: "rxe0".into(),
                    node_guid: Some("5054:00ff:fe12:3456".into()),
                    in_sysfs: true,
                    in_verbs: false,
                },
            ]
        );
        // Only sysfs devices have ports (counters come from sysfs).
        assert_eq!(s.ports.len(), 2);
        fx.remove_device("rxe0");
        p.poll_at(secs(t0, 2));
    }

    #[test]
    fn snapshot_serializes_to_json() {
        let fx = Fixture::new();
        fx.mlx5_roce("mlx5_1");
        let mut p = poller(&fx);
        let s = p.poll();
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["ports"][0]["device"], "mlx5_1");
        assert_eq!(json["ports"][0]["link_layer"], "Ethernet");
        assert_eq!(json["ports"][0]["counters"]["cnp_sent"], 10);
        assert_eq!(json["read_errors_total"], 0);
        assert_eq!(json["devices_seen"][0]["node_guid"], "0c42:a103:0010:8a3c");
    }

    #[test]
    fn thread_publishes_snapshots_and_stops_without_receivers() {
        let fx = Fixture::new();
        fx.mlx5_ib("mlx5_0");
        let config = RdmaConfig {
            sysfs_root: fx.root(),
            interval: Duration::from_millis(20),
        };
        let poller = RdmaPoller::with_discovery(config, || VerbsDiscovery::Disabled);
        let (mut rx, handle) = spawn_poller(poller).unwrap();
        assert_eq!(handle.thread().name(), Some(THREAD_NAME));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            // The first poll, then at least one more tick with rates.
            for _ in 0..3 {
                tokio::time::timeout(Duration::from_secs(5), rx.changed())
                    .await
                    .expect("a snapshot within 5 s")
                    .expect("sender alive");
            }
        });
        let snap = rx.borrow_and_update().clone();
        let port1 = port(&snap, "mlx5_0", 1);
        assert_eq!(port1.rate(keys::TRANSMIT_BYTES), Some(0.0));
        assert!(snap.elapsed_seconds.unwrap() > 0.0);

        drop(rx);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !handle.is_finished() {
            assert!(Instant::now() < deadline, "poller thread did not stop");
            thread::sleep(Duration::from_millis(5));
        }
        handle.join().unwrap();
    }

    #[test]
    fn spawn_uses_the_public_entry_point() {
        let fx = Fixture::new();
        let rx = spawn(RdmaConfig {
            sysfs_root: fx.root(),
            interval: Duration::from_millis(10),
        })
        .unwrap();
        assert!(rx.borrow().ports.is_empty());
    }
}
