//! Talking to the cluster: the client the kubeconfig selects, reading SingletonJobs (telling a
//! missing object from a missing CRD), suspending and resuming them, and errors that say what to
//! do.

use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};

use std::collections::HashMap;

use super::error::PluginError;
use crate::api::{DayRules, SingletonCalendar, SingletonJob, Suspension};
use crate::watch_decode::Listed;

/// The cluster the kubeconfig selects: a client, and the namespace its context names.
pub struct Cluster {
    pub client: Client,
    /// The context's namespace (`default` if it names none).
    pub default_namespace: String,
    /// ` at <URL>`, for the error that says the API server cannot be reached.
    server: String,
}

impl Cluster {
    /// From KUBECONFIG / ~/.kube/config / in-cluster, as kubectl does.
    pub async fn infer() -> Result<Cluster, PluginError> {
        let config = kube::Config::infer()
            .await
            .map_err(|e| PluginError::NoConfig(e.to_string()))?;
        let server = format!(" at {}", config.cluster_url);
        let default_namespace = config.default_namespace.clone();
        let client = Client::try_from(config).map_err(|e| PluginError::NoConfig(e.to_string()))?;
        Ok(Cluster {
            client,
            default_namespace,
            server,
        })
    }

    /// A failed request as the user should read it: which verb RBAC refused and where, or an
    /// API server that cannot be reached; anything else as the API said it.
    pub(super) fn api_error(&self, e: kube::Error, verb: &str, ns: Option<&str>) -> PluginError {
        match e {
            kube::Error::Api(s) if s.code == 403 => PluginError::Forbidden {
                verb: verb.into(),
                scope: match ns {
                    Some(ns) => format!(" in namespace {ns}"),
                    None => " in all namespaces".into(),
                },
                message: s.message.clone(),
            },
            e @ (kube::Error::HyperError(_) | kube::Error::Service(_)) => {
                PluginError::Unreachable {
                    server: self.server.clone(),
                    detail: error_chain(&e),
                }
            }
            e => PluginError::Kube(e),
        }
    }

    /// Whether the SingletonJob resource is served (a list in `ns` is not a 404).
    async fn crd_installed(&self, ns: &str) -> Result<bool, PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(self.api_error(e, "list", Some(ns))),
        }
    }

    /// One SingletonJob, or an error that tells a missing object from a missing CRD.
    pub async fn get(&self, ns: &str, name: &str) -> Result<SingletonJob, PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        match api.get(name).await {
            Ok(sj) => Ok(sj),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if self.crd_installed(ns).await? {
                    Err(PluginError::NotFound {
                        namespace: ns.into(),
                        name: name.into(),
                    })
                } else {
                    Err(PluginError::CrdMissing)
                }
            }
            Err(e) => Err(self.api_error(e, "get", Some(ns))),
        }
    }

    /// The rules of the named SingletonCalendars of `ns` that exist, by name.
    pub async fn calendars(
        &self,
        ns: &str,
        names: &[String],
    ) -> Result<HashMap<String, DayRules>, PluginError> {
        let api: Api<SingletonCalendar> = Api::namespaced(self.client.clone(), ns);
        let mut found = HashMap::new();
        for name in names {
            match api.get_opt(name).await {
                Ok(Some(cal)) => {
                    found.insert(name.clone(), cal.spec.rules);
                }
                Ok(None) => {}
                Err(e) => return Err(self.api_error(e, "get", Some(ns))),
            }
        }
        Ok(found)
    }

    /// SingletonJobs of `ns`, or of all namespaces when `None`, sorted by namespace and name.
    /// Decoded one by one as the controller does ([`crate::watch_decode`]): one that does not
    /// decode is listed as its stand-in rather than failing the whole list.
    pub async fn list(&self, ns: Option<&str>) -> Result<Vec<SingletonJob>, PluginError> {
        let api: Api<Listed> = match ns {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut items: Vec<SingletonJob> = match api.list(&ListParams::default()).await {
            Ok(l) => l.items.into_iter().map(|l| l.0).collect(),
            Err(kube::Error::Api(s)) if s.code == 404 => return Err(PluginError::CrdMissing),
            Err(e) => return Err(self.api_error(e, "list", ns)),
        };
        items.sort_by_key(|s| (s.namespace().unwrap_or_default(), s.name_any()));
        Ok(items)
    }

    /// Sets `spec.suspend` by a merge patch; returns what changed, for the user.
    pub async fn set_suspend(
        &self,
        ns: &str,
        name: &str,
        suspend: bool,
    ) -> Result<String, PluginError> {
        let before = self.get(ns, name).await?;
        let was = before.spec.suspend.unwrap_or(false);
        let verb = if suspend { "suspended" } else { "resumed" };
        if was == suspend {
            return Ok(format!(
                "singletonjob {ns}/{name} already {verb} (spec.suspend is {suspend})\n"
            ));
        }
        // Resuming ends a suspension's record too (the API server refuses one without suspend).
        let patch = match suspend {
            true => serde_json::json!({"spec": {"suspend": true}}),
            false => serde_json::json!({"spec": {"suspend": false, "suspension": null}}),
        };
        self.patch_spec(ns, name, &patch).await?;
        Ok(format!(
            "singletonjob {ns}/{name} {verb} (spec.suspend: {was} -> {suspend})\n"
        ))
    }

    /// Suspends with `spec.suspension`: why, by whom (as the API server names us) and until when,
    /// replacing an earlier suspension's. An end that is not in the future is a usage error,
    /// found before the cluster is asked anything.
    pub async fn suspend_until(
        &self,
        ns: &str,
        name: &str,
        until: Option<Timestamp>,
        reason: Option<String>,
        now: Timestamp,
    ) -> Result<String, PluginError> {
        if let Some(u) = until.filter(|u| *u <= now) {
            return Err(PluginError::Usage(format!(
                "--until {u} is not in the future (now {now}): a suspension must end later than it starts"
            )));
        }
        if until.is_none() && reason.is_none() {
            return self.set_suspend(ns, name, true).await;
        }
        self.get(ns, name).await?;
        let suspension = Suspension {
            until: until.map(Time),
            reason,
            by: self.whoami().await,
            since: Some(Time(now)),
        };
        // Every field named (null when unsaid), so an earlier suspension's are replaced.
        let patch = serde_json::json!({"spec": {"suspend": true, "suspension": {
            "until": suspension.until,
            "reason": suspension.reason,
            "by": suspension.by,
            "since": suspension.since,
        }}});
        self.patch_spec(ns, name, &patch).await?;
        let ends = match until {
            Some(u) => format!(
                "; periods before {} are Skipped, and it resumes by itself then",
                crate::naming::period_rfc3339(u)
            ),
            None => String::new(),
        };
        Ok(format!(
            "singletonjob {ns}/{name} suspended ({}){ends}\n",
            suspension.note()
        ))
    }

    /// A merge patch of a SingletonJob, its errors said for the user.
    async fn patch_spec(
        &self,
        ns: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<(), PluginError> {
        let api: Api<SingletonJob> = Api::namespaced(self.client.clone(), ns);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Err(PluginError::NotFound {
                namespace: ns.into(),
                name: name.into(),
            }),
            Err(e) => Err(self.api_error(e, "patch", Some(ns))),
        }
    }

    /// The authenticated user name, as the API server sees us (a SelfSubjectReview), for the
    /// request's record. None if the cluster does not answer it.
    pub async fn whoami(&self) -> Option<String> {
        let api: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = api
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .ok()?;
        review.status?.user_info?.username
    }
}

/// An error and its sources, outermost first ("client error (Connect): Connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        cur = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client against a fake API server that answers every request with `reply(method, path)`.
    fn fake(reply: fn(&http::Method, &str) -> (u16, String)) -> Cluster {
        use http::{Request, Response};
        use kube::client::Body;
        let server = tower::service_fn(move |req: Request<Body>| async move {
            let (code, body) = reply(req.method(), req.uri().path());
            Ok::<_, kube::Error>(
                Response::builder()
                    .status(code)
                    .body(Body::from(body.into_bytes()))
                    .unwrap(),
            )
        });
        Cluster {
            client: Client::new(server, "default"),
            default_namespace: "default".into(),
            server: " at https://fake".into(),
        }
    }

    fn status_body(code: u16, reason: &str) -> String {
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "message": format!("{reason} by the fake"), "code": code})
        .to_string()
    }

    const EMPTY_LIST: &str = r#"{"apiVersion":"singleton.dev/v1alpha1","kind":"SingletonJobList","metadata":{},"items":[]}"#;

    #[tokio::test]
    async fn a_missing_object_is_told_from_a_missing_crd() {
        // The resource is served, the object is not there.
        let cluster = fake(|m, path| match (m, path) {
            (&http::Method::GET, "/apis/singleton.dev/v1alpha1/namespaces/ns/singletonjobs") => {
                (200, EMPTY_LIST.into())
            }
            _ => (404, status_body(404, "NotFound")),
        });
        let e = cluster.get("ns", "x").await.unwrap_err();
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");
        let e = cluster.set_suspend("ns", "x", true).await.unwrap_err();
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");

        // The API server does not know the resource at all (its plain-text 404).
        let cluster = fake(|_, _| (404, "404 page not found\n".into()));
        for e in [
            cluster.get("ns", "x").await.unwrap_err(),
            cluster.list(Some("ns")).await.unwrap_err(),
            cluster.list(None).await.unwrap_err(),
        ] {
            assert!(matches!(e, PluginError::CrdMissing), "{e:?}");
        }
    }

    #[tokio::test]
    async fn forbidden_names_the_verb_and_scope() {
        let cluster = fake(|_, _| (403, status_body(403, "Forbidden")));
        let e = cluster.list(None).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "forbidden: you may not list singletonjobs.singleton.dev in all namespaces: Forbidden by the fake"
        );
        let e = cluster.get("ns", "x").await.unwrap_err();
        assert!(
            e.to_string().starts_with(
                "forbidden: you may not get singletonjobs.singleton.dev in namespace ns"
            ),
            "{e}"
        );
        // Reading is allowed, patching is not.
        let cluster = fake(|m, _| match *m {
            http::Method::PATCH => (403, status_body(403, "Forbidden")),
            _ => (
                200,
                serde_json::json!({"apiVersion": "singleton.dev/v1alpha1", "kind": "SingletonJob",
                    "metadata": {"name": "x", "namespace": "ns"},
                    "spec": {"schedule": "@daily", "jobTemplate": {}}})
                .to_string(),
            ),
        });
        let e = cluster.set_suspend("ns", "x", true).await.unwrap_err();
        assert!(
            e.to_string().starts_with(
                "forbidden: you may not patch singletonjobs.singleton.dev in namespace ns"
            ),
            "{e}"
        );
        // Already in the wanted state: nothing is patched.
        let msg = cluster.set_suspend("ns", "x", false).await.unwrap();
        assert_eq!(
            msg,
            "singletonjob ns/x already resumed (spec.suspend is false)\n"
        );
    }
}
