//! Boxing: request and response bodies into the layer's [`Body`], and the inner service's
//! future into a `Send` box.

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Full};
use oncely_core::response::{Body, BoxError};
use std::future::Future;
use tower::Service;

/// Boxes a request body of any data type, each frame copied into `Bytes`.
pub(crate) fn box_body<B>(body: B) -> Body
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    Body::new(
        body.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
            .map_err(Into::into),
    )
}

/// Boxes a response body whose frames are already `Bytes`: unlike [`box_body`] this keeps the
/// body's size hint, so a response of known length is still sent with `Content-Length`
/// (the same framing as its replay), not chunked.
pub(crate) fn box_bytes_body<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    Body::new(body.map_err(Into::into))
}

type BoxedCall<R, E> = std::pin::Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'static>>;

/// Calls the inner service and boxes its future as `Send`, proven here where every lifetime
/// is known (inside an `async fn`, the compiler cannot prove `S::Future: Send` for the erased
/// lifetimes of its state, rust-lang/rust#110338).
pub(crate) fn call_boxed<S, R>(inner: &mut S, req: R) -> BoxedCall<S::Response, S::Error>
where
    S: Service<R>,
    S::Future: Send + 'static,
{
    Box::pin(inner.call(req))
}

/// A body of bytes already in memory.
pub(crate) fn full_body(bytes: Bytes) -> Body {
    Body::new(Full::new(bytes).map_err(|never| match never {}))
}
