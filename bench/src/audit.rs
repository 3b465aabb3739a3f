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
    })
}

/// When each Job of `ns` that `user` made was allowed to run: (name, instant). The controller
/// under test creates its Jobs suspended and resumes the one its confirmed claim names (a patch),
/// so for it that is the resume; CronJob's Jobs may run from their create. The first per name.
pub fn job_starts<'a>(
    reqs: &'a [Request],
    user: &'a str,
    ns: &'a str,
) -> impl Iterator<Item = (&'a str, Timestamp)> + 'a {
    let (verb, code) = if user == SINGLETON_USER {
        ("patch", 200)
    } else {
        ("create", 201)
    };
    reqs.iter()
        .filter(move |r| {
            r.user == user
                && r.verb == verb
                && r.resource == "jobs"
                && r.subresource.is_empty()
                && r.code == code
                && !r.dry_run
                && r.namespace == ns
        })
        .map(|r| (r.name.as_str(), r.done))
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
