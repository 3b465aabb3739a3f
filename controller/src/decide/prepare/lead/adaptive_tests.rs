//! The adaptive lead (design §2.3): within `[base, max(base, max)]`, 0 when the base is 0,
//! longer with more runs due and shorter with a faster API server, and the design's examples.

use jiff::SignedDuration;
use proptest::prelude::*;

use super::*;

fn secs(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

const W: f64 = REQUESTS_PER_PREPARATION;

#[test]
fn ten_thousand_runs_at_800_per_second_get_57_s_and_unmeasured_450_s() {
    let (base, max) = (secs(30), secs(600));
    assert_eq!(adaptive_lead(base, max, 10_000, W, Some(800.0)), secs(57));
    assert_eq!(adaptive_lead(base, max, 10_000, W, None), secs(450));
    // With a backstop's re-read: 4 requests a run.
    let w = REQUESTS_PER_PREPARATION_WITH_BACKSTOP;
    assert_eq!(adaptive_lead(base, max, 10_000, w, Some(800.0)), secs(75));
}

#[test]
fn a_few_runs_keep_the_base_and_a_huge_burst_stops_at_the_cap() {
    let (base, max) = (secs(30), secs(600));
    assert_eq!(adaptive_lead(base, max, 1, W, None), base);
    assert_eq!(adaptive_lead(base, max, 0, W, None), base);
    assert_eq!(adaptive_lead(base, max, 1_000_000, W, Some(800.0)), max);
    // An API server that completed nothing while requests waited: the longest lead.
    assert_eq!(adaptive_lead(base, max, 10, W, Some(0.0)), max);
    assert_eq!(adaptive_lead(base, max, 10, W, Some(f64::NAN)), max);
}

#[test]
fn off_stays_off_and_a_spec_lead_above_the_cap_is_kept() {
    let max = secs(600);
    assert_eq!(
        adaptive_lead(SignedDuration::ZERO, max, 10_000, W, None),
        SignedDuration::ZERO
    );
    assert_eq!(adaptive_lead(secs(900), max, 10_000, W, None), secs(900));
    assert_eq!(burst_lead(max, 10_000, W, None), secs(450));
}

/// A rate: unmeasured, or measured between a trickle and a very fast API server.
fn rate_strategy() -> impl Strategy<Value = Option<f64>> {
    proptest::option::weighted(0.8, 0.0f64..5_000.0)
}

/// The rate [`adaptive_lead`] assumes for `rate`.
fn assumed(rate: Option<f64>) -> f64 {
    rate.unwrap_or(UNMEASURED_RATE)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn the_lead_is_within_the_base_and_the_cap(
        base in 0i64..=3600,
        max in 0i64..=3600,
        due in 0usize..200_000,
        w in prop_oneof![Just(3.0), Just(4.0)],
        rate in rate_strategy(),
    ) {
        let lead = adaptive_lead(secs(base), secs(max), due, w, rate);
        if base == 0 {
            prop_assert_eq!(lead, SignedDuration::ZERO, "the adaptive lead turned preparation on");
        } else {
            prop_assert!(lead >= secs(base), "{:?} below the base {}", lead, base);
            prop_assert!(lead <= secs(base.max(max)), "{:?} above the cap {} (base {})", lead, max, base);
        }
    }

    #[test]
    fn more_runs_due_never_shorten_the_lead(
        base in 1i64..=3600,
        max in 0i64..=3600,
        due in 0usize..200_000,
        more in 0usize..200_000,
        rate in rate_strategy(),
    ) {
        let fewer = adaptive_lead(secs(base), secs(max), due, W, rate);
        let more = adaptive_lead(secs(base), secs(max), due + more, W, rate);
        prop_assert!(fewer <= more, "{:?} for {} runs, {:?} for more", fewer, due, more);
    }

    #[test]
    fn a_faster_api_server_never_lengthens_the_lead(
        base in 1i64..=3600,
        max in 0i64..=3600,
        due in 0usize..200_000,
        rate in rate_strategy(),
        faster in 0.0f64..5_000.0,
    ) {
        let slow = adaptive_lead(secs(base), secs(max), due, W, rate);
        let fast = adaptive_lead(secs(base), secs(max), due, W, Some(assumed(rate) + faster));
        prop_assert!(fast <= slow, "{:?} at {:?}/s, {:?} faster", slow, rate, fast);
    }

    /// Below the cap, the lead covers the burst's work 1.5 times over, to the second above it.
    #[test]
    fn below_the_cap_the_lead_is_one_and_a_half_times_the_work(
        due in 1usize..200_000,
        rate in 1.0f64..5_000.0,
    ) {
        let lead = adaptive_lead(secs(1), secs(3600), due, W, Some(rate));
        let work = 1.5 * W * due as f64 / rate;
        if lead > secs(1) && lead < secs(3600) {
            prop_assert!(lead.as_secs_f64() >= work, "{:?} for {} s of work", lead, work);
            prop_assert!(lead.as_secs_f64() < work + 1.0, "{:?} for {} s of work", lead, work);
        }
    }
}
