//! What to audit, and the bounds on the traffic the audit may send.

use http::{HeaderName, HeaderValue, Method};
use reqwest::Url;
use std::time::Duration;

/// Default number of identical requests fired at once by the concurrency check.
pub const DEFAULT_CONCURRENCY: usize = 20;

/// Default per-request timeout: 10 seconds (connect, send and read the whole response).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default hard limit on the number of requests one audit sends: 500.
pub const DEFAULT_MAX_REQUESTS: usize = 500;

/// The longest replay window the expiry check will wait out: 600 seconds (10 minutes).
///
/// Waiting out a production window (24 hours by default in Oncely) is not an audit; point the
/// audit at a deployment configured with a short window instead.
pub const MAX_WINDOW: Duration = Duration::from_secs(600);

/// The most identical requests the concurrency check may fire at once: 1000.
pub const MAX_CONCURRENCY: usize = 1000;

/// Default number of bursts (trials) the concurrency check fires, each with its own key: 10.
///
/// A race that shows in a share `s` of bursts, independently, escapes `n` bursts with
/// probability `(1 - s)^n`: with 10 bursts, a race present in at least half of them is caught
/// with probability at least `1 - 2^-10` (99.9%), one present in a quarter of them with
/// probability at least `1 - 0.75^10` (94.4%). A bigger burst is no substitute: past a point
/// the later requests of a burst just get the replay.
pub const DEFAULT_TRIALS: usize = 10;

/// The most bursts the concurrency check may fire: 100.
pub const MAX_TRIALS: usize = 100;

/// The client-bypass check's request allotment (see
/// [`checks::CLIENT_BYPASS`](super::checks::CLIENT_BYPASS)), count-URL reads aside: 17. Three
/// screening probes (a new key carrying the headers and its retry, the completed baseline key
/// carrying them); the rest, only when a screening probe changed the behaviour, for the
/// control (the same requests without the headers) and the search that names the header, and
/// for the headers the in-flight answers announced.
pub(crate) const BYPASS_REQUESTS: usize = 17;

/// Requests the method check sends besides count-URL reads: two keyless requests and three
/// `GET`s of the resource.
const METHOD_PROBES: usize = 5;

/// Where the audited endpoint reads its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyPlacement {
    /// A request header: `Idempotency-Key` (the default, IETF
    /// draft-ietf-httpapi-idempotency-key-header), `webhook-id` (Standard Webhooks),
    /// `X-GitHub-Delivery` ...
    Header(HeaderName),
    /// A string member of the JSON body at this RFC 6901 JSON Pointer (`/id`, Stripe's event
    /// id): the audit writes each request's key there (the member's parent must be an object
    /// of the configured body). "No key" removes the member; "the key twice" writes the member
    /// twice in one object.
    JsonPointer(String),
}

impl Default for KeyPlacement {
    fn default() -> Self {
        Self::Header(HeaderName::from_static("idempotency-key"))
    }
}

impl std::fmt::Display for KeyPlacement {
    /// `Idempotency-Key`, `webhook-id`, `key at /id`: how evidence lines name the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Header(h) if h == "idempotency-key" => f.write_str("Idempotency-Key"),
            Self::Header(h) => f.write_str(h.as_str()),
            Self::JsonPointer(p) => write!(f, "key at {p}"),
        }
    }
}

/// What to audit: one state-changing endpoint of one API, and the limits of the probe.
///
/// Every request goes to `base_url`'s origin (scheme, host, port): the endpoint, the other
/// endpoint and the count URL are paths under it, redirects are never followed and no proxy is
/// used. The audit sends at most [`max_requests`](Self::max_requests) requests, each bounded by
/// [`timeout`](Self::timeout); the only deliberate wait is the expiry check's (at most
/// [`MAX_WINDOW`] plus a margin).
///
/// The audit creates real resources on the target (a few dozen at most, as a client retrying
/// would): point it at a test or staging deployment.
///
/// ```
/// use oncely_audit::audit::{AuditConfig, Url};
/// use http::Method;
///
/// let mut cfg = AuditConfig::new(
///     Url::parse("http://127.0.0.1:8080").unwrap(),
///     Method::POST,
///     "/v1/payments",
///     serde_json::json!({"amount": 100, "currency": "usd"}),
/// );
/// cfg.auth = Some("Bearer sk_test_alice".into());
/// cfg.count_url = Some("/v1/payments".into());
/// assert_eq!(cfg.concurrency, 20);
/// assert!(cfg.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct AuditConfig {
    /// Where the API lives: `http://host:port` with an optional path prefix (`/api`). Only
    /// `http` and `https` are accepted (`https` needs a TLS feature of `reqwest` enabled in the
    /// final binary). Query and fragment are not allowed.
    pub base_url: Url,
    /// More base URLs of the same API (other instances sharing its store, e.g. three processes
    /// behind no proxy), each held to the same rules as `base_url`. Requests to the endpoint and
    /// the other endpoint are spread across `base_url` and these in turn (round robin), so a
    /// retry usually reaches another instance than its original; the count URL is read from
    /// `base_url`. Empty by default.
    pub more_base_urls: Vec<Url>,
    /// The method of the audited endpoint, usually `POST`.
    pub method: Method,
    /// The audited endpoint's path under `base_url`, starting with `/` (e.g. `/v1/payments`);
    /// it may carry a query string.
    pub path: String,
    /// The JSON body of a request that succeeds (2xx) on the endpoint. `Value::Null` sends no
    /// body (the body-related checks are then N/A).
    pub body: serde_json::Value,
    /// The full `Authorization` header value of the first caller (`Bearer ...`), if the API
    /// needs one. Never printed in evidence.
    pub auth: Option<String>,
    /// The full `Authorization` header value of a second, different caller, for the key-scope
    /// check. `None` makes that check N/A.
    pub second_auth: Option<String>,
    /// Another `Authorization` value for the *same* account as `auth` (a refreshed token), for
    /// the refreshed-credential check: the first caller's request sent again with it must be
    /// replayed, not executed. `None` makes that check N/A. Never printed.
    pub same_account_auth: Option<String>,
    /// Keep one cookie jar per caller (default `false`): each caller's requests present the
    /// cookies its earlier responses set (name and value; `Max-Age=0` deletes). The first and
    /// the same-account credential are one client (a refreshed token) and share a jar; the
    /// second credential has its own. Needed for
    /// APIs whose idempotency records live in the caller's session, and it enables the
    /// session-scope check.
    pub cookies: bool,
    /// A path under `base_url` (or an absolute URL on the same origin) answering `GET` with a
    /// JSON array of the resources the endpoint creates, or an object with a count (`count`,
    /// `total`, `total_count`, or an array under `data` / `items` / `results`). Read before and
    /// after the checks that must not execute twice, with the first caller's credential. `None`:
    /// executions are counted from the responses' `id` fields only.
    pub count_url: Option<String>,
    /// Another endpoint of the same API (method, path under `base_url`) that accepts keys, for
    /// the cross-endpoint check. `None` makes that check N/A.
    pub other_endpoint: Option<(Method, String)>,
    /// The JSON body the other endpoint accepts (with a 2xx). `None`: the audited endpoint's
    /// `body` is sent, and the check is N/A if the other endpoint refuses it.
    pub other_body: Option<serde_json::Value>,
    /// How many identical requests the concurrency check fires at once. Default
    /// [`DEFAULT_CONCURRENCY`] (20); 2 to [`MAX_CONCURRENCY`].
    pub concurrency: usize,
    /// How many bursts of `concurrency` requests the concurrency check fires, one after the
    /// other, each with a fresh key. Default [`DEFAULT_TRIALS`] (10); 1 to [`MAX_TRIALS`].
    pub trials: usize,
    /// The server's replay window, if it is short enough to wait out (at most [`MAX_WINDOW`]).
    /// `Some` enables the expiry check, which waits the window plus a margin of 10% (at least
    /// 1 second). `None` makes that check N/A.
    pub window: Option<Duration>,
    /// Per-request timeout, from connect to the last body byte. Default [`DEFAULT_TIMEOUT`]
    /// (10 seconds).
    pub timeout: Duration,
    /// Hard bound on requests sent by one audit, count-URL reads included. Default
    /// [`DEFAULT_MAX_REQUESTS`] (500); must cover [`planned_requests`](Self::planned_requests).
    pub max_requests: usize,
    /// Where the key goes (default the `Idempotency-Key` header). Every check puts its keys
    /// there: a webhook receiver keyed on `webhook-id` or on the event's `/id` is audited like
    /// any API.
    pub key_placement: KeyPlacement,
    /// Sign every request to the endpoint and the other endpoint as a Standard Webhooks sender
    /// does, with this secret (`whsec_<base64>`): `webhook-id` (the key when the key placement
    /// is the `webhook-id` header; else the request's key, or a fresh id for a keyless
    /// request), `webhook-timestamp` (now, in seconds) and `webhook-signature` (`v1,` HMAC-SHA256
    /// over `id.timestamp.body`, by the `standardwebhooks` crate), computed afresh for each
    /// attempt over the body actually sent. The second caller signs with
    /// [`second_webhook_secret`](Self::second_webhook_secret) when given. Never printed.
    pub webhook_secret: Option<String>,
    /// Another sender's Standard Webhooks secret: the second caller of the key-scope check
    /// (its requests are signed with it). Enables that check like
    /// [`second_auth`](Self::second_auth). Never printed.
    pub second_webhook_secret: Option<String>,
}

/// Why an [`AuditConfig`] cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `base_url` is not an `http` or `https` URL with a host, or carries a query or fragment.
    #[error(
        "base URL {0:?} must be an http:// or https:// URL with a host and no query or fragment"
    )]
    BaseUrl(String),
    /// A path (endpoint, other endpoint, count URL) does not start with `/`, or leads to
    /// another origin than `base_url`'s.
    #[error("{what} {value:?} must be a path starting with '/' under the base URL")]
    Path {
        /// Which setting: `path`, `other endpoint` or `count URL`.
        what: &'static str,
        /// The value given.
        value: String,
    },
    /// An `Authorization` value is not a valid header value (control characters, newlines).
    #[error("the {0} credential is not a valid HTTP header value")]
    Credential(&'static str),
    /// `second_auth` equals `auth`: the key-scope check needs two different callers.
    #[error("the second credential must differ from the first")]
    SameCredentials,
    /// `same_account_auth` equals `auth` or `second_auth`: it must be another token (a
    /// refreshed one) of the first caller's account.
    #[error(
        "the same-account credential must be another token of the first caller's account, not the first or the second credential"
    )]
    SameAccountCredentials,
    /// `trials` is outside 1..=[`MAX_TRIALS`].
    #[error("trials must be between 1 and {MAX_TRIALS}, got {0}")]
    Trials(usize),
    /// `concurrency` is outside 2..=[`MAX_CONCURRENCY`].
    #[error("concurrency must be between 2 and {MAX_CONCURRENCY}, got {0}")]
    Concurrency(usize),
    /// `timeout` is zero.
    #[error("the per-request timeout must be greater than zero")]
    Timeout,
    /// `window` is zero or longer than [`MAX_WINDOW`].
    #[error("the replay window must be between 1 ms and {} s to be waited out, got {} ms", MAX_WINDOW.as_secs(), .0.as_millis())]
    Window(Duration),
    /// The key's JSON Pointer does not start with `/`, or its parent is not an object of the
    /// configured body.
    #[error(
        "the key's JSON Pointer {0:?} must start with '/' and name a member of an object in the body"
    )]
    KeyPointer(String),
    /// A Standard Webhooks secret is not `whsec_<base64>` (or bare base64), or is empty.
    #[error("the {0} webhook secret is not a Standard Webhooks secret (whsec_ followed by base64)")]
    WebhookSecret(&'static str),
    /// `second_webhook_secret` without `webhook_secret`, or equal to it.
    #[error("the second webhook secret needs a first one, and must differ from it")]
    SecondWebhookSecret,
    /// `max_requests` is smaller than what the checks need.
    #[error("max_requests is {given} but this audit needs up to {needed} requests")]
    Budget {
        /// The configured limit.
        given: usize,
        /// [`AuditConfig::planned_requests`].
        needed: usize,
    },
}

/// The validated URLs every request goes to.
#[derive(Debug, Clone)]
pub(crate) struct Targets {
    /// The endpoint on each base URL, `base_url`'s first.
    pub(crate) endpoints: Vec<Url>,
    /// The other endpoint on each base URL.
    pub(crate) other: Option<(Method, Vec<Url>)>,
    pub(crate) count: Option<Url>,
}

impl AuditConfig {
    /// A configuration with the defaults: one base URL, no credentials, no cookies, no count
    /// URL, no other endpoint, no window, [`DEFAULT_CONCURRENCY`], [`DEFAULT_TRIALS`],
    /// [`DEFAULT_TIMEOUT`], [`DEFAULT_MAX_REQUESTS`].
    pub fn new(
        base_url: Url,
        method: Method,
        path: impl Into<String>,
        body: serde_json::Value,
    ) -> Self {
        Self {
            base_url,
            more_base_urls: Vec::new(),
            method,
            path: path.into(),
            body,
            auth: None,
            second_auth: None,
            same_account_auth: None,
            cookies: false,
            count_url: None,
            other_endpoint: None,
            other_body: None,
            concurrency: DEFAULT_CONCURRENCY,
            trials: DEFAULT_TRIALS,
            window: None,
            timeout: DEFAULT_TIMEOUT,
            max_requests: DEFAULT_MAX_REQUESTS,
            key_placement: KeyPlacement::default(),
            webhook_secret: None,
            second_webhook_secret: None,
        }
    }

    /// The most requests this configuration's audit sends: `trials x concurrency + 46`, plus
    /// `2 x trials + 25` count-URL reads when `count_url` is set (with the defaults, 246 and
    /// 291). Many of those are conditional: the in-flight check's two retries with a shorter
    /// delay (4 requests, 4 reads), the cross-scope check's two same-account probes, and 14 of
    /// the client-bypass check's 17 (its controls and the search for the header that changes the
    /// behaviour, sent only when a screening probe changed it, and its probes of the headers the
    /// server's in-flight answers announced, sent only when there are any).
    pub fn planned_requests(&self) -> usize {
        // concurrency: trials x n; replay: 2; reordered: 1; mismatch: 1; other endpoint: 2
        // (fresh key, reused key); second scope: 1 + 2 (same-account probes: a count read with
        // the second credential, a GET of the Location); refreshed credential: 1; session: 2;
        // client bypass: its allotment; malformed keys: 4; missing key: 1; in-flight: up to
        // 3 x 2; expiry: 1; method: 2 keyless requests and 3 GETs of the resource.
        let probes = self.trials * self.concurrency
            + 2
            + 1
            + 1
            + 2
            + 3
            + 1
            + 2
            + BYPASS_REQUESTS
            + 4
            + 1
            + 6
            + 1
            + METHOD_PROBES;
        // count reads before/after: each burst, replay, reordered, mismatch, refreshed
        // credential, session, client bypass x2, in-flight x3, expiry; method: 3.
        let counts = if self.count_url.is_some() {
            2 * self.trials + 2 * 11 + 3
        } else {
            0
        };
        probes + counts
    }

    /// Checks the configuration without sending anything.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] found: a base URL that is not plain `http(s)://host[:port][/prefix]`,
    /// a path not starting with `/` or leaving the base URLs' origins, an invalid credential or
    /// two equal ones, `concurrency` outside 2..=1000, `trials` outside 1..=100, a zero timeout,
    /// a window of zero or over [`MAX_WINDOW`], or `max_requests` below
    /// [`planned_requests`](Self::planned_requests).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.targets().map(|_| ())
    }

    pub(crate) fn targets(&self) -> Result<Targets, ConfigError> {
        let bases: Vec<&Url> = std::iter::once(&self.base_url)
            .chain(&self.more_base_urls)
            .collect();
        for base in &bases {
            if !matches!(base.scheme(), "http" | "https")
                || base.host_str().is_none()
                || base.query().is_some()
                || base.fragment().is_some()
                || base.cannot_be_a_base()
            {
                return Err(ConfigError::BaseUrl(base.to_string()));
            }
        }
        let base = &self.base_url;
        let endpoints = bases
            .iter()
            .map(|b| join(b, "path", &self.path))
            .collect::<Result<Vec<_>, _>>()?;
        let other = match &self.other_endpoint {
            Some((m, p)) => Some((
                m.clone(),
                bases
                    .iter()
                    .map(|b| join(b, "other endpoint", p))
                    .collect::<Result<Vec<_>, _>>()?,
            )),
            None => None,
        };
        let count = match &self.count_url {
            Some(c) if c.starts_with("http://") || c.starts_with("https://") => {
                let url = Url::parse(c).map_err(|_| ConfigError::Path {
                    what: "count URL",
                    value: c.clone(),
                })?;
                if !bases.iter().any(|b| b.origin() == url.origin()) {
                    return Err(ConfigError::Path {
                        what: "count URL",
                        value: c.clone(),
                    });
                }
                Some(url)
            }
            Some(c) => Some(join(base, "count URL", c)?),
            None => None,
        };
        for (what, cred) in [
            ("first", &self.auth),
            ("second", &self.second_auth),
            ("same-account", &self.same_account_auth),
        ] {
            if let Some(c) = cred
                && HeaderValue::from_str(c).is_err()
            {
                return Err(ConfigError::Credential(what));
            }
        }
        if self.second_auth.is_some() && self.second_auth == self.auth {
            return Err(ConfigError::SameCredentials);
        }
        if self.same_account_auth.is_some()
            && (self.same_account_auth == self.auth || self.same_account_auth == self.second_auth)
        {
            return Err(ConfigError::SameAccountCredentials);
        }
        if let KeyPlacement::JsonPointer(ptr) = &self.key_placement {
            let parent = ptr.rfind('/').map(|i| &ptr[..i]);
            let parent_is_object = parent.is_some_and(|parent| {
                self.body
                    .pointer(parent)
                    .is_some_and(serde_json::Value::is_object)
            });
            if !ptr.starts_with('/') || !parent_is_object {
                return Err(ConfigError::KeyPointer(ptr.clone()));
            }
        }
        for (what, secret) in [
            ("first", &self.webhook_secret),
            ("second", &self.second_webhook_secret),
        ] {
            if let Some(s) = secret
                && crate::audit::signer::signer(s).is_none()
            {
                return Err(ConfigError::WebhookSecret(what));
            }
        }
        if self.second_webhook_secret.is_some()
            && (self.webhook_secret.is_none() || self.second_webhook_secret == self.webhook_secret)
        {
            return Err(ConfigError::SecondWebhookSecret);
        }
        if !(1..=MAX_TRIALS).contains(&self.trials) {
            return Err(ConfigError::Trials(self.trials));
        }
        if !(2..=MAX_CONCURRENCY).contains(&self.concurrency) {
            return Err(ConfigError::Concurrency(self.concurrency));
        }
        if self.timeout.is_zero() {
            return Err(ConfigError::Timeout);
        }
        if let Some(w) = self.window
            && (w.is_zero() || w > MAX_WINDOW)
        {
            return Err(ConfigError::Window(w));
        }
        let needed = self.planned_requests();
        if self.max_requests < needed {
            return Err(ConfigError::Budget {
                given: self.max_requests,
                needed,
            });
        }
        Ok(Targets {
            endpoints,
            other,
            count,
        })
    }

    /// The targets without the budget and bound checks, for unit tests of the probe.
    #[cfg(test)]
    pub(crate) fn targets_unchecked_for_tests(&self) -> Targets {
        Targets {
            endpoints: vec![join(&self.base_url, "path", &self.path).unwrap()],
            other: None,
            count: None,
        }
    }
}

/// `base` + `path` by concatenation (not RFC 3986 resolution, which would drop a base path
/// prefix), then checked to still be on the base origin.
fn join(base_url: &Url, what: &'static str, path: &str) -> Result<Url, ConfigError> {
    let err = || ConfigError::Path {
        what,
        value: path.to_owned(),
    };
    if !path.starts_with('/') || path.starts_with("//") {
        return Err(err());
    }
    let base = base_url.as_str().trim_end_matches('/');
    let url = Url::parse(&format!("{base}{path}")).map_err(|_| err())?;
    if url.origin() != base_url.origin() {
        return Err(err());
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(base: &str) -> AuditConfig {
        AuditConfig::new(
            Url::parse(base).unwrap(),
            Method::POST,
            "/v1/p",
            serde_json::json!({}),
        )
    }

    #[test]
    fn joins_under_a_base_prefix() {
        let mut c = cfg("http://127.0.0.1:9/api/");
        c.other_endpoint = Some((Method::POST, "/v1/r?x=1".into()));
        c.count_url = Some("/v1/p".into());
        c.more_base_urls = vec![Url::parse("http://127.0.0.1:10/api").unwrap()];
        let t = c.targets().unwrap();
        assert_eq!(
            t.endpoints.iter().map(Url::as_str).collect::<Vec<_>>(),
            [
                "http://127.0.0.1:9/api/v1/p",
                "http://127.0.0.1:10/api/v1/p"
            ]
        );
        assert_eq!(
            t.other.unwrap().1[1].as_str(),
            "http://127.0.0.1:10/api/v1/r?x=1"
        );
        assert_eq!(t.count.unwrap().as_str(), "http://127.0.0.1:9/api/v1/p");
    }

    #[test]
    fn rejects_traffic_elsewhere() {
        let mut c = cfg("http://127.0.0.1:9");
        c.count_url = Some("http://example.invalid/v1/p".into());
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Path {
                what: "count URL",
                ..
            })
        ));
        let mut c = cfg("http://127.0.0.1:9");
        c.path = "//evil.invalid/x".into();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Path { what: "path", .. })
        ));
        let mut c = cfg("http://127.0.0.1:9");
        c.path = "v1/p".into();
        assert!(matches!(c.validate(), Err(ConfigError::Path { .. })));
        assert!(matches!(
            cfg("ftp://127.0.0.1:9").validate(),
            Err(ConfigError::BaseUrl(_))
        ));
        assert!(matches!(
            cfg("http://127.0.0.1:9/?q=1").validate(),
            Err(ConfigError::BaseUrl(_))
        ));
        let mut c = cfg("http://127.0.0.1:9");
        c.more_base_urls = vec![Url::parse("ftp://127.0.0.1:10").unwrap()];
        assert!(matches!(c.validate(), Err(ConfigError::BaseUrl(_))));
        // A count URL on another instance's origin is allowed, one elsewhere is not.
        let mut c = cfg("http://127.0.0.1:9");
        c.more_base_urls = vec![Url::parse("http://127.0.0.1:10").unwrap()];
        c.count_url = Some("http://127.0.0.1:10/v1/p".into());
        assert_eq!(c.validate(), Ok(()));
        c.count_url = Some("http://127.0.0.1:11/v1/p".into());
        assert!(matches!(c.validate(), Err(ConfigError::Path { .. })));
    }

    #[test]
    fn key_placements_and_webhook_secrets_are_checked() {
        let mut c = cfg("http://127.0.0.1:9");
        c.body = serde_json::json!({"id": "x", "data": {"object": {}}});
        for ok in ["/id", "/data/object/id", "/new"] {
            c.key_placement = KeyPlacement::JsonPointer(ok.into());
            assert_eq!(c.validate(), Ok(()), "{ok}");
        }
        for bad in ["id", "/missing/id", "/id/x"] {
            c.key_placement = KeyPlacement::JsonPointer(bad.into());
            assert_eq!(
                c.validate(),
                Err(ConfigError::KeyPointer(bad.into())),
                "{bad}"
            );
        }
        c.key_placement = KeyPlacement::default();
        c.webhook_secret = Some("whsec_not base64!".into());
        assert_eq!(c.validate(), Err(ConfigError::WebhookSecret("first")));
        c.webhook_secret = Some("whsec_".into());
        assert_eq!(c.validate(), Err(ConfigError::WebhookSecret("first")));
        c.webhook_secret = Some("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into());
        assert_eq!(c.validate(), Ok(()));
        c.second_webhook_secret = c.webhook_secret.clone();
        assert_eq!(c.validate(), Err(ConfigError::SecondWebhookSecret));
        c.second_webhook_secret = Some("whsec_dGhlIG90aGVyIHNlbmRlcidzIHNlY3JldA==".into());
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(KeyPlacement::default().to_string(), "Idempotency-Key");
    }

    #[test]
    fn bounds_are_enforced() {
        let mut c = cfg("http://127.0.0.1:9");
        assert_eq!(c.planned_requests(), 10 * 20 + 46);
        c.count_url = Some("/v1/p".into());
        assert_eq!(c.planned_requests(), 10 * 20 + 46 + 20 + 25);
        c.trials = 2;
        assert_eq!(c.planned_requests(), 2 * 20 + 46 + 4 + 25);
        c.max_requests = 50;
        assert_eq!(
            c.validate(),
            Err(ConfigError::Budget {
                given: 50,
                needed: 115
            })
        );
        c.max_requests = 115;
        assert_eq!(c.validate(), Ok(()));
        c.trials = 0;
        assert_eq!(c.validate(), Err(ConfigError::Trials(0)));
        c.trials = 101;
        assert_eq!(c.validate(), Err(ConfigError::Trials(101)));
        c.trials = 1;
        c.concurrency = 1;
        assert_eq!(c.validate(), Err(ConfigError::Concurrency(1)));
        c.concurrency = 2;
        c.window = Some(Duration::from_secs(601));
        assert_eq!(
            c.validate(),
            Err(ConfigError::Window(Duration::from_secs(601)))
        );
        c.window = Some(Duration::from_secs(600));
        c.auth = Some("Bearer a".into());
        c.second_auth = Some("Bearer a".into());
        assert_eq!(c.validate(), Err(ConfigError::SameCredentials));
        c.second_auth = Some("Bearer\nb".into());
        assert_eq!(c.validate(), Err(ConfigError::Credential("second")));
        c.second_auth = Some("Bearer b".into());
        c.same_account_auth = Some("Bearer b".into());
        assert_eq!(c.validate(), Err(ConfigError::SameAccountCredentials));
        c.same_account_auth = Some("Bearer a".into());
        assert_eq!(c.validate(), Err(ConfigError::SameAccountCredentials));
        c.same_account_auth = Some("Bearer a2".into());
        assert_eq!(c.validate(), Ok(()));
    }
}
