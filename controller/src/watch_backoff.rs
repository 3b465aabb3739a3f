//! How soon a broken watch is tried again. kube's default (0.8 s doubling to 30 s, plus up to
//! 100 % jitter, reset only by an event that arrives) suits a cache that may lag; this
//! controller decides a run every period from its caches, and one backoff paces all of its
//! trigger watches together (kube's `Controller` merges them). After an API server outage of a
//! minute that default left the controller blind for one to two minutes more: the first re-watch
//! found the server back but got 410 Gone (a restarted server's watch cache starts newer), which
//! counted as one more failure and backed off up to a minute again. Meanwhile every status write
//! from the stale cache was refused with 409 and retried (docs/multi-cluster.md, `make demo-dr`).
//!
//! [`WatchBackoff`]: 0.25 s doubling to [`MAX_DELAY`], each delay plus up to a quarter of itself
//! of jitter (so controllers restarted together do not retry in step), reset by any event.
//! [`retrying`] applies it to each watch on its own and hands the Controller no errors, so its
//! merged trigger stream never pauses every watch for one watch's failure (with one shared
//! backoff the three watches' 410s after a restart were retried one after another, 4 s apart).

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// The first delay after a watch breaks.
pub const MIN_DELAY: Duration = Duration::from_millis(250);
/// The longest delay: a watch is tried at least this often (plus jitter) while its server is
/// down, so it is back at most about this long after the server is.
pub const MAX_DELAY: Duration = Duration::from_secs(4);

/// Doubling delays from [`MIN_DELAY`] to [`MAX_DELAY`], with up to 25 % jitter.
#[derive(Debug, Default)]
pub struct WatchBackoff {
    failures: u32,
}

impl WatchBackoff {
    /// The delay before retry number `failures` (1-based), without jitter.
    fn base(failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        MIN_DELAY.saturating_mul(1 << doublings).min(MAX_DELAY)
    }
}

/// A fraction in [0, 1) from the process's random hasher keys: jitter needs no more.
fn random_fraction() -> f64 {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        let base = Self::base(self.failures);
        Some(base + base.mul_f64(0.25 * random_fraction()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A watch's stream with its errors retried here: logged, then polled again after its own
/// [`WatchBackoff`] delay; at once after 410 Gone, which the watcher answers by listing again
/// (a restarted API server's watch cache starts past the resourceVersion it was given).
pub fn retrying<T, S>(watch: &'static str, stream: S) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    S: Stream<Item = watcher::Result<T>> + Send + 'static,
{
    let state = (stream.boxed(), WatchBackoff::default());
    futures::stream::unfold(state, move |(mut stream, mut backoff)| async move {
        loop {
            match stream.next().await? {
                Ok(item) => {
                    backoff.reset();
                    return Some((item, (stream, backoff)));
                }
                Err(e) if gone(&e) => {
                    tracing::debug!(watch, error = %e, "watch expired: listing again");
                }
                Err(e) => {
                    let delay = backoff.next().unwrap_or(MAX_DELAY);
                    tracing::debug!(watch, error = %e, ?delay, "watch failed: retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    })
}

fn gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use tokio::time::Instant;

    fn failed() -> watcher::Error {
        watcher::Error::WatchError(
            Status::failure("boom", "InternalError")
                .with_code(500)
                .boxed(),
        )
    }

    fn expired() -> watcher::Error {
        watcher::Error::WatchError(Status::failure("too old", "Expired").with_code(410).boxed())
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_retried_after_the_backoff_and_410_at_once_and_never_passed_on() {
        let items = vec![Err(failed()), Err(failed()), Ok(1), Err(expired()), Ok(2)];
        let t0 = Instant::now();
        let mut s = std::pin::pin!(retrying("test", futures::stream::iter(items)));
        assert_eq!(s.next().await, Some(1));
        let waited = t0.elapsed();
        // Two failures: the first two delays, each with at most a quarter more of jitter.
        let least = WatchBackoff::base(1) + WatchBackoff::base(2);
        assert!(
            waited >= least && waited <= least.mul_f64(1.25),
            "{waited:?}"
        );
        let t1 = Instant::now();
        assert_eq!(s.next().await, Some(2));
        assert_eq!(t1.elapsed(), Duration::ZERO, "410 Gone is retried at once");
        assert_eq!(s.next().await, None);
    }

    #[test]
    fn delays_double_from_a_quarter_second_to_the_cap_with_at_most_a_quarter_more() {
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = b.by_ref().take(12).collect();
        for (i, d) in delays.iter().enumerate() {
            let base = WatchBackoff::base(i as u32 + 1);
            assert!(
                *d >= base && *d <= base.mul_f64(1.25),
                "retry {}: {d:?}",
                i + 1
            );
        }
        let bases: Vec<u64> = (1..=6)
            .map(|n| WatchBackoff::base(n).as_millis() as u64)
            .collect();
        assert_eq!(bases, [250, 500, 1000, 2000, 4000, 4000]);
        // However long the outage, a retry is never further off than the cap plus its jitter.
        assert!(
            delays.iter().all(|d| *d <= MAX_DELAY.mul_f64(1.25)),
            "{delays:?}"
        );
        assert_eq!(WatchBackoff::base(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn an_event_resets_it_to_the_first_delay() {
        let mut b = WatchBackoff::default();
        b.by_ref().take(10).for_each(drop);
        b.reset();
        let d = b.next().unwrap();
        assert!(d <= MIN_DELAY.mul_f64(1.25), "{d:?}");
    }

    #[test]
    fn jitter_varies() {
        let n: std::collections::HashSet<u64> =
            (0..20).map(|_| (random_fraction() * 1e9) as u64).collect();
        assert!(n.len() > 1, "{n:?}");
    }
}
