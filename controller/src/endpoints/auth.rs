//! Who may read `/metrics`: the caller's bearer token checked with a TokenReview, the user it
//! names authorised with a SubjectAccessReview (`get` on the non-resource URL `/metrics`), as
//! controller-runtime's secure metrics and kube-rbac-proxy do. So Prometheus needs a token bound
//! to a role like the chart's `<release>-metrics-reader`, and nothing else on the network can
//! read what the metrics say about the cluster's jobs.
//!
//! Decisions are cached by the SHA-256 of the token ([`DecisionCache`]), briefly and in bounded
//! space: a scrape every 15 s then costs two API calls once a minute, not every time.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::Result;

/// The non-resource URL and verb a caller must be allowed, as in RBAC's `nonResourceURLs`.
pub const METRICS_PATH: &str = "/metrics";
pub const METRICS_VERB: &str = "get";

/// What the API server said about a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Authenticated and allowed `get /metrics`: 200.
    Allowed,
    /// The token is unknown, expired or revoked: 401.
    Unauthenticated,
    /// A valid token whose user may not `get /metrics`: 403.
    Forbidden,
    /// Not reviewed: the budget of reviews is spent (a flood of unknown tokens). 429; never
    /// cached, so the caller's next request is reviewed once the budget refills.
    Throttled,
}

/// How long a decision is reused, and how many are kept.
#[derive(Clone, Copy, Debug)]
pub struct CachePolicy {
    /// An allowed token is re-checked after this (a removed RoleBinding takes effect by then).
    pub allowed_ttl: Duration,
    /// A refused token is re-checked after this, so a new binding takes effect soon.
    pub refused_ttl: Duration,
    /// At most this many tokens are remembered.
    pub capacity: usize,
    /// How many tokens not in the cache are reviewed.
    pub reviews: ReviewBudget,
}

/// How often the API server is asked about a token the cache does not know. Each review is a
/// request under the controller's own identity, in the same API Priority and Fairness flow as its
/// Job creates and status writes, so without a budget anyone who reaches `/metrics` could slow
/// scheduling with made-up tokens (security review N6). A scraper's token is cached for a
/// minute; only new tokens spend the budget.
#[derive(Clone, Copy, Debug)]
pub struct ReviewBudget {
    /// Reviews a second, sustained.
    pub per_second: u32,
    /// Reviews at once after a quiet spell.
    pub burst: u32,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        ReviewBudget {
            per_second: 5,
            burst: 10,
        }
    }
}

/// A token bucket on tokio's clock, so tests can stop time. Written here rather than taken from a
/// rate-limiting crate: it is a few lines, and such crates keep a clock of their own.
#[derive(Debug)]
struct Bucket {
    budget: ReviewBudget,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(budget: ReviewBudget, now: Instant) -> Self {
        Bucket {
            budget,
            tokens: f64::from(budget.burst),
            at: now,
        }
    }

    /// Takes one review from the budget at `now`, if there is one.
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64()
            * f64::from(self.budget.per_second);
        self.tokens = (self.tokens + refill).min(f64::from(self.budget.burst));
        self.at = now;
        let ok = self.tokens >= 1.0;
        if ok {
            self.tokens -= 1.0;
        }
        ok
    }
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            allowed_ttl: Duration::from_secs(60),
            refused_ttl: Duration::from_secs(10),
            capacity: 256,
            reviews: ReviewBudget::default(),
        }
    }
}

/// The SHA-256 of a token: the cache never holds a token itself.
pub type TokenKey = [u8; 32];

pub fn token_key(token: &str) -> TokenKey {
    Sha256::digest(token.as_bytes()).into()
}

/// Recent decisions by token hash. Pure: the caller passes the time.
#[derive(Debug)]
pub struct DecisionCache {
    policy: CachePolicy,
    entries: HashMap<TokenKey, (Decision, Instant)>,
}

impl DecisionCache {
    pub fn new(policy: CachePolicy) -> Self {
        DecisionCache {
            policy,
            entries: HashMap::new(),
        }
    }

    /// The decision for `key` if it is still fresh at `now`.
    pub fn get(&self, key: &TokenKey, now: Instant) -> Option<Decision> {
        self.entries
            .get(key)
            .filter(|(_, expires)| now < *expires)
            .map(|(d, _)| *d)
    }

    /// Remembers `decision` from `now`. When full, expired entries go first, then the one that
    /// would expire soonest, so a flood of made-up tokens cannot grow memory without bound.
    pub fn insert(&mut self, key: TokenKey, decision: Decision, now: Instant) {
        if self.policy.capacity == 0 {
            return;
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= self.policy.capacity {
            self.entries.retain(|_, (_, expires)| now < *expires);
            if self.entries.len() >= self.policy.capacity
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, expires))| *expires)
                    .map(|(k, _)| *k)
            {
                self.entries.remove(&oldest);
            }
        }
        let ttl = match decision {
            Decision::Allowed => self.policy.allowed_ttl,
            Decision::Unauthenticated | Decision::Forbidden => self.policy.refused_ttl,
            Decision::Throttled => return,
        };
        self.entries.insert(key, (decision, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The token of an `Authorization: Bearer <token>` header value, if it is one.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Reviews tokens against the API server, through the cache.
pub struct Authorizer {
    client: Client,
    cache: Mutex<DecisionCache>,
    budget: Mutex<Bucket>,
}

impl Authorizer {
    pub fn new(client: Client, policy: CachePolicy) -> Self {
        Authorizer {
            client,
            budget: Mutex::new(Bucket::new(policy.reviews, Instant::now())),
            cache: Mutex::new(DecisionCache::new(policy)),
        }
    }

    /// The decision for `token`: from the cache, else reviewed while the budget lasts, else
    /// [`Decision::Throttled`]. Errors (the API server unreachable, this controller not allowed
    /// to create reviews) are not cached: the next scrape asks again.
    pub async fn check(&self, token: &str) -> Result<Decision> {
        let key = token_key(token);
        if let Some(d) = self.lock_cache().get(&key, Instant::now()) {
            return Ok(d);
        }
        let spent = !crate::sync::lock(&self.budget).take(Instant::now());
        if spent {
            return Ok(Decision::Throttled);
        }
        let decision = self.review(token).await?;
        self.lock_cache().insert(key, decision, Instant::now());
        Ok(decision)
    }

    fn lock_cache(&self) -> std::sync::MutexGuard<'_, DecisionCache> {
        // The cache holds no invariant a panicking holder could break half-way.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn review(&self, token: &str) -> Result<Decision> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = reviewed.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(Decision::Unauthenticated);
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(METRICS_PATH.into()),
                    verb: Some(METRICS_VERB.into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answered = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await?;
        Ok(match answered.status.map(|s| s.allowed) {
            Some(true) => Decision::Allowed,
            _ => Decision::Forbidden,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{CachePolicy, Decision, DecisionCache, ReviewBudget, bearer_token, token_key};

    fn policy(capacity: usize) -> CachePolicy {
        CachePolicy {
            allowed_ttl: Duration::from_secs(60),
            refused_ttl: Duration::from_secs(10),
            capacity,
            reviews: ReviewBudget::default(),
        }
    }

    #[test]
    fn decisions_expire_refusals_sooner_than_grants() {
        let now = Instant::now();
        let mut c = DecisionCache::new(policy(8));
        let (good, bad) = (token_key("good"), token_key("bad"));
        c.insert(good, Decision::Allowed, now);
        c.insert(bad, Decision::Forbidden, now);
        assert_eq!(c.get(&good, now), Some(Decision::Allowed));
        assert_eq!(c.get(&bad, now), Some(Decision::Forbidden));
        let later = now + Duration::from_secs(10);
        assert_eq!(
            c.get(&bad, later),
            None,
            "a refusal is re-checked after 10 s"
        );
        assert_eq!(c.get(&good, later), Some(Decision::Allowed));
        assert_eq!(c.get(&good, now + Duration::from_secs(60)), None);
        assert_eq!(c.get(&token_key("other"), now), None);
    }

    #[test]
    fn the_cache_is_bounded_and_evicts_expired_then_soonest_to_expire() {
        let now = Instant::now();
        let mut c = DecisionCache::new(policy(3));
        c.insert(token_key("a"), Decision::Allowed, now);
        c.insert(token_key("b"), Decision::Unauthenticated, now);
        c.insert(token_key("c"), Decision::Allowed, now);
        // Full: "b" (refused, 10 s) would expire first, so it goes.
        c.insert(
            token_key("d"),
            Decision::Allowed,
            now + Duration::from_secs(1),
        );
        assert_eq!(c.len(), 3);
        assert_eq!(c.get(&token_key("b"), now), None);
        assert!(c.get(&token_key("a"), now).is_some() && c.get(&token_key("d"), now).is_some());
        // A flood of made-up tokens never grows it.
        for i in 0..1000 {
            c.insert(
                token_key(&format!("junk-{i}")),
                Decision::Unauthenticated,
                now,
            );
        }
        assert_eq!(c.len(), 3);
        // Re-inserting a known key replaces it without evicting another.
        let mut c = DecisionCache::new(policy(2));
        c.insert(token_key("a"), Decision::Forbidden, now);
        c.insert(token_key("b"), Decision::Allowed, now);
        c.insert(token_key("a"), Decision::Allowed, now);
        assert_eq!(c.get(&token_key("a"), now), Some(Decision::Allowed));
        assert_eq!(c.get(&token_key("b"), now), Some(Decision::Allowed));
        assert!(DecisionCache::new(policy(0)).is_empty());
    }

    #[test]
    fn the_cache_keys_by_hash_never_by_token() {
        let key = token_key("secret-token");
        assert_eq!(key.len(), 32);
        assert_ne!(key, token_key("secret-token2"));
        let c = {
            let mut c = DecisionCache::new(policy(4));
            c.insert(key, Decision::Allowed, Instant::now());
            c
        };
        assert!(!format!("{c:?}").contains("secret-token"));
    }

    /// The reviews' shape, and that a cached decision sends nothing: the mock answers three
    /// requests and then is gone, so a fourth would fail the check.
    #[tokio::test]
    async fn a_token_is_reviewed_then_authorised_for_get_metrics_once_per_ttl() {
        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let auth = super::Authorizer::new(kube::Client::new(svc, "default"), policy(8));
        let server = tokio::spawn(async move {
            let mut answer = async |path: &str, reply: serde_json::Value| {
                let (req, send) = handle.next_request().await.expect("a request");
                assert_eq!((req.method().as_str(), req.uri().path()), ("POST", path));
                let body: serde_json::Value =
                    serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                        .unwrap();
                send.send_response(Response::new(Body::from(
                    serde_json::to_vec(&reply).unwrap(),
                )));
                body
            };
            let review = "/apis/authentication.k8s.io/v1/tokenreviews";
            let access = "/apis/authorization.k8s.io/v1/subjectaccessreviews";
            let user = serde_json::json!({"username": "system:serviceaccount:mon:prom",
                "uid": "u-1", "groups": ["system:serviceaccounts"], "extra": {"k": ["v"]}});
            let body = answer(
                review,
                serde_json::json!({"apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview", "spec": {},
                "status": {"authenticated": true, "user": user}}),
            )
            .await;
            assert_eq!(body["spec"]["token"], "good");
            let body = answer(
                access,
                serde_json::json!({"apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview", "spec": {}, "status": {"allowed": true}}),
            )
            .await;
            let spec = &body["spec"];
            assert_eq!(spec["user"], "system:serviceaccount:mon:prom");
            assert_eq!(spec["uid"], "u-1");
            assert_eq!(spec["groups"][0], "system:serviceaccounts");
            assert_eq!(spec["extra"]["k"][0], "v");
            assert_eq!(spec["nonResourceAttributes"]["path"], "/metrics");
            assert_eq!(spec["nonResourceAttributes"]["verb"], "get");
            assert!(spec["resourceAttributes"].is_null());
            // An unknown token: no access review at all.
            let body = answer(
                review,
                serde_json::json!({"apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview", "spec": {}, "status": {"authenticated": false}}),
            )
            .await;
            assert_eq!(body["spec"]["token"], "forged");
        });
        assert_eq!(auth.check("good").await.unwrap(), Decision::Allowed);
        assert_eq!(
            auth.check("forged").await.unwrap(),
            Decision::Unauthenticated
        );
        server.await.unwrap();
        // From the cache: the mock is gone, a request would fail.
        assert_eq!(auth.check("good").await.unwrap(), Decision::Allowed);
        assert_eq!(
            auth.check("forged").await.unwrap(),
            Decision::Unauthenticated
        );
        assert!(
            auth.check("new").await.is_err(),
            "an uncached token asks the API server"
        );
    }

    /// N6: a flood of made-up tokens costs the API server at most the review budget; a token
    /// already decided is answered from the cache throughout.
    #[tokio::test(start_paused = true)]
    async fn made_up_tokens_cost_at_most_the_review_budget() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        use http::{Request, Response};
        use kube::client::Body;
        let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let mut p = policy(64);
        p.reviews = ReviewBudget {
            per_second: 5,
            burst: 10,
        };
        let auth = super::Authorizer::new(kube::Client::new(svc, "default"), p);
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_string();
                counted.fetch_add(1, Ordering::SeqCst);
                let reply = if path.ends_with("/tokenreviews") {
                    let body: serde_json::Value =
                        serde_json::from_slice(&req.into_body().collect_bytes().await.unwrap())
                            .unwrap();
                    let known = body["spec"]["token"] == "prometheus";
                    serde_json::json!({"apiVersion": "authentication.k8s.io/v1",
                        "kind": "TokenReview", "spec": {},
                        "status": {"authenticated": known, "user": {"username": "prom"}}})
                } else {
                    serde_json::json!({"apiVersion": "authorization.k8s.io/v1",
                        "kind": "SubjectAccessReview", "spec": {}, "status": {"allowed": true}})
                };
                send.send_response(Response::new(Body::from(
                    serde_json::to_vec(&reply).unwrap(),
                )));
            }
        });
        // The scraper's token, decided before the flood (a review and an access review).
        assert_eq!(auth.check("prometheus").await.unwrap(), Decision::Allowed);
        let flood = async |from: usize, to: usize| {
            let mut throttled = 0;
            for i in from..to {
                match auth.check(&format!("made-up-{i}")).await.unwrap() {
                    Decision::Throttled => throttled += 1,
                    Decision::Unauthenticated => {}
                    other => panic!("{other:?}"),
                }
                assert_eq!(auth.check("prometheus").await.unwrap(), Decision::Allowed);
            }
            throttled
        };
        // Time stands still: the burst left after the scraper's review, then nothing.
        assert_eq!(flood(0, 1000).await, 1000 - 9);
        assert_eq!(reviews.load(Ordering::SeqCst), 2 + 9);
        // A second refills five.
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(flood(1000, 2000).await, 1000 - 5);
        assert_eq!(reviews.load(Ordering::SeqCst), 2 + 9 + 5);
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(None), None);
    }
}
