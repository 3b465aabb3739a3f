//! The exact shape of the claim's write, against kube's mock service: the one place where a
//! mock is right, since the real API server cannot show us the request we sent.
use super::*;
use crate::api::{SingletonJob, SingletonJobSpec};
use crate::context::{InFlight, OwnWrites, Recent};
use crate::events::Events;
use crate::gate::Gate;
use futures::StreamExt;
use http::{Request, Response};
use kube::client::Body;
use kube::runtime::events::Reporter;
use kube::runtime::reflector;
use kube::runtime::reflector::ObjectRef;
use tokio_stream::wrappers::UnboundedReceiverStream;

fn context(client: kube::Client) -> Context {
    let clock = Arc::new(crate::clock::Clock::new(
        crate::clock::Samples::new(jiff::SignedDuration::from_secs(5)),
        client.clone(),
        std::time::Duration::from_secs(30),
    ));
    let lanes = crate::lanes::Lanes::new(4);
    let client_for_notifier = client.clone();
    Context {
        client: client.clone(),
        events: Events::new(
            client,
            Reporter {
                controller: "test".into(),
                instance: None,
            },
            lanes.clone(),
        ),
        lanes,
        jobs: reflector::store().0,
        calendars: kube::runtime::reflector::store().0,
        clock,
        gate: Gate::always(),
        backstops: Default::default(),
        backstop_health: Default::default(),
        rejections_seen: Default::default(),
        own_writes: OwnWrites::default(),
        confirming: InFlight::new().0,
        resumed: Recent::default(),
        fresh_reads: Default::default(),
        refused: Default::default(),
        prepare_lead_seconds: 0,
        prepare_max_lead_seconds: 600,
        due: crate::context::Due::new().0,
        notifier: crate::notify::Notifier::new(
            client_for_notifier,
            Gate::always(),
            Default::default(),
        )
        .0,
    }
}

fn sj() -> SingletonJob {
    let mut sj = SingletonJob::new(
        "hello",
        serde_yaml::from_str::<SingletonJobSpec>(
            "schedule: '* * * * *'\njobTemplate: {spec: {template: {spec: {containers: []}}}}",
        )
        .unwrap(),
    );
    sj.metadata.namespace = Some("ns".into());
    sj.metadata.resource_version = Some("4711".into());
    sj
}

#[tokio::test]
async fn the_status_write_is_a_put_guarded_by_the_observed_resource_version() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(kube::Client::new(svc, "ns"));
    let server = tokio::spawn(async move {
        let (req, send) = handle.next_request().await.expect("a request");
        assert_eq!(
            req.method(),
            http::Method::PUT,
            "a replace, never a patch: patches carry no precondition"
        );
        assert_eq!(
            req.uri().path(),
            "/apis/singleton.dev/v1alpha1/namespaces/ns/singletonjobs/hello/status"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["metadata"]["resourceVersion"], "4711");
        assert_eq!(body["status"]["fencingToken"], 8);
        // Someone else wrote first.
        let status = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"});
        send.send_response(
            Response::builder()
                .status(409)
                .body(Body::from(serde_json::to_vec(&status).unwrap()))
                .unwrap(),
        );
    });
    let status = SingletonJobStatus {
        fencing_token: 8,
        ..Default::default()
    };
    let err = write_status(&ctx, &sj(), status, Lane::Claim)
        .await
        .expect_err("409 must fail the claim");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");
    server.await.unwrap();
}

#[tokio::test]
async fn a_written_status_carries_the_resource_version_of_the_response() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(kube::Client::new(svc, "ns"));
    let server = tokio::spawn(async move {
        let (req, send) = next(&mut handle, "the status write").await;
        let mut stored: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        stored["metadata"]["resourceVersion"] = "4712".into();
        stored["metadata"]["managedFields"] =
            serde_json::json!([{"manager": "x", "fieldsV1": {"f:status": {}}}]);
        respond(send, 200, serde_json::to_vec(&stored).unwrap());
    });
    let status = SingletonJobStatus {
        fencing_token: 9,
        ..Default::default()
    };
    let written = write_status(&ctx, &sj(), status.clone(), Lane::Claim)
        .await
        .expect("written");
    assert_eq!(written.metadata.resource_version.as_deref(), Some("4712"));
    assert_eq!(written.status, Some(status));
    assert!(written.metadata.managed_fields.is_none(), "never decoded");
    server.await.unwrap();
}

#[tokio::test]
async fn no_write_without_a_resource_version_or_without_the_gate() {
    let (svc, _handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = context(kube::Client::new(svc, "ns"));
    let mut blind = sj();
    blind.metadata.resource_version = None;
    let err = write_status(&ctx, &blind, SingletonJobStatus::default(), Lane::Claim)
        .await
        .expect_err("blind write");
    assert!(matches!(err, Error::Conflict(_)), "{err:?}");

    let (tx, rx) = tokio::sync::watch::channel(crate::gate::GateState {
        may_act: false,
        epoch: 3,
        valid_until: None,
    });
    let closed = Context {
        gate: Gate::new(rx),
        ..ctx
    };
    let err = write_status(&closed, &sj(), SingletonJobStatus::default(), Lane::Claim)
        .await
        .expect_err("gate closed");
    assert!(matches!(err, Error::NotLeader), "{err:?}");
    drop(tx);
}

/// A SingletonJob as read, with a pending claim (token 7) whose Job was created with `job-uid`.
fn claimed() -> (SingletonJob, RunRef) {
    let mut sj = sj();
    sj.metadata.uid = Some("sj-uid".into());
    let claim = RunRef {
        unknown: Default::default(),
        late: false,
        period: Timestamp::from_second(1_800_000_000).unwrap().into(),
        token: 7,
        job_name: "hello-1800000000".into(),
        claimed_at: None,
        job_uid: Some("job-uid".into()),
        origin: None,
        requested_by: None,
        supersedes: None,
        replaces: Vec::new(),
        resume_at: None,
        basis: None,
    };
    sj.status = Some(SingletonJobStatus {
        fencing_token: 7,
        pending_claim: Some(claim.clone()),
        ..Default::default()
    });
    (sj, claim)
}

fn respond(send: tower_test::mock::SendResponse<Response<Body>>, code: u16, body: Vec<u8>) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(body))
            .unwrap(),
    );
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// The next request the controller sends; a test fails rather than hangs if none comes.
async fn next(
    handle: &mut Handle,
    what: &str,
) -> (
    Request<Body>,
    tower_test::mock::SendResponse<Response<Body>>,
) {
    tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request())
        .await
        .unwrap_or_else(|_| panic!("no {what} within 10 s"))
        .unwrap_or_else(|| panic!("the client is gone before the {what}"))
}

/// A confirm of [`claimed`]'s claim, spawned against a mock API server: the context, the
/// server's handle, the stream of reconciles asked for, and the object.
fn confirming() -> (
    Arc<Context>,
    Handle,
    UnboundedReceiverStream<ObjectRef<SingletonJob>>,
    SingletonJob,
    RunRef,
) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (confirming, done) = InFlight::new();
    let ctx = Arc::new(Context {
        confirming,
        ..context(kube::Client::new(svc, "ns"))
    });
    let (sj, claim) = claimed();
    let status = confirm::status_after_confirm(&sj, &claim, false);
    confirm::spawn(
        &ctx,
        sj.clone(),
        status,
        claim.clone(),
        "job-uid".into(),
        super::Admission::Controller,
    );
    (ctx, handle, done, sj, claim)
}

/// The reconcile the confirm asks for once it is done; a test fails rather than hangs.
async fn asked(
    done: &mut UnboundedReceiverStream<ObjectRef<SingletonJob>>,
) -> ObjectRef<SingletonJob> {
    tokio::time::timeout(std::time::Duration::from_secs(10), done.next())
        .await
        .expect("a reconcile asked for within 10 s")
        .expect("the channel is open")
}

fn conflict() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"})).unwrap()
}

/// Asserts that `req` resumes the Job `hello-1800000000` only if its uid is `uid`.
async fn assert_resume(req: Request<Body>, uid: &str) {
    assert_eq!(req.method(), http::Method::PATCH);
    assert_eq!(
        req.uri().path(),
        "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
    );
    assert_eq!(
        req.headers()[http::header::CONTENT_TYPE],
        "application/json-patch+json"
    );
    let body: serde_json::Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!([
            {"op": "test", "path": "/metadata/uid", "value": uid},
            {"op": "test", "path": "/spec/suspend", "value": true},
            {"op": "add", "path": "/metadata/annotations/singleton.dev~1released", "value": "7"},
            {"op": "replace", "path": "/spec/suspend", "value": false},
        ]),
        "only that object, never another Job of its name; marked released by the same patch"
    );
}

#[tokio::test]
async fn a_won_confirm_resumes_its_job_by_uid_and_reconciles_wait_for_both() {
    let (ctx, mut handle, mut done, sj, _) = confirming();
    assert!(
        ctx.confirming.contains(&sj),
        "the confirm is in flight until answered"
    );

    let (req, send) = next(&mut handle, "the confirm").await;
    assert_eq!(req.method(), http::Method::PUT);
    let body: serde_json::Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(
        body["metadata"]["resourceVersion"], "4711",
        "a compare-and-swap"
    );
    assert!(body["status"].get("pendingClaim").is_none(), "{body}");
    assert_eq!(body["status"]["active"][0]["token"], 7);
    assert_eq!(body["status"]["active"][0]["jobUid"], "job-uid");
    assert!(ctx.confirming.contains(&sj));
    respond(send, 200, serde_json::to_vec(&body).unwrap());

    // Step 8 follows the won confirm, and only it.
    let (req, send) = next(&mut handle, "the resume").await;
    assert_resume(req, "job-uid").await;
    assert!(ctx.confirming.contains(&sj), "in flight until resumed");
    respond(send, 200, b"{}".to_vec());

    assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
    assert!(!ctx.confirming.contains(&sj));
    // Copies read before the confirm are recognised as stale.
    assert!(ctx.own_writes.predates(&sj, sj.status.as_ref().unwrap()));
}

/// A preparation's confirm (issue 33) moves its claim into `status.prepared`, not `active`: its
/// period is not decided, no history entry is written, and no resume follows (G4: that waits
/// for the instant, in run::prepared). The task then asks for the reconcile that keeps it.
#[tokio::test]
async fn a_preparation_is_confirmed_into_prepared_and_not_resumed() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (confirming, mut done) = InFlight::new();
    let ctx = Arc::new(Context {
        confirming,
        ..context(kube::Client::new(svc, "ns"))
    });
    let (mut sj, mut claim) = claimed();
    let resume_at = claim.period.0 + jiff::SignedDuration::from_secs(3);
    claim.resume_at = Some(resume_at.into());
    claim.basis = Some("fp:00/spec:00".into());
    let before = Timestamp::from_second(1_799_999_940).unwrap();
    let st = sj.status.as_mut().unwrap();
    st.pending_claim = Some(claim.clone());
    st.decided_through = Some(before.into());
    st.run_count = 1;
    let status = confirm::status_after_confirm(&sj, &claim, false);
    confirm::spawn(
        &ctx,
        sj.clone(),
        status,
        claim.clone(),
        "job-uid".into(),
        super::Admission::Controller,
    );

    let (req, send) = next(&mut handle, "the confirm").await;
    assert_eq!(req.method(), http::Method::PUT);
    let body: serde_json::Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    let status = &body["status"];
    assert!(status.get("pendingClaim").is_none(), "{body}");
    assert!(
        status
            .get("active")
            .is_none_or(|a| a.as_array().is_some_and(Vec::is_empty)),
        "{body}"
    );
    assert!(
        status
            .get("history")
            .is_none_or(|h| h.as_array().is_some_and(Vec::is_empty)),
        "{body}"
    );
    assert_eq!(status["prepared"]["jobUid"], "job-uid");
    assert_eq!(status["prepared"]["token"], 7);
    assert_eq!(status["prepared"]["basis"], "fp:00/spec:00");
    assert!(status["prepared"]["resumeAt"].is_string(), "{body}");
    assert_eq!(
        status["decidedThrough"],
        serde_json::json!(before),
        "the cursor did not move"
    );
    assert_eq!(status["runCount"], 1);
    respond(send, 200, serde_json::to_vec(&body).unwrap());

    // No resume: the task ends and asks for the reconcile that keeps the run until its instant.
    assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
    assert!(!ctx.confirming.contains(&sj));
    let more = tokio::time::timeout(std::time::Duration::from_millis(200), handle.next_request());
    assert!(
        more.await.is_err(),
        "no request after a preparation's confirm"
    );
}

/// A status wiped between a claim and its completion, the pending claim kept (a merge patch
/// that removed what its author saw, the claim landing in between): the confirm written over it
/// carries the claim's token, so that the copy the watch brings back is not taken for one read
/// before the confirm (CI: a SingletonJob waited half a minute for a change that never came,
/// until the Lease changed hands, and its periods were recorded Missed).
#[test]
fn a_confirm_over_a_wiped_status_carries_its_token() {
    let (mut sj, claim) = claimed();
    sj.status = Some(SingletonJobStatus {
        pending_claim: Some(claim.clone()),
        ..Default::default()
    });
    let status = confirm::status_after_confirm(&sj, &claim, false);
    assert_eq!(status.fencing_token, claim.token);
    assert_eq!(status.active, vec![claim.clone()]);
    let own = OwnWrites::default();
    own.remember(&sj, claim.token);
    assert!(
        own.predates(&sj, sj.status.as_ref().unwrap()),
        "the wiped copy"
    );
    assert!(
        !own.predates(&sj, &status),
        "the confirmed copy is this process's own write"
    );
    // A status that was never wiped keeps its (higher) token.
    let (sj, claim) = claimed();
    let mut higher = sj.clone();
    higher.status.as_mut().unwrap().fencing_token = 9;
    assert_eq!(
        confirm::status_after_confirm(&higher, &claim, false).fencing_token,
        9
    );
}

/// What the status that beat a confirm says of the confirm's claim and Job.
#[derive(Clone, Copy, Debug)]
enum Winner {
    /// Another replica completed the claim with this very Job (it adopted it).
    AdoptedTheJob,
    /// The claim is still pending (an unrelated write won): its completer adopts the Job.
    StillPending,
    /// The period was completed without this Job (it is a late re-creation).
    MovedOn,
}

#[tokio::test]
async fn a_lost_confirm_never_lets_an_unknown_job_run() {
    for winner in [Winner::AdoptedTheJob, Winner::StillPending, Winner::MovedOn] {
        let (ctx, mut handle, mut done, sj, claim) = confirming();

        let (_, send) = next(&mut handle, "the confirm").await;
        respond(send, 409, conflict());
        let (req, send) = next(&mut handle, "the re-read").await;
        assert_eq!(req.method(), http::Method::GET);
        let mut won = sj.clone();
        won.metadata.resource_version = Some("4712".into());
        let mut status = SingletonJobStatus {
            fencing_token: 7,
            ..Default::default()
        };
        match winner {
            Winner::AdoptedTheJob => status.active = vec![claim.clone()],
            Winner::StillPending => status.pending_claim = Some(claim.clone()),
            Winner::MovedOn => {}
        }
        won.status = Some(status);
        respond(send, 200, serde_json::to_vec(&won).unwrap());
        match winner {
            // The winner resumes it; a loser never does.
            Winner::AdoptedTheJob | Winner::StillPending => {}
            Winner::MovedOn => {
                let (req, send) = next(&mut handle, "the removal").await;
                assert_eq!(req.method(), http::Method::DELETE);
                assert_eq!(
                    req.uri().path(),
                    "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
                );
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                assert_eq!(
                    body["preconditions"]["uid"], "job-uid",
                    "only that Job, never a later one of its name"
                );
                respond(send, 200, b"{}".to_vec());
            }
        }
        assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
        assert!(!ctx.confirming.contains(&sj));
        assert!(
            !ctx.own_writes.predates(&sj, sj.status.as_ref().unwrap()),
            "not confirmed"
        );
        // Nothing else was sent (never a resume after a lost confirm): the task is over and
        // holds no client.
        drop(ctx);
        let after = tokio::time::timeout(std::time::Duration::from_secs(10), handle.next_request());
        assert!(
            matches!(after.await, Ok(None)),
            "a request after the confirm was done ({winner:?})"
        );
    }
}

#[tokio::test]
async fn the_job_is_created_suspended_then_confirmed_then_resumed() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (confirming, mut done) = InFlight::new();
    let ctx = Arc::new(Context {
        confirming,
        ..context(kube::Client::new(svc, "ns"))
    });
    let (sj, claim) = claimed();
    let mut claim = claim;
    claim.job_uid = None;
    let server = async {
        let (req, send) = next(&mut handle, "the create").await;
        assert_eq!(req.method(), http::Method::POST);
        assert_eq!(req.uri().path(), "/apis/batch/v1/namespaces/ns/jobs");
        let mut job: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(job["spec"]["suspend"], true, "created unable to run");
        assert_eq!(job["metadata"]["name"], "hello-1800000000");
        job["metadata"]["uid"] = "new-uid".into();
        respond(send, 201, serde_json::to_vec(&job).unwrap());
        let (req, send) = next(&mut handle, "the confirm").await;
        assert_eq!(req.method(), http::Method::PUT);
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["status"]["active"][0]["jobUid"], "new-uid");
        respond(send, 200, serde_json::to_vec(&body).unwrap());
        let (req, send) = next(&mut handle, "the resume").await;
        assert_resume(req, "new-uid").await;
        respond(send, 200, b"{}".to_vec());
    };
    let (completed, ()) = tokio::join!(
        complete_claim(
            &ctx,
            &sj,
            claim,
            &Availability::NotConfigured,
            Source::OwnWrite
        ),
        server
    );
    completed.expect("completed");
    assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
}

#[tokio::test]
async fn a_write_waiting_for_a_lane_when_the_gate_closes_is_never_sent() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (tx, rx) = tokio::sync::watch::channel(crate::gate::GateState {
        may_act: true,
        epoch: 1,
        valid_until: None,
    });
    let ctx = Context {
        gate: Gate::new(rx),
        lanes: crate::lanes::Lanes::new(1),
        ..context(kube::Client::new(svc, "ns"))
    };
    // Every slot is taken: the write waits in its lane, past the gate check at its start.
    let held = ctx.lanes.acquire(Lane::Background).await;
    let obj = sj();
    let write = write_status(&ctx, &obj, SingletonJobStatus::default(), Lane::Create);
    tokio::pin!(write);
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(50), &mut write)
            .await
            .is_err(),
        "waits for a slot"
    );
    // The Lease is lost meanwhile; then the slot frees.
    tx.send_replace(crate::gate::GateState {
        may_act: false,
        epoch: 1,
        valid_until: None,
    });
    drop(held);
    let err = tokio::time::timeout(std::time::Duration::from_secs(5), write)
        .await
        .expect("refused without a request, not sent")
        .expect_err("the gate is closed");
    assert!(matches!(err, Error::NotLeader), "{err:?}");
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(200), handle.next_request())
            .await
            .is_err(),
        "nothing was sent"
    );
}

/// A rerun (`kubectl singleton rerun --replace`) takes the run protocol's steps for a period
/// decided before: the claim names a Job of its own and the run it replaces, marks the operation
/// done and leaves the schedule's cursor alone; the replaced run's Job is deleted (by uid) before
/// the new Job exists; the new Job carries the period's SINGLETON_PERIOD and idempotency key and
/// the new token; the confirm records the run as Rerun with who asked, the old one as Replaced.
#[tokio::test]
async fn a_rerun_claims_its_period_again_under_a_name_of_its_own() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (confirming, mut done) = InFlight::new();
    let ctx = Arc::new(Context {
        confirming,
        ..context(kube::Client::new(svc, "ns"))
    });
    let mut sj = sj();
    sj.metadata.uid = Some("sj-uid".into());
    sj.spec.job_template = serde_json::json!({"spec": {"template": {"spec": {
        "restartPolicy": "Never",
        "containers": [{"name": "work", "image": "busybox"}],
    }}}})
    .into();
    let period = Timestamp::from_second(1_800_000_000).unwrap();
    let (_, earlier) = claimed();
    let req = crate::decide::ops::Request {
        id: "r1".into(),
        by: Some("alice".into()),
        period: Some(period),
        replace: true,
        ..Default::default()
    };
    let mut status = SingletonJobStatus {
        fencing_token: 7,
        decided_through: Some(Timestamp::from_second(1_800_000_060).unwrap().into()),
        active: vec![earlier.clone()],
        active_count: 1,
        ..Default::default()
    };
    status.operations.rerun = Some(crate::decide::ops::accepted(&req, Timestamp::now()));
    let spec = serde_json::to_value(&sj.spec).unwrap();
    let server = async {
        let (req, send) = next(&mut handle, "the claim").await;
        assert_eq!(req.method(), http::Method::PUT);
        let mut written: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        // A status write sends no spec; the API server answers with the whole object.
        assert!(written.get("spec").is_none(), "{written}");
        written["spec"] = spec;
        let st = &written["status"];
        let claim = &st["pendingClaim"];
        assert_eq!(claim["jobName"], "hello-1800000000-r8", "{claim}");
        assert_eq!(
            (&claim["token"], &claim["origin"], &claim["requestedBy"]),
            (&8.into(), &"Rerun".into(), &"alice".into())
        );
        assert_eq!(claim["replaces"][0]["jobName"], "hello-1800000000");
        assert_eq!(st["fencingToken"], 8);
        assert_eq!(
            st["decidedThrough"], "2027-01-15T08:01:00Z",
            "the cursor is the schedule's"
        );
        assert_eq!(st["operations"]["rerun"]["phase"], "Done");
        assert_eq!(st["operations"]["rerun"]["token"], 8);
        respond(send, 200, serde_json::to_vec(&written).unwrap());
        // Runs to replace: the claim is re-read before anything is deleted.
        let (req, send) = next(&mut handle, "the re-read").await;
        assert_eq!(req.method(), http::Method::GET);
        respond(send, 200, serde_json::to_vec(&written).unwrap());
        let (req, send) = next(&mut handle, "the delete of the replaced run").await;
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(
            body["preconditions"]["uid"], "job-uid",
            "only that run's Job"
        );
        let gone = serde_json::json!({"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "hello-1800000000", "namespace": "ns", "uid": "job-uid"}});
        respond(send, 200, serde_json::to_vec(&gone).unwrap());
        // Without a backstop nothing fences the replaced run: the new Job waits until the old
        // one (deleted in the foreground, with its pods) is gone (F13).
        let (req, send) = next(&mut handle, "the check that the replaced Job is gone").await;
        assert_eq!(req.method(), http::Method::GET);
        assert_eq!(
            req.uri().path(),
            "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
        );
        let not_found = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
        respond(send, 404, serde_json::to_vec(&not_found).unwrap());
        let (req, send) = next(&mut handle, "the create").await;
        assert_eq!(req.method(), http::Method::POST);
        let mut job: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(job["metadata"]["name"], "hello-1800000000-r8");
        assert_eq!(job["spec"]["suspend"], true);
        let env: std::collections::BTreeMap<String, String> =
            job["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e.get("value").is_some())
                .map(|e| {
                    let s = |k: &str| e[k].as_str().unwrap().to_string();
                    (s("name"), s("value"))
                })
                .collect();
        assert_eq!(env["SINGLETON_PERIOD"], "2027-01-15T08:00:00Z");
        assert_eq!(env["SINGLETON_FENCING_TOKEN"], "8");
        assert_eq!(
            env["SINGLETON_IDEMPOTENCY_KEY"],
            naming::idempotency_key("ns/hello", period),
            "the period's key, as its earlier run had"
        );
        job["metadata"]["uid"] = "rerun-uid".into();
        respond(send, 201, serde_json::to_vec(&job).unwrap());
        let (req, send) = next(&mut handle, "the confirm").await;
        assert_eq!(req.method(), http::Method::PUT);
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        let st = &body["status"];
        assert_eq!(st["active"].as_array().unwrap().len(), 1, "{st}");
        assert_eq!(st["active"][0]["jobUid"], "rerun-uid");
        assert!(st["active"][0].get("supersedes").is_none());
        let history = st["history"].as_array().unwrap();
        assert_eq!(
            (
                &history[0]["jobName"],
                &history[0]["reason"],
                &history[0]["requestedBy"]
            ),
            (
                &"hello-1800000000-r8".into(),
                &"Rerun".into(),
                &"alice".into()
            )
        );
        assert_eq!(
            (&history[1]["jobName"], &history[1]["outcome"]),
            (&"hello-1800000000".into(), &"Replaced".into())
        );
        respond(send, 200, serde_json::to_vec(&body).unwrap());
        let (req, send) = next(&mut handle, "the resume").await;
        assert_eq!(req.method(), http::Method::PATCH);
        assert_eq!(
            req.uri().path(),
            "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000-r8"
        );
        respond(send, 200, b"{}".to_vec());
    };
    let cause = Cause::Rerun {
        replace: std::slice::from_ref(&earlier),
        supersedes: None,
        repair: false,
    };
    let db = Availability::NotConfigured;
    let (started, ()) = tokio::join!(start(&ctx, &sj, status, period, cause, &db), server);
    let claim = started.expect("started");
    assert_eq!(
        (claim.job_name.as_str(), claim.token),
        ("hello-1800000000-r8", 8)
    );
    assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
}

/// F2: a Job the API server returns not suspended (a mutating webhook cleared `spec.suspend` at
/// create) is never confirmed or resumed: the period is decided Failed/JobNotSuspended (the claim
/// cleared) with an Event, then the Job is deleted by uid with its pods (foreground).
#[tokio::test]
async fn a_job_created_running_is_deleted_and_its_period_decided() {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let ctx = Arc::new(context(kube::Client::new(svc, "ns")));
    let (sj, claim) = claimed();
    let mut claim = claim;
    claim.job_uid = None;
    let server = async {
        let (req, send) = next(&mut handle, "the create").await;
        assert_eq!(req.method(), http::Method::POST);
        let mut job: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(job["spec"]["suspend"], true, "sent suspended");
        // The webhook's doing.
        job["spec"]["suspend"] = false.into();
        job["metadata"]["uid"] = "mutated-uid".into();
        respond(send, 201, serde_json::to_vec(&job).unwrap());
        let (req, send) = next(&mut handle, "the decision").await;
        assert_eq!(
            req.method(),
            http::Method::PUT,
            "a status write, never a resume"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        let st = &body["status"];
        assert!(st.get("pendingClaim").is_none(), "{st}");
        assert_eq!(st["history"][0]["outcome"], "Failed");
        assert_eq!(st["history"][0]["reason"], "JobNotSuspended");
        respond(send, 200, serde_json::to_vec(&body).unwrap());
        let (req, send) = next(&mut handle, "the Event").await;
        assert!(req.uri().path().ends_with("/events"), "{}", req.uri());
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["reason"], "JobNotSuspended");
        respond(send, 201, serde_json::to_vec(&body).unwrap());
        // Only once the claim is decided does the Job go: deleted first, its name would be free
        // for a replica completing the still-pending claim with a second Job of the period.
        let (req, send) = next(&mut handle, "the delete").await;
        assert_eq!(req.method(), http::Method::DELETE);
        assert_eq!(
            req.uri().path(),
            "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
        );
        let body: serde_json::Value =
            serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
        assert_eq!(body["preconditions"]["uid"], "mutated-uid");
        assert_eq!(body["propagationPolicy"], "Foreground");
        respond(send, 200, serde_json::to_vec(&job).unwrap());
    };
    let (completed, ()) = tokio::join!(
        complete_claim(
            &ctx,
            &sj,
            claim,
            &Availability::NotConfigured,
            Source::OwnWrite
        ),
        server
    );
    completed.expect("decided");
}

/// The bare 422 of a refused patch (kube-apiserver 1.37 names no cause for a failed `test`).
fn bare_422() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server rejected our request due to an error in our request",
        "reason": "Invalid", "details": {}, "code": 422,
    }))
    .unwrap()
}

/// A prepared run's Job as the API server has it, marked `released`.
fn job_marked(uid: &str, released: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "hello-1", "namespace": "ns", "uid": uid,
            "annotations": {(crate::naming::ANNOTATION_RELEASED): released}},
        "spec": {"suspend": true, "template": {"spec": {"containers": []}}},
    }))
    .unwrap()
}

/// W1's patch (G1): it tests the uid and the `released: "false"` mark before marking the Job
/// withdrawn, so a resume (which tests the same mark) and a withdrawal never both pass. A bare
/// 422 is told apart by the object as it is now: a mark another replica changed is a failed
/// test; tests that still hold mean a refusal of another kind (a policy), reported as an error.
#[tokio::test]
async fn a_withdrawal_mark_tests_the_uid_and_the_mark_and_reads_a_bare_refusal() {
    for (now, want) in [
        (Some(job_marked("uid-1", "7")), "Not"),
        (Some(job_marked("uid-2", "false")), "Not"),
        (None, "Gone"),
        (Some(job_marked("uid-1", "false")), "Err"),
    ] {
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let ctx = context(kube::Client::new(svc, "ns"));
        let server = tokio::spawn(async move {
            let (req, send) = next(&mut handle, "the withdrawal mark").await;
            assert_eq!(req.method(), http::Method::PATCH);
            assert_eq!(
                req.uri().path(),
                "/apis/batch/v1/namespaces/ns/jobs/hello-1"
            );
            let kind = req.headers().get(http::header::CONTENT_TYPE).cloned();
            assert_eq!(kind.unwrap(), "application/json-patch+json");
            let ops: serde_json::Value =
                serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
            assert_eq!(
                ops,
                serde_json::json!([
                    {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
                    {"op": "test", "path": "/metadata/annotations/singleton.dev~1released", "value": "false"},
                    {"op": "replace", "path": "/metadata/annotations/singleton.dev~1released", "value": "withdrawn"},
                    {"op": "add", "path": "/metadata/annotations/singleton.dev~1withdrawn", "value": "Suspended"},
                ])
            );
            respond(send, 422, bare_422());
            let (req, send) = next(&mut handle, "the read after a bare 422").await;
            assert_eq!(req.method(), http::Method::GET);
            match now {
                Some(job) => respond(send, 200, job),
                None => respond(send, 404, br#"{"kind":"Status","code":404}"#.to_vec()),
            }
        });
        let marked = kube_io::withdraw_job(&ctx, "ns", "hello-1", "uid-1", "Suspended").await;
        let got = match marked {
            Ok(kube_io::Marked::Not) => "Not",
            Ok(kube_io::Marked::Gone) => "Gone",
            Ok(kube_io::Marked::Withdrawn) => "Withdrawn",
            Err(_) => "Err",
        };
        assert_eq!(got, want);
        server.await.unwrap();
    }
}

/// Asserts that `req` is a prepared run's resume of `hello-1800000000` (uid `job-uid`, token 7).
async fn assert_resume_prepared(req: Request<Body>) {
    assert_eq!(req.method(), http::Method::PATCH);
    assert_eq!(
        req.uri().path(),
        "/apis/batch/v1/namespaces/ns/jobs/hello-1800000000"
    );
    let body: serde_json::Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    let ops = body.as_array().cloned().unwrap_or_default();
    let has = |op: serde_json::Value| ops.contains(&op);
    assert!(
        has(serde_json::json!({"op": "replace", "path": "/spec/suspend", "value": false}))
            && has(serde_json::json!({"op": "test", "path": "/metadata/uid", "value": "job-uid"})),
        "the resume: {body}"
    );
}

/// At its instant a prepared run's reconcile sends the resume and returns: the promote's status
/// write goes on in a task of its own (`ctx.confirming`), so that in a burst the reconciles'
/// slots go to the other runs' resumes, not to status writes (issue 33: with the promote inline,
/// 1,000 prepared runs were resumed over 11.5 s). The SingletonJob is not reconciled while the
/// promote is in flight, and is asked for once it is written.
#[tokio::test]
async fn a_resumed_prepared_run_is_promoted_apart_from_the_reconcile_that_resumed_it() {
    use crate::clock::ClockState;
    use crate::observe::{OwnedJob, Release};

    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (confirming, mut done) = InFlight::new();
    let ctx = Arc::new(Context {
        confirming,
        ..context(kube::Client::new(svc, "ns"))
    });
    // claimed()'s run (token 7, its Job's uid known), prepared for its period.
    let (mut sj, mut run) = claimed();
    let period = run.period.0;
    sj.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        period - jiff::SignedDuration::from_hours(1),
    ));
    let schedule = ctx.schedule_of(&sj).unwrap();
    run.resume_at = Some(period.into());
    run.basis = Some(crate::decide::prepare::basis(&sj.spec, &schedule));
    sj.status = Some(SingletonJobStatus {
        fencing_token: 7,
        run_count: 1,
        decided_through: Some((period - jiff::SignedDuration::from_mins(1)).into()),
        schedule_fingerprint: Some(crate::decide::fingerprint(&sj.spec)),
        prepared: Some(run.clone()),
        ..Default::default()
    });
    // The freshness read was made half a second before the instant.
    ctx.fresh_reads.note("sj-uid", crate::context::asked(&sj));
    let job = OwnedJob {
        name: run.job_name.clone(),
        uid: "job-uid".into(),
        period: Some(period),
        token: Some(7),
        suspended: true,
        finished: false,
        deleting: false,
        release: Release::NotReleased,
        resume_at: Some(period),
    };
    let now = period + jiff::SignedDuration::from_secs(1);
    let (c, s) = (ctx.clone(), sj.clone());
    let reconcile = tokio::spawn(async move {
        let db = crate::backstop::Availability::NotConfigured;
        prepared::settle(&c, &s, &[job], &ClockState::agreeing(), now, &db).await
    });

    let (req, send) = next(&mut handle, "the resume").await;
    assert_resume_prepared(req).await;
    respond(send, 200, b"{}".to_vec());
    let action = tokio::time::timeout(std::time::Duration::from_secs(10), reconcile)
        .await
        .expect("the reconcile returns after the resume alone, without the promote's answer")
        .unwrap()
        .unwrap();
    assert_eq!(
        action,
        Some(kube::runtime::controller::Action::await_change())
    );
    assert!(
        ctx.confirming.contains(&sj),
        "its promote is in flight: reconciles of it wait"
    );

    // The promote's compare-and-swap (an Event for the start may come first).
    let (req, send) = loop {
        let (req, send) = next(&mut handle, "the promote").await;
        if req.uri().path().ends_with("/status") {
            break (req, send);
        }
        respond(send, 201, b"{}".to_vec());
    };
    assert_eq!(req.method(), http::Method::PUT);
    let body: serde_json::Value =
        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap()).unwrap();
    assert_eq!(body["metadata"]["resourceVersion"], "4711");
    assert!(body["status"].get("prepared").is_none(), "{body}");
    assert_eq!(body["status"]["active"][0]["token"], 7);
    respond(send, 200, serde_json::to_vec(&body).unwrap());
    assert_eq!(asked(&mut done).await, ObjectRef::from_obj(&sj));
    assert!(!ctx.confirming.contains(&sj));
}
