//! `@every <interval> [+<offset>]`: a fixed interval anchored at the Unix epoch plus an offset, so
//! that every replica, every restart and `kubectl singleton schedule` compute the same instants.
//! (robfig/cron, which Kubernetes' CronJob does not expose but Go programs use, anchors `@every`
//! at the moment its process started: a restart moves every later run.)
//!
//! The instants are `epoch + offset + k × interval` for every whole k: absolute times, so a time
//! zone's daylight-saving changes do not move them (every 1h is every 3,600 s).

use jiff::{SignedDuration, Timestamp};

/// The longest interval: longer ones read better as cron schedules, and the bound keeps the
/// arithmetic well inside `Timestamp`'s range.
const MAX_INTERVAL: SignedDuration = SignedDuration::from_hours(366 * 24);

/// A parsed `@every`: interval and offset in whole seconds, `0 <= offset < interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Every {
    interval: i64,
    offset: i64,
}

impl Every {
    /// Parses what follows `@every`: `<interval>` or `<interval> +<offset>`, each a duration such
    /// as `90s`, `15m`, `1h30m` or `1.5h` (Go's and jiff's duration syntax).
    pub(super) fn parse(rest: &str) -> Result<Every, String> {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let (interval, offset) = match words.as_slice() {
            [interval] => (*interval, None),
            [interval, offset] => match offset.strip_prefix('+') {
                Some(offset) => (*interval, Some(offset)),
                None => return Err(usage(&format!("{offset:?} is not an offset"))),
            },
            _ => return Err(usage("expected an interval")),
        };
        let interval = whole_seconds(interval, "interval")?;
        if interval < 1 || interval > MAX_INTERVAL.as_secs() {
            return Err(format!(
                "the interval must be from 1s to {}h",
                MAX_INTERVAL.as_hours()
            ));
        }
        let offset = offset
            .map(|o| whole_seconds(o, "offset"))
            .transpose()?
            .unwrap_or(0);
        if offset < 0 || offset >= interval {
            return Err("the offset must be at least 0 and shorter than the interval".into());
        }
        Ok(Every { interval, offset })
    }

    /// The first instant strictly after `t`, if it is within `Timestamp`'s range.
    pub(super) fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let k = self.periods_to(t).checked_add(1)?;
        self.instant(k)
    }

    /// The latest instant at or before `t`.
    pub(super) fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        self.instant(self.periods_to(t))
    }

    /// The k of the latest instant at or before `t`.
    fn periods_to(&self, t: Timestamp) -> i64 {
        let since_anchor = t.as_nanosecond() - i128::from(self.offset) * 1_000_000_000;
        let step = i128::from(self.interval) * 1_000_000_000;
        // Timestamps span about 6e20 ns, so k fits an i64 for any interval of 1 s or more.
        since_anchor.div_euclid(step) as i64
    }

    fn instant(&self, k: i64) -> Option<Timestamp> {
        let seconds = k.checked_mul(self.interval)?.checked_add(self.offset)?;
        Timestamp::from_second(seconds).ok()
    }
}

fn whole_seconds(text: &str, what: &str) -> Result<i64, String> {
    let d: SignedDuration = text
        .parse()
        .map_err(|_| usage(&format!("{text:?} is not a duration")))?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "the {what} {text:?} must be a whole number of seconds"
        ));
    }
    Ok(d.as_secs())
}

fn usage(problem: &str) -> String {
    format!("{problem}: write @every <interval> [+<offset>], such as @every 15m or @every 6h +30m")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn intervals_and_offsets_parse() {
        assert_eq!(
            Every::parse("15m"),
            Ok(Every {
                interval: 900,
                offset: 0
            })
        );
        assert_eq!(
            Every::parse("1h30m"),
            Ok(Every {
                interval: 5400,
                offset: 0
            })
        );
        assert_eq!(
            Every::parse("1.5h +10m"),
            Ok(Every {
                interval: 5400,
                offset: 600
            })
        );
        assert_eq!(
            Every::parse(" 6h  +0s "),
            Ok(Every {
                interval: 21600,
                offset: 0
            })
        );
        assert_eq!(
            Every::parse("8784h"),
            Ok(Every {
                interval: 8784 * 3600,
                offset: 0
            })
        );
    }

    #[test]
    fn bad_intervals_say_why() {
        for (rest, says) in [
            ("", "expected an interval"),
            ("1h 2h 3h", "expected an interval"),
            ("soon", "\"soon\" is not a duration"),
            ("0s", "from 1s to 8784h"),
            ("-5m", "from 1s to 8784h"),
            ("8785h", "from 1s to 8784h"),
            ("1500ms", "whole number of seconds"),
            ("1h 30m", "\"30m\" is not an offset"),
            ("1h +1h", "shorter than the interval"),
            ("1h +-1m", "at least 0"),
            ("1h +0.5s", "whole number of seconds"),
            ("1d", "\"1d\" is not a duration"),
        ] {
            let e = Every::parse(rest).unwrap_err();
            assert!(e.contains(says), "{rest:?}: {e}");
        }
    }

    #[test]
    fn instants_are_anchored_at_the_epoch_plus_the_offset() {
        let every = Every::parse("6h +30m").unwrap();
        assert_eq!(
            every.next_after(ts("2027-03-28T00:00:00Z")),
            Some(ts("2027-03-28T00:30:00Z"))
        );
        assert_eq!(
            every.next_after(ts("2027-03-28T00:30:00Z")),
            Some(ts("2027-03-28T06:30:00Z"))
        );
        assert_eq!(
            every.next_after(ts("2027-03-28T00:29:59.999999999Z")),
            Some(ts("2027-03-28T00:30:00Z"))
        );
        assert_eq!(
            every.latest_at_or_before(ts("2027-03-28T00:30:00Z")),
            Some(ts("2027-03-28T00:30:00Z"))
        );
        assert_eq!(
            every.latest_at_or_before(ts("2027-03-28T00:29:59Z")),
            Some(ts("2027-03-27T18:30:00Z"))
        );
        // Before the epoch too.
        assert_eq!(
            every.latest_at_or_before(ts("1969-12-31T23:00:00Z")),
            Some(ts("1969-12-31T18:30:00Z"))
        );
        // 7 minutes do not divide an hour: the instants still come from the epoch, not from now.
        let seven = Every::parse("7m").unwrap();
        let at = seven.next_after(ts("2027-01-01T00:00:00Z")).unwrap();
        assert_eq!(at.as_second() % 420, 0);
        assert_eq!(at, ts("2027-01-01T00:02:00Z"));
    }

    #[test]
    fn the_ends_of_time_are_handled() {
        let every = Every::parse("1h").unwrap();
        assert_eq!(every.next_after(Timestamp::MAX), None);
        assert!(every.latest_at_or_before(Timestamp::MIN).is_none());
        assert!(every.next_after(Timestamp::MIN).is_some());
    }
}
