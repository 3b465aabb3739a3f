//! The controller's writes to the API server, each gated: a write waits for a slot in its lane
//! ([`crate::lanes`]), and only then, immediately before it is sent, checks that this replica may
//! still act ([`crate::gate::Gate`], whose renew deadline closes it by itself). A replica
//! that lost the Lease while its request waited sends nothing (G4).
//!
//! What a check cannot close, a pause between the check and the send, the run protocol closes
//! another way: every Job is created suspended and only the Job a compare-and-swap confirmed is
//! ever resumed ([`crate::run`]).

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, PropagationPolicy};

use crate::api::{SingletonJob, SingletonJobStatus};
use crate::context::Context;
use crate::failpoint;
use crate::lanes::Lane;
use crate::{Error, Result};

/// Sends the request `make` builds once it has a slot in `lane` and the gate is open, with
/// `point` reached in between (a failpoint, for tests). The outer error is [`Error::NotLeader`];
/// the inner result is the API server's answer, for the caller to sort.
pub async fn gated<T, F, Fut>(
    ctx: &Context,
    lane: Lane,
    point: Option<&'static str>,
    make: F,
) -> Result<kube::Result<T>>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = kube::Result<T>>,
{
    let _slot = ctx.lanes.acquire(lane).await;
    ctx.gate.check()?;
    if let Some(point) = point {
        failpoint::hit(point);
    }
    Ok(Box::pin(make()).await)
}

/// What the controller reads of a write's response. The rest is skipped unparsed: decoding whole
/// responses (each with its managed fields, a JSON tree of kilobytes) was most of what a start-up
/// with 10,000 SingletonJobs allocated and freed, and the fragmentation it left stayed resident.
#[derive(serde::Deserialize)]
struct Written {
    #[serde(default)]
    metadata: WrittenMeta,
}

#[derive(Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

/// Writes `status` to `sj`'s status subresource with `sj`'s resourceVersion as precondition
/// (compare-and-swap). Returns the object as written, carrying the new resourceVersion.
///
/// Every status write carries the notifications of the history entries it adds (the outbox,
/// [`crate::decide::notify::fill`]): recorded in the same write as the period, whichever step
/// wrote it, so neither is ever without the other. Once written, their delivery starts.
pub async fn write_status(
    ctx: &Context,
    sj: &SingletonJob,
    status: SingletonJobStatus,
    lane: Lane,
) -> Result<SingletonJob> {
    write_status_at(ctx, sj, status, lane, None).await
}

/// [`write_status`] with a failpoint reached right before the write is sent.
pub async fn write_status_at(
    ctx: &Context,
    sj: &SingletonJob,
    status: SingletonJobStatus,
    lane: Lane,
    point: Option<&'static str>,
) -> Result<SingletonJob> {
    let mut status = status;
    fill_outbox(ctx, sj, sj.status.as_ref(), &mut status);
    write_status_filled(ctx, sj, status, lane, point).await
}

/// Adds to `status`'s outbox the notifications of the history entries it adds to `base`
/// ([`crate::decide::notify::fill`]), for a write whose precondition copy no longer holds the
/// status it was made from (see [`write_status_filled`]).
pub fn fill_outbox(
    ctx: &Context,
    sj: &SingletonJob,
    base: Option<&SingletonJobStatus>,
    status: &mut SingletonJobStatus,
) {
    let targets = ctx.notifier.targets(sj);
    // Most SingletonJobs have none: nothing to compare, not even a key to format.
    if targets.is_empty() {
        return;
    }
    crate::decide::notify::fill(
        targets,
        &sj.key(),
        base,
        status,
        |job| pods_started(ctx, sj, job),
        Timestamp::now(),
    );
}

/// The pods a run's Job has started so far (active, succeeded and failed), from the cache.
fn pods_started(ctx: &Context, sj: &SingletonJob, job: &str) -> Option<i32> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let j = ctx
        .jobs
        .get(&kube::runtime::reflector::ObjectRef::new(job).within(ns))?;
    let s = j.status.as_ref()?;
    Some(s.active.unwrap_or(0) + s.succeeded.unwrap_or(0) + s.failed.unwrap_or(0))
}

/// [`write_status_at`] for a `status` whose outbox the caller filled with [`fill_outbox`]: `sj`
/// is only the precondition (its resourceVersion), its status may have been dropped to save
/// memory while the write waited.
pub async fn write_status_filled(
    ctx: &Context,
    sj: &SingletonJob,
    status: SingletonJobStatus,
    lane: Lane,
    point: Option<&'static str>,
) -> Result<SingletonJob> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let api: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    // Never write without a precondition: a missing resourceVersion would turn the PUT into a
    // blind overwrite and silently undo another replica's claim.
    if sj.metadata.resource_version.is_none() {
        return Err(Error::Conflict(format!(
            "{ns}/{name} read without a resourceVersion"
        )));
    }
    let pp = PostParams::default();
    // The copy to send is made once the request has a slot, not while it waits for one. What
    // comes back is what was sent with a new resourceVersion (and managed fields, which the
    // controller never reads), so only the resourceVersion is read from the response.
    let send = || async {
        let mut obj = sj.clone();
        obj.status = Some(status);
        // Without the spec: the API server takes only the status from a status write, and a
        // template over the size limit is not held to be sent (see `api::JobTemplate`).
        let body = serde_json::to_vec(&serde_json::json!({
            "apiVersion": <SingletonJob as kube::Resource>::api_version(&()),
            "kind": <SingletonJob as kube::Resource>::kind(&()),
            "metadata": &obj.metadata,
            "status": &obj.status,
        }))
        .map_err(kube::Error::SerdeError)?;
        let req = kube::core::Request::new(api.resource_url())
            .replace_subresource("status", name, &pp, body)
            .map_err(kube::Error::BuildRequest)?;
        let written: Written = ctx.client.request(req).await?;
        obj.metadata.resource_version = written.metadata.resource_version;
        Ok::<_, kube::Error>(obj)
    };
    let written = gated(ctx, lane, point, send)
        .await
        .and_then(|r| {
            r.map_err(|e| Error::from_write(e, &format!("singletonjob {ns}/{name} status")))
        })
        .inspect_err(|e| crate::metrics::global().write_refused(sj, e))?;
    // What this write settled is no longer news; what it recorded starts on its way.
    if let Some(st) = written.status.as_ref() {
        ctx.notifier.written(&written, st);
        ctx.notifier.offer(&written, Some(st));
    }
    Ok(written)
}

/// Creates `job` (suspended: see [`crate::run`]). The API server's answer is the caller's to
/// sort (a 409 means a Job of that name exists).
pub async fn create_job(ctx: &Context, job: &Job, lane: Lane) -> Result<kube::Result<Job>> {
    let ns = job.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PostParams::default();
    gated(ctx, lane, Some(failpoint::CREATE_LANE), || {
        jobs.create(&pp, job)
    })
    .await
}

/// How a deleted Job's pods go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The Job object goes at once; its pods are removed after it.
    Background,
    /// The Job object stays (with a deletionTimestamp) until its pods are gone, so its existence
    /// says its pods may still run.
    Foreground,
}

impl Propagation {
    fn policy(self) -> PropagationPolicy {
        match self {
            Propagation::Background => PropagationPolicy::Background,
            Propagation::Foreground => PropagationPolicy::Foreground,
        }
    }
}

/// What became of a resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumed {
    /// The Job with that uid may now run its pods.
    Yes,
    /// It could already (someone resumed it before), or a Job of that name exists that is not
    /// the object with that uid: nothing was changed.
    Already,
    /// No Job of that name exists any more (deleted, pruned, replaced).
    Gone,
}

/// How a confirmed run's Job is let run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release<'a> {
    /// The controller resumes it (`spec.suspend: false`).
    Resume,
    /// A queue resumes it (a queue-managed template, Kueue): the controller adds the queue's
    /// label (`kueue.x-k8s.io/queue-name`, withheld at create), and the queue admits it.
    Queue(Option<&'a str>),
}

/// Lets the Job `name` run its pods (or be admitted by its queue), but only if it is still the
/// object with `uid` and still suspended: a JSON patch whose `test`s make the API server refuse it
/// for any other Job of that name, and make a second resume change nothing (so it is told apart
/// from the first). The same patch marks it `singleton.dev/released` with the run's token: a Job
/// of ours running without that mark was started by someone else (issue 31).
pub async fn resume_job(ctx: &Context, ns: &str, resume: &ResumeJob<'_>) -> Result<Resumed> {
    let ResumeJob {
        name,
        uid,
        token,
        release,
        active_deadline,
        unreleased,
    } = *resume;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let released = pointer("/metadata/annotations", crate::naming::ANNOTATION_RELEASED);
    let mut ops = vec![
        serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid}),
        serde_json::json!({"op": "test", "path": "/spec/suspend", "value": true}),
    ];
    if unreleased == Unreleased::Tested {
        ops.push(serde_json::json!({"op": "test", "path": released, "value": crate::naming::NOT_RELEASED}));
    }
    ops.push(serde_json::json!({"op": "add", "path": released, "value": token.to_string()}));
    match release {
        Release::Resume => ops.push(serde_json::json!({"op": "replace", "path": "/spec/suspend", "value": false})),
        // The Job's labels exist (the controller's own are set at create).
        Release::Queue(Some(queue)) => ops.push(serde_json::json!({"op": "add", "path": pointer("/metadata/labels", crate::naming::LABEL_KUEUE_QUEUE), "value": queue})),
        Release::Queue(None) => {}
    }
    // Counted by Kubernetes from the resume: set from the deadline's distance now (F10a).
    if let Some(seconds) = active_deadline {
        ops.push(serde_json::json!({"op": "add", "path": "/spec/activeDeadlineSeconds", "value": seconds}));
    }
    let point = Some(match unreleased {
        Unreleased::Tested => failpoint::RESUME_PREPARED,
        Unreleased::Untested => failpoint::RESUME,
    });
    Ok(
        match guarded_patch(
            ctx,
            jobs.resource_url(),
            name,
            serde_json::Value::Array(ops),
            Lane::Create,
            point,
        )
        .await?
        {
            Patched::Done => Resumed::Yes,
            Patched::Gone => Resumed::Gone,
            // Another object of that name, or resumed already.
            Patched::TestFailed => Resumed::Already,
        },
    )
}

/// What [`resume_job`] lets run: the Job `name` with `uid`, for the run with `token`.
#[derive(Clone, Copy, Debug)]
pub struct ResumeJob<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub token: u64,
    pub release: Release<'a>,
    /// `activeDeadlineSeconds`, counted by Kubernetes from the resume (F10a).
    pub active_deadline: Option<i64>,
    pub unreleased: Unreleased,
}

/// Whether a resume tests that the Job is still marked not released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreleased {
    /// A prepared run's resume: its withdrawal marks the Job `withdrawn` (the linearisation
    /// point between the two), so a resume that finds any other mark changes nothing, however
    /// late it is sent (a paused leader's).
    Tested,
    /// A confirmed run's resume: its Job may be a controller's from before issue 31 (no mark).
    Untested,
}

/// What became of a withdrawal's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// The Job with that uid is marked withdrawn (now, or before): no resume can pass any more.
    Withdrawn,
    /// No Job of that name exists.
    Gone,
    /// The Job is not the one with that uid, or no longer marked not released (resumed, or
    /// withdrawn by another replica): read it to tell which.
    Not,
}

/// Step W1 of a prepared run's withdrawal: marks the Job `name` withdrawn, with `reason`, but only
/// if it is still the object with `uid` and still marked not released. The resume tests for that
/// mark, and the API server applies a JSON patch to the latest object: of a resume and a
/// withdrawal, exactly one succeeds (G1).
pub async fn withdraw_job(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
    reason: &str,
) -> Result<Marked> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let released = pointer("/metadata/annotations", crate::naming::ANNOTATION_RELEASED);
    let why = pointer("/metadata/annotations", crate::naming::ANNOTATION_WITHDRAWN);
    let ops = serde_json::json!([
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": released, "value": crate::naming::NOT_RELEASED},
        {"op": "replace", "path": released, "value": crate::naming::WITHDRAWN},
        {"op": "add", "path": why, "value": reason},
    ]);
    let point = None;
    Ok(
        match guarded_patch(ctx, jobs.resource_url(), name, ops, Lane::Create, point).await? {
            Patched::Done => Marked::Withdrawn,
            Patched::Gone => Marked::Gone,
            Patched::TestFailed => Marked::Not,
        },
    )
}

/// A JSON pointer to `key` under `parent` (RFC 6901: `~` and `/` escaped).
fn pointer(parent: &str, key: &str) -> String {
    format!("{parent}/{}", key.replace('~', "~0").replace('/', "~1"))
}

/// Sets `spec.suspend: true` on the SingletonJob (`suspendAfterConsecutiveFailures`), only if its
/// spec is still the generation the decision was made on: a copy decided again before the watch
/// delivers the suspension (or a user's concurrent edit) fails the test and changes nothing, and
/// the next decision, on the new spec, tries again if it must. Returns whether this call
/// suspended it.
pub async fn suspend_sj(ctx: &Context, sj: &SingletonJob) -> Result<bool> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let sjs: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    let ops = serde_json::json!([
        {"op": "test", "path": "/metadata/generation", "value": sj.metadata.generation},
        {"op": "add", "path": "/spec/suspend", "value": true},
    ]);
    let patched = guarded_patch(ctx, sjs.resource_url(), name, ops, Lane::Background, None).await?;
    Ok(patched == Patched::Done)
}

/// Ends a suspension whose `suspension.until` has passed: `suspend: false` and no `suspension`,
/// only if the spec is still the one that was decided on (a user's edit since wins). Returns
/// whether it was done.
pub async fn resume_sj(ctx: &Context, sj: &SingletonJob) -> Result<bool> {
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let name = sj.metadata.name.as_deref().unwrap_or_default();
    let sjs: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    let ops = serde_json::json!([
        {"op": "test", "path": "/metadata/generation", "value": sj.metadata.generation},
        {"op": "replace", "path": "/spec/suspend", "value": false},
        {"op": "remove", "path": "/spec/suspension"},
    ]);
    let patched = guarded_patch(ctx, sjs.resource_url(), name, ops, Lane::Background, None).await?;
    Ok(patched == Patched::Done)
}

/// What a [`guarded_patch`] came to.
#[derive(Debug, PartialEq, Eq)]
enum Patched {
    Done,
    /// No object of that name.
    Gone,
    /// A `test` of the patch failed: the object is not the one it was written for.
    TestFailed,
}

/// Sends a JSON patch of `name` (under the resource `url`) through the gate ([`gated`]); its `test` operations are its
/// preconditions. Only the verdict matters: the object in the response is skipped unparsed.
async fn guarded_patch(
    ctx: &Context,
    url: &str,
    name: &str,
    ops: serde_json::Value,
    lane: Lane,
    point: Option<&'static str>,
) -> Result<Patched> {
    let patch: json_patch::Patch = serde_json::from_value(ops)?;
    let tests: Vec<json_patch::PatchOperation> = patch
        .0
        .iter()
        .filter(|op| matches!(op, json_patch::PatchOperation::Test(_)))
        .cloned()
        .collect();
    let pp = PatchParams::default();
    let sent = gated(ctx, lane, point, || async {
        let req = kube::core::Request::new(url)
            .patch(name, &pp, &Patch::<()>::Json(patch))
            .map_err(kube::Error::BuildRequest)?;
        ctx.client.request::<serde::de::IgnoredAny>(req).await
    })
    .await?;
    match sent {
        Ok(_) => Ok(Patched::Done),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Patched::Gone),
        Err(kube::Error::Api(s))
            if matches!(s.code, 409 | 422 | 400) && test_failed(&s.message) =>
        {
            Ok(Patched::TestFailed)
        }
        // API servers since 1.3x answer a failed `test` with a bare 422 ("the server rejected
        // our request due to an error in our request", no cause), which a policy's or a
        // webhook's refusal can also be: the object as it is now tells which.
        Err(kube::Error::Api(s)) if s.code == 422 => {
            match Box::pin(tests_hold_now(ctx, url, name, &tests, lane)).await? {
                None => Ok(Patched::Gone),
                Some(false) => Ok(Patched::TestFailed),
                Some(true) => Err(kube::Error::Api(s).into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether every `test` of a refused patch holds on the object `name` as it is now (`None`: it
/// is gone). A read: not gated.
async fn tests_hold_now(
    ctx: &Context,
    url: &str,
    name: &str,
    tests: &[json_patch::PatchOperation],
    lane: Lane,
) -> Result<Option<bool>> {
    let req = kube::core::Request::new(url)
        .get(name, &kube::api::GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    let read = ctx
        .lanes
        .run(lane, || {
            ctx.client.request::<serde_json::Value>(req.clone())
        })
        .await;
    match read {
        Ok(mut object) => Ok(Some(json_patch::patch(&mut object, tests).is_ok())),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether the API server's message says a JSON patch `test` failed (json-patch's "testing value
/// /path failed: test failed"), and not, say, a webhook's denial that mentions a test (F10a: such
/// a denial was read as "resumed already" and the run silently never started).
fn test_failed(message: &str) -> bool {
    message.contains("test failed") || message.contains("testing value")
}

/// Deletes the Job `name` only if it is still the object with `uid` (never a later one of that
/// name). Returns whether anything was deleted.
pub async fn delete_job_uid(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
    propagation: Propagation,
    lane: Lane,
) -> Result<bool> {
    delete_job(ctx, ns, name, Some(uid), propagation, lane).await
}

/// Deletes a Job by name when its uid is not known (a run recorded before uids were, or one
/// whose create answer was lost): whatever Job has the name now goes.
pub async fn delete_job_named(
    ctx: &Context,
    ns: &str,
    name: &str,
    propagation: Propagation,
    lane: Lane,
) -> Result<bool> {
    delete_job(ctx, ns, name, None, propagation, lane).await
}

/// The gated delete behind both: with a uid, a precondition on it (409: another object has the
/// name now, so nothing of ours was deleted).
async fn delete_job(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: Option<&str>,
    propagation: Propagation,
    lane: Lane,
) -> Result<bool> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        propagation_policy: Some(propagation.policy()),
        preconditions: uid.map(|uid| kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match gated(ctx, lane, None, || jobs.delete(name, &dp)).await? {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || (s.code == 409 && uid.is_some()) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Reads one Job (a read: not gated), `None` if it does not exist.
pub async fn get_job(ctx: &Context, ns: &str, name: &str, lane: Lane) -> Result<Option<Job>> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    Ok(ctx.lanes.run(lane, || jobs.get_opt(name)).await?)
}

/// Reads one SingletonJob fresh from the API server (not gated).
pub async fn get_sj(ctx: &Context, ns: &str, name: &str) -> Result<SingletonJob> {
    let sjs: Api<SingletonJob> = Api::namespaced(ctx.client.clone(), ns);
    Ok(ctx.lanes.run(Lane::Create, || sjs.get(name)).await?)
}

/// Asks the API server whether it would accept this SingletonJob's Job (a dry-run create, which
/// runs validation and admission but stores nothing). `Ok(Err(message))` when it would not.
pub async fn dry_run_job(
    ctx: &Context,
    sj: &SingletonJob,
    now: Timestamp,
) -> Result<std::result::Result<(), String>> {
    let window = crate::schedule::Window::unknown(now);
    let job = match crate::job::build(sj, now, 0, &window) {
        Ok(job) => job,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let ns = sj.metadata.namespace.as_deref().unwrap_or_default();
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // Only the verdict matters: the response (the Job as it would be) is skipped unparsed.
    let dry_run = || async {
        let body = serde_json::to_vec(&job).map_err(kube::Error::SerdeError)?;
        let req = kube::core::Request::new(jobs.resource_url())
            .create(&pp, body)
            .map_err(kube::Error::BuildRequest)?;
        ctx.client.request::<serde::de::IgnoredAny>(req).await
    };
    match ctx.lanes.run(Lane::Background, dry_run).await {
        // 409: a Job of that name exists, so the template itself was not the problem; nor is
        // it with 403 (a quota with no room, or no permission): creating the run's Job will say
        // so, and the claim is decided by its deadline.
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 || s.code == 403 => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => Ok(Err(s.message)),
        Err(e) => Err(e.into()),
    }
}
