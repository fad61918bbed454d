//! Time-stamped readings of a kernel gauge, taken in the background, so that a value probe
//! read at a known instant (its snapshot's `time_unix`) can be compared with what the kernel
//! showed at that instant rather than whenever the test happened to look.
use anyhow::Result;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock now, seconds since the Unix epoch (the clock of probe's `time_unix`).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// One reading: the value was taken somewhere in `[start, end]` (Unix seconds).
#[derive(Debug, Clone, PartialEq)]
pub struct Reading<T> {
    pub start: f64,
    pub end: f64,
    pub value: T,
}

impl<T> Reading<T> {
    pub fn mid(&self) -> f64 {
        (self.start + self.end) / 2.0
    }
}

/// Readings in time order.
#[derive(Debug, Clone)]
pub struct Timeline<T> {
    pub readings: Vec<Reading<T>>,
}

impl<T> Timeline<T> {
    /// The reading whose midpoint is nearest to `t`, with its distance in seconds.
    pub fn nearest(&self, t: f64) -> Option<(&Reading<T>, f64)> {
        self.readings
            .iter()
            .map(|r| (r, (r.mid() - t).abs()))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The readings that overlap `[t0, t1]`.
    pub fn overlapping(&self, t0: f64, t1: f64) -> impl Iterator<Item = &Reading<T>> {
        self.readings
            .iter()
            .filter(move |r| r.end >= t0 && r.start <= t1)
    }

    /// Median spacing of consecutive readings, seconds.
    pub fn median_interval(&self) -> Option<f64> {
        let d: Vec<f64> = self
            .readings
            .windows(2)
            .map(|w| w[1].mid() - w[0].mid())
            .collect();
        crate::median(&d)
    }
}

/// Calls `read` back to back (at most every `every`) until `stop` is set, `limit` passes or
/// `max` readings are taken, stamping each with the wall-clock interval it ran in. Failed
/// reads are skipped.
pub fn sample<T>(
    mut read: impl FnMut() -> Result<T>,
    stop: &AtomicBool,
    every: Duration,
    limit: Duration,
    max: usize,
) -> Timeline<T> {
    let deadline = Instant::now() + limit;
    let mut readings = Vec::new();
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline && readings.len() < max {
        let t = Instant::now();
        let start = unix_now();
        if let Ok(value) = read() {
            readings.push(Reading {
                start,
                end: unix_now(),
                value,
            });
        }
        if let Some(rest) = every.checked_sub(t.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    Timeline { readings }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_and_overlap() {
        let r = |s: f64, v: u32| Reading {
            start: s,
            end: s + 0.004,
            value: v,
        };
        let t = Timeline {
            readings: vec![r(10.0, 1), r(10.01, 2), r(10.02, 3)],
        };
        let (n, d) = t.nearest(10.013).unwrap();
        assert_eq!(n.value, 2);
        assert!((d - 0.001).abs() < 1e-9);
        let v: Vec<u32> = t.overlapping(10.003, 10.012).map(|r| r.value).collect();
        assert_eq!(v, vec![1, 2]);
        assert!((t.median_interval().unwrap() - 0.01).abs() < 1e-9);
        let empty: Timeline<u32> = Timeline { readings: vec![] };
        assert!(empty.nearest(1.0).is_none());
    }

    #[test]
    fn sampling_is_bounded() {
        let stop = AtomicBool::new(false);
        let mut n = 0;
        let t0 = Instant::now();
        let tl = sample(
            || {
                n += 1;
                Ok(n)
            },
            &stop,
            Duration::from_millis(1),
            Duration::from_secs(5),
            20,
        );
        assert_eq!(tl.readings.len(), 20);
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(tl.readings.windows(2).all(|w| w[0].start <= w[1].start));
    }
}
