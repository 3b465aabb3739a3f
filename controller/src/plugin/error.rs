//! What can go wrong in a plugin command; each message says what to do about it.

/// The resource as kubectl and RBAC name it.
const RESOURCE: &str = "singletonjobs.singleton.dev";

/// What can go wrong in a plugin command; each message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("SingletonJob {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("the SingletonJob CRD is not installed: kubectl apply -f crds/")]
    CrdMissing,
    #[error("forbidden: you may not {verb} {RESOURCE}{scope}: {message}")]
    Forbidden {
        verb: String,
        scope: String,
        message: String,
    },
    #[error(
        "cannot reach the Kubernetes API server{server}: {detail}; check KUBECONFIG (or ~/.kube/config) and that the cluster runs"
    )]
    Unreachable { server: String, detail: String },
    #[error(
        "cannot load a kubeconfig: {0}; set KUBECONFIG to a kubeconfig file (or create ~/.kube/config)"
    )]
    NoConfig(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    #[error("encoding output: {0}")]
    Encode(String),
    /// A request of the same kind is not finished; overwriting it would lose it.
    #[error("{0}")]
    Busy(String),
    /// Nobody acted on the request in time.
    #[error("{0}")]
    NoController(String),
    #[error("{command} rejected by the controller: {message}")]
    Rejected {
        command: &'static str,
        message: String,
    },
    #[error("{0}")]
    Usage(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_say_what_to_do() {
        let e = PluginError::NotFound {
            namespace: "ns".into(),
            name: "x".into(),
        };
        assert_eq!(e.to_string(), "SingletonJob ns/x not found");
        assert_eq!(
            PluginError::CrdMissing.to_string(),
            "the SingletonJob CRD is not installed: kubectl apply -f crds/"
        );
        let e = PluginError::Forbidden {
            verb: "patch".into(),
            scope: " in namespace ns".into(),
            message: "no".into(),
        };
        assert_eq!(
            e.to_string(),
            "forbidden: you may not patch singletonjobs.singleton.dev in namespace ns: no"
        );
    }
}
