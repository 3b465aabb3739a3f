//! Days on which a schedule does not run: listed dates, date ranges, and cron day rules
//! (`day-of-month month day-of-week`, such as `* * SAT,SUN`), from the SingletonJob itself and from
//! the SingletonCalendars it names. A day is judged in the schedule's time zone.

use std::collections::BTreeSet;

use croner::Cron;
use jiff::civil::Date;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ScheduleError, parse_cron};

/// Excluded days: dates, ranges of dates and day rules. A day matching any of them is excluded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DayRules {
    /// Single days, `YYYY-MM-DD`, such as `2027-12-24`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000), inner(length(min = 10, max = 10)))]
    pub dates: Vec<String>,

    /// Ranges of days, both ends included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 200))]
    pub ranges: Vec<DateRange>,

    /// Days matched by the three day fields of a cron expression, `day-of-month month
    /// day-of-week`, read as in `schedule`: `* * SAT,SUN` (weekends), `25 DEC *` (every 25
    /// December), `L * *` (the last day of each month), `* * 1#1` (the first Monday of a month).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50), inner(length(min = 5, max = 128)))]
    pub days: Vec<String>,
}

/// A range of days, both ends included.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DateRange {
    /// The first excluded day, `YYYY-MM-DD`.
    #[schemars(length(min = 10, max = 10))]
    pub from: String,
    /// The last excluded day, `YYYY-MM-DD`.
    #[schemars(length(min = 10, max = 10))]
    pub to: String,
}

/// What happens to a period whose instant falls on an excluded day.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ExcludedAction {
    /// The period does not run: it is recorded as Skipped, reason Excluded.
    #[default]
    Skip,
    /// The period runs at the same wall time on the next day that is not excluded ("the 1st, or
    /// the next business day"). Its instant is that shifted instant; several scheduled instants
    /// shifted onto one instant are one period. A period with no allowed day within 366 days is
    /// Skipped.
    NextAllowedDay,
}

/// How far [`ExcludedAction::NextAllowedDay`] looks for an allowed day.
pub(super) const MAX_SHIFT_DAYS: i32 = 366;

/// Compiled [`DayRules`] (several sets, joined) and the action.
#[derive(Clone, Debug)]
pub struct Exclusions {
    /// Identifies the rules and the action (see [`Exclusions::digest`]).
    digest: String,
    dates: BTreeSet<Date>,
    ranges: Vec<(Date, Date)>,
    days: Vec<Cron>,
    action: ExcludedAction,
}

impl Exclusions {
    /// Compiles the rules of each set; `source` names a set in error messages.
    pub fn compile<'a>(
        sets: impl IntoIterator<Item = (&'a str, &'a DayRules)>,
        action: ExcludedAction,
    ) -> Result<Exclusions, ScheduleError> {
        let mut hash = Sha256::new();
        hash.update(format!("{action:?}"));
        let mut out = Exclusions {
            digest: String::new(),
            dates: BTreeSet::new(),
            ranges: Vec::new(),
            days: Vec::new(),
            action,
        };
        for (source, rules) in sets {
            let bad = |what: &str, value: &str, why: String| ScheduleError::InvalidExclusion {
                origin: source.to_string(),
                what: what.to_string(),
                value: value.to_string(),
                message: why,
            };
            // Serializing plain strings and vectors cannot fail.
            hash.update(serde_json::to_vec(&(source, rules)).unwrap_or_default());
            for d in &rules.dates {
                out.dates.insert(date(d).map_err(|e| bad("date", d, e))?);
            }
            for r in &rules.ranges {
                let text = format!("{}..{}", r.from, r.to);
                let from = date(&r.from).map_err(|e| bad("range", &text, e))?;
                let to = date(&r.to).map_err(|e| bad("range", &text, e))?;
                if to < from {
                    return Err(bad("range", &text, "it ends before it starts".into()));
                }
                out.ranges.push((from, to));
            }
            for rule in &rules.days {
                out.days
                    .push(day_rule(rule).map_err(|e| bad("day rule", rule, e))?);
            }
        }
        out.digest = hash
            .finalize()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(out)
    }

    /// A short hash of the rules and the action: equal rules, equal digest. The cursor's
    /// fingerprint includes it, so that an edit of the rules (or of a calendar) applies from the
    /// moment it is seen and never makes a past period run.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn action(&self) -> ExcludedAction {
        self.action
    }

    /// Whether nothing is excluded.
    pub fn is_empty(&self) -> bool {
        self.dates.is_empty() && self.ranges.is_empty() && self.days.is_empty()
    }

    /// Whether the day is excluded.
    pub fn excludes(&self, day: Date) -> bool {
        self.dates.contains(&day)
            || self
                .ranges
                .iter()
                .any(|(from, to)| *from <= day && day <= *to)
            || self.days.iter().any(|cron| matches_day(cron, day))
    }

    /// The first day after `day` that is not excluded, within [`MAX_SHIFT_DAYS`].
    pub(super) fn next_allowed(&self, day: Date) -> Option<Date> {
        let mut d = day;
        for _ in 0..MAX_SHIFT_DAYS {
            d = d.tomorrow().ok()?;
            if !self.excludes(d) {
                return Some(d);
            }
        }
        None
    }

    /// The first day of the run of excluded days that ends on the day before `day` (`day` itself
    /// if the day before is allowed), at most [`MAX_SHIFT_DAYS`] back.
    pub(super) fn excluded_run_before(&self, day: Date) -> Date {
        let mut first = day;
        for _ in 0..MAX_SHIFT_DAYS {
            match first.yesterday() {
                Ok(before) if self.excludes(before) => first = before,
                _ => break,
            }
        }
        first
    }
}

fn date(text: &str) -> Result<Date, String> {
    text.trim()
        .parse::<Date>()
        .map_err(|_| "expected a date such as 2027-12-24".to_string())
}

/// A day rule is the day fields of a cron expression at midnight, parsed as `schedule` is.
fn day_rule(rule: &str) -> Result<Cron, String> {
    let fields = rule.split_whitespace().count();
    if fields != 3 {
        return Err(format!(
            "expected 3 fields (day-of-month month day-of-week), found {fields}"
        ));
    }
    parse_cron(&format!("0 0 {rule}"))
}

fn matches_day(cron: &Cron, day: Date) -> bool {
    let weekday =
        croner::Weekday::from_days_from_sunday(day.weekday().to_sunday_zero_offset() as u32);
    cron.pattern
        .month_match(day.month() as u32)
        .unwrap_or(false)
        && cron
            .pattern
            .day_match(
                i32::from(day.year()),
                day.month() as u32,
                day.day() as u32,
                weekday,
            )
            .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(dates: &[&str], ranges: &[(&str, &str)], days: &[&str]) -> DayRules {
        DayRules {
            dates: dates.iter().map(|s| s.to_string()).collect(),
            ranges: ranges
                .iter()
                .map(|(f, t)| DateRange {
                    from: f.to_string(),
                    to: t.to_string(),
                })
                .collect(),
            days: days.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn compile(r: &DayRules) -> Result<Exclusions, ScheduleError> {
        Exclusions::compile([("spec", r)], ExcludedAction::Skip)
    }

    fn d(s: &str) -> Date {
        s.parse().unwrap()
    }

    #[test]
    fn dates_ranges_and_day_rules_exclude_their_days() {
        let r = rules(
            &["2027-12-24"],
            &[("2027-12-27", "2027-12-31")],
            &["* * SAT,SUN", "1 JAN *", "L 2 *"],
        );
        let x = compile(&r).unwrap();
        for day in [
            "2027-12-24",
            "2027-12-27",
            "2027-12-31",
            "2027-12-25",
            "2028-01-01",
            "2028-02-29",
            "2027-02-28",
        ] {
            assert!(x.excludes(d(day)), "{day} should be excluded");
        }
        for day in ["2027-12-23", "2028-01-03", "2028-02-28", "2027-12-20"] {
            assert!(!x.excludes(d(day)), "{day} should not be excluded");
        }
    }

    #[test]
    fn next_allowed_and_the_run_before() {
        let x = compile(&rules(&["2027-12-24"], &[], &["* * SAT,SUN"])).unwrap();
        // Friday 24th excluded, then the weekend: Monday 27th.
        assert_eq!(x.next_allowed(d("2027-12-23")), Some(d("2027-12-27")));
        assert_eq!(x.next_allowed(d("2027-12-24")), Some(d("2027-12-27")));
        assert_eq!(x.excluded_run_before(d("2027-12-27")), d("2027-12-24"));
        assert_eq!(x.excluded_run_before(d("2027-12-23")), d("2027-12-23"));
        let all = compile(&rules(&[], &[], &["* * *"])).unwrap();
        assert_eq!(all.next_allowed(d("2027-01-01")), None);
    }

    #[test]
    fn bad_rules_say_which_and_why() {
        for (r, want) in [
            (rules(&["2027-13-01"], &[], &[]), "date \"2027-13-01\""),
            (
                rules(&[], &[("2027-05-02", "2027-05-01")], &[]),
                "ends before it starts",
            ),
            (rules(&[], &[], &["* *"]), "expected 3 fields"),
            (rules(&[], &[], &["* * FUNDAY"]), "day rule \"* * FUNDAY\""),
        ] {
            let err = compile(&r).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert!(err.contains("spec"), "{err:?} should name the source");
        }
    }
}
