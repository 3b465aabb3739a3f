//! Notifications, the I/O part: the events a status write left pending
//! (`status.notifications.pending`, filled by [`crate::decide::notify::fill`]) are delivered here,
//! each to each of its targets, in a task of its own, tried again with backoff until the target
//! accepts it or `giveUpAfterSeconds` pass. Never in a reconcile's way: a reconcile only hands
//! the pending events over ([`Notifier::offer`]) and later writes what came of them
//! ([`Notifier::news`], [`crate::decide::notify::settle`]) in its own status write, so the
//! SingletonJob's status keeps one writer.
//!
//! At least once: an event leaves the outbox only in a status write after its delivery, so a
//! crash or failover in between sends it again, under the same id, for the receiver to drop.

pub mod format;
pub mod send;
pub mod sign;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::api::{NotifyTarget, PendingNotification, SingletonJob, SingletonJobStatus};
use crate::decide::notify::{Delivery, Fate};
use crate::gate::Gate;
use crate::metrics::NotifyResult;
use crate::sync::lock;

/// A Secret a notification reads must carry this label, set to "true": permission to create
/// SingletonJobs is not permission to send any Secret's value to a URL of one's choosing.
pub const SECRET_LABEL: &str = "singleton.dev/notify";

/// Deliveries in flight at once, over every SingletonJob.
const SLOTS: usize = 8;
/// The first wait after a failed try; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How long a delivery written to status is remembered: far longer than the watch lags behind a
/// write.
const REMEMBER_DONE: Duration = Duration::from_secs(600);

/// Which SingletonJob, which event, which target.
type Key = (String, String, String);

/// The controller's default targets, for the SingletonJobs without `spec.notify`
/// (`--default-notify`, the chart's `notify.defaults`): their Secrets are in `namespace`, the
/// controller's own, not the SingletonJob's.
#[derive(Clone, Debug, Default)]
pub struct Defaults {
    pub targets: Vec<NotifyTarget>,
    pub namespace: String,
}

/// The deliveries of this process.
pub struct Notifier {
    client: kube::Client,
    gate: Gate,
    defaults: Defaults,
    http: OnceLock<Result<send::Http, String>>,
    slots: Semaphore,
    /// (uid, event id, target) being delivered (None), or done and written to status (when): a
    /// cached copy older than that write still lists it pending, and must not send it again.
    busy: Mutex<HashMap<Key, Option<Instant>>>,
    /// Per SingletonJob uid, what came of its deliveries since status last said so.
    news: Mutex<HashMap<String, Vec<Delivery>>>,
    /// Asks for a SingletonJob's reconcile when there is news for its status.
    wake: mpsc::UnboundedSender<ObjectRef<SingletonJob>>,
}

impl Notifier {
    /// The notifier, and the stream of SingletonJobs to reconcile because of news.
    pub fn new(
        client: kube::Client,
        gate: Gate,
        defaults: Defaults,
    ) -> (Arc<Self>, UnboundedReceiverStream<ObjectRef<SingletonJob>>) {
        let (wake, rx) = mpsc::unbounded_channel();
        let n = Notifier {
            client,
            gate,
            defaults,
            http: OnceLock::new(),
            slots: Semaphore::new(SLOTS),
            busy: Mutex::default(),
            news: Mutex::default(),
            wake,
        };
        (Arc::new(n), UnboundedReceiverStream::new(rx))
    }

    /// `sj`'s targets: `spec.notify`, or the controller's defaults when it is unset.
    pub fn targets<'a>(&'a self, sj: &'a SingletonJob) -> &'a [NotifyTarget] {
        sj.spec.notify.as_deref().unwrap_or(&self.defaults.targets)
    }

    /// Where `sj`'s targets' Secrets are: its own namespace, the controller's for the defaults.
    fn secrets_in(&self, sj: &SingletonJob) -> String {
        match sj.spec.notify {
            Some(_) => sj.metadata.namespace.clone().unwrap_or_default(),
            None => self.defaults.namespace.clone(),
        }
    }

    /// Starts delivering each event pending in `status` (of `sj`) to each target not yet on its
    /// way. Cheap when there is nothing new: a reconcile calls it every time.
    pub fn offer(self: &Arc<Self>, sj: &SingletonJob, status: Option<&SingletonJobStatus>) {
        let (Some(uid), Some(pending)) = (
            sj.metadata.uid.as_ref(),
            status.and_then(|s| s.notifications.as_ref()),
        ) else {
            return;
        };
        if self.gate.check().is_err() {
            return;
        }
        for p in &pending.pending {
            for name in &p.targets {
                let Some(target) = self.targets(sj).iter().find(|t| t.name == *name) else {
                    continue;
                };
                let key = (uid.clone(), p.id.clone(), name.clone());
                {
                    let mut busy = lock(&self.busy);
                    if busy.contains_key(&key) {
                        continue;
                    }
                    busy.insert(key.clone(), None);
                }
                let job = JobRef {
                    namespace: sj.metadata.namespace.clone().unwrap_or_default(),
                    name: sj.metadata.name.clone().unwrap_or_default(),
                    secrets_in: self.secrets_in(sj),
                };
                tokio::spawn(Arc::clone(self).deliver(job, key, target.clone(), p.clone()));
            }
        }
    }

    /// What came of `sj`'s deliveries that its status does not say yet.
    pub fn news(&self, sj: &SingletonJob) -> Vec<Delivery> {
        sj.metadata
            .uid
            .as_ref()
            .and_then(|uid| lock(&self.news).get(uid).cloned())
            .unwrap_or_default()
    }

    /// `status` of `sj` was written: news it holds is forgotten (a delivered or given-up event no
    /// longer pending for its target, a failed try no newer than the target's last failure).
    pub fn written(&self, sj: &SingletonJob, status: &SingletonJobStatus) {
        let Some(uid) = sj.metadata.uid.as_ref() else {
            return;
        };
        let mut news = lock(&self.news);
        let Some(list) = news.get_mut(uid) else {
            return;
        };
        let n = status.notifications.as_deref();
        let pending = |d: &Delivery| {
            n.is_some_and(|n| {
                n.pending
                    .iter()
                    .any(|p| p.id == d.id && p.targets.contains(&d.target))
            })
        };
        let failure_seen = |d: &Delivery| {
            n.and_then(|n| n.targets.iter().find(|t| t.name == d.target))
                .and_then(|t| t.last_failure.as_ref())
                .is_some_and(|t| t.0 >= d.at)
        };
        let mut done = Vec::new();
        list.retain(|d| {
            let keep = match d.fate {
                Fate::Failing(_) => !failure_seen(d),
                Fate::Delivered | Fate::GaveUp(_) => pending(d),
            };
            if !keep && !matches!(d.fate, Fate::Failing(_)) {
                done.push((uid.clone(), d.id.clone(), d.target.clone()));
            }
            keep
        });
        if list.is_empty() {
            news.remove(uid);
        }
        drop(news);
        let now = Instant::now();
        let mut busy = lock(&self.busy);
        for k in done {
            busy.insert(k, Some(now));
        }
        busy.retain(|_, done| done.is_none_or(|at| now.duration_since(at) < REMEMBER_DONE));
    }

    /// Forgets a deleted SingletonJob.
    pub fn forget(&self, sj: &SingletonJob) {
        if let Some(uid) = &sj.metadata.uid {
            lock(&self.news).remove(uid);
            lock(&self.busy).retain(|(u, _, _), _| u != uid);
        }
    }

    /// Tries `p` on `target` until it is accepted, given up, or this replica may no longer act.
    async fn deliver(
        self: Arc<Self>,
        job: JobRef,
        key: Key,
        target: NotifyTarget,
        p: PendingNotification,
    ) {
        let started = Instant::now();
        let give_up = target.give_up_after();
        let mut backoff = FIRST_BACKOFF;
        let mut last_error = String::new();
        loop {
            // A standby sends nothing: the leader delivers what is pending.
            if self.gate.check().is_err() {
                lock(&self.busy).remove(&key);
                return;
            }
            let tried = {
                let _slot = self.slots.acquire().await;
                self.try_once(&job, &target, &p).await
            };
            let metrics = crate::metrics::global();
            let e = match tried {
                Ok(()) => {
                    metrics.notification(&job.namespace, &job.name, NotifyResult::Delivered);
                    return self.tell(&job, &key, Fate::Delivered);
                }
                Err(e) => e,
            };
            metrics.notification(&job.namespace, &job.name, NotifyResult::Failed);
            tracing::debug!(job = %job.key(), target = %target.name, id = %p.id, error = %e, "notification try failed");
            if started.elapsed() + backoff > give_up {
                metrics.notification(&job.namespace, &job.name, NotifyResult::GaveUp);
                return self.tell(&job, &key, Fate::GaveUp(e));
            }
            // Status hears of a failing delivery when its error changes, not at every try.
            if e != last_error {
                self.tell(&job, &key, Fate::Failing(e.clone()));
                last_error = e;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Keeps `fate` as news for the SingletonJob's status and asks for its reconcile.
    fn tell(&self, job: &JobRef, key: &Key, fate: Fate) {
        let d = Delivery {
            id: key.1.clone(),
            target: key.2.clone(),
            at: Timestamp::now(),
            fate,
        };
        let mut news = lock(&self.news);
        let list = news.entry(key.0.clone()).or_default();
        // Of a delivery's failed tries only the latest is news.
        list.retain(|old| {
            !(old.id == d.id && old.target == d.target && matches!(old.fate, Fate::Failing(_)))
        });
        list.push(d);
        drop(news);
        let _ = self
            .wake
            .send(ObjectRef::new(&job.name).within(&job.namespace));
    }

    /// One try: the URL and key from their Secrets (read each time, so a fixed Secret is used at
    /// the next try), the request in the target's format, signed if asked, sent.
    async fn try_once(
        &self,
        job: &JobRef,
        target: &NotifyTarget,
        p: &PendingNotification,
    ) -> Result<(), String> {
        let url = match (&target.url, &target.url_secret_ref) {
            (Some(url), _) => url.clone(),
            (None, Some(r)) => {
                let v = self.secret_value(&job.secrets_in, r).await?;
                String::from_utf8(v)
                    .map(|s| s.trim().to_string())
                    .map_err(|_| format!("Secret {} key {} is not text", r.name, r.key))?
            }
            (None, None) => return Err("neither url nor urlSecretRef is set".into()),
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err("the URL is not an http:// or https:// URL".into());
        }
        let req = format::request(
            target.format,
            &url,
            format::Job {
                namespace: &job.namespace,
                name: &job.name,
            },
            p,
        );
        let mut headers = Vec::new();
        if let Some(r) = &target.signing_secret_ref {
            let key = sign::key(&self.secret_value(&job.secrets_in, r).await?);
            let now = Timestamp::now().as_second();
            headers.push(("webhook-id", p.id.clone()));
            headers.push(("webhook-timestamp", now.to_string()));
            headers.push((
                "webhook-signature",
                sign::signature(&key, &p.id, now, &req.body),
            ));
        }
        let http = self
            .http
            .get_or_init(send::Http::new)
            .as_ref()
            .map_err(Clone::clone)?;
        http.post(&req, &headers).await
    }

    /// A key of a labelled Secret in `namespace`.
    async fn secret_value(
        &self,
        namespace: &str,
        r: &crate::api::SecretKeyRef,
    ) -> Result<Vec<u8>, String> {
        let api: kube::Api<Secret> = kube::Api::namespaced(self.client.clone(), namespace);
        let secret = match api.get_opt(&r.name).await {
            Ok(Some(s)) => s,
            Ok(None) => return Err(format!("Secret {} not found", r.name)),
            Err(e) => return Err(format!("Secret {} could not be read: {e}", r.name)),
        };
        let labelled = secret
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SECRET_LABEL))
            .is_some_and(|v| v == "true");
        if !labelled {
            return Err(format!(
                "Secret {} is not labelled {SECRET_LABEL}=true",
                r.name
            ));
        }
        secret
            .data
            .and_then(|mut d| d.remove(&r.key))
            .map(|b| b.0)
            .ok_or_else(|| format!("Secret {} has no key {}", r.name, r.key))
    }
}

/// A SingletonJob as a delivery names it, and where its target's Secrets are.
#[derive(Clone, Debug)]
struct JobRef {
    namespace: String,
    name: String,
    secrets_in: String,
}

impl JobRef {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}
