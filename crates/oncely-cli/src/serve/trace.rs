//! Request ids and the trace layer, from tower-http: every request gets an `x-request-id` (the
//! client's own if it sent one, else a fresh UUID v4), a `request` span carrying it (with the
//! method and the path) for everything logged while it runs, and the same id on its response.
//!
//! The idempotency layer runs a claimed handler inline in the request's future (and keeps the
//! span if it has to finish the handler on a task of its own), so the handler's logs, the
//! layer's and the phases' all carry the request id. A handler reads it with
//! `Extension<tower_http::request_id::RequestId>`.
//!
//! The id is added outside the idempotency layer: a stored response never holds the first
//! request's id, and a replay answers with the id of the request that asked for it.

use axum::Router;
use axum::http::{HeaderName, Request};
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

/// The request and response header of the request id: `x-request-id`.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `router` with request ids and the trace layer around it (outermost).
pub fn with_request_ids(router: Router) -> Router {
    router.layer(
        tower::ServiceBuilder::new()
            .layer(SetRequestIdLayer::new(X_REQUEST_ID, MakeRequestUuid))
            .layer(
                TraceLayer::new_for_http()
                    .make_span_with(request_span)
                    .on_failure(on_failure),
            )
            .layer(PropagateRequestIdLayer::new(X_REQUEST_ID)),
    )
}

/// A failed request, in the request's span. A `503` is a retryable answer whose cause was
/// already logged where it was decided (the layer's failed claim, a suspended phase, an
/// outside call that timed out), so it is logged at `debug` and not a second time at `error`;
/// every other `5xx` and every error from the service is logged at `error`.
fn on_failure(class: ServerErrorsFailureClass, latency: std::time::Duration, _: &tracing::Span) {
    let latency_ms = latency.as_millis();
    match class {
        ServerErrorsFailureClass::StatusCode(s)
            if s == axum::http::StatusCode::SERVICE_UNAVAILABLE =>
        {
            tracing::debug!(
                status = s.as_u16(),
                latency_ms,
                "answered 503 (its cause is logged above)"
            );
        }
        ServerErrorsFailureClass::StatusCode(s) => {
            tracing::error!(
                status = s.as_u16(),
                latency_ms,
                "the request failed with a server error"
            );
        }
        ServerErrorsFailureClass::Error(e) => {
            tracing::error!(error = %e, latency_ms, "the request failed");
        }
    }
}

/// The `request` span: method, path (never the query: it may carry secrets) and request id.
fn request_span<B>(req: &Request<B>) -> tracing::Span {
    let id = req
        .headers()
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::post;
    use oncely_core::{MemoryStore, Scope};
    use oncely_tower::IdempotencyLayer;
    use std::sync::{Arc, Mutex};
    use tower::ServiceExt as _;
    use tower_http::request_id::RequestId;

    /// Captures formatted log lines.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    /// Runs `work` on a current-thread runtime and returns what it logged at `info` and above.
    fn logged(work: impl std::future::Future<Output = ()>) -> String {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tracing::subscriber::with_default(subscriber, || rt.block_on(work));
        String::from_utf8(logs.0.lock().unwrap().clone()).unwrap()
    }

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A keyed write behind the idempotency layer: its handler sees the request id, logs
    /// inside the request's span, and the response carries the id (the client's, or a
    /// generated one; a replay answers with its own request's id).
    #[test]
    fn the_request_id_reaches_the_claimed_handler_and_the_response() {
        let handler = |axum::Extension(id): axum::Extension<RequestId>| async move {
            tracing::info!("handler ran");
            id.header_value().to_str().unwrap().to_owned()
        };
        let app = with_request_ids(
            Router::new()
                .route("/v1/things", post(handler))
                .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new())))
                .layer(axum::middleware::from_fn(
                    |mut req: axum::extract::Request, next: axum::middleware::Next| async move {
                        req.extensions_mut().insert(Scope::new("acct_t"));
                        next.run(req).await
                    },
                )),
        );
        let call = |id: Option<&str>| {
            let mut req = Request::post("/v1/things")
                .header("idempotency-key", "k-1")
                .header("content-type", "application/json");
            if let Some(id) = id {
                req = req.header("x-request-id", id);
            }
            app.clone().oneshot(req.body(Body::from("{}")).unwrap())
        };
        let text = logged(async {
            let res = call(Some("rid-client-1")).await.unwrap();
            assert_eq!(res.status(), 200);
            assert_eq!(res.headers()["x-request-id"], "rid-client-1");
            let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
            assert_eq!(&body[..], b"rid-client-1");

            // A replay: the stored body (the first id), this request's own id.
            let res = call(None).await.unwrap();
            assert_eq!(res.headers()["idempotent-replayed"], "true");
            let generated = res.headers()["x-request-id"].to_str().unwrap().to_owned();
            assert_eq!(
                uuid::Uuid::parse_str(&generated).unwrap().get_version_num(),
                4
            );
            let body = axum::body::to_bytes(res.into_body(), 1024).await.unwrap();
            assert_eq!(&body[..], b"rid-client-1");
        });
        let line = text
            .lines()
            .find(|l| l.contains("handler ran"))
            .unwrap_or_else(|| panic!("no handler log in:\n{text}"));
        assert!(line.contains("request_id=rid-client-1"), "{line}");
        assert!(line.contains("path=/v1/things"), "{line}");
        assert_eq!(text.matches("handler ran").count(), 1, "{text}");
    }

    /// A `503` (already logged where it was decided) is not logged again at `error`; a `500`
    /// is.
    #[test]
    fn a_503_is_not_logged_again_as_a_failure_and_a_500_is() {
        let app = with_request_ids(
            Router::new()
                .route(
                    "/busy",
                    post(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }),
                )
                .route(
                    "/broken",
                    post(|| async { axum::http::StatusCode::INTERNAL_SERVER_ERROR }),
                ),
        );
        let text = logged(async {
            for (path, status) in [("/busy", 503), ("/broken", 500)] {
                let req = Request::post(path).body(Body::empty()).unwrap();
                let res = app.clone().oneshot(req).await.unwrap();
                assert_eq!(res.status().as_u16(), status);
            }
        });
        let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
        assert_eq!(errors.len(), 1, "{text}");
        assert!(
            errors[0].contains("status=500") && errors[0].contains("path=/broken"),
            "{text}"
        );
    }
}
