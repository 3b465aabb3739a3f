//! Version skew (issue 36): during a rolling upgrade or a rollback, leadership passes between
//! releases, and an older controller's status writes must not drop what a newer one recorded.
//! A status write replaces the whole status (PUT): a release that decoded the status into its
//! own types and wrote them back would silently remove every field it does not know, among them
//! the ones that guard a claim.
//!
//! Set up as a newer release would leave it: the SingletonJob CRD given the newer release's
//! status fields (one at the top, one in each history entry, as a newer CRD would add), and
//! those fields written into a SingletonJob's status. Then this release's controller decides
//! periods (several status writes): every field must still be there, each history entry's on
//! the same entry. The test changes the cluster's CRD, so `make e2e` runs it on a control plane
//! of its own (hack/own-cluster.sh, instance own3); run alone, it puts the CRD back when it ends.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{Env, ensure, sj_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use singleton::api::SingletonJob;

const CRD_NAME: &str = "singletonjobs.singleton.dev";
const MANAGER: &str = "e2e-version-skew";

/// The newer release's fields: at the top of the status, and in a history entry.
const TOP: &str = "preparedRun";
const IN_ENTRY: &str = "attemptsCommitted";

/// The installed CRD with the newer release's status fields added to its schema.
fn newer_crd(installed: &CustomResourceDefinition) -> Result<Value> {
    let mut crd = serde_json::to_value(installed)?;
    for key in ["status", "metadata"] {
        if key == "metadata" {
            crd[key] = json!({ "name": CRD_NAME });
        } else {
            crd.as_object_mut()
                .context("a CRD is an object")?
                .remove(key);
        }
    }
    let status = crd
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/status/properties")
        .context("the CRD's status schema")?;
    status[TOP] = json!({
        "type": "object",
        "properties": { "period": { "type": "string" }, "token": { "type": "integer" } },
    });
    status["history"]["items"]["properties"][IN_ENTRY] = json!({ "type": "integer" });
    Ok(crd)
}

/// Applies the newer CRD; put back as it was when dropped.
struct NewerCrd {
    api: Api<CustomResourceDefinition>,
    installed: CustomResourceDefinition,
}

impl NewerCrd {
    async fn apply(client: kube::Client) -> Result<NewerCrd> {
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let installed = api.get(CRD_NAME).await?;
        let newer = newer_crd(&installed)?;
        let pp = PatchParams::apply(MANAGER).force();
        api.patch(CRD_NAME, &pp, &Patch::Apply(&newer)).await?;
        Ok(NewerCrd { api, installed })
    }

    /// Puts the installed schema back (the newer fields are then pruned again).
    async fn restore(&self) -> Result<()> {
        let mut crd = self.installed.clone();
        crd.metadata.managed_fields = None;
        crd.metadata.resource_version = None;
        crd.status = None;
        let pp = PatchParams::apply(MANAGER).force();
        self.api.patch(CRD_NAME, &pp, &Patch::Apply(&crd)).await?;
        Ok(())
    }
}

/// The SingletonJob `name` as the API server holds it, every field included.
async fn raw_status(env: &Env, name: &str) -> Result<Value> {
    let ar = ApiResource::erase::<SingletonJob>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let obj = api.get(name).await?;
    Ok(obj.data.get("status").cloned().unwrap_or(Value::Null))
}

fn token(v: &Value) -> Option<u64> {
    v.as_u64()
}

#[tokio::test]
async fn an_older_controller_keeps_the_status_fields_of_a_newer_one() -> Result<()> {
    let mut env = Env::new("skew-status").await?;
    let crd = NewerCrd::apply(env.client.clone()).await?;
    let result = keeps_newer_fields(&mut env).await;
    let restored = crd.restore().await;
    result.and(restored)
}

async fn keeps_newer_fields(env: &mut Env) -> Result<()> {
    env.start_controller(&[]).await?;
    env.create_sj(&sj_yaml("skew", "*/2 * * * * *", "")).await?;
    // A newer release recorded its fields: one at the top, one in the history entry of the
    // first run (found by its token; the test op refuses the patch if a status write moved the
    // entry in between, and the next look tries again).
    let sjs: Api<SingletonJob> = Api::namespaced(env.client.clone(), &env.ns);
    let entry_period = env
        .wait_for(
            "the newer fields written into the status",
            Duration::from_secs(60),
            || async {
                let status = raw_status(env, "skew").await?;
                let history = status["history"].as_array().cloned().unwrap_or_default();
                let Some(i) = history.iter().position(|e| token(&e["token"]) == Some(1)) else {
                    return Ok(None);
                };
                let patch: json_patch::Patch = serde_json::from_value(json!([
                    { "op": "test", "path": format!("/status/history/{i}/token"), "value": 1 },
                    { "op": "add", "path": format!("/status/history/{i}/{IN_ENTRY}"), "value": 3 },
                    { "op": "add", "path": format!("/status/{TOP}"),
                      "value": { "period": "2030-01-01T00:00:00Z", "token": 42 } },
                ]))?;
                let pp = PatchParams::default();
                Ok(
                    match sjs
                        .patch_status("skew", &pp, &Patch::Json::<()>(patch))
                        .await
                    {
                        Ok(_) => Some(history[i]["period"].clone()),
                        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => None,
                        Err(e) => return Err(e.into()),
                    },
                )
            },
        )
        .await?;
    let written = raw_status(env, "skew").await?;
    let token_then = token(&written["fencingToken"]).unwrap_or_default();
    // This release decides later periods: several status writes of the whole status.
    let after = env
        .wait_for(
            "three more runs decided",
            Duration::from_secs(60),
            || async {
                let status = raw_status(env, "skew").await?;
                Ok(
                    (token(&status["fencingToken"]).unwrap_or_default() >= token_then + 3)
                        .then_some(status),
                )
            },
        )
        .await?;
    ensure(
        env,
        after[TOP] == json!({ "period": "2030-01-01T00:00:00Z", "token": 42 }),
        (
            "the newer top-level field after this release's writes",
            &after[TOP],
        ),
    )
    .await?;
    let history = after["history"].as_array().cloned().unwrap_or_default();
    let with_field: Vec<&Value> = history
        .iter()
        .filter(|e| e.get(IN_ENTRY).is_some())
        .collect();
    ensure(
        env,
        with_field.len() == 1
            && with_field[0]["period"] == entry_period
            && with_field[0][IN_ENTRY] == json!(3),
        (
            "the newer history field, on its own entry only",
            &entry_period,
            &history,
        ),
    )
    .await?;
    Ok(())
}
