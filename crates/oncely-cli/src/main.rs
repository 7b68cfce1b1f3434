//! `oncely`: the reference payments API, the end-to-end gates, the integrator contract and the
//! background jobs. Run `oncely --help`.

// A binary: `pub` marks what a module offers its siblings, not a public API.
#![allow(unreachable_pub)]

mod cli;
mod contract;
mod gates;
mod jobs;
mod processor;
mod serve;
mod tools;

use anyhow::{Context as _, Result};
use clap::Parser as _;
use cli::{Cli, Command};
use serve::ServeConfig;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    use std::io::IsTerminal as _;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal, never into a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The gates print their own progress and table; retries they provoke on purpose are
    // logged only when RUST_LOG asks for them.
    init_tracing(match cli.command {
        // The retries and budget refusals the gates provoke on purpose are not news.
        Command::Gates { .. } | Command::FleetClient => {
            "warn,oncely_client=error,oncely_tower=error"
        }
        Command::Audit(_) | Command::Bench(_) | Command::Simulate(_) => "warn",
        Command::Reap { .. } | Command::Complete { .. } => "warn,oncely=info",
        Command::Records(_) => "warn,oncely::audit=info",
        _ => "info",
    });
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("oncely: error: {}", explain(&e));
            ExitCode::from(2)
        }
    }
}

/// An error and its causes in one line, each cause said once: drivers repeat their source in
/// their own message, and sqlx adds the line of its own source file ("at line 948").
fn explain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = match text.find(" at line ") {
            Some(i)
                if text[i + 9..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .count()
                    > 0 =>
            {
                let end = i
                    + 9
                    + text[i + 9..]
                        .chars()
                        .take_while(char::is_ascii_digit)
                        .count();
                format!("{}{}", &text[..i], &text[end..])
            }
            _ => text,
        };
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

async fn listen(addr: SocketAddr) -> Result<(tokio::net::TcpListener, String)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listen on {addr}"))?;
    let url = format!("http://{}", listener.local_addr()?);
    Ok((listener, url))
}

fn announce(url: &str) {
    use std::io::Write as _;
    // The first line on standard output: the gates (and scripts) read the address from it.
    println!("oncely: listening on {url}");
    let _ = std::io::stdout().flush();
}

async fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Processor {
            addr,
            webhook_secret,
            charge_delay_ms,
            email_delay_ms,
        } => {
            let latency = processor::Latency {
                charge: Duration::from_millis(charge_delay_ms),
                email: Duration::from_millis(email_delay_ms),
            };
            let router = processor::router(&webhook_secret, latency)?;
            let (listener, url) = listen(addr).await?;
            announce(&url);
            axum::serve(listener, router).await?;
            Ok(true)
        }
        Command::Serve {
            addr,
            store,
            processor_url,
            processor_timeout_ms,
            business_db,
            pg_fewest_round_trips,
            crash_after,
            completer_grace_ms,
            completer_every_ms,
            no_completer,
            redrive,
            reap_every_secs,
            idempotency,
            webhook_secret,
            limits,
            policy,
        } => {
            policy.check_lease()?;
            // Without --processor-url, a processor of its own: its address is bound now (the
            // API's client needs it) and it starts serving once the store has been accepted, so
            // a refused store never logs a processor that started.
            let (processor_url, own_processor) = match processor_url {
                Some(u) => (u, None),
                None => {
                    let (l, url) = listen("127.0.0.1:0".parse()?).await?;
                    let router = processor::router(&webhook_secret, processor::Latency::default())?;
                    (url, Some((l, router)))
                }
            };
            let cfg = ServeConfig {
                store,
                processor_url,
                processor_timeout: Duration::from_millis(processor_timeout_ms.max(1)),
                crash_after,
                policy: policy.policy(),
                business_path: business_db,
                pg_fewest_round_trips,
                completer_grace: (!no_completer).then(|| Duration::from_millis(completer_grace_ms)),
                idempotency_off: idempotency == "off",
                webhook_secret,
            };
            let (app, router) = serve::build(&cfg).await?;
            if let Some((l, router)) = own_processor {
                tokio::spawn(async move { axum::serve(l, router).await });
                tracing::info!(url = %cfg.processor_url, "started the outside card processor and mailer in this process");
            }
            let (listener, url) = listen(addr).await?;
            if reap_every_secs > 0 {
                app.spawn_reaper(Duration::from_secs(reap_every_secs));
            }
            // SIGTERM (or Ctrl-C) starts the drain and stops the in-process completer, so that
            // it does not re-drive through a server that is shutting down.
            let (stopping, stopped) = tokio::sync::watch::channel(false);
            if let Some(grace) = cfg.completer_grace {
                let mut stopped = stopped.clone();
                if let Some(counters) = jobs::spawn_completer(
                    app.store(),
                    url.clone(),
                    grace,
                    Duration::from_millis(completer_every_ms),
                    redrive.policy(),
                    async move {
                        stopped.wait_for(|s| *s).await.ok();
                    },
                ) {
                    app.show_completer(counters);
                }
            }
            drop(stopped);
            // The processor delivers its events here (it may start later: registered in the
            // background, retried until it answers).
            tokio::spawn(processor::webhooks::register_receiver(
                cfg.processor_url.trim_end_matches('/').to_owned(),
                format!("{url}{}", serve::routes::webhooks::PATH),
            ));
            tracing::info!(store = %cfg.store, %url, "serving the reference payments API");
            announce(&url);
            serve::server::serve(listener, router, limits.limits(), app.drain(), async move {
                serve::server::shutdown_signal().await;
                stopping.send_replace(true);
            })
            .await?;
            Ok(true)
        }
        Command::Gates {
            store,
            concurrency,
            instances,
            fleet_clients,
            fleet_calls,
            json,
            only,
            client_command,
            pg_fewest_round_trips,
        } => {
            gates::run(gates::GatesConfig {
                store,
                concurrency,
                instances,
                fleet_clients,
                fleet_calls,
                json,
                only,
                client_command,
                pg_fewest_round_trips,
            })
            .await
        }
        Command::Contract { policy } => {
            let policy = policy.policy();
            policy
                .validate()
                .context("this configuration would not start a server")?;
            print!("{}", contract::render(&policy));
            Ok(true)
        }
        Command::Audit(args) => tools::audit::run(args).await,
        Command::Lint(args) => tools::lint::run(args).await,
        Command::Simulate(args) => tools::simulate::run(args).await,
        Command::Bench(args) => tools::bench::run(args).await,
        Command::Reap { store, batch } => jobs::reap(&store, batch).await,
        Command::Records(args) => tools::records::run(args).await,
        Command::FleetClient => gates::fleet_client::run().await,
        Command::Testbench { addr, scenarios } => {
            oncely_testbench::serve(addr, scenarios.as_deref()).await?;
            Ok(true)
        }
        Command::Complete {
            store,
            server_url,
            grace_ms,
            limit,
            redrive,
        } => {
            jobs::complete(
                &store,
                &server_url,
                Duration::from_millis(grace_ms),
                limit,
                redrive.policy(),
            )
            .await
        }
    }
}
