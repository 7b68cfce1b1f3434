//! Child processes of the gates: the processor and the API servers, each on a free port.
//!
//! A child is started with `--addr 127.0.0.1:0`; it binds a free port and prints
//! `oncely: listening on http://ADDR` as its first line on standard output, which is how the
//! gates learn the address (no port is guessed, so two gate runs never collide).

use anyhow::{Context as _, Result, bail};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// This executable's path, resolved once: a rebuild that replaces the file while the gates
/// run must not make later restarts fail.
fn executable() -> Result<std::path::PathBuf> {
    static EXE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    EXE.get_or_init(|| std::env::current_exe().ok())
        .clone()
        .context("find the oncely executable")
}

/// Resolves the executable's path now (call before anything slow).
pub fn resolve_executable() -> Result<()> {
    executable().map(|_| ())
}

/// Where the children's standard error goes: a file per child in this folder (set once by the
/// runner), so that their log lines do not interleave with the gates' own; without it they go
/// to this process's standard error.
static LOGS: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Sends every child's standard error to a file of its own in `dir` from now on.
pub fn log_to(dir: std::path::PathBuf) {
    let _ = LOGS.set(dir);
}

/// A standard error for the child `name`: a new file `<name>-<n>.log` in the logs folder, or
/// this process's own.
pub fn stderr_for(name: &str) -> Stdio {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let Some(dir) = LOGS.get() else {
        return Stdio::inherit();
    };
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let slug: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    match std::fs::File::create(dir.join(format!("{n:03}-{}.log", slug.trim_matches('-')))) {
        Ok(f) => Stdio::from(f),
        Err(_) => Stdio::inherit(),
    }
}

/// A running child and its base URL.
pub struct Proc {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    name: String,
}

impl Proc {
    /// Starts `oncely <args…> --addr 127.0.0.1:0` and waits (up to 60 seconds) for its address.
    pub async fn start(name: &str, args: &[String]) -> Result<Self> {
        let mut child = Command::new(executable()?)
            .args(args)
            .args(["--addr", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_for(name))
            .env(
                "RUST_LOG",
                std::env::var("ONCELY_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        let stdout = child.stdout.take().context("child stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let url = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(url) = line.strip_prefix("oncely: listening on ") {
                    return anyhow::Ok(url.trim().to_owned());
                }
            }
            bail!("{name} exited before it was listening")
        })
        .await
        .with_context(|| format!("{name} did not start within 60 seconds"))??;
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self {
            child,
            url,
            name: name.to_owned(),
        })
    }

    /// Kills the process at once (SIGKILL) and waits for it.
    pub async fn kill(mut self) -> Result<()> {
        self.child
            .kill()
            .await
            .with_context(|| format!("kill {}", self.name))
    }

    /// Sends SIGTERM (a deploy's stop) and waits up to `limit` for the process to exit; its exit
    /// status.
    ///
    /// # Errors
    ///
    /// The signal could not be sent, or the process did not exit within `limit` (it is then
    /// killed).
    pub async fn terminate(mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let pid = self
            .child
            .id()
            .with_context(|| format!("{} has already exited", self.name))?;
        let pid = i32::try_from(pid).context("a process id out of range")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        )
        .with_context(|| format!("send SIGTERM to {}", self.name))?;
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(status) => status.with_context(|| format!("wait for {}", self.name)),
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("{} did not exit within {limit:?} of SIGTERM", self.name)
            }
        }
    }

    /// Waits (up to `limit`) for the process to exit by itself; returns whether it did.
    pub async fn wait_exit(&mut self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.child.wait()).await.is_ok()
    }
}
