//! # oncely-redis
//!
//! The Redis [`KeyStore`](oncely_core::KeyStore) for Oncely, for teams whose only shared store
//! is Redis: the claim is one conditional write (a Lua script), never a bare `SET NX` lock, and
//! every later write carries a fencing token that the server checks.
//!
//! ```no_run
//! use oncely_core::{ClaimOutcome, ClaimRequest, IdempotencyKey, KeyStore, RecordKey, Scope};
//! use oncely_core::fingerprint::{DefaultFingerprinter, Fingerprinter, RequestParts};
//! use oncely_redis::{RedisConfig, RedisStore};
//! use std::time::Duration;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // The server's clock decides leases (see `ClockSource`); 2 s per round trip by default.
//! // Connecting refuses a Redis that persists nothing (see "What Redis must keep").
//! let store = RedisStore::connect_with(
//!     "redis://127.0.0.1:6379",
//!     RedisConfig::new().with_operation_timeout(Duration::from_millis(500)),
//! )
//! .await?;
//! let id = RecordKey::new(Scope::new("acct_1"), IdempotencyKey::new("order-42").unwrap());
//! let fingerprint = DefaultFingerprinter.fingerprint(
//!     &RequestParts::new("POST", "/v1/orders", br#"{"sku":"A"}"#)
//!         .with_content_type(Some(b"application/json")),
//! );
//! // Lease 30 s, replay window 24 h, retention 72 h.
//! let req = ClaimRequest::new(
//!     id, fingerprint, Duration::from_secs(30),
//!     Duration::from_secs(86_400), Duration::from_secs(259_200),
//! );
//! match store.claim(req).await? {
//!     ClaimOutcome::Claimed(claim) => { /* run the handler, then complete with claim.token */ }
//!     ClaimOutcome::InFlight { .. } => { /* 409 idempotency_request_in_flight */ }
//!     ClaimOutcome::Replay { .. } => { /* replay the stored response */ }
//!     ClaimOutcome::Mismatch => { /* 422 idempotency_key_mismatch */ }
//!     ClaimOutcome::NeedsAttention { .. } => { /* 409 idempotency_request_needs_attention */ }
//!     _ => { /* an outcome this code does not know: fail closed, never run the handler */ }
//! }
//! # Ok(()) }
//! ```
//!
//! # How it is stored
//!
//! One hash per `(scope, key)` at [`record_key`] (`oncely:{<scope-len>:<scope>:<key>}`); each
//! of claim, renew, checkpoint, complete and release, the completer's note, and a person's
//! release, resolve and retry ([`Operator`](oncely_core::Operator) on [`RedisStore`]) is one Lua
//! script that touches only that record and its entries in the maintenance index (one round
//! trip, atomic on the server). The fields:
//!
//! | field | meaning |
//! |---|---|
//! | `scope`, `key` | the identity, verbatim: only in records of the first form, written by older versions (the Redis key names it; both forms are read) |
//! | `fp_v`, `fp` | fingerprint algorithm version (decimal) and 32-byte digest (raw bytes) |
//! | `token` | the fencing token (decimal; +1 on every claim and on every change a person makes, never reset while the hash lives) |
//! | `state` | `in_flight`, `complete` or `released` |
//! | `lease`, `rp` | in flight: lease expiry (epoch ms) and recovery point (absent when none) |
//! | `created`, `expires` | claim time and end of retention (epoch ms) |
//! | `req` | in flight: the stored request (JSON, [`StoredRequest::encode`](oncely_core::StoredRequest::encode)); absent when none, and deleted by complete and release |
//! | `status`, `headers`, `body`, `retained`, `completed` | complete: the response (headers as JSON, body raw) and completion time (epoch ms) |
//! | `attempts`, `next_attempt`, `marked` | in flight, written by the completer: its re-drives so far, when it may try again, and when it gave up and marked the record for a person (epoch ms); absent until then (and in records written before they existed, which read as never re-driven) |
//!
//! Every write also sets the hash's Redis TTL to `expires - now`, so Redis deletes the record by
//! itself when its retention ends. `expires` is never earlier than a live lease's end, so a
//! record (and with it its token counter) cannot vanish under a live owner.
//!
//! The maintenance index ([`RedisStore`], "The maintenance index") is three kinds of sorted
//! sets ([`IndexKind`]) whose members are record keys: `oncely:index:lease` (in-flight records
//! by lease end), `oncely:index:marked` (records marked for a person, by mark time) and, under
//! an application clock only, `oncely:index:retention` (every record, by retention end); on a
//! Redis Cluster one of each per hash slot, `oncely:index:<kind>:{<tag>}`, in the slot of the
//! records it holds. `oncely:index:walk` marks the last walk of the whole namespace (its TTL is
//! the time to the next one).
//!
//! See [`RedisStore`] for the guarantees, [`ClockSource`] for the clock rule, and
//! [`Maintenance::reap`](oncely_core::Maintenance::reap) on [`RedisStore`] for why Redis expiry does
//! the reaping.
//!
//! # Redis Cluster
//!
//! `redis+cluster://host:port[,host:port…]` connects to a Redis Cluster through its seed
//! nodes. Every record is one hash-tagged key, so it lives in one slot on one primary, its index
//! entries are in index keys of that same slot, and every script stays atomic there; the reaper
//! and the completer read every slot's index keys, never every record.
//!
//! # What Redis must keep
//!
//! A store must keep what it acknowledged for the whole replay window. At connect the store
//! reads each node's persistence ([`Persistence`]) and refuses a node that keeps nothing
//! ([`ConnectError::Volatile`]) unless `accept_volatile=true` (in the URL, or
//! [`RedisConfig::accept_volatile`]) says that losing the replay window on restart is
//! acceptable. It warns about `appendfsync everysec` (a crash can lose up to about one second
//! of records), and about a node with a memory limit (`maxmemory` above 0) and a
//! `maxmemory-policy` other than `noeviction`, read from `INFO memory`: eviction forgets
//! records as a restart does (the `volatile-*` policies too: every record has a TTL).
//!
//! # What is not promised
//!
//! Redis replication is asynchronous: a write acknowledged by a primary that fails before
//! replicating it is lost on failover, and a retry of a lost claim then executes again. With
//! `wait_replicas=N` (1 by default on a cluster) the store answers only after `WAIT` saw N
//! replicas acknowledge, and answers `503` otherwise; [`RedisStore`] ("Failover") says exactly
//! what survives a failover and what does not. Within one primary, claims are atomic and
//! writes are fenced.

mod clock;
mod config;
mod conn;
mod decode;
mod durability;
mod error;
mod index;
mod keys;
mod keystore;
mod maintenance;
mod operator;
mod persistence;
mod scripts;
mod store;
mod url;
mod walk;

pub use clock::ClockSource;
pub use config::{
    DEFAULT_INDEX_WALK_EVERY, DEFAULT_OPERATION_TIMEOUT, DEFAULT_WAIT_TIMEOUT, RedisConfig,
};
pub use error::{
    ConnectError, InvalidUrl, OperationTimedOut, ReplicasDidNotAcknowledge, VolatileRedis,
};
pub use keys::{DEFAULT_NAMESPACE, IndexKind, record_key};
pub use persistence::Persistence;
pub use store::RedisStore;
pub use walk::IndexWalk;
