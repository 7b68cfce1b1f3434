//! Shared by the process-level tests: start `oncely` as a child process and learn its address.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `oncely` child process (a server), killed on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    /// `http://127.0.0.1:PORT`
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `oncely <args…> --addr 127.0.0.1:0` and waits for the address it prints as
/// `oncely: listening on URL`.
pub(crate) fn start(args: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .args(["--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start oncely");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("oncely printed its address")
            .expect("utf-8");
        if let Some(u) = line.strip_prefix("oncely: listening on ") {
            break u.trim().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Server { child, url }
}
