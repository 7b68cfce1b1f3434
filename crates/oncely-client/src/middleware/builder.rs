//! [`OncelyRetry`]: the reqwest-middleware face's type, its builder methods and the clients it
//! builds (the request loop is in `call.rs`).

use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};

use super::guard::SendGuard;
use crate::classify::ResponseClassifier;
use crate::driver::Driver;
use crate::policy::RetryPolicy;

/// The retry middleware for `reqwest_middleware`.
///
/// Cloning is cheap and shares the budget, the metrics and the random source: keep a clone to
/// read [`OncelyRetry::metrics`] after handing one to the client builder.
#[derive(Clone, Debug)]
pub struct OncelyRetry {
    /// The retry core this transport shares with the gRPC one ([`crate::driver`]).
    pub(super) core: Driver,
    pub(super) classifier: Option<ResponseClassifier>,
}

impl Default for OncelyRetry {
    fn default() -> Self {
        Self::new(RetryPolicy::new())
    }
}

impl OncelyRetry {
    /// A middleware with this policy, a fresh budget (if the policy enables one), fresh metrics,
    /// UUID v4 keys, tokio's timer and an OS-seeded random source.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            core: Driver::new(policy),
            classifier: None,
        }
    }

    crate::driver::core_methods!();

    /// A response hook for every call (a [`CallOptions::with_classifier`](crate::CallOptions::with_classifier) replaces it for one
    /// call). It adds a signal; the allowlist defaults stay (see [`crate::classify`]).
    pub fn with_classifier(mut self, classifier: ResponseClassifier) -> Self {
        self.classifier = Some(classifier);
        self
    }

    /// The guard to put last in a middleware chain built by hand (see the
    /// [module docs](super)).
    pub fn guard(&self) -> SendGuard {
        SendGuard
    }

    /// A reqwest client builder with the policy's connect timeout
    /// ([`RetryPolicy::connect_timeout`], default 3 s), for clients you want to configure
    /// further before [`OncelyRetry::wrap`].
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        reqwest::Client::builder().connect_timeout(self.core.policy.connect_timeout())
    }

    /// A reqwest client with the policy's connect timeout, wrapped with this middleware first
    /// and its [`SendGuard`] last.
    ///
    /// # Errors
    ///
    /// The `reqwest::Error` of `reqwest::ClientBuilder::build` (a TLS backend that cannot start).
    pub fn client(self) -> Result<ClientWithMiddleware, reqwest::Error> {
        let client = self.client_builder().build()?;
        Ok(self.wrap(client))
    }

    /// Wraps a reqwest client with this middleware first and its [`SendGuard`] last.
    ///
    /// The client's own settings stay: build it with [`OncelyRetry::client_builder`] (or set
    /// `connect_timeout` yourself) so that a connect that hangs is reported as "not sent" and
    /// retried, rather than as a timeout of the whole attempt.
    pub fn wrap(self, client: reqwest::Client) -> ClientWithMiddleware {
        let guard = self.guard();
        ClientBuilder::new(client).with(self).with(guard).build()
    }
}
