//! Ring all-reduce arithmetic: who sends which chunk to whom at each step.
//!
//! The buffer of `size` bytes is cut into `world` chunks. A ring all-reduce takes
//! `2 * (world - 1)` steps: `world - 1` reduce-scatter steps, after which rank `r` holds the
//! fully reduced chunk `(r + 1) % world`, then `world - 1` all-gather steps that pass the
//! reduced chunks around. At every step each rank sends one chunk to `next(r)` and receives
//! one chunk from `prev(r)`, at the same time.

/// Which half of the all-reduce a step belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The received chunk is added to the local one.
    ReduceScatter,
    /// The received chunk replaces the local one.
    AllGather,
}

/// What one rank does at one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub phase: Phase,
    /// Chunk index sent to `next(rank)`.
    pub send_chunk: usize,
    /// Chunk index received from `prev(rank)`.
    pub recv_chunk: usize,
}

pub fn next(rank: usize, world: usize) -> usize {
    (rank + 1) % world
}

pub fn prev(rank: usize, world: usize) -> usize {
    (rank + world - 1) % world
}

/// Number of steps of one all-reduce.
pub fn steps(world: usize) -> usize {
    2 * world.saturating_sub(1)
}

/// The chunks rank `rank` sends and receives at step `step` (0-based, `< steps(world)`).
pub fn step(rank: usize, world: usize, step: usize) -> Step {
    assert!(world >= 2 && rank < world && step < steps(world));
    let n = world;
    if step < n - 1 {
        // Reduce-scatter: send the chunk reduced at the previous step.
        Step {
            phase: Phase::ReduceScatter,
            send_chunk: (rank + n - step) % n,
            recv_chunk: (rank + 2 * n - step - 1) % n,
        }
    } else {
        // All-gather: start with the chunk this rank owns fully reduced, (rank + 1) % n.
        let s = step - (n - 1);
        Step {
            phase: Phase::AllGather,
            send_chunk: (rank + 1 + n - s) % n,
            recv_chunk: (rank + n - s) % n,
        }
    }
}

/// Length in bytes of chunk `chunk` when `size` bytes are split into `world` chunks
/// (the first `size % world` chunks carry one extra byte).
pub fn chunk_len(size: u64, world: usize, chunk: usize) -> u64 {
    let w = world as u64;
    size / w + u64::from((chunk as u64) < size % w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn neighbours() {
        assert_eq!(next(3, 4), 0);
        assert_eq!(prev(0, 4), 3);
        assert_eq!(next(0, 2), 1);
        assert_eq!(prev(0, 2), 1);
        assert_eq!(steps(4), 6);
        assert_eq!(steps(1), 0);
    }

    #[test]
    fn four_ranks_by_hand() {
        // Rank 0 of 4: reduce-scatter sends chunks 0, 3, 2 and receives 3, 2, 1;
        // it then owns chunk 1 and all-gather sends 1, 0, 3 and receives 0, 3, 2.
        let sends: Vec<_> = (0..6).map(|s| step(0, 4, s).send_chunk).collect();
        let recvs: Vec<_> = (0..6).map(|s| step(0, 4, s).recv_chunk).collect();
        assert_eq!(sends, [0, 3, 2, 1, 0, 3]);
        assert_eq!(recvs, [3, 2, 1, 0, 3, 2]);
        assert_eq!(step(0, 4, 2).phase, Phase::ReduceScatter);
        assert_eq!(step(0, 4, 3).phase, Phase::AllGather);
    }

    #[test]
    fn sender_and_receiver_agree() {
        for n in 2..=9 {
            for s in 0..steps(n) {
                for r in 0..n {
                    let mine = step(r, n, s);
                    let theirs = step(next(r, n), n, s);
                    assert_eq!(mine.send_chunk, theirs.recv_chunk, "n={n} s={s} r={r}");
                    assert_eq!(mine.phase, theirs.phase);
                }
            }
        }
    }

    #[test]
    fn every_rank_ends_with_every_contribution() {
        for n in 2..=9 {
            // held[r][c] = set of ranks whose contribution rank r holds for chunk c.
            let mut held: Vec<Vec<BTreeSet<usize>>> = (0..n)
                .map(|r| (0..n).map(|_| BTreeSet::from([r])).collect())
                .collect();
            for s in 0..steps(n) {
                let sent: Vec<_> = (0..n)
                    .map(|r| {
                        let st = step(r, n, s);
                        (next(r, n), st, held[r][st.send_chunk].clone())
                    })
                    .collect();
                for (to, st, data) in sent {
                    let slot = &mut held[to][st.send_chunk];
                    match st.phase {
                        Phase::ReduceScatter => {
                            assert!(slot.is_disjoint(&data), "double-counted contribution");
                            slot.extend(data);
                        }
                        Phase::AllGather => *slot = data,
                    }
                }
                if s == n - 2 {
                    for (r, chunks) in held.iter().enumerate() {
                        assert_eq!(chunks[(r + 1) % n].len(), n, "rank {r} owns its chunk");
                    }
                }
            }
            for chunks in &held {
                for c in chunks {
                    assert_eq!(c.len(), n, "n={n}");
                }
            }
        }
    }

    #[test]
    fn chunk_lengths_cover_the_buffer() {
        for (size, n) in [(4 << 20, 4), (10, 3), (2, 4), (0, 2), (1_000_003, 7)] {
            let total: u64 = (0..n).map(|c| chunk_len(size, n, c)).sum();
            assert_eq!(total, size);
            let max = (0..n).map(|c| chunk_len(size, n, c)).max().unwrap();
            let min = (0..n).map(|c| chunk_len(size, n, c)).min().unwrap();
            assert!(max - min <= 1);
        }
        // Each rank sends 2(N-1)/N of the buffer per all-reduce.
        let sent: u64 = (0..steps(4))
            .map(|s| chunk_len(4 << 20, 4, step(1, 4, s).send_chunk))
            .sum();
        assert_eq!(sent, 6 << 20);
    }
}
