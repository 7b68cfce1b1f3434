//! The runner: checks the configuration, sets up the environment, runs the chosen gates in
//! [`Gate::ALL`] order and hands each verdict to the [`report`](super::report).

use super::child;
use super::env::Env;
use super::report::Report;
use super::{Gate, GateResult, GatesConfig};
use crate::serve::StoreUrl;
use anyhow::{Context as _, Result, bail};
use serde_json::json;
use std::time::Instant;

/// The gates `only` names (all of them when empty), in run order.
fn chosen(only: &[String]) -> Result<Vec<Gate>> {
    if let Some(bad) = only.iter().find(|o| Gate::from_name(o).is_none()) {
        let names: Vec<&str> = Gate::ALL.iter().map(|g| g.name()).collect();
        let expected = match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        bail!("unknown gate {bad:?}: expected {expected}");
    }
    Ok(Gate::ALL
        .into_iter()
        .filter(|g| only.is_empty() || only.iter().any(|o| o == g.name()))
        .collect())
}

/// Runs the chosen gates; returns whether all passed.
///
/// # Errors
///
/// A setup error (exit 2): an unknown gate, `-n 0`, a store that cannot be used or does not
/// outlive a process, a processor that does not start. A gate that fails is not an error.
pub async fn run(cfg: GatesConfig) -> Result<bool> {
    child::resolve_executable()?;
    let dir = tempfile::tempdir().context("make a temporary directory")?;
    let store = match &cfg.store {
        Some(s) => own_namespace(s),
        None => StoreUrl::Sqlite(dir.path().join("oncely.sqlite3").display().to_string()),
    };
    let instances = cfg.instances.unwrap_or(match store {
        StoreUrl::Postgres(_) | StoreUrl::Mysql(_) => 3,
        _ => 1,
    });
    let gates = chosen(&cfg.only)?;
    if cfg.concurrency == 0 {
        bail!("-n must be at least 1 (it is the number of concurrent identical requests)");
    }
    if matches!(
        store,
        StoreUrl::Postgres(_) | StoreUrl::Mysql(_) | StoreUrl::Redis(_)
    ) {
        // A store that cannot be reached is a setup error (exit 2), not a failed gate.
        crate::serve::open_store(&store)
            .await
            .with_context(|| format!("the key store {store} cannot be used"))?;
    }
    if store == StoreUrl::Memory {
        bail!(
            "the gates restart servers, so they need a store that outlives a process: use a file path, postgres://…, mysql://…, redis://… or redis+cluster://…"
        );
    }
    // The children's logs go to files, named at the end if a gate failed.
    let logs = tempfile::Builder::new()
        .prefix("oncely-gates-logs-")
        .tempdir()
        .context("make a folder for the child processes' logs")?
        .keep();
    child::log_to(logs.clone());
    let env = match Env::start(store.clone(), dir, instances, cfg.json).await {
        Ok(env) if cfg.pg_fewest_round_trips => env.with_serve_flag("--pg-fewest-round-trips"),
        Ok(env) => env,
        Err(e) => {
            name_logs(&logs);
            return Err(e);
        }
    };
    let started = Instant::now();
    let mut report = Report::new(store, cfg.json, env.progress.clone());
    let total = gates.len();
    for (n, gate) in gates.into_iter().enumerate() {
        report.starting(n + 1, total, gate.title());
        let t = Instant::now();
        let mut r = gate.run(&env, &cfg).await.unwrap_or_else(|e| GateResult {
            name: gate.title().into(),
            passed: false,
            summary: format!("could not run: {e:#}"),
            details: json!({"error": format!("{e:#}")}),
        });
        r.details["seconds"] = json!(t.elapsed().as_secs_f64());
        report.push(r);
    }
    let passed = report.finish(started.elapsed())?;
    if passed {
        let _ = std::fs::remove_dir_all(&logs);
    } else {
        name_logs(&logs);
    }
    Ok(passed)
}

/// Says on standard error where the child processes' logs are (kept after a failure).
fn name_logs(logs: &std::path::Path) {
    eprintln!(
        "the child processes' logs (API servers, processor, clients): {}",
        logs.display()
    );
}

/// A Redis store in a namespace of this run's own (`namespace=oncely-gates-<uuid>` added to its
/// URL, unless the URL names one): every server and completer the gates start then sees only
/// this run's records. In the shared namespace, another deployment on the same Redis (another
/// gates run, a test's server) with its own business database would take over this run's
/// requests whose lease lapsed (its completer re-drives them through its own server) and store
/// their final response, so a client would be answered `201` for a payment that this run's
/// business database never got. Other stores are returned as they are.
fn own_namespace(store: &StoreUrl) -> StoreUrl {
    match store {
        StoreUrl::Redis(url) if !has_query_param(url, "namespace") => {
            let sep = if url.contains('?') { '&' } else { '?' };
            StoreUrl::Redis(format!(
                "{url}{sep}namespace=oncely-gates-{}",
                uuid::Uuid::new_v4().simple()
            ))
        }
        other => other.clone(),
    }
}

/// Whether `url`'s query has the parameter `name`.
fn has_query_param(url: &str, name: &str) -> bool {
    url.split_once('?').is_some_and(|(_, q)| {
        q.split('&')
            .any(|p| p.split_once('=').map_or(p, |(n, _)| n) == name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_store_gets_a_namespace_of_the_runs_own() {
        let ns = |s: &StoreUrl| match s {
            StoreUrl::Redis(u) => u
                .split(['?', '&'])
                .find_map(|p| p.strip_prefix("namespace="))
                .map(str::to_owned),
            _ => None,
        };
        let shared = StoreUrl::Redis("redis://127.0.0.1:6379?accept_volatile=true".into());
        let (one, two) = (own_namespace(&shared), own_namespace(&shared));
        let first = ns(&one).expect("a namespace");
        assert!(first.starts_with("oncely-gates-"), "{first}");
        assert_ne!(ns(&one), ns(&two), "each run its own");
        let StoreUrl::Redis(u) = &one else {
            unreachable!()
        };
        assert!(u.starts_with("redis://127.0.0.1:6379?accept_volatile=true&namespace="));
        let cluster = StoreUrl::Redis("redis+cluster://127.0.0.1:7100,127.0.0.1:7101".into());
        assert!(ns(&own_namespace(&cluster)).is_some());
        let named = StoreUrl::Redis("redis://h?namespace=mine".into());
        assert_eq!(
            own_namespace(&named),
            named,
            "the URL's own namespace is kept"
        );
        let pg = StoreUrl::Postgres("postgres://h/db".into());
        assert_eq!(own_namespace(&pg), pg);
    }
}
