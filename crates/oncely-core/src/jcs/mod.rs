//! RFC 8785 (JSON Canonicalization Scheme) straight from the body bytes, with no tree.
//!
//! The body is read once by a validating tokenizer that records every token as a byte range
//! (a flat "tape" in a buffer reused between calls, never one allocation per node), sorts the
//! members of each object by the UTF-16 code units of their names (RFC 8785 section 3.2.3),
//! and computes the length of the canonical form. The canonical bytes are then written straight
//! into the consumer (the fingerprint's SHA-256), in order:
//!
//! - a body that is already canonical (no whitespace, members in order, every string and number
//!   in its canonical form: common for machine-generated JSON) is passed on as it is;
//! - otherwise every subtree that is canonical is copied as one range; strings are copied as
//!   they are unless an escape is not the canonical one (`\/`, `\u0041`, upper-case hex...),
//!   numbers unless they are not in ECMAScript's shortest form (RFC 8785 section 3.2.2.3;
//!   re-formatted with `ryu-js`, the formatter of the ECMAScript `Number.prototype.toString`
//!   algorithm, or, for a short decimal whose fraction only ends in zeros such as `5.10`, cut
//!   to the prefix that is that form), or are numbers no double carries, which are kept as
//!   written (see [Numbers](#numbers)).
//!
//! # What is refused
//!
//! RFC 8785 is defined over I-JSON (RFC 7493). A body that is JSON but not I-JSON has no
//! canonical form, and is refused with a [`JcsError`] whose [`JcsErrorKind::is_json`] is true:
//!
//! - two members of one object with the same name, after unescaping (RFC 7493 section 2.3);
//!   a parser that keeps the first value and one that keeps the last would read two different
//!   requests;
//! - a `\u` escape of a surrogate that is not half of a pair (RFC 7493 section 2.1).
//!
//! A number is never refused (see [Numbers](#numbers)).
//!
//! # Numbers
//!
//! RFC 8785 writes a number as the ECMAScript shortest form of the double it is read as
//! (section 3.2.2.3), which RFC 7493 section 2.2 expects it to be. A number that a double
//! carries keeps that form: one that is exactly the decimal of the shortest form of its
//! nearest double, in the range of normal doubles (`1.0` and `1e0` are written `1`,
//! `3.141592653589793`, `0.30000000000000004`, `9007199254740991`, `1e308` are accepted as
//! they are). A number of at most 15 significant digits (leading zeros do not count) with an
//! exponent of at most 3 digits and +-300 always is one, when it is in range; a longer one, or
//! one with a larger exponent, is one when its decimal value equals that of the shortest form
//! of its nearest double. Where a double lies exactly halfway between two shortest decimals
//! (`600000000000000.25` between `…0.2` and `…0.3`), only ECMAScript's even one is its
//! shortest form: JavaScript, Python and serde_json write it, Rust's `{}` for `f64` may write
//! the other (a different decimal, kept as written).
//!
//! Every other number is one that no double carries, and writing its double's form would give
//! it the canonical form of a different decimal (`9007199254740993` and `9007199254740992` are
//! one double; `0.1000000000000000055511151231257827021181583404541015625`, the exact value of
//! the double nearest to `0.1`, would be written `0.1`): its canonical form is its token as
//! written, digit for digit, exponent and sign included. That covers integers beyond 2^53
//! (a 64-bit id such as `12345678901234567890`), decimals with more precision than a double
//! (`3.1415926535897932`, Rust's other halfway decimal), and values beyond the range of normal
//! doubles (`1e400`, `1e-400`, `5e-324`). RFC 7493 section 2.2 says such numbers SHOULD NOT
//! be sent and RFC 8785 has no form for them; this one is ours.
//!
//! Two different numbers never share a canonical form: a token kept as written is never the
//! shortest form of a normal double (it would then be that form's decimal, and a double would
//! carry it). Two spellings of one such number (`12345678901234567890` and
//! `1.2345678901234567890e19`) are two canonical forms: the fingerprint then sees two
//! requests, a mismatch, never a wrong replay.
//!
//! Noncharacters such as U+FFFF, which RFC 7493 also excludes, are accepted: they have one
//! canonical form and every parser reads them alike.
//!
//! A body that is not JSON at all (a syntax error, bytes that are not UTF-8, data after the
//! value), or that nests arrays and objects deeper than [`MAX_DEPTH`] levels, gets an error
//! whose [`JcsErrorKind::is_json`] is false; the fingerprint then takes the body as raw bytes.
//!
//! # Output
//!
//! Byte for byte the output of the tree-based `serde_json_canonicalizer` 0.4 over
//! `serde_json::Value` (the implementation of fingerprint version 1 before this module), which
//! the tests keep as the oracle, for every body both accept. The tree reads every number as a
//! double, so the oracle hands it the numbers no double carries as placeholders and puts
//! their tokens back as written.

use parse::Parser;
use sha2::{Digest, Sha256};
use sink::{HashSink, SINK, SINK_BUF};
use tape::{SCRATCH, Scratch, Tape};

mod emit;
mod error;
mod lex;
mod order;
mod parse;
mod sink;
mod tape;
#[cfg(test)]
mod tests;

pub use error::{JcsError, JcsErrorKind, MAX_DEPTH};

/// The RFC 8785 canonical form of `body`.
///
/// # Errors
///
/// [`JcsError`] when the body is not JSON, is nested deeper than [`MAX_DEPTH`], or is JSON but
/// not I-JSON (see the module docs).
pub fn canonicalize(body: &[u8]) -> Result<Vec<u8>, JcsError> {
    with_tape(body, |tape| {
        let mut out = Vec::with_capacity(tape.len as usize);
        tape.emit_all(&mut out);
        out
    })
}

/// Whether `body` is already in RFC 8785 canonical form.
///
/// # Errors
///
/// As [`canonicalize`].
pub fn is_canonical(body: &[u8]) -> Result<bool, JcsError> {
    with_tape(body, |tape| tape.verbatim)
}

/// Hashes the canonical form of `body` into `h`, framed as the fingerprint frames every part:
/// its length as a big-endian `u64`, then the bytes. Nothing is written on error.
///
/// # Errors
///
/// As [`canonicalize`].
pub(crate) fn hash_framed(body: &[u8], h: &mut Sha256) -> Result<(), JcsError> {
    with_tape(body, |tape| {
        h.update(tape.len.to_be_bytes());
        if tape.verbatim {
            h.update(body);
        } else {
            SINK.with(|cell| {
                // A re-entrant call (impossible today) would get a fresh buffer.
                let mut fresh = Vec::new();
                let mut borrowed = cell.try_borrow_mut();
                let buf: &mut Vec<u8> = match &mut borrowed {
                    Ok(b) => b,
                    Err(_) => &mut fresh,
                };
                // Zeroed once per thread.
                buf.resize(SINK_BUF, 0);
                let buf: &mut [u8; SINK_BUF] = (&mut buf[..]).try_into().expect("SINK_BUF bytes");
                let mut sink = HashSink {
                    h: &mut *h,
                    buf,
                    len: 0,
                };
                tape.emit_all(&mut sink);
                sink.flush();
            });
        }
    })
}

fn with_tape<R>(body: &[u8], f: impl FnOnce(&Tape<'_>) -> R) -> Result<R, JcsError> {
    if u32::try_from(body.len()).is_err() {
        return Err(JcsError {
            kind: JcsErrorKind::TooLarge,
            offset: 0,
        });
    }
    SCRATCH.with(|cell| {
        // A re-entrant call (impossible today: nothing here calls back) would get fresh buffers.
        let mut fresh;
        let mut borrowed = cell.try_borrow_mut();
        let s: &mut Scratch = match &mut borrowed {
            Ok(s) => s,
            Err(_) => {
                fresh = Scratch::default();
                &mut fresh
            }
        };
        s.clear();
        let (len, verbatim) = Parser::new(body, s).run()?;
        let tape = Tape {
            src: body,
            s,
            len,
            verbatim,
        };
        Ok(f(&tape))
    })
}
