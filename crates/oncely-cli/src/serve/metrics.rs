//! `GET /metrics`: the layer's counters and this server's, as Prometheus text (exposition
//! format 0.0.4), written by hand for now.

use super::App;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", security(()),
    responses((status = 200, description = "Prometheus text format.", content_type = "text/plain", body = String)))]
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
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            value
        ));
    }
    if let Ok(n) = app.db().payment_count().await {
        text.push_str(
            "# HELP oncely_payments Payments in the database.\n# TYPE oncely_payments gauge\n",
        );
        text.push_str(&format!("oncely_payments {n}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
