//! How the completer re-drives an abandoned request ([`Redrive`], failing with
//! [`RedriveError`]), and how hard it tries before it marks the record for a person
//! ([`RedrivePolicy`]).

use async_trait::async_trait;
use oncely_core::Record;
use std::time::Duration;

/// Why a re-drive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// The record kept no request (its claim carried `request: None`), so there is nothing to
    /// re-drive.
    #[error("the record kept no request to re-drive")]
    NoRequest,
    /// The service could not be reached or did not answer.
    #[error("the service could not be reached: {0}")]
    Unreachable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The scope's credentials could not be obtained.
    #[error("no credentials for scope {0}")]
    NoCredentials(String),
}

/// Re-drives one abandoned request through the service with the same key.
///
/// The CLI's implementation sends [`Record::request`] over HTTP to the server with the same
/// `Idempotency-Key` and the scope's credentials; the server's layer then takes the key over
/// (the lease lapsed), resumes at the recovery point, and stores the final response.
#[async_trait]
pub trait Redrive: Send + Sync {
    /// Sends the request; returns the HTTP status the service answered.
    ///
    /// # Errors
    ///
    /// [`RedriveError`] when the request could not be sent or answered.
    async fn redrive(&self, record: &Record) -> Result<u16, RedriveError>;
}

/// How hard the completer tries before it gives up on a record and marks it for a person.
///
/// Attempt `n` (1-based) that leaves the record still in flight is followed by a pause of
/// `min(backoff_cap, backoff_base * 2^(n-1))` before attempt `n + 1` may start: with the
/// defaults 30 s, 1 min, 2 min, 4 min. The pause runs from the start of the attempt, and a
/// record is also only listed once its lease lapsed at least the completer's grace ago, so the
/// real pause is the longer of the two. When `max_attempts` attempts have not finished it, the
/// next pass marks it for a person ([`RedriveNote::Mark`](oncely_core::RedriveNote::Mark))
/// instead of re-driving it again.
///
/// The pauses are not jittered: every attempt is one compare-and-set on the record
/// ([`Maintenance::note_redrive`](oncely_core::Maintenance::note_redrive)), so several
/// completers never re-drive one record twice, and there is no herd of clients to spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedrivePolicy {
    /// The re-drives one record gets before it is marked for a person. Default
    /// [`RedrivePolicy::DEFAULT_MAX_ATTEMPTS`] (5). 0 marks every abandoned record at once.
    pub max_attempts: u32,
    /// The pause after the first attempt. Default [`RedrivePolicy::DEFAULT_BACKOFF_BASE`]
    /// (30 seconds).
    pub backoff_base: Duration,
    /// The longest pause. Default [`RedrivePolicy::DEFAULT_BACKOFF_CAP`] (10 minutes).
    pub backoff_cap: Duration,
}

impl RedrivePolicy {
    /// The default number of re-drives per record: 5.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;
    /// The default pause after the first attempt: 30 seconds.
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(30);
    /// The default longest pause: 10 minutes.
    pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(600);

    /// A policy with these attempts and pauses.
    pub fn new(max_attempts: u32, backoff_base: Duration, backoff_cap: Duration) -> Self {
        Self {
            max_attempts,
            backoff_base,
            backoff_cap,
        }
    }

    /// The pause after attempt `attempt` (1-based): `min(cap, base * 2^(attempt-1))`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.backoff_base
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.backoff_cap)
    }
}

impl Default for RedrivePolicy {
    fn default() -> Self {
        Self::new(
            Self::DEFAULT_MAX_ATTEMPTS,
            Self::DEFAULT_BACKOFF_BASE,
            Self::DEFAULT_BACKOFF_CAP,
        )
    }
}
