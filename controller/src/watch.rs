//! The watches and the wiring: the reflectors over SingletonJobs and their Jobs (with what their
//! caches keep), the Controller that runs [`crate::reconcile`] for each change, the reconciles
//! asked for when the gate opens, the clock's verdict changes, a confirm ends, a notification's
//! delivery has news or a burst's lead grows, the error policy, and the shutdown.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::controller::{self as kube_controller, Action, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::api::{SingletonCalendar, SingletonJob};
use crate::backstop::health::Health;
use crate::backstop::{AllowedHosts, BackstopCache};
use crate::clock::Clock;
use crate::context::{Context, Due, InFlight, OwnWrites, Recent};
use crate::events::Events;
use crate::gate::Gate;
use crate::lanes::Lanes;
use crate::notify::Notifier;
use crate::watch_backoff::{WatchBackoff, retrying};
use crate::watch_decode::{self, Listed};
use crate::{Error, Result, naming};

/// How long in-flight reconciles get to finish their writes once the controller stops.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(250);

/// At most this many reconciles run at once (a bound on memory; see docs/performance.md). A run
/// holds its slot from claim to create, not through its confirm ([`InFlight`]).
const MAX_CONCURRENT_RECONCILES: u16 = 128;

/// Objects per page of the watches' (re)lists; kube's default is 500. A page is read and decoded
/// whole before anything of it is trimmed (the Job cache's `slim_job`, the 64 KiB template cap):
/// at 500, 150 SingletonJobs near the API server's 1.5 MiB object limit, or as many large Jobs
/// labelled `singleton.dev/job`, made one page of about 225 MB against the chart's 256 Mi memory
/// limit, an out-of-memory kill on every relist (review N5). At 50 such a page is a tenth of
/// that; a relist of 1,000 objects takes 20 requests instead of 2.
pub const LIST_PAGE: u32 = 50;

/// The configuration of every watch of the controller: pages of [`LIST_PAGE`].
fn list_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE)
}

/// The watch of the controller's Jobs (label `singleton.dev/job`), each slimmed as it arrives.
fn job_watch(api: Api<Job>) -> impl futures::Stream<Item = watcher::Result<watcher::Event<Job>>> {
    watcher(api, list_config().labels(naming::LABEL_JOB)).modify(slim_job)
}

fn calendar_watch(
    api: Api<SingletonCalendar>,
) -> impl futures::Stream<Item = watcher::Result<watcher::Event<SingletonCalendar>>> {
    watcher(api, list_config())
}

fn error_policy(sj: Arc<SingletonJob>, err: &Error, _ctx: Arc<Context>) -> Action {
    crate::metrics::global().reconcile_error(err);
    match err {
        // Someone else wrote first: re-read (the watch brings the new object) and decide again.
        Error::Conflict(_) => Action::requeue(Duration::from_millis(50)),
        Error::NotLeader => Action::await_change(),
        // A run's transaction holds the fence row; under Replace that run is being stopped.
        Error::FenceHeld(why) => {
            tracing::info!(sj = %sj.key(), %why, "waiting for the backstop's fence row");
            Action::requeue(Duration::from_secs(1))
        }
        Error::Stopping(why) => {
            tracing::info!(sj = %sj.key(), %why, "waiting for a replaced run to stop");
            Action::requeue(Duration::from_secs(1))
        }
        // A standby's turn comes by the database's clock; our clock only paces the retry.
        Error::StandbyWaiting { until } => {
            let wait = until.duration_since(jiff::Timestamp::now());
            let wait = Duration::try_from(wait).unwrap_or_default();
            Action::requeue(wait.clamp(Duration::from_millis(200), Duration::from_secs(1)))
        }
        _ => {
            tracing::warn!(sj = %sj.key(), kind = err.kind(), error = %err, "reconcile failed");
            Action::requeue(Duration::from_secs(5))
        }
    }
}

/// What the cache keeps of a Job: its metadata (name, labels, annotations, owner), status and
/// `spec.suspend`, which is all the controller reads from a cached Job. Managed fields and the
/// pod template are most of a Job's size, and a cache of thousands of Jobs held them all.
fn slim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    // Of the spec, only whether it may run pods (see run.rs, step 8).
    let suspend = job.spec.as_ref().and_then(|s| s.suspend);
    job.spec = suspend.map(|suspend| k8s_openapi::api::batch::v1::JobSpec {
        suspend: Some(suspend),
        ..Default::default()
    });
}

/// Configuration of a controller instance.
#[derive(Clone, Debug)]
pub struct Config {
    /// Watch only this namespace (all when None).
    pub namespace: Option<String>,
    /// Reporting controller name in Events.
    pub reporter: String,
    /// Instance name (pod name) in Events.
    pub instance: Option<String>,
    /// Clock verdicts, fed by the client's responses ([`crate::clock::Samples::client`]).
    pub clock: crate::clock::Samples,
    /// How old a clock verdict may be when a run may start.
    pub clock_check_interval: Duration,
    /// Serve only the SingletonJobs with these labels (a label selector; all when None).
    pub label_selector: Option<String>,
    /// The hosts a backstop may point at (empty: all).
    pub backstop_allowed_hosts: AllowedHosts,
    /// This cluster's identity in shared backstop databases (`--cluster-id`; empty: none).
    pub cluster_id: String,
    /// The notification targets of SingletonJobs without `spec.notify` (`--default-notify`).
    pub notify: crate::notify::Defaults,
    /// How long before their instants runs are prepared (`--prepare-lead-seconds`; 0: never).
    pub prepare_lead_seconds: u32,
    /// How far a burst may raise that lead (`--prepare-max-lead-seconds`; not below it).
    pub prepare_max_lead_seconds: u32,
}

impl Config {
    /// Refuses settings that contradict each other (clap checks each flag's own range).
    pub fn validate(&self) -> Result<()> {
        check_prepare_leads(self.prepare_lead_seconds, self.prepare_max_lead_seconds)
    }
}

/// The adaptive lead may only raise the base lead: a cap below it would make the flags say two
/// things at once. Checked at start-up, before anything connects.
pub fn check_prepare_leads(lead: u32, max: u32) -> Result<()> {
    if max < lead {
        return Err(Error::Config(format!(
            "--prepare-max-lead-seconds ({max}) is below --prepare-lead-seconds ({lead}): the \
             longest lead a burst may get cannot be shorter than every run's lead; raise the \
             first or lower the second"
        )));
    }
    Ok(())
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    client: Client,
    cfg: Config,
    gate: Gate,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (sjs, cals, jobs_api) = apis(&client, cfg.namespace.as_deref()).await?;

    let clock = Arc::new(Clock::new(
        cfg.clock.clone(),
        client.clone(),
        cfg.clock_check_interval,
    ));
    // A first verdict before anything is reconciled, narrowed soon after.
    clock.fresh().await;
    clock.narrow_in_background();
    let clock_rx = clock.subscribe();

    let (jobs, job_stream) = cached("jobs", job_watch(jobs_api));
    let (calendars, calendar_stream) = cached("singletoncalendars", calendar_watch(cals));
    let (sj_reader, sj_events) = singletonjobs(sjs, cfg.label_selector.as_deref());

    // A clock verdict that changes, or this replica starting to lead, re-evaluates every
    // SingletonJob.
    let reconcile_all = futures::stream::select(
        WatchStream::from_changes(clock_rx).map(|_| ()),
        gate.opened(),
    );
    let (ctx, asked) = context(client, &cfg, gate, clock, (jobs, calendars));
    let by_calendar = sj_reader.clone();
    let (forget_ctx, store) = (ctx.clone(), sj_reader.clone());
    let sj_stream = retrying(
        "singletonjobs",
        sj_events
            .inspect_ok(move |event| forget_deleted(&forget_ctx, &store, event))
            .applied_objects(),
    )
    .map(Ok::<_, watcher::Error>);

    let (mut stop_rx, forceful) = stop_signals(shutdown);
    Controller::for_stream(sj_stream, sj_reader)
        .with_config(kube_controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        // Each watch retries on its own (`retrying`), so this backoff of the merged trigger
        // streams never sees an error; kube's default here left the SingletonJob watch down for
        // minutes after an API server outage (watch_backoff.rs).
        .trigger_backoff(WatchBackoff::default())
        .owns_stream(job_stream)
        // A calendar's edit re-decides the SingletonJobs that name it.
        .watches_stream(calendar_stream, move |cal| {
            naming_calendar(&by_calendar, &cal)
        })
        .reconcile_all_on(reconcile_all)
        .reconcile_on(asked)
        .graceful_shutdown_on(async move {
            // The controller wants a Sync future; a watch receiver is one.
            let _ = stop_rx.changed().await;
        })
        .run(crate::reconcile::reconcile, error_policy, ctx)
        .take_until(forceful)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
    Ok(())
}

/// The SingletonJobs' cache and watch, of those with `labels` (all when None): decoded object by
/// object, slimmed for the cache ([`watch_decode`]).
fn singletonjobs(
    sjs: Api<Listed>,
    labels: Option<&str>,
) -> (
    reflector::Store<SingletonJob>,
    impl futures::Stream<Item = watcher::Result<watcher::Event<SingletonJob>>> + Send + 'static,
) {
    let (reader, writer) = reflector::store::<SingletonJob>();
    let config = match labels {
        Some(selector) => list_config().labels(selector),
        None => list_config(),
    };
    let events = watcher(sjs, config).map_ok(watch_decode::unwrap_event);
    (reader, reflector::reflector(writer, events))
}

/// `shutdown` as a watch receiver (kube's graceful shutdown wants a Sync future; a receiver is
/// one), and a future that resolves a short grace after it. kube's graceful shutdown also waits
/// for scheduled requeues (ours sleep until the next period), which would hold up a handover.
/// Once stopping, the gate is closed, so nothing queued could write anyway: after the grace for
/// writes in flight, stop outright.
fn stop_signals(
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> (watch::Receiver<()>, impl std::future::Future<Output = ()>) {
    let (stop_tx, stop_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        stop_tx.send_replace(());
    });
    let mut forceful_rx = stop_rx.clone();
    let forceful = async move {
        let _ = forceful_rx.changed().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    (stop_rx, forceful)
}

/// What the process keeps of SingletonJobs that are gone: the metric series labelled with them,
/// their backstop connections and short memories. SingletonJobs have no finalizer, so a deletion
/// is seen here, by the watch, not by a reconcile; deletions missed while the watch was down are
/// caught when it lists again (`InitDone`: everything not in the fresh cache is gone).
fn forget_deleted(
    ctx: &Arc<Context>,
    store: &reflector::Store<SingletonJob>,
    event: &watcher::Event<SingletonJob>,
) {
    match event {
        watcher::Event::Delete(sj) => {
            ctx.forget(sj);
            crate::run::prepared::withdraw_deleted(ctx, sj);
        }
        watcher::Event::InitDone => {
            let live: std::collections::HashSet<(String, String)> = store
                .state()
                .iter()
                .map(|sj| {
                    let ns = sj.metadata.namespace.clone().unwrap_or_default();
                    (ns, sj.metadata.name.clone().unwrap_or_default())
                })
                .collect();
            crate::metrics::global().forget_all_but(&live);
            ctx.due.keep_only(&live);
        }
        _ => {}
    }
}

/// A reflector over a watch: its cache, and the objects it touched (its errors retried by
/// [`retrying`], never passed on).
fn cached<K>(
    name: &'static str,
    watch: impl futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
) -> (
    reflector::Store<K>,
    impl futures::Stream<Item = watcher::Result<K>> + Send + 'static,
)
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store::<K>();
    let stream = retrying(name, reflector::reflector(writer, watch).touched_objects())
        .map(Ok::<_, watcher::Error>);
    (reader, stream)
}

/// The SingletonJobs in a calendar's namespace that name it.
fn naming_calendar(
    sjs: &reflector::Store<SingletonJob>,
    cal: &SingletonCalendar,
) -> Vec<ObjectRef<SingletonJob>> {
    let (ns, name) = (
        cal.metadata.namespace.as_deref(),
        cal.metadata.name.as_deref(),
    );
    sjs.state()
        .iter()
        .filter(|sj| sj.metadata.namespace.as_deref() == ns)
        .filter(|sj| {
            sj.spec
                .exclusions
                .as_ref()
                .is_some_and(|x| x.calendars.iter().any(|c| Some(c.as_str()) == name))
        })
        .map(|sj| ObjectRef::from_obj(sj.as_ref()))
        .collect()
}

/// The SingletonJobs (each decoded on its own: [`Listed`]), SingletonCalendars and Jobs watched:
/// of `namespace`, or of all. Fails fast, with a clear message, when a CRD is not installed.
async fn apis(
    client: &Client,
    namespace: Option<&str>,
) -> Result<(Api<Listed>, Api<SingletonCalendar>, Api<Job>)> {
    let (sjs, cals, jobs): (Api<Listed>, Api<SingletonCalendar>, Api<Job>) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let installed = |kind: &'static str| {
        move |e: kube::Error| {
            Error::Config(format!(
                "cannot list {kind} (is the CRD installed? try `kubectl apply -f crds/`): {e}"
            ))
        }
    };
    let one = ListParams::default().limit(1);
    sjs.list(&one).await.map_err(installed("SingletonJobs"))?;
    cals.list(&one)
        .await
        .map_err(installed("SingletonCalendars"))?;
    Ok((sjs, cals, jobs))
}

/// The context every reconcile shares, and the SingletonJobs it asks to reconcile: a confirm
/// done, a notification's news, and those whose preparation must begin earlier because the lead
/// of their burst grew ([`Due`]). The memory give-back starts with it.
fn context(
    client: Client,
    cfg: &Config,
    gate: Gate,
    clock: Arc<Clock>,
    (jobs, calendars): (reflector::Store<Job>, reflector::Store<SingletonCalendar>),
) -> (
    Arc<Context>,
    impl futures::Stream<Item = ObjectRef<SingletonJob>> + Send + 'static,
) {
    let (confirming, confirmed_runs) = InFlight::new();
    let (notifier, notified) = Notifier::new(client.clone(), gate.clone(), cfg.notify.clone());
    let (due, lead_grew) = Due::new();
    let asked =
        futures::stream::select(futures::stream::select(confirmed_runs, notified), lead_grew);
    let reporter = Reporter {
        controller: cfg.reporter.clone(),
        instance: cfg.instance.clone(),
    };
    let lanes = Lanes::new(crate::lanes::IN_FLIGHT);
    crate::memory::limit_arenas();
    tokio::spawn(crate::memory::give_back_after_bursts(lanes.clone()));
    let ctx = Arc::new(Context {
        client: client.clone(),
        events: Events::new(client, reporter, lanes.clone()),
        lanes,
        jobs,
        calendars,
        clock,
        gate,
        backstops: BackstopCache::new(cfg.backstop_allowed_hosts.clone())
            .with_cluster(cfg.cluster_id.clone()),
        backstop_health: Health::default(),
        rejections_seen: Mutex::default(),
        own_writes: OwnWrites::default(),
        confirming,
        resumed: Recent::default(),
        fresh_reads: Default::default(),
        refused: Default::default(),
        notifier,
        prepare_lead_seconds: cfg.prepare_lead_seconds,
        prepare_max_lead_seconds: cfg.prepare_max_lead_seconds,
        due,
    });
    (ctx, asked)
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;

    use super::*;

    #[test]
    fn a_max_lead_below_the_lead_is_refused_naming_both_flags() {
        assert!(check_prepare_leads(0, 600).is_ok());
        assert!(check_prepare_leads(30, 30).is_ok());
        assert!(check_prepare_leads(900, 3600).is_ok());
        assert!(check_prepare_leads(0, 0).is_ok());
        let err = check_prepare_leads(60, 30).unwrap_err().to_string();
        assert!(
            err.contains("--prepare-max-lead-seconds (30)")
                && err.contains("--prepare-lead-seconds (60)"),
            "{err}"
        );
    }

    /// The first request of each of the controller's watches: its list, with `limit` at
    /// [`LIST_PAGE`] (review N5: kube's default of 500 buffered a page of up to 500 large
    /// objects).
    #[tokio::test]
    async fn every_watch_lists_in_pages_of_fifty() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(mock, "default");
        let (_, sjs) = singletonjobs(Api::all(client.clone()), Some("team=a"));
        let jobs = job_watch(Api::all(client.clone()));
        let cals = calendar_watch(Api::all(client));
        for (what, first) in [
            ("singletonjobs", Box::pin(sjs.map_ok(|_| ())).boxed()),
            ("jobs", Box::pin(jobs.map_ok(|_| ())).boxed()),
            ("singletoncalendars", Box::pin(cals.map_ok(|_| ())).boxed()),
        ] {
            // Polled on and on: the watcher's first event (Init) comes before its list.
            let poll = tokio::spawn(async move {
                let mut first = first;
                while first.next().await.is_some() {}
            });
            let (req, _send) = handle.next_request().await.expect("a list request");
            let query = req.uri().query().unwrap_or_default().to_string();
            assert!(req.uri().path().ends_with(what), "{what}: {}", req.uri());
            assert!(
                query
                    .split('&')
                    .any(|kv| kv == format!("limit={LIST_PAGE}")),
                "{what}: {query}"
            );
            poll.abort();
        }
    }
}
