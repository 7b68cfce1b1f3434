//! The tools that work on anybody's API (`audit`, `lint`), the retry simulations (`simulate`)
//! and the load generator (`bench`).

pub mod audit;
pub mod bench;
pub mod lint;
pub mod simulate;
