//! `oncely lint`: not implemented yet.

use anyhow::{Result, bail};

/// Arguments of `oncely lint`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {}

/// Runs `oncely lint`; returns whether it passed.
pub async fn run(_args: Args) -> Result<bool> {
    bail!("oncely lint is not implemented yet")
}
