//! Where a period sits in its schedule, as its run's workload is told (issue 35, item 4): the
//! interval the run is responsible for and the period in the SingletonJob's time zone, so that a
//! workload does not re-derive them from our DST, calendar and bounds rules.

use jiff::Timestamp;

use super::Schedule;

/// What a run is told of its period besides the instant (`SINGLETON_PERIOD`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The schedule's period before this one that runs: the run is responsible for `[previous,
    /// period)`. Periods on excluded days do not run, so they fall in the next run's window.
    /// None for the first period (by `startAt`), or when the schedule cannot be read.
    pub previous: Option<Timestamp>,
    /// The schedule's period after this one that runs. None after the last (by `endAt`).
    pub next: Option<Timestamp>,
    /// The time zone's IANA name (`UTC` when the SingletonJob sets none).
    pub time_zone: String,
    /// The period's local date in that zone, `YYYY-MM-DD`.
    pub business_date: String,
    /// The period in that zone, RFC 9557: `2027-03-28T03:00:00+02:00[Europe/Berlin]` (the offset
    /// tells the two runs of a repeated hour apart).
    pub key: String,
}

impl Window {
    /// A window of `period` in UTC with neither neighbour known (the schedule could not be read).
    pub fn unknown(period: Timestamp) -> Window {
        let zoned = period.to_zoned(jiff::tz::TimeZone::UTC);
        Window {
            previous: None,
            next: None,
            time_zone: "UTC".into(),
            business_date: zoned.date().to_string(),
            key: zoned.to_string(),
        }
    }
}

impl Schedule {
    /// `period`'s window in this schedule: its neighbours are this schedule's periods that run
    /// (excluded days, shifts and bounds applied), so the windows of the runs tile time with
    /// neither gap nor overlap: a period skipped as excluded is covered by the next run. A manual
    /// period (a trigger, between two scheduled ones) gets the scheduled periods around it.
    pub fn window(&self, period: Timestamp) -> Window {
        let tz = self.time_zone();
        let zoned = period.to_zoned(tz.clone());
        Window {
            previous: self.running_before(period),
            next: self.running_after(period),
            time_zone: tz.iana_name().unwrap_or("UTC").to_string(),
            business_date: zoned.date().to_string(),
            key: zoned.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{Bounds, DayRules, ExcludedAction, Exclusions};

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn schedule(expr: &str, tz: Option<&str>) -> Schedule {
        Schedule::parse(expr, tz, Default::default()).unwrap()
    }

    #[test]
    fn a_daily_period_is_responsible_for_the_day_before_it_in_its_zone() {
        let s = schedule("0 0 * * *", Some("Europe/Berlin"));
        let w = s.window(ts("2026-12-05T23:00:00Z"));
        assert_eq!(w.previous, Some(ts("2026-12-04T23:00:00Z")));
        assert_eq!(w.next, Some(ts("2026-12-06T23:00:00Z")));
        assert_eq!(w.time_zone, "Europe/Berlin");
        assert_eq!(w.business_date, "2026-12-06", "the local date, not UTC's");
        assert_eq!(w.key, "2026-12-06T00:00:00+01:00[Europe/Berlin]");
    }

    #[test]
    fn across_a_dst_change_the_interval_is_the_local_day_with_its_real_length() {
        // 2027-03-28 has 23 hours in Berlin: the run at the 29th's midnight covers them.
        let s = schedule("0 0 * * *", Some("Europe/Berlin"));
        let w = s.window(ts("2027-03-28T22:00:00Z"));
        assert_eq!(w.previous, Some(ts("2027-03-27T23:00:00Z")));
        assert_eq!(w.key, "2027-03-29T00:00:00+02:00[Europe/Berlin]");
        // The repeated hour of the autumn change: two periods, told apart by their offsets.
        let s = schedule("30 2 * * *", Some("Europe/Berlin"));
        let first = s.window(ts("2027-10-31T00:30:00Z"));
        assert_eq!(first.key, "2027-10-31T02:30:00+02:00[Europe/Berlin]");
        assert_eq!(first.business_date, "2027-10-31");
    }

    #[test]
    fn excluded_days_belong_to_the_next_run_and_bounds_end_the_chain() {
        let weekends = DayRules {
            days: vec!["* * SAT,SUN".into()],
            ..Default::default()
        };
        let x = Exclusions::compile([("exclusions", &weekends)], ExcludedAction::Skip).unwrap();
        let s = schedule("0 6 * * *", None).with_exclusions(x);
        // Monday 2026-12-07: the previous run was Friday's, so Monday's covers the weekend.
        let w = s.window(ts("2026-12-07T06:00:00Z"));
        assert_eq!(w.previous, Some(ts("2026-12-04T06:00:00Z")));
        assert_eq!(w.next, Some(ts("2026-12-08T06:00:00Z")));
        assert_eq!(w.time_zone, "UTC");
        // Friday's run is followed by Monday's.
        let w = s.window(ts("2026-12-04T06:00:00Z"));
        assert_eq!(w.next, Some(ts("2026-12-07T06:00:00Z")));

        let bounded = schedule("0 6 * * *", None).with_bounds(Bounds {
            start: Some(ts("2026-12-01T06:00:00Z")),
            end: Some(ts("2026-12-03T06:00:00Z")),
        });
        assert_eq!(bounded.window(ts("2026-12-01T06:00:00Z")).previous, None);
        assert_eq!(bounded.window(ts("2026-12-03T06:00:00Z")).next, None);
        assert_eq!(
            bounded.window(ts("2026-12-02T06:00:00Z")).previous,
            Some(ts("2026-12-01T06:00:00Z"))
        );
    }

    #[test]
    fn a_manual_period_gets_the_scheduled_periods_around_it() {
        let s = schedule("0 * * * *", None);
        let trigger = ts("2026-12-06T10:17:03.123456Z");
        let w = s.window(trigger);
        assert_eq!(w.previous, Some(ts("2026-12-06T10:00:00Z")));
        assert_eq!(w.next, Some(ts("2026-12-06T11:00:00Z")));
        assert_eq!(w.key, "2026-12-06T10:17:03.123456+00:00[UTC]");
    }

    #[test]
    fn without_a_schedule_only_the_period_itself_is_known() {
        let w = Window::unknown(ts("2026-12-06T10:00:00Z"));
        assert_eq!((w.previous, w.next), (None, None));
        assert_eq!(w.business_date, "2026-12-06");
        assert_eq!(w.key, "2026-12-06T10:00:00+00:00[UTC]");
    }
}
