//! The `oncely` command line: the subcommands and their flags (clap), and the flags `serve`
//! and `contract` share (the idempotency policy, the completer's re-drives, the server's
//! limits). What each subcommand does is dispatched in `main.rs`.

use crate::{processor, serve, tools};
use anyhow::Result;
use clap::{Parser, Subcommand};
use oncely_core::{InFlightBehavior, Policy, StatusProfile};
use serve::StoreUrl;
use std::net::SocketAddr;
use std::time::Duration;

/// Oncely: safe retried writes, end to end (effectively-once: at-least-once delivery plus
/// duplicate collapse inside a key scope and replay window).
#[derive(Parser)]
#[command(name = "oncely", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// The idempotency policy flags shared by `serve` and `contract`.
#[derive(clap::Args, Clone, Debug)]
pub struct PolicyArgs {
    /// How long a completed key replays its stored response, in seconds.
    #[arg(long, default_value_t = 86_400)]
    replay_window_secs: u64,
    /// How long records are kept before the reaper deletes them, in seconds (>= the window).
    #[arg(long, default_value_t = 259_200)]
    retention_secs: u64,
    /// The lease of every claim, in milliseconds; renewed every third of it while a handler
    /// runs, so a store stall or process pause up to about two-thirds of it is survived. At
    /// least 1000 (choose it above the store's worst answer time plus a renewal interval);
    /// shorter only with --allow-short-lease.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// Accept a --lease-ms under 1000: a store stall or pause longer than two-thirds of it lets
    /// a duplicate take a live request over.
    #[arg(long)]
    allow_short_lease: bool,
    /// Status profile for the error codes: ietf, stripe or resend.
    #[arg(long, default_value = "ietf")]
    profile: StatusProfile,
    /// Wait up to this many milliseconds for an in-flight duplicate's result instead of
    /// answering 409 at once (0 = answer 409 at once).
    #[arg(long, default_value_t = 0)]
    in_flight_wait_ms: u64,
    /// Answer an in-flight duplicate `202 Accepted` with `Location: /v1/idempotency-keys/{key}`
    /// (the key's state) and `Retry-After`, instead of `409` (for generated SDKs that give up on
    /// a 409 after a couple of retries).
    #[arg(long, conflicts_with = "in_flight_wait_ms")]
    in_flight_accepted: bool,
}

impl PolicyArgs {
    /// The least `--lease-ms` accepted without `--allow-short-lease`.
    const SHORTEST_LEASE_MS: u64 = 1000;

    /// Refuses a lease under a second unless asked to insist (`docs/DESIGN.md`, "Leases and
    /// fencing tokens").
    pub fn check_lease(&self) -> Result<()> {
        if self.lease_ms < Self::SHORTEST_LEASE_MS && !self.allow_short_lease {
            anyhow::bail!(
                "--lease-ms {} is under {} ms: renewals run every third of the lease, so a store stall or process pause longer than about two-thirds of it ({} ms) would let a duplicate take a live request over; choose a lease above the store's worst answer time plus a renewal interval, or pass --allow-short-lease to insist",
                self.lease_ms,
                Self::SHORTEST_LEASE_MS,
                self.lease_ms * 2 / 3
            );
        }
        Ok(())
    }

    pub fn policy(&self) -> Policy {
        let lease = Duration::from_millis(self.lease_ms);
        let in_flight = if self.in_flight_accepted {
            InFlightBehavior::Accepted {
                status_url: "/v1/idempotency-keys/{key}",
            }
        } else if self.in_flight_wait_ms == 0 {
            InFlightBehavior::Reject
        } else {
            InFlightBehavior::Wait {
                max: Duration::from_millis(self.in_flight_wait_ms),
                poll: Duration::from_millis(50),
            }
        };
        Policy::default()
            .with_replay_window(Duration::from_secs(self.replay_window_secs))
            .with_retention(Duration::from_secs(self.retention_secs))
            .with_lease(lease)
            // At least 1 ms, so that a 1-2 ms lease is refused by validation, not by a zero
            // heartbeat.
            .with_heartbeat((lease / 3).max(Duration::from_millis(1)))
            .with_profile(self.profile)
            .with_in_flight(in_flight)
    }
}

/// How hard the completer tries before it marks a record for a person
/// (`oncely_jobs::RedrivePolicy`).
#[derive(clap::Args, Clone, Debug)]
pub struct RedriveArgs {
    /// Re-drives one abandoned request gets; when they have not finished it, the completer
    /// marks it for a person (never re-driven again; retries are answered
    /// 409 idempotency_request_needs_attention; the reaper logs it on every pass).
    #[arg(long, default_value_t = oncely_jobs::RedrivePolicy::DEFAULT_MAX_ATTEMPTS)]
    completer_max_attempts: u32,
    /// Seconds between a record's first and second re-drive; each later pause doubles.
    #[arg(long, default_value_t = 30)]
    completer_backoff_secs: u64,
    /// The longest pause between two re-drives of one record, in seconds.
    #[arg(long, default_value_t = 600)]
    completer_backoff_cap_secs: u64,
}

impl RedriveArgs {
    pub fn policy(&self) -> oncely_jobs::RedrivePolicy {
        oncely_jobs::RedrivePolicy::new(
            self.completer_max_attempts,
            Duration::from_secs(self.completer_backoff_secs),
            Duration::from_secs(self.completer_backoff_cap_secs),
        )
    }
}

/// The server's limits against slow clients, and its shutdown grace (see serve/server.rs).
#[derive(clap::Args, Clone, Debug)]
pub struct LimitArgs {
    /// Seconds a client has to send a whole request head, from the connection's accept or
    /// the previous response (also bounds an idle kept-alive connection).
    #[arg(long, default_value_t = 10)]
    header_read_timeout_secs: u64,
    /// Seconds the server waits for each next piece of a request body.
    #[arg(long, default_value_t = 30)]
    body_read_timeout_secs: u64,
    /// Seconds a connection with no request running stays open.
    #[arg(long, default_value_t = 60)]
    idle_timeout_secs: u64,
    /// The most open client connections (capped by the open-file limit minus 64); more
    /// clients wait in the listen backlog.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds running requests may finish after SIGTERM; those still running then are
    /// suspended at their recovery points so their retries resume at once, except a request
    /// inside an outside call: it keeps its lease until the call returns (at most the
    /// processor timeout plus 2 seconds), and stops at its next recovery point.
    #[arg(long, default_value_t = 20)]
    shutdown_grace_secs: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> serve::server::Limits {
        serve::server::Limits {
            header_read_timeout: Duration::from_secs(self.header_read_timeout_secs.max(1)),
            body_read_timeout: Duration::from_secs(self.body_read_timeout_secs.max(1)),
            idle_timeout: Duration::from_secs(self.idle_timeout_secs.max(1)),
            max_connections: self.max_connections,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_secs),
        }
    }
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Serve the reference payments API, over REST and over gRPC on the same port.
    ///
    /// gRPC: the service oncely.payments.v1.Payments
    /// (crates/oncely-grpc/proto/oncely/payments/v1/payments.proto), HTTP/2 without TLS at the
    /// same address (h2c, what a gRPC client sends to an http:// address), routed by path
    /// (/oncely.payments.v1.Payments/CreatePayment and /GetPayment). CreatePayment requires the
    /// idempotency-key metadata entry and the caller's Authorization: Bearer ACCOUNT, and
    /// shares the store and the payment flow with POST /v1/payments. Its statuses and the A6
    /// retry policy for stock clients: `oncely contract`, "gRPC".
    Serve {
        /// Address to listen on, for REST and gRPC (port 0 picks a free one; the address is
        /// printed).
        #[arg(long, default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// Key store: a file path or sqlite://PATH (the embedded default), memory,
        /// postgres://…, MySQL 8 / MariaDB 10.6+ (mysql://user:password@host:3306/db),
        /// redis://… or a Redis Cluster, redis+cluster://HOST:PORT[,HOST:PORT…] (seed nodes;
        /// rediss+cluster:// for TLS). With PostgreSQL and MySQL the business tables live in the
        /// same database (one commit per phase).
        ///
        /// Redis must keep what it acknowledged: a Redis (or any cluster node) that persists
        /// nothing (appendonly no, save "") is refused, because a restart would forget every
        /// key and a retry across it would execute again; add ?accept_volatile=true to the URL
        /// to accept losing the replay window on restart. appendfsync everysec is accepted
        /// with a warning (a crash can lose up to about 1 second of records). On a cluster
        /// every claim, recovery point and completion waits for 1 replica (WAIT, 500 ms) and
        /// is answered 503 idempotency_store_unavailable when it does not arrive; set
        /// ?wait_replicas=N&wait_timeout_ms=M (also on redis://; wait_replicas=0 turns it off).
        /// ?namespace=NAME keeps the records under a key prefix of their own (default oncely):
        /// the servers of one namespace must share one business database.
        #[arg(long, default_value = "oncely.sqlite3")]
        store: StoreUrl,
        /// The outside card processor and mailer (`oncely processor`); without it one is
        /// started in this process.
        #[arg(long)]
        processor_url: Option<String>,
        /// The timeout of every call to the card processor and the mailer, in milliseconds;
        /// a graceful shutdown waits this long plus 2 seconds for a request inside such a call.
        #[arg(long, default_value_t = 10_000)]
        processor_timeout_ms: u64,
        /// Where business data goes with the memory or Redis key store (embedded SQLite).
        #[arg(long)]
        business_db: Option<String>,
        /// PostgreSQL only: send each transactional claim with its transaction's BEGIN and
        /// each final completion with its COMMIT, one message each, so that a first execution
        /// makes as many round trips as the same handler without idempotency. For a database
        /// across a network (a round trip of 0.3 ms or more); off by default, because each
        /// message is planned anew and the claim of a key that exists (a replay, a mismatch, a
        /// duplicate) fails its insert on purpose, which PostgreSQL logs as an ERROR holding
        /// the scope and key (docs/DESIGN.md, "The claim goes out with the begin").
        #[arg(long)]
        pg_fewest_round_trips: bool,
        /// TESTING ONLY: kill the process (SIGKILL) right after this recovery point commits
        /// (payment_recorded, charge_created, receipt_sent, response_stored; webhook_applied:
        /// after a webhook event's transaction committed, before its answer is sent).
        #[arg(long)]
        crash_after: Option<String>,
        /// The in-process completer finishes requests whose lease lapsed at least this many
        /// milliseconds ago (longer than a client's whole retry schedule, so a client still
        /// retrying resumes its own request first).
        #[arg(long, default_value_t = 60_000)]
        completer_grace_ms: u64,
        /// How often the in-process completer looks, in milliseconds.
        #[arg(long, default_value_t = 5_000)]
        completer_every_ms: u64,
        /// Do not run the completer in this process (run `oncely complete` elsewhere).
        #[arg(long)]
        no_completer: bool,
        #[command(flatten)]
        redrive: RedriveArgs,
        /// How often the in-process reaper deletes records past retention, in seconds
        /// (0 = never; run `oncely reap` elsewhere).
        #[arg(long, default_value_t = 300)]
        reap_every_secs: u64,
        /// `off` serves the same endpoints without the idempotency layer (benchmark baseline).
        #[arg(long, default_value = "on", value_parser = ["on", "off"])]
        idempotency: String,
        /// The Standard Webhooks secret (whsec_ and base64) the processor signs its events with;
        /// POST /webhooks/processor verifies every delivery with it before any claim. The
        /// default is a well-known test secret (the processor's default too): set your own
        /// outside tests, on both.
        #[arg(long, env = "ONCELY_WEBHOOK_SECRET", hide_env_values = true, default_value = processor::webhooks::DEV_WEBHOOK_SECRET)]
        webhook_secret: String,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Run the simulated outside card processor and mailer (and webhook sender).
    Processor {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8081")]
        addr: SocketAddr,
        /// The Standard Webhooks secret (`whsec_<base64>`) its charge.succeeded events are signed
        /// with; the API server must verify with the same one. The default is a well-known
        /// test secret: set your own outside tests.
        #[arg(long, env = "ONCELY_WEBHOOK_SECRET", hide_env_values = true, default_value = processor::webhooks::DEV_WEBHOOK_SECRET)]
        webhook_secret: String,
        /// Milliseconds `POST /charges` waits before answering, after the charge executed (a
        /// slow card network).
        #[arg(long, default_value_t = 0)]
        charge_delay_ms: u64,
        /// Milliseconds `POST /emails` waits before answering, after the e-mail was queued.
        #[arg(long, default_value_t = 0)]
        email_delay_ms: u64,
    },
    /// Run the end-to-end gates (the main job); exit status 1 if any fails.
    Gates {
        /// Key store (default: a fresh embedded SQLite file); postgres://… and mysql://… run 3
        /// API processes.
        /// Redis and Redis Cluster URLs as for `oncely serve --store` (e.g.
        /// redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102).
        #[arg(long)]
        store: Option<StoreUrl>,
        /// Concurrent identical requests in the concurrency gate.
        #[arg(long, short = 'n', default_value_t = 200)]
        concurrency: usize,
        /// API server processes sharing the store (default 1, or 3 with PostgreSQL; the rolling
        /// restart gate runs at least 2).
        #[arg(long)]
        instances: Option<usize>,
        /// Clients in the fleet and rolling restart gates.
        #[arg(long, default_value_t = 20)]
        fleet_clients: usize,
        /// Logical payments per fleet client.
        #[arg(long, default_value_t = 10)]
        fleet_calls: usize,
        /// Print machine-readable JSON.
        #[arg(long)]
        json: bool,
        /// Run only these gates: concurrency, crash, fleet, rolling, grpc-concurrency, grpc-crash,
        /// webhook (repeatable; default all).
        #[arg(long)]
        only: Vec<String>,
        /// The fleet gate's clients as external processes: `sh -c COMMAND`, --fleet-clients of
        /// them, each given the proxy URL, account, key prefix, call count and SDK settings in
        /// ONCELY_FLEET_* variables and printing one JSON line per call (conformance/README.md,
        /// "The fleet run"). For SDKs in other languages.
        #[arg(long)]
        client_command: Option<String>,
        /// Start the API servers with `--pg-fewest-round-trips` (PostgreSQL only: each claim
        /// sent with its BEGIN, each final completion with its COMMIT).
        #[arg(long)]
        pg_fewest_round_trips: bool,
    },
    /// Print the integrator contract (Markdown) from the live configuration.
    Contract {
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Serve the retry conformance scenarios (conformance/retry/README.md) as a scripted fault
    /// server; prints its URL as the first line of standard output and serves until killed.
    Testbench {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:0")]
        addr: SocketAddr,
        /// The scenario file (default: conformance/retry/scenarios.json as it was at build time).
        #[arg(long)]
        scenarios: Option<std::path::PathBuf>,
    },
    /// One fleet client on the Rust SDK, for `oncely gates --only fleet --client-command`:
    /// reads ONCELY_FLEET_* and prints one JSON line per call.
    #[command(hide = true)]
    FleetClient,
    /// Delete records past retention, in bounded batches.
    Reap {
        /// Key store.
        #[arg(long)]
        store: StoreUrl,
        /// Records deleted per batch.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
    /// Probe anybody's HTTP API for the idempotency contract; exit status 1 on any FAIL.
    Audit(tools::audit::Args),
    /// Check an OpenAPI document: every state-changing operation takes an Idempotency-Key or
    /// is marked unsafe to retry; exit status 1 on any finding.
    Lint(tools::lint::Args),
    /// Simulate clients contending and fleets retrying through an outage, per backoff strategy.
    Simulate(tools::simulate::Args),
    /// Load-test a running server with a key per request (unique, duplicate share, or none).
    Bench(tools::bench::Args),
    /// Act on records as a person: list them, show one, release, resolve or retry one (the
    /// way out for a request the completer marked; runbook: docs/OPERATIONS.md).
    Records(tools::records::Args),
    /// Finish abandoned in-flight requests by re-driving them through a running server.
    Complete {
        /// Key store.
        #[arg(long)]
        store: StoreUrl,
        /// The running API server that re-executes them.
        #[arg(long)]
        server_url: String,
        /// Only requests whose lease lapsed at least this many milliseconds ago.
        #[arg(long, default_value_t = 30_000)]
        grace_ms: u64,
        /// At most this many requests.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        #[command(flatten)]
        redrive: RedriveArgs,
    },
}
