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
//! the same entry. And the chart never takes a newer release's CRD back on a rollback (the API
//! server would prune those fields from every stored SingletonJob); and the CRD's next API
//! version can be served beside `v1alpha1` without a conversion webhook.
//!
//! The tests change the cluster's CRD, so `make e2e` runs them on a control plane of their own
//! (hack/own-cluster.sh, instance own3), and they take turns ([`CRD`]); run alone, each puts
//! the CRD back when it ends.

use std::time::Duration;

use anyhow::{Context as _, Result};
use e2e::{Env, ensure, sj_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use singleton::api::SingletonJob;

const CRD_NAME: &str = "singletonjobs.singleton.dev";

/// The tests change the one CRD: one at a time.
static CRD: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
const MANAGER: &str = "e2e-version-skew";

/// The newer release's fields: at the top of the status, and in a history entry.
const TOP: &str = "preparedRun";
const IN_ENTRY: &str = "attemptsCommitted";

/// The installed CRD with the newer release's status fields added to its schema, and
/// `metadata` (its name added).
fn newer_crd(installed: &CustomResourceDefinition, mut metadata: Value) -> Result<Value> {
    let mut crd = serde_json::to_value(installed)?;
    crd.as_object_mut()
        .context("a CRD is an object")?
        .remove("status");
    metadata["name"] = json!(CRD_NAME);
    crd["metadata"] = metadata;
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
    async fn apply(client: kube::Client, metadata: Value) -> Result<NewerCrd> {
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let installed = api.get(CRD_NAME).await?;
        let newer = newer_crd(&installed, metadata)?;
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

#[tokio::test]
async fn an_older_controller_keeps_the_status_fields_of_a_newer_one() -> Result<()> {
    let _turn = CRD.lock().await;
    let mut env = Env::new("skew-status").await?;
    let crd = NewerCrd::apply(env.client.clone(), json!({})).await?;
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
                let Some(i) = history.iter().position(|e| e["token"].as_u64() == Some(1)) else {
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
    let token_then = written["fencingToken"].as_u64().unwrap_or_default();
    // This release decides later periods: several status writes of the whole status.
    let after = env
        .wait_for(
            "three more runs decided",
            Duration::from_secs(60),
            || async {
                let status = raw_status(env, "skew").await?;
                Ok(
                    (status["fencingToken"].as_u64().unwrap_or_default() >= token_then + 3)
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

/// The chart as `helm upgrade` or `helm rollback` would apply it to this cluster (a server-side
/// dry run runs its lookups): the SingletonJob CRD it renders.
fn rendered_crd(env: &Env, release: &str) -> Result<Value> {
    let out = e2e::run_ok(
        e2e::helm()
            .args(["template", release])
            .arg(e2e::chart_dir())
            .args(["--dry-run=server", "--namespace", &env.ns]),
    )?;
    e2e::yaml_docs(&out)?
        .into_iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<Value>, _>>()?
        .into_iter()
        .find(|d| d["kind"] == "CustomResourceDefinition" && d["metadata"]["name"] == CRD_NAME)
        .context("the chart renders no SingletonJob CRD")
}

/// A rollback keeps a newer release's CRD: installed by a newer release of the chart (its
/// version label above this chart's appVersion), the chart renders that CRD's schema and
/// version, not its own older one; installed by an older release, it renders its own.
#[tokio::test]
async fn a_rollback_of_the_chart_keeps_a_newer_release_crd() -> Result<()> {
    let _turn = CRD.lock().await;
    let env = Env::new("skew-chart").await?;
    let release = "skew";
    let owned_by = |version: &str| {
        json!({
            "labels": { "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/version": version },
            "annotations": { "meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": env.ns },
        })
    };
    let chart_version = serde_yaml::from_str::<Value>(&std::fs::read_to_string(
        e2e::chart_dir().join("Chart.yaml"),
    )?)?["appVersion"]
        .clone();
    // The chart renders the calendar CRD too: it must look the release's as well.
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let calendar = "singletoncalendars.singleton.dev";
    let owner = PatchParams::apply("e2e-version-skew-owner").force();
    let mut meta = owned_by(chart_version.as_str().unwrap_or_default());
    meta["name"] = json!(calendar);
    let adopt = json!({ "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": meta });
    crds.patch(calendar, &owner, &Patch::Apply(&adopt)).await?;
    let result = renders_the_newer_crd(&env, release, &owned_by, &chart_version).await;
    let bare = json!({ "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                       "metadata": { "name": calendar } });
    let released = crds.patch(calendar, &owner, &Patch::Apply(&bare)).await;
    result.and(released.map(|_| ()).map_err(Into::into))
}

/// Each installed version in turn: what the chart renders.
async fn renders_the_newer_crd(
    env: &Env,
    release: &str,
    owned_by: &impl Fn(&str) -> Value,
    chart_version: &Value,
) -> Result<()> {
    let newer_field =
        "/spec/versions/0/schema/openAPIV3Schema/properties/status/properties/preparedRun";
    for (installed, keeps) in [("99.0.0", true), ("0.0.1", false)] {
        let crd = NewerCrd::apply(env.client.clone(), owned_by(installed)).await?;
        let rendered = rendered_crd(env, release);
        let restored = crd.restore().await;
        let rendered = rendered?;
        restored?;
        let version = rendered["metadata"]["labels"]["app.kubernetes.io/version"].clone();
        let kept = rendered.pointer(newer_field).is_some();
        let want_version = if keeps {
            json!(installed)
        } else {
            chart_version.clone()
        };
        anyhow::ensure!(
            kept == keeps && version == want_version,
            "installed by release {installed}: the chart rendered the CRD of version {version} \
             (want {want_version}), with the newer field: {kept} (want {keeps})"
        );
    }
    Ok(())
}

/// The CRD's next API version (docs/design.md, "The CRD's next version"): the same schema
/// served as `v1beta1` beside `v1alpha1`, stored as `v1beta1`, with no conversion webhook (the
/// API server only rewrites `apiVersion`, which is all that is needed while the schemas are
/// the same). A SingletonJob created through `v1beta1` is run by this controller, which speaks
/// `v1alpha1`, and reads back the same through both. The harness for the version after
/// `v1alpha1`: that release changes [`next_version_crd`]'s second version.
#[tokio::test]
async fn the_next_api_version_is_served_beside_v1alpha1_without_conversion() -> Result<()> {
    let _turn = CRD.lock().await;
    let mut env = Env::new("skew-next").await?;
    let api: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let installed = api.get(CRD_NAME).await?;
    let pp = PatchParams::apply(MANAGER).force();
    api.patch(CRD_NAME, &pp, &Patch::Apply(&next_version_crd()?))
        .await?;
    let result = served_by_both(&mut env).await;
    // Back to one version: no object may be stored as v1beta1 any more (the namespace's one is
    // deleted first), then v1beta1 leaves storedVersions, then the spec.
    let ar = next_resource();
    let sjs: Api<DynamicObject> = Api::namespaced_with(env.client.clone(), &env.ns, &ar);
    let deleted = sjs.delete("next", &Default::default()).await.map(|_| ());
    let mut crd = installed.clone();
    crd.metadata.managed_fields = None;
    crd.metadata.resource_version = None;
    crd.status = None;
    let stored = json!({ "status": { "storedVersions": ["v1alpha1"] } });
    let restored = async {
        api.patch_status(CRD_NAME, &PatchParams::default(), &Patch::Merge(&stored))
            .await?;
        api.patch(CRD_NAME, &pp, &Patch::Apply(&crd)).await?;
        Ok::<_, kube::Error>(())
    }
    .await;
    result
        .and(deleted.map_err(Into::into))
        .and(restored.map_err(Into::into))
}

/// The SingletonJob CRD with the next API version beside `v1alpha1`, stored in it.
fn next_version_crd() -> Result<CustomResourceDefinition> {
    let alpha = singleton::api::crd();
    let mut beta = alpha.clone();
    for v in &mut beta.spec.versions {
        v.name = "v1beta1".into();
    }
    let mut merged = kube::core::crd::merge_crds(vec![alpha, beta], "v1beta1")?;
    merged.metadata.managed_fields = None;
    Ok(merged)
}

fn next_resource() -> ApiResource {
    let mut ar = ApiResource::erase::<SingletonJob>(&());
    ar.version = "v1beta1".into();
    ar.api_version = "singleton.dev/v1beta1".into();
    ar
}

async fn served_by_both(env: &mut Env) -> Result<()> {
    env.start_controller(&[]).await?;
    let beta: Api<DynamicObject> =
        Api::namespaced_with(env.client.clone(), &env.ns, &next_resource());
    let mut obj: Value = serde_yaml::from_str(&sj_yaml("next", "*/2 * * * * *", ""))?;
    obj["apiVersion"] = json!("singleton.dev/v1beta1");
    let obj: DynamicObject = serde_json::from_value(obj)?;
    // The API server serves a version added to a CRD a moment after the CRD's write returns
    // (a 404 until then, seen on a loaded machine): wait for it rather than race it.
    env.wait_for("v1beta1 to be served", Duration::from_secs(30), || async {
        Ok(beta.list(&Default::default()).await.ok().map(|_| ()))
    })
    .await?;
    beta.create(&Default::default(), &obj).await?;
    let alpha = env
        .wait_for(
            "two runs of a SingletonJob created as v1beta1",
            Duration::from_secs(60),
            || async {
                let s = raw_status(env, "next").await?;
                Ok((s["fencingToken"].as_u64().unwrap_or_default() >= 2).then_some(s))
            },
        )
        .await?;
    let through_beta = beta.get("next").await?;
    let beta_status = through_beta.data.get("status").cloned().unwrap_or_default();
    // The same object: the status read through v1beta1 is at least as far as the one read
    // through v1alpha1 a moment before (the controller keeps writing).
    ensure(
        env,
        through_beta.types.as_ref().map(|t| t.api_version.as_str())
            == Some("singleton.dev/v1beta1")
            && beta_status["fencingToken"].as_u64() >= alpha["fencingToken"].as_u64(),
        (
            "read through v1beta1",
            &through_beta.types,
            &beta_status["fencingToken"],
            &alpha["fencingToken"],
        ),
    )
    .await?;
    let crd = Api::<CustomResourceDefinition>::all(env.client.clone())
        .get(CRD_NAME)
        .await?;
    let stored = crd
        .status
        .and_then(|s| s.stored_versions)
        .unwrap_or_default();
    ensure(
        env,
        stored.iter().any(|v| v == "v1beta1"),
        ("v1beta1 among the stored versions", &stored),
    )
    .await
}
