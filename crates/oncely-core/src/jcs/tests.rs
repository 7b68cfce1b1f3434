use super::*;
use proptest::prelude::*;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::collections::HashSet;
use std::fmt;

/// The tree-based canonicalizer fingerprint version 1 used before this module
/// (`serde_json::Value` serialized by `serde_json_canonicalizer`), with number tokens sorted
/// by a rule written independently of the parser's: the oracle. The tree reads every number as
/// a double, so a number no double carries is handed to it as a placeholder string, and its
/// token is put back as written in the output (docs/DESIGN.md, "Large numbers").
fn oracle(body: &[u8]) -> Option<Vec<u8>> {
    // Valid JSON as sent (serde's `IgnoredAny` checks number syntax, never range): a
    // placeholder must not turn a number where no value may be into a string that may.
    serde_json::from_slice::<de::IgnoredAny>(body).ok()?;
    let (masked, exact) = oracle_mask_numbers(body);
    let value: serde_json::Value = serde_json::from_slice(&masked).ok()?;
    let mut out = serde_json_canonicalizer::to_vec(&value).ok()?;
    for (i, token) in exact.iter().enumerate().rev() {
        let mark = format!("\"{}\"", oracle_placeholder(i));
        let mark = mark.as_bytes();
        let at = out.windows(mark.len()).position(|w| w == mark)?;
        out.splice(at..at + mark.len(), token.iter().copied());
    }
    Some(out)
}

fn oracle_placeholder(i: usize) -> String {
    format!("~oncely-oracle-exact-number-{i}~")
}

/// The body with every number token that no double carries replaced by a placeholder string
/// (number `i` by `"~oncely-oracle-exact-number-i~"`), and those tokens in order.
fn oracle_mask_numbers(body: &[u8]) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut out = Vec::with_capacity(body.len());
    let mut exact = Vec::new();
    let mut i = 0;
    let mut in_string = false;
    while i < body.len() {
        let b = body[i];
        if in_string {
            out.push(b);
            match b {
                b'\\' => {
                    if let Some(&next) = body.get(i + 1) {
                        out.push(next);
                    }
                    i += 1;
                }
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                out.push(b);
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < body.len()
                    && matches!(body[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    i += 1;
                }
                let tok = &body[start..i];
                if oracle_number_fits_double(tok) {
                    out.extend_from_slice(tok);
                } else {
                    out.extend_from_slice(
                        format!("\"{}\"", oracle_placeholder(exact.len())).as_bytes(),
                    );
                    exact.push(tok.to_vec());
                }
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    (out, exact)
}

/// Whether a double carries the number token `tok`: it is in the range of normal doubles (or
/// zero), and is exactly the decimal of its nearest double's ECMAScript shortest form.
fn oracle_number_fits_double(tok: &[u8]) -> bool {
    let (mantissa, exponent) = match tok.iter().position(|&b| b == b'e' || b == b'E') {
        Some(p) => (&tok[..p], Some(&tok[p + 1..])),
        None => (tok, None),
    };
    let Ok(v) = std::str::from_utf8(tok).unwrap_or("x").parse::<f64>() else {
        return false;
    };
    let zero = mantissa.iter().all(|b| matches!(b, b'0' | b'.' | b'-'));
    if !v.is_finite() || (!zero && !v.is_normal()) {
        return false;
    }
    let significant = mantissa
        .iter()
        .filter(|b| b.is_ascii_digit())
        .skip_while(|&&b| b == b'0')
        .count();
    let short = significant <= 15
        && match exponent {
            None => true,
            Some(e) => {
                let digits: Vec<u8> = e.iter().copied().filter(u8::is_ascii_digit).collect();
                digits.len() <= 3
                    && std::str::from_utf8(&digits)
                        .ok()
                        .and_then(|s| s.parse::<u32>().ok())
                        .is_some_and(|n| n <= 300)
            }
        };
    if short {
        return true;
    }
    // Longer: the token must be exactly the decimal of its nearest double's ECMAScript
    // form, compared as scientific notation. (Not std's `{:e}`: where a double lies
    // exactly halfway between two 17-digit decimals, std may round up and ECMAScript
    // rounds to even; the canonical form is ECMAScript's.)
    let shortest = ryu_js::Buffer::new().format_finite(v).to_owned();
    oracle_scientific(tok) == oracle_scientific(shortest.as_bytes())
}

/// A number token in scientific notation with its digits stripped of zeros at both ends
/// (`"-120.50e1"` is `"-1205e3"`: `-0.1205 x 10^4`); zero is `"0"`.
fn oracle_scientific(tok: &[u8]) -> String {
    let text = std::str::from_utf8(tok).unwrap();
    let (neg, text) = match text.strip_prefix('-') {
        Some(t) => (true, t),
        None => (false, text),
    };
    let (m, e) = text.split_once(['e', 'E']).unwrap_or((text, "0"));
    let e: i64 = e.trim_start_matches('+').parse().unwrap();
    let (int, frac) = m.split_once('.').unwrap_or((m, ""));
    let all = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    if trimmed.is_empty() {
        return "0".to_owned();
    }
    let point = int.len() as i64 - (all.len() - trimmed.len()) as i64 + e;
    format!(
        "{}{}e{point}",
        if neg { "-" } else { "" },
        trimmed.trim_end_matches('0')
    )
}

/// A JSON value read by serde with duplicate member names refused: an independent check
/// of [`JcsErrorKind::DuplicateName`].
struct NoDuplicates;

impl<'de> Deserialize<'de> for NoDuplicates {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NoDuplicates;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_bool<E>(self, _: bool) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_i64<E>(self, _: i64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_u64<E>(self, _: u64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_f64<E>(self, _: f64) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_str<E>(self, _: &str) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_unit<E>(self) -> Result<NoDuplicates, E> {
                Ok(NoDuplicates)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<NoDuplicates, A::Error> {
                while a.next_element::<NoDuplicates>()?.is_some() {}
                Ok(NoDuplicates)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<NoDuplicates, A::Error> {
                let mut seen = HashSet::new();
                while let Some(k) = a.next_key::<String>()? {
                    if !seen.insert(k) {
                        return Err(de::Error::custom("duplicate member name"));
                    }
                    a.next_value::<NoDuplicates>()?;
                }
                Ok(NoDuplicates)
            }
        }
        d.deserialize_any(V)
    }
}

fn has_duplicates(body: &[u8]) -> bool {
    // serde refuses numbers beyond the range of doubles: placeholders stand for them.
    let (body, _) = oracle_mask_numbers(body);
    serde_json::from_slice::<serde_json::Value>(&body).is_ok()
        && serde_json::from_slice::<NoDuplicates>(&body).is_err()
}

/// Checks the streaming canonicalizer against the oracle on one body.
/// Objects of one shape repeated (the member-order cache), shapes alternating in one slot,
/// the same prefixes in another order, names that tie on their 8-byte prefix (never
/// remembered) and a duplicate inside a repeated shape.
#[test]
fn repeated_shapes_reuse_their_order() {
    let mut body = String::from("[");
    for i in 0..40 {
        body.push_str(&format!(
            r#"{{"sku":"s{i}","qty":{i},"meta":{{"w":{i},"a":[{i}]}},"b":true}},"#
        ));
        body.push_str(&format!(r#"{{"b":{i},"sku":1,"qty":2,"meta":3}},"#));
        body.push_str(&format!(
            r#"{{"abcdefghZ":{i},"abcdefgh":1,"abcdefghA":2,"x\u0041":[{{"z":1,"y":2}}]}},"#
        ));
    }
    body.push_str(r#"{"sku":1,"qty":2,"meta":3,"b":4}]"#);
    for _ in 0..2 {
        check(body.as_bytes()).unwrap();
    }
    let dup = r#"[{"b":1,"a":2},{"b":1,"a":2},{"b":1,"b":2}]"#;
    assert_eq!(
        canonicalize(dup.as_bytes()).unwrap_err().kind(),
        JcsErrorKind::DuplicateName
    );
    let dup = r#"[{"b":1,"a":2,"c":3},{"b":1,"a":2,"c":3},{"b":1,"a":2,"b":3}]"#;
    assert_eq!(
        canonicalize(dup.as_bytes()).unwrap_err().kind(),
        JcsErrorKind::DuplicateName
    );
}

fn check(body: &[u8]) -> Result<(), TestCaseError> {
    let new = canonicalize(body);
    let old = oracle(body);
    match &new {
        Ok(c) => {
            prop_assert_eq!(
                Some(c),
                old.as_ref(),
                "body {:?}",
                String::from_utf8_lossy(body)
            );
            prop_assert!(!has_duplicates(body));
            // The output is canonical (the fast path takes it as is) and a fixed point.
            prop_assert_eq!(is_canonical(c), Ok(true));
            prop_assert_eq!(&canonicalize(c).unwrap(), c);
            prop_assert_eq!(is_canonical(body), Ok(c.as_slice() == body));
            // The hashed form is the same bytes, framed.
            let mut h = Sha256::new();
            hash_framed(body, &mut h).unwrap();
            let mut want = Sha256::new();
            want.update((c.len() as u64).to_be_bytes());
            want.update(c);
            prop_assert_eq!(h.finalize(), want.finalize());
        }
        Err(e) => match e.kind() {
            // Not JSON for serde either.
            JcsErrorKind::Syntax | JcsErrorKind::TooDeep => {
                prop_assert!(serde_json::from_slice::<serde_json::Value>(body).is_err());
                prop_assert_eq!(&old, &None);
            }
            JcsErrorKind::DuplicateName => prop_assert!(has_duplicates(body)),
            // serde refuses lone surrogates: version 1 took such a body as raw bytes.
            JcsErrorKind::LoneSurrogate => prop_assert_eq!(&old, &None),
            JcsErrorKind::TooLarge => prop_assert!(false),
        },
    }
    // Whatever the oracle canonicalizes, this one canonicalizes the same, unless it refuses
    // a duplicate name.
    if let Some(o) = &old
        && new.is_err()
    {
        let kind = new.unwrap_err().kind();
        prop_assert!(
            kind == JcsErrorKind::DuplicateName,
            "{:?} for {:?}",
            kind,
            String::from_utf8_lossy(o)
        );
    }
    Ok(())
}

fn ok(body: &str) -> String {
    String::from_utf8(canonicalize(body.as_bytes()).unwrap()).unwrap()
}

fn kind(body: &str) -> JcsErrorKind {
    canonicalize(body.as_bytes()).unwrap_err().kind()
}

#[test]
fn canonical_forms() {
    assert_eq!(
        ok(r#" { "b" : 2 , "a" : [ 1 , { } , [ ] ] } "#),
        r#"{"a":[1,{},[]],"b":2}"#
    );
    assert_eq!(
        ok("[1.50, -0, -0.0, 1E3, 1e21, 1e-7, 0.000001, 12.0e-1]"),
        "[1.5,0,0,1000,1e+21,1e-7,0.000001,1.2]"
    );
    assert_eq!(
        ok(r#""\u0041\/\u00e9\uD83D\uDE00\u001F\u001f\n""#),
        "\"A/\u{e9}\u{1f600}\\u001f\\u001f\\n\""
    );
    assert_eq!(ok(r#"{"\u0062":1,"a":2}"#), r#"{"a":2,"b":1}"#);
    // Names with escapes that must stay escaped.
    assert_eq!(ok(r#"{"\"\n\u0001":1}"#), r#"{"\"\n\u0001":1}"#);
    // UTF-16 order: U+1F600 (a surrogate pair, D83D) sorts before U+FB33.
    assert_eq!(
        ok("{\"\u{fb33}\":1,\"\u{1f600}\":2}"),
        "{\"\u{1f600}\":2,\"\u{fb33}\":1}"
    );
    assert_eq!(is_canonical(br#"{"a":[1,"x"],"b":null}"#), Ok(true));
    assert_eq!(is_canonical(br#"{"b":1,"a":2}"#), Ok(false));
    assert_eq!(is_canonical(b"1.0"), Ok(false));
}

/// A fraction that ends in zeros loses them (and its point when nothing is left), at the root,
/// in an array and as a member's value; `-0.0` is `0` and values below 1e-6 take an exponent.
#[test]
fn fraction_zeros_are_cut() {
    for (body, want) in [
        ("5.10", "5.1"),
        ("12.0", "12"),
        ("0.00", "0"),
        ("-0.0", "0"),
        ("-0.50", "-0.5"),
        ("-12.000", "-12"),
        ("0.0000010", "0.000001"),
        ("0.00000010", "1e-7"),
        ("123456789012345.0", "123456789012345"),
        ("1234567890123456.0", "1234567890123456"),
    ] {
        assert_eq!(ok(body), want, "{body}");
        assert_eq!(is_canonical(body.as_bytes()), Ok(false), "{body}");
        assert_eq!(ok(&format!("[{body},{body}]")), format!("[{want},{want}]"));
        assert_eq!(
            ok(&format!(r#"{{"b":{body},"a":{body}}}"#)),
            format!(r#"{{"a":{want},"b":{want}}}"#)
        );
        assert_eq!(
            ok(&format!(r#"{{"a":{body},"b":[{body}]}}"#)),
            format!(r#"{{"a":{want},"b":[{want}]}}"#)
        );
    }
}

#[test]
fn not_i_json_is_refused() {
    assert_eq!(
        kind(r#"{"amount":1,"amount":5000}"#),
        JcsErrorKind::DuplicateName
    );
    // After unescaping, and in any order.
    assert_eq!(
        kind(r#"{"a":1,"b":0,"\u0061":2}"#),
        JcsErrorKind::DuplicateName
    );
    assert_eq!(
        kind(r#"[{"x":{"a":1,"a":1}}]"#),
        JcsErrorKind::DuplicateName
    );
    assert_eq!(kind(r#""\ud800""#), JcsErrorKind::LoneSurrogate);
    assert_eq!(kind(r#""\udc00\ud800""#), JcsErrorKind::LoneSurrogate);
    assert_eq!(kind(r#"{"\ud800x":1}"#), JcsErrorKind::LoneSurrogate);
    // The refusal is only reported for JSON: a syntax error after it makes it not JSON.
    assert_eq!(kind(r#"[{"a":1,"a":2},"#), JcsErrorKind::Syntax);
    assert!(JcsErrorKind::DuplicateName.is_json());
    assert!(!JcsErrorKind::Syntax.is_json());
    let e = canonicalize(br#"[1,{"a":1,"a":2}]"#).unwrap_err();
    assert_eq!(e.offset(), 3);
    assert_eq!(
        e.to_string(),
        "an object has two members with the same name at byte 3"
    );
}

/// A number no double carries is canonicalized by its digits, as written (docs/DESIGN.md,
/// "Large numbers"): never the form of its nearest double, which another decimal has.
#[test]
fn numbers_no_double_carries_keep_their_digits() {
    for n in [
        // Integers beyond 2^53: 64-bit ids.
        "9007199254740993",
        "12345678901234567890",
        "-9223372036854775807",
        "18446744073709551615",
        "18014398509481985",
        "1152921504606846976",
        "123456789012345678901234567890",
        // More precision than a double.
        "3.1415926535897932",
        "0.1000000000000000000001",
        "0.1000000000000000055511151231257827021181583404541015625",
        // Other spellings of those, and their digits kept as they are (case, sign, zeros).
        "1.2345678901234567890e19",
        "1.2345678901234567890E+19",
        "12345678901234567890.0",
        "012e5",
        // Beyond the range of normal doubles.
        "999999999999999e300",
        "0.0000000001e-300",
        "1e99999",
        "-1e400",
        "1e-400",
        "5e-324",
        "2.2250738585072009e-308",
    ] {
        // `012e5` is not JSON: a leading zero.
        if n == "012e5" {
            assert_eq!(kind(n), JcsErrorKind::Syntax);
            continue;
        }
        assert_eq!(ok(n), n, "{n}");
        assert_eq!(is_canonical(n.as_bytes()), Ok(true), "{n}");
        assert_eq!(oracle(n.as_bytes()).as_deref(), Some(n.as_bytes()), "{n}");
        // Inside a body that is reordered, the token is copied as it is.
        let body = format!(r#"{{ "z" : [ {n} ], "a" : {n} }}"#);
        assert_eq!(ok(&body), format!(r#"{{"a":{n},"z":[{n}]}}"#), "{n}");
        check(body.as_bytes()).unwrap();
    }
    // 2^53 + 1 and 2^53 are one double, and two canonical forms; so are two spellings of one
    // 64-bit id (a mismatch for the fingerprint, never a shared form).
    assert_ne!(ok("9007199254740993"), ok("9007199254740992"));
    assert_eq!(ok("9007199254740992"), "9007199254740992");
    assert_ne!(ok("12345678901234567890"), ok("1.2345678901234567890e19"));
    assert_ne!(ok("12345678901234567890"), ok("12345678901234567000"));
    assert_eq!(ok("12345678901234567000"), "12345678901234567000");
    assert_ne!(
        ok("0.1000000000000000055511151231257827021181583404541015625"),
        ok("0.1")
    );
    // Beyond 15 significant digits or an exponent of 300, a number that is the same decimal
    // as its nearest double's shortest form keeps RFC 8785's form (what JavaScript's
    // `Math.PI` and `0.1 + 0.2` serialize to, a 16-digit id, an integer up to 2^53, or a
    // larger one that is its double's shortest form, as 2^54). 2^60 written in full is not:
    // its shortest form is `1152921504606847000`, another decimal.
    for (n, want) in [
        ("3.141592653589793", "3.141592653589793"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("-0.30000000000000004", "-0.30000000000000004"),
        ("9007199254740991", "9007199254740991"),
        ("1234567890123456", "1234567890123456"),
        ("1796168454571896", "1796168454571896"),
        ("18014398509481984", "18014398509481984"),
        ("1e308", "1e+308"),
        ("1E+308", "1e+308"),
        ("1e301", "1e+301"),
        ("1e0001", "10"),
        ("2.2250738585072014e-308", "2.2250738585072014e-308"),
        ("1.0000000000000000", "1"),
        ("-0.0000000000000000e5", "0"),
        ("0e99999", "0"),
        ("314159265358979.30e-14", "3.141592653589793"),
        ("1.0", "1"),
        ("9007199254740992.0", "9007199254740992"),
    ] {
        let got = canonicalize(n.as_bytes()).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert_eq!(String::from_utf8(got).unwrap(), want, "{n}");
        assert_eq!(
            oracle(n.as_bytes()).as_deref(),
            Some(want.as_bytes()),
            "{n}"
        );
    }
}

#[test]
fn not_json() {
    for b in [
        "",
        " ",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "01",
        "1.",
        ".5",
        "-",
        "+1",
        "1e",
        "tru",
        "nul",
        "\"a",
        "\"\t\"",
        "\"\\x\"",
        "\"\\u12\"",
        "[1] 2",
        "\u{feff}1",
        "{1:2}",
        "{\"a\" 1}",
        "[1 2]",
        "NaN",
    ] {
        assert_eq!(kind(b), JcsErrorKind::Syntax, "{b:?}");
    }
    assert_eq!(
        canonicalize(b"\"\xff\"").unwrap_err().kind(),
        JcsErrorKind::Syntax
    );
    let deep = |n: usize| "[".repeat(n) + &"]".repeat(n);
    assert!(canonicalize(deep(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(kind(&deep(MAX_DEPTH + 1)), JcsErrorKind::TooDeep);
    check(deep(MAX_DEPTH).as_bytes()).unwrap();
    check(deep(MAX_DEPTH + 1).as_bytes()).unwrap();
}

/// The published number-serialization cases of the RFC 8785 reference implementations
/// (cyberphone/json-canonicalization, `testdata/README.md` and `verify-numbers`): IEEE 754
/// bits and the expected text. Written as JSON, each must come out as the expected text, or
/// as written when it is another decimal (one a double does not carry).
#[test]
fn rfc_8785_number_cases() {
    let cases = [
        ("4340000000000001", "9007199254740994"),
        ("4340000000000002", "9007199254740996"),
        ("444b1ae4d6e2ef50", "1e+21"),
        ("3eb0c6f7a0b5ed8d", "0.000001"),
        ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
        ("8000000000000000", "0"),
        ("0", "0"),
    ];
    for (hex, want) in cases {
        let v = f64::from_bits(u64::from_str_radix(hex, 16).unwrap());
        assert_eq!(ryu_js::Buffer::new().format_finite(v), want, "{hex}");
        for text in [want.to_owned(), format!("{v:e}"), format!("{v:?}")] {
            let digits = text
                .split(['e', 'E'])
                .next()
                .unwrap()
                .bytes()
                .filter(u8::is_ascii_digit)
                .skip_while(|&d| d == b'0')
                .count();
            // Another decimal than the expected text's is kept as written (it has more digits).
            let c = canonicalize(text.as_bytes()).unwrap();
            if c != want.as_bytes() {
                assert_eq!(c, text.as_bytes(), "{text}");
                assert!(digits > 15, "{text}");
            }
        }
    }
    // NaN and the infinities have no JSON form at all.
    for text in ["NaN", "Infinity", "-Infinity"] {
        assert_eq!(kind(text), JcsErrorKind::Syntax);
    }
}

/// Number tokens around the edges of what a double carries: integers near and beyond 2^53
/// (64-bit ids and longer), decimals of 10 to 30 significant digits, exponents near and past
/// the range of doubles, and doubles' own shortest forms.
fn number_token() -> impl Strategy<Value = String> {
    prop_oneof![
        (0_u64..4096).prop_map(|d| (9_007_199_254_740_992 - 2048 + d).to_string()),
        (9_007_199_254_740_992_u64..=u64::MAX).prop_map(|n| n.to_string()),
        (i64::MIN..-9_007_199_254_740_992).prop_map(|n| n.to_string()),
        "-?[1-9][0-9]{14,30}",
        "-?(0|[1-9][0-9]{0,5})\\.[0-9]{10,25}",
        "-?[1-9](\\.[0-9]{1,20})?[eE][+-]?[0-9]{1,3}",
        "-?[1-9](\\.[0-9]{0,3})?e[+-]?(29[0-9]|3[0-3][0-9])",
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| ryu_js::Buffer::new().format_finite(f).to_owned()),
    ]
}

/// A generated string that stands for a number token written as it is (serde's `Value` holds
/// only doubles and 64-bit integers): [`Style`] and [`to_json`] write the token in its place.
const RAW_NUMBER: &str = "~oncely-test-raw-number~";

/// `v` written compactly by serde, with every [`RAW_NUMBER`] string put back as its token.
fn to_json(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string(v).unwrap();
    let mark = format!("\"{RAW_NUMBER}");
    while let Some(at) = s.find(&mark) {
        let end = at + 1 + s[at + 1..].find('"').unwrap();
        let token = s[at + mark.len()..end].to_owned();
        s.replace_range(at..=end, &token);
    }
    s
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let number = prop_oneof![
        (-1_000_000_000_000_000_i64..1_000_000_000_000_000).prop_map(serde_json::Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(serde_json::Value::from),
        (-99_999_i64..99_999, -30_i32..30)
            .prop_map(|(m, e)| serde_json::Value::from(m as f64 * 10f64.powi(e))),
        number_token().prop_map(|t| serde_json::Value::String(format!("{RAW_NUMBER}{t}"))),
    ];
    let text = prop_oneof![
        "[a-e]{0,3}",
        "\\PC{0,6}",
        "[\u{0}-\u{1f}\"\\\\/\u{7f}\u{e000}\u{ffff}\u{10000}\u{10ffff}a]{0,5}",
        // Names that tie on their first 8 bytes (the sort's prefix), or differ only by a NUL.
        "(abcdefgh|a|\u{e000}bcdefg)[\u{0}ab\u{10000}]{0,3}",
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        number,
        text.clone().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            proptest::collection::btree_map(text.clone(), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

/// How a generated value is written: member order, whitespace, escapes, number spelling.
#[derive(Debug, Clone)]
struct Style {
    seed: u64,
}

impl Style {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.seed ^= self.seed >> 12;
        self.seed ^= self.seed << 25;
        self.seed ^= self.seed >> 27;
        self.seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
    fn ws(&mut self, out: &mut String) {
        if self.chance(3) {
            out.push_str([" ", "\n", "\t", "\r\n  "][(self.next() % 4) as usize]);
        }
    }
    fn string(&mut self, s: &str, out: &mut String) {
        out.push('"');
        for ch in s.chars() {
            match ch {
                '"' => out.push_str(if self.chance(2) { "\\\"" } else { "\\u0022" }),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let short = match c {
                        '\n' => Some("\\n"),
                        '\t' => Some("\\t"),
                        '\r' => Some("\\r"),
                        '\u{8}' => Some("\\b"),
                        '\u{c}' => Some("\\f"),
                        _ => None,
                    };
                    match short {
                        Some(s) if self.chance(2) => out.push_str(s),
                        _ if self.chance(2) => out.push_str(&format!("\\u{:04X}", c as u32)),
                        _ => out.push_str(&format!("\\u{:04x}", c as u32)),
                    }
                }
                '/' if self.chance(2) => out.push_str("\\/"),
                c if self.chance(6) => {
                    let mut units = [0; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
    fn number(&mut self, n: &serde_json::Number, out: &mut String) {
        let f = n.as_f64().unwrap();
        let text = match self.next() % 5 {
            0 => format!("{f:e}"),
            1 => format!("{f:E}"),
            2 if f.fract() == 0.0 && f.abs() < 1e15 => format!("{f:.1}"),
            3 => format!("{f:?}"),
            _ => n.to_string(),
        };
        out.push_str(&text);
    }
    /// A number token as it is, or another spelling of the same decimal: an exponent in
    /// upper case, a zero appended to the fraction, the point moved into the exponent.
    fn raw_number(&mut self, token: &str, out: &mut String) {
        let (mantissa, exp) = match token.split_once(['e', 'E']) {
            Some((m, e)) => (m, Some(e)),
            None => (token, None),
        };
        match (self.next() % 4, exp) {
            (0, Some(e)) => out.push_str(&format!("{mantissa}E{e}")),
            (1, _) if mantissa.contains('.') => out.push_str(&format!(
                "{mantissa}0{}",
                exp.map(|e| format!("e{e}")).unwrap_or_default()
            )),
            (2, None) if !mantissa.contains('.') && mantissa.trim_start_matches('-').len() > 1 => {
                let (sign, digits) = match mantissa.strip_prefix('-') {
                    Some(d) => ("-", d),
                    None => ("", mantissa),
                };
                out.push_str(&format!(
                    "{sign}{}.{}e{}",
                    &digits[..1],
                    &digits[1..],
                    digits.len() - 1
                ));
            }
            _ => out.push_str(token),
        }
    }
    fn write(&mut self, v: &serde_json::Value, out: &mut String) {
        self.ws(out);
        match v {
            serde_json::Value::Object(m) => {
                out.push('{');
                let mut members: Vec<_> = m.iter().collect();
                if self.chance(2) {
                    members.reverse();
                }
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.ws(out);
                    self.string(k, out);
                    self.ws(out);
                    out.push(':');
                    self.write(v, out);
                }
                self.ws(out);
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, v) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    self.write(v, out);
                }
                self.ws(out);
                out.push(']');
            }
            serde_json::Value::String(s) => match s.strip_prefix(RAW_NUMBER) {
                Some(token) => self.raw_number(token, out),
                None => self.string(s, out),
            },
            serde_json::Value::Number(n) => self.number(n, out),
            other => out.push_str(&other.to_string()),
        }
        self.ws(out);
    }
}

/// Inserts a copy of one member of some object (a duplicate name), when there is one.
fn with_duplicate(v: &serde_json::Value) -> Option<serde_json::Value> {
    let s = to_json(v);
    let at = s.find("{\"")?;
    let end = s[at + 1..].find("\":")? + at + 1;
    let name = &s[at + 1..=end];
    Some(serde_json::Value::String(format!(
        "{}{name}:0,{}",
        &s[..=at],
        &s[at + 1..]
    )))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("ONCELY_JCS_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(4096)
    ))]

    /// Every normal double, written in its shortest form (what any JSON serializer writes,
    /// ECMAScript's or Rust's), is I-JSON and canonicalizes to ECMAScript's form; the same
    /// digits with a nonzero digit appended are a different decimal with the same nearest
    /// double or a neighbour, and are kept as written (the double's form is another
    /// decimal's).
    #[test]
    fn every_double_in_shortest_form_is_accepted(bits in any::<u64>(), extra in 1_u8..10) {
        let v = f64::from_bits(bits);
        prop_assume!(v.is_normal());
        let want = ryu_js::Buffer::new().format_finite(v).to_owned();
        let got = canonicalize(want.as_bytes());
        prop_assert_eq!(got.as_deref().ok(), Some(want.as_bytes()), "{}", want);
        // Rust's own shortest forms are the same decimal, except where the double lies
        // exactly halfway between two 17-digit decimals: ECMAScript takes the even one and
        // Rust may not; the other decimal is then kept as written like any that is not the
        // canonical form's.
        for text in [format!("{v:e}"), format!("{v:?}")] {
            let got = canonicalize(text.as_bytes());
            if oracle_scientific(text.as_bytes()) == oracle_scientific(want.as_bytes()) {
                prop_assert_eq!(got.as_deref().ok(), Some(want.as_bytes()), "{}", text);
            } else {
                prop_assert_eq!(got.as_deref().ok(), Some(text.as_bytes()), "{}", text);
            }
        }
        // `{:e}` gives the shortest digits (at most 17) as `d.ddde<exp>`: with zeros and a
        // digit appended, 18 or more significant digits are never a double's shortest form.
        let sci = format!("{v:e}");
        let (m, e) = sci.split_once('e').unwrap();
        let pad = "0".repeat(17);
        let m = if m.contains('.') { format!("{m}{pad}{extra}") } else { format!("{m}.{pad}{extra}") };
        let longer = format!("{m}e{e}");
        let r = canonicalize(longer.as_bytes());
        prop_assert_eq!(r.as_deref().ok(), Some(longer.as_bytes()), "{}", longer);
        prop_assert_ne!(r.unwrap(), want.into_bytes());
    }

    /// Two number tokens share a canonical form only when they are the same decimal: a token
    /// against the shortest form of its nearest double (the form RFC 8785 alone would give
    /// it), against that double's neighbours, and against itself with one digit changed or
    /// re-spelled.
    #[test]
    fn different_numbers_never_share_a_canonical_form(
        tok in number_token(),
        digit in 0_u8..10,
        at in any::<prop::sample::Index>(),
    ) {
        let v: f64 = tok.parse().unwrap();
        let mut others = Vec::new();
        if v.is_finite() {
            others.push(ryu_js::Buffer::new().format_finite(v).to_owned());
            for n in [v.next_up(), v.next_down()] {
                if n.is_finite() {
                    others.push(ryu_js::Buffer::new().format_finite(n).to_owned());
                }
            }
        }
        let digits: Vec<usize> = tok.char_indices().filter(|(_, c)| c.is_ascii_digit()).map(|(i, _)| i).collect();
        let i = digits[at.index(digits.len())];
        let mut changed = tok.clone().into_bytes();
        changed[i] = b'0' + digit;
        others.push(String::from_utf8(changed).unwrap());
        others.push(format!("{tok}0"));
        let mine = canonicalize(tok.as_bytes());
        for other in others {
            let theirs = canonicalize(other.as_bytes());
            let (Ok(a), Ok(b)) = (&mine, &theirs) else { continue };
            if a == b {
                prop_assert_eq!(
                    oracle_scientific(tok.as_bytes()),
                    oracle_scientific(other.as_bytes()),
                    "{} and {} share {:?}", tok, other, String::from_utf8_lossy(a)
                );
            }
        }
    }

    #[test]
    fn same_as_the_tree_on_generated_json(v in json_value(), seed in any::<u64>()) {
        check(to_json(&v).as_bytes())?;
        let mut styled = String::new();
        Style { seed: seed | 1 }.write(&v, &mut styled);
        check(styled.as_bytes())?;
        if let Some(serde_json::Value::String(dup)) = with_duplicate(&v) {
            check(dup.as_bytes())?;
        }
    }

    #[test]
    fn same_as_the_tree_on_mutated_json(v in json_value(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4)) {
        let mut body = to_json(&v).into_bytes();
        for (at, byte, op) in edits {
            let i = at.index(body.len() + 1);
            match op {
                0 => body.insert(i, byte),
                1 if i < body.len() => body[i] = byte,
                _ if i < body.len() => { body.remove(i); }
                _ => {}
            }
        }
        check(&body)?;
    }

    #[test]
    fn same_as_the_tree_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..64)) {
        check(&body)?;
    }

    #[test]
    fn same_as_the_tree_on_json_alphabet(body in "[\\[\\]{}\",:0-9.eE+\\- a\\\\u]{0,40}") {
        check(body.as_bytes())?;
    }

    #[test]
    fn same_as_the_tree_on_number_tokens(body in "-?(0|[1-9][0-9]{0,17})(\\.[0-9]{1,18})?([eE][+-]?[0-9]{1,4})?") {
        check(body.as_bytes())?;
    }

    #[test]
    fn same_as_the_tree_on_long_number_tokens(body in "-?(0|[1-9][0-9]{0,30})(\\.[0-9]{1,30})?([eE][+-]?[0-9]{1,4})?") {
        check(body.as_bytes())?;
    }
}
