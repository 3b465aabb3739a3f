//! Job keys belong to a namespace (issue 34, N4). `spec.backstop.jobKey` is free text, and tenants
//! often share a database role, so the database's own permissions cannot tell one tenant's key
//! from another's. The backstop therefore records, per job key, the namespace of its first claim
//! (schema 6: `<p>fences.namespace`), and the claim transaction refuses a claim from any other
//! namespace, as does the retirement of a token. The same namespace in another cluster is the same
//! owner (docs/multi-cluster.md). An administrator shares a key with every namespace by setting
//! its owner to [`SHARED`], or moves it by setting another namespace (docs/security.md).

use crate::{Error, Result};

/// The owner an administrator sets for a job key that any namespace may claim.
pub const SHARED: &str = "*";

/// Whether a claim (or a retirement) from `claimant`'s namespace is refused for a job key whose
/// recorded owner is `recorded` (`None`: not recorded yet, the claim records it). An empty
/// `claimant` is not checked.
pub fn refuses(recorded: Option<&str>, claimant: &str) -> bool {
    match recorded {
        _ if claimant.is_empty() => false,
        None => false,
        Some(owner) => owner != claimant && owner != SHARED,
    }
}

/// The recorded owner to store for `claimant`: `None` (SQL NULL, nothing recorded) when it is
/// empty.
pub fn recorded(claimant: &str) -> Option<&str> {
    (!claimant.is_empty()).then_some(claimant)
}

/// [`refuses`] as an error for `job`: [`Error::NotOwner`], which does not name the owner.
pub fn check(job: &str, recorded: Option<&str>, claimant: &str) -> Result<()> {
    if refuses(recorded, claimant) {
        return Err(not_owner(job));
    }
    Ok(())
}

/// The refusal of `job` to a namespace that does not own it.
pub fn not_owner(job: &str) -> Error {
    Error::NotOwner {
        job: job.to_string(),
    }
}

#[cfg(test)]
mod tests;
