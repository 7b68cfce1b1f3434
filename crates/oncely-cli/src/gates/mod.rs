//! `oncely gates`: the binary gates of the guarantee, end to end, on real processes.
//!
//! 1. **Concurrency** ([`concurrency`]): N concurrent identical requests with one key -> exactly
//!    one payment, one charge and one receipt; every other answer is `409
//!    idempotency_request_in_flight` with `Retry-After` or a byte-identical replay.
//! 2. **Crash recovery** ([`crash`]): the API server kills itself with SIGKILL right after each
//!    phase commits (`--crash-after`), restarted, and the client retries with the same key ->
//!    zero repeated outside calls and one consistent final response. Then once more with no
//!    client retry at all: the in-process completer finishes the request.
//! 3. **Fleet** ([`fleet`]): retrying clients (the Oncely SDK) through a proxy that drops
//!    responses after the side effect and answers `503` with `Retry-After`, while the API server
//!    is killed and restarted mid-run -> the number of duplicate side effects, which must be 0.
//! 4. **Rolling restart** ([`rolling`]): retrying SDK clients keep paying while every API process
//!    in turn gets SIGTERM (drains, exits 0) and is started again -> zero duplicate side effects,
//!    zero lost payments, and no retry waiting on a (30-second) lease.
//!
//! 5. **gRPC concurrency** and 6. **gRPC crash recovery** ([`grpc`]): gates 1 and 2 through the
//!    gRPC Payments service (`CreatePayment`, same port), with tonic's client.
//! 7. **Webhook** ([`webhook`]): the processor's signed events delivered 50 times at once and
//!    redelivered after a receiver was SIGKILLed right after applying one -> one application
//!    per event id.
//!
//! Everything runs on this machine: the processor and the API servers are child processes on
//! free loopback ports, and the store is a fresh embedded SQLite file unless `--store` says
//! otherwise (PostgreSQL and MySQL then run the API as 3 processes sharing it).
//!
//! # Where is what
//!
//! | module | what it holds |
//! |---|---|
//! | [`runner`] | [`run`]: checks the configuration, sets up the [`env`](mod@env), runs the chosen gates in order |
//! | [`env`](mod@env) | the environment every gate shares: the store, the processor, starting API servers, the processor's ledger |
//! | [`http`] | the requests the gates make and what they keep of a response |
//! | [`concurrency`], [`crash`], [`fleet`], [`rolling`], [`webhook`] | one gate each |
//! | [`grpc`] | the concurrency and crash gates over gRPC, a file each |
//! | [`clients`] | what the fleet runs share: the SDK's settings, the retrying clients, the settling and the count of side effects |
//! | [`report`] | the output: a line per gate as it finishes, then the table or the `--json` document |
//! | [`child`], [`proxy`] | child processes; the fault-injecting proxy of the fleet gate |
//! | [`external`] | the fleet gate with external client processes (`--client-command`), for SDKs in other languages |
//! | [`fleet_client`] | `oncely fleet-client`: one such external client on the Rust SDK |
//!
//! # Adding a gate
//!
//! Write `gates/<name>.rs` with `pub async fn run(env: &Env, cfg: &GatesConfig) ->
//! Result<GateResult>`, and add a variant to [`Gate`] (its `--only` name, its title, and the
//! call in [`Gate::run`]).

mod child;
mod clients;
mod concurrency;
mod crash;
mod env;
mod external;
mod fleet;
pub mod fleet_client;
mod grpc;
mod http;
mod proxy;
mod report;
mod rolling;
mod runner;
mod webhook;

use anyhow::Result;
pub use env::Env;
pub use runner::run;
use serde_json::Value;

/// How to run the gates.
#[derive(Debug, Clone)]
pub struct GatesConfig {
    /// The key store; `None` = a fresh SQLite file in a temporary directory.
    pub store: Option<crate::serve::StoreUrl>,
    /// Concurrent identical requests in the concurrency gate (default 200).
    pub concurrency: usize,
    /// API server processes sharing the store (default 1 for SQLite, 3 for PostgreSQL and MySQL).
    pub instances: Option<usize>,
    /// Clients in the fleet gate (default 20), each making `fleet_calls` logical payments.
    pub fleet_clients: usize,
    /// Logical payments per fleet client (default 10).
    pub fleet_calls: usize,
    /// Print JSON instead of a table.
    pub json: bool,
    /// Run only these gates (their [`Gate::name`]s); empty = all.
    pub only: Vec<String>,
    /// The fleet gate's clients as external processes (`sh -c` this command), for SDKs in
    /// other languages ([`external`]); `None` = the Rust SDK in process.
    pub client_command: Option<String>,
    /// Start the API servers with `--pg-fewest-round-trips` (PostgreSQL: the claim sent with
    /// the `BEGIN`, the completion with the `COMMIT`; default off).
    pub pg_fewest_round_trips: bool,
}

impl Default for GatesConfig {
    fn default() -> Self {
        Self {
            store: None,
            concurrency: 200,
            instances: None,
            fleet_clients: 20,
            fleet_calls: 10,
            json: false,
            only: Vec::new(),
            client_command: None,
            pg_fewest_round_trips: false,
        }
    }
}

/// One gate's verdict.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GateResult {
    /// The gate's title ([`Gate::title`]).
    pub name: String,
    /// Whether it passed.
    pub passed: bool,
    /// One line of what was measured.
    pub summary: String,
    /// The measurements.
    pub details: Value,
}

/// A gate, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// N concurrent identical requests on one key ([`concurrency`]).
    Concurrency,
    /// SIGKILL after each recovery point, restart, retry ([`crash`]).
    Crash,
    /// Retrying SDK clients through injected faults and a killed server ([`fleet`]).
    Fleet,
    /// Retrying SDK clients while every server is restarted in turn with SIGTERM ([`rolling`]).
    Rolling,
    /// N concurrent identical gRPC calls on one key ([`grpc::concurrency`]).
    GrpcConcurrency,
    /// SIGKILL after each recovery point, restart, retry over gRPC ([`grpc::crash`]).
    GrpcCrash,
    /// Concurrent and post-crash redeliveries of webhook events ([`webhook`]).
    Webhook,
}

impl Gate {
    /// Every gate, in the order they run.
    pub const ALL: [Self; 7] = [
        Self::Concurrency,
        Self::Crash,
        Self::Fleet,
        Self::Rolling,
        Self::GrpcConcurrency,
        Self::GrpcCrash,
        Self::Webhook,
    ];

    /// The name `--only` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::Crash => "crash",
            Self::Fleet => "fleet",
            Self::Rolling => "rolling",
            Self::GrpcConcurrency => "grpc-concurrency",
            Self::GrpcCrash => "grpc-crash",
            Self::Webhook => "webhook",
        }
    }

    /// The name in the report.
    pub fn title(self) -> &'static str {
        match self {
            Self::Concurrency => "concurrency",
            Self::Crash => "crash recovery",
            Self::Fleet => "fleet",
            Self::Rolling => "rolling restart",
            Self::GrpcConcurrency => "grpc concurrency",
            Self::GrpcCrash => "grpc crash recovery",
            Self::Webhook => "webhook",
        }
    }

    /// The gate named `name` (see [`Gate::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == name)
    }

    /// Runs the gate in `env`.
    ///
    /// # Errors
    ///
    /// The gate could not run (a process did not start, a request failed outright); a gate
    /// that ran and measured a violation returns a [`GateResult`] with `passed: false`.
    pub async fn run(self, env: &Env, cfg: &GatesConfig) -> Result<GateResult> {
        match self {
            Self::Concurrency => concurrency::run(env, cfg).await,
            Self::Crash => crash::run(env, cfg).await,
            Self::Fleet => fleet::run(env, cfg).await,
            Self::Rolling => rolling::run(env, cfg).await,
            Self::GrpcConcurrency => grpc::concurrency::run(env, cfg).await,
            Self::GrpcCrash => grpc::crash::run(env, cfg).await,
            Self::Webhook => webhook::run(env, cfg).await,
        }
    }
}
