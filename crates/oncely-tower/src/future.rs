//! [`ResponseFuture`]: the future an [`Idempotency`](crate::Idempotency) service returns.

use http::Response;
use oncely_core::response::Body;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type Inner<E> = Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send + 'static>>;

/// The response future of [`Idempotency`](crate::Idempotency): resolves to the handler's
/// response, a replay, or a problem response; errors only with the inner service's error.
///
/// Dropping it (a client that disconnects or times out) does **not** cancel a claimed handler:
/// it runs on its own task to completion, with its lease heartbeat, and its response is stored,
/// so the client's retry gets the replay instead of waiting out the lease. (Only a process that
/// dies leaves its key in flight until the lease lapses; a retry then takes it over and resumes
/// at the recovery point.)
pub struct ResponseFuture<E> {
    inner: Inner<E>,
}

impl<E> ResponseFuture<E> {
    pub(crate) fn new(inner: Inner<E>) -> Self {
        Self { inner }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
