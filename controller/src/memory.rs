//! Giving memory back after a burst of work.
//!
//! glibc's malloc keeps freed memory inside its heaps and on its own returns only a heap's top:
//! after a start-up with thousands of SingletonJobs, free pages stay scattered among live data
//! (figures in docs/performance.md). So when the controller's API requests fall quiet after a
//! burst of them, it asks glibc to return its free pages. It costs milliseconds once per burst and nothing at rest.
//! Other allocators need no help (the image's musl returns memory on its own): there it does
//! nothing.

use std::time::Duration;

use crate::lanes::Lanes;

/// Requests since the last give-back that make a burst worth one.
const BURST: u64 = 200;

/// Quiet for this long first: the burst's last responses are still being applied to the caches.
const SETTLE: Duration = Duration::from_secs(2);

/// Runs for the life of the controller.
pub async fn give_back_after_bursts(lanes: Lanes) {
    let mut given_back_at = 0;
    loop {
        let granted = lanes.fell_quiet().await;
        if granted.saturating_sub(given_back_at) < BURST {
            continue;
        }
        tokio::time::sleep(SETTLE).await;
        // Busy again: the end of that work brings us back here.
        if !lanes.is_quiet() {
            continue;
        }
        give_back();
        given_back_at = granted;
    }
}

/// Two malloc arenas, one per core of the usual request, rather than glibc's eight per core: each
/// arena keeps its own free memory (docs/performance.md). Called once, early.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets a glibc tunable; M_ARENA_MAX affects arenas created later.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 2) };
    }
}

/// Returns free heap pages to the system.
fn give_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks glibc's own heaps under their locks; it has no
        // preconditions on the caller and 0 asks for no padding to be kept.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released == 1,
            "returned free heap pages to the system"
        );
    }
}
