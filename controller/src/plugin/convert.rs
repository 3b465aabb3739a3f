//! `kubectl singleton convert cronjob/NAME`: the SingletonJob that does what a CronJob does,
//! with every difference in behaviour it brings named. Pure: a function of the CronJob read, so
//! each CronJob feature is tested without a cluster. The switch itself (`--apply`) is
//! [`super::switch`].

use k8s_openapi::api::batch::v1::CronJob;
use kube::ResourceExt;
use serde_json::{Map, Value, json};

use super::error::PluginError;
use crate::api::SingletonJob;
use crate::schedule::{DstPolicy, Schedule};

/// Marks a SingletonJob made by `convert --apply`, naming its CronJob, so that a repeated
/// `--apply` finishes the switch instead of refusing an existing object.
pub const ANNOTATION_CONVERTED_FROM: &str = "singleton.dev/converted-from";

/// A CronJob's equivalent: the SingletonJob and what behaves differently, for the user to read.
#[derive(Debug)]
pub struct Conversion {
    pub singleton_job: SingletonJob,
    pub differences: Vec<String>,
}

/// The SingletonJob for `cj`: schedule (a `TZ=`/`CRON_TZ=` prefix moved to `timeZone`),
/// timeZone, concurrencyPolicy (CronJob's default, Allow, written out), startingDeadlineSeconds,
/// suspend, history limits, jobTemplate, and the CronJob's labels and annotations other than
/// kubectl's own. `now` is when the zone's daylight-saving changes are looked for.
pub fn convert(cj: &CronJob, now: jiff::Timestamp) -> Result<Conversion, PluginError> {
    let name = cj.name_any();
    let spec = cj
        .spec
        .as_ref()
        .ok_or_else(|| PluginError::Usage(format!("cronjob {name} has no spec")))?;
    let (schedule, prefix_zone) = split_zone_prefix(&spec.schedule);
    let time_zone = spec.time_zone.clone().or(prefix_zone.clone());
    let parsed = Schedule::parse(&schedule, time_zone.as_deref(), DstPolicy::default())
        .map_err(|e| PluginError::Usage(format!("cronjob {name}: {e}")))?;
    let concurrency = spec.concurrency_policy.as_deref().unwrap_or("Allow");
    let mut sj_spec = Map::new();
    sj_spec.insert("schedule".into(), json!(schedule));
    if let Some(zone) = &time_zone {
        sj_spec.insert("timeZone".into(), json!(zone));
    }
    sj_spec.insert("concurrencyPolicy".into(), json!(concurrency));
    // CronJob starts at most the newest missed schedule: catchUp Latest, written out.
    sj_spec.insert("catchUp".into(), json!("Latest"));
    let optional = [
        (
            "startingDeadlineSeconds",
            spec.starting_deadline_seconds.map(Value::from),
        ),
        ("suspend", spec.suspend.map(Value::from)),
        (
            "successfulJobsHistoryLimit",
            spec.successful_jobs_history_limit.map(Value::from),
        ),
        (
            "failedJobsHistoryLimit",
            spec.failed_jobs_history_limit.map(Value::from),
        ),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            sj_spec.insert(key.into(), value);
        }
    }
    let template =
        serde_json::to_value(&spec.job_template).map_err(|e| PluginError::Encode(e.to_string()))?;
    sj_spec.insert("jobTemplate".into(), template);
    let object = json!({
        "apiVersion": "singleton.dev/v1alpha1",
        "kind": "SingletonJob",
        "metadata": {
            "name": name,
            "namespace": cj.namespace(),
            "labels": cj.labels(),
            "annotations": kept_annotations(cj),
        },
        "spec": sj_spec,
    });
    let singleton_job: SingletonJob =
        serde_json::from_value(object).map_err(|e| PluginError::Encode(e.to_string()))?;
    let facts = Facts {
        prefix_zone,
        time_zone,
        concurrency_set: spec.concurrency_policy.is_some(),
        deadline_set: spec.starting_deadline_seconds.is_some(),
        zone_has_changes: has_offset_changes(&parsed, now),
        template_ttl: spec
            .job_template
            .spec
            .as_ref()
            .is_some_and(|j| j.ttl_seconds_after_finished.is_some()),
    };
    Ok(Conversion {
        singleton_job,
        differences: differences(&facts),
    })
}

/// The CronJob's name from `cronjob/NAME` (also `cronjobs/`, `cj/`, `cronjob.batch/`) or `NAME`.
pub fn cronjob_name(arg: &str) -> Result<&str, PluginError> {
    let name = match arg.split_once('/') {
        None => arg,
        Some(("cronjob" | "cronjobs" | "cj" | "cronjob.batch" | "cronjobs.batch", name)) => name,
        Some((kind, _)) => {
            return Err(PluginError::Usage(format!(
                "convert takes a CronJob (cronjob/NAME), not {kind}"
            )));
        }
    };
    if name.is_empty() {
        return Err(PluginError::Usage(
            "convert needs a CronJob's name: cronjob/NAME".into(),
        ));
    }
    Ok(name)
}

/// `TZ=Zone rest` or `CRON_TZ=Zone rest` → (rest, Zone); otherwise the schedule as it is.
fn split_zone_prefix(schedule: &str) -> (String, Option<String>) {
    let trimmed = schedule.trim();
    for prefix in ["CRON_TZ=", "TZ="] {
        if let Some(rest) = trimmed.strip_prefix(prefix)
            && let Some((zone, expr)) = rest.split_once(char::is_whitespace)
        {
            return (expr.trim().to_string(), Some(zone.to_string()));
        }
    }
    (trimmed.to_string(), None)
}

/// The CronJob's annotations without kubectl's and the API server's bookkeeping.
fn kept_annotations(cj: &CronJob) -> Map<String, Value> {
    cj.annotations()
        .iter()
        .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io/"))
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect()
}

/// Whether the schedule's zone changes its offset within the next 400 days (daylight saving).
fn has_offset_changes(schedule: &Schedule, now: jiff::Timestamp) -> bool {
    let horizon = now + jiff::SignedDuration::from_hours(400 * 24);
    schedule
        .time_zone()
        .following(now)
        .next()
        .is_some_and(|change| change.timestamp() < horizon)
}

/// What [`differences`] needs to know about the CronJob.
struct Facts {
    prefix_zone: Option<String>,
    time_zone: Option<String>,
    concurrency_set: bool,
    deadline_set: bool,
    zone_has_changes: bool,
    template_ttl: bool,
}

/// Each way the SingletonJob behaves differently from the CronJob, in words.
fn differences(f: &Facts) -> Vec<String> {
    let mut out = vec![
        "Each period runs at most once, also across controller failovers, and each run gets a \
         fencing token (SINGLETON_FENCING_TOKEN) that only increases; a CronJob can start a \
         period twice."
            .to_string(),
        "Jobs are named <name>-<seconds since the epoch of the period> (CronJob: <name>-<minutes>) \
         and carry singleton.dev/* labels; selectors on the CronJob's Job names or labels must \
         change."
            .to_string(),
        "Run now with `kubectl singleton trigger` (a manual period with its own token) instead \
         of `kubectl create job --from=cronjob/...` (kubernetes#47538)."
            .to_string(),
    ];
    if f.template_ttl {
        out.push(
            "The template's ttlSecondsAfterFinished is removed from each Job: finished Jobs are \
             pruned by the history limits once their outcome is recorded."
                .to_string(),
        );
    }
    if let Some(zone) = &f.prefix_zone {
        out.push(format!(
            "The schedule's {zone} prefix (TZ= or CRON_TZ=, which CronJob no longer accepts in new \
             objects) is spec.timeZone."
        ));
    }
    if f.time_zone.is_none() {
        out.push(
            "The CronJob has no timeZone, so it ran in kube-controller-manager's local time \
             zone; the SingletonJob reads its schedule in UTC. If that process did not run in \
             UTC, set spec.timeZone."
                .to_string(),
        );
    }
    if !f.concurrency_set {
        out.push(
            "concurrencyPolicy: Allow is CronJob's default, written out; the SingletonJob's \
             own default is Forbid."
                .to_string(),
        );
    }
    out.push(if f.deadline_set {
        "Late periods: the newest within startingDeadlineSeconds starts (catchUp: Latest, as \
         CronJob does); each older one is recorded Missed with a reason and an Event."
            .to_string()
    } else {
        "Late periods: the newest starts however late (catchUp: Latest) and each older one is \
         recorded Missed; there is no 100-missed-schedules cliff, after which older CronJob \
         versions stop scheduling (kubernetes/website#51861 documents the change)."
            .to_string()
    });
    if f.zone_has_changes {
        out.push(
            "Daylight-saving changes: a wall time the clocks skip runs once, at the jump (CronJob \
             skips it); a wall time that occurs twice runs once, at its first occurrence (CronJob \
             runs it twice). spec.dstPolicy can choose Shift or Last."
                .to_string(),
        );
    }
    out
}

/// The conversion as the command prints it: the differences as YAML comments, then the object.
pub fn render(conversion: &Conversion, cronjob: &str) -> Result<String, PluginError> {
    let mut out = format!("# Converted from cronjob {cronjob} by kubectl singleton convert.\n");
    out.push_str("# What behaves differently:\n");
    for difference in &conversion.differences {
        out.push_str(&comment_wrapped(difference));
    }
    let yaml = serde_yaml::to_string(&conversion.singleton_job)
        .map_err(|e| PluginError::Encode(e.to_string()))?;
    out.push_str(&yaml);
    Ok(out)
}

/// One difference as a `# - ` item wrapped at 100 columns.
fn comment_wrapped(text: &str) -> String {
    let mut out = String::new();
    let mut line = String::from("# -");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > 100 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#  ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CatchUp, ConcurrencyPolicy};

    fn cronjob(spec: Value) -> CronJob {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {
                "name": "nightly",
                "namespace": "billing",
                "labels": {"team": "payments"},
                "annotations": {
                    "owner": "payments@example.com",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}"
                }
            },
            "spec": spec,
        }))
        .unwrap()
    }

    fn now() -> jiff::Timestamp {
        "2027-01-15T12:00:00Z".parse().unwrap()
    }

    fn convert_at(cj: &CronJob) -> Result<Conversion, PluginError> {
        convert(cj, now())
    }

    fn template() -> Value {
        json!({"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "run", "image": "busybox", "args": ["true"]}]
        }}}})
    }

    #[test]
    fn every_cronjob_field_is_carried_over() {
        let cj = cronjob(json!({
            "schedule": "30 2 * * 1-5",
            "timeZone": "Europe/Berlin",
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 300,
            "suspend": true,
            "successfulJobsHistoryLimit": 5,
            "failedJobsHistoryLimit": 2,
            "jobTemplate": {"spec": {"ttlSecondsAfterFinished": 60, "template": template()["spec"]["template"]}},
        }));
        let c = convert(&cj, now()).unwrap();
        let sj = &c.singleton_job;
        assert_eq!(sj.name_any(), "nightly");
        assert_eq!(sj.namespace().as_deref(), Some("billing"));
        assert_eq!(
            sj.labels().get("team").map(String::as_str),
            Some("payments")
        );
        assert_eq!(sj.annotations().len(), 1, "kubectl's annotation dropped");
        let s = &sj.spec;
        assert_eq!(s.schedule, "30 2 * * 1-5");
        assert_eq!(s.time_zone.as_deref(), Some("Europe/Berlin"));
        assert_eq!(s.concurrency_policy, ConcurrencyPolicy::Forbid);
        assert_eq!(s.catch_up, CatchUp::Latest);
        assert_eq!(s.starting_deadline_seconds, Some(300));
        assert_eq!(s.suspend, Some(true));
        assert_eq!(s.successful_jobs_history_limit, Some(5));
        assert_eq!(s.failed_jobs_history_limit, Some(2));
        let job = s.job_template.decode().unwrap();
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("busybox"));
        let all = c.differences.join("\n");
        assert!(all.contains("Daylight-saving"), "{all}");
        assert!(all.contains("within startingDeadlineSeconds"), "{all}");
        assert!(all.contains("ttlSecondsAfterFinished"), "{all}");
        assert!(
            !all.contains("no timeZone") && !all.contains("CronJob's default"),
            "{all}"
        );
    }

    #[test]
    fn defaults_and_a_zone_prefix_are_written_out_and_named() {
        let cj = cronjob(json!({
            "schedule": "CRON_TZ=America/New_York 0 9 * * *",
            "jobTemplate": template(),
        }));
        let c = convert(&cj, now()).unwrap();
        let s = &c.singleton_job.spec;
        assert_eq!(s.schedule, "0 9 * * *");
        assert_eq!(s.time_zone.as_deref(), Some("America/New_York"));
        assert_eq!(s.concurrency_policy, ConcurrencyPolicy::Allow);
        assert_eq!(s.suspend, None);
        let all = c.differences.join("\n");
        assert!(all.contains("America/New_York prefix"), "{all}");
        assert!(all.contains("CronJob's default"), "{all}");
        assert!(all.contains("100-missed-schedules"), "{all}");

        let utc = convert_at(&cronjob(
            json!({"schedule": "TZ=UTC */5 * * * *", "jobTemplate": template()}),
        ))
        .unwrap();
        assert_eq!(utc.singleton_job.spec.time_zone.as_deref(), Some("UTC"));
        assert!(!utc.differences.join("\n").contains("Daylight-saving"));

        let local = convert_at(&cronjob(
            json!({"schedule": "@hourly", "jobTemplate": template()}),
        ))
        .unwrap();
        assert_eq!(local.singleton_job.spec.time_zone, None);
        assert!(
            local
                .differences
                .join("\n")
                .contains("kube-controller-manager's local time")
        );
    }

    #[test]
    fn a_schedule_the_controller_cannot_read_is_refused_with_the_reason() {
        let e = convert_at(&cronjob(
            json!({"schedule": "0 0 30 2 *", "jobTemplate": template()}),
        ))
        .unwrap_err();
        assert!(e.to_string().contains("never fires"), "{e}");
        let e = convert_at(&cronjob(json!({
            "schedule": "0 0 * * *", "timeZone": "Mars/Olympus", "jobTemplate": template()
        })))
        .unwrap_err();
        assert!(e.to_string().contains("unknown time zone"), "{e}");
    }

    #[test]
    fn the_cronjob_is_named_as_kubectl_names_it() {
        assert_eq!(cronjob_name("cronjob/nightly").unwrap(), "nightly");
        assert_eq!(cronjob_name("cj/nightly").unwrap(), "nightly");
        assert_eq!(cronjob_name("nightly").unwrap(), "nightly");
        assert!(
            cronjob_name("deployment/web")
                .unwrap_err()
                .to_string()
                .contains("not deployment")
        );
        assert!(cronjob_name("cronjob/").is_err());
    }

    #[test]
    fn the_output_is_commented_yaml_that_reads_back() {
        let cj = cronjob(json!({"schedule": "*/15 * * * *", "jobTemplate": template()}));
        let c = convert(&cj, now()).unwrap();
        let text = render(&c, "billing/nightly").unwrap();
        assert!(
            text.starts_with("# Converted from cronjob billing/nightly"),
            "{text}"
        );
        assert!(
            text.lines()
                .take_while(|l| l.starts_with('#'))
                .all(|l| l.len() <= 100)
        );
        let back: SingletonJob = serde_yaml::from_str(&text).unwrap();
        assert_eq!(back.spec.schedule, "*/15 * * * *");
        assert_eq!(back.spec.job_template, c.singleton_job.spec.job_template);
    }
}
