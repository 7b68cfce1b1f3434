//! Deterministic discrete-event simulations of retrying fleets.
//!
//! Two models, both seeded (the same configuration always gives the same report) and both
//! returning plain result structs for a caller (the `oncely simulate` command) to print:
//!
//! - [`contention`]: many clients updating one row under optimistic concurrency, the setup of the
//!   AWS Architecture Blog post "Exponential Backoff And Jitter" (100 clients, base 5 ms, cap
//!   2 s, a network with 10 ms mean and 2 ms standard deviation delay). It compares no backoff,
//!   un-jittered exponential backoff, equal jitter, full jitter and decorrelated jitter by total
//!   work (write calls) and completion time.
//! - [`outage`]: a fleet of instances making calls through an outage, retrying with and without
//!   the retry budget, reporting the load amplification (requests sent per logical call).
//!
//! The strategies in [`Strategy`] include un-jittered ones for comparison only: the retry policy
//! offers none of them.
//!
//! ```
//! use oncely_client::simulate::{ContentionConfig, Strategy, compare_contention};
//!
//! let reports = compare_contention(&ContentionConfig::new().with_clients(10).with_runs(2));
//! assert_eq!(reports.len(), Strategy::ALL.len());
//! for r in &reports {
//!     assert_eq!(r.completed, 10);
//! }
//! ```

pub mod contention;
mod net;
pub mod outage;
mod strategy;

pub use contention::{ContentionConfig, ContentionReport, compare_contention, run_contention};
pub use outage::{OutageConfig, OutageReport, compare_budget, run_outage};
pub use strategy::Strategy;
