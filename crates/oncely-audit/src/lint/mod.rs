//! `lint`: every state-changing operation of an OpenAPI document must accept an
//! `Idempotency-Key` header or say, explicitly, that it is unsafe to retry.
//!
//! ```
//! let spec = r#"
//! openapi: 3.1.0
//! info: { title: Payments, version: "1" }
//! paths:
//!   /v1/payments:
//!     post:
//!       operationId: createPayment
//!       parameters:
//!         - $ref: '#/components/parameters/IdempotencyKey'
//!       responses: { '201': { description: created } }
//!   /v1/refunds:
//!     post:
//!       operationId: createRefund
//!       responses: { '201': { description: created } }
//! components:
//!   parameters:
//!     IdempotencyKey:
//!       name: Idempotency-Key
//!       in: header
//!       required: true
//!       schema: { type: string, maxLength: 255 }
//! "#;
//! let report = oncely_audit::lint::lint(spec).unwrap();
//! assert_eq!(report.operations_checked, 2);
//! assert_eq!(report.findings.len(), 1);
//! assert_eq!(report.findings[0].path, "/v1/refunds");
//! assert_eq!(report.findings[0].operation_id.as_deref(), Some("createRefund"));
//! assert!(!report.passed());
//! ```
//!
//! # The rule
//!
//! An operation is *state-changing* when its method is `POST` or `PATCH`: neither is idempotent
//! by HTTP semantics (RFC 9110 section 9.2.2), so a client that retries one after a lost
//! response may run it twice unless the server collapses duplicates by key. `PUT` and `DELETE`
//! *are* idempotent by RFC 9110 section 9.2.2 (repeating them leaves the same state), so they
//! pass by default; an operation that breaks that promise (a `DELETE` that appends a ledger entry,
//! a `PUT` that increments) says so with [`EXT_IDEMPOTENT`]` : false` and is then checked like a
//! `POST`. Conversely a `POST` that changes nothing (a search) may say `x-oncely-idempotent: true`.
//! Safe methods (`GET`, `HEAD`, `OPTIONS`, `TRACE`) are never checked.
//!
//! A checked operation passes when either
//!
//! - it declares a header parameter named `Idempotency-Key` (case-insensitive, as HTTP field
//!   names are), inline or through a local `$ref` (`#/components/parameters/...` in OpenAPI 3,
//!   `#/parameters/...` in Swagger 2.0), on the operation or on its path item; or
//! - it names another key source with [`EXT_KEY_SOURCE`] (a webhook receiver keyed on
//!   `webhook-id`, or on the body's `/id`), on the operation or on its path item; or
//! - it carries the vendor extension [`EXT_UNSAFE_TO_RETRY`]` : true`, on the operation or on its
//!   path item.
//!
//! ## The vendor extensions
//!
//! | extension | where | meaning |
//! |---|---|---|
//! | `x-oncely-unsafe-to-retry: true` | operation or path item | "this operation does not take an idempotency key; clients must not retry it automatically". The explicit opt-out: the author has decided, and generated clients and humans can see it. |
//! | `x-oncely-idempotent: true \| false` | operation or path item | overrides the method's default: `true` exempts a side-effect-free `POST`, `false` subjects a `PUT`/`DELETE` that is not really idempotent to the rule. |
//! | `x-oncely-key-source: "webhook-id"` (or `"/id"`) | operation or path item | the operation reads its idempotency key from this header, or from the body at this JSON Pointer, instead of `Idempotency-Key` (a webhook receiver): it takes a key. |
//! | `x-oncely-verified-idempotent: true` | operation or path item | "this `PUT`/`DELETE` was checked and repeating it changes nothing" (for example by `oncely audit`'s method-idempotency check): silences the warning below. |
//!
//! ## The warning
//!
//! A `PUT` or `DELETE` that takes no key passes on its method's promise alone, and a `PUT` that
//! appends to a log or a `DELETE` that decrements a counter breaks it while every client, proxy
//! and SDK retries it freely. So the lint **warns** (it does not fail: the exit status is
//! unchanged) about every `PUT`/`DELETE` operation that declares no `Idempotency-Key`, is not
//! `x-oncely-unsafe-to-retry: true`, and is not marked [`EXT_VERIFIED_IDEMPOTENT`]` : true`,
//! pointing at the audit's method-idempotency check (`oncely audit URL --endpoint 'PUT
//! /path'`), which sends the request twice without a key and compares the state.
//!
//! Only boolean values count; `"true"` as a string is ignored (and so fails closed).
//! The operation's value wins over the path item's.
//!
//! References: only local references (starting with `#`) are followed; an external reference
//! (`common.yaml#/...`) cannot be checked and does not count as declaring the key (the finding
//! says so). Cyclic references are detected and reported the same way.

mod error;
mod parse;

pub use error::LintError;
use parse::{get, key_text};
use serde_json::json;
use serde_norway::Value;
use std::fmt;

/// The vendor extension that marks an operation as deliberately keyless and unsafe to retry.
pub const EXT_UNSAFE_TO_RETRY: &str = "x-oncely-unsafe-to-retry";

/// The vendor extension that overrides whether an operation's method is idempotent.
pub const EXT_IDEMPOTENT: &str = "x-oncely-idempotent";

/// The vendor extension that says a `PUT`/`DELETE` operation's idempotency was verified (for
/// example by `oncely audit`'s method-idempotency check): it silences the lint's warning.
pub const EXT_VERIFIED_IDEMPOTENT: &str = "x-oncely-verified-idempotent";

/// The vendor extension that names where an operation reads its idempotency key when it is
/// not the `Idempotency-Key` header: another header (`webhook-id`, `X-GitHub-Delivery`) or a
/// JSON Pointer into the body (`/id`), as `oncely_tower::KeySource` does. A non-empty string
/// counts as taking a key.
pub const EXT_KEY_SOURCE: &str = "x-oncely-key-source";

/// The header an operation must accept (compared case-insensitively).
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The HTTP methods an OpenAPI path item may hold, in the order findings report them.
const METHODS: [&str; 8] = [
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

/// How deep `$ref` chains are followed before giving up (a cycle guard).
const MAX_REF_DEPTH: usize = 16;

/// One operation that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// The HTTP method, upper case (`POST`).
    pub method: String,
    /// The path template as written in the document (`/v1/payments/{id}`).
    pub path: String,
    /// The operation's `operationId`, when it has one.
    pub operation_id: Option<String>,
    /// Why it was reported, in one sentence a person can act on.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)?;
        if let Some(id) = &self.operation_id {
            write!(f, " ({id})")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The result of [`lint`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LintReport {
    /// Every operation that breaks the rule, in document order.
    pub findings: Vec<Finding>,
    /// Warnings, in document order: `PUT`/`DELETE` operations that take no key and are not
    /// marked [`EXT_VERIFIED_IDEMPOTENT`]` : true`. They do not fail the lint (the exit status
    /// stays 0); they point at the audit's method-idempotency check.
    pub warnings: Vec<Finding>,
    /// How many `POST`, `PUT`, `PATCH` and `DELETE` operations were looked at (the methods the
    /// rule applies to before extensions; safe methods are not counted).
    pub operations_checked: usize,
}

impl LintReport {
    /// `true` when there are no findings (the CLI exits 0); warnings do not count.
    pub fn passed(&self) -> bool {
        self.findings.is_empty()
    }

    /// A human-readable report: one line per finding, then a summary line.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            out.push_str(&f.to_string());
            out.push('\n');
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out.push_str(&format!(
            "lint: {} state-changing operation(s) checked, {} without an Idempotency-Key or {}",
            self.operations_checked,
            self.findings.len(),
            EXT_UNSAFE_TO_RETRY
        ));
        if !self.warnings.is_empty() {
            out.push_str(&format!(
                ", {} warning(s) (PUT/DELETE not verified idempotent)",
                self.warnings.len()
            ));
        }
        out.push('\n');
        out
    }

    /// The report as JSON:
    /// `{"passed": bool, "operations_checked": n, "findings": [{"method", "path", "operation_id", "message"}], "warnings": [...the same shape]}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "passed": self.passed(),
            "operations_checked": self.operations_checked,
            "findings": self.findings.iter().map(|f| json!({
                "method": f.method,
                "path": f.path,
                "operation_id": f.operation_id,
                "message": f.message,
            })).collect::<Vec<_>>(),
            "warnings": self.warnings.iter().map(|f| json!({
                "method": f.method,
                "path": f.path,
                "operation_id": f.operation_id,
                "message": f.message,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Lints an OpenAPI 3.x (or Swagger 2.0) document given as JSON or YAML text.
///
/// Text whose first non-blank character is `{` is parsed as JSON, anything else as YAML. See the
/// [module documentation](self) for the rule and the vendor extensions.
///
/// # Errors
///
/// [`LintError::Empty`], [`LintError::Json`] or [`LintError::Yaml`] when the text does not parse
/// (with the line and column), [`LintError::NotOpenApi`] when it parses but has no `openapi` or
/// `swagger` version field, is not a mapping, or its `paths` is not a mapping.
pub fn lint(spec_text: &str) -> Result<LintReport, LintError> {
    let doc = parse::parse(spec_text)?;
    if !matches!(doc, Value::Mapping(_)) {
        return Err(LintError::NotOpenApi(
            "the top level is not a mapping".to_owned(),
        ));
    }
    if get(&doc, "openapi").is_none() && get(&doc, "swagger").is_none() {
        return Err(LintError::NotOpenApi(
            "no `openapi` (3.x) or `swagger` (2.0) version field at the top level".to_owned(),
        ));
    }
    let mut report = LintReport {
        findings: Vec::new(),
        warnings: Vec::new(),
        operations_checked: 0,
    };
    let paths = match get(&doc, "paths") {
        None | Some(Value::Null) => return Ok(report),
        Some(Value::Mapping(paths)) => paths,
        Some(_) => return Err(LintError::NotOpenApi("`paths` is not a mapping".to_owned())),
    };
    for (path_key, item) in paths {
        let Some(path) = key_text(path_key) else {
            continue;
        };
        if path.starts_with("x-") {
            continue; // a vendor extension on the Paths object, not a path
        }
        let item = match resolve(&doc, item, 0) {
            Ok(item) => item,
            Err(why) => {
                report.findings.push(Finding {
                    method: "*".to_owned(),
                    path: path.clone(),
                    operation_id: None,
                    message: format!("the path item could not be checked: {why}"),
                });
                continue;
            }
        };
        for method in METHODS {
            let Some(op) = get(item, method) else {
                continue;
            };
            match check_operation(&doc, &path, method, item, op, &mut report) {
                Verdict::Pass => {}
                Verdict::Finding(f) => report.findings.push(f),
                Verdict::Warning(w) => report.warnings.push(w),
            }
        }
    }
    Ok(report)
}

/// What the rule says about one operation.
enum Verdict {
    /// It passes, or the rule does not apply.
    Pass,
    /// It breaks the rule.
    Finding(Finding),
    /// A `PUT`/`DELETE` that takes no key and is not marked verified idempotent.
    Warning(Finding),
}

/// Applies the rule to one operation.
fn check_operation(
    doc: &Value,
    path: &str,
    method: &str,
    item: &Value,
    op: &Value,
    report: &mut LintReport,
) -> Verdict {
    let by_method = match method {
        "post" | "patch" => Some(false),
        "put" | "delete" => Some(true),
        _ => None,
    };
    let Some(by_method_idempotent) = by_method else {
        return Verdict::Pass;
    };
    report.operations_checked += 1;
    let ext = |name| bool_ext(op, name).or_else(|| bool_ext(item, name));
    let idempotent = ext(EXT_IDEMPOTENT).unwrap_or(by_method_idempotent);
    let unsafe_to_retry = ext(EXT_UNSAFE_TO_RETRY) == Some(true);
    let mut unresolved = Vec::new();
    let mut takes_key = [get(op, EXT_KEY_SOURCE), get(item, EXT_KEY_SOURCE)]
        .into_iter()
        .flatten()
        .any(|v| matches!(v, Value::String(s) if !s.trim().is_empty()));
    for params in [get(op, "parameters"), get(item, "parameters")]
        .into_iter()
        .flatten()
    {
        let Value::Sequence(params) = params else {
            continue;
        };
        for param in params {
            match resolve(doc, param, 0) {
                Ok(p) if is_key_header(p) => takes_key = true,
                Ok(_) => {}
                Err(why) => unresolved.push(why),
            }
        }
    }
    if takes_key || unsafe_to_retry {
        return Verdict::Pass;
    }
    let operation_id = match get(op, "operationId") {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    let upper = method.to_ascii_uppercase();
    let finding = |message: String| Finding {
        method: upper.clone(),
        path: path.to_owned(),
        operation_id: operation_id.clone(),
        message,
    };
    if idempotent {
        // A PUT/DELETE idempotent by its method alone (or by a bare claim): only a check of
        // the endpoint itself says whether it keeps the promise.
        if !by_method_idempotent || ext(EXT_VERIFIED_IDEMPOTENT) == Some(true) {
            return Verdict::Pass;
        }
        return Verdict::Warning(finding(format!(
            "{upper} promises idempotency (RFC 9110 section 9.2.2) but takes no \
             `{IDEMPOTENCY_KEY_HEADER}`, and nothing says the promise was verified: run `oncely \
             audit BASE_URL --endpoint '{upper} {path}'` (its method-idempotency check sends the \
             request twice without a key and compares the state), then mark the operation \
             `{EXT_VERIFIED_IDEMPOTENT}: true`, or accept an `{IDEMPOTENCY_KEY_HEADER}`"
        )));
    }
    let why_checked = if by_method_idempotent {
        format!("{upper} is marked {EXT_IDEMPOTENT}: false, so it")
    } else {
        format!("{upper} is not idempotent (RFC 9110 section 9.2.2) and")
    };
    let mut message = format!(
        "{why_checked} declares no `{IDEMPOTENCY_KEY_HEADER}` header parameter and is not marked \
         `{EXT_UNSAFE_TO_RETRY}: true`: a retried request may run twice"
    );
    if !unresolved.is_empty() {
        message.push_str(&format!(" (not followed: {})", unresolved.join("; ")));
    }
    Verdict::Finding(finding(message))
}

fn bool_ext(node: &Value, name: &str) -> Option<bool> {
    match get(node, name) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    }
}

fn is_key_header(param: &Value) -> bool {
    let name_ok = matches!(get(param, "name"), Some(Value::String(n)) if n.eq_ignore_ascii_case(IDEMPOTENCY_KEY_HEADER));
    let in_ok = matches!(get(param, "in"), Some(Value::String(i)) if i == "header");
    name_ok && in_ok
}

/// Follows `node`'s `$ref` (if any) to its target inside `doc`.
///
/// # Errors
///
/// A description of the reference when it is external, does not resolve, or the chain is deeper
/// than [`MAX_REF_DEPTH`] (a cycle).
fn resolve<'a>(doc: &'a Value, node: &'a Value, depth: usize) -> Result<&'a Value, String> {
    let Some(reference) = get(node, "$ref") else {
        return Ok(node);
    };
    let Value::String(reference) = reference else {
        return Err("a `$ref` that is not a string".to_owned());
    };
    if depth >= MAX_REF_DEPTH {
        return Err(format!(
            "`$ref: {reference}` (reference chain too deep or cyclic)"
        ));
    }
    let Some(pointer) = reference.strip_prefix('#') else {
        return Err(format!(
            "`$ref: {reference}` (only local references are followed)"
        ));
    };
    let mut target = doc;
    if !pointer.is_empty() {
        let Some(rest) = pointer.strip_prefix('/') else {
            return Err(format!("`$ref: {reference}` (not a JSON pointer)"));
        };
        for token in rest.split('/') {
            // RFC 6901 section 4: `~1` is `/`, `~0` is `~`, in that order.
            let token = token.replace("~1", "/").replace("~0", "~");
            let token = percent_decode(&token);
            target = match target {
                Value::Mapping(_) => get(target, &token),
                Value::Sequence(seq) => token.parse::<usize>().ok().and_then(|i| seq.get(i)),
                _ => None,
            }
            .ok_or_else(|| format!("`$ref: {reference}` (does not resolve)"))?;
        }
    }
    resolve(doc, target, depth + 1)
}

/// Decodes `%XX` escapes (a `$ref` is a URI fragment, RFC 3986 section 3.5); invalid escapes
/// are kept as written.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_escapes_resolve() {
        let doc = parse::parse(
            r#"{"openapi":"3.0.0","components":{"parameters":{"a/b":{"name":"Idempotency-Key","in":"header"},"c d":{"name":"x","in":"query"}}}}"#,
        )
        .unwrap();
        let node = parse::parse(r##"{"$ref":"#/components/parameters/a~1b"}"##).unwrap();
        assert!(is_key_header(resolve(&doc, &node, 0).unwrap()));
        let node = parse::parse(r##"{"$ref":"#/components/parameters/c%20d"}"##).unwrap();
        assert!(!is_key_header(resolve(&doc, &node, 0).unwrap()));
    }

    #[test]
    fn cyclic_and_external_refs_are_errors() {
        let doc =
            parse::parse(r##"{"openapi":"3.0.0","a":{"$ref":"#/b"},"b":{"$ref":"#/a"}}"##).unwrap();
        let node = parse::parse(r##"{"$ref":"#/a"}"##).unwrap();
        assert!(
            resolve(&doc, &node, 0)
                .unwrap_err()
                .contains("too deep or cyclic")
        );
        let node = parse::parse(r##"{"$ref":"common.yaml#/x"}"##).unwrap();
        assert!(
            resolve(&doc, &node, 0)
                .unwrap_err()
                .contains("only local references")
        );
        let node = parse::parse(r##"{"$ref":"#/nope"}"##).unwrap();
        assert!(
            resolve(&doc, &node, 0)
                .unwrap_err()
                .contains("does not resolve")
        );
    }

    #[test]
    fn percent_decode_keeps_invalid_escapes() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("a%2"), "a%2");
        assert_eq!(percent_decode("a%zzb"), "a%zzb");
    }
}
