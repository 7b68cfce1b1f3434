//! The fault server: HTTP/1.1 over tokio TCP, one scripted step per attempt.
//!
//! Requests are parsed with `httparse` (hyper's parser); answers are written by hand, because the
//! faults are exactly what an HTTP server library is built to prevent: a `content-length` that is
//! never honoured, a TCP reset instead of an answer (`SO_LINGER` 0, then close), an answer that
//! never comes, a body trickled out in chunks. While it waits (a delay, a hang, between slow
//! chunks) the testbench keeps reading the socket, so it notices at once when the client gives
//! up and closes, and reports that moment as the attempt's end.
//!
//! By concept: this file has [`Testbench`], the connection loop and the two kinds of request
//! (the control endpoints, a scripted attempt); `request.rs` reads a request; `answer.rs` writes
//! the answers and plays a step.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::report::{Answer, Recorded, Runs};
use crate::scenario::{FORMAT, Scenario, ScenarioFile, Step};

mod answer;
mod request;

use answer::{play, problem, write_json};
use request::{ReadError, Request, read_request};

/// The header naming the scenario.
pub const SCENARIO_HEADER: &str = "x-oncely-scenario";
/// The header naming the run (attempts are counted per run and call).
pub const RUN_HEADER: &str = "x-oncely-run";
/// The header giving the call index.
pub const CALL_HEADER: &str = "x-oncely-call";
/// How long a `hang` step waits for the client to give up before closing, in seconds.
pub const HANG_LIMIT: Duration = Duration::from_secs(120);

struct State {
    /// Per `http` scenario id, per call index (after `repeat`), the steps.
    steps: HashMap<String, Vec<Vec<Step>>>,
    scenarios: usize,
    runs: Runs,
    refused_url: String,
}

/// A running testbench. Dropping it stops the server.
pub struct Testbench {
    url: String,
    refused_url: String,
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
    /// Bound and never listening: connecting to it is refused. Kept so no one else takes the port.
    _refused: TcpSocket,
}

impl std::fmt::Debug for Testbench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbench")
            .field("url", &self.url)
            .field("refused_url", &self.refused_url)
            .finish_non_exhaustive()
    }
}

impl Drop for Testbench {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Testbench {
    /// Binds `addr` (port 0 picks a free one) and serves `file`'s `http` scenarios until dropped.
    /// Also reserves a loopback port where nothing listens ([`Testbench::refused_url`]).
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    pub async fn start(addr: SocketAddr, file: &ScenarioFile) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let refused = TcpSocket::new_v4()?;
        refused.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let refused_url = format!("http://{}", refused.local_addr()?);
        let mut steps = HashMap::new();
        for s in &file.scenarios {
            if let Scenario::Http(h) = s {
                let calls = h
                    .expanded_calls()
                    .into_iter()
                    .map(|c| c.server.clone())
                    .collect();
                steps.insert(h.id.clone(), calls);
            }
        }
        let state = Arc::new(State {
            steps,
            scenarios: file.scenarios.len(),
            runs: Runs::default(),
            refused_url: refused_url.clone(),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(stream, shared.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "testbench: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(Self {
            url: format!("http://{addr}"),
            refused_url,
            addr,
            state,
            task,
            _refused: refused,
        })
    }

    /// The base URL, `http://IP:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A loopback URL where nothing listens: every connection is refused, nothing is sent.
    pub fn refused_url(&self) -> &str {
        &self.refused_url
    }

    /// The report of a run, as `GET /_testbench/runs/<run>` gives it.
    pub fn report(&self, run: &str) -> crate::report::RunReport {
        self.state.runs.report(run)
    }

    /// Serves until the task ends (it does not end by itself: kill the process, or drop the
    /// future).
    pub async fn wait(mut self) {
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }
}

async fn connection(mut stream: TcpStream, state: Arc<State>) {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let req = match read_request(&mut stream, &mut buf).await {
            Ok(r) => r,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(status, why)) => {
                let _ = write_json(&mut stream, status, &problem(status, &why), true).await;
                return;
            }
        };
        let keep = if req.path.starts_with("/_testbench/") || req.path == "/_testbench" {
            control(&mut stream, &state, &req).await
        } else {
            scenario_request(&mut stream, &mut buf, &state, req).await
        };
        if !keep {
            return;
        }
    }
}

/// The control endpoints; returns whether to keep the connection.
async fn control(stream: &mut TcpStream, state: &State, req: &Request) -> bool {
    let path = req.path.split('?').next().unwrap_or_default();
    let rest = path.trim_start_matches("/_testbench");
    let (status, value) = match (req.method.as_str(), rest) {
        ("GET", "/info") => (
            200,
            serde_json::json!({
                "format": FORMAT,
                "scenarios": state.scenarios,
                "refused_url": state.refused_url,
            }),
        ),
        ("GET", r) if r.starts_with("/runs/") => {
            let run = &r["/runs/".len()..];
            (
                200,
                serde_json::to_value(state.runs.report(run)).unwrap_or_default(),
            )
        }
        ("DELETE", r) if r.starts_with("/runs/") => {
            let run = &r["/runs/".len()..];
            state.runs.forget(run);
            (200, serde_json::json!({ "forgotten": run }))
        }
        _ => (
            404,
            problem(
                404,
                "unknown control endpoint: GET /_testbench/info, GET or DELETE /_testbench/runs/<run>",
            ),
        ),
    };
    write_json(stream, status, &value, req.close).await.is_ok() && !req.close
}

fn valid_run(run: &str) -> bool {
    (1..=128).contains(&run.len())
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A scripted request; returns whether to keep the connection.
async fn scenario_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &State,
    req: Request,
) -> bool {
    let scenario = req.header(SCENARIO_HEADER).map(str::to_owned);
    let run = req.header(RUN_HEADER).map(str::to_owned);
    let call = req.header(CALL_HEADER).map(|c| c.trim().parse::<u32>());
    let (scenario, run, call) = match (scenario, run, call) {
        (Some(s), Some(r), Some(Ok(c))) if valid_run(&r) => (s, r, c),
        _ => {
            let why = format!(
                "a scripted request needs {SCENARIO_HEADER}, {RUN_HEADER} (1 to 128 of [A-Za-z0-9._-]) and {CALL_HEADER} (a call index)"
            );
            return write_json(stream, 400, &problem(400, &why), req.close)
                .await
                .is_ok()
                && !req.close;
        }
    };
    let Some(steps) = state
        .steps
        .get(&scenario)
        .and_then(|calls| calls.get(call as usize))
        .filter(|s| !s.is_empty())
    else {
        let why = format!(
            "no http scenario {scenario:?} with server steps for call {call} in this testbench's file"
        );
        return write_json(stream, 400, &problem(400, &why), req.close)
            .await
            .is_ok()
            && !req.close;
    };
    let recorded = Recorded {
        call,
        attempt: 0,
        step: 0,
        method: req.method.clone(),
        path: req.path.clone(),
        headers: req.headers.clone(),
        body_len: req.body.len(),
        body_sha256: hex::encode(Sha256::digest(&req.body)),
        arrived: req.arrived,
        ended: None,
        answer: Answer::InProgress,
    };
    let last = steps.len() - 1;
    let (attempt, index, slot) = state
        .runs
        .arrive(&run, &scenario, recorded, |n| (n as usize - 1).min(last));
    let step = &steps[index];
    let answer = play(stream, buf, step, attempt, req.method == "HEAD").await;
    if answer == Answer::Reset {
        // SO_LINGER 0: the close that follows (the connection is dropped) sends a RST.
        if let Err(e) = stream.set_zero_linger() {
            tracing::warn!(error = %e, "testbench: SO_LINGER 0 failed; the close will be a FIN");
        }
    }
    state.runs.finish(&slot, answer);
    answer == Answer::Complete && !req.close
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        assert!(valid_run("py-post-503-1a2b.c_d"));
        assert!(!valid_run(""));
        assert!(!valid_run("a/b"));
        assert!(!valid_run(&"a".repeat(129)));
    }
}
