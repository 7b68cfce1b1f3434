//! `lint` on whole documents, JSON and YAML.

use oncely_audit::lint::{Finding, LintError, lint};

const PAYMENTS_YAML: &str = include_str!("specs/payments.yaml");

fn finding(method: &str, path: &str, op: &str) -> (String, String, Option<String>) {
    (method.to_owned(), path.to_owned(), Some(op.to_owned()))
}

fn keys(findings: &[Finding]) -> Vec<(String, String, Option<String>)> {
    findings
        .iter()
        .map(|f| (f.method.clone(), f.path.clone(), f.operation_id.clone()))
        .collect()
}

#[test]
fn yaml_document_reports_exactly_the_unprotected_operations() {
    let report = lint(PAYMENTS_YAML).unwrap();
    // Checked: POST payments, PATCH + DELETE payments/{id}, POST refunds, POST emails,
    // POST search, DELETE ledger, POST webhooks. Not checked: GET payments.
    assert_eq!(report.operations_checked, 8);
    assert_eq!(
        keys(&report.findings),
        vec![
            // No key anywhere.
            finding("PATCH", "/v1/payments/{id}", "updatePayment"),
            // DELETE marked non-idempotent, no key.
            finding("DELETE", "/v1/ledger/{id}", "reverseLedgerEntry"),
            // The extension as a string does not count; a query parameter is not the header.
            finding("POST", "/v1/webhooks", "createWebhook"),
        ]
    );
    assert_eq!(
        report.findings[0].message,
        "PATCH is not idempotent (RFC 9110 section 9.2.2) and declares no `Idempotency-Key` \
         header parameter and is not marked `x-oncely-unsafe-to-retry: true`: a retried request \
         may run twice"
    );
    assert!(
        report.findings[1]
            .message
            .starts_with("DELETE is marked x-oncely-idempotent: false, so it declares no")
    );
    assert!(!report.passed());
    let text = report.render_text();
    assert!(
        text.starts_with("PATCH /v1/payments/{id} (updatePayment): PATCH is not idempotent"),
        "{text}"
    );
    assert!(text.ends_with("lint: 8 state-changing operation(s) checked, 3 without an Idempotency-Key or x-oncely-unsafe-to-retry, 1 warning(s) (PUT/DELETE not verified idempotent)\n"), "{text}");
    // The keyless DELETE passes on its method's promise, with a warning pointing at the audit.
    assert_eq!(
        keys(&report.warnings),
        vec![finding("DELETE", "/v1/payments/{id}", "cancelPayment")]
    );
    assert!(
        text.contains(
            "warning: DELETE /v1/payments/{id} (cancelPayment): DELETE promises idempotency"
        ),
        "{text}"
    );
    let j = report.to_json();
    assert_eq!(j["passed"], false);
    assert_eq!(j["operations_checked"], 8);
    assert_eq!(j["findings"][2]["operation_id"], "createWebhook");
    assert_eq!(j["warnings"][0]["operation_id"], "cancelPayment");
}

#[test]
fn keyless_put_and_delete_are_warnings_until_marked_verified() {
    let spec = |marks: &str| {
        format!(
            r#"{{
      "openapi": "3.1.0",
      "info": {{"title": "t", "version": "1"}},
      "paths": {{
        "/v1/items/{{id}}": {{
          "put": {{"operationId": "putItem"{marks}, "responses": {{"200": {{"description": "ok"}}}}}},
          "delete": {{"operationId": "deleteItem"{marks}, "responses": {{"204": {{"description": "ok"}}}}}}
        }},
        "/v1/keyed/{{id}}": {{
          "put": {{"operationId": "putKeyed",
                  "parameters": [{{"name": "Idempotency-Key", "in": "header"}}],
                  "responses": {{"200": {{"description": "ok"}}}}}}
        }}
      }}
    }}"#
        )
    };
    let report = lint(&spec("")).unwrap();
    assert!(report.passed(), "warnings do not fail the lint");
    assert!(report.findings.is_empty());
    assert_eq!(
        keys(&report.warnings),
        vec![
            finding("PUT", "/v1/items/{id}", "putItem"),
            finding("DELETE", "/v1/items/{id}", "deleteItem"),
        ]
    );
    let msg = &report.warnings[0].message;
    assert!(msg.contains("method-idempotency check"), "{msg}");
    assert!(
        msg.contains("oncely audit BASE_URL --endpoint 'PUT /v1/items/{id}'"),
        "{msg}"
    );
    assert!(msg.contains("x-oncely-verified-idempotent: true"), "{msg}");
    // Verified: silent. A bare claim of idempotency is not a verification.
    let verified = lint(&spec(r#", "x-oncely-verified-idempotent": true"#)).unwrap();
    assert!(verified.warnings.is_empty(), "{:?}", verified.warnings);
    let claimed = lint(&spec(r#", "x-oncely-idempotent": true"#)).unwrap();
    assert_eq!(claimed.warnings.len(), 2);
    // Unsafe to retry, or not idempotent at all: the rule's own business, no warning.
    let unsafe_ = lint(&spec(r#", "x-oncely-unsafe-to-retry": true"#)).unwrap();
    assert!(unsafe_.warnings.is_empty() && unsafe_.findings.is_empty());
    let not = lint(&spec(r#", "x-oncely-idempotent": false"#)).unwrap();
    assert_eq!(not.findings.len(), 2);
    assert!(not.warnings.is_empty());
}

#[test]
fn unkeyed_post_is_reported_keyed_via_ref_is_clean() {
    let unkeyed = r#"{
      "openapi": "3.0.3",
      "info": {"title": "t", "version": "1"},
      "paths": {"/v1/orders": {"post": {"operationId": "createOrder", "responses": {"201": {"description": "ok"}}}}}
    }"#;
    let report = lint(unkeyed).unwrap();
    assert_eq!(report.operations_checked, 1);
    assert_eq!(
        keys(&report.findings),
        vec![finding("POST", "/v1/orders", "createOrder")]
    );

    let keyed = r##"{
      "openapi": "3.0.3",
      "info": {"title": "t", "version": "1"},
      "paths": {"/v1/orders": {"post": {
        "operationId": "createOrder",
        "parameters": [{"$ref": "#/components/parameters/Key"}],
        "responses": {"201": {"description": "ok"}}}}},
      "components": {"parameters": {
        "Key": {"$ref": "#/components/parameters/KeyInner"},
        "KeyInner": {"name": "IDEMPOTENCY-KEY", "in": "header", "schema": {"type": "string"}}}}
    }"##;
    let report = lint(keyed).unwrap();
    assert_eq!(report.operations_checked, 1);
    assert!(report.findings.is_empty(), "{:?}", report.findings);
    assert!(report.passed());
}

#[test]
fn the_extension_makes_an_unkeyed_post_clean() {
    let spec = "openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths:\n  /v1/mail:\n    x-oncely-unsafe-to-retry: true\n    post:\n      responses: {'202': {description: ok}}\n    patch:\n      x-oncely-unsafe-to-retry: false\n      responses: {'200': {description: ok}}\n";
    let report = lint(spec).unwrap();
    assert_eq!(report.operations_checked, 2);
    // The path item's `true` covers the POST; the PATCH's own `false` wins over it.
    assert_eq!(
        keys(&report.findings),
        vec![("PATCH".to_owned(), "/v1/mail".to_owned(), None)]
    );
}

#[test]
fn yaml_and_json_forms_of_one_document_agree() {
    // serde_json::Value cannot hold YAML's integer keys (`200:`): convert them to strings.
    let yaml = stringify_keys(serde_norway::from_str(PAYMENTS_YAML).unwrap());
    let json_text = serde_json::to_string_pretty(&yaml).unwrap();
    assert!(json_text.trim_start().starts_with('{'));
    let from_json = lint(&json_text).unwrap();
    let from_yaml = lint(PAYMENTS_YAML).unwrap();
    assert_eq!(from_json.operations_checked, from_yaml.operations_checked);
    // serde_json::Value sorted the paths; the findings are in each text's own document order.
    let sorted = |mut f: Vec<Finding>| {
        f.sort_by(|a, b| (&a.path, &a.method).cmp(&(&b.path, &b.method)));
        f
    };
    assert_eq!(from_json.findings.len(), 3);
    assert_eq!(sorted(from_json.findings), sorted(from_yaml.findings));
}

fn stringify_keys(v: serde_norway::Value) -> serde_json::Value {
    use serde_norway::Value as Y;
    match v {
        Y::Null => serde_json::Value::Null,
        Y::Bool(b) => b.into(),
        Y::Number(n) => serde_json::to_value(n).unwrap(),
        Y::String(s) => s.into(),
        Y::Sequence(s) => s.into_iter().map(stringify_keys).collect(),
        Y::Mapping(m) => m
            .into_iter()
            .map(|(k, v)| {
                let k = match k {
                    Y::String(s) => s,
                    other => serde_norway::to_string(&other).unwrap().trim().to_owned(),
                };
                (k, stringify_keys(v))
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        Y::Tagged(t) => stringify_keys(t.value),
    }
}

#[test]
fn swagger_2_and_path_item_refs_are_understood() {
    let spec = r##"
swagger: "2.0"
info: {title: t, version: "1"}
parameters:
  Key: {name: Idempotency-Key, in: header, type: string}
x-shared:
  orders:
    post:
      parameters: [{$ref: "#/parameters/Key"}]
      responses: {201: {description: ok}}
paths:
  x-internal: {note: not a path}
  /orders:
    $ref: "#/x-shared/orders"
  /broken:
    post:
      parameters: [{$ref: "common.yaml#/parameters/Key"}]
      responses: {201: {description: ok}}
"##;
    let report = lint(spec).unwrap();
    assert_eq!(report.operations_checked, 2);
    assert_eq!(report.findings.len(), 1);
    assert_eq!(report.findings[0].path, "/broken");
    assert!(
        report.findings[0].message.ends_with(
            "(not followed: `$ref: common.yaml#/parameters/Key` (only local references are followed))"
        ),
        "{}",
        report.findings[0].message
    );
}

#[test]
fn yaml_anchors_and_merge_keys_resolve() {
    let spec = r#"
openapi: 3.0.0
info: {title: t, version: "1"}
x-key: &key {name: Idempotency-Key, in: header}
x-base: &base
  parameters: [*key]
  responses: {201: {description: ok}}
paths:
  /a:
    post:
      <<: *base
      operationId: a
"#;
    let report = lint(spec).unwrap();
    assert_eq!(report.operations_checked, 1);
    assert!(report.findings.is_empty(), "{:?}", report.findings);
}

#[test]
fn malformed_documents_are_clear_errors() {
    let err = lint(r#"{"openapi": "3.0.0", "paths": {"/a": }"#).unwrap_err();
    assert!(matches!(err, LintError::Json { line: 1, .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("the OpenAPI document is not valid JSON (line 1, column "),
        "{err}"
    );

    let err = lint("openapi: 3.0.0\npaths:\n  /a: [unclosed\n").unwrap_err();
    assert!(
        matches!(
            err,
            LintError::Yaml { line: 4, .. } | LintError::Yaml { line: 3, .. }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("the OpenAPI document is not valid YAML (line "),
        "{err}"
    );

    assert_eq!(lint("  \n").unwrap_err(), LintError::Empty);
    assert_eq!(
        lint("just a string").unwrap_err().to_string(),
        "not an OpenAPI document: the top level is not a mapping"
    );
    assert_eq!(
        lint("{\"info\": {}}").unwrap_err().to_string(),
        "not an OpenAPI document: no `openapi` (3.x) or `swagger` (2.0) version field at the top level"
    );
    assert_eq!(
        lint("openapi: 3.0.0\npaths: [1, 2]\n")
            .unwrap_err()
            .to_string(),
        "not an OpenAPI document: `paths` is not a mapping"
    );
    // No paths at all (OpenAPI 3.1 allows webhooks-only documents): nothing to check.
    let report = lint("openapi: 3.1.0\nwebhooks: {}\n").unwrap();
    assert_eq!((report.operations_checked, report.findings.len()), (0, 0));
}

#[test]
fn another_key_source_counts_as_taking_a_key() {
    let spec = |source: &str| {
        format!(
            r#"{{"openapi": "3.1.0", "info": {{"title": "t", "version": "1"}},
      "paths": {{"/webhooks/processor": {{"post": {{"operationId": "receive"{source},
        "responses": {{"200": {{"description": "applied"}}}}}}}}}}}}"#
        )
    };
    assert!(
        lint(&spec(r#", "x-oncely-key-source": "webhook-id""#))
            .unwrap()
            .passed()
    );
    assert!(
        lint(&spec(r#", "x-oncely-key-source": "/id""#))
            .unwrap()
            .passed()
    );
    assert!(
        !lint(&spec(r#", "x-oncely-key-source": """#))
            .unwrap()
            .passed()
    );
    assert!(
        !lint(&spec(r#", "x-oncely-key-source": true"#))
            .unwrap()
            .passed()
    );
    assert!(!lint(&spec("")).unwrap().passed());
}
