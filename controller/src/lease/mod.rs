//! Leader election on a `coordination.k8s.io/v1` Lease (DESIGN.md layer 1, guarantee G4).
//!
//! Modelled on client-go's `leaderelection`, because no Rust crate gets the two rules right that
//! make it safe: every write is a compare-and-swap on the observed resourceVersion, and expiry is
//! judged by locally observed monotonic time, never by another node's `renewTime`.
//!
//! - [`lock`]: the Lease read and written with resourceVersion preconditions; the Lease watch.
//! - [`elector`]: try-acquire-or-renew, the standby and leader loops, the gate it drives.
//!
//! Only the election lives here: [`crate::replica`] runs a replica through it, and
//! [`crate::endpoints`] serves the probes from its published state.
//!
//! Leadership is only an efficiency layer: a leader that pauses past its deadline may still send
//! one write, which the resourceVersion check on the SingletonJob's status refuses (layer 2).

pub mod elector;
pub mod lock;

#[cfg(test)]
mod tests;

pub use elector::{Acquired, ElectionConfig, ElectionState, Elector, Held, Role};
pub use lock::{KubeLock, LeaderRecord, LeaseEvent, Lock, Versioned, watch_lease};

use std::hash::{BuildHasher, Hasher};

/// This process's identity in the Lease: `<POD_NAME or hostname>-<random suffix>`. The suffix
/// makes it unique per process, so a restarted pod with the same name never mistakes the old
/// process's record for its own.
pub fn identity(instance: Option<&str>) -> String {
    let base = instance
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| "singleton-controller".to_string());
    // Random per process (the OS seeds RandomState); the pid separates processes started in the
    // same instant.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    format!("{base}-{:08x}", h.finish() as u32)
}
