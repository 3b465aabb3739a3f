//! The lock: a `coordination.k8s.io/v1` Lease read and written with compare-and-swap.
//!
//! Every write carries the resourceVersion the caller observed (a PUT, never a patch or an apply),
//! so of two candidates that read the same record at most one write succeeds; the other gets HTTP
//! 409, which [`Lock`] reports as [`Error::Conflict`]: it lost the race.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use futures::{Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::{Error, Result};

/// What the Lease says, in the elector's terms (client-go's `LeaderElectionRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderRecord {
    /// Empty when nobody holds the lease (never granted, or released).
    pub holder: String,
    /// How long candidates must see the record unchanged before they may take it over.
    pub lease_duration: Duration,
    /// Informative only: wall-clock times of the holder, never compared with our clock.
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    /// Number of grants so far; the leader epoch.
    pub transitions: u64,
}

/// A record with the resourceVersion it was read or written at: the precondition of the next write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned {
    pub record: LeaderRecord,
    pub resource_version: String,
}

/// Storage of the leader record with compare-and-swap semantics. The Kubernetes Lease is the real
/// one ([`KubeLock`]); unit tests use an in-memory one.
pub trait Lock: Send + Sync {
    /// The current record, or None when the Lease does not exist.
    fn get(&self) -> impl Future<Output = Result<Option<Versioned>>> + Send;
    /// Creates the Lease; [`Error::Conflict`] when it already exists.
    fn create(&self, record: &LeaderRecord) -> impl Future<Output = Result<Versioned>> + Send;
    /// Replaces the record if it is still at `current.resource_version`, else
    /// [`Error::Conflict`].
    fn update(
        &self,
        current: &Versioned,
        record: &LeaderRecord,
    ) -> impl Future<Output = Result<Versioned>> + Send;
    /// `namespace/name`, for logs.
    fn describe(&self) -> String;
}

/// The Lease `name` in `namespace`.
pub struct KubeLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// The Lease as last read or written, so a replace keeps its labels and annotations.
    last: Mutex<Option<Lease>>,
}

impl KubeLock {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        KubeLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            last: Mutex::new(None),
        }
    }

    fn remember(&self, lease: &Lease) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(lease.clone());
        }
    }

    /// The object to PUT: the last one seen at that resourceVersion (or a bare one), with the new
    /// spec. The resourceVersion is always set: without it the PUT would be a blind overwrite.
    fn to_write(&self, current: &Versioned, record: &LeaderRecord) -> Lease {
        let seen = self.last.lock().ok().and_then(|l| l.clone()).filter(|l| {
            l.metadata.resource_version.as_deref() == Some(current.resource_version.as_str())
        });
        let mut lease = seen.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: None,
        });
        lease.metadata.resource_version = Some(current.resource_version.clone());
        lease.metadata.managed_fields = None;
        let mut spec = lease.spec.take().unwrap_or_default();
        fill_spec(&mut spec, record);
        lease.spec = Some(spec);
        lease
    }
}

impl Lock for KubeLock {
    async fn get(&self) -> Result<Option<Versioned>> {
        let lease = self.api.get_opt(&self.name).await?;
        if let Some(l) = &lease {
            self.remember(l);
        }
        Ok(lease.as_ref().map(versioned))
    }

    async fn create(&self, record: &LeaderRecord) -> Result<Versioned> {
        let mut spec = LeaseSpec::default();
        fill_spec(&mut spec, record);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        let created = self
            .api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(|e| Error::from_write(e, &format!("lease {}", self.describe())))?;
        self.remember(&created);
        Ok(versioned(&created))
    }

    async fn update(&self, current: &Versioned, record: &LeaderRecord) -> Result<Versioned> {
        let lease = self.to_write(current, record);
        let written = self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| Error::from_write(e, &format!("lease {}", self.describe())))?;
        self.remember(&written);
        Ok(versioned(&written))
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Writes `record` into a LeaseSpec, leaving fields we do not own (strategy, preferredHolder).
fn fill_spec(spec: &mut LeaseSpec, record: &LeaderRecord) {
    spec.holder_identity = (!record.holder.is_empty()).then(|| record.holder.clone());
    // The field has whole seconds: round up, so nobody waits less than we meant.
    let secs =
        record.lease_duration.as_secs() + u64::from(record.lease_duration.subsec_nanos() > 0);
    spec.lease_duration_seconds = Some(i32::try_from(secs.max(1)).unwrap_or(i32::MAX));
    spec.acquire_time = record.acquire_time.map(MicroTime);
    spec.renew_time = record.renew_time.map(MicroTime);
    spec.lease_transitions = Some(i32::try_from(record.transitions).unwrap_or(i32::MAX));
}

/// The record a Lease holds. Missing or negative numbers read as zero: a lease nobody wrote yet.
pub fn versioned(lease: &Lease) -> Versioned {
    let spec = lease.spec.clone().unwrap_or_default();
    Versioned {
        record: LeaderRecord {
            holder: spec.holder_identity.unwrap_or_default(),
            lease_duration: Duration::from_secs(
                spec.lease_duration_seconds.unwrap_or(0).max(0) as u64
            ),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0).max(0) as u64,
        },
        resource_version: lease.resource_version().unwrap_or_default(),
    }
}

/// What the Lease watch reports to the elector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The Lease as it is now; None when it does not exist (deleted, or never created).
    Observed(Option<Versioned>),
    /// The watch failed and is backing off: observations may be stale until the next
    /// `Observed`.
    WatchError(String),
}

/// Watches the one Lease (field selector on its name) so standbys react to a release or an
/// expiry at once instead of on their next poll. The stream never ends; errors are reported and
/// retried with backoff.
pub fn watch_lease(
    client: Client,
    namespace: &str,
    name: &str,
) -> impl Stream<Item = LeaseEvent> + Send + use<> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // Per-stream state: what the initial list found, to report "absent" when it found nothing.
    let mut listed: Option<Versioned> = None;
    watcher(api, cfg).default_backoff().filter_map(move |ev| {
        let out = match ev {
            Ok(watcher::Event::Init) => {
                listed = None;
                None
            }
            Ok(watcher::Event::InitApply(l)) => {
                listed = Some(versioned(&l));
                None
            }
            Ok(watcher::Event::InitDone) => Some(LeaseEvent::Observed(listed.take())),
            Ok(watcher::Event::Apply(l)) => Some(LeaseEvent::Observed(Some(versioned(&l)))),
            Ok(watcher::Event::Delete(_)) => Some(LeaseEvent::Observed(None)),
            Err(e) => Some(LeaseEvent::WatchError(e.to_string())),
        };
        futures::future::ready(out)
    })
}
