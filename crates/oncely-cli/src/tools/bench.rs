//! `oncely bench`: not implemented yet.

use anyhow::{Result, bail};

/// Arguments of `oncely bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {}

/// Runs `oncely bench`; returns whether it passed.
pub async fn run(_args: Args) -> Result<bool> {
    bail!("oncely bench is not implemented yet")
}
