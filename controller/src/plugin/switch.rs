//! `kubectl singleton convert cronjob/NAME --apply`: the switch from a CronJob to its
//! SingletonJob, in an order that neither drops nor doubles a period, safe to repeat.
//!
//! 1. Validate the SingletonJob with a server-side dry run, so that nothing is suspended for an
//!    object the API server would refuse.
//! 2. Wait, if needed, until the CronJob's next period is at least [`MARGIN`] away (after one
//!    that is about to fall due has passed), so that steps 3 and 4 both happen between two
//!    periods: the CronJob has started every period before them, and none after.
//! 3. Suspend the CronJob: it starts nothing more.
//! 4. Create the SingletonJob: a new SingletonJob decides periods from its creation on, so the
//!    next period is its first. If the create fails, the CronJob is resumed.
//!
//! A repeated `--apply` finds the SingletonJob it made (by [`ANNOTATION_CONVERTED_FROM`]) and only
//! makes sure the CronJob is suspended.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::batch::v1::CronJob;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};

use super::client::Cluster;
use super::convert::{ANNOTATION_CONVERTED_FROM, Conversion};
use super::error::PluginError;
use crate::api::SingletonJob;
use crate::schedule::Schedule;

/// How far away the next period must be when the switch starts: its two writes take
/// milliseconds; the rest is room for a slow API server and the CronJob controller's own lag.
pub const MARGIN: SignedDuration = SignedDuration::from_secs(15);

/// What the switch found and did, for the user.
#[derive(Debug, PartialEq)]
pub enum Switched {
    /// The SingletonJob was created and the CronJob suspended; `first` is the SingletonJob's
    /// first period.
    Done { first: Option<Timestamp> },
    /// An earlier `--apply` had created the SingletonJob; the CronJob is now suspended.
    AlreadyDone { suspended_now: bool },
}

impl Cluster {
    /// Reads the CronJob `ns/name`, with an error that names it when it does not exist.
    pub async fn get_cronjob(&self, ns: &str, name: &str) -> Result<CronJob, PluginError> {
        let api: Api<CronJob> = Api::namespaced(self.client.clone(), ns);
        match api.get(name).await {
            Ok(cj) => Ok(cj),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Err(PluginError::Usage(format!("cronjob {ns}/{name} not found")))
            }
            Err(e) => Err(self.api_error(e, "get cronjobs", Some(ns))),
        }
    }

    /// Carries out the switch; see the module docs for the order of its steps.
    pub async fn switch(
        &self,
        cronjob: &CronJob,
        conversion: &Conversion,
    ) -> Result<Switched, PluginError> {
        let ns = cronjob.namespace().unwrap_or_default();
        let name = cronjob.name_any();
        let mut sj = conversion.singleton_job.clone();
        let marker = format!("cronjob/{name}");
        sj.annotations_mut()
            .insert(ANNOTATION_CONVERTED_FROM.into(), marker.clone());
        let sjs: Api<SingletonJob> = Api::namespaced(self.client.clone(), &ns);
        if let Some(existing) = sjs
            .get_opt(&name)
            .await
            .map_err(|e| self.api_error(e, "get", Some(&ns)))?
        {
            return self
                .finish_earlier_switch(cronjob, &existing, &marker)
                .await;
        }
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        sjs.create(&dry_run, &sj)
            .await
            .map_err(|e| self.api_error(e, "create", Some(&ns)))?;
        let schedule = Schedule::parse(
            &sj.spec.schedule,
            sj.spec.time_zone.as_deref(),
            sj.spec.dst_policy,
        )
        .map_err(|e| PluginError::Usage(e.to_string()))?;
        let suspended = cronjob.spec.as_ref().and_then(|s| s.suspend) == Some(true);
        if !suspended {
            wait_for_room(&schedule, Timestamp::now).await;
            self.set_cronjob_suspend(&ns, &name, true).await?;
        }
        if let Err(e) = sjs.create(&PostParams::default(), &sj).await {
            if !suspended {
                self.set_cronjob_suspend(&ns, &name, false).await?;
            }
            return Err(self.api_error(e, "create", Some(&ns)));
        }
        let first = (!suspended)
            .then(|| schedule.next_after(Timestamp::now()))
            .flatten();
        Ok(Switched::Done { first })
    }

    /// A SingletonJob of the CronJob's name exists: if an earlier `--apply` made it, make sure
    /// the CronJob is suspended; otherwise refuse, since it is not ours to take over.
    async fn finish_earlier_switch(
        &self,
        cronjob: &CronJob,
        existing: &SingletonJob,
        marker: &str,
    ) -> Result<Switched, PluginError> {
        let ns = cronjob.namespace().unwrap_or_default();
        let name = cronjob.name_any();
        if existing
            .annotations()
            .get(ANNOTATION_CONVERTED_FROM)
            .map(String::as_str)
            != Some(marker)
        {
            return Err(PluginError::Usage(format!(
                "singletonjob {ns}/{name} already exists and was not made by convert --apply from \
                 cronjob {ns}/{name}; delete it or convert under another name"
            )));
        }
        let suspended = cronjob.spec.as_ref().and_then(|s| s.suspend) == Some(true);
        if !suspended {
            self.set_cronjob_suspend(&ns, &name, true).await?;
        }
        Ok(Switched::AlreadyDone {
            suspended_now: !suspended,
        })
    }

    async fn set_cronjob_suspend(
        &self,
        ns: &str,
        name: &str,
        suspend: bool,
    ) -> Result<(), PluginError> {
        let api: Api<CronJob> = Api::namespaced(self.client.clone(), ns);
        let patch = serde_json::json!({"spec": {"suspend": suspend}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| self.api_error(e, "patch cronjobs", Some(ns)))
    }
}

/// Sleeps until the schedule's next period is at least [`MARGIN`] away: past one that is closer.
/// `now` is the clock (injected, so the test can run on tokio's paused time).
async fn wait_for_room(schedule: &Schedule, now: impl Fn() -> Timestamp) {
    loop {
        let now = now();
        let Some(next) = schedule.next_after(now) else {
            return;
        };
        let until = next.duration_since(now);
        if until >= MARGIN {
            return;
        }
        // Past the close period, with a second for the CronJob controller to start it.
        let wait = until + SignedDuration::from_secs(1);
        tokio::time::sleep(Duration::try_from(wait).unwrap_or(Duration::from_secs(1))).await;
    }
}

/// The line the command prints after a switch.
pub fn describe(switched: &Switched, ns: &str, name: &str) -> String {
    match switched {
        Switched::Done { first: Some(first) } => format!(
            "cronjob {ns}/{name} suspended; singletonjob {ns}/{name} created, its first period \
             {first}\n"
        ),
        Switched::Done { first: None } => format!(
            "singletonjob {ns}/{name} created from the suspended cronjob {ns}/{name} (suspended \
             too; resume it with kubectl singleton resume {name} -n {ns})\n"
        ),
        Switched::AlreadyDone {
            suspended_now: true,
        } => format!(
            "singletonjob {ns}/{name} was already created by convert --apply; cronjob {ns}/{name} \
             suspended now\n"
        ),
        Switched::AlreadyDone {
            suspended_now: false,
        } => format!(
            "already converted: singletonjob {ns}/{name} exists and cronjob {ns}/{name} is \
             suspended\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::DstPolicy;

    /// A clock that starts at `at` and runs with tokio's (paused) time.
    fn clock_from(at: &str) -> impl Fn() -> Timestamp {
        let base: Timestamp = at.parse().unwrap();
        let started = tokio::time::Instant::now();
        move || base + SignedDuration::try_from(started.elapsed()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_switch_waits_only_when_a_period_is_close() {
        let every_minute = Schedule::parse("* * * * *", None, DstPolicy::default()).unwrap();
        // 30 s before the next period: room enough, no wait.
        let started = tokio::time::Instant::now();
        wait_for_room(&every_minute, clock_from("2027-01-01T00:00:30Z")).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
        // 10 s before it: wait until it has passed (and a second more), then the next is 59 s away.
        let started = tokio::time::Instant::now();
        wait_for_room(&every_minute, clock_from("2027-01-01T00:00:50Z")).await;
        assert_eq!(started.elapsed(), Duration::from_secs(11));
    }

    #[test]
    fn what_the_switch_did_is_said_plainly() {
        let first: Timestamp = "2027-01-01T00:01:00Z".parse().unwrap();
        let done = describe(&Switched::Done { first: Some(first) }, "ns", "n");
        assert!(
            done.contains("suspended") && done.contains("2027-01-01T00:01:00Z"),
            "{done}"
        );
        let again = describe(
            &Switched::AlreadyDone {
                suspended_now: false,
            },
            "ns",
            "n",
        );
        assert!(again.starts_with("already converted"), "{again}");
    }
}
