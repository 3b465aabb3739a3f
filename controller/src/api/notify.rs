//! `spec.notify` and `status.notifications`: what happened to each period, sent where its users
//! already look (issue 37; docs/notifications.md).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{HistoryEntry, Unknown};

/// A receiver of this SingletonJob's period events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.url) != has(self.urlSecretRef)")
        .message("set exactly one of url and urlSecretRef")
)]
pub struct NotifyTarget {
    /// A name for this receiver, unique in `notify`: status and Events name it.
    #[schemars(length(min = 1, max = 63))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// What is sent: `CloudEvents` (a CloudEvents 1.0 event in structured JSON mode, type
    /// `dev.singleton.period.<event>`), `Slack` (an incoming webhook's `{"text": ...}`) or
    /// `Healthchecks` (a check-in: `<url>/start` when a run starts, `<url>` when it succeeds,
    /// `<url>/fail` when it fails, is missed or is late, `<url>/log` otherwise; the run's id as
    /// `rid`).
    #[serde(default)]
    pub format: NotifyFormat,
    /// The receiver's URL, `http://` or `https://`. Set this or `urlSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    #[x_kube(
        validation = Rule::new("isURL(self) && (self.startsWith('https://') || self.startsWith('http://'))")
            .message("url must be an absolute http:// or https:// URL")
    )]
    pub url: Option<String>,
    /// A key of a Secret in this namespace that holds the URL, for receivers whose URL is the
    /// credential (Slack webhooks, check-in URLs). Set this or `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret_ref: Option<SecretKeyRef>,
    /// A key of a Secret in this namespace whose value signs every request with HMAC-SHA256,
    /// in the headers of the Standard Webhooks specification: `webhook-id` (the event's id),
    /// `webhook-timestamp` and `webhook-signature: v1,<base64 of HMAC(id.timestamp.body)>`. A
    /// value `whsec_<base64>` is that specification's form of the key; any other value is the
    /// key's bytes as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_secret_ref: Option<SecretKeyRef>,
    /// Which events are sent. Default: Failed, Missed and Late. (Not named `on`, which YAML 1.1
    /// parsers, kubectl's among them, read as `true`.)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub events: Vec<NotifyOn>,
    /// How long a delivery is tried again, with backoff (1 s doubling to 5 min), before it is
    /// given up: then an Event `NotificationFailed`, the target's `failed` count in status and
    /// `singleton_notifications_total{result="GaveUp"}`. Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 5, max = 604800))]
    pub give_up_after_seconds: Option<i64>,
}

/// Default `giveUpAfterSeconds`.
pub const DEFAULT_GIVE_UP_AFTER_SECONDS: i64 = 3600;

impl NotifyTarget {
    /// `events`, or its default.
    pub fn wanted(&self) -> &[NotifyOn] {
        if self.events.is_empty() {
            &[NotifyOn::Failed, NotifyOn::Missed, NotifyOn::Late]
        } else {
            &self.events
        }
    }

    /// What the CRD's schema checks, for targets that do not come through the API server (the
    /// controller's defaults, `--default-notify`).
    pub fn check(&self) -> Result<(), String> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 63
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !self.name.starts_with('-')
            && !self.name.ends_with('-');
        if !name_ok {
            return Err(format!(
                "notify target name {:?}: at most 63 lower-case letters, digits and '-'",
                self.name
            ));
        }
        match (&self.url, &self.url_secret_ref) {
            (Some(_), Some(_)) | (None, None) => Err(format!(
                "notify target {}: set exactly one of url and urlSecretRef",
                self.name
            )),
            (Some(u), None) if !(u.starts_with("https://") || u.starts_with("http://")) => {
                Err(format!(
                    "notify target {}: url must be an absolute http:// or https:// URL",
                    self.name
                ))
            }
            _ => match self.give_up_after_seconds {
                Some(s) if !(5..=604_800).contains(&s) => Err(format!(
                    "notify target {}: giveUpAfterSeconds must be from 5 to 604800",
                    self.name
                )),
                _ => Ok(()),
            },
        }
    }

    /// `giveUpAfterSeconds`, or its default.
    pub fn give_up_after(&self) -> std::time::Duration {
        let s = self
            .give_up_after_seconds
            .unwrap_or(DEFAULT_GIVE_UP_AFTER_SECONDS);
        std::time::Duration::from_secs(u64::try_from(s).unwrap_or(0))
    }
}

/// A key of a Secret in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(
        pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ))]
    pub name: String,
    /// The key in its data.
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[-._a-zA-Z0-9]+$"))]
    pub key: String,
}

/// What a notification is sent as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NotifyFormat {
    #[default]
    CloudEvents,
    Slack,
    Healthchecks,
}

/// What happened to a period that a receiver can ask for.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum NotifyOn {
    /// A run's Job was created (its claim confirmed).
    Started,
    /// The run's Job completed.
    Succeeded,
    /// The run's Job failed, or was deleted before it finished.
    Failed,
    /// The period could not be started in time (deadline, superseded, claimed elsewhere...).
    Missed,
    /// The run had not succeeded by `completionDeadlineSeconds`.
    Late,
    /// The period was deliberately not run (suspension, exclusions, Forbid...).
    Skipped,
    /// The run was fenced and deleted for a newer one (concurrencyPolicy Replace).
    Replaced,
    /// The backstop already held a claim for the period, so no Job was created.
    Deduplicated,
}

impl NotifyOn {
    /// The variant's name, as in the API (and in metric labels and Event reasons).
    pub fn name(self) -> &'static str {
        match self {
            NotifyOn::Started => "Started",
            NotifyOn::Succeeded => "Succeeded",
            NotifyOn::Failed => "Failed",
            NotifyOn::Missed => "Missed",
            NotifyOn::Late => "Late",
            NotifyOn::Skipped => "Skipped",
            NotifyOn::Replaced => "Replaced",
            NotifyOn::Deduplicated => "Deduplicated",
        }
    }
}

/// How this SingletonJob's notifications fare.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Notifications {
    /// Events recorded and not yet delivered to (or given up by) every target they are for,
    /// oldest first. Written in the same status write that records the period, so a failover
    /// loses none: the next leader sends them. At most 100 are kept (the oldest go first,
    /// counted in `dropped`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub pending: Vec<PendingNotification>,
    /// Per target, how its deliveries went.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<NotifyTargetStatus>,
    /// Events dropped unsent because more than 100 were pending.
    #[serde(default, skip_serializing_if = "super::is_default")]
    #[schemars(schema_with = "super::counter_schema")]
    pub dropped: u64,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

impl Notifications {
    pub fn is_empty(&self) -> bool {
        *self == Notifications::default()
    }
}

/// An event waiting to be delivered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingNotification {
    /// The event's id (CloudEvents `id`, `webhook-id`): the same for every try, so a receiver
    /// drops a repeat by it. Derived from the job, the period, the event and the run's token.
    pub id: String,
    /// What happened.
    pub event: NotifyOn,
    /// When it was recorded.
    pub recorded: Time,
    /// The targets (by name) still to deliver it to.
    pub targets: Vec<String>,
    /// Pods the run's Job had started when it was recorded, if it had a Job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// The period's history entry as recorded.
    pub entry: HistoryEntry,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

/// How deliveries to one target went.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyTargetStatus {
    /// The target's name in `spec.notify`.
    pub name: String,
    /// Events it accepted (a 2xx answer).
    #[serde(default, skip_serializing_if = "super::is_default")]
    #[schemars(schema_with = "super::counter_schema")]
    pub delivered: u64,
    /// Events given up after `giveUpAfterSeconds` of failed tries.
    #[serde(default, skip_serializing_if = "super::is_default")]
    #[schemars(schema_with = "super::counter_schema")]
    pub failed: u64,
    /// When it last accepted one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_delivered: Option<Time>,
    /// When a try last failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Time>,
    /// Why a try last failed (the answer's status, a connection error, a missing Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Fields of a newer release, kept as read so that this one's writes never drop them.
    #[serde(flatten)]
    #[schemars(skip)]
    pub unknown: Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: Option<&str>, secret: bool) -> NotifyTarget {
        NotifyTarget {
            name: "ops".into(),
            url: url.map(String::from),
            url_secret_ref: secret.then(|| SecretKeyRef {
                name: "s".into(),
                key: "url".into(),
            }),
            ..Default::default()
        }
    }

    /// The checks of the controller's defaults say what the CRD's rules say.
    #[test]
    fn a_default_target_is_checked_as_the_crd_checks_spec_notify() {
        assert!(target(Some("https://x.example/"), false).check().is_ok());
        assert!(target(None, true).check().is_ok());
        let err = |t: NotifyTarget| t.check().unwrap_err();
        assert!(err(target(Some("ftp://x/"), false)).contains("absolute http://"));
        assert!(err(target(Some("https://x/"), true)).contains("exactly one of url"));
        assert!(err(target(None, false)).contains("exactly one of url"));
        let mut t = target(Some("http://x/"), false);
        t.name = "Ops".into();
        assert!(err(t).contains("lower-case"));
        let mut t = target(Some("http://x/"), false);
        t.give_up_after_seconds = Some(1);
        assert!(err(t).contains("giveUpAfterSeconds"));
    }

    #[test]
    fn unset_events_are_failed_missed_and_late() {
        let t = target(Some("http://x/"), false);
        assert_eq!(
            t.wanted(),
            &[NotifyOn::Failed, NotifyOn::Missed, NotifyOn::Late]
        );
    }
}
