//! `oncely lint`: every state-changing operation of an OpenAPI document must accept an
//! `Idempotency-Key` header or be marked `x-oncely-unsafe-to-retry: true`.
//!
//! A thin layer over [`oncely_audit::lint`] (the rule, the vendor extensions and the `$ref`
//! handling are documented there). Reads the file (JSON or YAML; `-` reads standard input),
//! prints one line per finding, one `warning:` line per `PUT`/`DELETE` that takes no key and is
//! not marked `x-oncely-verified-idempotent: true` (check it with `oncely audit`'s
//! method-idempotency check), and a summary, or the report as JSON with `--json`. Exit status 0
//! without findings (warnings do not count), 1 with any, 2 when the file cannot be read or is
//! not an OpenAPI document.

use anyhow::{Context as _, Result};
use std::io::Read as _;
use std::path::PathBuf;

/// Arguments of `oncely lint`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The OpenAPI 3.x or Swagger 2.0 document, JSON or YAML (`-` for standard input).
    spec: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// Runs `oncely lint`; returns whether the document has no findings.
///
/// # Errors
///
/// The file cannot be read, or [`oncely_audit::lint::lint`] rejects it (not JSON/YAML, not an
/// OpenAPI document), with the line and column when known.
pub async fn run(args: Args) -> Result<bool> {
    let text = if args.spec.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("read the OpenAPI document from standard input")?;
        s
    } else {
        std::fs::read_to_string(&args.spec)
            .with_context(|| format!("read {}", args.spec.display()))?
    };
    let report =
        oncely_audit::lint::lint(&text).with_context(|| format!("lint {}", args.spec.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.render_text());
    }
    Ok(report.passed())
}
