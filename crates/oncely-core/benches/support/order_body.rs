//! The JSON body of the fingerprint benches (`benches/fingerprint.rs`,
//! `benches/fingerprint_ratio.rs`), shared with the test that pins its fingerprints
//! (`tests/jcs.rs`).

/// A realistic JSON API body of about `target` bytes (at least `target`, ending at a whole line
/// item): an order with line items (strings, integers, decimals, booleans, nested objects and
/// arrays), keys deliberately not in canonical order.
pub(crate) fn json_body(target: usize) -> Vec<u8> {
    let mut out = String::from(
        r#"{"customer":{"name":"Ada Lovelace","email":"ada@example.com"},"currency":"eur","items":["#,
    );
    let mut i = 0u32;
    while out.len() + 2 < target {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            r#"{{"sku":"SKU-{i:06}","quantity":{},"unit_price":{}.{:02},"gift":{},"meta":{{"warehouse":"w{}","tags":["a","b{}"]}},"note":"line item number {i} of the order"}}"#,
            i % 17 + 1,
            i % 997,
            i % 100,
            i.is_multiple_of(2),
            i % 5,
            i % 3
        ));
        i += 1;
    }
    out.push_str("]}");
    out.into_bytes()
}
