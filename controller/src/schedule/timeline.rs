//! A SingletonJob's periods: the union of its schedules, with excluded days skipped or shifted
//! to the next allowed day. Everything that decides or shows periods goes through this type, so
//! the controller, `status.nextScheduleTimes` and `kubectl singleton schedule` agree.
//!
//! The union is a merge of sorted streams in which equal instants are one period. A shift moves an
//! instant only later (to the same wall time on a later day), so each excluded day becomes one
//! more sorted stream in the merge, started when the schedule reaches that day (see `Shifted`).

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

use super::exclusions::MAX_SHIFT_DAYS;
use super::{DstPolicy, ExcludedAction, Exclusions, ScheduleError, Single, count_until};

const ONE_NANO: SignedDuration = SignedDuration::from_nanos(1);

/// The most schedules one SingletonJob may list.
pub const MAX_SCHEDULES: usize = 20;

/// The periods of a SingletonJob.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// At least one, all in the same time zone.
    parts: Vec<Single>,
    exclusions: Option<Exclusions>,
    /// With `NextAllowedDay`: only instants after this are moved; an excluded day's instants at
    /// or before it are dropped (see [`Schedule::with_shift_floor`]).
    shift_floor: Option<Timestamp>,
    /// `startAt` and `endAt`: instants outside them are not periods (see [`Schedule::with_bounds`]).
    bounds: Bounds,
}

/// The first and last instants a period may have (`startAt`, `endAt`), both included.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    pub start: Option<Timestamp>,
    pub end: Option<Timestamp>,
}

impl Bounds {
    /// Whether an instant is within the bounds.
    pub fn contains(&self, t: Timestamp) -> bool {
        self.start.is_none_or(|s| t >= s) && self.end.is_none_or(|e| t <= e)
    }
}

impl From<Single> for Schedule {
    fn from(single: Single) -> Self {
        Schedule {
            parts: vec![single],
            exclusions: None,
            shift_floor: None,
            bounds: Bounds::default(),
        }
    }
}

impl Schedule {
    /// One expression; see [`Single::parse`] for the syntax.
    pub fn parse(
        expr: &str,
        time_zone: Option<&str>,
        dst: DstPolicy,
    ) -> Result<Schedule, ScheduleError> {
        Single::parse(expr, time_zone, dst).map(Schedule::from)
    }

    /// Several expressions whose instants are united: an instant two of them produce is one
    /// period.
    pub fn parse_all<S: AsRef<str>>(
        exprs: &[S],
        time_zone: Option<&str>,
        dst: DstPolicy,
    ) -> Result<Schedule, ScheduleError> {
        if exprs.is_empty() || exprs.len() > MAX_SCHEDULES {
            return Err(ScheduleError::Schedules(format!(
                "expected 1 to {MAX_SCHEDULES} expressions, found {}",
                exprs.len()
            )));
        }
        let parts = exprs
            .iter()
            .map(|e| Single::parse(e.as_ref(), time_zone, dst))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Schedule {
            parts,
            exclusions: None,
            shift_floor: None,
            bounds: Bounds::default(),
        })
    }

    /// The same schedule with days excluded (none if `exclusions` is empty).
    pub fn with_exclusions(mut self, exclusions: Exclusions) -> Schedule {
        self.exclusions = (!exclusions.is_empty()).then_some(exclusions);
        self
    }

    /// The same schedule where instants at or before `floor` are never moved to a later day
    /// (`NextAllowedDay`): on an excluded day they are dropped. A schedule or exclusions edit sets
    /// it to the edit's cursor: an instant that was due before the edit was decided under the old
    /// rules (it ran, or was recorded), and moving it past the edit would run its business period
    /// a second time under a new identity (F9), or fire it retroactively.
    pub fn with_shift_floor(mut self, floor: Option<Timestamp>) -> Schedule {
        self.shift_floor = floor;
        self
    }

    /// The same schedule with instants before `bounds.start` or after `bounds.end` dropped: they
    /// are not periods at all (not due, not recorded, not shown as next), so every decision and
    /// `kubectl singleton schedule` treat `startAt` and `endAt` alike. An instant an excluded day
    /// moves past `endAt` is dropped too.
    pub fn with_bounds(mut self, bounds: Bounds) -> Schedule {
        self.bounds = bounds;
        self
    }

    /// `startAt` and `endAt`.
    pub fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// Whether some days are excluded.
    pub fn has_exclusions(&self) -> bool {
        self.exclusions.is_some()
    }

    /// The excluded days' [`Exclusions::digest`], if any are excluded.
    pub fn exclusions_digest(&self) -> Option<&str> {
        self.exclusions.as_ref().map(Exclusions::digest)
    }

    /// The expressions as given, joined by `; `.
    pub fn expr(&self) -> String {
        let exprs: Vec<&str> = self.parts.iter().map(Single::expr).collect();
        exprs.join("; ")
    }

    /// The time zone wall times and days are read in.
    pub fn time_zone(&self) -> &TimeZone {
        self.parts[0].time_zone()
    }

    /// Whether the period at `t` falls on an excluded day and is therefore not run (Skipped,
    /// reason Excluded). With [`ExcludedAction::NextAllowedDay`] periods are on allowed days,
    /// except those with no allowed day within reach.
    pub fn excluded(&self, t: Timestamp) -> bool {
        self.exclusions
            .as_ref()
            .is_some_and(|x| x.excludes(self.day(t)))
    }

    /// The first period strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.iter_after(t).next()
    }

    /// Periods strictly after `t`, strictly increasing, lazily.
    pub fn iter_after(&self, t: Timestamp) -> Box<dyn Iterator<Item = Timestamp> + '_> {
        let from = match self.bounds.start.and_then(|s| s.checked_sub(ONE_NANO).ok()) {
            Some(before_start) => t.max(before_start),
            None => t,
        };
        match self.bounds.end {
            Some(end) => Box::new(self.unbounded_after(from).take_while(move |at| *at <= end)),
            None => self.unbounded_after(from),
        }
    }

    /// The latest period at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        let t = self.bounds.end.map_or(t, |e| t.min(e));
        self.unbounded_latest(t)
            .filter(|at| self.bounds.start.is_none_or(|s| *at >= s))
    }

    /// [`Schedule::iter_after`] without the bounds.
    fn unbounded_after(&self, t: Timestamp) -> Box<dyn Iterator<Item = Timestamp> + '_> {
        let Some(x) = self.shifting() else {
            return Box::new(self.merged_after(t));
        };
        // Instants of the excluded days just before `t`'s day (and of its own day, if excluded)
        // may be shifted past `t`: start with them.
        let day = self.day(t);
        let first = x.excluded_run_before(day);
        let from = if first < day || x.excludes(day) {
            self.start_of(first).map_or(t, |s| s - ONE_NANO).min(t)
        } else {
            t
        };
        Box::new(Shifted {
            schedule: self,
            exclusions: x,
            base: self.merged_after(from).boxed().peekable(),
            moved: Vec::new(),
            target: None,
            emitted_up_to: t,
        })
    }

    /// [`Schedule::latest_at_or_before`] without the bounds.
    fn unbounded_latest(&self, t: Timestamp) -> Option<Timestamp> {
        let mut bound = t;
        loop {
            let base = self
                .parts
                .iter()
                .filter_map(|p| p.latest_at_or_before(bound))
                .max()?;
            if self.shifting().is_none() {
                return Some(base);
            }
            // The forward scan covers the excluded days before `base` (see `iter_after`): if it
            // finds nothing at or before `t`, `base` was shifted past `t` together with its whole
            // run of excluded days, so look before that run.
            let from = base.checked_sub(ONE_NANO).ok()?;
            if let Some(found) = self.unbounded_after(from).take_while(|at| *at <= t).last() {
                return Some(found);
            }
            let x = self.exclusions.as_ref()?;
            let run = x.excluded_run_before(self.day(base));
            bound = self.start_of(run)?.checked_sub(ONE_NANO).ok()?.min(from);
        }
    }

    /// The latest period before `t` that runs (not on an excluded day: with
    /// [`ExcludedAction::Skip`] those are periods too, recorded Skipped), looking back over at most
    /// a year of excluded days.
    pub fn running_before(&self, t: Timestamp) -> Option<Timestamp> {
        let mut at = self.latest_at_or_before(t.checked_sub(ONE_NANO).ok()?)?;
        for _ in 0..=MAX_SHIFT_DAYS {
            if !self.excluded(at) {
                return Some(at);
            }
            // Every period of an excluded day is excluded: go on before that day.
            let day = self.start_of(self.day(at))?;
            at = self.latest_at_or_before(day.checked_sub(ONE_NANO).ok()?)?;
        }
        None
    }

    /// The first period after `t` that runs (see [`Schedule::running_before`]).
    pub fn running_after(&self, t: Timestamp) -> Option<Timestamp> {
        let mut at = self.next_after(t)?;
        for _ in 0..=MAX_SHIFT_DAYS {
            if !self.excluded(at) {
                return Some(at);
            }
            let next_day = self.start_of(self.day(at).tomorrow().ok()?)?;
            at = self.next_after(next_day.checked_sub(ONE_NANO).ok()?)?;
        }
        None
    }

    /// Number of periods in (after, until], counting at most `cap`.
    pub fn count_between(&self, after: Timestamp, until: Timestamp, cap: u64) -> u64 {
        count_until(self.iter_after(after), until, cap)
    }

    /// Local wall time of an instant with its offset, e.g.
    /// "2027-03-28T03:00:00+02:00[Europe/Berlin]".
    pub fn local(&self, t: Timestamp) -> String {
        self.parts[0].local(t)
    }

    fn shifting(&self) -> Option<&Exclusions> {
        self.exclusions
            .as_ref()
            .filter(|x| x.action() == ExcludedAction::NextAllowedDay)
    }

    fn day(&self, t: Timestamp) -> Date {
        t.to_zoned(self.time_zone().clone()).date()
    }

    fn start_of(&self, day: Date) -> Option<Timestamp> {
        day.to_zoned(self.time_zone().clone())
            .ok()
            .map(|z| z.timestamp())
    }

    /// The union of the parts' instants after `t`.
    fn merged_after(&self, t: Timestamp) -> Merged<'_> {
        Merged {
            heads: self
                .parts
                .iter()
                .map(|p| Box::new(p.iter_after(t)) as Box<dyn Iterator<Item = Timestamp> + '_>)
                .map(Iterator::peekable)
                .collect(),
        }
    }

    /// Where an instant on an excluded day runs, one instant at a time: the tests' reference.
    #[cfg(test)]
    fn shift(&self, x: &Exclusions, t: Timestamp) -> Timestamp {
        let day = self.day(t);
        if !x.excludes(day) {
            return t;
        }
        x.next_allowed(day).map_or(t, |to| self.moved_to(to, t))
    }

    /// Where an instant of an excluded day runs: at its wall time on the allowed `day` (if the wall
    /// time does not exist that day, at the instant the time zone's rules give it).
    fn moved_to(&self, day: Date, t: Timestamp) -> Timestamp {
        let time = t.to_zoned(self.time_zone().clone()).time();
        day.to_datetime(time)
            .to_zoned(self.time_zone().clone())
            .map_or(t, |z| z.timestamp().max(t))
    }

    /// The instants of the excluded `day` from `first` on, each moved to its wall time on `to`,
    /// sorted, only those later than `after`.
    ///
    /// On days without an offset change wall times keep the instants' order, so the stream is
    /// lazy and starts at `after`'s wall time. Around a change (a gap or a fold on either day)
    /// they need not: that day is moved whole and sorted, at most a day of instants.
    fn moved_day(
        &self,
        day: Date,
        first: Timestamp,
        to: Date,
        after: Timestamp,
    ) -> Box<dyn Iterator<Item = Timestamp> + '_> {
        let end = day.tomorrow().ok().and_then(|d| self.start_of(d));
        let on_day = move |t: &Timestamp| end.is_none_or(|end| *t < end);
        let from = first.checked_sub(ONE_NANO).unwrap_or(first);
        let from = self.shift_floor.map_or(from, |f| from.max(f));
        if !(self.plain(day) && self.plain(to)) {
            let mut moved: Vec<Timestamp> = self
                .merged_after(from)
                .take_while(on_day)
                .map(|t| self.moved_to(to, t))
                .filter(|t| *t > after)
                .collect();
            moved.sort_unstable();
            moved.dedup();
            return Box::new(moved.into_iter());
        }
        let tz = self.time_zone().clone();
        let after_zoned = after.to_zoned(tz.clone());
        let from = match after_zoned.date().cmp(&to) {
            std::cmp::Ordering::Less => from,
            // Instants at or before `after`'s wall time move to or before `after`.
            std::cmp::Ordering::Equal => day
                .to_datetime(after_zoned.time())
                .to_zoned(tz)
                .map_or(from, |z| z.timestamp().max(from)),
            std::cmp::Ordering::Greater => return Box::new(std::iter::empty()),
        };
        Box::new(
            self.merged_after(from)
                .take_while(on_day)
                .map(move |t| self.moved_to(to, t)),
        )
    }

    /// Whether the time zone's offset stays the same from half a day before `day` to half a day
    /// after it, so that wall times on it map to instants one to one and in order.
    fn plain(&self, day: Date) -> bool {
        const MARGIN: SignedDuration = SignedDuration::from_hours(12);
        let window = self
            .start_of(day)
            .zip(day.tomorrow().ok().and_then(|d| self.start_of(d)));
        let Some((start, end)) = window else {
            return false;
        };
        let (Ok(start), Ok(end)) = (start.checked_sub(MARGIN), end.checked_add(MARGIN)) else {
            return false;
        };
        self.time_zone()
            .following(start)
            .next()
            .is_none_or(|change| change.timestamp() >= end)
    }
}

/// Sorted streams merged; equal instants once.
struct Merged<'a> {
    heads: Vec<Stream<'a>>,
}

impl<'a> Merged<'a> {
    fn boxed(self) -> Box<dyn Iterator<Item = Timestamp> + 'a> {
        Box::new(self)
    }
}

impl Iterator for Merged<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        let min = self
            .heads
            .iter_mut()
            .filter_map(|h| h.peek().copied())
            .min()?;
        for head in &mut self.heads {
            if head.peek() == Some(&min) {
                head.next();
            }
        }
        Some(min)
    }
}

type Stream<'a> = std::iter::Peekable<Box<dyn Iterator<Item = Timestamp> + 'a>>;

/// Instants with excluded days shifted; see the module docs.
///
/// Works a day at a time: when the schedule reaches an excluded day, that day's instants become
/// one sorted stream on the allowed day they move to, and the schedule jumps to the next day.
/// The output is the merge of the schedule and those streams. Every moved instant is later than
/// the excluded day it comes from, so once the schedule stands on an allowed day no stream still
/// to come can hold anything earlier than what the merge emits. An every-second schedule with a
/// year of excluded days thus costs a few steps per excluded day and per period, not every
/// instant of those days.
struct Shifted<'a> {
    schedule: &'a Schedule,
    exclusions: &'a Exclusions,
    /// The schedule's instants, excluded days with an allowed day to go to taken out.
    base: Stream<'a>,
    /// One stream per excluded day met, of its instants on their allowed day.
    moved: Vec<Stream<'a>>,
    /// The run of excluded days being taken out: its days up to `.0` move to `.1`.
    target: Option<(Date, Date)>,
    emitted_up_to: Timestamp,
}

impl Shifted<'_> {
    /// Takes the excluded days at the head of `base` out into `moved`, until `base` stands on an
    /// allowed day, on an instant with nowhere to go (which stays, as excluded), or later than a
    /// moved instant (which can then be emitted: what `base` still holds moves later still).
    fn take_out_excluded_days(&mut self) {
        while let Some(&at) = self.base.peek() {
            let earliest_moved = self
                .moved
                .iter_mut()
                .filter_map(|m| m.peek().copied())
                .min();
            if earliest_moved.is_some_and(|m| m < at) {
                return;
            }
            let day = self.schedule.day(at);
            let Some(to) = self.allowed_day_after(day) else {
                return;
            };
            let next_day = day.tomorrow().ok().and_then(|d| self.schedule.start_of(d));
            let Some(next_day) = next_day.and_then(|t| t.checked_sub(ONE_NANO).ok()) else {
                return;
            };
            let moved = self.schedule.moved_day(day, at, to, self.emitted_up_to);
            self.moved.push(moved.peekable());
            self.base = self.schedule.merged_after(next_day).boxed().peekable();
        }
    }

    /// The allowed day an excluded `day`'s instants move to; `None` if `day` is allowed or no
    /// allowed day is within reach. Days arrive in order, so a run's target is looked up once.
    fn allowed_day_after(&mut self, day: Date) -> Option<Date> {
        if let Some((_, to)) = self.target.filter(|(last, _)| day <= *last) {
            return Some(to);
        }
        if !self.exclusions.excludes(day) {
            return None;
        }
        let to = self.exclusions.next_allowed(day)?;
        self.target = to.yesterday().ok().map(|last| (last, to));
        Some(to)
    }
}

impl Iterator for Shifted<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        loop {
            self.take_out_excluded_days();
            let heads = self.moved.iter_mut().chain(std::iter::once(&mut self.base));
            let earliest = heads.filter_map(|h| h.peek().copied()).min()?;
            for head in self.moved.iter_mut().chain(std::iter::once(&mut self.base)) {
                if head.peek() == Some(&earliest) {
                    head.next();
                }
            }
            self.moved.retain_mut(|m| m.peek().is_some());
            if earliest > self.emitted_up_to {
                self.emitted_up_to = earliest;
                return Some(earliest);
            }
        }
    }
}

/// A period's start offset within `jitter_seconds`: the same for the same key (the SingletonJob)
/// and period on every replica and after every restart, spread over the window in milliseconds.
/// The period's identity (name, idempotency key, history) stays its instant.
pub fn jitter(key: &str, period: Timestamp, jitter_seconds: u32) -> SignedDuration {
    if jitter_seconds == 0 {
        return SignedDuration::ZERO;
    }
    let digest = Sha256::new()
        .chain_update(key.as_bytes())
        .chain_update([0])
        .chain_update(period.as_nanosecond().to_be_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let window_ms = u64::from(jitter_seconds) * 1000;
    SignedDuration::from_millis((u64::from_be_bytes(first) % window_ms) as i64)
}

/// Lines printed by `kubectl singleton schedule`: the next `n` periods
/// strictly after `from`, one per line, as the instant in RFC 3339 UTC, a
/// space, and [`Schedule::local`]. Lazy, so a long preview streams.
pub fn preview(
    schedule: &Schedule,
    from: Timestamp,
    n: usize,
) -> impl Iterator<Item = String> + '_ {
    schedule.iter_after(from).take(n).map(|at| {
        format!(
            "{} {}",
            at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            schedule.local(at)
        )
    })
}

#[cfg(test)]
mod tests;
