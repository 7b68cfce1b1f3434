//! `oncely gates --only fleet --client-command CMD`: the fleet gate with external client
//! processes, the mode the Python and Node SDKs' fleet clients run in. Driven here by the
//! binary's own Rust SDK client (`oncely fleet-client`), and by clients that break the
//! interface, which must fail the gate.

use serde_json::Value;
use std::process::{Command, Stdio};

/// Runs the fleet gate with `command` as the clients; returns the gate's report, asserting the
/// exit status agrees with its verdict.
fn fleet(command: &str, clients: usize, calls: usize) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["gates", "--json", "--only", "fleet"])
        .args(["--fleet-clients", &clients.to_string()])
        .args(["--fleet-calls", &calls.to_string()])
        .args(["--client-command", command])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "gates printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(out.status.success(), report["passed"] == true, "{report:#}");
    let gates = report["gates"].as_array().unwrap();
    assert_eq!(gates.len(), 1);
    assert_eq!(gates[0]["name"], "fleet");
    gates[0].clone()
}

#[test]
fn the_rust_sdk_as_external_clients_makes_every_payment_once() {
    let command = format!("{} fleet-client", env!("CARGO_BIN_EXE_oncely"));
    let gate = fleet(&command, 4, 10);
    let d = &gate["details"];
    assert_eq!(gate["passed"], true, "{gate:#}");
    assert_eq!(d["external_clients"], 4);
    assert_eq!(d["logical_calls"], 40);
    assert_eq!(d["reported_calls"], 40);
    assert_eq!(d["duplicate_side_effects"], 0);
    assert_eq!(d["payments"], 40);
    assert_eq!(d["charged_keys"], 40);
    assert_eq!(d["client_problems"], serde_json::json!([]));
    // The faults really happened: the proxy dropped or refused some, and the server was down.
    let faults = d["dropped_responses"].as_u64().unwrap()
        + d["injected_503"].as_u64().unwrap()
        + d["upstream_down_502"].as_u64().unwrap();
    assert!(faults > 0, "{d:#}");
}

#[test]
fn a_client_that_reports_nothing_fails_the_gate() {
    let gate = fleet("true", 2, 3);
    assert_eq!(gate["passed"], false);
    let problems = gate["details"]["client_problems"].as_array().unwrap();
    assert_eq!(problems.len(), 6, "{problems:#?}");
    assert!(problems[0].as_str().unwrap().contains("reported 0 times"));
}

#[test]
fn a_client_that_prints_other_things_or_fails_fails_the_gate() {
    let gate = fleet("echo hello; exit 3", 1, 1);
    assert_eq!(gate["passed"], false);
    let problems: Vec<&str> = gate["details"]["client_problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    assert!(
        problems.iter().any(|p| p.contains("not a call line")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("exit status Some(3)")),
        "{problems:?}"
    );
}

#[test]
fn a_client_that_pays_under_other_keys_fails_the_gate() {
    // The Rust client with another key prefix: its payments are not the ones asked for.
    let command = format!(
        "ONCELY_FLEET_KEY_PREFIX=elsewhere-$ONCELY_FLEET_CLIENT {} fleet-client",
        env!("CARGO_BIN_EXE_oncely")
    );
    let gate = fleet(&command, 1, 2);
    assert_eq!(gate["passed"], false);
    let d = &gate["details"];
    assert_eq!(d["charged_keys"], 0, "{d:#}");
    assert!(
        d["client_problems"][0]
            .as_str()
            .unwrap()
            .contains("unexpected key")
    );
}
