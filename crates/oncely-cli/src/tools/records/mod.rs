//! `oncely records`: what a person does to the records of a key store (list, show, release,
//! resolve, retry), through the stores' [`Operator`] operations. Every change is fenced on the
//! version of the record this command read (a concurrent change makes it fail, never a lost
//! update), asks for confirmation at a terminal (`--yes` skips it), and is logged for the
//! audit trail (the `oncely::audit` log line on standard error, and `--audit-log FILE` as one
//! JSON line per change).

mod render;

use crate::serve::{Existing, StoreUrl, open_existing};
use anyhow::{Context as _, Result, anyhow, bail};
use oncely_core::{
    IdempotencyKey, Operator, OperatorError, Record, RecordFilter, RecordKey, RecordVersion, Scope,
    StoredResponse, UnixMillis,
};
use render::{span, status_line, table, text, view, when};
use serde_json::{Value, json};
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `oncely records`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Key store, as `oncely serve --store` takes it: a file path or sqlite://PATH,
    /// postgres://…, mysql://…, redis://… or redis+cluster://….
    #[arg(long, global = true, default_value = "oncely.sqlite3")]
    store: StoreUrl,
    #[command(subcommand)]
    command: Command,
}

/// The subcommands.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// List records (not released ones), in (scope, key) order; every filter given must hold.
    List {
        /// Only in-flight records marked for a person (the completer gave up on them; retries
        /// are answered 409 idempotency_request_needs_attention).
        #[arg(long)]
        marked: bool,
        /// Only in-flight records.
        #[arg(long)]
        in_flight: bool,
        /// Only abandoned records: in flight, lease lapsed, not marked.
        #[arg(long)]
        abandoned: bool,
        /// Only this scope (the authenticated caller).
        #[arg(long)]
        scope: Option<String>,
        /// Only records whose stored request is on this path or below it (e.g. /v1/payments);
        /// only in-flight records keep their request.
        #[arg(long)]
        route: Option<String>,
        /// Only records claimed at least this long ago: a number and a unit, s, m, h or d
        /// (e.g. 90s, 30m, 2h, 3d).
        #[arg(long, value_parser = parse_age)]
        older_than: Option<Duration>,
        /// Records read per page (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// Where to go on: the `next` cursor a previous page printed.
        #[arg(long)]
        cursor: Option<String>,
        /// Print JSON (`{"records": [...], "next": CURSOR|null}`) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one record: every field; the stored body only with --body.
    Show {
        /// The record's scope.
        scope: String,
        /// The record's Idempotency-Key.
        key: String,
        /// Also print the stored response body (as text when it is UTF-8, else as hex).
        #[arg(long)]
        body: bool,
        /// The replay window of the servers (seconds), to say until when a complete record
        /// replays (the store does not keep it).
        #[arg(long, default_value_t = 86_400)]
        replay_window_secs: u64,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Forget a record: the next request with its key executes anew. Refused while its lease
    /// is live unless --force, which fences the request still running off (its token is
    /// raised first: it can no longer complete).
    Release {
        /// The record's scope.
        scope: String,
        /// The record's Idempotency-Key.
        key: String,
        /// Release even while the lease is live.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Complete an in-flight record (a marked one, typically) with the answer a person
    /// decided: every retry with its key replays it.
    Resolve {
        /// The record's scope.
        scope: String,
        /// The record's Idempotency-Key.
        key: String,
        /// The status to replay (200 to 599).
        #[arg(long)]
        status: u16,
        /// A file holding the body to replay (default: empty).
        #[arg(long)]
        body: Option<PathBuf>,
        /// A header to replay, 'Name: value' (repeatable).
        #[arg(long = "header")]
        headers: Vec<String>,
        /// How long to keep the record from now, in seconds (the servers' retention).
        #[arg(long, default_value_t = 259_200)]
        retention_secs: u64,
        /// Resolve even while the lease is live (the running request is fenced off).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Lift the completer's mark: it re-drives the request once more (the record must have
    /// kept its request).
    Retry {
        /// The record's scope.
        scope: String,
        /// The record's Idempotency-Key.
        key: String,
        /// The completer's --completer-max-attempts (the record is left one attempt under it).
        #[arg(long, default_value_t = oncely_jobs::RedrivePolicy::DEFAULT_MAX_ATTEMPTS)]
        completer_max_attempts: u32,
        #[command(flatten)]
        change: ChangeArgs,
    },
}

/// What every change takes: the confirmation and the audit trail.
#[derive(clap::Args, Debug)]
struct ChangeArgs {
    /// Why (kept in the audit log line), e.g. a ticket number.
    #[arg(long)]
    reason: String,
    /// Who runs it (default: $USER).
    #[arg(long)]
    operator: Option<String>,
    /// Do not ask for confirmation (required when standard input is not a terminal).
    #[arg(long)]
    yes: bool,
    /// Also append the audit record to this file, one JSON object per line.
    #[arg(long)]
    audit_log: Option<PathBuf>,
}

/// `oncely records`.
pub async fn run(args: Args) -> Result<bool> {
    let store = open(&args.store).await?;
    match args.command {
        Command::List {
            marked,
            in_flight,
            abandoned,
            scope,
            route,
            older_than,
            limit,
            cursor,
            json,
        } => {
            let filter = RecordFilter::default()
                .with_marked(marked)
                .with_in_flight(in_flight)
                .with_abandoned(abandoned)
                .with_scope(scope.map(Scope::new))
                .with_route(route)
                .with_older_than(older_than);
            let page = store
                .list_records(&filter, limit, cursor.as_deref())
                .await
                .map_err(|e| match e {
                    OperatorError::BadCursor => anyhow!(
                        "--cursor is not a cursor of this store's listing (give the `next` a previous page printed)"
                    ),
                    e => anyhow!(e).context("list the records"),
                })?;
            let now = now_millis();
            if json {
                let records: Vec<Value> = page
                    .records
                    .iter()
                    .map(|r| view(r, now, None, false))
                    .collect();
                println!("{}", json!({"records": records, "next": page.next}));
            } else {
                print!("{}", table(&page.records, now));
                match &page.next {
                    Some(next) => println!("more: --cursor {next}"),
                    None => println!("{} records; no more", page.records.len()),
                }
            }
            Ok(true)
        }
        Command::Show {
            scope,
            key,
            body,
            replay_window_secs,
            json,
        } => {
            let id = record_key(&scope, &key)?;
            let rec = read(&*store, &id).await?;
            let window = Some(Duration::from_secs(replay_window_secs));
            let v = view(&rec, now_millis(), window, body);
            if json {
                println!("{v}");
            } else {
                print!("{}", text(&v));
            }
            Ok(true)
        }
        Command::Release {
            scope,
            key,
            force,
            change,
        } => {
            let id = record_key(&scope, &key)?;
            let what = if force { "release --force" } else { "release" };
            apply(&*store, &args.store, &id, what, &change, async |seen| {
                store.release_record(&id, seen, force).await
            })
            .await
        }
        Command::Resolve {
            scope,
            key,
            status,
            body,
            headers,
            retention_secs,
            force,
            change,
        } => {
            let id = record_key(&scope, &key)?;
            let response = decided_response(status, body.as_deref(), &headers)?;
            let retention = Duration::from_secs(retention_secs);
            let what = format!(
                "resolve --status {status}{}",
                if force { " --force" } else { "" }
            );
            apply(&*store, &args.store, &id, &what, &change, async |seen| {
                store
                    .resolve_record(&id, seen, response.clone(), retention, force)
                    .await
            })
            .await
        }
        Command::Retry {
            scope,
            key,
            completer_max_attempts,
            change,
        } => {
            let id = record_key(&scope, &key)?;
            let attempts = completer_max_attempts.saturating_sub(1);
            apply(&*store, &args.store, &id, "retry", &change, async |seen| {
                store.retry_record(&id, seen, attempts).await
            })
            .await
        }
    }
}

/// The store behind `url`, as an [`Operator`].
async fn open(url: &StoreUrl) -> Result<Arc<dyn Operator>> {
    if matches!(url, StoreUrl::Memory) {
        bail!(
            "the memory store lives inside one server process: oncely records needs a shared store (SQLite, PostgreSQL, MySQL, Redis)"
        );
    }
    Ok(match open_existing(url).await? {
        Existing::Sqlite(s) => Arc::new(s),
        #[cfg(feature = "postgres")]
        Existing::Postgres(s) => Arc::new(s),
        #[cfg(feature = "mysql")]
        Existing::Mysql(s) => Arc::new(s),
        Existing::Redis(s) => Arc::new(s),
    })
}

fn record_key(scope: &str, key: &str) -> Result<RecordKey> {
    let key = IdempotencyKey::new(key).map_err(|e| anyhow!("invalid key {key:?}: {e}"))?;
    Ok(RecordKey::new(Scope::new(scope), key))
}

async fn read(store: &dyn Operator, id: &RecordKey) -> Result<Record> {
    store
        .get(id)
        .await
        .context("read the record")?
        .ok_or_else(|| {
            anyhow!(
                "no record of scope {:?} and key {:?}",
                id.scope.as_str(),
                id.key.as_str()
            )
        })
}

/// Reads the record, shows it, asks, makes the change `op` on the version read, logs it.
async fn apply(
    store: &dyn Operator,
    url: &StoreUrl,
    id: &RecordKey,
    what: &str,
    change: &ChangeArgs,
    op: impl AsyncFnOnce(RecordVersion) -> Result<Record, OperatorError>,
) -> Result<bool> {
    let before = read(store, id).await?;
    let now = now_millis();
    eprintln!(
        "{what}: scope {:?}, key {:?}, now {} (fencing token {})",
        id.scope.as_str(),
        id.key.as_str(),
        status_line(&before, now),
        before.token.0
    );
    confirm(change.yes, what)?;
    let operator = change
        .operator
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    let seen = RecordVersion::of(&before);
    let result = op(seen).await;
    let after = match &result {
        Ok(rec) => json!({"state": rec.state_name(), "token": rec.token.0}),
        Err(e) => json!({"error": e.to_string()}),
    };
    let entry = json!({
        "at": now_millis(),
        "operator": operator,
        "reason": change.reason,
        "change": what,
        "store": url.kind(),
        "scope": id.scope.as_str(),
        "key": id.key.as_str(),
        "before": {
            "state": before.state_name(),
            "token": before.token.0,
            "marked_at": before.redrives.marked_at,
            "attempts": before.redrives.attempts,
        },
        "after": after,
    });
    tracing::info!(target: "oncely::audit", operator = %operator, reason = %change.reason,
        change = what, store = url.kind(), scope = id.scope.as_str(), key = id.key.as_str(),
        before_state = before.state_name(), before_token = before.token.0,
        after = %entry["after"], "operator change");
    if let Some(path) = &change.audit_log {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("open the audit log {}", path.display()))?;
        writeln!(f, "{entry}")
            .with_context(|| format!("write the audit log {}", path.display()))?;
    }
    match result {
        Ok(after) => {
            println!(
                "{what}: done; the record is now {} (fencing token {})",
                status_line(&after, now_millis()),
                after.token.0
            );
            Ok(true)
        }
        Err(OperatorError::LeaseLive { lease_expires_at }) => bail!(
            "refused: the lease is live for {} more (until {}): its request may still be running; wait, or pass --force to fence it off",
            span(lease_expires_at - now_millis()),
            when(lease_expires_at)
        ),
        Err(e @ OperatorError::Changed { .. }) => {
            Err(anyhow!(e).context("refused, nothing changed"))
        }
        Err(e) => Err(anyhow!(e).context("refused, nothing changed")),
    }
}

/// Asks at a terminal; refuses without one unless `--yes`.
fn confirm(yes: bool, what: &str) -> Result<()> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!(
            "refusing to {what} without confirmation: standard input is not a terminal; pass --yes"
        );
    }
    eprint!("{what} this record? Type yes to go on: ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if answer.trim() != "yes" {
        bail!("not confirmed; nothing changed");
    }
    Ok(())
}

/// The response a person decided, checked as HTTP would take it.
fn decided_response(
    status: u16,
    body: Option<&std::path::Path>,
    headers: &[String],
) -> Result<StoredResponse> {
    if !(200..=599).contains(&status) {
        bail!("--status {status}: a final HTTP status, 200 to 599");
    }
    let mut pairs = Vec::new();
    for h in headers {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| anyhow!("--header {h:?}: expected 'Name: value'"))?;
        let name = http::HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| anyhow!("--header {h:?}: {:?} is not a header name", name.trim()))?;
        let value = http::HeaderValue::from_str(value.trim())
            .map_err(|_| anyhow!("--header {h:?}: the value is not a valid header value"))?;
        pairs.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
    }
    let body = match body {
        Some(path) => {
            std::fs::read(path).with_context(|| format!("read --body {}", path.display()))?
        }
        None => Vec::new(),
    };
    Ok(StoredResponse::new(status, pairs, body))
}

/// `90s`, `30m`, `2h`, `3d` (or plain seconds).
fn parse_age(s: &str) -> Result<Duration, String> {
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?}: expected a number and a unit (90s, 30m, 2h, 3d)"))?;
    let secs = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit is one of s, m, h, d")),
    };
    Ok(Duration::from_secs(n.saturating_mul(secs)))
}

fn now_millis() -> UnixMillis {
    oncely_core::Clock::now_millis(&oncely_core::SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_decided_responses_are_checked() {
        assert_eq!(parse_age("90s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_age("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_age("3d").unwrap(), Duration::from_secs(3 * 86_400));
        assert_eq!(parse_age("15").unwrap(), Duration::from_secs(15));
        assert!(parse_age("2w").is_err());
        assert!(parse_age("h").is_err());
        let r = decided_response(201, None, &["Content-Type: application/json".into()]).unwrap();
        assert_eq!(r.status, 201);
        assert_eq!(
            r.headers,
            vec![("content-type".to_owned(), b"application/json".to_vec())]
        );
        assert!(decided_response(99, None, &[]).is_err());
        assert!(decided_response(600, None, &[]).is_err());
        assert!(decided_response(200, None, &["no colon".into()]).is_err());
        assert!(decided_response(200, None, &["bad name: x".into()]).is_err());
        assert!(decided_response(200, None, &["x-ok: line\nbreak".into()]).is_err());
    }
}
