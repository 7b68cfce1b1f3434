//! Member name order (RFC 8785 section 3.2.3): name prefixes, UTF-16 comparison, and the
//! sort of the members of one object.

use super::tape::{F_HIGH, F_SIDE, Tok};
use std::cmp::Ordering;

/// Sorts a short slice in place (the members of one object); `sort_unstable_by` beyond 16.
pub(super) fn insertion_sort<T: Copy>(v: &mut [T], mut cmp: impl FnMut(&T, &T) -> Ordering) {
    if v.len() > 16 {
        v.sort_unstable_by(cmp);
        return;
    }
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && cmp(&x, &v[j - 1]) == Ordering::Less {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

/// The first 8 bytes of a member name as a big-endian integer, padded with zero bytes: two
/// names whose prefixes differ are in the order of their prefixes (byte order; a padding zero
/// marks the end of the shorter name, which then is a prefix of the other), so most member
/// comparisons are one integer comparison.
#[inline(always)]
pub(super) fn name_prefix(buf: &[u8], a: usize, b: usize) -> u64 {
    let n = (b - a).min(8);
    match buf.get(a..a + 8) {
        // The 8 bytes from the name's start, the bytes past its end masked off.
        Some(w) => {
            let w = u64::from_be_bytes(w.try_into().expect("8 bytes"));
            if n == 8 {
                w
            } else {
                w & !(u64::MAX >> (8 * n))
            }
        }
        None => {
            let mut p = [0u8; 8];
            p[..n].copy_from_slice(&buf[a..a + n]);
            u64::from_be_bytes(p)
        }
    }
}

/// The [`name_prefix`] a member name token carries.
#[inline]
pub(super) fn tok_prefix(t: &Tok) -> u64 {
    (u64::from(t.c) << 32) | u64::from(t.d)
}

/// The member name order of RFC 8785 section 3.2.3 (UTF-16 code units) between two name tokens.
#[inline]
pub(super) fn name_cmp(tx: &Tok, ty: &Tok, src: &[u8], side: &[u8]) -> Ordering {
    if tx.flags & ty.flags & F_HIGH == 0 {
        let (px, py) = (tok_prefix(tx), tok_prefix(ty));
        if px != py {
            return px.cmp(&py);
        }
    }
    whole_name_cmp(tx, ty, src, side)
}

/// [`name_cmp`] on the whole names.
#[inline(never)]
pub(super) fn whole_name_cmp(tx: &Tok, ty: &Tok, src: &[u8], side: &[u8]) -> Ordering {
    let both_high = tx.flags & ty.flags & F_HIGH != 0;
    let (kx, ky) = (key_bytes(tx, src, side), key_bytes(ty, src, side));
    if both_high {
        utf16_cmp(kx, ky)
    } else {
        // Byte order is UTF-16 order unless both names have a byte from EE up.
        kx.cmp(ky)
    }
}

/// The unescaped bytes of a member name.
pub(super) fn key_bytes<'x>(t: &Tok, src: &'x [u8], side: &'x [u8]) -> &'x [u8] {
    let r = t.a as usize..t.b as usize;
    if t.flags & F_SIDE != 0 {
        &side[r]
    } else {
        &src[r]
    }
}

/// Orders two UTF-8 strings by their UTF-16 code units (RFC 8785 section 3.2.3). Byte order is
/// code point order, which differs from UTF-16 order only between U+E000..U+FFFF (lead bytes
/// `EE`, `EF`) and supplementary characters (lead bytes `F0`..`F4`, surrogate pairs in
/// UTF-16, which sort first).
pub(super) fn utf16_cmp(x: &[u8], y: &[u8]) -> Ordering {
    let n = x.len().min(y.len());
    match x[..n].iter().zip(&y[..n]).position(|(a, b)| a != b) {
        None => x.len().cmp(&y.len()),
        Some(i) => {
            let (a, b) = (x[i], y[i]);
            if (0xee..=0xef).contains(&a) && b >= 0xf0 {
                Ordering::Greater
            } else if (0xee..=0xef).contains(&b) && a >= 0xf0 {
                Ordering::Less
            } else {
                a.cmp(&b)
            }
        }
    }
}
