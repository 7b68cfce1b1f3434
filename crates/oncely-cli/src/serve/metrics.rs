//! `GET /metrics`: the layer's counters and this server's, as Prometheus text (exposition
//! format 0.0.4), written by hand for now.

use super::App;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// `GET /metrics`.
pub async fn metrics(State(app): State<App>) -> Response {
    let mut text = app.metrics().render_prometheus();
    let counts = app.counts();
    text.push_str(
        "# HELP oncely_payments_created_total Payments this process created (first executions).\n\
         # TYPE oncely_payments_created_total counter\n",
    );
    text.push_str(&format!(
        "oncely_payments_created_total {}\n",
        counts.payments_created
    ));
    for (name, help, value) in [
        (
            "oncely_reaped_total",
            "Records past retention the in-process reaper deleted.",
            counts.reaped,
        ),
        (
            "oncely_orphaned_total",
            "Of those, records still in flight (abandoned, never finished).",
            counts.orphaned,
        ),
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
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            value
        ));
    }
    text.push_str(&format!(
        "# HELP oncely_records_marked Records marked for a person (the completer gave up on them), as of the last in-process reaper pass; each is logged on every pass.\n\
         # TYPE oncely_records_marked gauge\n\
         oncely_records_marked {}\n",
        counts.marked
    ));
    if let Ok(n) = app.db().payment_count().await {
        text.push_str(
            "# HELP oncely_payments Payments in the database.\n# TYPE oncely_payments gauge\n",
        );
        text.push_str(&format!("oncely_payments {n}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
