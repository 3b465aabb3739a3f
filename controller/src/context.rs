//! What every reconcile shares: the API client and the lanes its requests wait in, the caches,
//! the clock, the gate, the backstop connections, and this process's short memories that keep a
//! reconcile from acting on a copy older than its own writes.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{SingletonCalendar, SingletonJob, SingletonJobStatus};
use crate::backstop::BackstopCache;
use crate::backstop::health::Health;
use crate::clock::Clock;
use crate::events::Events;
use crate::gate::Gate;
use crate::lanes::Lanes;
use crate::notify::Notifier;
use crate::schedule::{DayRules, Schedule, ScheduleError};
use crate::sync::lock;
use crate::{Error, Result};

mod due;

pub use due::Due;

/// Shared by every reconcile.
pub struct Context {
    pub client: Client,
    pub events: Events,
    /// Jobs labelled `singleton.dev/job`, kept current by a watch: metadata, status and
    /// `spec.suspend` only (see [`crate::watch`]).
    pub jobs: Store<Job>,
    /// SingletonCalendars, kept current by a watch (a SingletonJob's excluded days).
    pub calendars: Store<SingletonCalendar>,
    /// Every request of a reconcile to the API server takes a slot here (see [`crate::lanes`]).
    pub lanes: Lanes,
    pub clock: Arc<Clock>,
    pub gate: Gate,
    /// One backstop connection per SingletonJob that has one.
    pub backstops: BackstopCache,
    /// How each backstop target fared lately, and the probes in flight per namespace.
    pub backstop_health: Health,
    /// The backstop's refused-stale-write count last seen, per SingletonJob (for Events).
    pub rejections_seen: Mutex<HashMap<String, u64>>,
    /// The claims this process confirmed, until the watch delivers them.
    pub own_writes: OwnWrites,
    /// The confirms and resumes (steps 7 and 8), and the promotes of prepared runs (step 4 of
    /// run/prepared.rs), running in tasks of their own.
    pub confirming: InFlight,
    /// Job uids this process resumed lately (step 8): until the Job watch shows them resumed,
    /// the cache still says suspended, and resuming them again would cost a request each.
    pub resumed: Recent,
    /// SingletonJobs checked by a quorum read just before a prepared run's instant.
    pub fresh_reads: FreshReads,
    /// The period whose preparation was refused (its Job's name taken, the Job rejected, the
    /// backstop's claim held), per SingletonJob uid: it is not prepared again, and runs at its
    /// instant as without preparation ([`crate::run::decided`]).
    pub refused: Mutex<HashMap<String, Timestamp>>,
    /// Delivers the events `status.notifications` holds (`spec.notify`).
    pub notifier: Arc<Notifier>,
    /// `--prepare-lead-seconds`: how long before their instants runs are prepared, unless a
    /// SingletonJob says (`spec.prepareLeadSeconds`); 0: never (issue 33).
    pub prepare_lead_seconds: u32,
    /// `--prepare-max-lead-seconds`: how far the adaptive lead may raise that lead for a burst.
    pub prepare_max_lead_seconds: u32,
    /// Which SingletonJobs prepare their next run for each instant: the size of a burst, for
    /// the adaptive lead.
    pub due: Due,
}

impl Context {
    /// The SingletonJob's periods, with the SingletonCalendars it names as the watch has them
    /// (a calendar not yet seen: [`ScheduleError::MissingCalendar`]).
    pub fn schedule_of(&self, sj: &SingletonJob) -> std::result::Result<Schedule, ScheduleError> {
        let names = sj
            .spec
            .exclusions
            .as_ref()
            .map_or(&[][..], |x| &x.calendars[..]);
        let calendars: HashMap<String, DayRules> = names
            .iter()
            .filter_map(|name| {
                let key =
                    ObjectRef::new(name).within(sj.metadata.namespace.as_deref().unwrap_or(""));
                self.calendars
                    .get(&key)
                    .map(|cal| (name.clone(), cal.spec.rules.clone()))
            })
            .collect();
        crate::decide::schedule(&sj.spec, &calendars)
    }

    /// Remembers that `period`'s preparation was refused: it is not prepared again.
    pub fn refuse_preparation(&self, sj: &SingletonJob, period: Timestamp) {
        if let Some(uid) = &sj.metadata.uid {
            lock(&self.refused).insert(uid.clone(), period);
        }
    }

    /// The period whose preparation was refused last, if any.
    pub fn refused_preparation(&self, sj: &SingletonJob) -> Option<Timestamp> {
        let uid = sj.metadata.uid.as_ref()?;
        lock(&self.refused).get(uid).copied()
    }

    /// Forgets a deleted SingletonJob: its metric series, its backstop connection and what this
    /// process remembered of it.
    pub fn forget(&self, sj: &SingletonJob) {
        crate::metrics::global().forget(sj);
        self.own_writes.forget(sj);
        self.backstops.forget(&sj.key());
        self.notifier.forget(sj);
        lock(&self.rejections_seen).remove(&sj.key());
        self.due.leave(&ObjectRef::from_obj(sj));
        if let Some(uid) = &sj.metadata.uid {
            self.backstop_health.forget(uid);
            lock(&self.refused).remove(uid);
        }
    }
}

/// How long this process remembers a claim it confirmed, to recognise cached copies from before
/// it ([`OwnWrites::predates`]); a watch that lags longer costs a re-read and a 409, as without
/// it.
const OWN_WRITES_TTL: Duration = Duration::from_secs(60);

/// The highest token whose claim this process confirmed (step 7), and the highest whose prepared
/// run it promoted (issue 33), and when, per SingletonJob uid (a re-created SingletonJob has a new
/// uid, and without a backstop its tokens start again). Only needed until the watch delivers the
/// write: entries expire.
#[derive(Default)]
pub struct OwnWrites {
    confirmed: Mutex<HashMap<String, (u64, Instant)>>,
    promoted: Mutex<HashMap<String, (u64, Instant)>>,
}

impl OwnWrites {
    /// Records that this process confirmed the claim with `token` (it is no longer pending).
    pub fn remember(&self, sj: &SingletonJob, token: u64) {
        note(&self.confirmed, sj, token);
    }

    /// Records that this process promoted the prepared run with `token` (it is active now).
    pub fn remember_promoted(&self, sj: &SingletonJob, token: u64) {
        note(&self.promoted, sj, token);
    }

    /// Whether `sj` (with `status`) is older than a write of this process: a claim it confirmed
    /// (tokens only increase and the confirmed status carries its token, so a copy whose token
    /// is lower, or whose pending claim has that token or a lower one, was read before the
    /// confirm), or a prepared run it promoted (a copy that still names it as prepared; the
    /// resume's Job event triggers a reconcile that may read it, and would promote again from an
    /// old resourceVersion: a request and a 409 per run in a burst).
    ///
    /// The first copy that is not older (the watch delivered the write, or something newer)
    /// ends the memory: the cache never goes back, so no older copy can come any more, and a
    /// status that later shows a lower token was wiped or restored, which must be seen (it is
    /// raised to the Jobs, [`crate::observe::behind`]), not skipped as a stale copy.
    pub fn predates(&self, sj: &SingletonJob, status: &SingletonJobStatus) -> bool {
        let confirm = older(&self.confirmed, sj, |t| {
            status.fencing_token < t || status.pending_claim.as_ref().is_some_and(|c| c.token <= t)
        });
        let promote = older(&self.promoted, sj, |t| {
            status.prepared.as_ref().is_some_and(|p| p.token <= t)
        });
        confirm || promote
    }

    /// Forgets a deleted SingletonJob.
    pub fn forget(&self, sj: &SingletonJob) {
        if let Some(uid) = &sj.metadata.uid {
            lock(&self.confirmed).remove(uid);
            lock(&self.promoted).remove(uid);
        }
    }
}

/// Records `token` in `map` for `sj`, now (the highest kept).
fn note(map: &Mutex<HashMap<String, (u64, Instant)>>, sj: &SingletonJob, token: u64) {
    if let Some(uid) = sj.metadata.uid.clone() {
        let now = Instant::now();
        let mut m = lock(map);
        // Bounded by the writes of the last minute, whatever the churn of SingletonJobs.
        if m.len() >= 1024 {
            m.retain(|_, (_, at)| now.duration_since(*at) < OWN_WRITES_TTL);
        }
        let e = m.entry(uid).or_insert((token, now));
        *e = (e.0.max(token), now);
    }
}

/// Whether `sj`'s copy is older than the write `map` remembers for it (`is_older` of its
/// token); the first copy that is not ends the memory (see [`OwnWrites::predates`]).
fn older(
    map: &Mutex<HashMap<String, (u64, Instant)>>,
    sj: &SingletonJob,
    is_older: impl FnOnce(u64) -> bool,
) -> bool {
    let Some(uid) = sj.metadata.uid.as_ref() else {
        return false;
    };
    let mut m = lock(map);
    let Some(&(t, at)) = m.get(uid) else {
        return false;
    };
    let stale = at.elapsed() < OWN_WRITES_TTL && is_older(t);
    if !stale {
        m.remove(uid);
    }
    stale
}

/// Keys seen lately (at most `Recent::TTL` ago), bounded by what a minute can bring.
#[derive(Default)]
pub struct Recent(Mutex<HashMap<String, Instant>>);

impl Recent {
    const TTL: Duration = Duration::from_secs(30);

    pub fn note(&self, key: &str) {
        let now = Instant::now();
        let mut m = lock(&self.0);
        if m.len() >= 1024 {
            m.retain(|_, at| now.duration_since(*at) < Self::TTL);
        }
        m.insert(key.to_string(), now);
    }

    pub fn contains(&self, key: &str) -> bool {
        lock(&self.0)
            .get(key)
            .is_some_and(|at| at.elapsed() < Self::TTL)
    }
}

/// What a user can change that a reconcile must see at once: the spec (its generation) and the
/// operation annotations (the cached copy keeps no others).
pub fn asked(sj: &SingletonJob) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    sj.metadata.generation.hash(&mut h);
    sj.metadata.annotations.hash(&mut h);
    h.finish()
}

/// SingletonJobs read by quorum shortly before a prepared run's instant (its freshness check,
/// [`crate::run::prepared`]), by uid and what a user can change (spec generation, operation
/// annotations): the resume at the instant needs no second read while the cached copy is still
/// the one checked, a moment ago.
#[derive(Default)]
pub struct FreshReads(Mutex<HashMap<String, (u64, Instant)>>);

impl FreshReads {
    /// How long a check holds: from shortly before the instant to just after it.
    const TTL: Duration = Duration::from_secs(3);

    /// `uid`'s cached copy, whose user-visible state hashes to `asked`, was checked just now.
    pub fn note(&self, uid: &str, asked: u64) {
        let now = Instant::now();
        let mut m = lock(&self.0);
        m.retain(|_, (_, at)| now.duration_since(*at) < Self::TTL);
        m.insert(uid.to_string(), (asked, now));
    }

    /// Whether `uid`'s copy hashing to `asked` was checked within the last moments.
    pub fn holds(&self, uid: &str, asked: u64) -> bool {
        lock(&self.0)
            .get(uid)
            .is_some_and(|(a, at)| *a == asked && at.elapsed() < Self::TTL)
    }
}

/// The confirms (steps 7 and 8) and prepared runs' promotes in flight, each in its own task, by
/// SingletonJob uid.
///
/// A reconcile of a SingletonJob whose confirm is in flight does nothing: the status it read is
/// about to change, and acting on it would complete the claim a second time. When the confirm is
/// done (written, lost or failed), the SingletonJob is reconciled again, by a request on the
/// channel the controller listens to ([`InFlight::new`]); after a failure other than a lost
/// compare-and-swap, only after `RETRY_AFTER_FAILURE`, like a failed reconcile.
pub struct InFlight {
    uids: Mutex<HashSet<String>>,
    done: mpsc::UnboundedSender<ObjectRef<SingletonJob>>,
}

/// How long a confirm that failed (other than by a lost compare-and-swap) waits before its
/// SingletonJob is reconciled again; a reconcile would then find the claim pending and complete it.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

impl InFlight {
    /// The registry, and the stream of SingletonJobs to reconcile because their confirm is done.
    pub fn new() -> (Self, UnboundedReceiverStream<ObjectRef<SingletonJob>>) {
        let (done, rx) = mpsc::unbounded_channel();
        let registry = InFlight {
            uids: Mutex::default(),
            done,
        };
        (registry, UnboundedReceiverStream::new(rx))
    }

    /// Whether a confirm of `sj` is in flight.
    pub fn contains(&self, sj: &SingletonJob) -> bool {
        sj.metadata
            .uid
            .as_ref()
            .is_some_and(|uid| lock(&self.uids).contains(uid))
    }

    pub fn begin(&self, uid: Option<&str>) {
        if let Some(uid) = uid {
            lock(&self.uids).insert(uid.to_string());
        }
    }

    /// The confirm of `sj` (uid `uid`) ended with `result`: asks for its next reconcile.
    pub async fn end(&self, uid: Option<&str>, sj: ObjectRef<SingletonJob>, result: Result<()>) {
        if let Some(uid) = uid {
            lock(&self.uids).remove(uid);
        }
        if let Err(e) = &result {
            crate::metrics::global().reconcile_error(e);
            match e {
                Error::Conflict(_) | Error::NotLeader => {
                    tracing::debug!(error = %e, "confirm not written");
                }
                _ => {
                    tracing::warn!(kind = e.kind(), error = %e, "confirm failed");
                    tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                }
            }
        }
        // The controller may have stopped; then there is nobody to ask.
        let _ = self.done.send(sj);
    }
}

/// What the cache keeps of a SingletonJob: all but its managed fields and every annotation but
/// the operation requests (the only ones the controller reads). An object may carry 256 KiB of
/// annotations, kubectl's copy of the last applied spec among them, and every SingletonJob is
/// cached: kept, they would cost memory for nothing. Safe to drop: the controller writes a
/// SingletonJob only through the status subresource, where the API server ignores every change
/// outside `status`.
pub fn slim_sj(sj: &mut SingletonJob) {
    sj.metadata.managed_fields = None;
    if let Some(a) = sj.metadata.annotations.as_mut() {
        a.retain(|k, _| {
            crate::decide::ops::OperationKind::ALL
                .iter()
                .any(|kind| kind.annotation() == k)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A SingletonJob with uid `u` and `status`.
    fn with_status(status: SingletonJobStatus) -> SingletonJob {
        let mut sj = SingletonJob::new("a", Default::default());
        sj.metadata.uid = Some("u".into());
        sj.status = Some(status);
        sj
    }

    /// A status whose prepared run has `token`.
    fn prepared(token: u64) -> SingletonJobStatus {
        SingletonJobStatus {
            fencing_token: token,
            prepared: Some(crate::api::RunRef {
                unknown: Default::default(),
                late: false,
                period: jiff::Timestamp::UNIX_EPOCH.into(),
                token,
                job_name: "a-0".into(),
                claimed_at: None,
                job_uid: None,
                origin: None,
                requested_by: None,
                supersedes: None,
                replaces: Vec::new(),
                resume_at: None,
                basis: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_copy_that_still_names_a_promoted_run_as_prepared_predates_the_promote() {
        let writes = OwnWrites::default();
        let before = with_status(prepared(7));
        assert!(!writes.predates(&before, before.status.as_ref().unwrap()));
        writes.remember_promoted(&before, 7);
        // Read before the promote (the resume's Job event): it waits for the watch.
        assert!(writes.predates(&before, before.status.as_ref().unwrap()));
        assert!(writes.predates(&before, before.status.as_ref().unwrap()));
        // The promote delivered: no longer prepared. That ends the memory...
        let after = with_status(SingletonJobStatus {
            fencing_token: 7,
            ..Default::default()
        });
        assert!(!writes.predates(&after, after.status.as_ref().unwrap()));
        // ... so a later copy naming it again (a restored status) is seen, not skipped.
        assert!(!writes.predates(&before, before.status.as_ref().unwrap()));
        // A newer preparation is never taken for the promoted one.
        writes.remember_promoted(&before, 7);
        let next = with_status(prepared(8));
        assert!(!writes.predates(&next, next.status.as_ref().unwrap()));
    }

    #[test]
    fn the_cache_keeps_only_the_operation_annotations() {
        let mut sj = SingletonJob::new("a", Default::default());
        sj.metadata.annotations = Some(
            [
                (crate::api::ANNOTATION_TRIGGER, r#"{"id":"1"}"#.to_string()),
                (
                    "kubectl.kubernetes.io/last-applied-configuration",
                    "{}".into(),
                ),
                ("team.example/notes", "x".repeat(200 * 1024)),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        );
        slim_sj(&mut sj);
        let kept: Vec<&String> = sj.metadata.annotations.as_ref().unwrap().keys().collect();
        assert_eq!(kept, vec![crate::api::ANNOTATION_TRIGGER]);
    }
}
