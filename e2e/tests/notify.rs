//! Notifications (issue 37, docs/notifications.md) against the real API server and a real local
//! HTTP receiver ([`e2e::receiver`]): CloudEvents signed with a key from a Secret, delivered at
//! least once through a receiver outage with no id accepted twice; Slack and Healthchecks
//! formats; a delivery given up (status, Event, metric); and bad input.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Result;
use e2e::receiver::{Received, Receiver};
use e2e::{Env, ensure, events_with_reason, kubectl_stdin, metric, sj_yaml};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use singleton::api::{Outcome, SingletonJob};

/// A Secret labelled for notifications (or not), with one key.
async fn secret(env: &Env, name: &str, key: &str, value: &str, labelled: bool) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.ns);
    let mut s = Secret {
        string_data: Some([(key.to_string(), value.to_string())].into()),
        ..Default::default()
    };
    s.metadata.name = Some(name.into());
    if labelled {
        s.metadata.labels = Some([("singleton.dev/notify".to_string(), "true".to_string())].into());
    }
    api.create(&PostParams::default(), &s).await?;
    Ok(())
}

/// The runs a SingletonJob's history says succeeded: (period as in the event's data, token).
fn succeeded(sj: &SingletonJob) -> BTreeSet<(String, u64)> {
    sj.status
        .as_ref()
        .map(|s| {
            s.history
                .iter()
                .filter(|h| h.outcome == Outcome::Succeeded)
                .filter_map(|h| Some((singleton::naming::period_rfc3339(h.period.0), h.token?)))
                .collect()
        })
        .unwrap_or_default()
}

fn pending(sj: &SingletonJob) -> usize {
    sj.status
        .as_ref()
        .and_then(|s| s.notifications.as_ref())
        .map_or(0, |n| n.pending.len())
}

fn target_error(sj: &SingletonJob, name: &str) -> Option<String> {
    sj.status
        .as_ref()?
        .notifications
        .as_ref()?
        .targets
        .iter()
        .find(|t| t.name == name)?
        .last_error
        .clone()
}

/// The accepted events of type `dev.singleton.period.<kind>`, by id.
fn accepted<'a>(got: &'a [Received], kind: &str) -> Vec<&'a Received> {
    let ty = format!("dev.singleton.period.{kind}");
    got.iter()
        .filter(|r| r.accepted() && r.json()["type"] == ty.as_str())
        .collect()
}

const KEY: &str = "a-signing-key-of-32-bytes-length";

#[tokio::test]
async fn signed_cloud_events_arrive_at_least_once_through_an_outage_and_no_id_twice() -> Result<()>
{
    let mut env = Env::new("notify").await?;
    let mut rx = Receiver::start().await?;
    secret(&env, "hook-key", "key", KEY, true).await?;
    let notify = format!(
        "  notify:\n  - name: hook\n    url: {}\n    signingSecretRef: {{name: hook-key, key: key}}\n    events: [Started, Succeeded]\n",
        rx.url("/events")
    );
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("pay", "*/2 * * * * *", &notify))
        .await?;

    // Up: a run's start and success arrive, signed, as CloudEvents naming the run.
    let first = env
        .wait_for("a Succeeded event", Duration::from_secs(60), || async {
            Ok(accepted(&rx.received(), "succeeded")
                .first()
                .map(|r| (*r).clone()))
        })
        .await?;
    let ce = first.json();
    let job = env
        .jobs()
        .get(ce["data"]["jobName"].as_str().unwrap_or("?"))
        .await?;
    let token = e2e::token_of(&job);
    ensure(
        &env,
        first.signed_with(KEY.as_bytes())
            && first.header("content-type") == Some("application/cloudevents+json")
            && ce["specversion"] == "1.0"
            && first.header("webhook-id") == ce["id"].as_str()
            && ce["subject"]
                .as_str()
                .is_some_and(|s| s.starts_with(&format!("{}/pay/", env.ns)))
            && ce["data"]["token"] == token
            && ce["data"]["outcome"] == "Succeeded"
            && token > 0,
        (
            "a signed CloudEvent naming its run and token",
            &ce,
            &first.headers,
        ),
    )
    .await?;

    // Down: its port refuses connections. Runs go on; the events wait in status, the target's
    // error says why.
    rx.down();
    let before_down = env.get_sj("pay").await?;
    let done_before = succeeded(&before_down);
    env.wait_for(
        "runs during the outage, their events pending with the error",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("pay").await?;
            let new_runs = succeeded(&sj).difference(&done_before).count();
            Ok((new_runs >= 2
                && pending(&sj) >= 2
                && target_error(&sj, "hook").is_some_and(|e| e.contains("connect")))
            .then_some(()))
        },
    )
    .await?;

    // Back: every run's events arrive, the outbox empties.
    rx.up().await?;
    env.wait_for(
        "every recorded run's Succeeded event delivered, the outbox empty",
        Duration::from_secs(90),
        || async {
            let sj = env.get_sj("pay").await?;
            let got = rx.received();
            let delivered: BTreeSet<(String, u64)> = accepted(&got, "succeeded")
                .iter()
                .map(|r| {
                    let d = &r.json()["data"];
                    (
                        d["period"].as_str().unwrap_or_default().to_string(),
                        d["token"].as_u64().unwrap_or_default(),
                    )
                })
                .collect();
            let missing: Vec<_> = succeeded(&sj).difference(&delivered).cloned().collect();
            Ok((missing.is_empty() && pending(&sj) == 0).then_some(()))
        },
    )
    .await?;
    env.stop_controller(0, false).await?;

    // Every request signed; an id names one (event, period, token), and a repeat of an id is
    // the same event (a receiver drops it): at most the one the outage cut off after the
    // receiver took it, before the controller heard its answer.
    let got = rx.received();
    let mut by_id: BTreeMap<String, Vec<&Received>> = BTreeMap::new();
    for r in got.iter().filter(|r| r.accepted()) {
        by_id
            .entry(r.json()["id"].as_str().unwrap_or_default().to_string())
            .or_default()
            .push(r);
    }
    let named: BTreeSet<String> = by_id
        .values()
        .map(|rs| {
            let ce = rs[0].json();
            format!("{} {} {}", ce["type"], ce["subject"], ce["data"]["token"])
        })
        .collect();
    let repeats: Vec<String> = by_id
        .iter()
        .filter(|(_, rs)| rs.len() > 1)
        .map(|(id, rs)| {
            let bodies: Vec<_> = rs
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).into_owned())
                .collect();
            format!("{id}: {bodies:?}")
        })
        .collect();
    let alike = by_id
        .values()
        .all(|rs| rs.iter().all(|r| r.body == rs[0].body));
    let unsigned = got
        .iter()
        .filter(|r| !r.signed_with(KEY.as_bytes()))
        .count();
    ensure(
        &env,
        unsigned == 0
            && named.len() == by_id.len()
            && alike
            && repeats.len() <= 1
            && by_id.len() >= 6,
        (
            "unsigned, events named, ids, repeats alike, ids repeated",
            unsigned,
            &named,
            by_id.len(),
            alike,
            &repeats,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn slack_and_check_in_formats_and_a_delivery_given_up() -> Result<()> {
    let mut env = Env::new("notify-formats").await?;
    let rx = Receiver::start().await?;
    rx.answer("/broken", 500);
    // Slack's URL is its credential: from a Secret.
    secret(&env, "slack-url", "url", &rx.url("/slack/T0/B0/x"), true).await?;
    let notify = format!(
        concat!(
            "  notify:\n",
            "  - name: slack\n    format: Slack\n    urlSecretRef: {{name: slack-url, key: url}}\n    events: [Succeeded]\n",
            "  - name: hc\n    format: Healthchecks\n    url: {}\n    events: [Started, Succeeded, Failed]\n",
            "  - name: broken\n    url: {}\n    events: [Succeeded]\n    giveUpAfterSeconds: 5\n",
        ),
        rx.url("/hc/0f6c5b1e-uuid"),
        rx.url("/broken"),
    );
    let ctl = env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("fmt", "*/3 * * * * *", &notify))
        .await?;

    let slack = env
        .wait_for("a Slack message", Duration::from_secs(60), || async {
            Ok(rx.under("/slack/").into_iter().find(|r| r.accepted()))
        })
        .await?;
    let text = slack.json()["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure(
        &env,
        text.starts_with(":white_check_mark: ")
            && text.contains("/fmt period ")
            && text.contains("Succeeded"),
        ("Slack's one line", &text),
    )
    .await?;

    // A run's start and success pair up by their run id.
    let (start, end) = env
        .wait_for(
            "a run's start and success check-ins",
            Duration::from_secs(60),
            || async {
                let hc = rx.under("/hc/");
                let starts: Vec<_> = hc.iter().filter(|r| r.path.ends_with("/start")).collect();
                Ok(starts.iter().find_map(|s| {
                    let end = hc.iter().find(|e| {
                        e.path == "/hc/0f6c5b1e-uuid" && e.query.is_some() && e.query == s.query
                    })?;
                    Some(((*s).clone(), end.clone()))
                }))
            },
        )
        .await?;
    ensure(
        &env,
        start
            .query
            .as_deref()
            .is_some_and(|q| q.starts_with("rid=") && q.len() == 40),
        (
            "check-ins carry the run's UUID as rid",
            &start.query,
            &end.path,
        ),
    )
    .await?;

    // The broken receiver: given up after 5 s, said in status, an Event and the metric.
    let sj = env
        .wait_for("a delivery given up", Duration::from_secs(60), || async {
            let sj = env.get_sj("fmt").await?;
            let failed = sj
                .status
                .as_ref()
                .and_then(|s| s.notifications.as_ref())
                .and_then(|n| n.targets.iter().find(|t| t.name == "broken"))
                .is_some_and(|t| t.failed >= 1);
            Ok(failed.then_some(sj))
        })
        .await?;
    ensure(
        &env,
        target_error(&sj, "broken").is_some_and(|e| e.contains("HTTP 500")),
        ("the broken target's error", target_error(&sj, "broken")),
    )
    .await?;
    let evs = env
        .wait_for(
            "a NotificationFailed Event",
            Duration::from_secs(30),
            || async {
                let evs = events_with_reason(&env, "NotificationFailed").await?;
                Ok((!evs.is_empty()).then_some(evs))
            },
        )
        .await?;
    let note = evs[0].message.clone().unwrap_or_default();
    let text = env.metrics(ctl).await?;
    let gave_up = metric(
        &text,
        "singleton_notifications_total",
        &[("name", "fmt"), ("result", "GaveUp")],
    );
    let delivered = metric(
        &text,
        "singleton_notifications_total",
        &[("name", "fmt"), ("result", "Delivered")],
    );
    ensure(
        &env,
        note.contains("to broken given up") && gave_up >= 1.0 && delivered >= 2.0,
        (
            "the Event's note, GaveUp and Delivered counts",
            &note,
            gave_up,
            delivered,
        ),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn bad_notify_input_is_refused_or_said_on_the_object_and_no_run_waits() -> Result<()> {
    let mut env = Env::new("notify-bad").await?;
    let rx = Receiver::start().await?;
    let refused = [
        (
            "  notify:\n  - name: a\n    url: not a url\n",
            "url must be an absolute http",
        ),
        (
            "  notify:\n  - name: a\n    url: ftp://example.com/x\n",
            "url must be an absolute http",
        ),
        (
            "  notify:\n  - name: a\n    url: http://example.com/\n    urlSecretRef: {name: s, key: url}\n",
            "set exactly one of url and urlSecretRef",
        ),
        (
            "  notify:\n  - name: a\n    url: http://example.com/\n  - name: a\n    url: http://example.com/b\n",
            "notify target names must be unique",
        ),
        (
            "  notify:\n  - name: a\n    url: http://example.com/\n    events: [Sometimes]\n",
            "Unsupported value",
        ),
    ];
    // Through kubectl, as users apply them.
    for (i, (spec, want)) in refused.iter().enumerate() {
        let yaml = sj_yaml(&format!("bad-{i}"), "@hourly", spec);
        let err = kubectl_stdin(&["apply", "-n", &env.ns, "-f", "-"], &yaml);
        let msg = err
            .as_ref()
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        ensure(&env, msg.contains(want), ("refused with", want, &msg)).await?;
    }
    ensure(
        &env,
        env.sjs().list(&Default::default()).await?.items.is_empty(),
        "no refused SingletonJob was stored",
    )
    .await?;

    // A missing Secret and an unlabelled one: runs go on, the error is on the object, the
    // events wait; fixed, they are delivered.
    let notify = format!(
        concat!(
            "  notify:\n",
            "  - name: nokey\n    url: {}\n    signingSecretRef: {{name: nope, key: key}}\n    events: [Succeeded]\n",
            "  - name: unlabelled\n    url: {}\n    signingSecretRef: {{name: plain, key: key}}\n    events: [Succeeded]\n",
        ),
        rx.url("/nokey"),
        rx.url("/unlabelled"),
    );
    secret(&env, "plain", "key", KEY, false).await?;
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("sec", "*/2 * * * * *", &notify))
        .await?;
    env.wait_for(
        "both errors on the object, runs done",
        Duration::from_secs(60),
        || async {
            let sj = env.get_sj("sec").await?;
            let missing =
                target_error(&sj, "nokey").is_some_and(|e| e.contains("Secret nope not found"));
            let label = target_error(&sj, "unlabelled")
                .is_some_and(|e| e.contains("not labelled singleton.dev/notify=true"));
            Ok((missing && label && succeeded(&sj).len() >= 2 && pending(&sj) >= 2).then_some(()))
        },
    )
    .await?;
    ensure(
        &env,
        rx.received().is_empty(),
        ("nothing sent without its key", rx.received().len()),
    )
    .await?;
    secret(&env, "nope", "key", KEY, true).await?;
    env.wait_for(
        "the waiting events delivered once the Secret exists",
        Duration::from_secs(60),
        || async {
            let got = rx.under("/nokey");
            Ok((got
                .iter()
                .filter(|r| r.accepted() && r.signed_with(KEY.as_bytes()))
                .count()
                >= 2)
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn the_controllers_defaults_serve_singletonjobs_without_notify_and_an_empty_list_opts_out()
-> Result<()> {
    let mut env = Env::new("notify-defaults").await?;
    let rx = Receiver::start().await?;
    // The defaults' Secrets are in the controller's own namespace (here the one it serves).
    secret(&env, "platform-key", "key", KEY, true).await?;
    let defaults = serde_json::json!([{
        "name": "platform",
        "url": rx.url("/platform"),
        "signingSecretRef": {"name": "platform-key", "key": "key"},
        "events": ["Succeeded"],
    }])
    .to_string();
    env.start_controller(&["--default-notify", &defaults])
        .await?;
    env.create_sj(&sj_yaml("plain", "*/2 * * * * *", ""))
        .await?;
    env.create_sj(&sj_yaml("quiet", "*/2 * * * * *", "  notify: []\n"))
        .await?;
    env.wait_for(
        "the default target told of plain's runs",
        Duration::from_secs(60),
        || async {
            let got = rx.under("/platform");
            let plain = got
                .iter()
                .filter(|r| r.accepted() && r.signed_with(KEY.as_bytes()))
                .filter(|r| r.json()["data"]["name"] == "plain")
                .count();
            let quiet = env.get_sj("quiet").await?;
            Ok((plain >= 2 && succeeded(&quiet).len() >= 2).then_some(()))
        },
    )
    .await?;
    let quiet_events = rx
        .received()
        .iter()
        .filter(|r| r.json()["data"]["name"] == "quiet")
        .count();
    ensure(
        &env,
        quiet_events == 0,
        ("notify: [] opts out of the defaults", quiet_events),
    )
    .await?;
    // A bad default is refused at start-up, with what is wrong.
    let out = std::process::Command::new(e2e::controller_bin())
        .args([
            "--default-notify",
            r#"[{"name":"x","url":"ftp://example.com/"}]"#,
        ])
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure(
        &env,
        !out.status.success() && err.contains("url must be an absolute http:// or https:// URL"),
        ("a bad --default-notify", &err),
    )
    .await?;
    Ok(())
}

/// The worst delay from a period's instant to its Job's release (the update that let it run:
/// its creation when not prepared ahead, issue 33), over the Jobs of `sj` let run.
fn worst_delay(jobs: &[k8s_openapi::api::batch::v1::Job], sj: &str) -> (usize, f64) {
    let delays: Vec<f64> = jobs
        .iter()
        .filter(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with(&format!("{sj}-")))
        })
        .filter_map(|j| {
            let released = e2e::observer::released_at(j)?;
            let period: jiff::Timestamp = j
                .metadata
                .annotations
                .as_ref()?
                .get("singleton.dev/period")?
                .parse()
                .ok()?;
            Some(released.duration_since(period).as_secs_f64())
        })
        .collect();
    (delays.len(), delays.into_iter().fold(0.0, f64::max))
}

#[tokio::test]
async fn a_receiver_that_never_answers_delays_no_run() -> Result<()> {
    let mut env = Env::new("notify-hang").await?;
    let rx = Receiver::start().await?;
    rx.hang("/hang");
    let notify = format!(
        "  notify:\n  - name: hang\n    url: {}\n    events: [Started, Succeeded]\n",
        rx.url("/hang")
    );
    env.start_controller(&[]).await?;
    // `calm` has no receivers: the machine's own delay, for comparison on a loaded machine.
    let keep = "  successfulJobsHistoryLimit: 20\n";
    env.create_sj(&sj_yaml(
        "busy",
        "*/2 * * * * *",
        &format!("{keep}{notify}"),
    ))
    .await?;
    env.create_sj(&sj_yaml("calm", "*/2 * * * * *", keep))
        .await?;
    // Every try hangs until the 10 s timeout; meanwhile runs go on at their instants.
    let jobs = env
        .wait_for(
            "8 runs of each and a timed-out try",
            Duration::from_secs(60),
            || async {
                let jobs = env.job_list().await?;
                let sj = env.get_sj("busy").await?;
                let timed_out =
                    target_error(&sj, "hang").is_some_and(|e| e.contains("no answer within"));
                let enough = worst_delay(&jobs, "busy").0 >= 8 && worst_delay(&jobs, "calm").0 >= 8;
                Ok((enough && timed_out).then_some(jobs))
            },
        )
        .await?;
    let (busy, calm) = (worst_delay(&jobs, "busy").1, worst_delay(&jobs, "calm").1);
    let sj = env.get_sj("busy").await?;
    // A run held up by a delivery would wait its 10 s timeout; 2 s is a period of the schedule.
    ensure(
        &env,
        busy <= calm + 2.0 && pending(&sj) >= 4 && !rx.under("/hang").is_empty(),
        (
            "worst delay with a hanging receiver, without, events pending",
            busy,
            calm,
            pending(&sj),
        ),
    )
    .await?;
    Ok(())
}
