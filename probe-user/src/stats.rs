//! Small statistics every stage uses (features, labels, eval, analyze): a module at the
//! bottom that imports nothing of probe's.

/// Median of `v` (sorted in place); None when empty.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The `q` quantile (nearest rank, 0 <= q <= 1) of `v` (reordered in place); None if
/// empty. A selection, not a sort: the labels take one per tick over a window of values.
pub fn quantile(v: &mut [f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let i = (((v.len() - 1) as f64 * q).round() as usize).min(v.len() - 1);
    // Under total_cmp, equal means the same bits: the value a sort would put at i.
    let (_, at, _) = v.select_nth_unstable_by(i, f64::total_cmp);
    Some(*at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn quantile_is_nearest_rank() {
        assert_eq!(quantile(&mut [], 0.5), None);
        assert_eq!(quantile(&mut [3.0, 1.0, 2.0, 4.0, 5.0], 0.25), Some(2.0));
        assert_eq!(quantile(&mut [3.0, 1.0], 0.0), Some(1.0));
        assert_eq!(quantile(&mut [3.0, 1.0], 1.0), Some(3.0));
    }
}
