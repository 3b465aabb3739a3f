//! Events for the state changes a human cares about, beyond runs and outcomes (tested in
//! scheduling.rs): who leads, who handed over, and a stale write refused by the fence.

use std::time::Duration;

use anyhow::Result;
use e2e::{Env, pg, sj_yaml};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams};

/// Reasons of the Events about objects of `kind` in the test namespace.
async fn reasons(env: &Env, kind: &str) -> Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref() == Some(kind))
        .filter_map(|e| e.reason)
        .collect())
}

async fn wait_reason(env: &Env, kind: &str, reason: &str, at_least: usize) -> Result<()> {
    env.wait_for(
        &format!("{at_least} {reason} Event(s) on a {kind}"),
        Duration::from_secs(30),
        || async {
            let n = reasons(env, kind)
                .await?
                .iter()
                .filter(|r| *r == reason)
                .count();
            Ok((n >= at_least).then_some(()))
        },
    )
    .await
}

#[tokio::test]
async fn leader_changes_are_events_on_the_lease() -> Result<()> {
    let mut env = Env::new("ev-lease").await?;
    let elect = [
        "--leader-elect",
        "--lease-name",
        "ev",
        "--lease-namespace",
        &env.ns.clone(),
    ];
    let first = env.start_controller(&elect).await?;
    wait_reason(&env, "Lease", "LeaderElected", 1).await?;
    env.start_controller(&elect).await?;
    // A graceful handover: the leader says it let go, the standby says it leads.
    env.stop_controller(first, false).await?;
    wait_reason(&env, "Lease", "LeaderReleased", 1).await?;
    wait_reason(&env, "Lease", "LeaderElected", 2).await?;
    Ok(())
}

#[tokio::test]
async fn a_stale_write_refused_by_the_fence_is_an_event_on_the_singletonjob() -> Result<()> {
    let mut env = Env::new("ev-fence").await?;
    let prefix = e2e::table_prefix(&env);
    e2e::backstop_secret(&env, "db", &e2e::database_url()?, true).await?;
    env.start_controller(&[]).await?;
    let spec = e2e::backstop_spec("db", &prefix, "");
    env.create_sj(&sj_yaml("f", "*/2 * * * * *", &spec)).await?;
    env.wait_for("two runs", Duration::from_secs(30), || async {
        let s = env.get_sj("f").await?.status.unwrap_or_default();
        Ok((s.fencing_token >= 2).then_some(()))
    })
    .await?;
    // A paused first run wakes up and writes with token 1.
    let db = pg().await?;
    let refused = db
        .query(
            &format!("SELECT {prefix}fence($1, 1)"),
            &[&format!("{}/f", env.ns)],
        )
        .await;
    anyhow::ensure!(refused.is_err(), "token 1 must be stale");
    wait_reason(&env, "SingletonJob", "StaleTokenRefused", 1).await?;
    Ok(())
}
