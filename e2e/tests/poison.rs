//! One object the controller cannot decode (issue 34, N1): a SingletonJob whose `jobTemplate`
//! (kept without a schema) nests deeper than serde_json's 128 levels. The API server stores it;
//! the controller used to fail every list of SingletonJobs on it, exiting at start-up ("cannot
//! list SingletonJobs (is the CRD installed?)") or, once running, leaving its watch down, so
//! nothing was scheduled in any namespace.
//!
//! One controller serves two namespaces here (all namespaces, only SingletonJobs labelled with
//! this test's run, as tests/noisy.rs does): in one, a poisoned SingletonJob exists before the
//! controller starts and another is created while it runs; in the other, an ordinary every-2-
//! seconds SingletonJob must run. The poisoned ones must say what is wrong on themselves
//! (`Ready=False`, reason `Undecodable`, a Warning Event, the metric), `kubectl singleton list`
//! must list them, and one fixed in place must be scheduled again.

use std::time::Duration;

use anyhow::Result;
use e2e::{
    DEPTH, Env, Observer, RUN_LABEL, ensure, events_with_reason, kubectl, kubectl_stdin, metric,
    plugin, poisoned, run_ok, sj_yaml, stdout,
};

/// `reason` and `status` of the Ready condition of `ns/name`, read with kubectl.
fn ready(ns: &str, name: &str) -> Result<(String, String)> {
    let path = r#"{range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}{end}"#;
    let out = run_ok(kubectl().args([
        "get",
        "singletonjobs.singleton.dev",
        name,
        "-n",
        ns,
        "-o",
        &format!("jsonpath={path}"),
    ]))?;
    let (status, reason) = out.trim().split_once(' ').unwrap_or((out.trim(), ""));
    Ok((status.to_string(), reason.to_string()))
}

#[tokio::test]
async fn a_poisoned_singletonjob_never_stops_the_others() -> Result<()> {
    let mut good = Env::new("poison-good").await?;
    let bad = Env::new("poison-bad").await?;
    let run = good.ns.clone();

    // Before the controller starts: the poisoned object, and the ordinary one beside it.
    kubectl_stdin(&["create", "-f", "-"], &poisoned(&bad.ns, "deep", &run))?;
    // Counts the ordinary one's runs from outside (its Jobs are pruned to the last three).
    let watch = Observer::watch(good.client.clone(), &good.ns).await?;
    let runs = || watch.jobs().into_iter().filter(|j| j.ran).count();
    good.create_sj_labelled(&run, &sj_yaml("tick", "*/2 * * * * *", ""))
        .await?;
    good.start_controller(&[
        "--namespace=",
        "--label-selector",
        &format!("{RUN_LABEL}={run}"),
    ])
    .await?;

    // The ordinary one runs.
    good.wait_for(
        "two runs of the ordinary SingletonJob",
        Duration::from_secs(60),
        || async { Ok((runs() >= 2).then_some(())) },
    )
    .await?;
    // The poisoned one says why on itself; the controller is up.
    let said = |name: &'static str| {
        let bad = &bad;
        async move {
            bad.wait_for(
                &format!("{name}: Ready=False, reason Undecodable"),
                Duration::from_secs(30),
                || async {
                    let (status, reason) = ready(&bad.ns, name)?;
                    Ok((status == "False" && reason == "Undecodable").then_some(()))
                },
            )
            .await
        }
    };
    said("deep").await?;
    ensure(&good, !good.controller_exited(0), "the controller exited").await?;

    // One poisoned while the controller runs: its watch goes on, and it is said on itself too.
    kubectl_stdin(&["create", "-f", "-"], &poisoned(&bad.ns, "deeper", &run))?;
    said("deeper").await?;
    let runs_before = runs();
    good.wait_for(
        "the ordinary SingletonJob still running",
        Duration::from_secs(30),
        || async { Ok((runs() >= runs_before + 2).then_some(())) },
    )
    .await?;
    let events = events_with_reason(&bad, "Undecodable").await?;
    let noted: Vec<String> = events
        .iter()
        .filter_map(|e| e.involved_object.name.clone())
        .collect();
    ensure(
        &bad,
        noted.contains(&"deep".into()) && noted.contains(&"deeper".into()),
        ("a Warning Event on each poisoned SingletonJob", &noted),
    )
    .await?;
    let note = events[0].message.clone().unwrap_or_default();
    ensure(
        &bad,
        note.contains("nests deeper"),
        ("the Event says why", &note),
    )
    .await?;
    let text = good.metrics(0).await?;
    for name in ["deep", "deeper"] {
        let labels = [("namespace", bad.ns.as_str()), ("name", name)];
        let v = metric(&text, "singleton_undecodable_singletonjobs", &labels);
        ensure(&good, v == 1.0, ("the metric of", name, v)).await?;
    }
    ensure(
        &good,
        bad.job_list().await?.is_empty(),
        "a poisoned SingletonJob ran",
    )
    .await?;
    // The plugin lists them too, as the controller decodes them, instead of failing the list.
    let out = plugin(&["list", "-n", &bad.ns], &[])?;
    let listed = format!("{}{}", stdout(&out), e2e::stderr(&out));
    ensure(
        &bad,
        out.status.success() && listed.matches("(undecodable)").count() == 2,
        ("kubectl singleton list", &listed),
    )
    .await?;

    // Fixed in place (the deep field removed): scheduled again, and its metric series gone.
    run_ok(kubectl().args([
        "patch",
        "singletonjobs.singleton.dev",
        "deep",
        "-n",
        &bad.ns,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/spec/jobTemplate/spec/deep"}]"#,
    ]))?;
    bad.wait_for(
        "the fixed SingletonJob to run",
        Duration::from_secs(60),
        || async { Ok((!bad.job_list().await?.is_empty()).then_some(())) },
    )
    .await?;
    let (status, reason) = ready(&bad.ns, "deep")?;
    ensure(
        &bad,
        reason != "Undecodable",
        ("fixed, still", status, reason),
    )
    .await?;
    let text = good.metrics(0).await?;
    let labels = [("namespace", bad.ns.as_str()), ("name", "deep")];
    let v = metric(&text, "singleton_undecodable_singletonjobs", &labels);
    ensure(&good, v == 0.0, ("the fixed one's metric", v)).await?;
    println!(
        "poisoned: 2 SingletonJobs nested {DEPTH} deep reported Undecodable ({} Events), {} runs of the ordinary one meanwhile, the fixed one ran",
        events.len(),
        runs()
    );
    Ok(())
}
