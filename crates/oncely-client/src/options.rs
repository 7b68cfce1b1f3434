//! Per-call overrides of the policy, shared by both transports: a [`CallOptions`] request
//! extension is read by the reqwest middleware ([`crate::middleware`]) and by the gRPC layer
//! (`crate::grpc`) alike.

use std::time::Duration;

use crate::classify::ResponseClassifier;
use crate::policy::RetryPolicy;

/// Per-call overrides, passed as a request extension
/// (`reqwest_middleware::RequestBuilder::with_extension`).
///
/// ```no_run
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) -> Result<(), reqwest_middleware::Error> {
/// use std::time::Duration;
/// use oncely_client::CallOptions;
/// use oncely_client::classify::ResponseClassifier;
///
/// let response = client
///     .post("http://127.0.0.1:8080/report")
///     .with_extension(
///         CallOptions::new()
///             .with_deadline(Duration::from_secs(5))
///             .with_key_minting(false) // this endpoint is naturally idempotent
///             .with_classifier(ResponseClassifier::new(|r| {
///                 // A signal the SDK does not know; `None` leaves it to the defaults.
///                 r.headers.get("x-acme-busy").map(|_| true)
///             })),
///     )
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) mint_keys: Option<bool>,
    pub(crate) classifier: Option<ResponseClassifier>,
}

impl CallOptions {
    /// No overrides.
    pub const fn new() -> Self {
        Self {
            deadline: None,
            max_attempts: None,
            mint_keys: None,
            classifier: None,
        }
    }

    /// This call's overall deadline instead of the policy's.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// This call's total attempts instead of the policy's (1 disables retries for it).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Whether this call gets a key minted (a `POST` or `PATCH` without one) instead of the
    /// policy's choice ([`RetryPolicy::with_key_minting`], default `true`). Without a key, an
    /// ambiguous failure of such a call ends as "outcome unknown" instead of a safe retry.
    pub fn with_key_minting(mut self, mint: bool) -> Self {
        self.mint_keys = Some(mint);
        self
    }

    /// The policy and the key-minting choice of one call: `policy` with these overrides.
    pub(crate) fn apply(options: Option<&Self>, policy: RetryPolicy) -> (RetryPolicy, bool) {
        let mut policy = policy;
        let mut mint = policy.mints_keys();
        if let Some(options) = options {
            if let Some(d) = options.deadline {
                policy = policy.with_deadline(d);
            }
            if let Some(n) = options.max_attempts {
                policy = policy.with_max_attempts(n);
            }
            if let Some(m) = options.mint_keys {
                mint = m;
            }
        }
        (policy, mint)
    }

    /// This call's response hook instead of the middleware's ([`OncelyRetry::with_classifier`](crate::OncelyRetry::with_classifier));
    /// it adds a signal, read after the server's own and before the allowlist (see
    /// [`crate::classify`]).
    pub fn with_classifier(mut self, classifier: ResponseClassifier) -> Self {
        self.classifier = Some(classifier);
        self
    }
}
