//! `oncely lint` as a real process: the reference server's own OpenAPI document (fetched from a
//! running `oncely serve`) has no findings; a spec with an unkeyed POST reports exactly that
//! operation with exit status 1; unreadable or non-OpenAPI input is exit status 2.

use serde_json::{Value, json};
use std::io::Write as _;
use std::process::{Command, Output, Stdio};

mod common;
use common::start;

fn oncely(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .output()
        .expect("run oncely")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_servers_own_document_has_no_findings() {
    let server = start(&["serve", "--store", "memory"]);
    let doc = reqwest::get(format!("{}/openapi.json", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, &doc).unwrap();
    let path = path.to_str().unwrap();

    let out = oncely(&["lint", path, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    // Three state-changing operations: POST /v1/payments and POST /v1/orders keyed by
    // Idempotency-Key, POST /webhooks/processor by webhook-id (x-oncely-key-source).
    assert_eq!(
        report,
        json!({"passed": true, "operations_checked": 3, "findings": [], "warnings": []})
    );

    let out = oncely(&["lint", path]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        text(&out.stdout),
        "lint: 3 state-changing operation(s) checked, 0 without an Idempotency-Key or \
         x-oncely-unsafe-to-retry\n"
    );

    // Sanity: the document really declares the header the lint looked for.
    let spec: Value = serde_json::from_str(&doc).unwrap();
    assert!(spec["paths"]["/v1/payments"]["post"].is_object(), "{doc}");
}

const UNKEYED: &str = r#"
openapi: 3.0.3
info: { title: Shop, version: "1" }
paths:
  /v1/payments:
    post:
      operationId: createPayment
      parameters:
        - $ref: '#/components/parameters/IdempotencyKey'
      responses: { '201': { description: created } }
    get:
      operationId: listPayments
      responses: { '200': { description: ok } }
  /v1/refunds:
    post:
      operationId: createRefund
      responses: { '201': { description: created } }
  /v1/exports:
    post:
      operationId: startExport
      x-oncely-unsafe-to-retry: true
      responses: { '202': { description: accepted } }
  /v1/carts/{id}:
    put:
      operationId: replaceCart
      responses: { '200': { description: ok } }
components:
  parameters:
    IdempotencyKey:
      name: idempotency-key
      in: header
      required: true
      schema: { type: string }
"#;

#[test]
fn an_unkeyed_post_is_reported_with_exit_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, UNKEYED).unwrap();
    let path = path.to_str().unwrap();

    let out = oncely(&["lint", path, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["passed"], false);
    // POST x3 and PUT x1; the GET is not counted.
    assert_eq!(report["operations_checked"], 4);
    let findings = report["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{report}");
    assert_eq!(findings[0]["method"], "POST");
    assert_eq!(findings[0]["path"], "/v1/refunds");
    assert_eq!(findings[0]["operation_id"], "createRefund");

    let out = oncely(&["lint", path]);
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines[0].starts_with("POST /v1/refunds (createRefund): "),
        "{stdout}"
    );
    // The keyless PUT: a warning pointing at the audit's method check, not a finding.
    assert!(
        lines[1].starts_with("warning: PUT /v1/carts/{id} (replaceCart): PUT promises idempotency"),
        "{stdout}"
    );
    assert_eq!(report["warnings"][0]["operation_id"], "replaceCart");
    assert_eq!(
        lines[2],
        "lint: 4 state-changing operation(s) checked, 1 without an Idempotency-Key or \
         x-oncely-unsafe-to-retry, 1 warning(s) (PUT/DELETE not verified idempotent)"
    );
}

#[test]
fn standard_input_is_read_with_a_dash() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(["lint", "-", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(UNKEYED.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["findings"][0]["path"], "/v1/refunds");
}

#[test]
fn unreadable_or_non_openapi_input_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.yaml");
    let out = oncely(&["lint", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("missing.yaml"),
        "{}",
        text(&out.stderr)
    );

    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\"openapi\": \"3.1.0\",\n \"paths\": {").unwrap();
    let out = oncely(&["lint", broken.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("the OpenAPI document is not valid JSON (line 2"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());

    let other = dir.path().join("other.yaml");
    std::fs::write(&other, "name: not a spec\n").unwrap();
    let out = oncely(&["lint", other.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not an OpenAPI document"),
        "{}",
        text(&out.stderr)
    );
}
