//! Noisy neighbours (issue 19): one namespace's black-holed backstops must not delay another
//! namespace's runs, and a backstop host outside `--backstop-allowed-hosts` is refused untried.
//!
//! One controller serves two namespaces here. It watches all namespaces but only SingletonJobs
//! labelled with this test's run (`--label-selector`), so it never acts on other tests' objects.
//! The skew is observed from outside, as the other tests do: a watch of the healthy namespace's
//! Jobs notes when each run's Job was first allowed to run, minus its scheduled instant.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use e2e::skew::{describe, healthy_namespace, instants, measure, p99, window};
use e2e::{
    Env, Proxy, RUN_LABEL, backstop_secret, backstop_spec, database_port, database_url, ensure,
    metric, sj_yaml, table_prefix,
};
use jiff::Timestamp;

/// SingletonJobs of the hostile namespace: more than the controller's 128 reconcile slots.
const HOSTILE: usize = 130;
/// Connection Secrets they share (so both the per-target backoff and the per-namespace bound on
/// probes are at work: 13 targets, at most 4 probed at once).
const HOSTILE_SECRETS: usize = 13;
/// SingletonJobs of the healthy namespace, every second each. Two Jobs a second is what the local
/// cluster (kube-controller-manager's job controller and kwok, on two cores) completes with room
/// to spare: at four, active runs piled up to `maxActive` even alone, and the test measured that
/// limit, not the neighbour.
const HEALTHY: usize = 2;
/// How long each phase is measured.
const WINDOW: Duration = Duration::from_secs(25);
/// The "alone" p99 is taken as at least this, so a quiet baseline of a few tens of milliseconds
/// does not turn ordinary noise of a shared 2-core machine (other test binaries run beside this
/// one) into a failure; a stall behind black-holed probes is the backstop's operation timeout
/// (10 s), 1.7 times twice this (with the protection removed the p99 was 32.9 s, 5.5 times the
/// bound). 1 s failed once (warm make test: 0.73 s alone, 2.69 s with, five lanes of tests
/// beside it), and 2 s once (2026-12-06, warm make test: p50 0.34 s alone, 0.70 s with; one run
/// of 48 at 5.0 s while the real-node chaos rows and three other lanes ran beside it).
/// The baseline is also at least a control namespace's p99 in the same window (below), so a
/// machine busier in the second window than in the first (2026-12-06: 2.70 s alone, 6.65 s
/// with, the unit tests and three lanes of e2e beside it) is not read as the neighbour's doing.
const BASELINE_FLOOR: f64 = 3.0;

/// How many SingletonJobs of `env` show `BackstopReady=False`.
async fn told(env: &Env) -> Result<usize> {
    let sjs = env.sjs().list(&Default::default()).await?.items;
    Ok(sjs
        .iter()
        .filter(|sj| {
            sj.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "BackstopReady" && c.status == "False")
            })
        })
        .count())
}

#[tokio::test]
async fn a_namespace_of_black_holed_backstops_does_not_delay_another_namespaces_runs() -> Result<()>
{
    let mut healthy = Env::new("noisy-healthy").await?;
    let hostile = Env::new("noisy-hostile").await?;
    let run = healthy.ns.clone();
    let selector = format!("{RUN_LABEL}={run}");
    healthy
        .start_controller(&["--namespace=", "--label-selector", &selector])
        .await?;

    // The healthy namespace: every-second runs, each claimed in a reachable backstop.
    let names: Vec<String> = (0..HEALTHY).map(|i| format!("h{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (_observer, skews) = healthy_namespace(&healthy, &run, &names, "* * * * * *").await?;

    // Alone.
    let reconciles = || async {
        let text = healthy.metrics(0).await?;
        anyhow::Ok(metric(
            &text,
            "singleton_reconcile_duration_seconds_count",
            &[],
        ))
    };
    let (started, from, r0) = (Instant::now(), Timestamp::now(), reconciles().await?);
    measure(&healthy, "the window alone", started, WINDOW).await?;
    let due = instants(from, Timestamp::now(), 1);
    let alone = window(&healthy, &skews, &names, &due).await?.skews;
    let rate_alone = (reconciles().await? - r0) / started.elapsed().as_secs_f64();

    // The hostile namespace: 130 every-second SingletonJobs whose backstops accept connections
    // and never answer.
    let hole = Proxy::start(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        database_port()?,
    )))
    .await?;
    hole.stall();
    let url = database_url()?.replace(
        &format!(":{}/", database_port()?),
        &format!(":{}/", hole.port),
    );
    for s in 0..HOSTILE_SECRETS {
        backstop_secret(&hostile, &format!("hole-{s}"), &url, true).await?;
    }
    let creates = (0..HOSTILE).map(|i| {
        let spec = backstop_spec(&format!("hole-{}", i % HOSTILE_SECRETS), "x_", "");
        let yaml = sj_yaml(&format!("x{i}"), "* * * * * *", &spec);
        let (hostile, run) = (&hostile, &run);
        async move { hostile.create_sj_labelled(run, &yaml).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    // The window opens once every hostile SingletonJob has been told its backstop is down: from
    // then on, without the fix, each of their reconciles (one a second each) dials the black hole
    // again and holds a reconcile slot for the operation timeout. The burst of their creation
    // (a dry run, a status write and an Event each, as for any 130 new SingletonJobs) is left
    // out: it is volume, not the backstop.
    let settling = Instant::now();
    let settled = healthy
        .wait_for(
            "every hostile SingletonJob told BackstopReady=False",
            Duration::from_secs(120),
            || async { Ok((told(&hostile).await? >= HOSTILE).then_some(())) },
        )
        .await;
    if let Err(e) = settled {
        let seen = hostile.dump().await;
        return Err(e.context(seen.chars().take(8000).collect::<String>()));
    }
    let settled = settling.elapsed();
    // The control: the same every-second runs in a namespace of their own, served by a controller
    // of their own (no hostile neighbour), measured in the same window: what the machine's load
    // alone does to a healthy namespace then.
    let mut control = Env::new("noisy-control").await?;
    let control_run = control.ns.clone();
    let control_selector = format!("{RUN_LABEL}={control_run}");
    control
        .start_controller(&["--namespace=", "--label-selector", &control_selector])
        .await?;
    let (_control_observer, control_skews) =
        healthy_namespace(&control, &control_run, &names, "* * * * * *").await?;
    let (started, from, r0) = (Instant::now(), Timestamp::now(), reconciles().await?);
    let held_before = hole.held();
    measure(
        &healthy,
        "the window with the hostile namespace",
        started,
        WINDOW,
    )
    .await?;
    let held_in_window = hole.held() - held_before;
    let due = instants(from, Timestamp::now(), 1);
    let with_hostile = window(&healthy, &skews, &names, &due).await?.skews;
    let beside = window(&control, &control_skews, &names, &due).await?.skews;
    let rate_hostile = (reconciles().await? - r0) / started.elapsed().as_secs_f64();
    // The attack stayed live (the black hole took connections and never answered) and no
    // hostile run started.
    let hostile_jobs = hostile.job_list().await?.len();
    // Every target was tried (its probes backed off up to 30 s since, so the 25 s window may
    // hold none of a target's next tries).
    ensure(
        &healthy,
        hole.held() >= HOSTILE_SECRETS as u64,
        (
            "the black hole took a connection for each hostile target",
            ("held in all", hole.held()),
            ("of which in the measured window", held_in_window),
        ),
    )
    .await?;
    let (a, h, c) = (p99(&alone), p99(&with_hostile), p99(&beside));
    let ratio = h / a.max(c).max(BASELINE_FLOOR);
    eprintln!(
        "noisy neighbours: alone {} ({rate_alone:.0} reconciles/s); with {HOSTILE} black-holed SingletonJobs {} ({rate_hostile:.0} reconciles/s); a control namespace meanwhile {}; ratio {ratio:.2} (p99 with / max(p99 alone, p99 of the control, {BASELINE_FLOOR} s); {:.2} against alone without the floor); every hostile one told BackstopReady=False {settled:.1?} after their creation; {hostile_jobs} hostile Jobs",
        describe(&alone),
        describe(&with_hostile),
        describe(&beside),
        h / a
    );
    ensure(
        &healthy,
        hostile_jobs == 0,
        ("no hostile run", hostile_jobs),
    )
    .await?;
    ensure(
        &healthy,
        ratio <= 2.0,
        (
            "the healthy namespace's skew p99 within 2x of its value alone (or of a control's meanwhile)",
            describe(&alone),
            describe(&with_hostile),
            describe(&beside),
        ),
    )
    .await?;
    Ok(())
}

/// The `BackstopReady` condition of SingletonJob `name`, once it is False: its message.
async fn backstop_not_ready(env: &Env, name: &str) -> Result<String> {
    env.wait_for(
        &format!("BackstopReady=False on {name}"),
        Duration::from_secs(40),
        || async {
            let s = env.get_sj(name).await?.status.unwrap_or_default();
            Ok(s.conditions
                .iter()
                .find(|c| c.type_ == "BackstopReady" && c.status == "False")
                .map(|c| c.message.clone()))
        },
    )
    .await
}

#[tokio::test]
async fn a_backstop_host_outside_the_allow_list_is_refused_untried() -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut env = Env::new("allow-list").await?;
    // A server outside the list that would answer: it counts the connections it gets.
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await?;
    let port = listener.local_addr()?.port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let server = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(conn);
        }
    });
    env.start_controller(&["--backstop-allowed-hosts", "127.0.0.1/32,::1/128"])
        .await?;
    let url = |host: &str, port: u16| format!("postgres://u@{host}:{port}/db?sslmode=disable");
    let secrets = [
        ("outside-open", url("127.0.0.2", port)),
        ("outside-closed", url("127.0.0.3", 1)),
        ("outside-name", url("no-such-host.invalid", 5432)),
        ("inside-closed", url("127.0.0.1", 1)),
        // Inside by its addresses: a name resolved once and dialled at the address checked.
        (
            "good",
            database_url()?.replace("@127.0.0.1:", "@localhost:"),
        ),
    ];
    let prefix = table_prefix(&env);
    for (name, u) in &secrets {
        backstop_secret(&env, name, u, true).await?;
        let spec = backstop_spec(name, &prefix, "");
        env.create_sj(&sj_yaml(name, "*/2 * * * * *", &spec))
            .await?;
    }

    let mut outside = Vec::new();
    for name in ["outside-open", "outside-closed", "outside-name"] {
        outside.push(backstop_not_ready(&env, name).await?);
    }
    let inside = backstop_not_ready(&env, "inside-closed").await?;
    env.wait_for(
        "a run of the allowed backstop",
        Duration::from_secs(40),
        || async {
            let jobs = env.job_list().await?;
            Ok(jobs
                .iter()
                .any(|j| {
                    j.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("good-"))
                })
                .then_some(()))
        },
    )
    .await?;
    let refused = singleton::backstop::NOT_ALLOWED;
    ensure(
        &env,
        outside
            .iter()
            .all(|m| m.contains(refused) && *m == outside[0]),
        (
            "one message for every host outside, refused or open or unknown",
            &outside,
        ),
    )
    .await?;
    ensure(
        &env,
        !inside.contains(refused) && inside.to_lowercase().contains("refused"),
        ("a host inside keeps its helpful message", &inside),
    )
    .await?;
    ensure(
        &env,
        accepted.load(Ordering::SeqCst) == 0,
        (
            "no connection to a host outside",
            accepted.load(Ordering::SeqCst),
        ),
    )
    .await?;
    ensure(
        &env,
        env.job_list().await?.iter().all(|j| {
            j.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("good-"))
        }),
        "no run without its backstop",
    )
    .await?;
    eprintln!("allow-list: outside {outside:?}; inside {inside:?}");
    server.abort();
    Ok(())
}
