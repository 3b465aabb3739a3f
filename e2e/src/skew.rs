//! A namespace's schedule skew, seen from outside: a watch of its Jobs notes when each run's Job
//! was first allowed to run, minus its scheduled instant. Shared by the tests that measure one
//! namespace's runs while another misbehaves (tests/noisy.rs, tests/hostile.rs).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use jiff::Timestamp;
use tokio::sync::mpsc;

use crate::observer::{Observer, Seen};
use crate::{Env, backstop_secret, backstop_spec, database_url, sj_yaml, table_prefix};

/// The skews seen so far: (SingletonJob, scheduled instant, seconds from it until the Job could
/// run).
pub type Skews = Arc<Mutex<Vec<(String, Timestamp, f64)>>>;

/// Notes the skew of every run of `env`'s namespace as the watch sees it allowed to run.
pub fn record_skews(env: &Env) -> (Observer, Skews) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let observer = Observer::start(env.client.clone(), &env.ns, tx);
    let skews: Skews = Arc::default();
    let out = skews.clone();
    tokio::spawn(async move {
        while let Some(seen) = rx.recv().await {
            if let Seen::Ran { sj, period, .. } = seen {
                let skew = Timestamp::now().duration_since(period).as_secs_f64();
                out.lock().unwrap().push((sj, period, skew));
            }
        }
    });
    (observer, skews)
}

/// The healthy namespace of a noisy-neighbour test: `env`'s SingletonJobs `names` on `schedule`
/// (labelled with `run`, so a controller started with `--label-selector` sees them), each
/// claimed in a reachable backstop, and the watch noting their skews; returned once each has run
/// twice.
pub async fn healthy_namespace(
    env: &Env,
    run: &str,
    names: &[&str],
    schedule: &str,
) -> Result<(Observer, Skews)> {
    backstop_secret(env, "db", &database_url()?, true).await?;
    let (observer, skews) = record_skews(env);
    let spec = backstop_spec(
        "db",
        &table_prefix(env),
        "  concurrencyPolicy: Allow\n  catchUp: All\n",
    );
    for name in names {
        env.create_sj_labelled(run, &sj_yaml(name, schedule, &spec))
            .await?;
    }
    env.wait_for(
        "the healthy runs under way",
        Duration::from_secs(30),
        || async { Ok((skews.lock().unwrap().len() >= 2 * names.len()).then_some(())) },
    )
    .await?;
    Ok((observer, skews))
}

/// The instants in [from, to) of a schedule that fires every `every` seconds, on the second.
pub fn instants(from: Timestamp, to: Timestamp, every: i64) -> Vec<Timestamp> {
    let first = from.as_second() + i64::from(from.subsec_nanosecond() > 0);
    (first..to.as_second().max(first))
        .filter(|s| s.rem_euclid(every) == 0)
        .filter_map(|s| Timestamp::from_second(s).ok())
        .collect()
}

/// What a window of runs showed: the skews (sorted), and the periods with no run.
pub struct Window {
    pub skews: Vec<f64>,
    pub missing: Vec<(String, Timestamp)>,
}

/// The skews of the runs of `sjs` whose instants are `due`, after waiting (up to 30 s) for all
/// of them; one still missing then counts with its wait so far, and is named in `missing`.
pub async fn window(env: &Env, skews: &Skews, sjs: &[&str], due: &[Timestamp]) -> Result<Window> {
    let wanted: Vec<(String, Timestamp)> = sjs
        .iter()
        .flat_map(|sj| due.iter().map(move |t| (sj.to_string(), *t)))
        .collect();
    let seen = || -> Vec<(String, Timestamp, f64)> {
        let s = skews.lock().unwrap();
        s.iter()
            .filter(|(sj, p, _)| wanted.iter().any(|(w, t)| w == sj && t == p))
            .cloned()
            .collect()
    };
    let all_seen = env
        .wait_for(
            "every run of the window",
            Duration::from_secs(30),
            || async { Ok((seen().len() >= wanted.len()).then_some(())) },
        )
        .await;
    let got = seen();
    let mut missing = Vec::new();
    let mut sorted: Vec<f64> = got.iter().map(|(_, _, s)| *s).collect();
    if all_seen.is_err() {
        for (sj, t) in &wanted {
            if !got.iter().any(|(s, p, _)| s == sj && p == t) {
                missing.push((sj.clone(), *t));
                sorted.push(Timestamp::now().duration_since(*t).as_secs_f64());
            }
        }
    }
    sorted.sort_by(f64::total_cmp);
    Ok(Window {
        skews: sorted,
        missing,
    })
}

pub fn p99(sorted: &[f64]) -> f64 {
    if sorted.is_empty() {
        return f64::INFINITY;
    }
    let i = ((sorted.len() as f64) * 0.99).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

pub fn describe(sorted: &[f64]) -> String {
    if sorted.is_empty() {
        return "n=0".into();
    }
    let at = |q: f64| sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)];
    format!(
        "n={} p50={:.3}s p99={:.3}s max={:.3}s",
        sorted.len(),
        at(0.5),
        p99(sorted),
        sorted.last().copied().unwrap_or_default()
    )
}

/// Waits out a measuring window of `length` (the wait is the measurement, not a guess at a
/// condition).
pub async fn measure(env: &Env, what: &str, from: Instant, length: Duration) -> Result<()> {
    env.wait_for(what, length + Duration::from_secs(5), || async {
        Ok((from.elapsed() >= length).then_some(()))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_the_schedules_seconds_in_the_half_open_window() {
        let t = |s: i64| Timestamp::from_second(s).unwrap();
        assert_eq!(instants(t(10), t(16), 2), vec![t(10), t(12), t(14)]);
        let just_after = t(10) + jiff::SignedDuration::from_millis(1);
        assert_eq!(instants(just_after, t(16), 2), vec![t(12), t(14)]);
        assert_eq!(instants(t(10), t(13), 1), vec![t(10), t(11), t(12)]);
        assert!(instants(t(16), t(10), 1).is_empty());
    }

    #[test]
    fn p99_of_a_few_is_the_largest_and_of_none_is_infinite() {
        assert_eq!(p99(&[0.1, 0.2, 0.3]), 0.3);
        assert_eq!(p99(&[]), f64::INFINITY);
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(p99(&hundred), 99.0);
    }
}
