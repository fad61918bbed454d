//! A small seeded generator (xorshift64*): the soak's choices replay from `--seed`, and
//! xtask needs no rand crate for it.

#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` and `stream` (each thread draws from its own stream).
    pub fn new(seed: u64, stream: u64) -> Self {
        // splitmix64 of the pair: distinct, never-zero states even for seeds 0 and 1.
        let mut z = seed
            .wrapping_add(stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in [lo, hi).
    pub fn range_f(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_and_spread() {
        let (mut a, mut b) = (Rng::new(7, 0), Rng::new(7, 0));
        assert_eq!(a.next_u64(), b.next_u64());
        assert_ne!(Rng::new(7, 1).next_u64(), Rng::new(7, 2).next_u64());
        let mut r = Rng::new(0, 0);
        let mut hits = [0u32; 4];
        for _ in 0..4000 {
            hits[r.below(4) as usize] += 1;
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
        assert!(hits.iter().all(|&h| h > 800), "{hits:?}");
    }
}
