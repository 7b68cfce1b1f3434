//! Numbers: their grammar, and whether they are in ECMAScript shortest form.

use super::Parser;
use crate::jcs::error::{JcsError, JcsErrorKind};
use crate::jcs::lex::same_decimal;
use crate::jcs::tape::{F_SIDE, K_NUM};

impl Parser<'_> {
    /// A number that no double carries (its decimal value is not the shortest form of its
    /// nearest double, or it is beyond the range of normal doubles): its canonical form is its
    /// token as written, digit for digit (docs/DESIGN.md, "Large numbers"). No normal double's
    /// shortest form is that token (it would then be the decimal of that form), so it never
    /// shares a canonical form with another number.
    #[cold]
    #[inline(never)]
    pub(super) fn exact_digits(&mut self, start: usize, end: usize) {
        self.push(K_NUM, 0, start, end);
    }

    /// A number: validates its grammar (RFC 8259 section 6), and keeps it as is when already
    /// in ECMAScript shortest form, or when no double carries it ([`Parser::exact_digits`]).
    pub(super) fn number(&mut self) -> Result<(), JcsError> {
        let src = self.src;
        let start = self.pos;
        let digits = |p: &mut usize| {
            let s = *p;
            while src.get(*p).is_some_and(u8::is_ascii_digit) {
                *p += 1;
            }
            *p - s
        };
        let mut p = start;
        let neg = src[p] == b'-';
        if neg {
            p += 1;
        }
        let int_start = p;
        match src.get(p) {
            Some(b'0') => p += 1,
            Some(b'1'..=b'9') => {
                digits(&mut p);
            }
            _ => {
                return Err(JcsError {
                    kind: JcsErrorKind::Syntax,
                    offset: p,
                });
            }
        }
        let int_end = p;
        let mut frac = None;
        if src.get(p) == Some(&b'.') {
            p += 1;
            let fs = p;
            if digits(&mut p) == 0 {
                return Err(JcsError {
                    kind: JcsErrorKind::Syntax,
                    offset: p,
                });
            }
            frac = Some((fs, p));
        }
        let mut exp_ok = true;
        let mut has_exp = false;
        if matches!(src.get(p), Some(b'e' | b'E')) {
            has_exp = true;
            p += 1;
            if matches!(src.get(p), Some(b'+' | b'-')) {
                p += 1;
            }
            let es = p;
            let n = digits(&mut p);
            if n == 0 {
                return Err(JcsError {
                    kind: JcsErrorKind::Syntax,
                    offset: p,
                });
            }
            // Written with at most 3 digits and at most 300 (leading zeros count as digits).
            exp_ok = n <= 3
                && src[es..p]
                    .iter()
                    .fold(0u32, |v, d| v * 10 + u32::from(d - b'0'))
                    <= 300;
        }
        self.pos = p;
        let token = &src[start..p];
        // Significant digits of the mantissa: leading zeros do not count, trailing ones do. An
        // integer part that is not `0` starts with a nonzero digit (JSON's grammar): then every
        // digit counts; after `0`, the fraction's digits from its first nonzero one.
        let frac_len = frac.map_or(0, |(fs, fe)| fe - fs);
        let significant = if src[int_start] != b'0' {
            int_end - int_start + frac_len
        } else {
            frac.map_or(0, |(fs, fe)| {
                frac_len - src[fs..fe].iter().take_while(|&&d| d == b'0').count()
            })
        };
        let nonzero = significant > 0;
        // Up to 15 significant digits and a modest exponent, every decimal is the shortest form
        // of its nearest double; beyond, it is accepted only if it is exactly that form's value.
        let must_be_exact = significant > 15 || !exp_ok;
        // Already canonical without reading it as a double: plain notation at most 15
        // significant digits (so the shortest form of the nearest double is these digits),
        // no trailing zero in the fraction, no `-0`, and a value of at least 1e-6 when below 1
        // (ECMAScript writes smaller values with an exponent).
        let canonical = !must_be_exact
            && !has_exp
            && match frac {
                None => !(neg && int_end - int_start == 1 && src[int_start] == b'0'),
                Some((fs, fe)) => {
                    src[fe - 1] != b'0'
                        && (src[int_start] != b'0'
                            || src[fs..fe].iter().take_while(|&&d| d == b'0').count() <= 5)
                }
            };
        if canonical {
            self.push(K_NUM, 0, start, p);
            return Ok(());
        }
        // The same notation with a fraction that ends in zeros (`5.10`, `12.0`, `0.00`): the
        // token without those zeros (and without its point when no fraction digit is left) is
        // the same decimal and passes the test above, so it is the canonical form, and a prefix
        // of the token. `-0.0` and values below 1e-6 go the long way, below.
        if !must_be_exact
            && !has_exp
            && let Some((fs, fe)) = frac
        {
            let mut e = fe;
            while e > fs && src[e - 1] == b'0' {
                e -= 1;
            }
            let trimmed = if e == fs {
                !(neg && int_end - int_start == 1 && src[int_start] == b'0')
            } else {
                src[int_start] != b'0' || src[fs..e].iter().take_while(|&&d| d == b'0').count() <= 5
            };
            if trimmed {
                let end = if e == fs { fs - 1 } else { e };
                self.push(K_NUM, 0, start, end);
                self.len -= (p - end) as u64;
                self.dirty();
                return Ok(());
            }
        }
        let text = std::str::from_utf8(token).map_err(|_| self.err(JcsErrorKind::Syntax))?;
        let value: f64 = text.parse().map_err(|_| JcsError {
            kind: JcsErrorKind::Syntax,
            offset: start,
        })?;
        if !value.is_finite() || (nonzero && !value.is_normal()) {
            // Beyond the range of normal doubles: no double carries it.
            self.exact_digits(start, p);
            return Ok(());
        }
        let mut buf = ryu_js::Buffer::new();
        let out = buf.format_finite(value).as_bytes();
        if must_be_exact && !same_decimal(token, out) {
            // Another decimal than the shortest form of its nearest double: writing that form
            // would give two different decimals one canonical form (one would replay the
            // other's record, although a parser that keeps every digit reads them apart).
            self.exact_digits(start, p);
            return Ok(());
        }
        self.len = self.len + out.len() as u64 - token.len() as u64;
        if out == token {
            self.push(K_NUM, 0, start, p);
        } else {
            let a = self.s.numbuf.len();
            self.s.numbuf.extend_from_slice(out);
            let b = self.s.numbuf.len();
            self.push(K_NUM, F_SIDE, a, b);
            self.dirty();
        }
        Ok(())
    }
}
