//! Whether this replica may act: the gate the leader election opens and closes (a single
//! replica's is always open), checked before every write of the run path ([`crate::kube_io`]).
//! It carries the leader's renew deadline, so it closes by itself when the election loop is not
//! scheduled (a paused process resumes with reconciles in flight).

use futures::StreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::{Error, Result};

/// Whether this replica may act, published on a channel (leader election feeds it; a single
/// replica is always allowed). Checked before every write of the run path.
#[derive(Clone)]
pub struct Gate {
    rx: watch::Receiver<GateState>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateState {
    pub may_act: bool,
    /// Leader epoch (the Lease's `leaseTransitions`), 0 without election.
    pub epoch: u64,
    /// The leader's renew deadline (monotonic): past it the gate is closed whatever `may_act`
    /// says, because the election loop may not have run yet (a pause, a busy runtime). None
    /// without election.
    pub valid_until: Option<tokio::time::Instant>,
}

impl Gate {
    pub fn new(rx: watch::Receiver<GateState>) -> Self {
        Gate { rx }
    }

    /// A gate that is always open (single-replica mode).
    pub fn always() -> Self {
        // A receiver keeps the last value after its sender is gone: the state never changes.
        let (_, rx) = watch::channel(GateState {
            may_act: true,
            epoch: 0,
            valid_until: None,
        });
        Gate { rx }
    }

    pub fn check(&self) -> Result<()> {
        let state = *self.rx.borrow();
        if state.may_act
            && state
                .valid_until
                .is_none_or(|v| tokio::time::Instant::now() < v)
        {
            Ok(())
        } else {
            Err(Error::NotLeader)
        }
    }

    pub fn epoch(&self) -> u64 {
        self.rx.borrow().epoch
    }

    /// Resolves once the gate is closed: at once if it is, else when the state says so or the
    /// renew deadline it carries passes (whichever comes first). Never, for [`Gate::always`].
    pub async fn closed(&self) {
        let mut rx = self.rx.clone();
        loop {
            let state = *rx.borrow_and_update();
            let deadline_passed = state
                .valid_until
                .is_some_and(|v| tokio::time::Instant::now() >= v);
            if !state.may_act || deadline_passed {
                return;
            }
            let deadline = async {
                match state.valid_until {
                    Some(v) => tokio::time::sleep_until(v).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(deadline);
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // Nobody will change the state again: only the deadline can close it.
                        deadline.await;
                        return;
                    }
                }
                () = &mut deadline => return,
            }
        }
    }

    /// Yields each time the gate opens (this replica starts leading).
    pub fn opened(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        WatchStream::from_changes(self.rx.clone())
            .scan(false, |was_open, s| {
                let opened = s.may_act && !*was_open;
                *was_open = s.may_act;
                futures::future::ready(Some(opened))
            })
            .filter(|opened| futures::future::ready(*opened))
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_gate_closes_by_itself_at_the_renew_deadline() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let (_tx, rx) = tokio::sync::watch::channel(GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(deadline),
        });
        let gate = Gate::new(rx);
        assert!(gate.check().is_ok());
        // Nobody updates the state (the election loop is stuck or paused): time alone closes it.
        tokio::time::advance(std::time::Duration::from_secs(3)).await;
        assert!(matches!(gate.check(), Err(Error::NotLeader)));
    }

    #[tokio::test(start_paused = true)]
    async fn gate_closed_resolves_on_a_state_change_or_at_the_deadline() {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(3);
        let (tx, rx) = tokio::sync::watch::channel(GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(deadline),
        });
        let gate = Gate::new(rx);
        // The deadline alone closes it.
        let started = tokio::time::Instant::now();
        gate.closed().await;
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(3));
        // A renewal moves the deadline; losing the Lease closes it before.
        tx.send_replace(GateState {
            may_act: true,
            epoch: 1,
            valid_until: Some(tokio::time::Instant::now() + std::time::Duration::from_secs(10)),
        });
        let closing = gate.closed();
        tokio::pin!(closing);
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(1), &mut closing)
                .await
                .is_err()
        );
        tx.send_replace(GateState {
            may_act: false,
            epoch: 1,
            valid_until: None,
        });
        closing.await;
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(60), Gate::always().closed())
                .await
                .is_err(),
            "an always-open gate never closes"
        );
    }
}
