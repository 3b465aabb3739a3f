//! The state of a SingletonJob's active runs' Jobs, as the decision core needs it.

use std::collections::HashMap;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;

use crate::Result;
use crate::api::{RunRef, SingletonJob};
use crate::context::Context;
use crate::decide::JobState;
use crate::job;

/// The state of each active run's Job: from the cache, or from the API server when the cache does
/// not have it (it may lag behind a Job we just created, and "gone" must be a fact, not a guess).
pub async fn active_job_states(
    ctx: &Context,
    sj: &SingletonJob,
    active: &[RunRef],
) -> Result<HashMap<String, JobState>> {
    let ns = sj.namespace().unwrap_or_default();
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let mut out = HashMap::new();
    for run in active {
        let cached = ctx.jobs.get(&ObjectRef::new(&run.job_name).within(&ns));
        let state = match cached {
            Some(job) => job::state(&job),
            None => match api.get_opt(&run.job_name).await? {
                Some(job) => job::state(&job),
                None => JobState::Gone,
            },
        };
        out.insert(run.job_name.clone(), state);
    }
    Ok(out)
}
