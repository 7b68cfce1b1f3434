//! A claimed request's execution: the handler runs, then the layer ends the claim (stores the
//! response, releases the key, or suspends the request at its recovery point).

use super::detached::Detached;
use crate::body::{box_bytes_body, call_boxed};
use crate::claim::ClaimState;
use crate::claimer::ClaimerKind;
use crate::config::Config;
use crate::context::{HandlerOutcome, IdempotencyContext};
use crate::drain::{Drain, Running};
use crate::metrics::Counter;
use crate::phase::{PhaseFailed, ResponseCommitted};
use crate::store_call::timed;
use bytes::Bytes;
use http::{Request, Response};
use oncely_core::response::{
    Body, BoxError, IDEMPOTENT_REPLAYED, capture_response, replay_response,
};
use oncely_core::{ErrorCode, Problem, StoreError};
use std::sync::Arc;
use tower::Service;
use tracing::Instrument as _;

/// A claimed request's execution, boxed as `dyn Future + Send` so that the caller's future need
/// not re-prove `Send` for its output (a rustc limitation with higher-ranked lifetimes in async
/// fns).
type Execution<E> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<Body>, E>> + Send>>;

/// [`execute`], polled inline by the request's future, detached onto a task of its own if that
/// future is dropped first (see the caller for why). The execution keeps the request's tracing
/// span, so its logs (and the handler's) say which request they belong to.
pub(super) fn detached_execute<S, ResBody>(
    config: Arc<Config>,
    inner: S,
    req: Request<Body>,
    claim: Arc<ClaimState>,
    running: Running,
) -> Detached<Result<Response<Body>, S::Error>>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let execution: Execution<S::Error> = Box::pin(
        async move {
            let res = execute(&config, inner, req, &claim).await;
            // The key's turn in this process ends with the execution at the latest (it was
            // passed on earlier if the claim committed before).
            claim.release_hold();
            // Registered for a graceful shutdown until the execution ends, wherever it runs.
            drop(running);
            res
        }
        .in_current_span(),
    );
    Detached::new(execution)
}

/// Runs the claimed request, then ends its claim.
async fn execute<S, ResBody>(
    config: &Arc<Config>,
    mut inner: S,
    req: Request<Body>,
    claim: &Arc<ClaimState>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    if config.drain.is_draining() {
        // Claimed, but the server began shutting down before the handler started: nothing
        // ran, so the key is released at once and the client retries elsewhere. (A claim that
        // rides in a transaction is undone by dropping the request, which rolls it back.)
        if claim.is_committed() {
            release(config, claim).await;
        }
        return Ok(Drain::shutting_down(
            &*config.dialect,
            config.policy.retry_after_secs,
        ));
    }
    let res = match call_boxed(&mut inner, req).await {
        Ok(r) => r,
        Err(e) => {
            // The service failed without a response: its effects are unknown, so the key is
            // left in flight and a retry takes it over once the lease lapses. Dropping the
            // heartbeat stops it (no await here: the error is returned as is).
            claim.drop_heartbeat();
            tracing::warn!(scope = %claim.id().scope, key = %claim.id().key, "inner service failed; the key stays in flight until its lease lapses");
            return Err(e);
        }
    };
    let res = res.map(box_bytes_body);
    if matches!(claim.claimer(), ClaimerKind::Transactional { .. }) {
        claim.stop_heartbeat().await;
        return Ok(transactional_end(config, claim, res).await);
    }
    Ok(store_end(config, claim, res).await)
}

/// After the handler of a store's claim: store its response, or release the key, or suspend
/// the request at its recovery point.
async fn store_end(config: &Config, claim: &ClaimState, res: Response<Body>) -> Response<Body> {
    let (parts, body) = res.into_parts();
    // What the store policy judges: the HTTP status, or what the dialect reads from the head
    // (a gRPC status sent in the headers); asked again with the trailers below.
    let status = config
        .dialect
        .effective_status(parts.status, &parts.headers, &[]);
    let suspend_it = match parts.extensions.get::<HandlerOutcome>() {
        Some(HandlerOutcome::NotExecuted) => Some(false),
        Some(HandlerOutcome::Suspended) => Some(true),
        _ if !config.policy.store_policy.stores(status.as_u16(), false) => Some(false),
        _ => None,
    };
    if let Some(suspend_it) = suspend_it {
        claim.stop_heartbeat().await;
        if suspend_it {
            suspend(config, claim).await;
        } else {
            release(config, claim).await;
        }
        return Response::from_parts(parts, body);
    }
    let (res, stored, _failed) = capture_response(
        Response::from_parts(parts, body),
        config.policy.max_response_bytes,
    )
    .await;
    // Stop renewing before completing: a renew racing the completion would be fenced.
    claim.stop_heartbeat().await;
    let status = config
        .dialect
        .effective_status(res.status(), res.headers(), &stored.trailers);
    if !config.policy.store_policy.stores(status.as_u16(), false) {
        // Only known from the trailers (a gRPC status sent after the messages): a status the
        // policy does not keep releases the key, as it would have before the body.
        release(config, claim).await;
        return res;
    }
    if !stored.body_retained {
        config.metrics.inc(Counter::not_retained);
    }
    let (id, token) = (claim.id(), claim.token());
    match timed(
        config,
        config
            .store
            .complete(id, token, stored, config.policy.retention),
    )
    .await
    {
        Ok(()) => {}
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %id.scope, key = %id.key, token = token.0, "completion fenced: this request's lease lapsed and another request took the key over; its record stands");
        }
        Err(e) => {
            tracing::error!(scope = %id.scope, key = %id.key, token = token.0, error = %e, "could not store the response of an executed request; the key stays in flight until its lease lapses, then a retry takes it over");
        }
    }
    res
}

/// After the handler of a transactional claim: the record is the transaction's business, so
/// the layer stores nothing. It sends the response the transaction committed (the one every
/// replay sends, even if the handler returned another); and for a handler that did not
/// complete the record, it waits for the rollback of a transaction the handler dropped, ends
/// what committed (suspended at its recovery point, or released), and says what is true.
async fn transactional_end(
    config: &Config,
    claim: &ClaimState,
    res: Response<Body>,
) -> Response<Body> {
    if let Some(committed) = claim.committed_response() {
        if res.extensions().get::<ResponseCommitted>().is_some() {
            return res;
        }
        // The handler committed one response and returned another: the caller gets what is
        // stored, what every retry will get.
        tracing::error!(scope = %claim.id().scope, key = %claim.id().key, status = %res.status(), "the handler returned another response than the one it committed (Tx::commit); sending the committed one, which every retry replays");
        let mut sent = replay_response(&committed);
        sent.headers_mut().remove(IDEMPOTENT_REPLAYED);
        return sent;
    }
    let ended_behind = claim.settle().await;
    // The HTTP status, or what the dialect reads from the head (a gRPC status sent in it).
    let status = config
        .dialect
        .effective_status(res.status(), res.headers(), &[]);
    let lost_writes = status.is_success() || status.is_redirection();
    if lost_writes {
        tracing::error!(scope = %claim.id().scope, key = %claim.id().key, %status, "the handler answered success without completing its idempotent transaction (Tx::commit): its writes were rolled back and nothing was stored; answering 500 instead");
    }
    let recovery_point = claim.recovery_point();
    if !claim.is_committed() {
        // The claim rode in the handler's transaction, which did not commit: the rollback
        // undid the claim with the writes, and the key is free again.
    } else if recovery_point.is_some() {
        suspend(config, claim).await;
    } else {
        release(config, claim).await;
    }
    if ended_behind {
        tracing::error!(scope = %claim.id().scope, key = %claim.id().key, token = claim.token().0, "the handler ended its idempotent transaction itself (COMMIT or ROLLBACK through the Tx): nothing of this phase is recorded, and the key is not released (writes may have committed outside the phase)");
        return config.dialect.render(&crate::phase::ended_problem());
    }
    if let (Some(failed), Some(rp)) = (res.extensions().get::<PhaseFailed>(), &recovery_point) {
        return config.dialect.render(&failed.stopped_answer(rp));
    }
    if lost_writes {
        let p = Problem::from_code(
            ErrorCode::HandlerDidNotCommit,
            "the server answered success without committing this request's transaction, so nothing of its last step was kept: a server bug, not retried automatically; tell the API's operator",
        );
        return config.dialect.render(&p);
    }
    res
}

/// Releases the claim (nothing executed, or a status the store policy does not keep).
async fn release(config: &Config, claim: &ClaimState) {
    let (id, token) = (claim.id(), claim.token());
    match timed(config, config.store.release(id, token)).await {
        Ok(()) => config.metrics.inc(Counter::released),
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %id.scope, key = %id.key, token = token.0, "release fenced: another request took the key over");
        }
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not release the key; it stays in flight until its lease lapses");
        }
    }
}

/// Keeps the record in flight with its recovery point but lets its lease lapse now (a 0 ms
/// renewal, which every store raises to 1 millisecond), so the next retry resumes at once.
async fn suspend(config: &Config, claim: &ClaimState) {
    let (id, token) = (claim.id(), claim.token());
    match timed(
        config,
        config.store.renew(id, token, std::time::Duration::ZERO),
    )
    .await
    {
        Ok(_) => {
            tracing::info!(scope = %id.scope, key = %id.key, recovery_point = ?claim.recovery_point(), "request suspended at its recovery point; the next retry resumes it");
        }
        Err(StoreError::Fenced) => {
            config.metrics.inc(Counter::fencing_rejections);
            tracing::warn!(scope = %id.scope, key = %id.key, token = token.0, "suspend fenced: another request took the key over");
        }
        Err(e) => {
            tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "could not cut the lease short; the key stays in flight until its lease lapses");
        }
    }
}

/// What the layer hands a claimed request's handler: its context, in the request extensions.
pub(super) fn context(claim: &Arc<ClaimState>) -> IdempotencyContext {
    IdempotencyContext::new(Arc::clone(claim))
}
