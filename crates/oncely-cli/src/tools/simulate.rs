//! `oncely simulate`: not implemented yet.

use anyhow::{Result, bail};

/// Arguments of `oncely simulate`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {}

/// Runs `oncely simulate`; returns whether it passed.
pub async fn run(_args: Args) -> Result<bool> {
    bail!("oncely simulate is not implemented yet")
}
