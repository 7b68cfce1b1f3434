//! The tools that work on anybody's API (`audit`, `lint`), the retry simulations (`simulate`)
//! the load generator (`bench`), and what a person does to a store's records (`records`).

pub mod audit;
pub mod bench;
pub mod lint;
pub mod records;
pub mod simulate;
