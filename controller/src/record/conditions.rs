//! Status conditions following the Kubernetes API conventions: `lastTransitionTime` changes only
//! when `status` does, and `observedGeneration` says which spec the condition is about.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

pub const READY: &str = "Ready";
pub const SCHEDULE_VALID: &str = "ScheduleValid";
pub const SUSPENDED: &str = "Suspended";
pub const CLOCK_TRUSTED: &str = "ClockTrusted";
pub const JOB_TEMPLATE_VALID: &str = "JobTemplateValid";
pub const BACKSTOP_READY: &str = "BackstopReady";
/// False after the status was found behind the SingletonJob's own Jobs and raised to them.
pub const STATUS_CONSISTENT: &str = "StatusConsistent";
/// True once no period will come (`endAt` passed, `maxRuns` reached, or bounds that hold no
/// period); only for a SingletonJob with `startAt`, `endAt` or `maxRuns`.
pub const ENDED: &str = "Ended";
/// How runs are prepared ahead of their instants (issue 33); only while a lead is in effect.
pub const PREPARATION: &str = "Preparation";

/// Sets (or adds) a condition; returns whether anything a reader would notice changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    ok: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let status = if ok { "True" } else { "False" };
    let message = message.into();
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == type_) {
        let changed = c.status != status
            || c.reason != reason
            || c.message != message
            || c.observed_generation != generation;
        if c.status != status {
            c.last_transition_time = now.into();
        }
        c.status = status.into();
        c.reason = reason.into();
        c.message = message;
        c.observed_generation = generation;
        changed
    } else {
        conditions.push(Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time: now.into(),
        });
        true
    }
}

/// The condition of this type, if it was set for `generation`.
pub fn for_generation<'a>(
    conditions: &'a [Condition],
    type_: &str,
    generation: Option<i64>,
) -> Option<&'a Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == type_ && c.observed_generation == generation)
}

pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0: Timestamp = "2027-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2027-01-01T00:01:00Z".parse().unwrap();
        let mut cs = vec![];
        assert!(set(&mut cs, READY, true, "Scheduled", "ok", Some(1), t0));
        assert!(!set(&mut cs, READY, true, "Scheduled", "ok", Some(1), t1));
        assert_eq!(cs[0].last_transition_time.0, t0);
        assert!(set(&mut cs, READY, false, "Bad", "no", Some(2), t1));
        assert_eq!(cs[0].last_transition_time.0, t1);
        assert!(!is_true(&cs, READY));
    }
}
