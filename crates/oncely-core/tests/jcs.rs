//! The RFC 8785 reference test vectors (`tests/data/rfc8785`, from the reference
//! implementations' repository) through `oncely_core::jcs`.

use oncely_core::fingerprint::{RequestParts, fingerprint_v1};
use oncely_core::jcs::{canonicalize, is_canonical};
use std::path::Path;

#[path = "../benches/support/order_body.rs"]
mod order_body;

fn vector(dir: &str, name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/rfc8785")
        .join(dir)
        .join(format!("{name}.json"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn reference_inputs_give_the_reference_outputs() {
    for name in ["arrays", "french", "structures", "unicode", "weird"] {
        let input = vector("input", name);
        let want = vector("output", name);
        let got = canonicalize(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            String::from_utf8_lossy(&got),
            String::from_utf8_lossy(&want),
            "{name}"
        );
        // The expected output is canonical as it is (the fast path), and a fixed point.
        assert_eq!(is_canonical(&want), Ok(true), "{name}");
        assert_eq!(canonicalize(&want).unwrap(), want, "{name}");
    }
}

/// `values.json` holds `333333333.33333329` (17 significant digits; its reference output
/// `333333333.3333333` has 16): it is not exactly the value of its nearest double's shortest
/// form, so that form is another decimal's, and it is kept as written (docs/DESIGN.md, "Large
/// numbers"). Every other value comes out as the reference says.
#[test]
fn reference_values_keep_an_inexact_number_as_written_and_match_otherwise() {
    let input = String::from_utf8(vector("input", "values")).unwrap();
    assert!(input.contains("333333333.33333329"));
    let got = String::from_utf8(canonicalize(input.as_bytes()).unwrap()).unwrap();
    let want = String::from_utf8(vector("output", "values")).unwrap();
    assert!(want.contains("333333333.3333333,"));
    assert_eq!(
        got,
        want.replace("333333333.3333333,", "333333333.33333329,")
    );
    assert_eq!(is_canonical(got.as_bytes()), Ok(true));
    // The same number shortened to 15 digits is one a double carries: RFC 8785's form.
    let input = input.replace("333333333.33333329", "333333333.333333");
    let want = want.replace("333333333.3333333,", "333333333.333333,");
    let got = canonicalize(input.as_bytes()).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), want);
}

/// The fingerprints of the benches' JSON bodies (`benches/support/order_body.rs`: an order with
/// nested line items, keys not in canonical order, some decimals not in shortest form) at their
/// three sizes, as computed before any optimization of the canonicalizer (and by an independent
/// RFC 8785 serialization of the parsed bodies): a faster canonicalizer must not change a
/// fingerprint (docs/DESIGN.md, "The fingerprint"). The body already in canonical form has the
/// same fingerprint, and is its own canonical form.
#[test]
fn the_bench_bodies_keep_their_fingerprints() {
    for (size, body_len, canonical_len, want) in [
        (
            1 << 10,
            1135,
            1132,
            "8853dc70e25c409a82bb78a35eea4ee7d8dfa1af05a7d9639360ba7bbe5c13e4",
        ),
        (
            64 << 10,
            65613,
            65560,
            "18704f7f8302288149e98336e70312d29f4e8edf143102ff35e443cc2f354013",
        ),
        (
            1 << 20,
            1048597,
            1047783,
            "6e747d5f381ac9e68ce7ed82184142140fc7c851cf2c7bdbca8107dc260046cf",
        ),
    ] {
        let body = order_body::json_body(size);
        assert_eq!(body.len(), body_len, "{size}");
        let canonical = canonicalize(&body).unwrap();
        assert_eq!(canonical.len(), canonical_len, "{size}");
        assert_eq!(is_canonical(&body), Ok(false), "{size}");
        assert_eq!(is_canonical(&canonical), Ok(true), "{size}");
        assert_eq!(canonicalize(&canonical).unwrap(), canonical, "{size}");
        for b in [&body, &canonical] {
            let fp = fingerprint_v1(
                &RequestParts::new("POST", "/v1/orders", b)
                    .with_content_type(Some(b"application/json")),
            );
            assert_eq!(fp.to_string(), format!("v1:{want}"), "{size}");
        }
    }
}
