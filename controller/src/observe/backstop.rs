//! A SingletonJob's backstop database as this reconcile finds it: connected and checked, or why
//! not; and the workloads' refused stale writes it counted since the last look.

use kube::ResourceExt;

use crate::api::SingletonJob;
use tokio::time::Instant;

use std::time::Duration;

use crate::backstop::health::{Admission, BUSY_RETRY, Target};
use crate::backstop::share::Turn;
use crate::backstop::{Availability, Backstop, SecretKeys, TablePrefix, fingerprint, load_secret};
use crate::context::Context;
use crate::sync::lock;

/// A SingletonJob's backstop as [`resolve`] found it.
pub struct Resolved {
    pub db: Availability,
    /// Unavailable and not probed again before this instant (its backoff): nothing that waits
    /// for it can change sooner.
    pub retry_at: Option<Instant>,
    /// The namespace's turn at its database ([`crate::backstop::share`]), held for the rest of
    /// the reconcile. None: no backstop, one failing (no database work), or one being probed
    /// while not known healthy (bounded by [`crate::backstop::health`] instead).
    pub turn: Option<Turn>,
}

impl From<Availability> for Resolved {
    fn from(db: Availability) -> Self {
        Resolved {
            db,
            retry_at: None,
            turn: None,
        }
    }
}

/// What [`resolve`] found.
pub enum Resolution {
    Resolved(Resolved),
    /// The backstop cannot be used now without waiting (other probes of its namespace are in
    /// flight, or its namespace's database time is spent): look again after this long, without
    /// holding a reconcile slot meanwhile.
    Later(Duration),
}

/// The SingletonJob's backstop, connected and checked (the schema is ensured on connect), with
/// its namespace's turn at the database. Every failure becomes a reason that names no secret
/// value.
pub async fn resolve(ctx: &Context, sj: &SingletonJob) -> Resolution {
    use Resolution::{Later, Resolved as Found};
    let Some((kind, secret, table_prefix)) = sj.spec.backstop.as_ref().and_then(|b| b.database())
    else {
        ctx.backstops.forget(&sj.key());
        return Found(Availability::NotConfigured.into());
    };
    let (ns, secret) = (sj.namespace().unwrap_or_default(), &secret.name);
    match ctx
        .backstop_health
        .before_reading(&ns, secret, Instant::now())
    {
        Some(Admission::Failing { error, retry_at }) => {
            let db = Availability::Unavailable(error);
            let retry_at = Some(retry_at);
            return Found(Resolved {
                db,
                retry_at,
                turn: None,
            });
        }
        Some(Admission::Busy) => return Later(BUSY_RETRY),
        Some(Admission::Probe(_)) | None => {}
    }
    let unavailable = |e: crate::Error| Found(Availability::Unavailable(e.to_string()).into());
    let data = match load_secret(&ctx.client, &ns, secret).await {
        Ok(d) => d,
        Err(e) => return unavailable(e),
    };
    let prefix = match table_prefix.map(TablePrefix::new).transpose() {
        Ok(p) => p.unwrap_or_default(),
        Err(e) => return unavailable(e),
    };
    let keys = SecretKeys::default();
    let db = match ctx.backstops.get_as(&sj.key(), kind, &data, &keys, &prefix) {
        Ok(db) => db,
        Err(e) => return unavailable(e),
    };
    let target = Target {
        namespace: ns,
        secret: secret.clone(),
        contents: fingerprint(kind, &data, &keys, &prefix),
    };
    let probe = match ctx.backstop_health.admit(&target, Instant::now()) {
        Admission::Probe(p) => p,
        Admission::Failing { error, retry_at } => {
            let db = Availability::Unavailable(error);
            let retry_at = Some(retry_at);
            return Found(Resolved {
                db,
                retry_at,
                turn: None,
            });
        }
        Admission::Busy => return Later(BUSY_RETRY),
    };
    // The database will be used: a slow database's SingletonJobs wait outside the reconcile
    // slots (N3). A target not known healthy needs no turn: its probes are bounded per
    // namespace already, and a black-holed one must be found failing (and its SingletonJobs
    // told) however slow its namespace's database time looks.
    let share = ctx.backstops.share();
    let turn = if probe.is_bounded() {
        None
    } else {
        match share.admit(&target.namespace, Instant::now()) {
            Ok(t) => Some(t),
            Err(wait) => {
                crate::metrics::global().backstop_deferred(sj);
                return Later(wait);
            }
        }
    };
    let r = db.ping().await.map_err(|e| e.to_string());
    let retry_at = probe.done(r.clone(), Instant::now());
    let db = match r {
        Ok(()) => Availability::Ready(db),
        Err(why) => Availability::Unavailable(why),
    };
    Found(Resolved { db, retry_at, turn })
}

/// How many more stale writes the backstop refused since the last look (the first look after
/// start-up is the baseline), and the total, which also goes to the metric.
pub async fn new_rejections(ctx: &Context, sj: &SingletonJob, b: &Backstop) -> Option<(u64, u64)> {
    let total = match b.rejections().await {
        Ok(n) => n,
        Err(e) => {
            tracing::debug!(sj = %sj.key(), error = %e, "could not read the backstop's refusal count");
            return None;
        }
    };
    crate::metrics::global().rejections(sj, total);
    let before = lock(&ctx.rejections_seen).insert(sj.key(), total);
    before.filter(|b| total > *b).map(|b| (total - b, total))
}
