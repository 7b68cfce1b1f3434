//! `oncely audit`: probe anybody's HTTP API for the `Idempotency-Key` contract.
//!
//! A thin layer over [`oncely_audit::audit`]: the flags build an [`AuditConfig`], which is
//! validated before anything is sent (an invalid one is a usage error, exit status 2), then the
//! report is printed as text (per check PASS / FAIL / N/A / INCONCLUSIVE, the anti-pattern a
//! FAIL is evidence of, the detail and the exchanges) or, with `--json`, as
//! [`AuditReport::to_json`]. Exit status 0 when every check is PASS or N/A, 1 otherwise.
//!
//! Traffic goes only to the base URLs' origins, at most `--max-requests` requests (default 500),
//! each bounded by `--timeout-secs` (default 10 s); see [`oncely_audit::audit`] for the checks
//! and bounds. The audit creates real resources: point it at a test deployment.

use anyhow::{Context as _, Result, anyhow, bail};
use http::Method;
use oncely_audit::audit::{self, AuditConfig, AuditReport, Url};
use std::time::Duration;

/// Arguments of `oncely audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Where the API lives: http://host:port, optionally with a path prefix (/api). (https is
    /// not built in.) Several base URLs audit a multi-instance API without a proxy: the
    /// endpoint's requests are spread across them in turn (the count URL is read from the
    /// first).
    #[arg(required = true, num_args = 1..)]
    base_urls: Vec<String>,
    /// The audited endpoint: 'METHOD /path' under the base URL (e.g. 'POST /v1/payments').
    #[arg(long)]
    endpoint: String,
    /// A JSON body the endpoint accepts with a 2xx (e.g. '{"amount": 1000}'); @FILE reads it
    /// from a file. Without it, requests carry no body and the body checks are N/A.
    #[arg(long)]
    body: Option<String>,
    /// The first caller's full Authorization header value (e.g. 'Bearer acct_1'); never printed.
    #[arg(long)]
    auth: Option<String>,
    /// A second caller's Authorization value, of another account, for the key-scope check (N/A
    /// without). The report warns when it looks like the first caller's account.
    #[arg(long)]
    second_auth: Option<String>,
    /// Another token of the first caller's account (a refreshed credential), for the
    /// refreshed-credential check: a retry under it must be replayed (N/A without).
    #[arg(long)]
    same_account_auth: Option<String>,
    /// Keep a cookie jar per caller and send its cookies back (for session-bound APIs); also
    /// enables the session-scope check (with --second-auth).
    #[arg(long)]
    cookies: bool,
    /// A GET URL on the same origin (or a path under the base URL) listing the created
    /// resources (a JSON array, or an object with count/total/data/items), read before and
    /// after the checks that must not execute twice.
    #[arg(long)]
    count_url: Option<String>,
    /// Another endpoint of the same API that accepts keys, 'METHOD /path', for the
    /// cross-endpoint check (N/A without, or when it refuses its own request).
    #[arg(long)]
    other_endpoint: Option<String>,
    /// The JSON body the other endpoint accepts with a 2xx; @FILE reads it from a file.
    /// Without it, the other endpoint is sent --body.
    #[arg(long, requires = "other_endpoint")]
    other_body: Option<String>,
    /// Identical requests fired at once by the concurrency check (2..=1000).
    #[arg(long, default_value_t = audit::DEFAULT_CONCURRENCY)]
    concurrency: usize,
    /// Bursts the concurrency check fires, each with its own key (1..=100): a race present in
    /// at least half of the bursts is caught with probability 1 - 2^-trials (99.9% with 10).
    #[arg(long, default_value_t = audit::DEFAULT_TRIALS)]
    trials: usize,
    /// The server's replay window, in seconds (fractions allowed, at most 600): the expiry check
    /// waits it out and expects a new execution. Without it, the expiry check is N/A.
    #[arg(long)]
    window_secs: Option<f64>,
    /// Per-request timeout, in seconds (fractions allowed).
    #[arg(long, default_value_t = audit::DEFAULT_TIMEOUT.as_secs_f64())]
    timeout_secs: f64,
    /// Hard limit on the requests the audit sends (count-URL reads included).
    #[arg(long, default_value_t = audit::DEFAULT_MAX_REQUESTS)]
    max_requests: usize,
    /// The header the endpoint reads its key from (default Idempotency-Key), e.g. webhook-id
    /// for a Standard Webhooks receiver or X-GitHub-Delivery.
    #[arg(long, value_name = "NAME", conflicts_with = "key_json_pointer")]
    key_header: Option<String>,
    /// The endpoint reads its key from the JSON body at this JSON Pointer (RFC 6901), e.g. /id
    /// for Stripe-style events: every request writes its key there (the member's parent must
    /// be an object of --body).
    #[arg(long, value_name = "PTR")]
    key_json_pointer: Option<String>,
    /// Sign every request as a Standard Webhooks sender (whsec_... secret): webhook-id,
    /// webhook-timestamp and a fresh webhook-signature per attempt over the body sent, so every
    /// check runs against a webhook receiver. Never printed.
    #[arg(
        long,
        value_name = "SECRET",
        env = "ONCELY_AUDIT_WEBHOOK_SECRET",
        hide_env_values = true
    )]
    webhook_secret: Option<String>,
    /// Another sender's Standard Webhooks secret: the second caller of the key-scope check.
    #[arg(
        long,
        value_name = "SECRET",
        requires = "webhook_secret",
        hide_env_values = true
    )]
    second_webhook_secret: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Parses `'METHOD /path'` (the method is upper-cased; any HTTP token is accepted).
fn parse_endpoint(flag: &str, value: &str) -> Result<(Method, String)> {
    let mut parts = value.split_whitespace();
    let (Some(method), Some(path), None) = (parts.next(), parts.next(), parts.next()) else {
        bail!("{flag} must be 'METHOD /path' (e.g. 'POST /v1/payments'), got {value:?}");
    };
    let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
        .map_err(|_| anyhow!("{flag}: {method:?} is not an HTTP method"))?;
    if !path.starts_with('/') {
        bail!("{flag}: the path must start with '/', got {path:?}");
    }
    Ok((method, path.to_owned()))
}

fn seconds(flag: &str, value: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| anyhow!("{flag} must be a positive number of seconds, got {value}"))
}

/// Builds and validates the configuration; sends nothing.
/// Reads a JSON flag value (`@FILE` reads the file).
fn json_arg(flag: &str, text: &str) -> Result<serde_json::Value> {
    let text = match text.strip_prefix('@') {
        Some(file) => {
            std::fs::read_to_string(file).with_context(|| format!("{flag}: read {file}"))?
        }
        None => text.to_owned(),
    };
    serde_json::from_str(&text).with_context(|| format!("{flag} is not valid JSON"))
}

fn config(args: &Args) -> Result<AuditConfig> {
    let mut bases = Vec::new();
    for b in &args.base_urls {
        let base = Url::parse(b).map_err(|e| anyhow!("the base URL {b:?} is not a URL: {e}"))?;
        // The workspace builds reqwest without a TLS backend: an https:// audit would only
        // collect transport errors (INCONCLUSIVE everywhere), so say so up front.
        if base.scheme() == "https" {
            bail!(
                "this oncely binary is built without TLS: audit an http:// URL (for example \
                 through a local TLS-terminating proxy)"
            );
        }
        bases.push(base);
    }
    let base = bases.remove(0);
    let (method, path) = parse_endpoint("--endpoint", &args.endpoint)?;
    let body = match &args.body {
        None => serde_json::Value::Null,
        Some(text) => json_arg("--body", text)?,
    };
    let mut cfg = AuditConfig::new(base, method, path, body);
    cfg.more_base_urls = bases;
    cfg.auth = args.auth.clone();
    cfg.second_auth = args.second_auth.clone();
    cfg.same_account_auth = args.same_account_auth.clone();
    cfg.cookies = args.cookies;
    cfg.other_body = args
        .other_body
        .as_deref()
        .map(|b| json_arg("--other-body", b))
        .transpose()?;
    cfg.trials = args.trials;
    cfg.count_url = args.count_url.clone();
    cfg.other_endpoint = args
        .other_endpoint
        .as_deref()
        .map(|e| parse_endpoint("--other-endpoint", e))
        .transpose()?;
    cfg.concurrency = args.concurrency;
    cfg.window = args
        .window_secs
        .map(|w| seconds("--window-secs", w))
        .transpose()?;
    cfg.timeout = seconds("--timeout-secs", args.timeout_secs)?;
    cfg.max_requests = args.max_requests;
    if let Some(name) = &args.key_header {
        let name = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| anyhow!("--key-header: {name:?} is not an HTTP header name"))?;
        cfg.key_placement = audit::KeyPlacement::Header(name);
    }
    if let Some(ptr) = &args.key_json_pointer {
        cfg.key_placement = audit::KeyPlacement::JsonPointer(ptr.clone());
    }
    cfg.webhook_secret = args.webhook_secret.clone();
    cfg.second_webhook_secret = args.second_webhook_secret.clone();
    cfg.validate().context("invalid audit configuration")?;
    Ok(cfg)
}

/// Runs `oncely audit`; returns whether every check is PASS or N/A.
///
/// # Errors
///
/// A usage error, before anything is sent: a base URL or endpoint that does not parse, an
/// `https://` base URL (no TLS in this build), a body (or other body) that is not JSON, or a
/// configuration [`AuditConfig::validate`] rejects (traffic leaving the base origins, equal
/// credentials, out-of-range concurrency, trials, window or budget).
pub async fn run(args: Args) -> Result<bool> {
    let cfg = config(&args)?;
    if !args.json {
        eprintln!(
            "oncely: auditing {} {}{} (at most {} requests, {} bursts of {}{})",
            cfg.method,
            cfg.base_url.as_str().trim_end_matches('/').to_owned() + &cfg.path,
            match cfg.more_base_urls.len() {
                0 => String::new(),
                n => format!(" and {n} more instance(s)"),
            },
            cfg.planned_requests(),
            cfg.trials,
            cfg.concurrency,
            match cfg.window {
                Some(w) => format!(
                    ", plus a {:.1} s wait for the expiry check",
                    w.as_secs_f64()
                ),
                None => String::new(),
            }
        );
    }
    let report: AuditReport = audit::run(&cfg).await;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(report.passed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let (m, p) = parse_endpoint("--endpoint", "post  /v1/payments").unwrap();
        assert_eq!((m, p.as_str()), (Method::POST, "/v1/payments"));
        assert!(parse_endpoint("--endpoint", "/v1/payments").is_err());
        assert!(parse_endpoint("--endpoint", "POST v1").is_err());
        assert!(parse_endpoint("--endpoint", "POST /a /b").is_err());
        assert!(seconds("--window-secs", 0.0).is_err());
        assert!(seconds("--window-secs", -1.0).is_err());
        assert_eq!(
            seconds("--window-secs", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
    }
}
