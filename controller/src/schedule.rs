//! Temporary stand-in with the agreed API; replaced by the real schedule engine.
use jiff::{Timestamp, civil::DateTime, tz::TimeZone};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a wall time inside a spring-forward gap is placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum GapPolicy {
    #[default]
    AfterGap,
    Shift,
}
/// How a wall time repeated by a fall-back fold is placed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FoldPolicy {
    #[default]
    First,
    Last,
}
/// DST policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DstPolicy {
    #[serde(default)]
    pub gap: GapPolicy,
    #[serde(default)]
    pub fold: FoldPolicy,
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ScheduleError {
    #[error("invalid cron expression {expr:?}: {message}")]
    InvalidCron { expr: String, message: String },
    #[error("unknown time zone {0:?} (expected an IANA name such as Europe/Berlin)")]
    UnknownTimeZone(String),
    #[error("cron expression {0:?} never fires")]
    NeverFires(String),
}

#[derive(Clone, Debug)]
pub struct Schedule {
    cron: croner::Cron,
    tz: TimeZone,
    expr: String,
}
impl Schedule {
    pub fn parse(
        expr: &str,
        time_zone: Option<&str>,
        _dst: DstPolicy,
    ) -> Result<Schedule, ScheduleError> {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| ScheduleError::InvalidCron {
                expr: expr.into(),
                message: e.to_string(),
            })?;
        let tz = match time_zone {
            None | Some("") => TimeZone::UTC,
            Some(n) => TimeZone::get(n).map_err(|_| ScheduleError::UnknownTimeZone(n.into()))?,
        };
        Ok(Schedule {
            cron,
            tz,
            expr: expr.into(),
        })
    }
    pub fn expr(&self) -> &str {
        &self.expr
    }
    pub fn time_zone(&self) -> &TimeZone {
        &self.tz
    }
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.iter_after(t).next()
    }
    pub fn iter_after(&self, t: Timestamp) -> impl Iterator<Item = Timestamp> + '_ {
        let civil: DateTime = t.to_zoned(self.tz.clone()).datetime();
        self.cron
            .iter_after(civil)
            .filter_map(move |c| self.tz.to_ambiguous_timestamp(c).compatible().ok())
            .filter(move |x| *x > t)
    }
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        let civil: DateTime = t.to_zoned(self.tz.clone()).datetime();
        self.cron
            .iter_from(civil, croner::Direction::Backward)
            .filter_map(|c| self.tz.to_ambiguous_timestamp(c).compatible().ok())
            .find(|x| *x <= t)
    }
    pub fn count_between(&self, after: Timestamp, until: Timestamp, cap: u64) -> u64 {
        self.iter_after(after)
            .take_while(|x| *x <= until)
            .take(cap as usize)
            .count() as u64
    }
    pub fn local(&self, t: Timestamp) -> String {
        t.to_zoned(self.tz.clone()).to_string()
    }
}
pub fn preview(schedule: &Schedule, from: Timestamp, n: usize) -> Vec<String> {
    schedule
        .iter_after(from)
        .take(n)
        .map(|t| format!("{} {}", t.strftime("%Y-%m-%dT%H:%M:%SZ"), schedule.local(t)))
        .collect()
}
