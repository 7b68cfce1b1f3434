//! The Rust runner of the retry conformance suite: every scenario of
//! `conformance/retry/scenarios.json` (format: `conformance/retry/README.md`), through this
//! crate's reqwest middleware, against `oncely-testbench` started in process.
//!
//! Waits and attempt durations are checked from what the testbench observed: lower bounds
//! strictly (5 ms of tolerance for the clock reads on both sides), upper bounds with slack for a
//! loaded 2-core machine (`ONCELY_CONFORMANCE_SLACK_MS`, default 250). A scenario this runner
//! cannot run is a failure, never a skip. Every failure is listed, then the test fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use oncely_client::budget::{BudgetConfig, RetryCost};
use oncely_client::key::is_valid_key;
use oncely_client::{
    Backoff, CallOptions, IdempotencyKeyExt, Jitter, OncelyRetry, RetryError, RetryPolicy,
    StopReason,
};
use oncely_testbench::scenario::{
    Bound, BudgetSetting, Call, CallResult, DefaultsScenario, ErrorKind, HttpScenario,
    JitterScenario, KeyExpect, KeyMode, KeySpec, Pair, Policy, Scenario, ScenarioFile, Target,
};
use oncely_testbench::{Answer, AttemptReport, RunReport, Testbench};
use reqwest_middleware::ClientWithMiddleware;
use sha2::Digest;

/// A lower bound passes at `>= min - LOWER_TOLERANCE_MS`.
const LOWER_TOLERANCE_MS: f64 = 5.0;

fn slack_ms() -> f64 {
    std::env::var("ONCELY_CONFORMANCE_SLACK_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(250.0)
}

fn load() -> ScenarioFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conformance/retry/scenarios.json");
    let text = std::fs::read_to_string(&path).expect("conformance/retry/scenarios.json");
    ScenarioFile::from_json(&text).expect("a valid scenario file")
}

type Check = Result<(), String>;

fn within(what: &str, value: f64, min: Option<f64>, max: Option<f64>) -> Check {
    if let Some(min) = min
        && value < min - LOWER_TOLERANCE_MS
    {
        return Err(format!(
            "{what} = {value:.1} ms, below the lower bound {min} ms"
        ));
    }
    if let Some(max) = max
        && value > max + slack_ms()
    {
        return Err(format!(
            "{what} = {value:.1} ms, above the upper bound {max} ms (+{} ms slack)",
            slack_ms()
        ));
    }
    Ok(())
}

fn within_pair(what: &str, value: f64, (min, max): Pair) -> Check {
    within(what, value, Some(min), max)
}

fn within_bound(what: &str, value: f64, b: &Bound) -> Check {
    within(what, value, b.min, b.max)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------- defaults and jitter

fn run_defaults(s: &DefaultsScenario) -> Check {
    let p = RetryPolicy::new();
    let e = &s.expect;
    let budget = p.budget().ok_or("the default policy has no budget")?;
    let got = (
        p.max_attempts(),
        ms(p.deadline()),
        ms(p.attempt_timeout()),
        p.jitter() == Jitter::Full,
        ms(p.backoff().base()),
        ms(p.backoff().cap()),
        p.retry_500(),
        p.mints_keys(),
        (
            budget.capacity(),
            budget.cost(RetryCost::Transient),
            budget.cost(RetryCost::Throttle),
            budget.success_refund(),
        ),
    );
    let want = (
        e.max_attempts,
        e.deadline_ms,
        e.attempt_timeout_ms,
        e.jitter == "full",
        e.base_ms,
        e.cap_ms,
        e.retry_500,
        e.mint_keys,
        (
            e.budget.capacity,
            e.budget.transient_cost,
            e.budget.throttle_cost,
            e.budget.success_refund,
        ),
    );
    if got != want {
        return Err(format!("defaults {got:?}, expected {want:?}"));
    }
    Ok(())
}

fn run_jitter(s: &JitterScenario) -> Check {
    let backoff = Backoff::full_jitter(
        Duration::from_millis(s.policy.base_ms),
        Duration::from_millis(s.policy.cap_ms),
    );
    let mut rng = rand::rng();
    for r in &s.retries {
        let draws: Vec<f64> = (0..s.draws)
            .map(|_| backoff.delay(r.retry, None, &mut rng).as_secs_f64() * 1000.0)
            .collect();
        let e = &r.expect;
        let retry = r.retry;
        if let Some(bad) = draws.iter().find(|d| **d < 0.0 || **d > e.max_ms + 0.001) {
            return Err(format!(
                "retry {retry}: a draw of {bad} ms outside [0, {}]",
                e.max_ms
            ));
        }
        if !draws.iter().any(|d| *d < e.some_below_ms) {
            return Err(format!(
                "retry {retry}: no draw below {} ms",
                e.some_below_ms
            ));
        }
        if !draws.iter().any(|d| *d > e.some_above_ms) {
            return Err(format!(
                "retry {retry}: no draw above {} ms (stuck at zero?)",
                e.some_above_ms
            ));
        }
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        if e.mean_ms.min.is_some_and(|m| mean < m) || e.mean_ms.max.is_some_and(|m| mean > m) {
            return Err(format!(
                "retry {retry}: mean {mean} ms outside {:?}",
                e.mean_ms
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- http

fn policy_of(p: &Policy) -> RetryPolicy {
    let mut out = RetryPolicy::new();
    if let Some(n) = p.max_attempts {
        out = out.with_max_attempts(n);
    }
    if let Some(d) = p.deadline_ms {
        out = out.with_deadline(Duration::from_millis(d));
    }
    if let Some(d) = p.attempt_timeout_ms {
        out = out.with_attempt_timeout(Duration::from_millis(d));
    }
    let defaults = out.backoff();
    let base = p.base_ms.map_or(defaults.base(), Duration::from_millis);
    let cap = p.cap_ms.map_or(defaults.cap(), Duration::from_millis);
    out = out.with_full_jitter(base, cap);
    if let Some(r) = p.retry_500 {
        out = out.with_retry_500(r);
    }
    if let Some(m) = p.mint_keys {
        out = out.with_key_minting(m);
    }
    match p.budget {
        BudgetSetting::Inherit => {}
        BudgetSetting::Disabled => out = out.with_budget(None),
        BudgetSetting::Set(b) => {
            let mut c = BudgetConfig::new();
            if let Some(v) = b.capacity {
                c = c.with_capacity(v);
            }
            if let Some(v) = b.transient_cost {
                c = c.with_transient_cost(v);
            }
            if let Some(v) = b.throttle_cost {
                c = c.with_throttle_cost(v);
            }
            if let Some(v) = b.success_refund {
                c = c.with_success_refund(v);
            }
            out = out.with_budget(Some(c));
        }
    }
    out
}

fn kind_of(reason: &StopReason) -> Option<ErrorKind> {
    Some(match reason {
        StopReason::AttemptsExhausted { .. } => ErrorKind::AttemptsExhausted,
        StopReason::DeadlineExhausted { .. } => ErrorKind::DeadlineExhausted,
        StopReason::RetryAfterBeyondDeadline { .. } => ErrorKind::RetryAfterBeyondDeadline,
        StopReason::BudgetEmpty { .. } => ErrorKind::BudgetEmpty,
        StopReason::OutcomeUnknown => ErrorKind::OutcomeUnknown,
        StopReason::InvalidIdempotencyKey(_) => ErrorKind::InvalidIdempotencyKey,
        StopReason::NotRetryable => ErrorKind::NotRetryable,
        StopReason::BodyNotReplayable => ErrorKind::BodyNotReplayable,
        StopReason::NestedRetryLayer { .. } => ErrorKind::NestedRetryLayer,
        _ => return None,
    })
}

/// What one call returned.
enum Outcome {
    Response {
        status: u16,
        headers: reqwest::header::HeaderMap,
        body: Vec<u8>,
    },
    Error {
        kind: Option<ErrorKind>,
        reason: String,
        outcome_unknown: bool,
        attempts: u32,
        last_status: Option<u16>,
        key: Option<String>,
        retry_after: Option<Duration>,
    },
}

async fn make_call(
    client: &ClientWithMiddleware,
    base: &str,
    scenario: &str,
    run: &str,
    index: usize,
    call: &Call,
) -> Result<(Outcome, f64), String> {
    let method = reqwest::Method::from_bytes(call.method.as_bytes()).map_err(|e| e.to_string())?;
    let mut req = client
        .request(method, format!("{base}{}", call.path))
        .header("x-oncely-scenario", scenario)
        .header("x-oncely-run", run)
        .header("x-oncely-call", index.to_string());
    for (k, v) in &call.headers {
        req = req.header(k, v);
    }
    let mut options = CallOptions::new();
    match &call.key {
        KeySpec::Mode(KeyMode::Auto) => {}
        KeySpec::Mode(KeyMode::None) => options = options.with_key_minting(false),
        KeySpec::Given { value } => req = req.idempotency_key(value),
    }
    if let Some(d) = call.deadline_ms {
        options = options.with_deadline(Duration::from_millis(d));
    }
    if let Some(n) = call.max_attempts {
        options = options.with_max_attempts(n);
    }
    if let Some(body) = &call.body {
        if let Some(ct) = &body.content_type {
            req = req.header("content-type", ct);
        }
        req = req.body(body.text.clone());
    }
    let req = req.with_extension(options);
    let started = Instant::now();
    let result = req.send().await;
    let outcome = match result {
        Ok(response) => {
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let body = response
                .bytes()
                .await
                .map_err(|e| format!("reading the {status} response's body failed: {e}"))?;
            Outcome::Response {
                status,
                headers,
                body: body.to_vec(),
            }
        }
        Err(e) => {
            let Some(stop) = RetryError::from_middleware(&e) else {
                return Err(format!("the call failed without a RetryError: {e}"));
            };
            Outcome::Error {
                kind: kind_of(stop.reason()),
                reason: stop.to_string(),
                outcome_unknown: stop.is_outcome_unknown(),
                attempts: stop.attempts(),
                last_status: stop.last_status().map(|s| s.as_u16()),
                key: stop.idempotency_key().map(str::to_owned),
                retry_after: stop.retry_after(),
            }
        }
    };
    Ok((outcome, started.elapsed().as_secs_f64() * 1000.0))
}

async fn fetch_report(http: &reqwest::Client, url: &str, run: &str) -> Result<RunReport, String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let report: RunReport = http
            .get(format!("{url}/_testbench/runs/{run}"))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let busy = report
            .attempts
            .iter()
            .any(|a| a.answer == Answer::InProgress);
        if !busy || Instant::now() > deadline {
            return Ok(report);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn header<'a>(a: &'a AttemptReport, name: &str) -> Option<&'a str> {
    a.headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn check_key(
    what: &str,
    want: KeyExpect,
    got: Option<&str>,
    given: Option<&str>,
    minted: Option<&str>,
) -> Check {
    match (want, got) {
        (KeyExpect::None, None) => Ok(()),
        (KeyExpect::None, Some(k)) => Err(format!("{what} carries key {k:?}, expected none")),
        (KeyExpect::Given, Some(k)) if Some(k) == given => Ok(()),
        (KeyExpect::Given, k) => Err(format!(
            "{what} carries key {k:?}, expected the caller's {given:?}"
        )),
        (KeyExpect::Minted, Some(k)) if is_valid_key(k) && minted.is_none_or(|m| m == k) => Ok(()),
        (KeyExpect::Minted, k) => Err(format!(
            "{what} carries key {k:?}, expected the one valid minted key {minted:?}"
        )),
    }
}

/// Checks one call; returns the minted key it carried, if any.
fn check_call(
    scenario: &str,
    index: usize,
    call: &Call,
    attempts: &[&AttemptReport],
    run: &str,
    outcome: &Outcome,
    elapsed: f64,
) -> Result<Option<String>, String> {
    let e = &call.expect;
    let given = match &call.key {
        KeySpec::Given { value } => Some(value.as_str()),
        KeySpec::Mode(_) => None,
    };
    if attempts.len() != e.attempts as usize {
        return Err(format!(
            "{} attempts reached the testbench, expected {}",
            attempts.len(),
            e.attempts
        ));
    }
    // The key on every attempt.
    let first_key = attempts.first().and_then(|a| a.idempotency_key.clone());
    for a in attempts {
        let what = format!("attempt {}", a.attempt);
        if a.idempotency_key_count > 1 {
            return Err(format!(
                "{what} carries {} Idempotency-Key headers",
                a.idempotency_key_count
            ));
        }
        check_key(
            &what,
            e.key,
            a.idempotency_key.as_deref(),
            given,
            first_key.as_deref(),
        )?;
        // The body, byte for byte, and the runner's headers.
        let body = call.body.as_ref().map_or(&b""[..], |b| b.text.as_bytes());
        let sha = hex::encode(sha2::Sha256::digest(body));
        if a.body_len != body.len() || a.body_sha256 != sha {
            return Err(format!(
                "{what} sent a {}-byte body that is not the call's",
                a.body_len
            ));
        }
        let index_text = index.to_string();
        for (name, value) in [
            ("x-oncely-scenario", scenario),
            ("x-oncely-run", run),
            ("x-oncely-call", index_text.as_str()),
        ] {
            if header(a, name) != Some(value) {
                return Err(format!("{what} lost the {name} header"));
            }
        }
    }
    // Waits and attempt durations, as the testbench saw them.
    let ended = |a: &AttemptReport| {
        a.ended_ms
            .ok_or_else(|| format!("attempt {} never ended at the testbench", a.attempt))
    };
    let mut waits = Vec::new();
    for w in attempts.windows(2) {
        waits.push(w[1].arrived_ms - ended(w[0])?);
    }
    if let Some(bounds) = &e.waits_ms {
        for (i, (wait, pair)) in waits.iter().zip(bounds).enumerate() {
            within_pair(&format!("the wait before attempt {}", i + 2), *wait, *pair)?;
        }
    }
    if let Some(b) = &e.total_wait_ms {
        within_bound("the total wait", waits.iter().sum(), b)?;
    }
    if let Some(bounds) = &e.attempt_ms {
        // The client's attempt timer starts before the testbench sees the request (the connect
        // and the send): the first attempt's lower bound is checked with the call's time the
        // testbench did not see added (conformance/retry/README.md, "How a runner checks a
        // scenario"); the upper bound with the held time alone.
        let unseen = match (attempts.first(), attempts.last()) {
            (Some(first), Some(last)) => (elapsed - (ended(last)? - first.arrived_ms)).max(0.0),
            _ => 0.0,
        };
        for (n, (a, (min, max))) in attempts.iter().zip(bounds).enumerate() {
            let held = ended(a)? - a.arrived_ms;
            let credit = if n == 0 { unseen } else { 0.0 };
            within(
                &format!(
                    "attempt {}'s duration (+{credit:.1} ms the testbench did not see)",
                    a.attempt
                ),
                held + credit,
                Some(*min),
                None,
            )?;
            within(
                &format!("attempt {}'s duration", a.attempt),
                held,
                None,
                *max,
            )?;
        }
    }
    if let Some(b) = &e.elapsed_ms {
        within_bound("the call's duration", elapsed, b)?;
    }
    // The result.
    let mut minted = (e.key == KeyExpect::Minted)
        .then(|| first_key.clone())
        .flatten();
    match (&e.result, outcome) {
        (
            CallResult::Response(want),
            Outcome::Response {
                status,
                headers,
                body,
            },
        ) => {
            if *status != want.status {
                return Err(format!("returned {status}, expected {}", want.status));
            }
            if let Some(json) = &want.body_json {
                let got: serde_json::Value = serde_json::from_slice(body).map_err(|err| {
                    format!(
                        "the body is not JSON ({err}): {}",
                        String::from_utf8_lossy(body)
                    )
                })?;
                if &got != json {
                    return Err(format!("body {got}, expected {json}"));
                }
            }
            if let Some(text) = &want.body_text
                && body != text.as_bytes()
            {
                return Err(format!(
                    "body {:?}, expected {text:?}",
                    String::from_utf8_lossy(body)
                ));
            }
            for (name, value) in &want.headers {
                let got = headers.get(name.as_str()).and_then(|v| v.to_str().ok());
                if got != Some(value.as_str()) {
                    return Err(format!("header {name} is {got:?}, expected {value:?}"));
                }
            }
        }
        (
            CallResult::Error(want),
            Outcome::Error {
                kind,
                reason,
                outcome_unknown,
                attempts: n,
                last_status,
                key,
                retry_after,
            },
        ) => {
            if *kind != Some(want.error) {
                return Err(format!(
                    "ended with {kind:?} ({reason}), expected {:?}",
                    want.error
                ));
            }
            if *outcome_unknown != want.outcome_unknown {
                return Err(format!(
                    "outcome unknown is {outcome_unknown}, expected {}",
                    want.outcome_unknown
                ));
            }
            if *n != want.attempts {
                return Err(format!(
                    "the error says {n} attempts, expected {} ({reason})",
                    want.attempts
                ));
            }
            if *last_status != want.last_status {
                return Err(format!(
                    "last status {last_status:?}, expected {:?} ({reason})",
                    want.last_status
                ));
            }
            check_key(
                "the error",
                want.key,
                key.as_deref(),
                given,
                minted.as_deref(),
            )?;
            if want.key == KeyExpect::Minted {
                minted = key.clone();
            }
            match (&want.retry_after_ms, retry_after) {
                (Some(b), Some(hint)) => {
                    within_bound("the error's Retry-After", hint.as_secs_f64() * 1000.0, b)?
                }
                (Some(_), None) => return Err("the error carries no Retry-After hint".into()),
                (None, _) => {}
            }
        }
        (CallResult::Response(want), Outcome::Error { reason, .. }) => {
            return Err(format!(
                "ended in an error ({reason}), expected a {} response",
                want.status
            ));
        }
        (CallResult::Error(want), Outcome::Response { status, .. }) => {
            return Err(format!(
                "returned {status}, expected the error {:?}",
                want.error
            ));
        }
    }
    Ok(minted)
}

async fn run_http(
    file: &ScenarioFile,
    s: &HttpScenario,
    bench: &Testbench,
    http: &reqwest::Client,
    nth: usize,
) -> Check {
    let policy = policy_of(&s.effective_policy(file));
    let outer = OncelyRetry::new(policy);
    let reqwest_client = outer.client_builder().build().map_err(|e| e.to_string())?;
    let single = outer.clone().wrap(reqwest_client.clone());
    // Two SDK layers: another instance of ours inside the first, one guard at the bottom.
    let double = reqwest_middleware::ClientBuilder::new(reqwest_client)
        .with(outer.clone())
        .with(OncelyRetry::new(policy))
        .with(outer.guard())
        .build();
    let base = match s.target {
        Target::Testbench => bench.url(),
        Target::Refused => bench.refused_url(),
    };
    let run = format!("rs-{nth}-{}", uuid::Uuid::new_v4().simple());
    let calls = s.expanded_calls();
    let mut outcomes = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let client = if call.layers == 2 { &double } else { &single };
        let done = make_call(client, base, &s.id, &run, i, call)
            .await
            .map_err(|e| format!("call {i}: {e}"))?;
        outcomes.push(done);
    }
    let report = fetch_report(http, bench.url(), &run).await?;
    let mut minted: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (call, (outcome, elapsed))) in calls.iter().zip(&outcomes).enumerate() {
        let attempts = report.of_call(i as u32);
        let key = check_call(&s.id, i, call, &attempts, &run, outcome, *elapsed)
            .map_err(|e| format!("call {i} ({} {}): {e}", call.method, call.path))?;
        if let Some(key) = key
            && let Some(other) = minted.insert(key.clone(), i)
            && s.distinct_keys
        {
            return Err(format!(
                "calls {other} and {i} carry the same minted key {key:?}"
            ));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_of_the_conformance_file() {
    let file = load();
    println!(
        "conformance: {} scenarios from conformance/retry/scenarios.json (slack {} ms)",
        file.scenarios.len(),
        slack_ms()
    );
    let bench = Testbench::start("127.0.0.1:0".parse().unwrap(), &file)
        .await
        .expect("start the testbench");
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut failures = Vec::new();
    for (nth, s) in file.scenarios.iter().enumerate() {
        let t = Instant::now();
        let result = match s {
            Scenario::Defaults(d) => run_defaults(d),
            Scenario::Jitter(j) => run_jitter(j),
            Scenario::Http(h) => run_http(&file, h, &bench, &http, nth).await,
        };
        let took = t.elapsed().as_millis();
        match result {
            Ok(()) => println!("ok    {} ({took} ms)", s.id()),
            Err(e) => {
                println!("FAIL  {} ({took} ms): {e}", s.id());
                failures.push(format!("{}: {e}\n      rule: {}", s.id(), s.rule()));
            }
        }
    }
    let total = file.scenarios.len();
    println!(
        "conformance: {} passed, {} failed, of {total} scenarios in {:.1} s",
        total - failures.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} conformance scenarios failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
