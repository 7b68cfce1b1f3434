//! `GET /metrics`: everything sent through the `metrics` facade (the layer's
//! counters and histograms with `route`, `outcome` and `store` labels, the client SDK's, this
//! server's own), rendered by `metrics-exporter-prometheus` in the Prometheus text format
//! (version 0.0.4).
//!
//! | series | type | labels |
//! |---|---|---|
//! | `oncely_<counter>_total` (`claims`, `replays`, `in_flight_conflicts`, `mismatches`, `lease_takeovers`, `fencing_rejections`, `store_errors`, `released`, `not_retained`, `key_missing`, `key_invalid`, `body_not_canonicalizable`, `needs_attention`: `oncely_tower::MetricsSnapshot`'s fields) | counter | `route`, `store` |
//! | `oncely_requests_total` | counter | `route`, `outcome` (`claimed`, `replayed`, `in_flight`, `mismatch`, `needs_attention`, `store_error`), `store` |
//! | `oncely_claim_duration_seconds` | histogram | `route`, `outcome`, `store` |
//! | `oncely_store_operation_duration_seconds` | histogram | `store`, `outcome` (`ok`, `error`) |
//! | `oncely_payments_created_total`, `oncely_reaped_total`, `oncely_orphaned_total` | counter | — |
//! | `oncely_payments` | gauge | — |
//!
//! The recorder is the process's one global recorder, installed by the first server built.

use super::App;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// The histograms' buckets, in seconds: 0.5 milliseconds to 10 seconds.
const BUCKETS_SECONDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the Prometheus recorder as the global `metrics` recorder, once per process, and
/// describes the layer's and the client SDK's series to it (their `# HELP` lines). If another
/// recorder was installed first (an embedding application's), every series goes to that one
/// and `/metrics` answers a comment saying so.
pub fn install() {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS_SECONDS)
            .ok()?;
        match builder.install_recorder() {
            Ok(handle) => {
                oncely_tower::Metrics::describe();
                oncely_client::RetryMetrics::describe();
                Some(handle)
            }
            Err(e) => {
                tracing::warn!(error = %e, "another metrics recorder is installed; it gets every series and /metrics shows none");
                None
            }
        }
    });
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", security(()),
    responses((status = 200, description = "Prometheus text format.", content_type = "text/plain", body = String)))]
pub async fn metrics(State(app): State<App>) -> Response {
    let counts = app.counts();
    ::metrics::describe_counter!(
        "oncely_payments_created_total",
        "Payments this process created (first executions)."
    );
    ::metrics::counter!("oncely_payments_created_total").absolute(counts.payments_created);
    ::metrics::describe_counter!(
        "oncely_reaped_total",
        "Records past retention the in-process reaper deleted."
    );
    ::metrics::counter!("oncely_reaped_total").absolute(counts.reaped);
    ::metrics::describe_counter!(
        "oncely_orphaned_total",
        "Of those, records still in flight (abandoned, never finished)."
    );
    ::metrics::counter!("oncely_orphaned_total").absolute(counts.orphaned);
    for (name, help, value) in [
        (
            "oncely_completer_redrives_total",
            "Abandoned requests the in-process completer re-drove (each attempt counted).",
            counts.completer.attempted,
        ),
        (
            "oncely_completer_completed_total",
            "Of those, requests that were no longer in flight afterwards.",
            counts.completer.completed,
        ),
        (
            "oncely_completer_marked_total",
            "Abandoned requests the in-process completer gave up on and marked for a person.",
            counts.completer.marked,
        ),
    ] {
        ::metrics::describe_counter!(name, help);
        ::metrics::counter!(name).absolute(value);
    }
    ::metrics::describe_gauge!(
        "oncely_records_marked",
        "Records marked for a person (the completer gave up on them), as of the last in-process reaper pass; each is logged on every pass."
    );
    ::metrics::gauge!("oncely_records_marked").set(counts.marked as f64);
    if let Ok(n) = app.db().payment_count().await {
        ::metrics::describe_gauge!("oncely_payments", "Payments in the database.");
        ::metrics::gauge!("oncely_payments").set(n as f64);
    }
    let text = match HANDLE.get().and_then(Option::as_ref) {
        Some(handle) => handle.render(),
        None => "# another metrics recorder is installed in this process: it has every series\n"
            .to_owned(),
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
