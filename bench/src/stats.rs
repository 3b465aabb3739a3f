//! Percentiles of a sample (nearest rank), in milliseconds.
use serde_json::{Value, json};

pub fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// n, p50, p99, max of a sample in ms (null when empty).
pub fn summary(sample: &[f64]) -> Value {
    let s = sorted(sample.to_vec());
    json!({
        "n": s.len(),
        "p50_ms": percentile(&s, 0.50),
        "p99_ms": percentile(&s, 0.99),
        "max_ms": s.last(),
    })
}

/// The fastest p99 a burst of `n` runs can have when each needs one request of a kind the API
/// server serves at `rate` per second: the time `0.99·n` of them take, in ms.
pub fn bound_ms(n: usize, rate: f64) -> Option<f64> {
    (rate > 0.0).then(|| 0.99 * n as f64 / rate * 1000.0)
}

/// Which of repeated runs stands for them: the one with the median of `key` (the lower one of an
/// even count, so that a figure shown is a figure measured). `None` for no runs.
pub fn median_index(key: &[f64]) -> Option<usize> {
    let mut order: Vec<usize> = (0..key.len()).collect();
    order.sort_by(|&a, &b| key[a].total_cmp(&key[b]));
    order.get(key.len().saturating_sub(1) / 2).copied()
}

/// The smallest and largest of a sample (the spread of repeated runs), `None` when empty.
pub fn spread(v: &[f64]) -> Option<(f64, f64)> {
    let s = sorted(v.to_vec());
    Some((*s.first()?, *s.last()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_of_a_burst() {
        // 1,000 runs at 842 patches/s: 1.18 s for 990 of them.
        let b = bound_ms(1_000, 842.0).unwrap();
        assert!((b - 1175.8).abs() < 0.1, "{b}");
        assert_eq!(bound_ms(100, 0.0), None);
    }

    #[test]
    fn the_median_run_and_the_spread() {
        assert_eq!(median_index(&[30.0, 10.0, 20.0]), Some(2));
        assert_eq!(median_index(&[30.0, 10.0]), Some(1));
        assert_eq!(median_index(&[5.0]), Some(0));
        assert_eq!(median_index(&[]), None);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), Some((1.0, 3.0)));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
