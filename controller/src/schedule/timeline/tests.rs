use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::schedule::{DateRange, DayRules};

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn strings(instants: impl IntoIterator<Item = Timestamp>) -> Vec<String> {
    instants.into_iter().map(|t| t.to_string()).collect()
}

fn union<S: AsRef<str>>(exprs: &[S], tz: &str) -> Schedule {
    Schedule::parse_all(exprs, Some(tz), DstPolicy::default()).unwrap()
}

fn excluding(s: Schedule, rules: &DayRules, action: ExcludedAction) -> Schedule {
    s.with_exclusions(Exclusions::compile([("spec", rules)], action).unwrap())
}

fn weekends_and(dates: &[&str]) -> DayRules {
    DayRules {
        dates: dates.iter().map(|d| d.to_string()).collect(),
        ranges: vec![],
        days: vec!["* * SAT,SUN".into()],
    }
}

fn between(s: &Schedule, after: &str, until: &str) -> Vec<String> {
    let until = ts(until);
    strings(s.iter_after(ts(after)).take_while(|t| *t <= until))
}

#[test]
fn an_instant_two_schedules_produce_is_one_period() {
    let s = union(&["0 9 * * *", "0 */3 * * *", "0 9 * * *"], "UTC");
    assert_eq!(
        between(&s, "2027-01-01T05:00:00Z", "2027-01-01T13:00:00Z"),
        [
            "2027-01-01T06:00:00Z",
            "2027-01-01T09:00:00Z",
            "2027-01-01T12:00:00Z"
        ]
    );
    assert_eq!(s.expr(), "0 9 * * *; 0 */3 * * *; 0 9 * * *");
    assert_eq!(
        s.latest_at_or_before(ts("2027-01-01T10:00:00Z")),
        Some(ts("2027-01-01T09:00:00Z"))
    );
}

#[test]
fn the_number_of_schedules_is_bounded_and_each_must_parse() {
    let none: [&str; 0] = [];
    assert!(Schedule::parse_all(&none, None, DstPolicy::default()).is_err());
    let many = vec!["* * * * *"; MAX_SCHEDULES + 1];
    assert!(Schedule::parse_all(&many, None, DstPolicy::default()).is_err());
    let err = Schedule::parse_all(&["0 9 * * *", "61 * * * *"], None, DstPolicy::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("61 * * * *"), "{err}");
}

#[test]
fn skip_keeps_excluded_periods_and_marks_them() {
    let s = excluding(
        union(&["0 6 * * *"], "Europe/Berlin"),
        &weekends_and(&[]),
        ExcludedAction::Skip,
    );
    // Friday 2027-01-01 to Monday 2027-01-04.
    let got = between(&s, "2027-01-01T00:00:00Z", "2027-01-04T23:00:00Z");
    assert_eq!(got.len(), 4);
    let marked: Vec<bool> = s
        .iter_after(ts("2027-01-01T00:00:00Z"))
        .take(4)
        .map(|t| s.excluded(t))
        .collect();
    assert_eq!(marked, [false, true, true, false]);
}

/// The worked example of docs/scheduling.md: "the 1st at 06:00, or the next business day".
#[test]
fn the_first_or_the_next_business_day() {
    let s = excluding(
        union(&["0 6 1 * *"], "Europe/Berlin"),
        &weekends_and(&["2028-01-03"]),
        ExcludedAction::NextAllowedDay,
    );
    assert_eq!(
        between(&s, "2027-04-15T00:00:00Z", "2028-02-15T00:00:00Z"),
        [
            "2027-05-03T04:00:00Z", // Sat 1 May -> Mon 3 May, 06:00 CEST
            "2027-06-01T04:00:00Z",
            "2027-07-01T04:00:00Z",
            "2027-08-02T04:00:00Z", // Sun 1 Aug -> Mon 2 Aug
            "2027-09-01T04:00:00Z",
            "2027-10-01T04:00:00Z",
            "2027-11-01T05:00:00Z", // 06:00 CET
            "2027-12-01T05:00:00Z",
            "2028-01-04T05:00:00Z", // Sat 1 Jan, Sun 2, Mon 3 excluded -> Tue 4 Jan
            "2028-02-01T05:00:00Z",
        ]
    );
    for t in s.iter_after(ts("2027-04-15T00:00:00Z")).take(10) {
        assert!(!s.excluded(t));
    }
    // The shifted period is found from inside the excluded run and just after it.
    assert_eq!(
        s.latest_at_or_before(ts("2028-01-04T04:59:59Z")),
        Some(ts("2027-12-01T05:00:00Z"))
    );
    assert_eq!(
        s.latest_at_or_before(ts("2028-01-04T05:00:00Z")),
        Some(ts("2028-01-04T05:00:00Z"))
    );
    assert_eq!(
        s.next_after(ts("2028-01-02T12:00:00Z")),
        Some(ts("2028-01-04T05:00:00Z"))
    );
}

#[test]
fn shifted_onto_an_existing_period_is_one_period() {
    // Daily at 06:00, weekends shifted: Saturday's and Sunday's land on Monday's.
    let s = excluding(
        union(&["0 6 * * *"], "UTC"),
        &weekends_and(&[]),
        ExcludedAction::NextAllowedDay,
    );
    assert_eq!(
        between(&s, "2027-01-01T00:00:00Z", "2027-01-05T00:00:00Z"),
        ["2027-01-01T06:00:00Z", "2027-01-04T06:00:00Z"]
    );
}

#[test]
fn nowhere_to_shift_to_keeps_the_instant_as_excluded() {
    let all = DayRules {
        days: vec!["* * *".into()],
        ..DayRules::default()
    };
    let s = excluding(
        union(&["0 6 * * *"], "UTC"),
        &all,
        ExcludedAction::NextAllowedDay,
    );
    let first = s.next_after(ts("2027-01-01T00:00:00Z")).unwrap();
    assert_eq!(first, ts("2027-01-01T06:00:00Z"));
    assert!(s.excluded(first));
}

#[test]
fn jitter_is_inside_its_window_and_the_same_for_the_same_period() {
    let p = ts("2027-01-01T06:00:00Z");
    assert_eq!(jitter("ns/a", p, 0), SignedDuration::ZERO);
    let a = jitter("ns/a", p, 300);
    assert_eq!(a, jitter("ns/a", p, 300));
    assert_ne!(a, jitter("ns/b", p, 300), "another job gets another offset");
    let offsets: BTreeSet<i64> = (0..200)
        .map(|h| jitter("ns/a", p + SignedDuration::from_hours(h), 300).as_millis() as i64)
        .collect();
    assert!(offsets.len() > 150, "offsets spread: {}", offsets.len());
    assert!(offsets.iter().all(|ms| (0..300_000).contains(ms)));
}

/// Reference: the schedules' instants one by one, shifted by the rules' definition, sorted and
/// deduplicated.
fn reference(s: &Schedule, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
    let lookback = SignedDuration::from_hours(24 * 40);
    let mut out = BTreeSet::new();
    for part in &s.parts {
        for t in part.iter_after(after - lookback) {
            if t > until {
                break;
            }
            let at = match s.shifting() {
                Some(x) => s.shift(x, t),
                None => t,
            };
            if at > after && at <= until {
                out.insert(at);
            }
        }
    }
    out.into_iter().collect()
}

fn exprs() -> impl Strategy<Value = Vec<String>> {
    let one = prop_oneof![
        (0u8..60, 0u8..24).prop_map(|(m, h)| format!("{m} {h} * * *")),
        (0u8..60, 1u8..8).prop_map(|(m, s)| format!("{m} */{s} * * *")),
        (0u8..24, 1u8..29).prop_map(|(h, d)| format!("0 {h} {d} * *")),
        (0u8..24, 0u8..7).prop_map(|(h, w)| format!("30 {h} * * {w}")),
        (1u32..48).prop_map(|h| format!("@every {h}h")),
    ];
    prop::collection::vec(one, 1..4)
}

fn rules() -> impl Strategy<Value = DayRules> {
    let date = (1u8..13, 1u8..29).prop_map(|(m, d)| format!("2027-{m:02}-{d:02}"));
    (
        prop::collection::vec(date.clone(), 0..6),
        prop::collection::vec((date, 0u8..6), 0..2),
        prop::collection::vec(
            prop::sample::select(vec!["* * SAT,SUN", "1 * *", "* * 3", "L * *"]),
            0..2,
        ),
    )
        .prop_map(|(dates, ranges, days)| DayRules {
            dates,
            ranges: ranges
                .into_iter()
                .map(|(from, len)| {
                    let start: Date = from.parse().unwrap();
                    let end = start + jiff::Span::new().days(i64::from(len));
                    DateRange {
                        from,
                        to: end.to_string(),
                    }
                })
                .collect(),
            days: days.into_iter().map(String::from).collect(),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The union has no duplicates; a shift never doubles or drops a period: the periods are
    /// exactly the scheduled instants, each moved to its allowed day, counted once.
    #[test]
    fn periods_are_the_shifted_union_without_duplicates(
        exprs in exprs(),
        rules in rules(),
        shift in any::<bool>(),
        zone in prop::sample::select(vec!["UTC", "Europe/Berlin", "America/New_York"]),
        start_day in 0i64..330,
    ) {
        let action = if shift { ExcludedAction::NextAllowedDay } else { ExcludedAction::Skip };
        let s = excluding(union(&exprs, zone), &rules, action);
        let after = ts("2027-01-01T00:00:00Z") + SignedDuration::from_hours(24 * start_day);
        let until = after + SignedDuration::from_hours(24 * 21);
        let got: Vec<Timestamp> = s.iter_after(after).take_while(|t| *t <= until).collect();
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "strictly increasing");
        prop_assert_eq!(&got, &reference(&s, after, until));
        if shift {
            for t in &got {
                // Excluded only when no allowed day was within reach (not in these rules).
                prop_assert!(!s.excluded(*t));
            }
        }
        // latest_at_or_before agrees with the forward order.
        for probe in [after + SignedDuration::from_hours(100), until] {
            let want = reference(&s, after - SignedDuration::from_hours(24 * 60), probe).last().copied();
            prop_assert_eq!(s.latest_at_or_before(probe), want);
        }
        prop_assert_eq!(s.count_between(after, until, u64::MAX), got.len() as u64);
    }
}

fn range(from: &str, to: &str) -> DayRules {
    DayRules {
        ranges: vec![DateRange {
            from: from.into(),
            to: to.into(),
        }],
        ..DayRules::default()
    }
}

#[test]
fn days_with_an_offset_change_move_in_order() {
    // In Berlin 2027-03-28 has no 02:00 to 03:00 and 2027-10-31 has it twice. Every 20 minutes:
    // 03-27 moves onto the spring-forward day, 10-30 and 10-31 onto November 1st. Then instants
    // of the excluded day only: 02:40 moves into the gap (to 03:40), after 03:10's place.
    let every = ["0 */20 * * * *"];
    let only_that_day = ["0 40 2 27 3 *", "0 10 3 27 3 *"];
    for (exprs, from, to, after, days) in [
        (
            &every[..],
            "2027-03-27",
            "2027-03-27",
            "2027-03-26T12:00:00Z",
            3,
        ),
        (
            &every,
            "2027-10-30",
            "2027-10-31",
            "2027-10-29T12:00:00Z",
            4,
        ),
        // Starting on the day the instants move to, part-way through it.
        (
            &every,
            "2027-03-27",
            "2027-03-27",
            "2027-03-28T01:10:00Z",
            2,
        ),
        (
            &every,
            "2027-10-30",
            "2027-10-31",
            "2027-11-01T09:50:00Z",
            2,
        ),
        (
            &only_that_day[..],
            "2027-03-27",
            "2027-03-27",
            "2027-03-26T12:00:00Z",
            3,
        ),
    ] {
        let s = excluding(
            union(exprs, "Europe/Berlin"),
            &range(from, to),
            ExcludedAction::NextAllowedDay,
        );
        let after = ts(after);
        let until = after + SignedDuration::from_hours(24 * days);
        let got: Vec<Timestamp> = s.iter_after(after).take_while(|t| *t <= until).collect();
        assert_eq!(
            got,
            reference(&s, after, until),
            "{from}..{to} after {after}"
        );
    }
}

/// With instants shifted one by one, the next periods of an every-second schedule after a year
/// of excluded days took minutes (every instant of the year was moved and held); now they take
/// a few steps per excluded day.
#[test]
fn a_long_run_of_excluded_days_is_moved_a_day_at_a_time() {
    let s = excluding(
        union(&["* * * * * *"], "UTC"),
        &range("2027-01-01", "2027-12-30"),
        ExcludedAction::NextAllowedDay,
    );
    let now = ts("2027-06-15T12:00:00Z");
    assert_eq!(
        strings(s.iter_after(now).take(3)),
        [
            "2027-12-31T00:00:00Z",
            "2027-12-31T00:00:01Z",
            "2027-12-31T00:00:02Z"
        ]
    );
    assert_eq!(s.latest_at_or_before(now), Some(ts("2026-12-31T23:59:59Z")));
    assert_eq!(s.count_between(now, ts("2027-12-31T00:00:09Z"), 100), 10);
}
