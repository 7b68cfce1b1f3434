//! What one request is: its key, its credential, where it goes, and any extra headers.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use reqwest::Url;

/// How the `Idempotency-Key` header is sent.
#[derive(Debug, Clone)]
pub(crate) enum Key {
    /// No key header at all.
    Absent,
    /// One key header with this value (any bytes a header value may carry).
    One(HeaderValue),
    /// The header twice, with these two values.
    Repeated(HeaderValue, HeaderValue),
}

impl Key {
    /// A fresh, valid key: `oncely-audit-<uuid v4>` (49 visible ASCII characters).
    pub(crate) fn fresh() -> Self {
        Self::One(fresh_value())
    }
}

/// A fresh, valid key value.
pub(crate) fn fresh_value() -> HeaderValue {
    HeaderValue::try_from(format!("oncely-audit-{}", uuid::Uuid::new_v4()))
        .expect("a uuid is a valid header value")
}

/// Which credential a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Cred {
    /// [`AuditConfig::auth`](crate::audit::AuditConfig::auth).
    First,
    /// [`AuditConfig::second_auth`](crate::audit::AuditConfig::second_auth).
    Second,
    /// [`AuditConfig::same_account_auth`](crate::audit::AuditConfig::same_account_auth).
    SameAccount,
}

impl Cred {
    /// The credential's slot among the configured ones (first, second, same-account).
    pub(crate) fn index(self) -> usize {
        match self {
            Self::First => 0,
            Self::Second => 1,
            Self::SameAccount => 2,
        }
    }

    /// Whose cookie jar a credential uses: a refreshed token is the first caller's client
    /// again, so it shares the first caller's jar.
    pub(crate) fn jar(self) -> usize {
        match self {
            Self::Second => 1,
            Self::First | Self::SameAccount => 0,
        }
    }

    /// How evidence lines name the credential (`second credential`): never its value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::First => "first credential",
            Self::Second => "second credential",
            Self::SameAccount => "same-account credential",
        }
    }
}

/// Where a request goes.
#[derive(Debug, Clone)]
pub(crate) enum Dest {
    /// The audited endpoint, on the next base URL in turn.
    Endpoint,
    /// The other endpoint, on the next base URL in turn.
    Other,
    /// This URL (the count URL, a `Location`).
    Url(Url),
}

/// One request to send.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) method: Method,
    pub(crate) dest: Dest,
    pub(crate) key: Key,
    pub(crate) body: Option<Bytes>,
    pub(crate) cred: Cred,
    /// Whose cookie jar the request presents (when cookies are on): usually `cred`'s own.
    pub(crate) cookies_of: Cred,
    /// Extra request headers (the client-bypass check's markers).
    pub(crate) extra: Vec<(HeaderName, HeaderValue)>,
}

impl Probe {
    /// The same probe under another credential (with that credential's own cookies).
    pub(crate) fn with_cred(mut self, cred: Cred) -> Self {
        self.cred = cred;
        self.cookies_of = cred;
        self
    }
}
