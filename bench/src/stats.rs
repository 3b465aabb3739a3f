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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let s: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }
}
