//! A SingletonJob's periods: the union of its schedules, with excluded days skipped or shifted
//! to the next allowed day. Everything that decides or shows periods goes through this type, so
//! the controller, `status.nextScheduleTimes` and `kubectl singleton schedule` agree.
//!
//! The union is a merge of sorted streams in which equal instants are one period. A shift moves an
//! instant only later (to the same wall time on a later day), so shifted instants are ordered the
//! way `Upcoming` orders DST-shifted ones: held back until the next unshifted instant shows that
//! nothing earlier can still come.

use std::collections::BTreeSet;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use sha2::{Digest, Sha256};

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
}

impl From<Single> for Schedule {
    fn from(single: Single) -> Self {
        Schedule {
            parts: vec![single],
            exclusions: None,
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
        })
    }

    /// The same schedule with days excluded (none if `exclusions` is empty).
    pub fn with_exclusions(mut self, exclusions: Exclusions) -> Schedule {
        self.exclusions = (!exclusions.is_empty()).then_some(exclusions);
        self
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
            base: (Box::new(self.merged_after(from)) as Box<dyn Iterator<Item = Timestamp>>)
                .peekable(),
            emitted_up_to: t,
            pending: BTreeSet::new(),
        })
    }

    /// The latest period at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
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
            if let Some(found) = self.iter_after(from).take_while(|at| *at <= t).last() {
                return Some(found);
            }
            let x = self.exclusions.as_ref()?;
            let run = x.excluded_run_before(self.day(base));
            bound = self.start_of(run)?.checked_sub(ONE_NANO).ok()?.min(from);
        }
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

    /// Where an instant on an excluded day runs: the same wall time on the next allowed day (if
    /// the wall time does not exist that day, at the instant the time zone's rules give it).
    fn shift(&self, x: &Exclusions, t: Timestamp) -> Timestamp {
        let zoned = t.to_zoned(self.time_zone().clone());
        if !x.excludes(zoned.date()) {
            return t;
        }
        x.next_allowed(zoned.date())
            .and_then(|day| {
                day.to_datetime(zoned.time())
                    .to_zoned(self.time_zone().clone())
                    .ok()
            })
            .map_or(t, |z| z.timestamp().max(t))
    }
}

/// Sorted streams merged; equal instants once.
struct Merged<'a> {
    heads: Vec<std::iter::Peekable<Box<dyn Iterator<Item = Timestamp> + 'a>>>,
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

/// Instants with excluded days shifted; see the module docs.
struct Shifted<'a> {
    schedule: &'a Schedule,
    exclusions: &'a Exclusions,
    base: std::iter::Peekable<Box<dyn Iterator<Item = Timestamp> + 'a>>,
    emitted_up_to: Timestamp,
    pending: BTreeSet<Timestamp>,
}

impl Iterator for Shifted<'_> {
    type Item = Timestamp;

    fn next(&mut self) -> Option<Timestamp> {
        loop {
            if let Some(&earliest) = self.pending.first() {
                // A later base instant is never shifted earlier than itself.
                let settled = self.base.peek().is_none_or(|next| earliest <= *next);
                if settled {
                    self.pending.pop_first();
                    if earliest > self.emitted_up_to {
                        self.emitted_up_to = earliest;
                        return Some(earliest);
                    }
                    continue;
                }
            }
            let at = self.base.next()?;
            let shifted = self.schedule.shift(self.exclusions, at);
            if shifted > self.emitted_up_to {
                self.pending.insert(shifted);
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
