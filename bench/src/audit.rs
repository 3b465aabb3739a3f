//! The API server's audit log (bench/audit-policy.yaml): one JSON line per request of the users
//! compared, written at ResponseComplete with microsecond timestamps.
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use jiff::Timestamp;

/// The controller under test (its client certificate's CN, minted by hack/bench.sh).
pub const SINGLETON_USER: &str = "singleton-bench-controller";
/// kube-controller-manager's CronJob controller (--use-service-account-credentials).
pub const CRONJOB_USER: &str = "system:serviceaccount:kube-system:cronjob-controller";

#[derive(Clone, Debug)]
pub struct Request {
    pub user: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    /// A dry run (the controller validates a new jobTemplate by one): nothing was created.
    pub dry_run: bool,
    /// When the response was complete: for a create, the instant the object exists.
    pub done: Timestamp,
    /// Whether the request's body sets `spec.suspend: false`; `None` when the log has no body
    /// (bench/audit-policy.yaml logs it for the controller's Job patches only).
    pub unsuspends: Option<bool>,
}

pub struct Audit {
    path: PathBuf,
}

impl Audit {
    pub fn new(path: PathBuf) -> Self {
        Audit { path }
    }

    /// The log's current end: requests after this point are read by [`Audit::since`].
    pub fn mark(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Every complete line written after `offset`.
    pub fn since(&self, offset: u64) -> anyhow::Result<Vec<Request>> {
        let mut offset = offset;
        self.read_on(&mut offset)
    }

    /// The complete lines written after `offset`, which moves past them: a poll reads each line
    /// once (re-parsing the whole log at every poll took CPU from the system under test).
    pub fn read_on(&self, offset: &mut u64) -> anyhow::Result<Vec<Request>> {
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(*offset))?;
        let mut buf = String::new();
        f.read_to_string(&mut buf)?;
        let complete = buf.rfind('\n').map_or("", |i| &buf[..=i]);
        *offset += complete.len() as u64;
        Ok(complete.lines().filter_map(parse).collect())
    }
}

fn parse(line: &str) -> Option<Request> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let s = |p: &str| {
        v.pointer(p)
            .and_then(|x| x.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some(Request {
        user: s("/user/username"),
        verb: s("/verb"),
        resource: s("/objectRef/resource"),
        subresource: s("/objectRef/subresource"),
        namespace: s("/objectRef/namespace"),
        name: s("/objectRef/name"),
        code: v
            .pointer("/responseStatus/code")
            .and_then(|c| c.as_u64())
            .unwrap_or(0) as u16,
        dry_run: s("/requestURI").contains("dryRun="),
        done: s("/stageTimestamp").parse().ok()?,
        unsuspends: v.get("requestObject").map(unsuspends),
    })
}

/// Whether a request body clears `spec.suspend`: a JSON patch's `replace` or `add` of
/// `/spec/suspend` with `false` (the controller's resume), or a merge patch or object with it.
fn unsuspends(body: &serde_json::Value) -> bool {
    match body.as_array() {
        Some(ops) => ops.iter().any(|op| {
            matches!(op["op"].as_str(), Some("replace" | "add"))
                && op["path"] == "/spec/suspend"
                && op["value"] == false
        }),
        None => body.pointer("/spec/suspend") == Some(&serde_json::Value::Bool(false)),
    }
}

/// When each Job of `ns` that `user` made was allowed to run: (name, instant). The controller
/// under test creates its Jobs suspended and resumes the one its confirmed claim names (a patch
/// clearing `spec.suspend`; a prepared run's Job exists up to its lead before that), so for it
/// that is the resume; CronJob's Jobs may run from their create. The first per name.
pub fn job_starts<'a>(
    reqs: &'a [Request],
    user: &'a str,
    ns: &'a str,
) -> impl Iterator<Item = (&'a str, Timestamp)> + 'a {
    reqs.iter()
        .filter(move |r| starts_job(r, user, ns))
        .map(|r| (r.name.as_str(), r.done))
}

/// Whether `r` is the request that let one of `ns`'s Jobs run ([`job_starts`]). A patch of the
/// controller's that leaves the Job suspended (a withdrawal's mark) is not one; without its body
/// in the log (an older audit policy) any patch that succeeded counts, as before.
fn starts_job(r: &Request, user: &str, ns: &str) -> bool {
    let (verb, code) = if user == SINGLETON_USER {
        ("patch", 200)
    } else {
        ("create", 201)
    };
    r.user == user
        && r.verb == verb
        && r.resource == "jobs"
        && r.subresource.is_empty()
        && r.code == code
        && !r.dry_run
        && r.namespace == ns
        && r.unsuspends != Some(false)
}

/// How many Jobs `user` created in `ns` before `at`: for the controller, the runs prepared ahead
/// of their instant (a run not prepared in time creates its Job after it).
pub fn created_before(reqs: &[Request], user: &str, ns: &str, at: Timestamp) -> usize {
    reqs.iter()
        .filter(|r| {
            r.user == user
                && r.verb == "create"
                && r.resource == "jobs"
                && r.subresource.is_empty()
                && r.code == 201
                && !r.dry_run
                && r.namespace == ns
                && r.done < at
        })
        .count()
}

/// A burst's requests on either side of its instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Requests done before the instant (a prepared run's claim, create and confirm).
    pub before: usize,
    /// Requests done at or after it.
    pub after: usize,
    /// Of those before, Jobs' starts ([`job_starts`]): a start before the instant is early.
    pub starts_before: usize,
    /// Of those after, Jobs' starts (for the controller, the resumes).
    pub starts_after: usize,
}

impl Split {
    /// The share of the requests done before the instant (0 to 1), `None` without requests.
    pub fn share_before(&self) -> Option<f64> {
        let all = self.before + self.after;
        (all > 0).then(|| self.before as f64 / all as f64)
    }

    /// The share of the starts among the requests done after the instant.
    pub fn start_share_after(&self) -> Option<f64> {
        (self.after > 0).then(|| self.starts_after as f64 / self.after as f64)
    }
}

/// The requests `user` completed within [from, to) (watches left out, as in [`count`]), split at
/// the instant `at`, with the starts of `ns`'s Jobs among them.
pub fn split(
    reqs: &[Request],
    user: &str,
    ns: &str,
    (from, at, to): (Timestamp, Timestamp, Timestamp),
) -> Split {
    let mut s = Split::default();
    for r in reqs
        .iter()
        .filter(|r| r.user == user && r.verb != "watch" && r.done >= from && r.done < to)
    {
        let start = usize::from(starts_job(r, user, ns));
        if r.done < at {
            s.before += 1;
            s.starts_before += start;
        } else {
            s.after += 1;
            s.starts_after += start;
        }
    }
    s
}

/// Requests by `user` completed within [from, to), without the long-running watches, whose
/// number says nothing about load (each is one request open for minutes).
pub fn count(reqs: &[Request], user: &str, from: Timestamp, to: Timestamp) -> usize {
    reqs.iter()
        .filter(|r| r.user == user && r.verb != "watch" && r.done >= from && r.done < to)
        .count()
}

/// The same requests by verb and resource, most frequent first (for results.json).
pub fn breakdown(
    reqs: &[Request],
    user: &str,
    from: Timestamp,
    to: Timestamp,
) -> Vec<(String, usize)> {
    let mut m = std::collections::BTreeMap::<String, usize>::new();
    for r in reqs
        .iter()
        .filter(|r| r.user == user && r.done >= from && r.done < to)
    {
        let res = if r.subresource.is_empty() {
            r.resource.clone()
        } else {
            format!("{}/{}", r.resource, r.subresource)
        };
        *m.entry(format!("{} {res}", r.verb)).or_default() += 1;
    }
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by_key(|b| std::cmp::Reverse(b.1));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn line(name: &str) -> String {
        format!(
            r#"{{"user":{{"username":"u"}},"verb":"create","objectRef":{{"resource":"jobs","namespace":"ns","name":"{name}"}},"responseStatus":{{"code":201}},"requestURI":"/apis/batch/v1/namespaces/ns/jobs","stageTimestamp":"2026-12-03T10:00:00.000001Z"}}"#
        )
    }

    fn req(verb: &str, code: u16, done: &str, unsuspends: Option<bool>) -> Request {
        Request {
            user: SINGLETON_USER.into(),
            verb: verb.into(),
            resource: "jobs".into(),
            subresource: String::new(),
            namespace: "ns".into(),
            name: "j-1".into(),
            code,
            dry_run: false,
            done: done.parse().unwrap(),
            unsuspends,
        }
    }

    #[test]
    fn a_job_starts_at_its_resume_not_at_a_withdrawal_mark() {
        let resume = json_line(
            r#"[{"op":"test","path":"/spec/suspend","value":true},{"op":"replace","path":"/spec/suspend","value":false}]"#,
        );
        let withdraw = json_line(
            r#"[{"op":"replace","path":"/metadata/annotations/singleton.dev~1released","value":"withdrawn"}]"#,
        );
        assert_eq!(parse(&resume).unwrap().unsuspends, Some(true));
        assert_eq!(parse(&withdraw).unwrap().unsuspends, Some(false));
        let reqs = [
            // The prepared Job's create, long before the instant: not a start.
            req("create", 201, "2026-12-03T10:00:00Z", None),
            req("patch", 200, "2026-12-03T10:00:10Z", Some(false)),
            req("patch", 200, "2026-12-03T10:00:30.005Z", Some(true)),
        ];
        let starts: Vec<_> = job_starts(&reqs, SINGLETON_USER, "ns").collect();
        assert_eq!(
            starts,
            [("j-1", "2026-12-03T10:00:30.005Z".parse().unwrap())]
        );
        // A log without bodies (an older policy): any patch that succeeded, as before.
        let old = [req("patch", 200, "2026-12-03T10:00:10Z", None)];
        assert_eq!(job_starts(&old, SINGLETON_USER, "ns").count(), 1);
    }

    fn json_line(patch: &str) -> String {
        format!(
            r#"{{"user":{{"username":"u"}},"verb":"patch","objectRef":{{"resource":"jobs","namespace":"ns","name":"j"}},"responseStatus":{{"code":200}},"requestObject":{patch},"stageTimestamp":"2026-12-03T10:00:00.000001Z"}}"#
        )
    }

    #[test]
    fn requests_split_at_the_instant() {
        let at: Timestamp = "2026-12-03T10:00:30Z".parse().unwrap();
        let from = at - jiff::SignedDuration::from_secs(32);
        let to = at + jiff::SignedDuration::from_secs(5);
        let mut watch = req("watch", 200, "2026-12-03T10:00:20Z", None);
        watch.resource = "singletonjobs".into();
        let reqs = [
            req("create", 201, "2026-12-03T09:59:00Z", None), // before the window
            req("create", 201, "2026-12-03T10:00:01Z", None),
            req("update", 200, "2026-12-03T10:00:02Z", None),
            watch,
            req("patch", 200, "2026-12-03T10:00:30.004Z", Some(true)),
            req("update", 200, "2026-12-03T10:00:30.010Z", None),
            req("create", 201, "2026-12-03T10:00:40Z", None), // after the window
        ];
        let s = split(&reqs, SINGLETON_USER, "ns", (from, at, to));
        let want = Split {
            before: 2,
            after: 2,
            starts_before: 0,
            starts_after: 1,
        };
        assert_eq!(s, want);
        assert_eq!(s.share_before(), Some(0.5));
        assert_eq!(s.start_share_after(), Some(0.5));
        assert_eq!(Split::default().share_before(), None);
        // Prepared in time: the Jobs created before the instant.
        assert_eq!(created_before(&reqs, SINGLETON_USER, "ns", at), 2);
    }

    #[test]
    fn polls_read_each_complete_line_once() {
        let path = std::env::temp_dir().join(format!("audit-{}.log", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        let audit = Audit::new(path.clone());
        write!(f, "{}\n{}", line("a"), &line("b")[..20]).unwrap();
        let mut offset = 0;
        let names = |reqs: Vec<Request>| reqs.into_iter().map(|r| r.name).collect::<Vec<_>>();
        // The line still being written is left for the next poll.
        assert_eq!(names(audit.read_on(&mut offset).unwrap()), ["a"]);
        write!(f, "{}\n{}\n", &line("b")[20..], line("c")).unwrap();
        assert_eq!(names(audit.read_on(&mut offset).unwrap()), ["b", "c"]);
        assert!(audit.read_on(&mut offset).unwrap().is_empty());
        assert_eq!(names(audit.since(0).unwrap()), ["a", "b", "c"]);
        std::fs::remove_file(path).unwrap();
    }
}
