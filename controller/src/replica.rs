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

use crate::endpoints::{self, HealthSource};
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
}

/// Runs the controller as one replica until `shutdown` resolves. Returns
/// [`Error::LeadershipLost`] when this replica led and lost the lease: the caller should exit.
pub async fn run_replica(
    client: Client,
    cfg: watch::Config,
    opts: ReplicaOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let Some(election) = opts.election else {
        // Single-replica mode: this process always acts.
        crate::metrics::global().leader.set(1);
        endpoints::serve(opts.health_addr, HealthSource::Always).await?;
        return watch::run(client, cfg, Gate::always(), shutdown).await;
    };
    let ElectionOptions {
        lease_namespace,
        lease_name,
        config,
    } = election;
    config.validate()?;
    let lock = KubeLock::new(client.clone(), &lease_namespace, &lease_name);
    let events = watch_lease(client.clone(), &lease_namespace, &lease_name).boxed();
    let mut elector = Elector::new(lock, config.clone(), events)?;
    endpoints::serve(
        opts.health_addr,
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
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut ctrl = tokio::spawn(watch::run(client, cfg, elector.gate(), async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));

    let mut shutdown = Box::pin(shutdown);
    if let Acquired::Until(()) = elector.acquire(&mut shutdown).await {
        elector.stop();
        let _ = stop_tx.send(true);
        let _ = ctrl.await;
        return Ok(());
    }
    let epoch = elector.state().borrow().epoch;
    events
        .publish(
            EventType::Normal,
            "LeaderElected",
            format!("leads with epoch {epoch}"),
        )
        .await;

    match elector.hold(select(&mut shutdown, &mut ctrl)).await {
        Held::Lost(reason) => {
            // The gate is closed already. Stop every in-flight reconcile now, before anything
            // else (the Event below may take seconds): dropping the controller's future drops
            // them, and the confirms running in tasks of their own end with the gate.
            ctrl.abort();
            tracing::error!(%lease, %reason, "lost leadership; exiting to restart as a standby");
            events
                .publish(
                    EventType::Warning,
                    "LeaderLost",
                    format!("lost the lease ({reason}); exiting"),
                )
                .await;
            return Err(Error::LeadershipLost(lease));
        }
        Held::Until(Either::Right((ended, _))) => {
            // The controller stopped by itself (e.g. the CRD is missing): hand over and report.
            elector.begin_drain();
            release(&mut elector, &lease).await;
            return match ended {
                Ok(Ok(())) => Err(Error::Config("the controller stopped unexpectedly".into())),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(Error::Config(format!("the controller task failed: {e}"))),
            };
        }
        Held::Until(Either::Left(((), _))) => {}
    }

    // Graceful shutdown: stop starting writes, let in-flight reconciles finish while still
    // renewing (bounded by the renew deadline), then release so a standby takes over at once.
    elector.begin_drain();
    let _ = stop_tx.send(true);
    let drain = tokio::time::timeout(config.renew_deadline, &mut ctrl);
    match elector.hold(drain).await {
        Held::Lost(reason) => {
            ctrl.abort();
            tracing::error!(%lease, %reason, "lost leadership while draining");
            return Err(Error::LeadershipLost(lease));
        }
        Held::Until(Err(_)) => {
            tracing::warn!(%lease, "in-flight reconciles did not finish within the renew deadline; releasing anyway (their writes are fenced by resourceVersion)")
        }
        Held::Until(Ok(_)) => {}
    }
    release(&mut elector, &lease).await;
    events
        .publish(
            EventType::Normal,
            "LeaderReleased",
            "released the lease on shutdown".into(),
        )
        .await;
    Ok(())
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

/// Releases the lease, bounded so a dead API server cannot hold up the exit (the lease then
/// simply expires).
async fn release(elector: &mut Elector<KubeLock>, lease: &str) {
    let limit = elector.config().renew_deadline.max(Duration::from_secs(1));
    match tokio::time::timeout(limit, elector.release()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(%lease, error = %e, "could not release the lease; it will expire")
        }
        Err(_) => tracing::warn!(%lease, "releasing the lease timed out; it will expire"),
    }
}
