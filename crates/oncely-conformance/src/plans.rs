//! The records behind the SQL stores' query plan tests (each store's `plans` tests run
//! `EXPLAIN` on its maintenance and operator queries): a table that looks like a busy server's,
//! many completed records and a few in flight, so that the planner picks what it would pick
//! there (`docs/DESIGN.md`, "The maintenance index").
//!
//! [`seed`] writes, through the store: one completed record (the template the store's test
//! then copies [`plan_rows`] times under new keys, with SQL of its own dialect), 100 abandoned
//! records (in flight, lease lapsed, a stored request) and 10 marked ones.

use crate::fixtures::{LEASE, RETENTION, claim_req, expect_claimed, tricky_response};
use oncely_core::{
    Clock, FencingToken, IdempotencyKey, Maintenance, ManualClock, RecordKey, RedriveNote, Scope,
    UnixMillis,
};

/// The abandoned records [`seed`] writes.
pub const ABANDONED: usize = 100;
/// The marked records [`seed`] writes.
pub const MARKED: usize = 10;
/// The completed records a plan test holds when `ONCELY_TEST_PLAN_ROWS` is unset.
pub const DEFAULT_PLAN_ROWS: usize = 20_000;

/// The completed records a plan test copies from the template: `ONCELY_TEST_PLAN_ROWS`
/// (e.g. `1000000` to see the plans at a million records), else [`DEFAULT_PLAN_ROWS`].
///
/// # Panics
///
/// When `ONCELY_TEST_PLAN_ROWS` is set but not a number.
pub fn plan_rows() -> usize {
    std::env::var("ONCELY_TEST_PLAN_ROWS")
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(DEFAULT_PLAN_ROWS, |v| {
            v.replace(['_', ','], "")
                .parse()
                .expect("ONCELY_TEST_PLAN_ROWS is a number of records")
        })
}

/// What [`seed`] wrote.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// The scope of every record written.
    pub scope: Scope,
    /// The completed record to copy.
    pub template: RecordKey,
    /// One abandoned record and its fencing token (the completer's note on it).
    pub abandoned: (RecordKey, FencingToken),
    /// The store clock's "now" after seeding (epoch milliseconds): every lease has lapsed.
    pub now: UnixMillis,
}

fn id(scope: &Scope, key: &str) -> RecordKey {
    RecordKey::new(
        scope.clone(),
        IdempotencyKey::new(key).expect("a valid key"),
    )
}

/// Writes the template, [`ABANDONED`] abandoned and [`MARKED`] marked records through `store`,
/// whose clock is `clock` (advanced past the leases).
///
/// # Panics
///
/// When the store fails.
pub async fn seed(store: &dyn Maintenance, clock: &ManualClock) -> Seeded {
    let scope = Scope::new(format!("plans-{}", uuid::Uuid::new_v4().simple()));
    let template = id(&scope, "template");
    let c = expect_claimed(store.claim(claim_req(&template, "{}")).await.unwrap());
    store
        .complete(&template, c.token, tricky_response(), RETENTION)
        .await
        .unwrap();
    let mut flying = Vec::new();
    for i in 0..ABANDONED + MARKED {
        let id = id(&scope, &format!("in-flight-{i}"));
        let c = expect_claimed(store.claim(claim_req(&id, "{}")).await.unwrap());
        flying.push((id, c.token));
    }
    clock.advance(LEASE * 2);
    for (id, token) in &flying[ABANDONED..] {
        store
            .note_redrive(id, *token, 0, RedriveNote::Mark)
            .await
            .unwrap();
    }
    Seeded {
        scope,
        template,
        abandoned: flying[0].clone(),
        now: clock.now_millis(),
    }
}

/// A database of a test's (or a benchmark's) own on a database server (PostgreSQL or MySQL),
/// named `<prefix>_<uuid>`, which it creates and drops: a table it fills, or a completer it
/// runs, touches nobody else's records.
#[derive(Debug, Clone)]
pub struct OwnDatabase {
    /// The server's URL, as given (its database exists: the test connects there to create and
    /// drop its own).
    pub admin: String,
    /// The own database's name.
    pub name: String,
    /// `admin` with the database name replaced by `name` (its query kept).
    pub url: String,
}

impl OwnDatabase {
    /// A fresh name on the server of `admin`.
    pub fn new(admin: &str, prefix: &str) -> Self {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let (base, query) = admin.split_once('?').unwrap_or((admin, ""));
        let server = base.rsplit_once('/').map_or(base, |(s, _)| s);
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        let url = format!("{server}/{name}{query}");
        Self {
            admin: admin.to_owned(),
            name,
            url,
        }
    }

    /// [`OwnDatabase::new`] on the server named by the environment variable `var`; `None`,
    /// after printing why the test is skipped, when it is unset.
    pub fn from_env(var: &str, prefix: &str) -> Option<Self> {
        let Some(admin) = std::env::var(var).ok().filter(|u| !u.is_empty()) else {
            eprintln!("skipped: {var} is unset (a database server URL is needed)");
            return None;
        };
        Some(Self::new(&admin, prefix))
    }
}
