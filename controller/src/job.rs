//! The Job of a run: built from the SingletonJob's template (with the run's environment, labels
//! and annotations), and read back (its token, its state as the decision core sees it).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::EnvVar;
use kube::Resource;
use kube::api::ObjectMeta;

use crate::api::{CompletionDeadlinePolicy, RunRef, SingletonJob};
use crate::decide::JobState;
use crate::naming::{
    ENV_IDEMPOTENCY_KEY, ENV_JOB, ENV_PERIOD, ENV_TOKEN, LABEL_JOB, LABEL_PERIOD, LABEL_TOKEN,
    idempotency_key, job_label, job_name, period_label, period_rfc3339,
};
use crate::{Error, Result};

/// Builds the Job for a run from the SingletonJob's template.
pub fn build(sj: &SingletonJob, period: Timestamp, token: u64) -> Result<Job> {
    let name = sj.metadata.name.clone().unwrap_or_default();
    let template = sj.spec.job_template.decode().map_err(Error::JobTemplate)?;
    let mut spec = template
        .spec
        .clone()
        .ok_or_else(|| Error::JobTemplate("jobTemplate.spec is required".into()))?;
    // History limits prune finished Jobs only after their outcome is recorded; a TTL could delete a
    // Job before any controller saw it finish, and then its period would look unrun.
    spec.ttl_seconds_after_finished = None;

    let env = [
        (ENV_JOB, sj.backstop_key()),
        (ENV_PERIOD, period_rfc3339(period)),
        (ENV_TOKEN, token.to_string()),
        (ENV_IDEMPOTENCY_KEY, idempotency_key(&sj.key(), period)),
    ];
    let pod = spec.template.spec.get_or_insert_with(Default::default);
    for c in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        let vars = c.env.get_or_insert_with(Vec::new);
        vars.retain(|v| !env.iter().any(|(k, _)| v.name == *k));
        vars.extend(env.iter().map(|(k, v)| EnvVar {
            name: k.to_string(),
            value: Some(v.clone()),
            value_from: None,
        }));
    }

    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = tmeta.labels.unwrap_or_default();
    labels.insert(LABEL_JOB.into(), job_label(&name));
    labels.insert(LABEL_PERIOD.into(), period_label(period));
    labels.insert(LABEL_TOKEN.into(), token.to_string());
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(LABEL_JOB.into(), name.clone());
    annotations.insert(LABEL_PERIOD.into(), period_rfc3339(period));
    annotations.insert(LABEL_TOKEN.into(), token.to_string());

    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(&name, period)),
            namespace: sj.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: sj.controller_owner_ref(&()).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// `completionDeadlinePolicy: Stop`: the Job's `activeDeadlineSeconds` ends it at its period's
/// completion deadline (Kubernetes counts it from when the Job is resumed, an instant after
/// `now`), or earlier if the template says so; at least 1 s, so a run started past its deadline
/// fails at once rather than never being stopped.
pub fn stop_at_deadline(job: &mut Job, sj: &SingletonJob, period: Timestamp, now: Timestamp) {
    if sj.spec.completion_deadline_policy != CompletionDeadlinePolicy::Stop {
        return;
    }
    let Some(seconds) = sj.spec.completion_deadline_seconds else {
        return;
    };
    let left = (period + SignedDuration::from_secs(seconds)).duration_since(now);
    let left = left.as_secs() + i64::from(left.subsec_nanos() > 0);
    if let Some(spec) = job.spec.as_mut() {
        let limit = left.max(1);
        spec.active_deadline_seconds =
            Some(spec.active_deadline_seconds.map_or(limit, |d| d.min(limit)));
    }
}

/// Builds the Job of `run`, under the name its claim recorded: the period's own name, or a
/// re-run's ([`crate::naming::rerun_job_name`]).
pub fn for_run(sj: &SingletonJob, run: &RunRef) -> Result<Job> {
    let mut job = build(sj, run.period.0, run.token)?;
    job.metadata.name = Some(run.job_name.clone());
    Ok(job)
}

/// The fencing token a Job was created with, from its annotation.
pub fn token(job: &Job) -> Option<u64> {
    job.metadata
        .annotations
        .as_ref()?
        .get(LABEL_TOKEN)?
        .parse()
        .ok()
}

/// The state of a Job as the decision core sees it.
pub fn state(job: &Job) -> JobState {
    let status = job.status.as_ref();
    let conds = status.and_then(|s| s.conditions.as_ref());
    let done = |types: &[&str]| {
        conds.and_then(|cs| {
            cs.iter()
                .find(|c| types.contains(&c.type_.as_str()) && c.status == "True")
                .map(|c| {
                    c.last_transition_time
                        .as_ref()
                        .map(|t| t.0)
                        .unwrap_or_else(Timestamp::now)
                })
        })
    };
    if let Some(at) = done(&["Complete"]) {
        JobState::Succeeded(
            status
                .and_then(|s| s.completion_time.as_ref())
                .map(|t| t.0)
                .unwrap_or(at),
        )
    } else if let Some(at) = done(&["Failed"]) {
        JobState::Failed(at)
    } else {
        JobState::Active
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sj(
        deadline: Option<i64>,
        policy: CompletionDeadlinePolicy,
        template_deadline: Option<i64>,
    ) -> SingletonJob {
        let template = serde_json::json!({"spec": {
            "activeDeadlineSeconds": template_deadline,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "busybox"}]}}
        }});
        let mut sj = SingletonJob::new(
            "a",
            crate::api::SingletonJobSpec {
                schedule: "0 6 * * *".into(),
                completion_deadline_seconds: deadline,
                completion_deadline_policy: policy,
                job_template: template.into(),
                ..Default::default()
            },
        );
        sj.metadata.namespace = Some("ns".into());
        sj
    }

    fn limit(s: &SingletonJob, now: &str) -> Option<i64> {
        let period: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let mut job = build(s, period, 1).unwrap();
        stop_at_deadline(&mut job, s, period, now.parse().unwrap());
        job.spec.unwrap().active_deadline_seconds
    }

    #[test]
    fn stop_ends_the_job_at_its_completion_deadline() {
        use CompletionDeadlinePolicy::{Continue, Stop};
        let stop = sj(Some(3600), Stop, None);
        assert_eq!(limit(&stop, "2027-01-01T06:00:00Z"), Some(3600));
        assert_eq!(
            limit(&stop, "2027-01-01T06:10:00.5Z"),
            Some(3000),
            "rounded up"
        );
        assert_eq!(
            limit(&stop, "2027-01-01T09:00:00Z"),
            Some(1),
            "past it: at once"
        );
        assert_eq!(
            limit(&sj(Some(3600), Stop, Some(60)), "2027-01-01T06:00:00Z"),
            Some(60)
        );
        assert_eq!(
            limit(&sj(Some(3600), Continue, None), "2027-01-01T06:00:00Z"),
            None
        );
        assert_eq!(limit(&sj(None, Stop, None), "2027-01-01T06:00:00Z"), None);
    }
}
