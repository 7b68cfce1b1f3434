//! The request loop of one logical call through [`OncelyRetry`]: check or mint the key, send
//! attempts, classify their outcomes, and retry, return or give up (see the
//! [module docs](super) for the steps).

use std::error::Error as StdError;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::time::Duration;

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use super::body::inspect_problem;
use super::builder::OncelyRetry;
use super::guard::{ActiveCall, ActiveInner, Refused};
use crate::classify::{
    Outcome, Phase, RequestFacts, ResponseClassifier, ResponseFacts, TransportFailure, Verdict,
    classify, classify_with, needs_problem_body,
};
use crate::driver::RetryLog;
use crate::error::{BoxError, LastAnswer, RetryError, StopReason};
use crate::key::{IDEMPOTENCY_KEY, check_key, needs_key};
use crate::options::CallOptions;
use crate::policy::RetryPolicy;
use crate::retry_after::retry_after_from_headers;
use crate::schedule::CallState;

/// The timeout the middleware itself enforced on an attempt.
#[derive(Debug, thiserror::Error)]
#[error("attempt timed out after {} ms", .0.as_millis())]
struct AttemptTimedOut(Duration);

/// One attempt's result, classified.
enum Attempt {
    Response {
        response: Response,
        verdict: Verdict,
        hint: Option<Duration>,
    },
    Failed {
        error: BoxError,
        verdict: Verdict,
    },
    /// The call ends here with this reason.
    Stop {
        reason: StopReason,
        error: Option<BoxError>,
    },
    /// An inner instance of ours already decided: its error goes to the caller unchanged.
    Decided(reqwest_middleware::Error),
}

fn transport_of(e: &reqwest::Error) -> (Phase, TransportFailure) {
    // `is_connect` covers refused connections, DNS failures and reqwest's connect timeout:
    // all before any request byte was written.
    if e.is_connect() {
        (Phase::BeforeSend, TransportFailure::Connect)
    } else if e.is_timeout() {
        (Phase::AfterSend, TransportFailure::Timeout)
    } else if e.is_request() {
        (Phase::AfterSend, TransportFailure::Reset)
    } else {
        (Phase::BeforeSend, TransportFailure::Other)
    }
}

/// The first error of type `T` in an error's chain, looking inside the
/// `reqwest_middleware::Error` values other layers wrap (whose `source` skips a level).
fn find_in_chain<'a, T: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        current = match e.downcast_ref::<reqwest_middleware::Error>() {
            Some(reqwest_middleware::Error::Reqwest(r)) => Some(r as &(dyn StdError + 'static)),
            Some(reqwest_middleware::Error::Middleware(a)) => {
                let inner: &(dyn StdError + 'static) = a.as_ref();
                Some(inner)
            }
            None => e.source(),
        };
    }
    None
}

#[async_trait::async_trait]
impl Middleware for OncelyRetry {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        if extensions.get::<ActiveCall>().is_some() {
            // An outer instance of ours runs this call's retry loop: one attempt of it is one
            // pass through here, or the two loops would multiply.
            tracing::debug!("oncely: an outer OncelyRetry is retrying this call; passing through");
            return next.run(req, extensions).await;
        }
        let options = extensions.get::<CallOptions>();
        let (policy, mint) = CallOptions::apply(options, self.core.policy);
        let classifier = options
            .and_then(|o| o.classifier.clone())
            .or_else(|| self.classifier.clone());
        let call = self.core.start_call(policy.deadline());
        let active = ActiveCall(Arc::new(ActiveInner {
            sends: AtomicU32::new(0),
            max_sends: policy.max_attempts(),
            in_flight: AtomicU32::new(0),
            deadline: *call.deadline(),
            timer: self.core.timer.clone(),
            last_status: AtomicU16::new(0),
        }));
        extensions.insert(active.clone());
        let result = self
            .run(
                req, extensions, next, policy, mint, classifier, call, &active,
            )
            .await;
        extensions.remove::<ActiveCall>();
        result
    }
}

impl OncelyRetry {
    fn give_up(
        &self,
        reason: StopReason,
        call: &CallState,
        last_status: Option<StatusCode>,
        key: &Option<String>,
        source: Option<BoxError>,
    ) -> reqwest_middleware::Error {
        reqwest_middleware::Error::middleware(self.core.give_up(
            reason,
            call,
            last_status.map(LastAnswer::Http),
            key.as_deref(),
            source,
        ))
    }

    #[allow(clippy::too_many_arguments)]
    async fn run(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
        policy: RetryPolicy,
        mint: bool,
        classifier: Option<ResponseClassifier>,
        mut call: CallState,
        active: &ActiveCall,
    ) -> reqwest_middleware::Result<Response> {
        // A caller's key is checked with the server's rules before anything is sent.
        let caller_key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Err(e) = check_key(req.headers()) {
            return Err(self.give_up(
                StopReason::InvalidIdempotencyKey(e),
                &call,
                None,
                &caller_key,
                None,
            ));
        }
        // One key per logical call, set on the request before any clone: every attempt carries it.
        if mint && needs_key(req.method()) && caller_key.is_none() {
            match self.core.mint_key() {
                Ok(value) => {
                    req.headers_mut().insert(IDEMPOTENCY_KEY, value);
                }
                Err((e, minted)) => {
                    return Err(self.give_up(
                        StopReason::InvalidIdempotencyKey(e),
                        &call,
                        None,
                        &Some(minted),
                        None,
                    ));
                }
            }
        }
        let has_key = req.headers().contains_key(IDEMPOTENCY_KEY);
        let key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let method = req.method().clone();
        let facts = RequestFacts {
            method: &method,
            has_key,
        };
        let path = req.url().path().to_owned();
        let attempt_timeout = req.timeout().map_or(policy.attempt_timeout(), |t| {
            (*t).min(policy.attempt_timeout())
        });
        let replayable = req.try_clone().is_some();
        let mut original = Some(req);
        let budget = self.core.budget.as_deref();
        let timer = &self.core.timer;

        loop {
            let started = timer.now();
            let limit = call.deadline().attempt_limit(started, attempt_timeout);
            if limit.is_zero() {
                let reason = StopReason::DeadlineExhausted {
                    deadline: policy.deadline(),
                };
                return Err(self.give_up(reason, &call, None, &key, None));
            }
            let this_attempt = if replayable {
                original.as_ref().and_then(Request::try_clone)
            } else {
                original.take()
            };
            let Some(mut this_attempt) = this_attempt else {
                return Err(self.give_up(StopReason::BodyNotReplayable, &call, None, &key, None));
            };
            *this_attempt.timeout_mut() = Some(limit);
            self.core.record_attempt(&mut call);
            let sends_before = active.sends();

            let result =
                tokio::time::timeout(limit, next.clone().run(this_attempt, extensions)).await;
            let attempt = match result {
                Err(_) => Attempt::Failed {
                    error: Box::new(AttemptTimedOut(limit)),
                    verdict: classify(
                        &facts,
                        &Outcome::Transport {
                            phase: Phase::AfterSend,
                            failure: TransportFailure::Timeout,
                        },
                        policy.retry_500(),
                    ),
                },
                Ok(Err(error)) => Self::classify_error(error, &facts, &policy),
                Ok(Ok(response)) => {
                    let status = response.status();
                    let hint = retry_after_from_headers(response.headers(), timer.system_now());
                    let (response, problem) = if needs_problem_body(status) {
                        // Reading the body is part of the attempt: bounded by what is left of it.
                        let spent = timer.now().saturating_duration_since(started);
                        inspect_problem(response, limit.saturating_sub(spent)).await
                    } else {
                        (response, None)
                    };
                    let verdict = classify_with(
                        &facts,
                        &Outcome::Response(ResponseFacts::new(
                            status,
                            response.headers(),
                            problem.as_ref(),
                        )),
                        policy.retry_500(),
                        classifier.as_ref(),
                    );
                    Attempt::Response {
                        response,
                        verdict,
                        hint,
                    }
                }
            };

            // More requests went out than this attempt: a retry layer below us re-sent it.
            let sent = active.sends().saturating_sub(sends_before);
            let attempt = match attempt {
                Attempt::Response {
                    verdict: Verdict::Done,
                    ..
                } => attempt,
                other if sent > 1 => {
                    let error = match other {
                        Attempt::Failed { error, .. } => Some(error),
                        Attempt::Stop { error, .. } => error,
                        Attempt::Decided(e) => Some(Box::new(e) as BoxError),
                        Attempt::Response { .. } => None,
                    };
                    Attempt::Stop {
                        reason: StopReason::NestedRetryLayer {
                            requests: active.sends(),
                        },
                        error,
                    }
                }
                other => other,
            };

            let (reason, hint, last_status, source) = match attempt {
                Attempt::Response {
                    response,
                    verdict: Verdict::Done,
                    ..
                } => {
                    if !response.status().is_server_error() {
                        call.on_success(budget);
                    }
                    return Ok(response);
                }
                Attempt::Response {
                    response,
                    verdict: Verdict::Retry(reason),
                    hint,
                } => (reason, hint, Some(response.status()), None),
                Attempt::Response { response, .. } => {
                    // Responses only classify as Done or Retry; keep the response regardless.
                    return Ok(response);
                }
                Attempt::Failed {
                    error,
                    verdict: Verdict::Retry(reason),
                } => (reason, None, None, Some(error)),
                Attempt::Failed {
                    error,
                    verdict: Verdict::OutcomeUnknown,
                } => {
                    return Err(self.give_up(
                        StopReason::OutcomeUnknown,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
                Attempt::Failed { error, .. } => {
                    return Err(self.give_up(
                        StopReason::NotRetryable,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
                Attempt::Stop { reason, error } => {
                    let mut call = call;
                    if let StopReason::NestedRetryLayer { requests } = reason {
                        call.set_attempts(requests.max(call.attempts()));
                    }
                    return Err(self.give_up(reason, &call, active.last_status(), &key, error));
                }
                Attempt::Decided(error) => return Err(error),
            };

            if !replayable {
                return Err(self.give_up(
                    StopReason::BodyNotReplayable,
                    &call,
                    last_status,
                    &key,
                    source,
                ));
            }
            let log = RetryLog {
                method: method.as_str(),
                path: &path,
                error: source.as_ref().map(|e| e.to_string()),
                key: key.as_deref(),
            };
            if reason.is_in_flight() {
                active.0.in_flight.fetch_add(1, Ordering::AcqRel);
            }
            if let Err(stop) = self
                .core
                .wait_to_retry(&mut call, &policy, reason, hint, log)
                .await
            {
                return Err(self.give_up(stop, &call, last_status, &key, source));
            }
        }
    }

    /// Classifies an attempt that ended in an error, by its root cause.
    fn classify_error(
        error: reqwest_middleware::Error,
        facts: &RequestFacts<'_>,
        policy: &RetryPolicy,
    ) -> Attempt {
        let transport = |e: &reqwest::Error| {
            let (phase, failure) = transport_of(e);
            classify(
                facts,
                &Outcome::Transport { phase, failure },
                policy.retry_500(),
            )
        };
        match error {
            reqwest_middleware::Error::Reqwest(e) => Attempt::Failed {
                verdict: transport(&e),
                error: Box::new(e),
            },
            reqwest_middleware::Error::Middleware(inner) => {
                if inner.downcast_ref::<RetryError>().is_some() {
                    return Attempt::Decided(reqwest_middleware::Error::Middleware(inner));
                }
                // The guard's own refusal, or one a layer between wrapped (reqwest-retry does).
                let refused = find_in_chain::<Refused>(inner.as_ref())
                    .map(|r| matches!(r, Refused::Deadline));
                // Another layer's error around a transport error: classified by that root cause.
                let verdict = find_in_chain::<reqwest::Error>(inner.as_ref())
                    .map_or(Verdict::NotRetryable, transport);
                let error: BoxError = inner.into();
                match refused {
                    Some(true) => Attempt::Stop {
                        reason: StopReason::DeadlineExhausted {
                            deadline: policy.deadline(),
                        },
                        error: Some(error),
                    },
                    Some(false) => Attempt::Stop {
                        reason: StopReason::NestedRetryLayer {
                            requests: policy.max_attempts(),
                        },
                        error: Some(error),
                    },
                    None => Attempt::Failed { error, verdict },
                }
            }
        }
    }
}
