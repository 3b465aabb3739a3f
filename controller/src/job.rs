//! The Job of a run: built from the SingletonJob's template (with the run's environment, labels
//! and annotations), and read back (its token, its state as the decision core sees it).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::batch::v1::JobSpec;
use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, ObjectFieldSelector};
use kube::Resource;
use kube::api::ObjectMeta;

use crate::api::{CompletionDeadlinePolicy, LockPurpose, RunRef, SingletonJob};
use crate::decide::JobState;
use crate::naming::{
    ANNOTATION_RELEASED, ANNOTATION_RESUME_AT, ENV_ATTEMPT, ENV_BUSINESS_DATE, ENV_IDEMPOTENCY_KEY,
    ENV_JOB, ENV_NEXT_PERIOD, ENV_PERIOD, ENV_PERIOD_KEY, ENV_PREVIOUS_PERIOD, ENV_TIME_ZONE,
    ENV_TOKEN, LABEL_JOB, LABEL_KUEUE_QUEUE, LABEL_PERIOD, LABEL_TOKEN, NOT_RELEASED,
    idempotency_key, job_label, job_name, period_label, period_rfc3339,
};
use crate::schedule::Window;
use crate::{Error, Result};

/// Builds the Job for a run from the SingletonJob's template; `window` is where its period sits
/// in the schedule (told to the workload).
pub fn build(sj: &SingletonJob, period: Timestamp, token: u64, window: &Window) -> Result<Job> {
    let name = sj.metadata.name.clone().unwrap_or_default();
    let template = sj.spec.job_template.decode().map_err(Error::JobTemplate)?;
    let mut spec = template
        .spec
        .clone()
        .ok_or_else(|| Error::JobTemplate("jobTemplate.spec is required".into()))?;
    // History limits prune finished Jobs only after their outcome is recorded; a TTL could delete a
    // Job before any controller saw it finish, and then its period would look unrun.
    spec.ttl_seconds_after_finished = None;
    one_process_at_a_time(&mut spec, sj.purpose())?;

    // The idempotency key follows the backstop's job key, so the runs of one period in two
    // clusters (one jobKey, different names) send the same key (F8).
    let job_key = sj.backstop_key();
    // A neighbour that does not exist (the first period, the last) is an empty value, so that a
    // workload reading it finds the variable set either way.
    let neighbour = |t: Option<Timestamp>| t.map(period_rfc3339).unwrap_or_default();
    let env = [
        (ENV_JOB, job_key.clone()),
        (ENV_PERIOD, period_rfc3339(period)),
        (ENV_TOKEN, token.to_string()),
        (ENV_IDEMPOTENCY_KEY, idempotency_key(&job_key, period)),
        (ENV_PREVIOUS_PERIOD, neighbour(window.previous)),
        (ENV_NEXT_PERIOD, neighbour(window.next)),
        (ENV_TIME_ZONE, window.time_zone.clone()),
        (ENV_BUSINESS_DATE, window.business_date.clone()),
        (ENV_PERIOD_KEY, window.key.clone()),
    ];
    let pod = spec.template.spec.get_or_insert_with(Default::default);
    for c in pod
        .containers
        .iter_mut()
        .chain(pod.init_containers.iter_mut().flatten())
    {
        let vars = c.env.get_or_insert_with(Vec::new);
        vars.retain(|v| v.name != ENV_ATTEMPT && !env.iter().any(|(k, _)| v.name == *k));
        vars.extend(env.iter().map(|(k, v)| EnvVar {
            name: k.to_string(),
            value: Some(v.clone()),
            value_from: None,
        }));
        vars.push(attempt_env());
    }

    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut labels: BTreeMap<String, String> = tmeta.labels.unwrap_or_default();
    // A queue-managed template (suspended, Kueue): the queue may admit only a confirmed run, so
    // its queue label is added by the release after the confirm, not here.
    if spec.suspend == Some(true) {
        labels.remove(LABEL_KUEUE_QUEUE);
    }
    labels.insert(LABEL_JOB.into(), job_label(&name));
    labels.insert(LABEL_PERIOD.into(), period_label(period));
    labels.insert(LABEL_TOKEN.into(), token.to_string());
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(LABEL_JOB.into(), name.clone());
    annotations.insert(LABEL_PERIOD.into(), period_rfc3339(period));
    annotations.insert(LABEL_TOKEN.into(), token.to_string());
    // Not released yet: the resume (or the queue release) after the confirm sets the token here;
    // running without it means someone else started the Job (issue 31).
    annotations.insert(ANNOTATION_RELEASED.into(), NOT_RELEASED.into());

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

/// `SINGLETON_ATTEMPT`: the pod's own uid, from the downward API. Every pod of a run gets a
/// different one, which is what the fence tells attempts apart by.
fn attempt_env() -> EnvVar {
    EnvVar {
        name: ENV_ATTEMPT.to_string(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: "metadata.uid".into(),
            }),
            ..EnvVarSource::default()
        }),
    }
}

/// A run is one process at a time (G1 for attempts): Kubernetes starts no replacement pod while
/// the previous one is still terminating (`podReplacementPolicy: Failed`; its default starts one
/// as soon as a pod is deleted, evicted or its node stops answering, while the old one may still
/// run). Under `lock.purpose: Correctness` a template that asks for several pods at once
/// (`parallelism`, `completions`) or for early replacement is refused with the reason, never run;
/// under `Efficiency` (where a double run only wastes work) the template's own choice stands.
fn one_process_at_a_time(spec: &mut JobSpec, purpose: LockPurpose) -> Result<()> {
    const WHY: &str = "under lock.purpose: Correctness a run is one process at a time (use lock.purpose: Efficiency for runs of several pods)";
    if purpose == LockPurpose::Correctness {
        for (field, value) in [
            ("parallelism", spec.parallelism),
            ("completions", spec.completions),
        ] {
            if let Some(n) = value.filter(|n| *n > 1) {
                return Err(Error::JobTemplate(format!(
                    "jobTemplate.spec.{field} is {n}: it must be 1 (or unset) {WHY}"
                )));
            }
        }
        if let Some(p) = spec
            .pod_replacement_policy
            .as_deref()
            .filter(|p| *p != "Failed")
        {
            return Err(Error::JobTemplate(format!(
                "jobTemplate.spec.podReplacementPolicy is {p}: it must be Failed (or unset) {WHY}: a replacement pod would start while the old one still runs"
            )));
        }
    }
    spec.pod_replacement_policy
        .get_or_insert_with(|| "Failed".to_string());
    Ok(())
}

/// `completionDeadlinePolicy: Stop`: the Job's `activeDeadlineSeconds` ends it at its period's
/// completion deadline (Kubernetes counts it from when the Job is resumed, an instant after
/// `now`), or earlier if the template says so; at least 1 s, so a run started past its deadline
/// fails at once rather than never being stopped.
pub fn stop_at_deadline(job: &mut Job, sj: &SingletonJob, period: Timestamp, now: Timestamp) {
    if let Some(spec) = job.spec.as_mut()
        && let Some(limit) = deadline_left(sj, period, now)
    {
        spec.active_deadline_seconds =
            Some(spec.active_deadline_seconds.map_or(limit, |d| d.min(limit)));
    }
}

/// The `activeDeadlineSeconds` a run resumed at `now` gets: [`stop_at_deadline`] counted from
/// the resume, since Kubernetes starts the count there. A run confirmed long before it is
/// resumed (an outage between the two) is not given its whole deadline again (F10a).
pub fn active_deadline_at(sj: &SingletonJob, period: Timestamp, now: Timestamp) -> Option<i64> {
    let limit = deadline_left(sj, period, now)?;
    let template = sj
        .spec
        .job_template
        .decode()
        .ok()
        .and_then(|t| t.spec)
        .and_then(|s| s.active_deadline_seconds);
    Some(template.map_or(limit, |d| d.min(limit)))
}

/// Whole seconds from `now` to the period's completion deadline under `Stop`, rounded up, at
/// least 1.
fn deadline_left(sj: &SingletonJob, period: Timestamp, now: Timestamp) -> Option<i64> {
    if sj.spec.completion_deadline_policy != CompletionDeadlinePolicy::Stop {
        return None;
    }
    let seconds = sj.spec.completion_deadline_seconds?;
    let left = (period + SignedDuration::from_secs(seconds)).duration_since(now);
    let left = left.as_secs() + i64::from(left.subsec_nanos() > 0);
    Some(left.max(1))
}

/// Builds the Job of `run`, under the name its claim recorded: the period's own name, or a
/// re-run's ([`crate::naming::rerun_job_name`]).
pub fn for_run(sj: &SingletonJob, run: &RunRef, window: &Window) -> Result<Job> {
    let mut job = build(sj, run.period.0, run.token, window)?;
    job.metadata.name = Some(run.job_name.clone());
    // A prepared run's Job says when it may run: no one resumes it before (G4).
    if let Some(at) = &run.resume_at {
        job.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION_RESUME_AT.into(), at.0.to_string());
    }
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

    /// [`super::build`] for a period whose neighbours are unknown (most tests here need none).
    fn build(sj: &SingletonJob, period: Timestamp, token: u64) -> Result<Job> {
        super::build(sj, period, token, &Window::unknown(period))
    }

    /// Every container is told the period's window: its neighbours (empty when there is none),
    /// the time zone, the local date and the key; a template's own values of these names give
    /// way, as for the other variables.
    #[test]
    fn every_container_is_told_its_period_window() {
        let p: Timestamp = "2026-12-05T23:00:00Z".parse().unwrap();
        let container = serde_json::json!({"name": "w", "image": "x",
            "env": [{"name": "SINGLETON_BUSINESS_DATE", "value": "stale"}]});
        let t = serde_json::json!({"spec": {"template": {"spec": {"containers": [container],
            "initContainers": [{"name": "i", "image": "x"}]}}}});
        let sj = with_template(t, None);
        let window = Window {
            previous: Some("2026-12-04T23:00:00Z".parse().unwrap()),
            next: None,
            time_zone: "Europe/Berlin".into(),
            business_date: "2026-12-06".into(),
            key: "2026-12-06T00:00:00+01:00[Europe/Berlin]".into(),
        };
        let job = super::build(&sj, p, 3, &window).unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let env: BTreeMap<&str, Vec<&str>> =
                c.env.iter().flatten().fold(BTreeMap::new(), |mut m, v| {
                    m.entry(v.name.as_str())
                        .or_default()
                        .push(v.value.as_deref().unwrap_or("<from>"));
                    m
                });
            assert_eq!(env["SINGLETON_PREVIOUS_PERIOD"], ["2026-12-04T23:00:00Z"]);
            assert_eq!(env["SINGLETON_NEXT_PERIOD"], [""], "none: set, empty");
            assert_eq!(env["SINGLETON_TIME_ZONE"], ["Europe/Berlin"]);
            assert_eq!(env["SINGLETON_BUSINESS_DATE"], ["2026-12-06"], "{}", c.name);
            assert_eq!(
                env["SINGLETON_PERIOD_KEY"],
                ["2026-12-06T00:00:00+01:00[Europe/Berlin]"]
            );
            assert_eq!(env["SINGLETON_PERIOD"], ["2026-12-05T23:00:00Z"]);
        }
    }

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

    /// F10a: Kubernetes counts `activeDeadlineSeconds` from the resume. A run confirmed before an
    /// outage and resumed an hour later gets what is left of its completion deadline then, not
    /// the whole deadline again; the template's own smaller limit stands.
    #[test]
    fn a_late_resume_counts_the_completion_deadline_from_the_resume() {
        use CompletionDeadlinePolicy::{Continue, Stop};
        let period: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let stop = sj(Some(3600), Stop, None);
        assert_eq!(
            active_deadline_at(&stop, period, at("2027-01-01T06:50:00Z")),
            Some(600)
        );
        assert_eq!(
            active_deadline_at(&stop, period, at("2027-01-01T08:00:00Z")),
            Some(1)
        );
        let both = sj(Some(3600), Stop, Some(60));
        assert_eq!(
            active_deadline_at(&both, period, at("2027-01-01T06:00:00Z")),
            Some(60)
        );
        assert_eq!(
            active_deadline_at(&sj(Some(3600), Continue, None), period, period),
            None
        );
    }

    fn with_template(template: serde_json::Value, purpose: Option<LockPurpose>) -> SingletonJob {
        let mut sj = SingletonJob::new(
            "a",
            crate::api::SingletonJobSpec {
                schedule: "0 6 * * *".into(),
                lock: purpose.map(|purpose| crate::api::LockSpec { purpose }),
                job_template: template.into(),
                ..Default::default()
            },
        );
        sj.metadata.namespace = Some("ns".into());
        sj
    }

    fn pod_template(spec: serde_json::Value) -> serde_json::Value {
        let mut spec = spec;
        spec["template"] = serde_json::json!({"spec": {"restartPolicy": "Never",
            "initContainers": [{"name": "i", "image": "busybox"}],
            "containers": [{"name": "w", "image": "busybox",
                "env": [{"name": "SINGLETON_ATTEMPT", "value": "forged"}]}]}});
        serde_json::json!({ "spec": spec })
    }

    /// F1: Kubernetes must not overlap pods of a run. The Job gets `podReplacementPolicy:
    /// Failed` (no replacement while the old pod still terminates); under Correctness a template
    /// asking for several pods at once or for early replacement is refused with the reason (no
    /// run), under Efficiency its choice stands.
    #[test]
    fn a_run_is_one_process_at_a_time() {
        let p: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let plain = with_template(pod_template(serde_json::json!({})), None);
        let job = build(&plain, p, 1).unwrap();
        assert_eq!(
            job.spec.unwrap().pod_replacement_policy.as_deref(),
            Some("Failed")
        );
        for (field, value) in [
            ("parallelism", serde_json::json!(2)),
            ("completions", serde_json::json!(3)),
            (
                "podReplacementPolicy",
                serde_json::json!("TerminatingOrFailed"),
            ),
        ] {
            let t = pod_template(serde_json::json!({ field: value }));
            let err = build(&with_template(t.clone(), None), p, 1)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(field) && err.contains("one process at a time"),
                "{err}"
            );
            let err = build(
                &with_template(t.clone(), Some(LockPurpose::Correctness)),
                p,
                1,
            );
            assert!(err.is_err());
            let ok = build(&with_template(t, Some(LockPurpose::Efficiency)), p, 1).unwrap();
            let spec = ok.spec.unwrap();
            assert!(
                spec.parallelism == Some(2)
                    || spec.completions == Some(3)
                    || spec.pod_replacement_policy.as_deref() == Some("TerminatingOrFailed"),
                "Efficiency keeps the template's {field}"
            );
        }
        let one = pod_template(serde_json::json!({"parallelism": 1, "completions": 1}));
        assert!(build(&with_template(one, None), p, 1).is_ok());
    }

    /// Every container of a run gets its pod's uid as SINGLETON_ATTEMPT (the downward API), in
    /// place of any value the template set: the fence tells the pods of a run apart by it.
    #[test]
    fn every_container_gets_its_pod_uid_as_the_attempt() {
        let p: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let job = build(
            &with_template(pod_template(serde_json::json!({})), None),
            p,
            7,
        )
        .unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        for c in pod
            .containers
            .iter()
            .chain(pod.init_containers.iter().flatten())
        {
            let attempts: Vec<&EnvVar> = c
                .env
                .iter()
                .flatten()
                .filter(|v| v.name == ENV_ATTEMPT)
                .collect();
            assert_eq!(attempts.len(), 1, "{}", c.name);
            let field = attempts[0]
                .value_from
                .as_ref()
                .and_then(|v| v.field_ref.as_ref());
            assert_eq!(field.map(|f| f.field_path.as_str()), Some("metadata.uid"));
            assert!(attempts[0].value.is_none());
        }
    }

    /// F2: a run is created not released; a queue-managed template's queue label is withheld
    /// until the release after the confirm, so the queue can admit only a confirmed run.
    #[test]
    fn a_queued_runs_label_waits_for_its_release() {
        let p: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let mut t = pod_template(serde_json::json!({"suspend": true}));
        t["metadata"] = serde_json::json!({"labels": {LABEL_KUEUE_QUEUE: "billing", "team": "a"}});
        let job = build(&with_template(t.clone(), None), p, 1).unwrap();
        let labels = job.metadata.labels.unwrap();
        assert!(!labels.contains_key(LABEL_KUEUE_QUEUE));
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        let released = job.metadata.annotations.unwrap();
        assert_eq!(
            released.get(ANNOTATION_RELEASED).map(String::as_str),
            Some(NOT_RELEASED)
        );
        // Not queue-managed: the label is the template's business.
        t["spec"]["suspend"] = serde_json::json!(false);
        let job = build(&with_template(t, None), p, 1).unwrap();
        assert!(job.metadata.labels.unwrap().contains_key(LABEL_KUEUE_QUEUE));
    }

    /// F8: the idempotency key and the jitter follow the backstop's job key, so two clusters'
    /// SingletonJobs of one `jobKey` under different names send the same key to a payment API and
    /// start at the same offset; other job keys differ.
    #[test]
    fn one_job_key_gives_one_idempotency_key_and_jitter() {
        let p: Timestamp = "2027-01-01T06:00:00Z".parse().unwrap();
        let sj = |ns: &str, name: &str, key: Option<&str>| {
            let mut s = with_template(pod_template(serde_json::json!({})), None);
            s.metadata.name = Some(name.into());
            s.metadata.namespace = Some(ns.into());
            s.spec.jitter_seconds = Some(600);
            s.spec.backstop = key.map(|k| crate::api::BackstopSpec {
                job_key: Some(k.into()),
                ..Default::default()
            });
            s
        };
        let key_of = |s: &SingletonJob| {
            let job = build(s, p, 1).unwrap();
            let c = &job.spec.unwrap().template.spec.unwrap().containers[0];
            let v = c
                .env
                .iter()
                .flatten()
                .find(|v| v.name == ENV_IDEMPOTENCY_KEY)
                .unwrap();
            v.value.clone().unwrap()
        };
        let west = sj("billing-west", "invoices", Some("billing/invoices"));
        let east = sj("billing", "invoices-east", Some("billing/invoices"));
        assert_eq!(key_of(&west), key_of(&east));
        assert_eq!(west.jitter(p), east.jitter(p));
        let other = sj("billing", "invoices-east", None);
        assert_ne!(key_of(&other), key_of(&east));
        let offsets: std::collections::BTreeSet<_> = (0..8)
            .map(|i| {
                other.jitter(p + SignedDuration::from_hours(i))
                    == east.jitter(p + SignedDuration::from_hours(i))
            })
            .collect();
        assert!(
            offsets.contains(&false),
            "another job key picks other offsets"
        );
    }
}
