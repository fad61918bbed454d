//! The N highest-scoring items of a stream, kept in a bounded buffer: the per-tick walks see
//! tens of thousands of entries and only a few are reported.
pub struct TopN<T> {
    n: usize,
    items: Vec<(u64, T)>,
}

impl<T> TopN<T> {
    pub fn new(n: usize) -> Self {
        Self {
            n,
            items: Vec::with_capacity(n),
        }
    }

    pub fn push(&mut self, score: u64, item: T) {
        if self.items.len() < self.n {
            self.items.push((score, item));
            return;
        }
        // Replace the lowest score if this one beats it (n is small: a linear scan).
        if let Some((i, _)) = self
            .items
            .iter()
            .enumerate()
            .min_by_key(|(_, (s, _))| *s)
            .filter(|(_, (s, _))| score > *s)
        {
            self.items[i] = (score, item);
        }
    }

    /// Highest score first.
    pub fn into_sorted(mut self) -> Vec<(u64, T)> {
        self.items.sort_by_key(|a| std::cmp::Reverse(a.0));
        self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The items TopN(n) keeps of `items`, highest first.
    fn top(n: usize, items: &[(u64, char)]) -> Vec<char> {
        let mut t = TopN::new(n);
        for &(s, x) in items {
            t.push(s, x);
        }
        t.into_sorted().into_iter().map(|(_, x)| x).collect()
    }

    #[test]
    fn keeps_the_highest() {
        let got = top(3, &[(5, 'a'), (1, 'b'), (9, 'c'), (7, 'd'), (2, 'e')]);
        assert_eq!(got, ['c', 'd', 'a']);
    }

    #[test]
    fn ties_with_the_lowest_kept_stay_out_and_zero_n_keeps_nothing() {
        let got = top(2, &[(4, 'a'), (4, 'b'), (4, 'c'), (5, 'd'), (4, 'e')]);
        assert_eq!(got, ['d', 'b'], "the first of equal lowest goes");
        assert!(top(0, &[(9, 'x')]).is_empty());
    }
}
