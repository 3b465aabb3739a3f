//! The bad-input battery: malformed and hostile SingletonJobs (and Secrets) applied while a good
//! one runs. Each is either refused by the API server (CRD schema or CEL) with a message, or
//! accepted and given a clear False condition with a message, and no Job. The controller never
//! exits or panics, never shows a Secret's password, and the good SingletonJob keeps its schedule.
//!
//! Adding a case is one line in `cases()`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use e2e::{Env, ensure, sj_yaml};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use singleton::api::SingletonJob;

/// The password in the credentials case: it must never appear in status, Events or the log.
const PASSWORD: &str = "Hunter2-e2e-S3cret-pw";

/// What must become of a case.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// `create` fails (422/400) and the message contains this text.
    Refused(&'static str),
    /// Accepted; the condition of this type becomes False with a message containing the text.
    False(&'static str, &'static str),
    /// Accepted and valid: it runs (at least one Job); `ttlSecondsAfterFinished` is stripped,
    /// and each Job carries the controller's own labels, namespace and owner whatever the
    /// template says.
    Runs,
    /// Accepted and valid: a run finished and is in `status.history` (its Job may be gone
    /// already, as with history limits of 0).
    Ran,
}
use Expect::*;

struct Case {
    /// Also the SingletonJob's name unless the YAML says otherwise.
    name: &'static str,
    yaml: String,
    expect: Expect,
}

fn c(name: &'static str, yaml: String, expect: Expect) -> Case {
    Case { name, yaml, expect }
}

/// A SingletonJob with this schedule and extra spec lines (two-space indented).
fn sj(name: &str, schedule: &str, extra: &str) -> String {
    sj_yaml(name, schedule, extra)
}

/// A valid every-2-seconds SingletonJob with extra spec lines.
fn ok(name: &str, extra: &str) -> String {
    sj(name, "*/2 * * * * *", extra)
}

/// A SingletonJob whose `spec.template.spec` (pod spec) is `pod` (indented 10 spaces).
fn pod(name: &str, pod: &str) -> String {
    format!(
        "apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: \"*/2 * * * * *\"
  jobTemplate:
    spec:
      template:
        spec:
{pod}"
    )
}

/// A SingletonJob with this `jobTemplate` (indented 4 spaces), or none.
fn template(name: &str, tpl: &str) -> String {
    format!(
        "apiVersion: singleton.dev/v1alpha1
kind: SingletonJob
metadata:
  name: {name}
spec:
  schedule: \"*/2 * * * * *\"
{tpl}"
    )
}

fn backstop(name: &str, secret: &str, extra: &str) -> String {
    ok(
        name,
        &format!("  backstop:\n    postgres:\n      secretRef: {{name: \"{secret}\"}}\n{extra}"),
    )
}

const CONTAINER: &str = "          restartPolicy: Never
          containers:
          - name: work
            image: busybox
";

// One line per case: rustfmt would spread each over several.
#[rustfmt::skip]
fn cases() -> Vec<Case> {
    let long = "x".repeat(300);
    vec![
        // Schedules.
        c("cron-7-fields", sj("cron-7-fields", "* * * * * * *", ""), Refused("schedule must have 5 fields")),
        c("cron-4-fields", sj("cron-4-fields", "* * * *", ""), Refused("schedule must have 5 fields")),
        c("cron-1-field", sj("cron-1-field", "hourly", ""), Refused("schedule must have 5 fields")),
        c("cron-empty", sj("cron-empty", "", ""), Refused("spec.schedule")),
        c("cron-blank", sj("cron-blank", "     ", ""), Refused("schedule must have 5 fields")),
        c("cron-300-chars", sj("cron-300-chars", &format!("{long} * * * *"), ""), Refused("spec.schedule")),
        c("cron-minute-61", sj("cron-minute-61", "61 * * * *", ""), False("ScheduleValid", "")),
        c("cron-hour-24", sj("cron-hour-24", "0 24 * * *", ""), False("ScheduleValid", "")),
        c("cron-dom-32", sj("cron-dom-32", "0 0 32 * *", ""), False("ScheduleValid", "")),
        c("cron-month-13", sj("cron-month-13", "0 0 1 13 *", ""), False("ScheduleValid", "")),
        c("cron-dow-8", sj("cron-dow-8", "0 0 * * 8", ""), False("ScheduleValid", "")),
        c("cron-second-60", sj("cron-second-60", "60 * * * * *", ""), False("ScheduleValid", "")),
        c("cron-feb-30", sj("cron-feb-30", "0 0 30 2 *", ""), False("ScheduleValid", "")),
        c("cron-reboot", sj("cron-reboot", "@reboot", ""), False("ScheduleValid", "")),
        c("cron-every-0s", sj("cron-every-0s", "@every 0s", ""), False("ScheduleValid", "from 1s")),
        c("cron-at", sj("cron-at", "@", ""), False("ScheduleValid", "")),
        c("cron-garbage", sj("cron-garbage", "hello world how are you", ""), False("ScheduleValid", "")),
        c("cron-unicode", sj("cron-unicode", "★ * * * *", ""), False("ScheduleValid", "")),
        c("cron-negative", sj("cron-negative", "-1 * * * *", ""), False("ScheduleValid", "")),
        c("cron-step-0", sj("cron-step-0", "*/0 * * * *", ""), False("ScheduleValid", "")),
        c("cron-reversed-range", sj("cron-reversed-range", "0 11-2 * * *", ""), False("ScheduleValid", "reversed")),
        c("cron-empty-list", sj("cron-empty-list", "0 0 , * *", ""), False("ScheduleValid", "lists no value")),
        c("cron-bare-l-weekday", sj("cron-bare-l-weekday", "0 0 * * L", ""), False("ScheduleValid", "needs a weekday")),
        c("cron-huge-number", sj("cron-huge-number", "99999999999999999999 * * * *", ""), False("ScheduleValid", "")),
        // Time zones.
        c("tz-unknown", ok("tz-unknown", "  timeZone: Mars/Olympus_Mons\n"), False("ScheduleValid", "")),
        c("tz-offset", ok("tz-offset", "  timeZone: UTC+25\n"), False("ScheduleValid", "")),
        c("tz-shell", ok("tz-shell", "  timeZone: \"Europe/Berlin; rm -rf /\"\n"), Refused("timeZone must be an IANA name")),
        c("tz-path", ok("tz-path", "  timeZone: ../../etc/passwd\n"), Refused("timeZone must be an IANA name")),
        c("tz-empty", ok("tz-empty", "  timeZone: \"\"\n"), Refused("timeZone")),
        c("tz-long", ok("tz-long", &format!("  timeZone: {}\n", "A".repeat(100))), Refused("timeZone")),
        // Numbers.
        c("deadline-negative", ok("deadline-negative", "  startingDeadlineSeconds: -1\n"), Refused("startingDeadlineSeconds")),
        c("deadline-zero", ok("deadline-zero", "  startingDeadlineSeconds: 0\n"), Refused("startingDeadlineSeconds")),
        c("deadline-huge", ok("deadline-huge", "  startingDeadlineSeconds: 1000000000000\n"), Refused("startingDeadlineSeconds")),
        c("deadline-string", ok("deadline-string", "  startingDeadlineSeconds: soon\n"), Refused("startingDeadlineSeconds")),
        c("history-negative", ok("history-negative", "  successfulJobsHistoryLimit: -5\n"), Refused("successfulJobsHistoryLimit")),
        c("history-huge", ok("history-huge", "  failedJobsHistoryLimit: 1000000\n"), Refused("failedJobsHistoryLimit")),
        // Names.
        // Events about an object are named after it plus 17 characters (at most 253 in all).
        c("name-230", ok(&"n".repeat(230), ""), Runs),
        c("name-231", ok(&"n".repeat(231), ""), Refused("230")),
        c("name-253", ok(&"n".repeat(253), ""), Refused("230")),
        c("name-254", ok(&"n".repeat(254), ""), Refused("")),
        c("name-unicode", ok("jöb-ünïcode", ""), Refused("")),
        c("name-emoji", ok("job-💥", ""), Refused("")),
        c("name-upper", ok("Invoices", ""), Refused("")),
        // Enums and types.
        c("catchup-sometimes", ok("catchup-sometimes", "  catchUp: Sometimes\n"), Refused("catchUp")),
        c("policy-lower", ok("policy-lower", "  concurrencyPolicy: forbid\n"), Refused("concurrencyPolicy")),
        c("purpose-unknown", ok("purpose-unknown", "  lock: {purpose: Maybe}\n"), Refused("purpose")),
        c("suspend-string", ok("suspend-string", "  suspend: \"yes please\"\n"), Refused("suspend")),
        c("dst-unknown", ok("dst-unknown", "  dstPolicy: {gap: Whenever}\n"), Refused("gap")),
        // Job templates.
        c("template-missing", template("template-missing", ""), Refused("jobTemplate")),
        c("template-string", template("template-string", "  jobTemplate: run my job\n"), Refused("jobTemplate")),
        c("template-no-spec", template("template-no-spec", "  jobTemplate: {metadata: {labels: {a: b}}}\n"), False("JobTemplateValid", "")),
        c("template-restart-always", pod("template-restart-always", "          restartPolicy: Always\n          containers:\n          - {name: work, image: busybox}\n"), False("JobTemplateValid", "restartPolicy")),
        c("template-no-containers", pod("template-no-containers", "          restartPolicy: Never\n          containers: []\n"), False("JobTemplateValid", "containers")),
        c("template-pull-policy", pod("template-pull-policy", &format!("{CONTAINER}            imagePullPolicy: Sometimes\n")), False("JobTemplateValid", "imagePullPolicy")),
        c("template-bad-container-name", pod("template-bad-container-name", "          restartPolicy: Never\n          containers:\n          - {name: Bad_Name, image: busybox}\n"), False("JobTemplateValid", "")),
        // Stored by the API server (the template keeps unknown fields); the controller decodes
        // the template only when building a Job, so this object stays readable and is reported.
        c("template-wrong-type", pod("template-wrong-type", &format!("{CONTAINER}          activeDeadlineSeconds: soon\n")), False("JobTemplateValid", "")),
        c("template-negative-backoff", template("template-negative-backoff", &format!("  jobTemplate:\n    spec:\n      backoffLimit: -3\n      template:\n        spec:\n{CONTAINER}")), False("JobTemplateValid", "backoffLimit")),
        c("template-ttl", template("template-ttl", &format!("  jobTemplate:\n    spec:\n      ttlSecondsAfterFinished: 0\n      template:\n        spec:\n{CONTAINER}")), Runs),
        // Several schedules, excluded days, jitter, deadlines, failures (issue 21).
        c("schedules-and-schedule", ok("schedules-and-schedule", "  schedules: [\"0 * * * *\"]\n"), Refused("set exactly one of schedule and schedules")),
        c("schedules-empty", sj("schedules-empty", "", "  schedules: []\n").replace("  schedule: \"\"\n", ""), Refused("spec.schedules")),
        c("schedules-21", sj("schedules-21", "", &format!("  schedules: [{}]\n", vec!["\"* * * * *\""; 21].join(", "))).replace("  schedule: \"\"\n", ""), Refused("spec.schedules")),
        c("schedules-4-fields", sj("schedules-4-fields", "", "  schedules: [\"0 * * * *\", \"* * * *\"]\n").replace("  schedule: \"\"\n", ""), Refused("each of schedules must have 5 fields")),
        c("schedules-one-invalid", sj("schedules-one-invalid", "", "  schedules: [\"*/2 * * * * *\", \"0 0 30 2 *\"]\n").replace("  schedule: \"\"\n", ""), False("ScheduleValid", "never fires")),
        c("exclusion-bad-date", ok("exclusion-bad-date", "  exclusions:\n    dates: [\"2027-02-30\"]\n"), False("ScheduleValid", "invalid date")),
        c("exclusion-reversed-range", ok("exclusion-reversed-range", "  exclusions:\n    ranges: [{from: \"2027-05-02\", to: \"2027-05-01\"}]\n"), False("ScheduleValid", "ends before it starts")),
        c("exclusion-day-rule-fields", ok("exclusion-day-rule-fields", "  exclusions:\n    days: [\"0 0 * * SAT\"]\n"), False("ScheduleValid", "expected 3 fields")),
        c("exclusion-missing-calendar", ok("exclusion-missing-calendar", "  exclusions:\n    calendars: [no-such-calendar]\n"), False("ScheduleValid", "no-such-calendar")),
        c("exclusion-bad-action", ok("exclusion-bad-action", "  exclusions:\n    action: Tomorrow\n"), Refused("action")),
        c("exclusion-date-long", ok("exclusion-date-long", &format!("  exclusions:\n    dates: [\"{long}\"]\n")), Refused("dates")),
        c("jitter-negative", ok("jitter-negative", "  jitterSeconds: -1\n"), Refused("jitterSeconds")),
        c("jitter-over-a-day", ok("jitter-over-a-day", "  jitterSeconds: 86401\n"), Refused("jitterSeconds")),
        c("completion-deadline-zero", ok("completion-deadline-zero", "  completionDeadlineSeconds: 0\n"), Refused("completionDeadlineSeconds")),
        c("completion-policy-unknown", ok("completion-policy-unknown", "  completionDeadlinePolicy: Kill\n"), Refused("completionDeadlinePolicy")),
        c("failures-zero", ok("failures-zero", "  suspendAfterConsecutiveFailures: 0\n"), Refused("suspendAfterConsecutiveFailures")),
        // Backstops.
        c("backstop-missing-secret", backstop("backstop-missing-secret", "no-such-secret", ""), False("BackstopReady", "not found")),
        c("backstop-unlabelled", backstop("backstop-unlabelled", "bad-unlabelled", ""), False("BackstopReady", "label")),
        c("backstop-nowhere", backstop("backstop-nowhere", "bad-nowhere", ""), False("BackstopReady", "")),
        c("backstop-credentials", backstop("backstop-credentials", "bad-credentials", ""), False("BackstopReady", "")),
        c("backstop-sslmode", backstop("backstop-sslmode", "bad-sslmode", ""), False("BackstopReady", "sslmode")),
        c("backstop-garbage-url", backstop("backstop-garbage-url", "bad-garbage-url", ""), False("BackstopReady", "")),
        c("backstop-empty-secret", backstop("backstop-empty-secret", "bad-empty", ""), False("BackstopReady", "")),
        c("backstop-bad-port", backstop("backstop-bad-port", "bad-port", ""), False("BackstopReady", "port")),
        // Not PostgreSQL (an HTTP server), with the default sslmode (verify-full) and in plain text.
        c("backstop-not-postgres", backstop("backstop-not-postgres", "bad-not-postgres", ""), False("BackstopReady", "does not speak the PostgreSQL protocol")),
        c("backstop-not-postgres-plain", backstop("backstop-not-postgres-plain", "bad-not-postgres-plain", ""), False("BackstopReady", "does not speak the PostgreSQL protocol")),
        c("backstop-prefix-injection", backstop("backstop-prefix-injection", "bad-nowhere", "      tablePrefix: \"Robert'); DROP TABLE students;--\"\n"), Refused("tablePrefix")),
        c("backstop-prefix-upper", backstop("backstop-prefix-upper", "bad-nowhere", "      tablePrefix: Claims_\n"), Refused("tablePrefix")),
        c("backstop-prefix-long", backstop("backstop-prefix-long", "bad-nowhere", &format!("      tablePrefix: {}\n", "p".repeat(40))), Refused("tablePrefix")),
        c("backstop-secret-empty-name", backstop("backstop-secret-empty-name", "", ""), Refused("secretRef")),
        c("backstop-secret-long-name", backstop("backstop-secret-long-name", &long, ""), Refused("secretRef")),
        // A backstop that names no database must not silently run without one.
        c("backstop-no-kind", ok("backstop-no-kind", "  backstop: {}\n"), Refused("backstop")),
        // Limits (issue 19).
        c("template-namespace-override", template("template-namespace-override", &format!("  jobTemplate:\n    metadata: {{namespace: kube-system}}\n    spec:\n      template:\n        spec:\n{CONTAINER}")), Runs),
        c("template-owner-override", template("template-owner-override", &format!("  jobTemplate:\n    metadata:\n      ownerReferences: [{{apiVersion: v1, kind: ConfigMap, name: other, uid: 00000000-0000-0000-0000-000000000001, controller: true}}]\n    spec:\n      template:\n        spec:\n{CONTAINER}")), Runs),
        c("template-label-spoof", template("template-label-spoof", &format!("  jobTemplate:\n    metadata:\n      labels: {{singleton.dev/job: good, singleton.dev/fencing-token: \"999999\", singleton.dev/period: \"1\"}}\n      annotations: {{singleton.dev/job: good, singleton.dev/fencing-token: \"999999\"}}\n    spec:\n      template:\n        spec:\n{CONTAINER}")), Runs),
        c("template-oversize", template("template-oversize", &format!("  jobTemplate:\n    metadata:\n      annotations: {{big: \"{}\"}}\n    spec:\n      template:\n        spec:\n{CONTAINER}", "x".repeat(100 * 1024))), False("JobTemplateValid", "more than the limit of 65536 bytes")),
        c("annotation-oversize", ok("annotation-oversize", "").replace("metadata:\n", &format!("metadata:\n  annotations: {{singleton.dev/trigger: \"{}\"}}\n", "x".repeat(300 * 1024))), Refused("annotations")),
        c("label-oversize", ok("label-oversize", "").replace("metadata:\n", &format!("metadata:\n  labels: {{singleton.dev/job: \"{}\"}}\n", "x".repeat(64))), Refused("labels")),
        c("history-zero", ok("history-zero", "  successfulJobsHistoryLimit: 0\n  failedJobsHistoryLimit: 0\n"), Ran),
        c("deadline-ten-years", ok("deadline-ten-years", "  startingDeadlineSeconds: 315360000\n  catchUp: All\n"), Runs),
        c("catchup-limit-zero", ok("catchup-limit-zero", "  catchUpLimit: 0\n"), Refused("catchUpLimit")),
        c("catchup-limit-huge", ok("catchup-limit-huge", "  catchUpLimit: 10001\n"), Refused("catchUpLimit")),
        c("max-active-zero", ok("max-active-zero", "  concurrencyPolicy: Allow\n  maxActive: 0\n"), Refused("maxActive")),
        c("max-active-huge", ok("max-active-huge", "  concurrencyPolicy: Allow\n  maxActive: 1001\n"), Refused("maxActive")),
        c("max-active-one", ok("max-active-one", "  concurrencyPolicy: Allow\n  maxActive: 1\n"), Runs),
        c("backstop-secret-dots", backstop("backstop-secret-dots", "db.backstop.v1", ""), False("BackstopReady", "not found")),
        c("backstop-secret-upper", backstop("backstop-secret-upper", "Bad-Upper", ""), Refused("should match")),
        c("backstop-secret-slash", backstop("backstop-secret-slash", "../kube-system/db", ""), Refused("should match")),
        c("backstop-secret-space", backstop("backstop-secret-space", "db name", ""), Refused("should match")),
        // Noisy neighbours (issue 19): a server that accepts and never answers is reported within
        // the operation timeout; a host outside --backstop-allowed-hosts is refused untried.
        c("backstop-blackholed", backstop("backstop-blackholed", "bad-blackhole", ""), False("BackstopReady", "timed out")),
        c("backstop-host-not-allowed", backstop("backstop-host-not-allowed", "bad-not-allowed", ""), False("BackstopReady", "not in the controller's allowed backstop hosts")),
        c("backstop-name-not-allowed", backstop("backstop-name-not-allowed", "bad-name-not-allowed", ""), False("BackstopReady", "not in the controller's allowed backstop hosts")),
    ]
}

/// A Secret: name, labelled for the backstop, string data.
type SecretSpec = (&'static str, bool, Vec<(&'static str, String)>);

/// The Secrets the backstop cases refer to (labelled unless said otherwise).
async fn secrets(env: &Env) -> Result<()> {
    let http = http_server().await?;
    let not_pg = format!("postgres://u:{PASSWORD}@127.0.0.1:{http}/db");
    let items: [SecretSpec; 9] = [
        ("bad-not-postgres", true, vec![("url", not_pg.clone())]),
        (
            "bad-not-postgres-plain",
            true,
            vec![("url", not_pg), ("sslmode", "disable".into())],
        ),
        (
            "bad-unlabelled",
            false,
            vec![("url", "postgres://u@127.0.0.1:1/db".into())],
        ),
        (
            "bad-nowhere",
            true,
            vec![("url", "postgres://u@127.0.0.1:1/db".into())],
        ),
        (
            "bad-credentials",
            true,
            vec![(
                "url",
                format!("postgres://admin:{PASSWORD}@127.0.0.1:1/db?sslmode=disable"),
            )],
        ),
        (
            "bad-sslmode",
            true,
            vec![
                ("url", "postgres://u@127.0.0.1:1/db".into()),
                ("sslmode", "sometimes".into()),
            ],
        ),
        (
            "bad-garbage-url",
            true,
            vec![("url", "¡not a url at all!".into())],
        ),
        ("bad-empty", true, vec![]),
        (
            "bad-port",
            true,
            vec![
                ("host", "127.0.0.1".into()),
                ("port", "99999".into()),
                ("user", "u".into()),
            ],
        ),
    ];
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, labelled, data) in items {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        if labelled {
            s.metadata.labels =
                Some([("singleton.dev/backstop".to_string(), "true".to_string())].into());
        }
        s.string_data = Some(data.into_iter().map(|(k, v)| (k.into(), v)).collect());
        api.create(&PostParams::default(), &s).await?;
    }
    Ok(())
}

/// An HTTP server for the not-PostgreSQL backstops: every connection gets a 400 and is closed.
/// It lives as long as the test's runtime. Returns its port.
async fn http_server() -> Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let _ = sock
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    Ok(port)
}

/// The Secrets of the noisy-neighbour cases: a black hole (a listener that accepts and never
/// answers, owned by the returned proxy) and hosts outside the battery's allow-list.
async fn noisy_secrets(env: &Env) -> Result<e2e::Proxy> {
    let hole = e2e::Proxy::start(std::net::SocketAddr::from(([127, 0, 0, 1], 1))).await?;
    hole.stall();
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, url) in [
        (
            "bad-blackhole",
            format!("postgres://u@127.0.0.1:{}/db?sslmode=disable", hole.port),
        ),
        (
            "bad-not-allowed",
            "postgres://u@10.1.2.3:5432/db".to_string(),
        ),
        (
            "bad-name-not-allowed",
            "postgres://u@db.example.invalid:5432/db".to_string(),
        ),
    ] {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.labels =
            Some([("singleton.dev/backstop".to_string(), "true".to_string())].into());
        s.string_data = Some([("url".to_string(), url)].into());
        api.create(&PostParams::default(), &s).await?;
    }
    Ok(hole)
}

/// Creates a SingletonJob from raw YAML (no client-side typing, so the API server judges it).
async fn create_raw(env: &Env, yaml: &str) -> Result<std::result::Result<String, String>> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let value: serde_json::Value = serde_yaml::from_str(yaml).context("case YAML")?;
    let obj: DynamicObject = serde_json::from_value(value)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(o) => Ok(Ok(o.name_any())),
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}

/// The object as the API server has it, untyped (a typed read would fail on a template the
/// Rust types cannot hold, which is one of the cases).
async fn get_raw(env: &Env, name: &str) -> Result<serde_json::Value> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    Ok(serde_json::to_value(api.get(name).await?)?)
}

fn uid(obj: &serde_json::Value) -> String {
    obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// (type, status, reason, message) of each condition.
fn conditions(obj: &serde_json::Value) -> Vec<[String; 4]> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    obj["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    [
                        text(&c["type"]),
                        text(&c["status"]),
                        text(&c["reason"]),
                        text(&c["message"]),
                    ]
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Whether a run of this SingletonJob finished and is in its history.
fn ran(obj: &serde_json::Value) -> bool {
    obj["status"]["history"].as_array().is_some_and(|h| {
        h.iter().any(|e| {
            e["jobName"].is_string()
                && matches!(e["outcome"].as_str(), Some("Succeeded" | "Failed"))
        })
    })
}

/// What a Job of SingletonJob `name` says that its template, not the controller, chose: its
/// namespace, owner or the controller's own labels and annotations.
fn spoofed(job: &Job, name: &str) -> Option<String> {
    let labels = job.labels();
    let annotations = job.annotations();
    let token = annotations.get("singleton.dev/fencing-token");
    let owner = job
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true));
    let why = if labels.get("singleton.dev/job") != Some(&singleton::naming::job_label(name)) {
        "label singleton.dev/job"
    } else if annotations.get("singleton.dev/job").map(String::as_str) != Some(name) {
        "annotation singleton.dev/job"
    } else if token.is_none_or(|t| t == "999999")
        || labels.get("singleton.dev/fencing-token") != token
    {
        "fencing-token label or annotation"
    } else if owner.is_none_or(|o| o.kind != "SingletonJob" || o.name != name) {
        "controller owner reference"
    } else {
        return None;
    };
    Some(format!(
        "Job {} has the template's {why}: {:?} {:?}",
        job.name_any(),
        job.metadata.labels,
        job.metadata.owner_references
    ))
}

fn owned_by(jobs: &[Job], uid: &str) -> Vec<Job> {
    jobs.iter()
        .filter(|j| j.owner_references().iter().any(|o| o.uid == uid))
        .cloned()
        .collect()
}

#[tokio::test]
async fn bad_input_battery() -> Result<()> {
    let started = Instant::now();
    let mut env = Env::new("bad-input").await?;
    // The battery's backstops are all on loopback; anything else is outside the allow-list.
    env.start_controller(&["--backstop-allowed-hosts", "127.0.0.0/8,::1"])
        .await?;
    secrets(&env).await?;
    let _hole = noisy_secrets(&env).await?;
    // The good one: Allow, so it never waits on a run, and history kept, so every Job is counted.
    env.create_sj(&ok(
        "good",
        "  concurrencyPolicy: Allow\n  successfulJobsHistoryLimit: 100\n  failedJobsHistoryLimit: 100\n",
    ))
    .await?;
    env.wait_for(
        "the good SingletonJob's first Job",
        Duration::from_secs(20),
        || async { Ok((!env.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    let battery_start = Instant::now();

    // Apply every case; refusals are judged at once.
    let cases = cases();
    let mut failures = Vec::new();
    let mut accepted = Vec::new(); // (case, object name)
    let names: BTreeSet<&str> = cases.iter().map(|c| c.name).collect();
    ensure(&env, names.len() == cases.len(), "case names are unique").await?;
    for case in &cases {
        match (create_raw(&env, &case.yaml).await?, case.expect) {
            (Err(msg), Refused(want)) => {
                if msg.is_empty() || !msg.contains(want) {
                    failures.push(format!(
                        "{}: refused, but message {msg:?} lacks {want:?}",
                        case.name
                    ));
                }
            }
            (Err(msg), _) => failures.push(format!(
                "{}: refused ({msg}), expected {:?}",
                case.name, case.expect
            )),
            (Ok(obj), Refused(_)) => {
                failures.push(format!(
                    "{}: accepted, expected {:?}",
                    case.name, case.expect
                ));
                accepted.push((case, obj));
            }
            (Ok(obj), _) => accepted.push((case, obj)),
        }
    }

    // Accepted ones: their condition within a deadline.
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut pending: Vec<_> = accepted
        .iter()
        .filter(|(c, _)| matches!(c.expect, False(..) | Runs | Ran))
        .collect();
    while !pending.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        let jobs = env.job_list().await?;
        for item in pending {
            let (case, obj) = item;
            let sj = get_raw(&env, obj).await?;
            let done = match case.expect {
                False(ty, want) => conditions(&sj).iter().any(|[t, st, _, msg]| {
                    t == ty && st == "False" && !msg.is_empty() && msg.contains(want)
                }),
                Runs => !owned_by(&jobs, &uid(&sj)).is_empty(),
                Ran => ran(&sj),
                Refused(_) => true,
            };
            if !done {
                still.push(item);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for (case, obj) in pending {
        let conds = conditions(&get_raw(&env, obj).await?);
        failures.push(format!(
            "{}: expected {:?} within the deadline; conditions {conds:?}",
            case.name, case.expect
        ));
    }

    // Let several periods pass over every bad one (and the good one), then count.
    env.wait_for("10 s of battery", Duration::from_secs(30), || async {
        Ok((battery_start.elapsed() >= Duration::from_secs(10)).then_some(()))
    })
    .await?;
    let jobs = env.job_list().await?;
    for (case, obj) in &accepted {
        let mine = owned_by(&jobs, &uid(&get_raw(&env, obj).await?));
        match case.expect {
            Ran => {}
            Runs => {
                failures.extend(
                    mine.iter()
                        .filter_map(|j| spoofed(j, obj))
                        .map(|why| format!("{}: {why}", case.name)),
                );
                for j in &mine {
                    let ttl = j.spec.as_ref().and_then(|s| s.ttl_seconds_after_finished);
                    if ttl.is_some() {
                        failures.push(format!(
                            "{}: Job {} kept ttlSecondsAfterFinished {ttl:?}",
                            case.name,
                            j.name_any()
                        ));
                    }
                }
            }
            _ if !mine.is_empty() => failures.push(format!(
                "{}: {} Job(s) created for a bad spec: {:?}",
                case.name,
                mine.len(),
                mine.iter().map(|j| j.name_any()).collect::<Vec<_>>()
            )),
            _ => {}
        }
    }

    // The good one kept its schedule: a Job per period, one each.
    let good = env.get_sj("good").await?;
    let good_jobs = owned_by(&jobs, &good.uid().unwrap_or_default());
    let periods: Vec<String> = good_jobs
        .iter()
        .filter_map(|j| j.annotations().get("singleton.dev/period").cloned())
        .collect();
    let distinct: BTreeSet<&String> = periods.iter().collect();
    let elapsed = battery_start.elapsed().as_secs();
    // A period every 2 s since the battery began; at least half of them ran. Other tests share
    // the two cores, so a period may be late past its deadline (Missed); a good SingletonJob held
    // up by the bad ones would run none or one.
    let want = (elapsed / 4).saturating_sub(1) as usize;
    if distinct.len() != periods.len() {
        failures.push(format!("good: two Jobs for one period: {periods:?}"));
    }
    if periods.len() < want.max(4) {
        failures.push(format!(
            "good: {} runs in {elapsed} s of battery, expected at least {}",
            periods.len(),
            want.max(4)
        ));
    }

    // The password appears nowhere.
    let ar = ApiResource::erase::<SingletonJob>(&());
    let all: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let status_text = serde_json::to_string(&all.list(&ListParams::default()).await?.items)?;
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let event_text: String = events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|e| {
            format!(
                "{} {}\n",
                e.reason.clone().unwrap_or_default(),
                e.message.clone().unwrap_or_default()
            )
        })
        .collect();
    let log = env.controller_log(0);
    for (what, text) in [
        ("status", &status_text),
        ("events", &event_text),
        ("controller log", &log),
    ] {
        if text.contains(PASSWORD) {
            failures.push(format!("the Secret's password appears in the {what}"));
        }
    }

    // The controller is alive and never panicked.
    if let Some(exit) = env.controller_exit(0)? {
        failures.push(format!("the controller exited: {exit}"));
    }
    if log.contains("panicked") {
        failures.push("the controller log shows a panic".into());
    }

    eprintln!(
        "bad-input battery: {} cases ({} refused at apply time, {} accepted), good ran {} times, {:.1?} in all",
        cases.len(),
        cases.len() - accepted.len(),
        accepted.len(),
        periods.len(),
        started.elapsed()
    );
    if !failures.is_empty() {
        bail!(
            "{} failure(s):\n  {}\n{}",
            failures.len(),
            failures.join("\n  "),
            env.dump().await
        );
    }
    Ok(())
}

// Operations (issue 19): hand-written requests. With the chart's operationRequester policy the
// API server refuses a request in someone else's name; whatever passes it, the controller refuses
// malformed text with a clear record, and strips control characters from who and why.

/// The chart's operationRequester policy, bound to `env`'s namespace only (so other tests' hand
/// -written requests are not judged); deleted on drop.
struct RequesterPolicy {
    file: std::path::PathBuf,
}

impl RequesterPolicy {
    fn apply(env: &Env) -> Result<RequesterPolicy> {
        let release = format!("bi-{}", env.ns.rsplit('-').next().unwrap_or("x"));
        let yaml = e2e::run_ok(
            e2e::helm()
                .args(["template", &release])
                .arg(e2e::chart_dir())
                .args(["--namespace", "singleton-system"])
                .args(["--show-only", "templates/admission.yaml"])
                .args(["--set", &format!("watchNamespaces={{{}}}", env.ns)])
                .args(["--set", "admissionPolicies.controllerJobs=false"])
                .args(["--set", "admissionPolicies.controllerStatus=false"]),
        )?;
        let file = env.log_dir().join("requester-policy.yaml");
        std::fs::write(&file, yaml)?;
        e2e::run_ok(e2e::kubectl().arg("apply").arg("-f").arg(&file))?;
        Ok(RequesterPolicy { file })
    }
}

impl Drop for RequesterPolicy {
    fn drop(&mut self) {
        let _ = e2e::kubectl()
            .args(["delete", "--ignore-not-found", "-f"])
            .arg(&self.file)
            .output();
    }
}

/// `kubectl annotate` of SingletonJob `name`, as `user` (impersonated) when given.
fn annotate(
    env: &Env,
    name: &str,
    user: Option<&str>,
    key: &str,
    value: &str,
    dry_run: bool,
) -> Result<std::result::Result<(), String>> {
    let mut cmd = e2e::kubectl();
    if let Some(u) = user {
        cmd.args([&format!("--as={u}"), "--as-group=system:masters"]);
    }
    cmd.args([
        "annotate",
        "--overwrite",
        "singletonjob",
        name,
        "-n",
        &env.ns,
    ])
    .arg(format!("{key}={value}"));
    if dry_run {
        cmd.arg("--dry-run=server");
    }
    let out = cmd.output()?;
    Ok(if out.status.success() {
        Ok(())
    } else {
        Err(e2e::stderr(&out))
    })
}

/// The record of the operation `pick` selects, once its id is `id` and it is no longer Pending.
async fn record(
    env: &Env,
    name: &str,
    id: &str,
    pick: fn(&singleton::api::Operations) -> Option<&singleton::api::OperationStatus>,
) -> Result<singleton::api::OperationStatus> {
    env.wait_for(
        &format!("the controller's record of request {id}"),
        Duration::from_secs(30),
        || async {
            let sj = env.get_sj(name).await?;
            Ok(sj
                .status
                .as_ref()
                .and_then(|s| pick(&s.operations))
                .filter(|o| o.id == id && o.phase != singleton::api::OperationPhase::Pending)
                .cloned())
        },
    )
    .await
}

fn printable(s: &str) -> bool {
    !s.chars().any(|c| {
        c.is_control() || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
    })
}

#[tokio::test]
async fn hand_written_operation_requests() -> Result<()> {
    use singleton::api::{OperationPhase, Operations};
    let mut env = Env::new("bad-ops").await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("ops", "0 0 1 1 *", "")).await?;
    let me = e2e::run_ok(e2e::kubectl().args([
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]))?;
    let me = me.trim();

    // Control characters in who and why (an install without the policy, where `by` is whatever
    // the client wrote): stripped before status and the Event.
    let raw = serde_json::json!({
        "by": "mallory\u{1b}[2K\u{202E}ecila",
        "id": "cc1",
        "reason": "stuck\nLockBroken by root\u{7}",
    })
    .to_string();
    annotate(&env, "ops", None, "singleton.dev/break-lock", &raw, false)?
        .map_err(anyhow::Error::msg)?;
    let rec = record(&env, "ops", "cc1", |o: &Operations| o.break_lock.as_ref()).await?;
    let note = env
        .wait_for("a LockBroken Event", Duration::from_secs(30), || async {
            Ok(e2e::events_with_reason(&env, "LockBroken")
                .await?
                .first()
                .and_then(|e| e.message.clone()))
        })
        .await?;
    ensure(
        &env,
        rec.requested_by.as_deref() == Some("mallory[2Kecila")
            && rec.reason.as_deref() == Some("stuck LockBroken by root")
            && printable(&rec.message)
            && printable(&note)
            && note.contains("lock broken by mallory[2Kecila: stuck LockBroken by root"),
        ("control characters in status or the Event", &rec, &note),
    )
    .await?;

    // The policy: once the API server enforces it (a dry run is refused), requests name their
    // writer or are refused.
    let _policy = RequesterPolicy::apply(&env)?;
    let spoof = r#"{"by":"mallory","id":"s1"}"#;
    env.wait_for(
        "the requester policy in force",
        Duration::from_secs(30),
        || async {
            Ok(
                annotate(&env, "ops", None, "singleton.dev/trigger", spoof, true)?
                    .err()
                    .filter(|e| e.contains("ValidatingAdmissionPolicy")),
            )
        },
    )
    .await?;

    // The plugin's own request passes, and names the caller.
    let out = e2e::plugin(&["trigger", "ops", "-n", &env.ns, "-o", "json"], &[])?;
    ensure(
        &env,
        out.status.success(),
        ("plugin trigger", e2e::stdout(&out), e2e::stderr(&out)),
    )
    .await?;
    let sj = env.get_sj("ops").await?;
    let by = sj
        .status
        .and_then(|s| s.operations.trigger)
        .and_then(|o| o.requested_by);
    ensure(
        &env,
        by.as_deref() == Some(me),
        ("trigger requested by", &by),
    )
    .await?;

    // Someone else's name, by hand: refused by the API server, with what to write instead.
    let old_format = format!(r#"{{"id":"s2","by":"{me}"}}"#);
    let spoofs: [(Option<&str>, &str, &str); 3] = [
        (None, "singleton.dev/trigger", spoof),
        // The old order, id first, even with one's own name: the prefix is the rule.
        (None, "singleton.dev/trigger", &old_format),
        (
            Some("alice"),
            "singleton.dev/break-lock",
            r#"{"by":"bob","id":"s3","reason":"bob said so"}"#,
        ),
    ];
    for (user, key, value) in spoofs {
        let r = annotate(&env, "ops", user, key, value, false)?;
        let writer = user.unwrap_or(me);
        ensure(
            &env,
            r.as_ref().is_err_and(|e| {
                e.contains("must name the user")
                    && e.contains(&format!(r#"must begin with {{"by":"{writer}","#))
            }),
            ("a request in someone else's name", user, value, &r),
        )
        .await?;
    }
    // Alice in her own name: allowed, and the Event says alice.
    annotate(
        &env,
        "ops",
        Some("alice"),
        "singleton.dev/break-lock",
        r#"{"by":"alice","id":"a1","reason":"alice asks"}"#,
        false,
    )?
    .map_err(anyhow::Error::msg)?;
    let rec = record(&env, "ops", "a1", |o: &Operations| o.break_lock.as_ref()).await?;
    ensure(
        &env,
        rec.phase == OperationPhase::Done && rec.requested_by.as_deref() == Some("alice"),
        ("alice's break-lock", &rec),
    )
    .await?;

    // Past the prefix: a second `by` (however spelled) and malformed JSON are the controller's
    // to refuse, each with a record saying why.
    let dup = format!(
        r#"{{"by":"{me}","id":"d1","from":"2026-01-01T00:00:00Z","to":"2026-01-02T00:00:00Z","\u0062y":"mallory"}}"#
    );
    annotate(&env, "ops", None, "singleton.dev/backfill", &dup, false)?
        .map_err(anyhow::Error::msg)?;
    // Not JSON the controller accepts, so no id of its own: recorded under one derived from it.
    let rec = env
        .wait_for(
            "the backfill with a second by rejected",
            Duration::from_secs(30),
            || async {
                let sj = env.get_sj("ops").await?;
                Ok(sj
                    .status
                    .and_then(|s| s.operations.backfill)
                    .filter(|o| o.phase == OperationPhase::Rejected))
            },
        )
        .await?;
    ensure(
        &env,
        rec.message.contains("duplicate field `by`"),
        ("a second by", &rec),
    )
    .await?;
    let broken = format!(r#"{{"by":"{me}",oops"#);
    annotate(&env, "ops", None, "singleton.dev/rerun", &broken, false)?
        .map_err(anyhow::Error::msg)?;
    let rejected = env
        .wait_for(
            "the malformed rerun rejected",
            Duration::from_secs(30),
            || async {
                let sj = env.get_sj("ops").await?;
                Ok(sj
                    .status
                    .and_then(|s| s.operations.rerun)
                    .filter(|o| o.phase == OperationPhase::Rejected))
            },
        )
        .await?;
    ensure(
        &env,
        rejected.message.contains("is not a valid request")
            && rejected.message.contains("expected JSON such as {\"by\":"),
        ("malformed JSON", &rejected),
    )
    .await?;
    // Events are published after the status write (and repeats may be folded into a series):
    // poll until both rejections are counted.
    env.wait_for(
        "two OperationRejected Events",
        Duration::from_secs(30),
        || async {
            let warned = e2e::events_with_reason(&env, "OperationRejected").await?;
            let n: i32 = warned
                .iter()
                .map(|e| {
                    let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(1);
                    series.max(e.count.unwrap_or(1))
                })
                .sum();
            Ok((n >= 2).then_some(()))
        },
    )
    .await?;
    // Nothing else broke: the controller runs, and the object still takes requests.
    ensure(&env, !env.controller_exited(0), "the controller exited").await?;
    Ok(())
}

// Limits (issue 19): operations are asked for through annotations, so this one is a test of its
// own: a backfill over a century (36,500 daily periods) is refused, and starts nothing.
#[tokio::test]
async fn a_backfill_over_a_century_is_refused() -> Result<()> {
    let mut env = Env::new("limits-backfill").await?;
    env.start_controller(&[]).await?;
    e2e::backstop_secret(&env, "db", &e2e::database_url()?, true).await?;
    let prefix = e2e::table_prefix(&env);
    env.create_sj(&e2e::sj_yaml(
        "b",
        "0 3 * * *",
        &e2e::backstop_spec("db", &prefix, "  concurrencyPolicy: Allow\n"),
    ))
    .await?;
    env.wait_for("claimsRecorded", Duration::from_secs(30), || async {
        let sj = env.get_sj("b").await?;
        Ok(sj.status.and_then(|s| s.claims_recorded).map(|_| ()))
    })
    .await?;
    let token = |sj: SingletonJob| sj.status.map_or(0, |s| s.fencing_token);
    let before = token(env.get_sj("b").await?);
    let req = serde_json::json!({
        "id": "century", "from": "1900-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z",
    })
    .to_string();
    let patch = serde_json::json!({"metadata": {"annotations": {"singleton.dev/backfill": req}}});
    env.sjs()
        .patch(
            "b",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    let op = env
        .wait_for(
            "the backfill's verdict",
            Duration::from_secs(30),
            || async {
                let sj = env.get_sj("b").await?;
                Ok(sj.status.and_then(|s| s.operations.backfill).filter(|o| {
                    o.id == "century" && o.phase != singleton::api::OperationPhase::Pending
                }))
            },
        )
        .await?;
    ensure(
        &env,
        op.phase == singleton::api::OperationPhase::Rejected
            && op.message.contains("more than 10000 periods"),
        ("backfill over a century", &op),
    )
    .await?;
    // No wait needed: a Job follows only a claim, which issues a token in status before the
    // Job is created, and the verdict was written after any claim of the same pass.
    let after = token(env.get_sj("b").await?);
    let jobs = env.job_list().await?;
    ensure(
        &env,
        jobs.is_empty() && after == before,
        (
            "Jobs (and tokens) after a refused backfill",
            jobs.len(),
            before,
            after,
        ),
    )
    .await?;
    Ok(())
}
