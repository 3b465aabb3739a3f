//! The schedule engine: cron expression + IANA time zone + DST policy -> the
//! ordered list of instants at which a job is due.
//!
//! Pure: no I/O and no system clock. Time zone rules come from the tz database
//! compiled into the binary, so the controller and `kubectl singleton schedule`
//! agree on every instant regardless of the host's `/usr/share/zoneinfo`.
//!
//! # How instants are found
//!
//! croner enumerates matching *wall-clock* (civil) times on
//! [`jiff::civil::DateTime`], which has no time zone, so none of croner's own
//! DST handling is involved. Each wall time is then placed on the time line by
//! `Single::place` according to the declared [`DstPolicy`]. Wall times
//! that land on the same instant are one run, so the output is strictly
//! increasing: no period is skipped and none runs twice because of DST.
//!
//! Ordering relies on a monotone lower bound, the *floor* of a wall time: its
//! placement with [`GapPolicy::AfterGap`] and the declared fold policy.
//! * The floor is monotone non-decreasing in wall time for both fold policies.
//!   Before a transition a wall time `c` is placed at `c - old offset`, after
//!   it at `c - new offset`; a skipped wall time goes to the transition instant
//!   itself, and a repeated one consistently to one of its two occurrences,
//!   which lies between the placements of its neighbours on either side.
//! * With [`GapPolicy::AfterGap`] the placement *is* the floor, so placing
//!   matches in wall-clock order and dropping equal neighbours suffices.
//! * With [`GapPolicy::Shift`] the placement is not monotone: in Berlin 02:59
//!   on a spring-forward day is moved to 03:59 CEST, after 03:00 CEST. It is
//!   never below the floor, so `Upcoming` holds placed instants back until
//!   the floor of the next match shows that nothing earlier can still come.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone, TimeZoneDatabase};
use jiff::{SignedDuration, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod every;
mod exclusions;
mod syntax;
mod timeline;
mod window;
use every::Every;
pub use exclusions::{DateRange, DayRules, ExcludedAction, Exclusions};
use syntax::normalize;
pub use timeline::{Bounds, Schedule, jitter, preview};
pub use window::Window;

/// How a run whose wall-clock time does not exist is placed. Such times are
/// skipped when clocks spring forward for daylight saving time (for example
/// 02:00-02:59 in Europe/Berlin on the last Sunday of March). AfterGap (the
/// default) runs at the moment the clocks jump; Shift moves the wall time
/// forward by the length of the jump. Either way the run happens once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GapPolicy {
    /// Run at the moment the clocks jump, the first instant after the skipped
    /// interval: a 02:30 run on a day when clocks go from 02:00 to 03:00 runs
    /// at 03:00. Several skipped wall times collapse into that single run.
    #[default]
    AfterGap,
    /// Run as if the clocks had not jumped: the wall time is moved forward by
    /// the length of the skipped interval, so 02:30 runs at 03:30 (as in
    /// RFC 5545 calendars). A moved run that coincides with another scheduled
    /// time is the same run.
    Shift,
}

/// How a run whose wall-clock time occurs twice is placed. Such times repeat
/// when clocks fall back at the end of daylight saving time (for example
/// 02:00-02:59 in Europe/Berlin on the last Sunday of October). First (the
/// default) runs at the first occurrence, Last at the second. Either way the
/// run happens once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FoldPolicy {
    /// Run at the first occurrence, before the clocks go back.
    #[default]
    First,
    /// Run at the second occurrence, after the clocks go back.
    Last,
}

impl GapPolicy {
    /// The variant's name, as in the API.
    pub fn name(self) -> &'static str {
        match self {
            GapPolicy::AfterGap => "AfterGap",
            GapPolicy::Shift => "Shift",
        }
    }

    /// The variant named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [GapPolicy::AfterGap, GapPolicy::Shift]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

impl FoldPolicy {
    /// The variant's name, as in the API.
    pub fn name(self) -> &'static str {
        match self {
            FoldPolicy::First => "First",
            FoldPolicy::Last => "Last",
        }
    }

    /// The variant named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        [FoldPolicy::First, FoldPolicy::Last]
            .into_iter()
            .find(|p| p.name() == name)
    }
}

/// How scheduled wall-clock times are placed around daylight saving time
/// changes (and other offset changes) of the schedule's time zone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DstPolicy {
    /// Placement of a run whose wall time is skipped when clocks spring
    /// forward. AfterGap (default): at the moment the clocks jump, so 02:30
    /// runs at 03:00 when clocks go from 02:00 to 03:00. Shift: moved forward
    /// by the length of the jump, so 02:30 runs at 03:30. Either way it runs
    /// once.
    #[serde(default)]
    pub gap: GapPolicy,
    /// Placement of a run whose wall time occurs twice when clocks fall
    /// back. First (default): at the first occurrence. Last: at the second.
    /// Either way it runs once.
    #[serde(default)]
    pub fold: FoldPolicy,
}

/// Why a schedule was rejected; the messages are meant for users.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("invalid cron expression {expr:?}: {message}")]
    InvalidCron { expr: String, message: String },
    #[error("unknown time zone {0:?} (expected an IANA name such as Europe/Berlin)")]
    UnknownTimeZone(String),
    #[error("cron expression {0:?} never fires")]
    NeverFires(String),
    #[error("{origin}: invalid {what} {value:?}: {message}")]
    InvalidExclusion {
        origin: String,
        what: String,
        value: String,
        message: String,
    },
    #[error("schedules: {0}")]
    Schedules(String),
    #[error(
        "SingletonCalendar {0:?} named in exclusions.calendars does not exist in this namespace"
    )]
    MissingCalendar(String),
}

/// A parsed schedule: which wall-clock times match, in which time zone, and
/// how they are placed around DST changes. Cron runs end with the year 5000,
/// the limit of croner's search.
#[derive(Clone, Debug)]
pub struct Single {
    expr: String,
    rule: Rule,
    tz: TimeZone,
    dst: DstPolicy,
}

/// What produces the instants.
// Cron is the common case and was held inline before `@every` existed; boxing it would add an
// allocation per parse to save nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
enum Rule {
    /// Cron fields matched against wall-clock time, placed by the DST policy.
    Cron(Cron),
    /// `@every`: a fixed interval from the epoch, independent of wall time.
    Every(Every),
}

/// How far around an instant's own wall time to look for the wall times
/// placed near it. jiff keeps offsets under 26 hours either way, so two
/// offsets differ by less than three days.
const WALL_SLACK: SignedDuration = SignedDuration::from_hours(3 * 24);

/// Longer than any spring-forward gap (the longest on record is a whole day,
/// Pacific/Apia skipping 2011-12-30).
const MAX_GAP: SignedDuration = SignedDuration::from_hours(2 * 24);

const ONE_SECOND: SignedDuration = SignedDuration::from_secs(1);
const ONE_NANO: SignedDuration = SignedDuration::from_nanos(1);

impl Single {
    /// Parses a schedule. `time_zone` None or "" means UTC.
    ///
    /// Accepted syntax: every expression Kubernetes CronJob accepts (robfig/cron
    /// v3's `ParseStandard`), with the same meaning, and a few more:
    /// * 5 fields (`minute hour day-of-month month day-of-week`), or 6 with a
    ///   leading seconds field; values, `*`, `?`, `a-b`, lists, and `*/n`,
    ///   `a-b/n`, `N/n` (from N to the field's maximum: `5/15` is `5-59/15`).
    /// * Month names `JAN`-`DEC` and day names `SUN`-`SAT`, case-insensitive,
    ///   only in their own field; 0 and 7 are both Sunday, and `SUN` ending a
    ///   range that starts on a later day is 7 (`FRI-SUN`).
    /// * Macros `@yearly` `@annually` `@monthly` `@weekly` `@daily`
    ///   `@midnight` `@hourly`.
    /// * `@every <interval> [+<offset>]` (`@every 15m`, `@every 6h +30m`):
    ///   instants at the Unix epoch plus the offset plus whole intervals, the
    ///   same on every replica and after every restart; whole seconds, from
    ///   1s to 8784h; time zone and DST policy do not move them.
    /// * As in Kubernetes CronJob: when both day fields are restricted, a day
    ///   matching either runs; a field whose list holds `*`, `?` or `*/1` is
    ///   unrestricted (`*,15` is `*`).
    /// * Quartz extensions, which do not change the meaning of standard
    ///   expressions: `L` (last day of month), `LW`, `15W` (nearest weekday) in
    ///   day-of-month; `5L` (last Friday) and `1#2` (second Monday) in
    ///   day-of-week.
    ///
    /// Rejected, with a message that says why: a 7th (year) field,
    /// `@reboot`, croner's `+` day-of-week prefix (which would
    /// silently switch the day fields to AND), names in the wrong field, empty
    /// lists of nothing (`,`), reversed ranges (`11-2`), values out of a field's bounds, a
    /// bare `L` in day-of-week, and expressions that can never fire
    /// (`0 0 30 2 *`).
    pub fn parse(
        expr: &str,
        time_zone: Option<&str>,
        dst: DstPolicy,
    ) -> Result<Single, ScheduleError> {
        let invalid = |message: String| ScheduleError::InvalidCron {
            expr: expr.to_string(),
            message,
        };
        let rule = match every_rest(expr) {
            Some(rest) => Rule::Every(Every::parse(rest).map_err(invalid)?),
            None => Rule::Cron(parse_cron(expr).map_err(invalid)?),
        };
        if let Rule::Cron(cron) = &rule
            && !ever_fires(cron)
        {
            return Err(ScheduleError::NeverFires(expr.to_string()));
        }
        let tz = match time_zone {
            None | Some("") => TimeZone::UTC,
            Some(name) => tz_database()
                .get(name)
                .map_err(|_| ScheduleError::UnknownTimeZone(name.to_string()))?,
        };
        Ok(Single {
            expr: expr.to_string(),
            rule,
            tz,
            dst,
        })
    }

    /// The expression exactly as given to [`Single::parse`].
    pub fn expr(&self) -> &str {
        &self.expr
    }

    /// The time zone wall times are read in (UTC if none was given).
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }

    /// The first scheduled instant strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.iter_after(t).next()
    }

    /// Scheduled instants strictly after `t`, strictly increasing, lazily.
    pub fn iter_after(&self, t: Timestamp) -> impl Iterator<Item = Timestamp> + '_ {
        match self.rule {
            Rule::Every(every) => Instants::Every { every, after: t },
            Rule::Cron(_) => {
                let next_match = self
                    .search_start(t)
                    .and_then(|start| self.next_match(start, true));
                Instants::Cron(Upcoming {
                    schedule: self,
                    emitted_up_to: t,
                    next_match,
                    pending: BTreeSet::new(),
                })
            }
        }
    }

    /// The latest scheduled instant at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        if let Rule::Every(every) = self.rule {
            return every.latest_at_or_before(t);
        }
        let mut bound = t;
        loop {
            // The latest match whose floor is at or before `bound`; croner
            // searches backwards by calendar fields, so this is cheap even if
            // that match is years back.
            let edge = self.first_wall_after(bound)?.checked_sub(ONE_SECOND).ok()?;
            let candidate = self.prev_match(edge)?;
            let from = self.floor(candidate)?.checked_sub(ONE_NANO).ok()?;
            // A forward scan from `from` finds the latest run in (from, t].
            // With AfterGap the candidate itself is one. Shift may have moved
            // it beyond `t`; if (from, t] then holds no run, the answer lies
            // at or before `from`.
            let latest = self.iter_after(from).take_while(|&at| at <= t).last();
            if latest.is_some() {
                return latest;
            }
            bound = from;
        }
    }

    /// Number of scheduled instants in (after, until], counting at most `cap`.
    pub fn count_between(&self, after: Timestamp, until: Timestamp, cap: u64) -> u64 {
        count_until(self.iter_after(after), until, cap)
    }

    /// Local wall time of an instant with its offset, e.g.
    /// "2027-03-28T03:00:00+02:00[Europe/Berlin]".
    pub fn local(&self, t: Timestamp) -> String {
        t.to_zoned(self.tz.clone()).to_string()
    }

    /// The instant a matching wall time runs at, under the declared policy.
    fn place(&self, wall: DateTime) -> Option<Timestamp> {
        self.place_with(wall, self.dst.gap)
    }

    /// The placement with [`GapPolicy::AfterGap`]: monotone in `wall` and
    /// never later than `Single::place` (see the module docs).
    fn floor(&self, wall: DateTime) -> Option<Timestamp> {
        self.place_with(wall, GapPolicy::AfterGap)
    }

    fn place_with(&self, wall: DateTime, gap: GapPolicy) -> Option<Timestamp> {
        let offset = match self.tz.to_ambiguous_timestamp(wall).offset() {
            AmbiguousOffset::Unambiguous { offset } => offset,
            AmbiguousOffset::Fold { before, after } => match self.dst.fold {
                FoldPolicy::First => before,
                FoldPolicy::Last => after,
            },
            AmbiguousOffset::Gap { before, after } => match gap {
                // Reading the wall time with the pre-jump offset moves it
                // forward by exactly the gap length.
                GapPolicy::Shift => before,
                GapPolicy::AfterGap => {
                    // Read with the post-jump offset, the wall time is an
                    // instant inside the last gap-length before the jump, so
                    // the next transition is the jump itself.
                    let before_jump = after.to_timestamp(wall).ok()?;
                    return Some(self.tz.following(before_jump).next()?.timestamp());
                }
            },
        };
        offset.to_timestamp(wall).ok()
    }

    /// The earliest whole-second wall time whose floor is after `t`. Every
    /// earlier wall time has its floor at or before `t`, because the floor is
    /// monotone; that lets a binary search find it.
    fn first_wall_after(&self, t: Timestamp) -> Option<DateTime> {
        let wall = truncate_to_second(self.tz.to_datetime(t))?;
        // Near the ends of jiff's range a placement may not exist; treat
        // those wall times as far past or far future.
        let is_after = |c: DateTime| self.floor(c).map_or(c > wall, |at| at > t);
        let mut low = wall.checked_sub(WALL_SLACK).unwrap_or(DateTime::MIN);
        let mut high = wall.checked_add(WALL_SLACK).unwrap_or(DateTime::MAX);
        let mut span = high.duration_since(low).as_secs();
        // Invariant: !is_after(low) && is_after(high).
        while span > 1 {
            let middle = low.checked_add(SignedDuration::from_secs(span / 2)).ok()?;
            if is_after(middle) {
                high = middle;
            } else {
                low = middle;
            }
            span = high.duration_since(low).as_secs();
        }
        truncate_to_second(high)
    }

    /// A wall time such that every matching wall time placed after `t` is at
    /// or after it.
    fn search_start(&self, t: Timestamp) -> Option<DateTime> {
        let mut start = self.first_wall_after(t)?;
        if self.dst.gap == GapPolicy::Shift {
            // Shift places a skipped wall time up to one gap length after the
            // jump, so wall times from a gap whose jump is at or before `t`
            // can still land after `t`: start at the beginning of such a gap.
            let just_after = t.checked_add(ONE_NANO).unwrap_or(t);
            let horizon = t.checked_sub(MAX_GAP).unwrap_or(Timestamp::MIN);
            for transition in self.tz.preceding(just_after) {
                let jump = transition.timestamp();
                if jump <= horizon {
                    break;
                }
                let before = self.tz.to_offset(jump.checked_sub(ONE_NANO).ok()?);
                let length = transition.offset().duration_since(before);
                let gap_end = jump.checked_add(length).ok()?;
                if length.is_positive() && gap_end > t {
                    start = start.min(before.to_datetime(jump));
                }
            }
        }
        Some(start)
    }

    /// The first matching wall time at or after (`inclusive`) or after `wall`.
    fn next_match(&self, wall: DateTime, inclusive: bool) -> Option<DateTime> {
        // croner reports both "no further match before year 5000" and running
        // off the calendar as errors; either way there is no next run.
        let Rule::Cron(cron) = &self.rule else {
            return None;
        };
        cron.find_next_occurrence(&wall, inclusive).ok()
    }

    /// The last matching wall time at or before `wall`.
    fn prev_match(&self, wall: DateTime) -> Option<DateTime> {
        let Rule::Cron(cron) = &self.rule else {
            return None;
        };
        cron.find_previous_occurrence(&wall, true).ok()
    }
}

/// A schedule's instants after a start instant, of either rule.
enum Instants<'a> {
    Cron(Upcoming<'a>),
    Every { every: Every, after: Timestamp },
}

impl Iterator for Instants<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        match self {
            Instants::Cron(upcoming) => upcoming.next(),
            Instants::Every { every, after } => {
                let at = every.next_after(*after)?;
                *after = at;
                Some(at)
            }
        }
    }
}

/// Cron instants after a start instant; see the module docs.
struct Upcoming<'a> {
    schedule: &'a Single,
    /// The last instant returned (initially the start): only later ones are
    /// new runs.
    emitted_up_to: Timestamp,
    /// The next matching wall time not yet placed.
    next_match: Option<DateTime>,
    /// Placed instants that a later match might still precede (Shift only).
    pending: BTreeSet<Timestamp>,
}

impl Iterator for Upcoming<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        loop {
            if let Some(&earliest) = self.pending.first() {
                // Every later match is placed at or after its floor, which is
                // at least the floor of the next match.
                let settled = self
                    .next_match
                    .and_then(|wall| self.schedule.floor(wall))
                    .is_none_or(|floor| earliest <= floor);
                if settled {
                    self.pending.pop_first();
                    if earliest > self.emitted_up_to {
                        self.emitted_up_to = earliest;
                        return Some(earliest);
                    }
                    continue;
                }
            }
            let wall = self.next_match?;
            if let Some(at) = self.schedule.place(wall)
                && at > self.emitted_up_to
            {
                self.pending.insert(at);
            }
            self.next_match = self.schedule.next_match(wall, false);
        }
    }
}

/// How many of the increasing `instants` are at or before `until`, counting at most `cap`.
fn count_until(instants: impl Iterator<Item = Timestamp>, until: Timestamp, cap: u64) -> u64 {
    let mut count = 0;
    for at in instants {
        if at > until || count >= cap {
            break;
        }
        count += 1;
    }
    count
}

/// The tz database compiled into the binary (see the module docs).
fn tz_database() -> &'static TimeZoneDatabase {
    static DATABASE: OnceLock<TimeZoneDatabase> = OnceLock::new();
    DATABASE.get_or_init(TimeZoneDatabase::bundled)
}

fn truncate_to_second(wall: DateTime) -> Option<DateTime> {
    wall.with().subsec_nanosecond(0).build().ok()
}

/// The text after `@every`, if the expression is an interval.
fn every_rest(expr: &str) -> Option<&str> {
    let trimmed = expr.trim_start();
    let head = trimmed.get(..6)?;
    head.eq_ignore_ascii_case("@every")
        .then(|| &trimmed[6..])
        .filter(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
}

/// A cron expression in CronJob's dialect, parsed by croner.
fn parse_cron(expr: &str) -> Result<Cron, String> {
    let normalized = normalize(expr)?;
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(&normalized)
        .map_err(|e| e.to_string())
}

/// Whether the pattern matches at least one wall time, decided in bounded
/// work instead of croner's search up to the year 5000 (hundreds of
/// milliseconds). Time of day and date are matched independently. Whether a
/// date matches depends only on its month, day, weekday and the length of
/// its month, and every combination of those occurs in 2001-2028, a full
/// 28-year cycle of the calendar; a pattern that matches no day there never
/// fires, and one that does fires again every 400 years at the latest.
fn ever_fires(cron: &Cron) -> bool {
    let pattern = &cron.pattern;
    let time_matches = (0..=59).any(|s| pattern.second_match(s).unwrap_or(false))
        && (0..=59).any(|m| pattern.minute_match(m).unwrap_or(false))
        && (0..=23).any(|h| pattern.hour_match(h).unwrap_or(false));
    if !time_matches {
        return false;
    }
    (2001i16..=2028).any(|year| {
        (1i8..=12).any(|month| {
            let Ok(first) = Date::new(year, month, 1) else {
                return false;
            };
            let month = month as u32;
            if !pattern.month_match(month).unwrap_or(false) {
                return false;
            }
            let first_weekday = croner::Weekday::from_days_from_sunday(
                first.weekday().to_sunday_zero_offset() as u32,
            );
            (1..=first.days_in_month() as u32).any(|day| {
                let weekday = first_weekday.shift(day as i32 - 1);
                pattern
                    .day_match(i32::from(year), month, day, weekday)
                    .unwrap_or(false)
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::Single as Schedule;
    use super::*;
    use proptest::prelude::*;

    const FIRST: DstPolicy = DstPolicy {
        gap: GapPolicy::AfterGap,
        fold: FoldPolicy::First,
    };
    const LAST: DstPolicy = DstPolicy {
        gap: GapPolicy::AfterGap,
        fold: FoldPolicy::Last,
    };
    const SHIFT: DstPolicy = DstPolicy {
        gap: GapPolicy::Shift,
        fold: FoldPolicy::First,
    };
    const SHIFT_LAST: DstPolicy = DstPolicy {
        gap: GapPolicy::Shift,
        fold: FoldPolicy::Last,
    };
    const ALL_POLICIES: [DstPolicy; 4] = [FIRST, LAST, SHIFT, SHIFT_LAST];

    fn schedule(expr: &str, tz: &str, dst: DstPolicy) -> Schedule {
        Schedule::parse(expr, Some(tz), dst).unwrap()
    }

    fn utc(expr: &str) -> Schedule {
        Schedule::parse(expr, None, DstPolicy::default()).unwrap()
    }

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn strings(instants: impl IntoIterator<Item = Timestamp>) -> Vec<String> {
        instants.into_iter().map(|t| t.to_string()).collect()
    }

    /// Scheduled instants in (after, until].
    fn runs(s: &Schedule, after: &str, until: &str) -> Vec<String> {
        let until = ts(until);
        strings(s.iter_after(ts(after)).take_while(|&t| t <= until))
    }

    fn first_n(s: &Schedule, after: &str, n: usize) -> Vec<String> {
        strings(s.iter_after(ts(after)).take(n))
    }

    fn parse_error(expr: &str) -> ScheduleError {
        Schedule::parse(expr, None, DstPolicy::default()).unwrap_err()
    }

    // ---- Cron semantics -------------------------------------------------

    #[test]
    fn restricted_day_of_month_and_day_of_week_match_either() {
        // The 13th or any Friday (August 2027 starts on a Sunday).
        assert_eq!(
            first_n(&utc("0 0 13 * 5"), "2027-08-01T00:00:00Z", 8),
            [
                "2027-08-06T00:00:00Z",
                "2027-08-13T00:00:00Z",
                "2027-08-20T00:00:00Z",
                "2027-08-27T00:00:00Z",
                "2027-09-03T00:00:00Z",
                "2027-09-10T00:00:00Z",
                "2027-09-13T00:00:00Z",
                "2027-09-17T00:00:00Z",
            ]
        );
    }

    #[test]
    fn an_unrestricted_day_field_leaves_the_other_in_charge() {
        let fridays = [
            "2027-08-06T00:00:00Z",
            "2027-08-13T00:00:00Z",
            "2027-08-20T00:00:00Z",
        ];
        let thirteenths = [
            "2027-08-13T00:00:00Z",
            "2027-09-13T00:00:00Z",
            "2027-10-13T00:00:00Z",
        ];
        for expr in ["0 0 * * 5", "0 0 ? * 5", "0 0 */1 * 5", "0 0 * * FRI"] {
            assert_eq!(
                first_n(&utc(expr), "2027-08-01T00:00:00Z", 3),
                fridays,
                "{expr}"
            );
        }
        for expr in ["0 0 13 * *", "0 0 13 * ?", "0 0 13 * */1"] {
            assert_eq!(
                first_n(&utc(expr), "2027-08-01T00:00:00Z", 3),
                thirteenths,
                "{expr}"
            );
        }
        // A stepped field other than */1 is a restriction, as in Kubernetes:
        // odd days or Fridays.
        assert_eq!(
            first_n(&utc("0 0 */2 * 5"), "2027-08-01T00:00:00Z", 4),
            [
                "2027-08-03T00:00:00Z",
                "2027-08-05T00:00:00Z",
                "2027-08-06T00:00:00Z",
                "2027-08-07T00:00:00Z",
            ]
        );
    }

    #[test]
    fn sunday_is_both_0_and_7() {
        let sundays = first_n(&utc("0 0 * * 0"), "2027-01-01T00:00:00Z", 3);
        assert_eq!(
            sundays,
            [
                "2027-01-03T00:00:00Z",
                "2027-01-10T00:00:00Z",
                "2027-01-17T00:00:00Z"
            ]
        );
        for expr in ["0 0 * * 7", "0 0 * * SUN", "0 0 * * sun"] {
            assert_eq!(
                first_n(&utc(expr), "2027-01-01T00:00:00Z", 3),
                sundays,
                "{expr}"
            );
        }
        // Friday through Sunday, written with 7 and with names.
        for expr in ["0 0 * * 5-7", "0 0 * * FRI-SUN"] {
            assert_eq!(
                first_n(&utc(expr), "2027-01-01T00:00:00Z", 4),
                [
                    "2027-01-02T00:00:00Z",
                    "2027-01-03T00:00:00Z",
                    "2027-01-08T00:00:00Z",
                    "2027-01-09T00:00:00Z",
                ],
                "{expr}"
            );
        }
    }

    /// The same instants, compared over a year of an every-minute window: equal schedules.
    fn same_runs(a: &str, b: &str) {
        assert_eq!(
            first_n(&utc(a), "2027-01-01T00:00:00Z", 400),
            first_n(&utc(b), "2027-01-01T00:00:00Z", 400),
            "{a} vs {b}"
        );
    }

    #[test]
    fn a_day_of_week_range_ending_on_sunday_after_sunday_is_sunday() {
        // croner reads SUN as 7, which made 0-SUN every day (found against robfig/cron, which
        // CronJob uses).
        for expr in [
            "0 0 * * 0-SUN",
            "0 0 * * SUN-SUN",
            "0 0 * * sun-sun",
            "0 0 * * 0-SUN/2",
            "0 0 * * 0-SUN/3",
            "0 0 * * 7-SUN",
        ] {
            same_runs(expr, "0 0 * * 0");
        }
        same_runs("0 0 * * SUN-SAT", "0 0 * * *");
        same_runs("0 0 * * MON-SUN", "0 0 * * *");
        same_runs("0 0 * * SUN-WED", "0 0 * * 0,1,2,3");
        same_runs("0 0 * * SUN-SAT/2", "0 0 * * 0,2,4,6");
    }

    #[test]
    fn a_single_value_with_a_step_runs_to_the_fields_maximum() {
        same_runs("5/15 * * * *", "5,20,35,50 * * * *");
        same_runs("0 3/5 * * *", "0 3,8,13,18,23 * * *");
        same_runs("0 0 5/10 * *", "0 0 5,15,25 * *");
        same_runs("0 0 1 2/3 *", "0 0 1 2,5,8,11 *");
        same_runs("0 0 1 FEB/3 *", "0 0 1 2,5,8,11 *");
        same_runs("0 0 * * 1/2", "0 0 * * 1,3,5");
        same_runs("0 0 * * MON/2", "0 0 * * 1,3,5");
        same_runs("10/20 0 0 * * *", "10,30,50 0 0 * * *");
        same_runs("0 ?/6 * * *", "0 */6 * * *");
    }

    #[test]
    fn lists_read_as_cronjob_reads_them() {
        same_runs("*,15 * * * *", "* * * * *");
        // Empty list items are skipped, as CronJob does.
        same_runs("0 0 1,,2 * *", "0 0 1,2 * *");
        same_runs(",5, * * * *", "5 * * * *");
        same_runs("0 */1,3 * * *", "0 * * * *");
        // An unrestricted day-of-month leaves day-of-week in charge, as `*` does.
        same_runs("0 0 *,15 * MON", "0 0 * * MON");
        same_runs("0 0 15 * ?,MON", "0 0 15 * *");
        // `*/2` restricts, so the days of either field run.
        same_runs(
            "0 0 */2,3 * MON",
            "0 0 1,3,5,7,9,11,13,15,17,19,21,23,25,27,29,31 * MON",
        );
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (expr, says) in [
            ("0 0 , * *", "the day-of-month field \",\" lists no value"),
            ("0 0 ,, * *", "lists no value"),
            ("0 0 * * L", "needs a weekday before it"),
            (
                "0 11-2 * * *",
                "the range \"11-2\" in the hour field is reversed",
            ),
            ("0 0 * DEC-JAN *", "reversed"),
            ("0 0 * * FRI-MON", "reversed"),
            (
                "60 * * * *",
                "60 is out of range for the minute field (0-59)",
            ),
            (
                "0 0 0 * *",
                "out of range for the day-of-month field (1-31)",
            ),
            ("0 0 * * 8", "out of range for the day-of-week field (0-7)"),
            ("*/0 * * * *", "positive whole number"),
            ("1-2-3 * * * *", "not a number"),
        ] {
            let message = parse_error(expr).to_string();
            assert!(message.contains(says), "{expr}: {message}");
        }
    }

    #[test]
    fn every_runs_at_the_epoch_plus_its_offset_whatever_the_time_zone() {
        let berlin = schedule("@every 1h +15m", "Europe/Berlin", FIRST);
        // Across the spring-forward jump: every 3,600 s, wall clock or not.
        assert_eq!(
            runs(&berlin, "2027-03-28T00:00:00Z", "2027-03-28T03:00:00Z"),
            [
                "2027-03-28T00:15:00Z",
                "2027-03-28T01:15:00Z",
                "2027-03-28T02:15:00Z"
            ]
        );
        assert_eq!(
            berlin.local(ts("2027-03-28T01:15:00Z")),
            "2027-03-28T03:15:00+02:00[Europe/Berlin]"
        );
        for policy in ALL_POLICIES {
            let s = schedule("@every 1h +15m", "Europe/Berlin", policy);
            assert_eq!(
                first_n(&s, "2027-10-31T00:00:00Z", 3),
                first_n(&berlin, "2027-10-31T00:00:00Z", 3)
            );
        }
        let every = utc("@EVERY 90s");
        assert_eq!(
            every.latest_at_or_before(ts("2027-01-01T00:00:59Z")),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            every.count_between(ts("2027-01-01T00:00:00Z"), ts("2027-01-01T01:00:00Z"), 100),
            40
        );
        // The same instants from any starting point: a restart does not move them.
        let later = first_n(&every, "2027-01-01T00:07:13Z", 2);
        assert_eq!(later, ["2027-01-01T00:07:30Z", "2027-01-01T00:09:00Z"]);
        assert!(
            parse_error("@every 1.5s")
                .to_string()
                .contains("whole number of seconds")
        );
    }

    #[test]
    fn month_and_weekday_names_work_in_any_case() {
        assert_eq!(
            first_n(&utc("0 0 1 JAN,jul *"), "2027-01-01T00:00:00Z", 3),
            [
                "2027-07-01T00:00:00Z",
                "2028-01-01T00:00:00Z",
                "2028-07-01T00:00:00Z"
            ]
        );
        assert_eq!(
            first_n(&utc("0 9 * * mon-Fri"), "2027-01-01T00:00:00Z", 3),
            [
                "2027-01-01T09:00:00Z",
                "2027-01-04T09:00:00Z",
                "2027-01-05T09:00:00Z"
            ]
        );
    }

    #[test]
    fn macros_expand_to_their_standard_forms() {
        for (macro_expr, standard) in [
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("@monthly", "0 0 1 * *"),
            ("@weekly", "0 0 * * 0"),
            ("@daily", "0 0 * * *"),
            ("@midnight", "0 0 * * *"),
            ("@hourly", "0 * * * *"),
            ("@DAILY", "0 0 * * *"),
            (" @hourly ", "0 * * * *"),
        ] {
            assert_eq!(
                first_n(&utc(macro_expr), "2027-01-01T00:30:00Z", 3),
                first_n(&utc(standard), "2027-01-01T00:30:00Z", 3),
                "{macro_expr}"
            );
        }
        assert_eq!(
            first_n(&utc("@weekly"), "2027-01-01T00:00:00Z", 1),
            ["2027-01-03T00:00:00Z"]
        );
    }

    #[test]
    fn six_fields_have_leading_seconds() {
        assert_eq!(
            first_n(&utc("*/15 * * * * *"), "2027-01-01T00:00:00Z", 5),
            [
                "2027-01-01T00:00:15Z",
                "2027-01-01T00:00:30Z",
                "2027-01-01T00:00:45Z",
                "2027-01-01T00:01:00Z",
                "2027-01-01T00:01:15Z",
            ]
        );
        assert_eq!(
            first_n(&utc("30 0 12 * * *"), "2027-01-01T00:00:00Z", 2),
            ["2027-01-01T12:00:30Z", "2027-01-02T12:00:30Z"]
        );
    }

    #[test]
    fn the_31st_skips_short_months() {
        assert_eq!(
            first_n(&utc("0 0 31 * *"), "2027-01-01T00:00:00Z", 6),
            [
                "2027-01-31T00:00:00Z",
                "2027-03-31T00:00:00Z",
                "2027-05-31T00:00:00Z",
                "2027-07-31T00:00:00Z",
                "2027-08-31T00:00:00Z",
                "2027-10-31T00:00:00Z",
            ]
        );
    }

    #[test]
    fn february_29th_runs_in_leap_years_only() {
        assert_eq!(
            first_n(&utc("0 0 29 2 *"), "2027-01-01T00:00:00Z", 3),
            [
                "2028-02-29T00:00:00Z",
                "2032-02-29T00:00:00Z",
                "2036-02-29T00:00:00Z"
            ]
        );
        // 2100 is not a leap year.
        assert_eq!(
            first_n(&utc("0 0 29 2 *"), "2097-01-01T00:00:00Z", 1),
            ["2104-02-29T00:00:00Z"]
        );
    }

    #[test]
    fn quartz_day_extensions() {
        // L: last day of the month.
        assert_eq!(
            first_n(&utc("0 0 L * *"), "2028-01-01T00:00:00Z", 3),
            [
                "2028-01-31T00:00:00Z",
                "2028-02-29T00:00:00Z",
                "2028-03-31T00:00:00Z"
            ]
        );
        // 1#1: first Monday; 5L: last Friday; 15W: weekday nearest the 15th
        // (2027-05-15 is a Saturday).
        assert_eq!(
            first_n(&utc("0 0 * * 1#1"), "2027-01-01T00:00:00Z", 2),
            ["2027-01-04T00:00:00Z", "2027-02-01T00:00:00Z"]
        );
        assert_eq!(
            first_n(&utc("0 0 * * 5L"), "2027-01-01T00:00:00Z", 2),
            ["2027-01-29T00:00:00Z", "2027-02-26T00:00:00Z"]
        );
        assert_eq!(
            first_n(&utc("0 0 15W * *"), "2027-05-01T00:00:00Z", 1),
            ["2027-05-14T00:00:00Z"]
        );
    }

    #[test]
    fn rejects_malformed_and_non_standard_expressions() {
        for expr in [
            "",
            "* * * *",
            "0 0 0 * * * 2027",
            "0 0 0 0 * * * *",
            "@reboot",
            "@every 0s",
            "@every",
            "@everyday",
            "@every 1h +2h",
            "60 * * * *",
            "0 24 * * *",
            "0 0 0 * *",
            "0 0 * 13 *",
            "0 0 * * 8",
            "*/0 * * * *",
            "JAN * * * *",
            "0 0 * MON *",
            "0 0 * * JAN",
            "0 0 * * MONDAY",
            "0 0 W * *",
            "0 0 1W-3 * *",
            "0 0 * * +1",
            "0 0 * * 1#6",
            "a b c d e",
        ] {
            match parse_error(expr) {
                ScheduleError::InvalidCron {
                    expr: given,
                    message,
                } => {
                    assert_eq!(given, expr);
                    assert!(!message.is_empty());
                }
                other => panic!("{expr:?}: unexpected {other:?}"),
            }
        }
        assert_eq!(
            parse_error("0 0 0 * * * 2027").to_string(),
            "invalid cron expression \"0 0 0 * * * 2027\": a 7th (year) field is not supported"
        );
    }

    #[test]
    fn schedules_that_never_fire_are_rejected_quickly() {
        for expr in [
            "0 0 30 2 *",
            "0 0 31 2 *",
            "0 0 31 4,6,9,11 *",
            "* * 31 2,4,6,9,11 *",
            "0 0 30,31 2 *",
        ] {
            let started = std::time::Instant::now();
            let error = parse_error(expr);
            let elapsed = started.elapsed();
            assert_eq!(error, ScheduleError::NeverFires(expr.to_string()));
            // Measured at well under 1 ms in a debug build; the bound only
            // guards against a regression to an unbounded search.
            assert!(elapsed.as_millis() < 50, "{expr}: {elapsed:?}");
        }
        assert_eq!(
            parse_error("0 0 30 2 *").to_string(),
            "cron expression \"0 0 30 2 *\" never fires"
        );
        // Rare is not never: a fifth Monday in February needs a leap year
        // whose February 1st is a Monday.
        let rare = utc("0 0 * 2 1#5");
        assert_eq!(
            rare.next_after(ts("2017-01-01T00:00:00Z")),
            Some(ts("2044-02-29T00:00:00Z"))
        );
        assert_eq!(
            rare.latest_at_or_before(ts("2040-01-01T00:00:00Z")),
            Some(ts("2016-02-29T00:00:00Z"))
        );
    }

    #[test]
    fn time_zone_names() {
        for tz in [None, Some("")] {
            let s = Schedule::parse("0 0 * * *", tz, DstPolicy::default()).unwrap();
            assert_eq!(s.time_zone(), &TimeZone::UTC);
        }
        let berlin = schedule("0 0 * * *", "Europe/Berlin", FIRST);
        assert_eq!(berlin.time_zone().iana_name(), Some("Europe/Berlin"));
        assert_eq!(
            Schedule::parse("0 0 * * *", Some("Mars/Olympus_Mons"), FIRST).unwrap_err(),
            ScheduleError::UnknownTimeZone("Mars/Olympus_Mons".to_string())
        );
        assert_eq!(
            ScheduleError::UnknownTimeZone("CEST".to_string()).to_string(),
            "unknown time zone \"CEST\" (expected an IANA name such as Europe/Berlin)"
        );
    }

    #[test]
    fn expr_is_kept_as_given() {
        assert_eq!(utc(" @daily ").expr(), " @daily ");
        assert_eq!(utc("0 9 * * mon").expr(), "0 9 * * mon");
    }

    #[test]
    fn policies_deserialize_with_defaults() {
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, MapDeserializer};

        let empty = MapDeserializer::<_, Error>::new(std::iter::empty::<(&str, &str)>());
        assert_eq!(DstPolicy::deserialize(empty), Ok(DstPolicy::default()));
        let both =
            MapDeserializer::<_, Error>::new([("gap", "Shift"), ("fold", "Last")].into_iter());
        assert_eq!(DstPolicy::deserialize(both), Ok(SHIFT_LAST));
        assert_eq!(
            GapPolicy::deserialize("AfterGap".into_deserializer()),
            Ok::<_, Error>(GapPolicy::AfterGap)
        );
        // Values are case-sensitive, like other Kubernetes enums.
        let lowercase: Result<FoldPolicy, Error> =
            FoldPolicy::deserialize("last".into_deserializer());
        assert!(lowercase.is_err());
        let schema = schemars::schema_for!(DstPolicy);
        assert!(schema.get("required").is_none());
    }

    // ---- Instant arithmetic ---------------------------------------------

    #[test]
    fn next_and_latest_around_an_instant() {
        let daily = utc("0 0 * * *");
        assert_eq!(
            daily.next_after(ts("2027-01-01T00:00:00Z")),
            Some(ts("2027-01-02T00:00:00Z"))
        );
        assert_eq!(
            daily.next_after(ts("2027-01-01T00:00:00.5Z")),
            Some(ts("2027-01-02T00:00:00Z"))
        );
        assert_eq!(
            daily.next_after(ts("2026-12-31T23:59:59.999Z")),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            daily.latest_at_or_before(ts("2027-01-01T00:00:00Z")),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            daily.latest_at_or_before(ts("2027-01-01T00:00:00.5Z")),
            Some(ts("2027-01-01T00:00:00Z"))
        );
        assert_eq!(
            daily.latest_at_or_before(ts("2026-12-31T23:59:59.999Z")),
            Some(ts("2026-12-31T00:00:00Z"))
        );
    }

    #[test]
    fn latest_finds_a_run_years_back_without_scanning() {
        let yearly = utc("0 0 1 1 *");
        assert_eq!(
            yearly.latest_at_or_before(ts("4000-06-01T00:00:00Z")),
            Some(ts("4000-01-01T00:00:00Z"))
        );
        let leap = schedule("30 2 29 2 *", "Europe/Berlin", SHIFT);
        assert_eq!(
            leap.latest_at_or_before(ts("2027-06-01T00:00:00Z")),
            Some(ts("2024-02-29T01:30:00Z"))
        );
    }

    #[test]
    fn the_ends_of_time_are_handled() {
        let daily = utc("0 0 * * *");
        // croner searches no further than the year 5000.
        assert_eq!(
            daily.next_after(ts("4999-12-31T12:00:00Z")),
            Some(ts("5000-01-01T00:00:00Z"))
        );
        assert_eq!(daily.next_after(ts("5001-01-01T00:00:00Z")), None);
        assert_eq!(daily.next_after(Timestamp::MAX), None);
        assert_eq!(daily.latest_at_or_before(Timestamp::MIN), None);
        assert_eq!(
            daily.latest_at_or_before(ts("0001-01-02T12:00:00Z")),
            Some(ts("0001-01-02T00:00:00Z"))
        );
        let berlin = schedule("* * * * *", "Europe/Berlin", SHIFT_LAST);
        assert_eq!(berlin.next_after(Timestamp::MAX), None);
        assert_eq!(berlin.latest_at_or_before(Timestamp::MIN), None);
    }

    #[test]
    fn count_between_counts_half_open_and_caps() {
        let hourly = utc("0 * * * *");
        let (after, until) = (ts("2027-01-01T00:00:00Z"), ts("2027-01-02T00:00:00Z"));
        assert_eq!(hourly.count_between(after, until, u64::MAX), 24);
        assert_eq!(hourly.count_between(after, until, 5), 5);
        assert_eq!(hourly.count_between(after, until, 0), 0);
        assert_eq!(hourly.count_between(until, after, 10), 0);
        assert_eq!(hourly.count_between(after, after, 10), 0);
    }

    #[test]
    fn preview_lines() {
        let berlin = schedule("30 2 * * *", "Europe/Berlin", FIRST);
        assert_eq!(
            preview(&berlin.clone().into(), ts("2027-03-26T12:00:00Z"), 3).collect::<Vec<_>>(),
            [
                "2027-03-27T01:30:00Z 2027-03-27T02:30:00+01:00[Europe/Berlin]",
                "2027-03-28T01:00:00Z 2027-03-28T03:00:00+02:00[Europe/Berlin]",
                "2027-03-29T00:30:00Z 2027-03-29T02:30:00+02:00[Europe/Berlin]",
            ]
        );
        assert_eq!(
            preview(&utc("0 0 * * *").into(), ts("2027-01-01T00:00:00Z"), 1).collect::<Vec<_>>(),
            ["2027-01-02T00:00:00Z 2027-01-02T00:00:00+00:00[UTC]"]
        );
        assert_eq!(
            preview(&berlin.clone().into(), ts("2027-01-01T00:00:00Z"), 0).count(),
            0
        );
    }

    // ---- DST tables -----------------------------------------------------
    //
    // Each case: zone, expression, the policies it holds for, the window
    // (after, until] and the exact UTC instants expected in it.

    #[track_caller]
    fn check(zone: &str, expr: &str, policies: &[DstPolicy], window: (&str, &str), want: &[&str]) {
        for &dst in policies {
            let s = schedule(expr, zone, dst);
            assert_eq!(
                runs(&s, window.0, window.1),
                want,
                "{zone} {expr:?} {dst:?}"
            );
            let count = s.count_between(ts(window.0), ts(window.1), u64::MAX);
            assert_eq!(count, want.len() as u64, "{zone} {expr:?} {dst:?}");
        }
    }

    #[track_caller]
    fn check_count(
        zone: &str,
        expr: &str,
        policies: &[DstPolicy],
        window: (&str, &str),
        want: u64,
    ) {
        for &dst in policies {
            let s = schedule(expr, zone, dst);
            let count = s.count_between(ts(window.0), ts(window.1), u64::MAX);
            assert_eq!(count, want, "{zone} {expr:?} {dst:?}");
        }
    }

    #[test]
    fn dst_transitions_are_where_the_tables_say() {
        // Guards the tables below against tzdb surprises: (zone, transition,
        // offset before, offset after).
        for (zone, at, before, after) in [
            ("Europe/Berlin", "2027-03-28T01:00:00Z", 3600, 7200),
            ("Europe/Berlin", "2027-10-31T01:00:00Z", 7200, 3600),
            ("America/New_York", "2027-03-14T07:00:00Z", -18000, -14400),
            ("America/New_York", "2027-11-07T06:00:00Z", -14400, -18000),
            ("Australia/Lord_Howe", "2027-10-02T15:30:00Z", 37800, 39600),
            ("Australia/Lord_Howe", "2027-04-03T15:00:00Z", 39600, 37800),
            ("Pacific/Apia", "2011-12-30T10:00:00Z", -36000, 50400),
            ("Europe/Moscow", "2014-10-25T22:00:00Z", 14400, 10800),
            ("America/Sao_Paulo", "2018-11-04T03:00:00Z", -10800, -7200),
        ] {
            let tz = tz_database().get(zone).unwrap();
            let at = ts(at);
            let transition = tz.following(at - ONE_SECOND).next().unwrap();
            assert_eq!(transition.timestamp(), at, "{zone}");
            assert_eq!(tz.to_offset(at - ONE_NANO).seconds(), before, "{zone}");
            assert_eq!(transition.offset().seconds(), after, "{zone}");
        }
    }

    #[test]
    fn berlin_spring_forward() {
        // 2027-03-28 02:00 CET -> 03:00 CEST at 01:00Z; 02:00-02:59 is skipped.
        let z = "Europe/Berlin";
        check(
            z,
            "0 * * * *",
            &ALL_POLICIES,
            ("2027-03-27T22:30:00Z", "2027-03-28T03:00:00Z"),
            &[
                "2027-03-27T23:00:00Z",
                "2027-03-28T00:00:00Z",
                "2027-03-28T01:00:00Z", // 02:00 and 03:00 wall time: one run
                "2027-03-28T02:00:00Z",
                "2027-03-28T03:00:00Z",
            ],
        );
        let days = ("2027-03-27T00:00:00Z", "2027-03-29T12:00:00Z");
        check(
            z,
            "30 2 * * *",
            &[FIRST, LAST],
            days,
            &[
                "2027-03-27T01:30:00Z",
                "2027-03-28T01:00:00Z", // 03:00 CEST
                "2027-03-29T00:30:00Z",
            ],
        );
        check(
            z,
            "30 2 * * *",
            &[SHIFT, SHIFT_LAST],
            days,
            &[
                "2027-03-27T01:30:00Z",
                "2027-03-28T01:30:00Z", // 03:30 CEST
                "2027-03-29T00:30:00Z",
            ],
        );
        // Every minute: the 60 skipped minutes and 03:00 are one run, so each
        // real minute has exactly one run.
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-03-28T00:00:00Z", "2027-03-28T02:00:00Z"),
            120,
        );
        check(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-03-28T00:58:00Z", "2027-03-28T01:01:00Z"),
            &[
                "2027-03-28T00:59:00Z",
                "2027-03-28T01:00:00Z",
                "2027-03-28T01:01:00Z",
            ],
        );
        // A schedule that only matches skipped minutes runs once, not 60 times.
        check(
            z,
            "* 2 * * *",
            &[FIRST, LAST],
            ("2027-03-27T23:00:00Z", "2027-03-28T23:00:00Z"),
            &["2027-03-28T01:00:00Z"],
        );
        check_count(
            z,
            "* 2 * * *",
            &[SHIFT],
            ("2027-03-27T23:00:00Z", "2027-03-28T23:00:00Z"),
            60,
        );
    }

    #[test]
    fn berlin_fall_back() {
        // 2027-10-31 03:00 CEST -> 02:00 CET at 01:00Z; 02:00-02:59 happens twice.
        let z = "Europe/Berlin";
        let window = ("2027-10-30T22:30:00Z", "2027-10-31T03:00:00Z");
        check(
            z,
            "0 * * * *",
            &[FIRST, SHIFT],
            window,
            &[
                "2027-10-30T23:00:00Z",
                "2027-10-31T00:00:00Z", // 02:00 CEST
                "2027-10-31T02:00:00Z",
                "2027-10-31T03:00:00Z",
            ],
        );
        check(
            z,
            "0 * * * *",
            &[LAST, SHIFT_LAST],
            window,
            &[
                "2027-10-30T23:00:00Z",
                "2027-10-31T01:00:00Z", // 02:00 CET
                "2027-10-31T02:00:00Z",
                "2027-10-31T03:00:00Z",
            ],
        );
        let days = ("2027-10-30T00:00:00Z", "2027-11-01T12:00:00Z");
        check(
            z,
            "30 2 * * *",
            &[FIRST, SHIFT],
            days,
            &[
                "2027-10-30T00:30:00Z",
                "2027-10-31T00:30:00Z",
                "2027-11-01T01:30:00Z",
            ],
        );
        check(
            z,
            "30 2 * * *",
            &[LAST, SHIFT_LAST],
            days,
            &[
                "2027-10-30T00:30:00Z",
                "2027-10-31T01:30:00Z",
                "2027-11-01T01:30:00Z",
            ],
        );
        // Every minute: 180 real minutes, 60 of them without a run.
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-10-30T23:00:00Z", "2027-10-31T02:00:00Z"),
            120,
        );
        check(
            z,
            "* * * * *",
            &[FIRST],
            ("2027-10-31T00:58:00Z", "2027-10-31T02:01:00Z"),
            &[
                "2027-10-31T00:59:00Z",
                "2027-10-31T02:00:00Z",
                "2027-10-31T02:01:00Z",
            ],
        );
        check(
            z,
            "* * * * *",
            &[LAST],
            ("2027-10-30T23:58:00Z", "2027-10-31T01:01:00Z"),
            &[
                "2027-10-30T23:59:00Z",
                "2027-10-31T01:00:00Z",
                "2027-10-31T01:01:00Z",
            ],
        );
    }

    #[test]
    fn next_and_latest_from_inside_a_fold() {
        // Berlin 2027-10-31: 00:00Z-01:00Z is the first 02:xx, 01:00Z-02:00Z
        // the second.
        let z = "Europe/Berlin";
        let first_0230 = ts("2027-10-31T00:30:00Z");
        let second_0230 = ts("2027-10-31T01:30:00Z");
        let minutely = |dst| schedule("* * * * *", z, dst);
        let daily = |dst| schedule("30 2 * * *", z, dst);

        // Last, from the first occurrence: wall times before 02:30 still run
        // later, at their second occurrence.
        assert_eq!(
            minutely(LAST).next_after(first_0230),
            Some(ts("2027-10-31T01:00:00Z"))
        );
        assert_eq!(daily(LAST).next_after(first_0230), Some(second_0230));
        assert_eq!(
            daily(LAST).next_after(ts("2027-10-31T00:10:00Z")),
            Some(second_0230)
        );
        assert_eq!(
            minutely(LAST).latest_at_or_before(first_0230),
            Some(ts("2027-10-30T23:59:00Z"))
        );
        assert_eq!(
            daily(LAST).latest_at_or_before(first_0230),
            Some(ts("2027-10-30T00:30:00Z"))
        );
        assert_eq!(
            daily(LAST).latest_at_or_before(second_0230),
            Some(second_0230)
        );

        // First, from the second occurrence: wall times after 02:30 already ran.
        assert_eq!(
            minutely(FIRST).next_after(second_0230),
            Some(ts("2027-10-31T02:00:00Z"))
        );
        assert_eq!(
            daily(FIRST).next_after(ts("2027-10-31T01:10:00Z")),
            Some(ts("2027-11-01T01:30:00Z"))
        );
        assert_eq!(
            daily(FIRST).next_after(ts("2027-10-31T00:10:00Z")),
            Some(first_0230)
        );
        assert_eq!(
            minutely(FIRST).latest_at_or_before(second_0230),
            Some(ts("2027-10-31T00:59:00Z"))
        );
        assert_eq!(
            daily(FIRST).latest_at_or_before(second_0230),
            Some(first_0230)
        );
    }

    #[test]
    fn next_and_latest_just_after_a_shifted_gap() {
        // Berlin 2027-03-28: Shift runs 02:30 at 03:30 CEST (01:30Z), so from
        // 03:10 CEST the next run comes from an earlier wall time.
        let daily = schedule("30 2 * * *", "Europe/Berlin", SHIFT);
        let t = ts("2027-03-28T01:10:00Z");
        assert_eq!(daily.next_after(t), Some(ts("2027-03-28T01:30:00Z")));
        assert_eq!(
            daily.latest_at_or_before(t),
            Some(ts("2027-03-27T01:30:00Z"))
        );
        assert_eq!(
            daily.latest_at_or_before(ts("2027-03-28T01:30:00Z")),
            Some(ts("2027-03-28T01:30:00Z"))
        );
        let after_gap = schedule("30 2 * * *", "Europe/Berlin", FIRST);
        assert_eq!(after_gap.next_after(t), Some(ts("2027-03-29T00:30:00Z")));
        assert_eq!(
            after_gap.latest_at_or_before(t),
            Some(ts("2027-03-28T01:00:00Z"))
        );
    }

    #[test]
    fn shift_is_not_monotone_but_the_output_is_sorted() {
        // Lord Howe 2027-10-03 02:00 -> 02:30 (+10:30 -> +11) at 15:30Z.
        // Shift moves 02:20 to 02:50 (15:50Z), after 02:40 (15:40Z).
        let z = "Australia/Lord_Howe";
        let shift = schedule("*/20 2 * * *", z, SHIFT);
        let wall = |s: &str| s.parse::<DateTime>().unwrap();
        assert!(shift.place(wall("2027-10-03T02:20")) > shift.place(wall("2027-10-03T02:40")));
        let window = ("2027-10-02T15:00:00Z", "2027-10-02T16:00:00Z");
        check(
            z,
            "*/20 2 * * *",
            &[SHIFT, SHIFT_LAST],
            window,
            &[
                "2027-10-02T15:30:00Z",
                "2027-10-02T15:40:00Z",
                "2027-10-02T15:50:00Z",
            ],
        );
        check(
            z,
            "*/20 2 * * *",
            &[FIRST, LAST],
            window,
            &["2027-10-02T15:30:00Z", "2027-10-02T15:40:00Z"],
        );
        let t = ts("2027-10-02T15:45:00Z");
        assert_eq!(shift.next_after(t), Some(ts("2027-10-02T15:50:00Z")));
        assert_eq!(
            shift.latest_at_or_before(t),
            Some(ts("2027-10-02T15:40:00Z"))
        );
        assert_eq!(
            shift.latest_at_or_before(ts("2027-10-02T15:35:00Z")),
            Some(ts("2027-10-02T15:30:00Z"))
        );
        // Berlin: 02:59 is moved past 03:00 CEST.
        let berlin = schedule("* * * * *", "Europe/Berlin", SHIFT);
        assert!(berlin.place(wall("2027-03-28T02:59")) > berlin.place(wall("2027-03-28T03:00")));
    }

    #[test]
    fn new_york_spring_forward() {
        // 2027-03-14 02:00 EST -> 03:00 EDT at 07:00Z.
        let z = "America/New_York";
        check(
            z,
            "0 * * * *",
            &ALL_POLICIES,
            ("2027-03-14T05:30:00Z", "2027-03-14T09:00:00Z"),
            &[
                "2027-03-14T06:00:00Z",
                "2027-03-14T07:00:00Z",
                "2027-03-14T08:00:00Z",
                "2027-03-14T09:00:00Z",
            ],
        );
        let days = ("2027-03-13T00:00:00Z", "2027-03-15T12:00:00Z");
        check(
            z,
            "30 2 * * *",
            &[FIRST, LAST],
            days,
            &[
                "2027-03-13T07:30:00Z",
                "2027-03-14T07:00:00Z",
                "2027-03-15T06:30:00Z",
            ],
        );
        check(
            z,
            "30 2 * * *",
            &[SHIFT, SHIFT_LAST],
            days,
            &[
                "2027-03-13T07:30:00Z",
                "2027-03-14T07:30:00Z",
                "2027-03-15T06:30:00Z",
            ],
        );
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-03-14T06:00:00Z", "2027-03-14T08:00:00Z"),
            120,
        );
        check(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-03-14T06:59:00Z", "2027-03-14T07:01:00Z"),
            &["2027-03-14T07:00:00Z", "2027-03-14T07:01:00Z"],
        );
    }

    #[test]
    fn new_york_fall_back() {
        // 2027-11-07 02:00 EDT -> 01:00 EST at 06:00Z; 01:00-01:59 twice.
        let z = "America/New_York";
        let window = ("2027-11-07T04:30:00Z", "2027-11-07T08:00:00Z");
        check(
            z,
            "0 * * * *",
            &[FIRST, SHIFT],
            window,
            &[
                "2027-11-07T05:00:00Z",
                "2027-11-07T07:00:00Z",
                "2027-11-07T08:00:00Z",
            ],
        );
        check(
            z,
            "0 * * * *",
            &[LAST, SHIFT_LAST],
            window,
            &[
                "2027-11-07T06:00:00Z",
                "2027-11-07T07:00:00Z",
                "2027-11-07T08:00:00Z",
            ],
        );
        let day = ("2027-11-07T00:00:00Z", "2027-11-07T12:00:00Z");
        check(
            z,
            "30 1 * * *",
            &[FIRST, SHIFT],
            day,
            &["2027-11-07T05:30:00Z"],
        );
        check(
            z,
            "30 1 * * *",
            &[LAST, SHIFT_LAST],
            day,
            &["2027-11-07T06:30:00Z"],
        );
        check(
            z,
            "30 2 * * *",
            &ALL_POLICIES,
            day,
            &["2027-11-07T07:30:00Z"],
        );
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-11-07T04:00:00Z", "2027-11-07T07:00:00Z"),
            120,
        );
    }

    #[test]
    fn lord_howe_half_hour_shifts() {
        // Spring: 2027-10-03 02:00 -> 02:30 (+10:30 -> +11) at 15:30Z.
        let z = "Australia/Lord_Howe";
        check(
            z,
            "0 * * * *",
            &ALL_POLICIES,
            ("2027-10-02T14:00:00Z", "2027-10-02T17:00:00Z"),
            &[
                "2027-10-02T14:30:00Z",
                "2027-10-02T15:30:00Z",
                "2027-10-02T16:00:00Z",
                "2027-10-02T17:00:00Z",
            ],
        );
        let day = ("2027-10-02T12:00:00Z", "2027-10-02T18:00:00Z");
        check(
            z,
            "15 2 * * *",
            &[FIRST, LAST],
            day,
            &["2027-10-02T15:30:00Z"],
        );
        check(
            z,
            "15 2 * * *",
            &[SHIFT, SHIFT_LAST],
            day,
            &["2027-10-02T15:45:00Z"],
        );
        // 02:30 is the first wall time after the gap, so it exists.
        check(
            z,
            "30 2 * * *",
            &ALL_POLICIES,
            day,
            &["2027-10-02T15:30:00Z"],
        );
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2027-10-02T15:00:00Z", "2027-10-02T16:00:00Z"),
            60,
        );

        // Fall: 2027-04-04 02:00 -> 01:30 (+11 -> +10:30) at 15:00Z; 01:30-01:59 twice.
        check(
            z,
            "0 * * * *",
            &ALL_POLICIES,
            ("2027-04-03T13:30:00Z", "2027-04-03T16:30:00Z"),
            &[
                "2027-04-03T14:00:00Z",
                "2027-04-03T15:30:00Z",
                "2027-04-03T16:30:00Z",
            ],
        );
        let day = ("2027-04-03T12:00:00Z", "2027-04-03T18:00:00Z");
        check(
            z,
            "45 1 * * *",
            &[FIRST, SHIFT],
            day,
            &["2027-04-03T14:45:00Z"],
        );
        check(
            z,
            "45 1 * * *",
            &[LAST, SHIFT_LAST],
            day,
            &["2027-04-03T15:15:00Z"],
        );
        check(
            z,
            "30 2 * * *",
            &ALL_POLICIES,
            day,
            &["2027-04-03T16:00:00Z"],
        );
        let half_hour = ("2027-04-03T14:30:00Z", "2027-04-03T15:30:00Z");
        check_count(z, "* * * * *", &[FIRST, SHIFT], half_hour, 30);
        check_count(z, "* * * * *", &[LAST, SHIFT_LAST], half_hour, 31);
    }

    #[test]
    fn apia_skipped_a_whole_day() {
        // 2011-12-29 23:59:59 -10:00 was followed by 2011-12-31 00:00 +14:00
        // (at 2011-12-30T10:00Z): all of December 30 is a 24-hour gap.
        let z = "Pacific/Apia";
        let days = ("2011-12-29T00:00:00Z", "2011-12-31T23:00:00Z");
        check(
            z,
            "30 2 * * *",
            &[FIRST, LAST],
            days,
            &[
                "2011-12-29T12:30:00Z",
                "2011-12-30T10:00:00Z", // December 30, at the jump
                "2011-12-30T12:30:00Z", // December 31
                "2011-12-31T12:30:00Z", // January 1
            ],
        );
        // Shifting December 30 by a day lands on December 31's run: one run.
        check(
            z,
            "30 2 * * *",
            &[SHIFT, SHIFT_LAST],
            days,
            &[
                "2011-12-29T12:30:00Z",
                "2011-12-30T12:30:00Z",
                "2011-12-31T12:30:00Z",
            ],
        );
        check(
            z,
            "0 * * * *",
            &ALL_POLICIES,
            ("2011-12-30T08:30:00Z", "2011-12-30T12:00:00Z"),
            &[
                "2011-12-30T09:00:00Z",
                "2011-12-30T10:00:00Z",
                "2011-12-30T11:00:00Z",
                "2011-12-30T12:00:00Z",
            ],
        );
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2011-12-30T09:00:00Z", "2011-12-30T11:00:00Z"),
            120,
        );
        check(
            z,
            "0 12 30 12 *",
            &[FIRST],
            ("2011-01-01T00:00:00Z", "2012-12-31T00:00:00Z"),
            &[
                "2011-12-30T10:00:00Z",
                "2012-12-29T22:00:00Z", // +14 (summer time)
            ],
        );
    }

    #[test]
    fn sao_paulo_midnight_that_never_happened() {
        // 2018-11-04 00:00 -03 -> 01:00 -02 at 03:00Z: the day began at 01:00.
        let z = "America/Sao_Paulo";
        let days = ("2018-11-03T00:00:00Z", "2018-11-05T12:00:00Z");
        check(
            z,
            "0 0 * * *",
            &ALL_POLICIES,
            days,
            &[
                "2018-11-03T03:00:00Z",
                "2018-11-04T03:00:00Z", // 01:00 -02
                "2018-11-05T02:00:00Z",
            ],
        );
        check(
            z,
            "0 0 4 11 *",
            &ALL_POLICIES,
            days,
            &["2018-11-04T03:00:00Z"],
        );
    }

    #[test]
    fn moscow_permanent_offset_change() {
        // 2014-10-26 02:00 +04 -> 01:00 +03 at 2014-10-25T22:00Z, not DST but
        // the same kind of fold.
        let z = "Europe/Moscow";
        let window = ("2014-10-25T19:30:00Z", "2014-10-25T23:00:00Z");
        check(
            z,
            "0 * * * *",
            &[FIRST, SHIFT],
            window,
            &[
                "2014-10-25T20:00:00Z",
                "2014-10-25T21:00:00Z",
                "2014-10-25T23:00:00Z",
            ],
        );
        check(
            z,
            "0 * * * *",
            &[LAST, SHIFT_LAST],
            window,
            &[
                "2014-10-25T20:00:00Z",
                "2014-10-25T22:00:00Z",
                "2014-10-25T23:00:00Z",
            ],
        );
        let day = ("2014-10-25T12:00:00Z", "2014-10-26T12:00:00Z");
        check(
            z,
            "30 1 * * *",
            &[FIRST, SHIFT],
            day,
            &["2014-10-25T21:30:00Z"],
        );
        check(
            z,
            "30 1 * * *",
            &[LAST, SHIFT_LAST],
            day,
            &["2014-10-25T22:30:00Z"],
        );
        check(
            z,
            "30 2 * * *",
            &ALL_POLICIES,
            day,
            &["2014-10-25T23:30:00Z"],
        );
        check_count(
            z,
            "* * * * *",
            &ALL_POLICIES,
            ("2014-10-25T20:00:00Z", "2014-10-25T23:00:00Z"),
            120,
        );
    }

    // ---- Property tests -------------------------------------------------

    /// Zones with offset changes first: DST, half-hour DST (Lord Howe),
    /// 45-minute offsets (Chatham), DST at midnight (Sao Paulo), a two-hour
    /// shift (Troll), a skipped day (Apia) and a permanent change (Moscow).
    const ZONES: [&str; 11] = [
        "Europe/Berlin",
        "America/New_York",
        "Australia/Lord_Howe",
        "Pacific/Apia",
        "Europe/Moscow",
        "Pacific/Chatham",
        "America/Sao_Paulo",
        "Antarctica/Troll",
        "America/St_Johns",
        "UTC",
        "Asia/Kolkata",
    ];
    const CHANGING_ZONES: &[&str] = ZONES.split_at(9).0;

    fn cron_field(min: u32, max: u32) -> impl Strategy<Value = String> {
        prop_oneof![
            Just("*".to_string()),
            (min..=max).prop_map(|v| v.to_string()),
            (min..=max, min..=max).prop_map(|(a, b)| format!("{a},{b}")),
            (min..=max, min..=max).prop_map(|(a, b)| format!("{}-{}", a.min(b), a.max(b))),
            (2..=max / 2 + 1).prop_map(|k| format!("*/{k}")),
            (min..=max, 2..=7u32).prop_map(move |(a, k)| format!("{a}-{max}/{k}")),
        ]
    }

    /// Expressions that always fire: months 3 and 10 (when most DST changes
    /// happen) have 31 days, and so does January.
    fn cron_expr() -> impl Strategy<Value = String> {
        let seconds = prop_oneof![
            Just(""),
            Just("0 "),
            Just("30 "),
            Just("*/20 "),
            Just("5,35 ")
        ];
        let month = prop_oneof![Just("*"), Just("3,10"), Just("*/2")];
        let dow = prop_oneof![
            cron_field(0, 7),
            Just("MON-FRI".to_string()),
            Just("sat,SUN".to_string())
        ];
        // Hours around the usual 01:00-03:00 changes are over-represented.
        let hour = prop_oneof![
            2 => cron_field(0, 23),
            1 => Just("*".to_string()),
            1 => Just("0-4".to_string()),
            1 => Just("1,2,3".to_string()),
        ];
        (
            seconds,
            cron_field(0, 59),
            hour,
            cron_field(1, 31),
            month,
            dow,
        )
            .prop_map(|(s, minute, hour, dom, month, dow)| {
                format!("{s}{minute} {hour} {dom} {month} {dow}")
            })
    }

    fn dst_policy() -> impl Strategy<Value = DstPolicy> {
        proptest::sample::select(ALL_POLICIES.to_vec())
    }

    /// Where a test starts: a year in 2000..2040, and either a point in that
    /// year or a point within three hours of one of the zone's offset changes
    /// (zones without changes fall back to the former).
    #[derive(Clone, Copy, Debug)]
    struct Start {
        year: i16,
        near_change: bool,
        nth_change: usize,
        into_year: i64,
        from_change: i64,
        nanos: i64,
    }

    impl Start {
        fn year_start(self) -> Timestamp {
            let date = Date::new(self.year, 1, 1).unwrap();
            date.to_zoned(TimeZone::UTC).unwrap().timestamp()
        }

        /// The offset change the start is near, if any.
        fn change(self, tz: &TimeZone) -> Option<Timestamp> {
            let change = tz.following(self.year_start()).nth(self.nth_change)?;
            self.near_change.then_some(change.timestamp())
        }

        fn instant(self, tz: &TimeZone) -> Timestamp {
            let base = match self.change(tz) {
                Some(change) => change + SignedDuration::from_secs(self.from_change),
                None => self.year_start() + SignedDuration::from_secs(self.into_year),
            };
            base + SignedDuration::from_nanos(self.nanos)
        }
    }

    fn start() -> impl Strategy<Value = Start> {
        (
            2000i16..2040,
            any::<bool>(),
            0usize..4,
            0i64..365 * 86_400,
            -3 * 3600i64..3 * 3600,
            prop_oneof![Just(0i64), 0i64..1_000_000_000],
        )
            .prop_map(
                |(year, near_change, nth_change, into_year, from_change, nanos)| Start {
                    year,
                    near_change,
                    nth_change,
                    into_year,
                    from_change,
                    nanos,
                },
            )
    }

    /// Placement computed from jiff's own disambiguation, independently of
    /// `Schedule::place`: the earlier/later instant of a repeated wall time,
    /// jiff's "later" (= compatible) instant for Shift, and for AfterGap the
    /// first instant whose wall time is not before the skipped one.
    fn oracle_place(tz: &TimeZone, wall: DateTime, dst: DstPolicy) -> Timestamp {
        let ambiguous = tz.to_ambiguous_zoned(wall);
        let zoned = match ambiguous.offset() {
            AmbiguousOffset::Unambiguous { .. } => ambiguous.unambiguous(),
            AmbiguousOffset::Fold { .. } => match dst.fold {
                FoldPolicy::First => ambiguous.earlier(),
                FoldPolicy::Last => ambiguous.later(),
            },
            AmbiguousOffset::Gap { .. } => match dst.gap {
                GapPolicy::Shift => ambiguous.later(),
                GapPolicy::AfterGap => {
                    let mut low = ambiguous.clone().earlier().unwrap().timestamp();
                    let mut high = ambiguous.later().unwrap().timestamp();
                    while high.duration_since(low) > ONE_SECOND {
                        let middle =
                            low + SignedDuration::from_secs(high.duration_since(low).as_secs() / 2);
                        if tz.to_datetime(middle) >= wall {
                            high = middle;
                        } else {
                            low = middle;
                        }
                    }
                    return high;
                }
            },
        };
        zoned.unwrap().timestamp()
    }

    /// The distinct placements of every matching wall time, in (after, until].
    fn oracle_runs(s: &Schedule, after: Timestamp, until: Timestamp) -> Vec<Timestamp> {
        // Offsets differ by at most a day in these zones.
        let margin = SignedDuration::from_hours(26);
        let mut wall = truncate_to_second(s.tz.to_datetime(after)).unwrap() - margin;
        let last = s.tz.to_datetime(until) + margin;
        let mut placed = BTreeSet::new();
        let Rule::Cron(cron) = &s.rule else {
            panic!("the oracle reads cron schedules")
        };
        while let Ok(next) = cron.find_next_occurrence(&wall, false) {
            if next > last {
                break;
            }
            let at = oracle_place(&s.tz, next, s.dst);
            if after < at && at <= until {
                placed.insert(at);
            }
            wall = next;
        }
        placed.into_iter().collect()
    }

    /// Checks `iter_after`, `count_between`, `next_after` and
    /// `latest_at_or_before` against [`oracle_runs`] on a window of `hours`.
    fn check_against_oracle(
        expr: &str,
        zone: &str,
        dst: DstPolicy,
        from: Start,
        around_change: &[i64],
        hours: i64,
    ) -> Result<(), TestCaseError> {
        let s = schedule(expr, zone, dst);
        let start = from.instant(&s.tz);
        let end = start + SignedDuration::from_hours(hours);
        let actual: Vec<Timestamp> = s.iter_after(start).take_while(|&t| t <= end).collect();

        prop_assert!(actual.iter().all(|&t| t > start));
        prop_assert!(actual.windows(2).all(|pair| pair[0] < pair[1]));
        // Nothing lost, nothing doubled.
        prop_assert_eq!(&actual, &oracle_runs(&s, start, end));

        let len = actual.len() as u64;
        prop_assert_eq!(s.count_between(start, end, u64::MAX), len);
        prop_assert_eq!(s.count_between(start, end, len / 2), len / 2);

        // Probe the start, points around the offset change, some runs and
        // the instants just before them.
        let step = (actual.len() / 6).max(1);
        let change = from.change(&s.tz);
        let probes = std::iter::once(start)
            .chain(
                around_change
                    .iter()
                    .filter_map(|&secs| Some(change? + SignedDuration::from_secs(secs))),
            )
            .chain(
                actual
                    .iter()
                    .step_by(step)
                    .flat_map(|&t| [t, t - ONE_NANO, t - ONE_SECOND]),
            )
            .filter(|&x| start <= x && x <= end);
        for x in probes {
            let next = s.next_after(x);
            prop_assert_eq!(next, s.iter_after(x).next());
            match actual.iter().find(|&&t| t > x) {
                Some(&expected) => prop_assert_eq!(next, Some(expected), "next_after({})", x),
                None => prop_assert!(next.is_none_or(|n| n > end)),
            }
            let latest = s.latest_at_or_before(x);
            if let Some(latest) = latest {
                prop_assert!(latest <= x);
                prop_assert!(s.next_after(latest).is_some_and(|n| n > x));
            }
            match actual.iter().rev().find(|&&t| t <= x) {
                Some(&expected) => {
                    prop_assert_eq!(latest, Some(expected), "latest_at_or_before({})", x);
                }
                None => prop_assert!(latest.is_none_or(|l| l <= start)),
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn runs_match_an_independent_oracle(
            expr in cron_expr(),
            zone in proptest::sample::select(ZONES.to_vec()),
            dst in dst_policy(),
            from in start(),
            around_change in proptest::collection::vec(-3 * 3600i64..3 * 3600, 4),
        ) {
            check_against_oracle(&expr, zone, dst, from, &around_change, 24)?;
        }

        #[test]
        fn runs_around_offset_changes_match_an_independent_oracle(
            expr in cron_expr(),
            zone in proptest::sample::select(CHANGING_ZONES),
            dst in dst_policy(),
            from in start(),
            around_change in proptest::collection::vec(-3 * 3600i64..3 * 3600, 6),
        ) {
            let from = Start { near_change: true, ..from };
            check_against_oracle(&expr, zone, dst, from, &around_change, 8)?;
        }

        #[test]
        fn the_floor_is_monotone_and_bounds_every_placement(
            zone in proptest::sample::select(ZONES.to_vec()),
            dst in dst_policy(),
            from in start(),
            // Wall times of real instants never fall in a gap; these can.
            around in -3 * 3600i64..3 * 3600,
            later_by in 0i64..3 * 3600,
        ) {
            let s = schedule("* * * * * *", zone, dst);
            let center = truncate_to_second(s.tz.to_datetime(from.instant(&s.tz))).unwrap();
            let wall = center + SignedDuration::from_secs(around);
            let later = wall + SignedDuration::from_secs(later_by);

            // Monotone for both fold policies, which is what makes
            // "drop equal neighbours" sufficient under AfterGap.
            prop_assert!(s.floor(wall).unwrap() <= s.floor(later).unwrap());
            let placed = s.place(wall).unwrap();
            prop_assert!(s.floor(wall).unwrap() <= placed);
            prop_assert!(placed < s.floor(wall).unwrap() + MAX_GAP);
            if dst.gap == GapPolicy::AfterGap {
                prop_assert!(placed <= s.place(later).unwrap());
            }
            prop_assert_eq!(placed, oracle_place(&s.tz, wall, dst));
        }
    }
}
