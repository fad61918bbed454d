//! Cumulative counters: what one gained between two readings, with restarts handled in one
//! place. A kernel counter restarts when an LRU map recreates its entry; one of probe's own
//! series restarts when it comes back after idling. Every counter delta of the daemon
//! (collect, observe, fold) goes through here; histograms have theirs in
//! `Histogram::increase`, which reads a restart the way [`Change::gain`] does.

/// How a counter moved from one reading to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// No earlier reading to compare with; the counter holds this much.
    First(u64),
    /// A continuation: the counter gained this much.
    Grew(u64),
    /// The counter went down: it restarted, and holds this much since.
    Restarted(u64),
}

impl Change {
    pub fn of(now: u64, before: Option<u64>) -> Self {
        match before {
            None => Self::First(now),
            Some(b) if now >= b => Self::Grew(now - b),
            Some(_) => Self::Restarted(now),
        }
    }

    /// What is new since the earlier reading, counting a first or restarted counter from
    /// zero (as Prometheus's `increase()` reads a reset): for totals that must never lose
    /// what a recreated entry counted.
    pub fn increase(self) -> u64 {
        match self {
            Self::First(n) | Self::Grew(n) | Self::Restarted(n) => n,
        }
    }

    /// The gain of a continuation only; None at a first reading or across a restart: a rate
    /// over an interval must not count what came before the interval.
    pub fn gain(self) -> Option<u64> {
        match self {
            Self::Grew(n) => Some(n),
            Self::First(_) | Self::Restarted(_) => None,
        }
    }
}

/// The increases of counters read together from one entry (a kernel map value): if any of
/// them went down, or the shape changed, the entry was recreated and all count from zero.
pub fn increases<'a>(now: &'a [u64], before: Option<&'a [u64]>) -> impl Iterator<Item = u64> + 'a {
    let before = before.filter(|b| b.len() == now.len() && now.iter().zip(*b).all(|(n, b)| n >= b));
    now.iter()
        .enumerate()
        .map(move |(i, &n)| before.map_or(n, |b| n - b[i]))
}

/// [`increases`] of a fixed set of counters, without allocating.
pub fn increases_of<const N: usize>(now: [u64; N], before: Option<[u64; N]>) -> [u64; N] {
    let mut out = now;
    for (o, d) in out
        .iter_mut()
        .zip(increases(&now, before.as_ref().map(|b| &b[..])))
    {
        *o = d;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_counter() {
        assert_eq!(Change::of(5, None), Change::First(5));
        assert_eq!(Change::of(7, Some(5)).gain(), Some(2));
        assert_eq!(Change::of(7, Some(5)).increase(), 2);
        let restarted = Change::of(3, Some(5));
        assert_eq!(restarted, Change::Restarted(3));
        assert_eq!((restarted.increase(), restarted.gain()), (3, None));
        assert_eq!(Change::of(5, None).gain(), None);
    }

    #[test]
    fn counters_of_one_entry_restart_together() {
        let all = |now: &[u64], before: Option<&[u64]>| increases(now, before).collect::<Vec<_>>();
        assert_eq!(all(&[10, 4], Some(&[7, 4])), [3, 0]);
        // One went down: the entry is new, both count from zero.
        assert_eq!(all(&[10, 1], Some(&[7, 4])), [10, 1]);
        assert_eq!(all(&[10, 1], None), [10, 1]);
        assert_eq!(all(&[10, 1, 2], Some(&[7, 1])), [10, 1, 2]);
        assert_eq!(increases_of([10, 4], Some([7, 4])), [3, 0]);
        assert_eq!(increases_of([10, 1], Some([7, 4])), [10, 1]);
    }
}
