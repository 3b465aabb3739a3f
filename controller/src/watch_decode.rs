//! The watched SingletonJobs, decoded one by one. kube decodes a list page, or a watch event, as
//! one JSON document, so a single object it cannot decode failed every list of SingletonJobs and
//! stopped the controller in every namespace (issue 34, N1): a `jobTemplate` (kept without a
//! schema) nested deeper than serde_json's limit of 128 levels, and the managed fields that mirror
//! it. Here each item is first captured as raw text, which serde_json skips over iteratively, with
//! no depth limit, and then decoded on its own. One that fails becomes a stand-in: its metadata,
//! its status when that decodes, and why, in [`MARK`]. The reconcile reports it on the object
//! itself ([`report`]: `Ready=False` with reason `Undecodable`, a Warning Event, the metric
//! `singleton_undecodable_singletonjobs`, a warning in the log) and schedules nothing for it
//! until it is fixed; every other SingletonJob goes on as before.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use crate::api::{SingletonJob, SingletonJobStatus};
use crate::context::{Context, slim_sj};
use crate::lanes::Lane;
use crate::record::conditions;
use crate::{Result, kube_io};

/// The annotation a stand-in carries: why its object could not be decoded. Never read from the
/// API server: a decoded object keeps only the operation annotations ([`slim_sj`]), so a user
/// cannot set it.
pub const MARK: &str = "singleton.dev/undecodable";

/// The condition reason, the Event reason and the word in logs.
pub const REASON: &str = "Undecodable";

/// A SingletonJob as listed or watched: decoded, or its stand-in (see the module doc).
#[derive(Clone, Debug)]
pub struct Listed(pub SingletonJob);

/// The same resource as [`SingletonJob`]: only its decoding differs.
impl kube::Resource for Listed {
    type DynamicType = ();
    type Scope = <SingletonJob as kube::Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        SingletonJob::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        SingletonJob::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        SingletonJob::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        SingletonJob::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

impl<'de> Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        decode(raw.get())
            .map(Listed)
            .map_err(serde::de::Error::custom)
    }
}

/// One object's text: the SingletonJob (slimmed for the cache), or its stand-in. An error only
/// when not even its metadata can be read (then it is no Kubernetes object).
pub fn decode(raw: &str) -> serde_json::Result<SingletonJob> {
    match serde_json::from_str::<SingletonJob>(raw) {
        Ok(mut sj) => {
            slim_sj(&mut sj);
            Ok(sj)
        }
        Err(e) => stand_in(raw, why(&e)),
    }
}

/// What is read of an object that does not decode: shallow fields only, the rest skipped.
#[derive(Deserialize)]
struct Lite {
    metadata: LiteMeta,
    status: Option<Box<RawValue>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LiteMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
}

fn stand_in(raw: &str, why: String) -> serde_json::Result<SingletonJob> {
    let lite: Lite = serde_json::from_str(raw)?;
    let m = lite.metadata;
    let mut sj = SingletonJob::new(m.name.as_deref().unwrap_or_default(), Default::default());
    sj.metadata = ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: m.labels,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        annotations: Some(BTreeMap::from([(MARK.to_string(), why)])),
        ..Default::default()
    };
    // The status is written back whole with the condition set, so it is kept only when it
    // decodes: one that does not is left alone (`None`), never replaced by a blank one.
    sj.status = match lite.status {
        None => Some(SingletonJobStatus::default()),
        Some(s) => serde_json::from_str(s.get()).ok(),
    };
    Ok(sj)
}

/// Why an object does not decode, for its owner.
fn why(e: &serde_json::Error) -> String {
    // serde_json names this error only in its text; it is the one a stored SingletonJob meets
    // (everything but the template has a schema, and the template is decoded only when a Job
    // is built: `api::JobTemplate`).
    if e.to_string().starts_with("recursion limit exceeded") {
        format!(
            "it nests deeper than the controller decodes (128 levels; a field inside spec.jobTemplate, which is kept as written, nests too deep): {e}"
        )
    } else {
        format!("it is not a SingletonJob the controller can read: {e}")
    }
}

/// Why this SingletonJob is a stand-in, or `None` for a decoded one.
pub fn undecodable(sj: &SingletonJob) -> Option<&str> {
    sj.metadata
        .annotations
        .as_ref()?
        .get(MARK)
        .map(String::as_str)
}

/// A watch event of [`Listed`] objects as one of SingletonJobs.
pub fn unwrap_event(e: watcher::Event<Listed>) -> watcher::Event<SingletonJob> {
    use watcher::Event::*;
    match e {
        Apply(l) => Apply(l.0),
        Delete(l) => Delete(l.0),
        InitApply(l) => InitApply(l.0),
        Init => Init,
        InitDone => InitDone,
    }
}

/// The reconcile of a stand-in: `Ready=False` (reason [`REASON`]) in its status when that could
/// be read, a Warning Event and a warning in the log when the condition changes (or cannot be
/// written), and the metric. Nothing is scheduled; the next change of the object decides again.
pub async fn report(ctx: &Context, sj: &SingletonJob, why: &str) -> Result<Action> {
    crate::metrics::global().undecodable(sj, true);
    let message = format!("nothing is scheduled for this SingletonJob until it is fixed: {why}");
    let changed = match sj.status.clone() {
        Some(mut status) => {
            let now = jiff::Timestamp::now();
            let generation = sj.metadata.generation;
            let conds = &mut status.conditions;
            let changed = conditions::set(
                conds,
                conditions::READY,
                false,
                REASON,
                &message,
                generation,
                now,
            );
            if changed {
                kube_io::write_status(ctx, sj, status, Lane::Background).await?;
            }
            changed
        }
        None => true,
    };
    if changed {
        tracing::warn!(sj = %sj.key(), reason = REASON, "{message}");
        ctx.events
            .publish(sj, EventType::Warning, REASON, "Decode", message)
            .await;
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use kube::core::ObjectList;
    use kube::core::WatchEvent;

    use super::*;

    const GOOD: &str = r#"{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJob",
        "metadata":{"name":"good","namespace":"b","resourceVersion":"7","uid":"u1",
          "annotations":{"singleton.dev/undecodable":"spoofed"}},
        "spec":{"schedule":"* * * * *","jobTemplate":{"spec":{}}}}"#;

    /// A SingletonJob whose template nests `depth` levels below it, with managed fields that
    /// mirror it (as the API server writes them), and a status.
    fn deep(depth: usize) -> String {
        let nested = format!("{}1{}", r#"{"a":"#.repeat(depth), "}".repeat(depth));
        format!(
            r#"{{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJob",
            "metadata":{{"name":"deep","namespace":"a","resourceVersion":"9","uid":"u2",
              "generation":3,"managedFields":[{{"fieldsV1":{nested}}}]}},
            "spec":{{"schedule":"* * * * *","jobTemplate":{{"spec":{nested}}}}},
            "status":{{"fencingToken":5}}}}"#
        )
    }

    #[test]
    fn one_deep_object_does_not_fail_its_list_page() {
        let page = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{}},"items":[{},{GOOD}]}}"#,
            deep(130)
        );
        // The cause: decoded as kube decodes a page, one object fails them all.
        let whole = serde_json::from_str::<ObjectList<SingletonJob>>(&page).unwrap_err();
        assert!(whole.to_string().contains("recursion limit"), "{whole}");

        let list: ObjectList<Listed> = serde_json::from_str(&page).unwrap();
        let [bad, good] = [&list.items[0].0, &list.items[1].0];
        let why = undecodable(bad).expect("a stand-in");
        assert!(why.contains("nests deeper"), "{why}");
        assert_eq!(bad.metadata.name.as_deref(), Some("deep"));
        assert_eq!(bad.metadata.namespace.as_deref(), Some("a"));
        assert_eq!(bad.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(bad.metadata.generation, Some(3));
        // Its status is kept, so writing the condition loses nothing of it.
        assert_eq!(bad.status.as_ref().unwrap().fencing_token, 5);
        // The good one decodes, and the marker cannot be set from outside.
        assert_eq!(good.spec.schedule, "* * * * *");
        assert_eq!(undecodable(good), None);
    }

    #[test]
    fn a_deep_object_in_a_watch_event_is_a_stand_in() {
        let line = format!(r#"{{"type":"MODIFIED","object":{}}}"#, deep(200));
        match serde_json::from_str::<WatchEvent<Listed>>(&line).unwrap() {
            WatchEvent::Modified(l) => assert!(undecodable(&l.0).is_some()),
            other => panic!("{other:?}"),
        }
        // Far deeper than any stack would take in a recursive decoder.
        let line = format!(r#"{{"type":"ADDED","object":{}}}"#, deep(100_000));
        let ev = serde_json::from_str::<WatchEvent<Listed>>(&line).unwrap();
        assert!(matches!(ev, WatchEvent::Added(l) if undecodable(&l.0).is_some()));
    }

    #[test]
    fn a_status_that_does_not_decode_is_not_replaced() {
        let text = deep(130).replace(r#"{"fencingToken":5}"#, r#"{"fencingToken":"x"}"#);
        let sj = decode(&text).unwrap();
        assert!(undecodable(&sj).is_some());
        assert_eq!(sj.status, None);
        // No status at all: a fresh one, to carry the condition.
        let text = deep(130).replace(r#""status":{"fencingToken":5}"#, r#""other":{}"#);
        assert_eq!(decode(&text).unwrap().status, Some(Default::default()));
    }

    #[test]
    fn an_object_within_the_limit_decodes() {
        let sj = decode(&deep(100)).unwrap();
        assert_eq!(undecodable(&sj), None);
        assert_eq!(sj.status.unwrap().fencing_token, 5);
    }

    #[test]
    fn not_an_object_is_an_error() {
        assert!(decode("[1,2]").is_err());
        assert!(serde_json::from_str::<Listed>(r#"{"kind":"x"}"#).is_err());
    }
}
