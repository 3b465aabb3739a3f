//! The SingletonJob YAML most tests apply.

/// The Job template used by most tests: one container, completed by the fake node.
pub fn sj_yaml(name: &str, schedule: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: "{schedule}"
{extra_spec}
  jobTemplate:
    spec:
      backoffLimit: 0
      template:
        spec:
          restartPolicy: Never
          containers:
          - name: work
            image: busybox
            command: ["sh", "-c", "echo $SINGLETON_FENCING_TOKEN"]
"#
    )
}

/// A SingletonJob YAML from [`sj_yaml`] whose Jobs never get a node, so its runs stay active.
pub fn never_scheduled(yaml: String) -> String {
    yaml.replace(
        "          restartPolicy: Never\n",
        "          restartPolicy: Never\n          nodeSelector:\n            singleton.dev/no-such-node: \"true\"\n",
    )
}

/// The fencing token a Job was created with (its `singleton.dev/fencing-token` annotation), 0 if
/// none.
pub fn token_of(job: &k8s_openapi::api::batch::v1::Job) -> u64 {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("singleton.dev/fencing-token"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_default()
}

/// The periods of these Jobs (their `singleton.dev/period` annotations), sorted.
pub fn periods(jobs: &[k8s_openapi::api::batch::v1::Job]) -> Vec<jiff::Timestamp> {
    let mut v: Vec<jiff::Timestamp> = jobs
        .iter()
        .filter_map(|j| {
            j.metadata
                .annotations
                .as_ref()?
                .get("singleton.dev/period")?
                .parse()
                .ok()
        })
        .collect();
    v.sort();
    v
}

/// A 6-field cron that fires once, at `at` (whole seconds, UTC).
pub fn once_at(at: jiff::Timestamp) -> String {
    let t = at.to_zoned(jiff::tz::TimeZone::UTC);
    format!(
        "{} {} {} {} {} *",
        t.second(),
        t.minute(),
        t.hour(),
        t.day(),
        t.month()
    )
}

/// Levels of nesting inside [`poisoned`]'s template: past serde_json's limit of 128 with what is
/// above it.
pub const DEPTH: usize = 130;

/// A SingletonJob labelled [`crate::RUN_LABEL`]`=run` whose job template holds a field nested
/// [`DEPTH`] levels deep, as JSON (a client built on serde_json cannot decode it, so it goes
/// through kubectl: [`crate::kubectl_stdin`]).
pub fn poisoned(ns: &str, name: &str, run: &str) -> String {
    let nested = format!("{}1{}", r#"{"a":"#.repeat(DEPTH), "}".repeat(DEPTH));
    let label = crate::RUN_LABEL;
    format!(
        r#"{{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJob",
        "metadata":{{"name":"{name}","namespace":"{ns}","labels":{{"{label}":"{run}"}}}},
        "spec":{{"schedule":"*/2 * * * * *","jobTemplate":{{"spec":{{"template":{{"spec":{{
          "restartPolicy":"Never","containers":[{{"name":"work","image":"busybox"}}]}}}},
          "deep":{nested}}}}}}}}}"#
    )
}
