//! The RFC 8785 reference test vectors (`tests/data/rfc8785`, from the reference
//! implementations' repository) through `oncely_core::jcs`.

use oncely_core::jcs::{JcsErrorKind, canonicalize, is_canonical};
use std::path::Path;

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
/// `333333333.3333333` has 16): it is not exactly the value of its canonical form (the shortest
/// form of its nearest double), so another decimal would share that form; it is not I-JSON for
/// us (RFC 7493 section 2.2) and is refused. With that one number shortened to 15 digits in the input and in the reference
/// output, every other value comes out as the reference says.
#[test]
fn reference_values_refuse_an_inexact_number_and_match_otherwise() {
    let input = String::from_utf8(vector("input", "values")).unwrap();
    let err = canonicalize(input.as_bytes()).unwrap_err();
    assert_eq!(err.kind(), JcsErrorKind::InexactNumber);
    assert_eq!(
        &input[err.offset()..err.offset() + 18],
        "333333333.33333329"
    );
    let want = String::from_utf8(vector("output", "values")).unwrap();
    assert!(want.contains("333333333.3333333,"));
    let input = input.replace("333333333.33333329", "333333333.333333");
    let want = want.replace("333333333.3333333,", "333333333.333333,");
    let got = canonicalize(input.as_bytes()).unwrap();
    assert_eq!(String::from_utf8_lossy(&got), want);
}
