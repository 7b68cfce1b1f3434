//! Byte-level pieces of the parser: string runs, escapes and number tokens.

/// Whether a byte ends a run of string bytes that are copied as they are.
pub(super) static STRING_STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = true;
        i += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

/// The end of the run of string bytes from `pos` that are copied as they are: the offset of the
/// first byte that [`STRING_STOP`] stops at, or the end of `src`. Eight bytes per step (the
/// "has a zero byte" test on a word, for `"`, `\` and bytes below 0x20 at once), then one at a
/// time for the tail.
#[inline(always)]
pub(super) fn string_run_end(src: &[u8], mut pos: usize) -> usize {
    pub(super) const LO: u64 = 0x0101_0101_0101_0101;
    pub(super) const HI: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = src.get(pos..pos + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let quote = w ^ (LO * u64::from(b'"'));
        let backslash = w ^ (LO * u64::from(b'\\'));
        // In each test the lowest flagged byte is exact (a false positive can only follow a
        // true one, through a borrow), so the lowest flag of the three is the first stop.
        let stops = ((quote.wrapping_sub(LO) & !quote)
            | (backslash.wrapping_sub(LO) & !backslash)
            | (w.wrapping_sub(LO * 0x20) & !w))
            & HI;
        if stops != 0 {
            return pos + (stops.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while src.get(pos).is_some_and(|&b| !STRING_STOP[b as usize]) {
        pos += 1;
    }
    pos
}

/// A JSON number token as `(negative, digits, point)`, its value being `0.digits x 10^point`,
/// with no leading or trailing zero in `digits` (empty for zero). `token` has JSON's grammar.
pub(super) fn decimal_parts(token: &[u8]) -> (bool, Vec<u8>, i64) {
    let neg = token.first() == Some(&b'-');
    let body = if neg { &token[1..] } else { token };
    let (mantissa, exponent) = match body.iter().position(|&b| b == b'e' || b == b'E') {
        Some(i) => (&body[..i], &body[i + 1..]),
        None => (body, &b""[..]),
    };
    let (exp_neg, exp_digits) = match exponent.first() {
        Some(b'-') => (true, &exponent[1..]),
        Some(b'+') => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    // Saturating: an exponent past i64 cannot describe a finite double, whose parts we compare.
    let e = exp_digits.iter().fold(0_i64, |v, d| {
        v.saturating_mul(10).saturating_add(i64::from(d - b'0'))
    });
    let e = if exp_neg { -e } else { e };
    let int_len = mantissa
        .iter()
        .position(|&b| b == b'.')
        .unwrap_or(mantissa.len());
    let mut digits: Vec<u8> = mantissa.iter().copied().filter(|&b| b != b'.').collect();
    let leading = digits.iter().take_while(|&&d| d == b'0').count();
    digits.drain(..leading);
    while digits.last() == Some(&b'0') {
        digits.pop();
    }
    let point = (int_len as i64 - leading as i64).saturating_add(e);
    (neg, digits, point)
}

/// Whether two JSON number tokens denote exactly the same decimal value (`-0` and `0` do).
pub(super) fn same_decimal(a: &[u8], b: &[u8]) -> bool {
    let (an, ad, ap) = decimal_parts(a);
    let (bn, bd, bp) = decimal_parts(b);
    if ad.is_empty() || bd.is_empty() {
        return ad.is_empty() && bd.is_empty();
    }
    an == bn && ad == bd && ap == bp
}

pub(super) fn hex4(src: &[u8], at: usize) -> Option<u32> {
    let h = src.get(at..at + 4)?;
    let mut v = 0;
    for &c in h {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

/// Decodes the escape at `at` (a backslash): the code point, the offset after it, and whether
/// it was a lone surrogate (then the code point is U+FFFD). `None` for a malformed escape.
pub(super) fn decode_escape(src: &[u8], at: usize) -> Option<(u32, usize, bool)> {
    let c = match *src.get(at + 1)? {
        b'"' => 0x22,
        b'\\' => 0x5c,
        b'/' => 0x2f,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => 0x0a,
        b'r' => 0x0d,
        b't' => 0x09,
        b'u' => {
            let u = hex4(src, at + 2)?;
            let next = at + 6;
            return Some(match u {
                0xd800..=0xdbff => {
                    let low = (src.get(next..next + 2) == Some(b"\\u"))
                        .then(|| hex4(src, next + 2))
                        .flatten()
                        .filter(|l| (0xdc00..=0xdfff).contains(l));
                    match low {
                        Some(l) => (
                            0x10000 + ((u - 0xd800) << 10) + (l - 0xdc00),
                            next + 6,
                            false,
                        ),
                        None => (0xfffd, next, true),
                    }
                }
                0xdc00..=0xdfff => (0xfffd, next, true),
                _ => (u, next, false),
            });
        }
        _ => return None,
    };
    Some((c, at + 2, false))
}

/// The RFC 8785 section 3.2.2.2 form of one character inside a string.
pub(super) fn canonical_char(c: u32, buf: &mut [u8; 6]) -> &[u8] {
    pub(super) const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match c {
        0x22 => Some(b'"'),
        0x5c => Some(b'\\'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        0x0a => Some(b'n'),
        0x0d => Some(b'r'),
        0x09 => Some(b't'),
        _ => None,
    };
    if let Some(s) = short {
        buf[0] = b'\\';
        buf[1] = s;
        return &buf[..2];
    }
    if c < 0x20 {
        *buf = [
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[(c >> 4) as usize],
            HEX[(c & 15) as usize],
        ];
        return &buf[..];
    }
    let ch = char::from_u32(c).unwrap_or('\u{fffd}');
    let n = ch.encode_utf8(&mut buf[..4]).len();
    &buf[..n]
}
