//! One replica's life: stand by, lead, and either hand over (SIGTERM) or exit (leadership lost).
//!
//! After losing leadership the process **exits** (non-zero) rather than staying up as a standby,
//! as client-go's users do by default. Exiting is the one cancellation that reaches everything at
//! once: reconciles in flight, requeue timers, the controller's caches and any state they built
//! while leading. The Deployment restarts the pod, which comes back as a fresh standby with a new
//! identity. Staying up would need every in-flight task to be found and cancelled, and a leader
//! that resumes after a pause (SIGSTOP, a frozen VM) would carry stale caches into its next term.
//!
//! Every replica runs the controller, so a standby's watches and caches are warm at takeover,
//! but behind the gate: a standby's reconciles return at once and write nothing. When the gate
//! opens, every SingletonJob is reconciled.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use futures::StreamExt;
use futures::future::{Either, select};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::task::JoinHandle;

use crate::endpoints::{self, HealthSource, MetricsOptions};
use crate::gate::Gate;
use crate::lease::{Acquired, ElectionConfig, Elector, Held, KubeLock, watch_lease};
use crate::watch;
use crate::{Error, Result};

/// Where the Lease lives and how the election is timed.
#[derive(Clone, Debug)]
pub struct ElectionOptions {
    pub lease_namespace: String,
    pub lease_name: String,
    pub config: ElectionConfig,
}

/// How a replica runs.
#[derive(Clone, Debug)]
pub struct ReplicaOptions {
    /// None: single-replica mode, no election, the gate always open.
    pub election: Option<ElectionOptions>,
    pub health_addr: SocketAddr,
    /// `/metrics`, on its own port; standbys serve it too (their role, their Lease observations).
    pub metrics: MetricsOptions,
}

/// Runs the controller as one replica until `shutdown` resolves. Returns
/// [`Error::LeadershipLost`] when this replica led and lost the lease: the caller should exit.
pub async fn run_replica(
    client: Client,
    cfg: watch::Config,
    opts: ReplicaOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    // Contradicting settings are refused at start-up, before anything is served or watched.
    cfg.validate()?;
    endpoints::metrics::serve(client.clone(), opts.metrics).await?;
    let Some(election) = opts.election else {
        // Single-replica mode: this process always acts.
        crate::metrics::global().leader.set(1);
        endpoints::serve(opts.health_addr, HealthSource::Always).await?;
        return watch::run(client, cfg, Gate::always(), shutdown).await;
    };
    let mut replica = Replica::start(client, cfg, election, opts.health_addr).await?;
    let mut shutdown = Box::pin(shutdown);
    if let Acquired::Until(()) = replica.stand_by(&mut shutdown).await {
        replica.leave_as_standby().await;
        return Ok(());
    }
    replica.lead(&mut shutdown).await?;
    replica.hand_over().await
}

/// A replica in the election, its controller running behind the elector's gate.
struct Replica {
    elector: Elector<KubeLock>,
    /// `watch::run` behind the gate, from start-up to the end of this replica.
    controller: JoinHandle<Result<()>>,
    /// Sending `true` stops the controller (its shutdown future).
    stop_controller: tokio::sync::watch::Sender<bool>,
    events: LeaseEvents,
    /// `namespace/name` of the Lease, for the logs and [`Error::LeadershipLost`].
    lease: String,
}

impl Replica {
    /// Joins the election as a standby: the elector, the probes, and the controller behind the
    /// still closed gate.
    async fn start(
        client: Client,
        cfg: watch::Config,
        election: ElectionOptions,
        health_addr: SocketAddr,
    ) -> Result<Self> {
        let ElectionOptions {
            lease_namespace,
            lease_name,
            config,
        } = election;
        config.validate()?;
        let lock = KubeLock::new(client.clone(), &lease_namespace, &lease_name);
        let lease_watch = watch_lease(client.clone(), &lease_namespace, &lease_name).boxed();
        let elector = Elector::new(lock, config.clone(), lease_watch)?;
        endpoints::serve(
            health_addr,
            HealthSource::Election {
                state: elector.state(),
                stale_after: config.lease_duration + config.renew_deadline,
            },
        )
        .await?;
        let lease = format!("{lease_namespace}/{lease_name}");
        tracing::info!(%lease, identity = %config.identity, "standing by for the lease");
        let events = LeaseEvents::new(
            &client,
            &cfg,
            &lease_namespace,
            &lease_name,
            &config.identity,
        );

        // Standby and leader alike run the controller behind the elector's gate, so a standby's
        // caches are warm when it takes over. While the gate is closed a reconcile does nothing;
        // opening it re-reconciles every SingletonJob at once.
        let (stop_controller, mut stop_rx) = tokio::sync::watch::channel(false);
        let controller = tokio::spawn(watch::run(client, cfg, elector.gate(), async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        }));
        Ok(Replica {
            elector,
            controller,
            stop_controller,
            events,
            lease,
        })
    }

    /// Waits for the lease (the gate opens with it), or for `shutdown`, whichever comes first.
    async fn stand_by(
        &mut self,
        shutdown: &mut (impl Future<Output = ()> + Unpin),
    ) -> Acquired<()> {
        self.elector.acquire(shutdown).await
    }

    /// Shut down before ever leading: nothing to hand over.
    async fn leave_as_standby(mut self) {
        self.elector.stop();
        let _ = self.stop_controller.send(true);
        let _ = self.controller.await;
    }

    /// Leads until `shutdown` (Ok: hand over next). Losing the lease, or the controller stopping
    /// by itself, ends this replica with an error: the process exits.
    async fn lead(&mut self, shutdown: &mut (impl Future<Output = ()> + Unpin)) -> Result<()> {
        let epoch = self.elector.state().borrow().epoch;
        self.events
            .publish(
                EventType::Normal,
                "LeaderElected",
                format!("leads with epoch {epoch}"),
            )
            .await;

        match self
            .elector
            .hold(select(shutdown, &mut self.controller))
            .await
        {
            Held::Lost(reason) => {
                // The gate is closed already. Stop every in-flight reconcile now, before anything
                // else (the Event below may take seconds): dropping the controller's future drops
                // them, and the confirms running in tasks of their own end with the gate.
                self.controller.abort();
                let lease = &self.lease;
                tracing::error!(%lease, %reason, "lost leadership; exiting to restart as a standby");
                self.events
                    .publish(
                        EventType::Warning,
                        "LeaderLost",
                        format!("lost the lease ({reason}); exiting"),
                    )
                    .await;
                Err(Error::LeadershipLost(self.lease.clone()))
            }
            Held::Until(Either::Right((ended, _))) => {
                // The controller stopped by itself (e.g. the CRD is missing): hand over and report.
                self.elector.begin_drain();
                self.release().await;
                Err(match ended {
                    Ok(Ok(())) => Error::Config("the controller stopped unexpectedly".into()),
                    Ok(Err(e)) => e,
                    Err(e) => Error::Config(format!("the controller task failed: {e}")),
                })
            }
            Held::Until(Either::Left(((), _))) => Ok(()),
        }
    }

    /// Graceful shutdown: stop starting writes, let in-flight reconciles finish while still
    /// renewing (bounded by the renew deadline), then release so a standby takes over at once.
    async fn hand_over(mut self) -> Result<()> {
        self.elector.begin_drain();
        let _ = self.stop_controller.send(true);
        let renew_deadline = self.elector.config().renew_deadline;
        let drain = tokio::time::timeout(renew_deadline, &mut self.controller);
        let lease = &self.lease;
        match self.elector.hold(drain).await {
            Held::Lost(reason) => {
                self.controller.abort();
                tracing::error!(%lease, %reason, "lost leadership while draining");
                return Err(Error::LeadershipLost(self.lease.clone()));
            }
            Held::Until(Err(_)) => {
                tracing::warn!(%lease, "in-flight reconciles did not finish within the renew deadline; releasing anyway (their writes are fenced by resourceVersion)")
            }
            Held::Until(Ok(_)) => {}
        }
        self.release().await;
        self.events
            .publish(
                EventType::Normal,
                "LeaderReleased",
                "released the lease on shutdown".into(),
            )
            .await;
        Ok(())
    }

    /// Releases the lease, bounded so a dead API server cannot hold up the exit (the lease then
    /// simply expires).
    async fn release(&mut self) {
        let lease = &self.lease;
        let limit = self
            .elector
            .config()
            .renew_deadline
            .max(Duration::from_secs(1));
        match tokio::time::timeout(limit, self.elector.release()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(%lease, error = %e, "could not release the lease; it will expire")
            }
            Err(_) => tracing::warn!(%lease, "releasing the lease timed out; it will expire"),
        }
    }
}

/// Events on the Lease for the changes a human cares about: who leads, who let go, who lost it.
struct LeaseEvents {
    recorder: Recorder,
    lease: ObjectReference,
    identity: String,
}

impl LeaseEvents {
    fn new(
        client: &Client,
        cfg: &watch::Config,
        namespace: &str,
        name: &str,
        identity: &str,
    ) -> Self {
        let reporter = Reporter {
            controller: cfg.reporter.clone(),
            instance: cfg.instance.clone(),
        };
        LeaseEvents {
            recorder: Recorder::new(client.clone(), reporter),
            lease: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: Some(name.into()),
                namespace: Some(namespace.into()),
                ..ObjectReference::default()
            },
            identity: identity.to_string(),
        }
    }

    /// Bounded, so a slow API server never holds up a handover or an exit.
    async fn publish(&self, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(format!("{} {note}", self.identity)),
            action: "Elect".into(),
            secondary: None,
        };
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.recorder.publish(&ev, &self.lease),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, reason, "could not publish a Lease event"),
            Err(_) => tracing::warn!(reason, "publishing a Lease event timed out"),
        }
    }
}
