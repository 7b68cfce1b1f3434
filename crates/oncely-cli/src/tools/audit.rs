//! `oncely audit`: not implemented yet.

use anyhow::{Result, bail};

/// Arguments of `oncely audit`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {}

/// Runs `oncely audit`; returns whether it passed.
pub async fn run(_args: Args) -> Result<bool> {
    bail!("oncely audit is not implemented yet")
}
