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
//!   algorithm).
//!
//! # What is refused
//!
//! RFC 8785 is defined over I-JSON (RFC 7493). A body that is JSON but not I-JSON has no
//! canonical form, and is refused with a [`JcsError`] whose [`JcsErrorKind::is_json`] is true:
//!
//! - two members of one object with the same name, after unescaping (RFC 7493 section 2.3);
//!   a parser that keeps the first value and one that keeps the last would read two different
//!   requests;
//! - a `\u` escape of a surrogate that is not half of a pair (RFC 7493 section 2.1);
//! - a number that is not exactly the value of its canonical form (RFC 7493 section 2.2: I-JSON
//!   numbers are read as doubles, and RFC 8785 writes the shortest form of that double). A
//!   number of at most 15 significant digits (leading zeros do not count) with an exponent of at
//!   most 3 digits and +-300 always is; a longer one, or one with a larger exponent, is accepted
//!   when its decimal value equals that of the shortest form of its nearest double
//!   (`3.141592653589793`, `0.30000000000000004`, `9007199254740991`, `1e308` are;
//!   `9007199254740993`, whose nearest double is `9007199254740992`, and
//!   `3.1415926535897932` are not: each would share its canonical form with a different
//!   decimal, and a parser that keeps every digit reads the two apart). Where a double lies
//!   exactly halfway between two shortest decimals (`600000000000000.25` between `…0.2` and
//!   `…0.3`), only ECMAScript's even one is its shortest form: JavaScript, Python and serde_json
//!   write it, Rust's `{}` for `f64` may write the other, which is refused. A value that
//!   overflows a double or falls below the smallest normal double (about `2.2e-308`) is refused
//!   too.
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
//! the tests keep as the oracle, for every body both accept.

use sha2::{Digest, Sha256};
use std::cell::RefCell;
use std::cmp::Ordering;
use std::fmt;

/// The deepest nesting of arrays and objects that is canonicalized: 127 levels, the limit of
/// `serde_json`'s parser that fingerprint version 1 was defined with. A deeper body is taken
/// as not JSON ([`JcsErrorKind::TooDeep`]).
pub const MAX_DEPTH: usize = 127;

/// Why a body has no RFC 8785 canonical form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{kind} at byte {offset}")]
pub struct JcsError {
    kind: JcsErrorKind,
    offset: usize,
}

impl JcsError {
    /// What is wrong.
    pub const fn kind(&self) -> JcsErrorKind {
        self.kind
    }

    /// The byte offset in the body where it was found (for a duplicate name, the start of the
    /// object that holds it).
    pub const fn offset(&self) -> usize {
        self.offset
    }
}

/// The kinds of [`JcsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum JcsErrorKind {
    /// Not JSON (RFC 8259): a syntax error, bytes that are not UTF-8, or data after the value.
    Syntax,
    /// Arrays and objects nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// Two members of one object have the same name (RFC 7493 section 2.3).
    DuplicateName,
    /// A `\u` escape of a surrogate that is not half of a pair (RFC 7493 section 2.1).
    LoneSurrogate,
    /// A number whose decimal value is not that of its canonical form, the shortest form of its
    /// nearest double, or that is beyond the range of normal doubles (RFC 7493 section 2.2; see
    /// the module docs).
    InexactNumber,
    /// A body of 4 GiB (`u32::MAX` bytes) or more.
    TooLarge,
}

impl JcsErrorKind {
    /// Whether the body is JSON (so the error is an I-JSON violation, and the body must be
    /// refused rather than taken as raw bytes). `false` for [`Syntax`](Self::Syntax) and
    /// [`TooDeep`](Self::TooDeep).
    pub const fn is_json(self) -> bool {
        !matches!(self, Self::Syntax | Self::TooDeep)
    }
}

impl fmt::Display for JcsErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Syntax => "not JSON",
            Self::TooDeep => "arrays and objects nested deeper than 127 levels",
            Self::DuplicateName => "an object has two members with the same name",
            Self::LoneSurrogate => "a string escapes a lone UTF-16 surrogate",
            Self::InexactNumber => {
                "a number is not the decimal its canonical form writes (it has more digits than the shortest form of its nearest double, as 9007199254740993, whose nearest double is written 9007199254740992), or is beyond the range of normal doubles"
            }
            Self::TooLarge => "the body is 4 GiB or more",
        })
    }
}

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
                buf.clear();
                buf.reserve(SINK_BUF);
                let mut sink = HashSink { h: &mut *h, buf };
                tape.emit_all(&mut sink);
                sink.flush();
            });
        }
    })
}

/// Where canonical bytes go.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn byte(&mut self, b: u8);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn byte(&mut self, b: u8) {
        self.push(b);
    }
}

const SINK_BUF: usize = 4096;

thread_local! {
    /// The batching buffer of [`HashSink`], kept per thread: a fresh zeroed array on every
    /// call cost more than hashing a small body (issue 11's profile).
    static SINK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Batches small writes (up to [`SINK_BUF`] bytes) before they reach the hasher.
struct HashSink<'h> {
    h: &'h mut Sha256,
    buf: &'h mut Vec<u8>,
}

impl HashSink<'_> {
    fn flush(&mut self) {
        self.h.update(&self.buf[..]);
        self.buf.clear();
    }
}

impl Sink for HashSink<'_> {
    fn put(&mut self, bytes: &[u8]) {
        if bytes.len() > SINK_BUF - self.buf.len() {
            self.flush();
            if bytes.len() >= SINK_BUF / 2 {
                self.h.update(bytes);
                return;
            }
        }
        self.buf.extend_from_slice(bytes);
    }
    fn byte(&mut self, b: u8) {
        if self.buf.len() == SINK_BUF {
            self.flush();
        }
        self.buf.push(b);
    }
}

// Token kinds.
const K_LIT: u8 = 0;
const K_NUM: u8 = 1;
const K_STR: u8 = 2;
const K_KEY: u8 = 3;
const K_OBJ: u8 = 4;
const K_ARR: u8 = 5;

// Token flags.
/// A string whose escapes must be re-written.
const F_REWRITE: u8 = 1;
/// A number whose canonical text is in `numbuf`, or a name whose unescaped text is in `keybuf`.
const F_SIDE: u8 = 2;
/// A container whose source range is canonical as it is.
const F_CLEAN: u8 = 4;
/// An object whose members are in canonical order in the source.
const F_ORDERED: u8 = 8;
/// A member name with a byte of `EE` or above (a character from U+E000 up), whose UTF-16 order
/// may differ from its byte order.
const F_HIGH: u8 = 16;
/// A member name written as it is (no escapes) with its colon right after it and its value
/// right after that, so that the name, the colon and a canonical value are one source range.
const F_JOINED: u8 = 32;

/// One token of the tape. `a..b` is a byte range (in the body, or for [`F_SIDE`] in the side
/// buffer); for containers `c` is the index of the token after the container and `d` the
/// offset of the sorted member list in `order` (unordered objects only); for member names
/// `c` and `d` are the high and low halves of [`name_prefix`].
#[derive(Debug, Clone, Copy, Default)]
struct Tok {
    kind: u8,
    flags: u8,
    a: u32,
    b: u32,
    c: u32,
    d: u32,
}

#[derive(Debug, Clone, Copy)]
struct Frame {
    tok: u32,
    obj: bool,
    clean: bool,
    members: u32,
    /// Every member name so far is after the one before it (checked as each name is read).
    ordered: bool,
    /// Two consecutive names so far are equal.
    duplicate: bool,
    /// A name has a byte from `EE` up ([`F_HIGH`]): sorting then needs UTF-16 comparisons.
    high: bool,
}

/// Buffers reused between calls on one thread (the tape, member lists, unescaped names and
/// re-formatted numbers), so that a fingerprint allocates nothing once they are warm.
#[derive(Debug, Default)]
struct Scratch {
    tape: Vec<Tok>,
    frames: Vec<Frame>,
    members: Vec<u32>,
    order: Vec<u32>,
    /// `(name prefix, position among its members)` of the object being sorted.
    sortbuf: Vec<(u64, u32)>,
    /// Member orders of objects sorted before, on this thread.
    sorts: SortCache,
    keybuf: Vec<u8>,
    numbuf: Vec<u8>,
}

impl Scratch {
    fn clear(&mut self) {
        // A huge body must not pin its buffers for the life of the thread.
        const KEEP: usize = 1 << 16;
        if self.tape.capacity() > KEEP * 4 {
            self.tape = Vec::new();
            self.order = Vec::new();
            self.members = Vec::new();
            self.sortbuf = Vec::new();
        }
        if self.keybuf.capacity() > KEEP * 16 {
            self.keybuf = Vec::new();
        }
        if self.numbuf.capacity() > KEEP * 16 {
            self.numbuf = Vec::new();
        }
        self.tape.clear();
        self.frames.clear();
        self.members.clear();
        self.order.clear();
        self.sortbuf.clear();
        self.keybuf.clear();
        self.numbuf.clear();
    }
}

/// The member orders of recently sorted objects, keyed by the sequence of their name
/// prefixes: when every prefix differs, the prefixes alone decide the order, so an object with
/// the same prefix sequence (the elements of an array of one shape, in machine-generated JSON)
/// takes the remembered permutation instead of being sorted again. Kept between calls; its
/// size is bounded ([`SortCache::SLOTS`] objects of at most [`SortCache::MAX_MEMBERS`]).
#[derive(Debug, Default)]
struct SortCache([SortSlot; SortCache::SLOTS]);

#[derive(Debug, Default)]
struct SortSlot {
    /// The name prefixes in source order (empty: nothing remembered).
    prefixes: Vec<u64>,
    /// The sorted order, as positions in `prefixes`.
    perm: Vec<u32>,
}

impl SortCache {
    const SLOTS: usize = 8;
    const MAX_MEMBERS: usize = 64;

    fn slot(members: usize, first_prefix: u64) -> usize {
        let h = (first_prefix ^ members as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 61) as usize
    }
}

impl std::ops::IndexMut<usize> for SortCache {
    fn index_mut(&mut self, i: usize) -> &mut SortSlot {
        &mut self.0[i]
    }
}

impl std::ops::Index<usize> for SortCache {
    type Output = SortSlot;
    fn index(&self, i: usize) -> &SortSlot {
        &self.0[i]
    }
}

/// Sorts a short slice in place (the members of one object); `sort_unstable_by` beyond 16.
fn insertion_sort<T: Copy>(v: &mut [T], mut cmp: impl FnMut(&T, &T) -> Ordering) {
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

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A parsed body, ready to be written out in canonical order.
struct Tape<'a> {
    src: &'a [u8],
    s: &'a Scratch,
    /// The length of the canonical form, in bytes.
    len: u64,
    /// The body is canonical as it is.
    verbatim: bool,
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

struct Parser<'a> {
    src: &'a [u8],
    pos: usize,
    s: &'a mut Scratch,
    /// The length of the canonical form so far.
    len: u64,
    /// The first I-JSON violation, reported once the whole body is known to be JSON.
    violation: Option<JcsError>,
}

/// Whether a byte ends a run of string bytes that are copied as they are.
static STRING_STOP: [bool; 256] = {
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
#[inline]
fn string_run_end(src: &[u8], mut pos: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
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

impl<'a> Parser<'a> {
    fn new(src: &'a [u8], s: &'a mut Scratch) -> Self {
        Self {
            src,
            pos: 0,
            s,
            len: 0,
            violation: None,
        }
    }

    fn err(&self, kind: JcsErrorKind) -> JcsError {
        JcsError {
            kind,
            offset: self.pos,
        }
    }

    fn violate(&mut self, kind: JcsErrorKind, offset: usize) {
        if self.violation.is_none() {
            self.violation = Some(JcsError { kind, offset });
        }
    }

    /// Skips JSON whitespace; whether there was any.
    #[inline]
    fn skip_ws(&mut self) -> bool {
        // Compact JSON: the next byte is above the space, where no whitespace is.
        if self.src.get(self.pos).is_none_or(|&b| b > b' ') {
            return false;
        }
        let start = self.pos;
        while let Some(&b) = self.src.get(self.pos) {
            if matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
                self.pos += 1;
            } else {
                break;
            }
        }
        self.pos != start
    }

    fn dirty(&mut self) {
        if let Some(f) = self.s.frames.last_mut() {
            f.clean = false;
        }
    }

    fn push(&mut self, kind: u8, flags: u8, a: usize, b: usize) {
        self.s.tape.push(Tok {
            kind,
            flags,
            a: a as u32,
            b: b as u32,
            c: 0,
            d: 0,
        });
    }

    /// Parses the whole body: the canonical length, and whether the body is canonical as is.
    fn run(mut self) -> Result<(u64, bool), JcsError> {
        if std::str::from_utf8(self.src).is_err() {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        let lead = self.skip_ws();
        'value: loop {
            // One value starts here.
            let Some(&b) = self.src.get(self.pos) else {
                return Err(self.err(JcsErrorKind::Syntax));
            };
            match b {
                b'{' | b'[' => {
                    if self.s.frames.len() == MAX_DEPTH {
                        return Err(self.err(JcsErrorKind::TooDeep));
                    }
                    let obj = b == b'{';
                    let tok = self.s.tape.len() as u32;
                    self.push(if obj { K_OBJ } else { K_ARR }, 0, self.pos, 0);
                    self.s.frames.push(Frame {
                        tok,
                        obj,
                        clean: true,
                        members: self.s.members.len() as u32,
                        ordered: true,
                        duplicate: false,
                        high: false,
                    });
                    self.len += 2;
                    self.pos += 1;
                    if self.skip_ws() {
                        self.dirty();
                    }
                    let close = if obj { b'}' } else { b']' };
                    if self.src.get(self.pos) == Some(&close) {
                        self.pos += 1;
                        self.close();
                    } else if obj {
                        self.key()?;
                        continue 'value;
                    } else {
                        continue 'value;
                    }
                }
                b'"' => self.string(false)?,
                b'-' | b'0'..=b'9' => self.number()?,
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return Err(self.err(JcsErrorKind::Syntax)),
            }
            // After a value: a separator, the end of containers, or the end of the body.
            loop {
                let ws = self.skip_ws();
                let Some(&f) = self.s.frames.last() else {
                    if self.pos != self.src.len() {
                        return Err(self.err(JcsErrorKind::Syntax));
                    }
                    if let Some(v) = self.violation {
                        return Err(v);
                    }
                    let root_clean = self.s.tape[0].flags & F_CLEAN != 0
                        || matches!(self.s.tape[0].kind, K_LIT | K_NUM | K_STR)
                            && self.s.tape[0].flags & (F_REWRITE | F_SIDE) == 0;
                    return Ok((self.len, root_clean && !lead && !ws));
                };
                if ws {
                    self.dirty();
                }
                match (f.obj, self.src.get(self.pos)) {
                    (_, Some(b',')) => {
                        self.pos += 1;
                        self.len += 1;
                        if self.skip_ws() {
                            self.dirty();
                        }
                        if f.obj {
                            self.key()?;
                        }
                        continue 'value;
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        self.pos += 1;
                        self.close();
                    }
                    _ => return Err(self.err(JcsErrorKind::Syntax)),
                }
            }
        }
    }

    /// A member name, the colon and the whitespace before the value.
    fn key(&mut self) -> Result<(), JcsError> {
        if self.src.get(self.pos) != Some(&b'"') {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        let tok = self.s.tape.len() as u32;
        self.s.members.push(tok);
        self.string(true)?;
        {
            let Scratch {
                tape,
                frames,
                members,
                keybuf,
                ..
            } = &mut *self.s;
            let f = frames
                .last_mut()
                .expect("a member name is inside an object");
            let t = &tape[tok as usize];
            f.high |= t.flags & F_HIGH != 0;
            if members.len() > f.members as usize + 1 {
                let prev = &tape[members[members.len() - 2] as usize];
                match name_cmp(prev, t, self.src, keybuf) {
                    Ordering::Less => {}
                    Ordering::Equal => f.duplicate = true,
                    Ordering::Greater => f.ordered = false,
                }
            }
        }
        let mut joined = true;
        if self.skip_ws() {
            self.dirty();
            joined = false;
        }
        if self.src.get(self.pos) != Some(&b':') {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        self.pos += 1;
        self.len += 1;
        if self.skip_ws() {
            self.dirty();
            joined = false;
        }
        if joined
            && let Some(t) = self.s.tape.last_mut()
            && t.flags & F_SIDE == 0
        {
            t.flags |= F_JOINED;
        }
        Ok(())
    }

    /// Closes the innermost container (its closing byte is consumed).
    fn close(&mut self) {
        let f = self.s.frames.pop().expect("a container is open");
        let end = self.s.tape.len() as u32;
        let mut clean = f.clean;
        let mut flags = 0;
        let mut order_at = 0;
        if f.obj {
            let Scratch {
                tape,
                members,
                order,
                sortbuf,
                sorts,
                keybuf,
                ..
            } = &mut *self.s;
            let src = self.src;
            let ms = &members[f.members as usize..];
            let mut duplicate = f.duplicate;
            if f.ordered {
                flags |= F_ORDERED;
            } else if !f.high {
                // Byte order: by the 8-byte prefixes, the whole names only when those tie.
                clean = false;
                order_at = order.len() as u32;
                order.push(ms.len() as u32);
                let prefix = |m: &u32| tok_prefix(&tape[*m as usize]);
                let slot = &mut sorts[SortCache::slot(ms.len(), prefix(&ms[0]))];
                if slot.prefixes.len() == ms.len()
                    && slot.prefixes.iter().copied().eq(ms.iter().map(prefix))
                {
                    // The same names as an object sorted before (array elements of one shape).
                    order.extend(slot.perm.iter().map(|&p| ms[p as usize]));
                } else {
                    sortbuf.clear();
                    sortbuf.extend(ms.iter().enumerate().map(|(p, m)| (prefix(m), p as u32)));
                    let name = |p: u32| key_bytes(&tape[ms[p as usize] as usize], src, keybuf);
                    insertion_sort(sortbuf, |x, y| match x.0.cmp(&y.0) {
                        Ordering::Equal => name(x.1).cmp(name(y.1)),
                        other => other,
                    });
                    let mut tie = false;
                    for w in sortbuf.windows(2) {
                        if w[0].0 == w[1].0 {
                            tie = true;
                            duplicate |= name(w[0].1) == name(w[1].1);
                        }
                    }
                    order.extend(sortbuf.iter().map(|&(_, p)| ms[p as usize]));
                    if !tie && ms.len() <= SortCache::MAX_MEMBERS {
                        // Distinct prefixes alone decide this order: remember it.
                        slot.prefixes.clear();
                        slot.prefixes.extend(ms.iter().map(prefix));
                        slot.perm.clear();
                        slot.perm.extend(sortbuf.iter().map(|&(_, p)| p));
                    } else {
                        slot.prefixes.clear();
                    }
                }
            } else {
                clean = false;
                order_at = order.len() as u32;
                order.push(ms.len() as u32);
                order.extend_from_slice(ms);
                let sorted = &mut order[order_at as usize + 1..];
                let cmp =
                    |x: u32, y: u32| name_cmp(&tape[x as usize], &tape[y as usize], src, keybuf);
                sorted.sort_unstable_by(|&x, &y| cmp(x, y));
                duplicate |= sorted
                    .windows(2)
                    .any(|w| cmp(w[0], w[1]) == Ordering::Equal);
            }
            members.truncate(f.members as usize);
            if duplicate {
                let offset = tape[f.tok as usize].a as usize;
                self.violate(JcsErrorKind::DuplicateName, offset);
            }
        }
        if clean {
            flags |= F_CLEAN;
        }
        let t = &mut self.s.tape[f.tok as usize];
        t.b = self.pos as u32;
        t.c = end;
        t.d = order_at;
        t.flags |= flags;
        if !clean {
            self.dirty();
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), JcsError> {
        if !self.src[self.pos..].starts_with(word) {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        self.push(K_LIT, 0, self.pos, self.pos + word.len());
        self.pos += word.len();
        self.len += word.len() as u64;
        Ok(())
    }

    /// Pushes a member name token: `a..b` in the body, or in the side buffer for [`F_SIDE`].
    #[inline]
    fn push_key(&mut self, flags: u8, a: usize, b: usize) {
        let buf = if flags & F_SIDE != 0 {
            &self.s.keybuf[..]
        } else {
            self.src
        };
        let text = &buf[a..b];
        let high = if !text.is_ascii() && text.iter().any(|&b| b >= 0xee) {
            F_HIGH
        } else {
            0
        };
        let prefix = name_prefix(buf, a, b);
        self.s.tape.push(Tok {
            kind: K_KEY,
            flags: flags | high,
            a: a as u32,
            b: b as u32,
            c: (prefix >> 32) as u32,
            d: prefix as u32,
        });
    }

    /// A string (a member name when `key`): validates it, records whether its escapes are
    /// canonical and, for a name with escapes, its unescaped text for sorting.
    #[inline]
    fn string(&mut self, key: bool) -> Result<(), JcsError> {
        let src = self.src;
        let start = self.pos;
        // Most strings have no escape: one scan to the closing quote.
        let end = string_run_end(src, start + 1);
        if src.get(end) == Some(&b'"') {
            self.pos = end + 1;
            self.len += (end + 1 - start) as u64;
            if key {
                self.push_key(0, start + 1, end);
            } else {
                self.push(K_STR, 0, start, end + 1);
            }
            return Ok(());
        }
        self.escaped_string(key)
    }

    /// [`Parser::string`] for a string with an escape (or a syntax error).
    #[cold]
    #[inline(never)]
    fn escaped_string(&mut self, key: bool) -> Result<(), JcsError> {
        let src = self.src;
        let start = self.pos;
        self.pos += 1;
        let mut seg = self.pos;
        let mut canon_len: u64 = 2;
        let mut rewrite = false;
        let mut escaped = false;
        let side_start = self.s.keybuf.len();
        loop {
            self.pos = string_run_end(src, self.pos);
            let run = &src[seg..self.pos];
            canon_len += run.len() as u64;
            if key && escaped {
                self.s.keybuf.extend_from_slice(run);
            }
            match src.get(self.pos) {
                Some(b'"') => {
                    self.pos += 1;
                    break;
                }
                Some(b'\\') => {
                    if key && !escaped {
                        self.s.keybuf.extend_from_slice(&src[start + 1..self.pos]);
                    }
                    escaped = true;
                    let esc = self.pos;
                    let (c, next, lone) = decode_escape(src, esc).ok_or(JcsError {
                        kind: JcsErrorKind::Syntax,
                        offset: esc,
                    })?;
                    if lone {
                        self.violate(JcsErrorKind::LoneSurrogate, esc);
                    }
                    self.pos = next;
                    let mut buf = [0; 6];
                    let canon = canonical_char(c, &mut buf);
                    canon_len += canon.len() as u64;
                    if canon != &src[esc..next] {
                        rewrite = true;
                    }
                    if key {
                        let mut utf8 = [0; 4];
                        let ch = char::from_u32(c).unwrap_or('\u{fffd}');
                        self.s
                            .keybuf
                            .extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
                    }
                    seg = self.pos;
                }
                // A control character, or the end of the body.
                _ => return Err(self.err(JcsErrorKind::Syntax)),
            }
        }
        self.len += canon_len;
        if rewrite {
            self.dirty();
        }
        if key {
            if escaped {
                let b = self.s.keybuf.len();
                self.push_key(F_SIDE, side_start, b);
            } else {
                self.push_key(0, start + 1, self.pos - 1);
            }
        } else {
            self.push(K_STR, if rewrite { F_REWRITE } else { 0 }, start, self.pos);
        }
        Ok(())
    }

    /// A number: validates its grammar (RFC 8259 section 6), checks that a double carries it,
    /// and keeps it as is when already in ECMAScript shortest form.
    fn number(&mut self) -> Result<(), JcsError> {
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
        let mantissa_end = p;
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
        // Significant digits of the mantissa: leading zeros do not count, trailing ones do.
        let mantissa = &src[int_start..mantissa_end];
        let mut significant = 0;
        let mut nonzero = false;
        for &d in mantissa {
            if d == b'.' {
                continue;
            }
            nonzero |= d != b'0';
            if nonzero {
                significant += 1;
            }
        }
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
            self.len += token.len() as u64;
            return Ok(());
        }
        let text = std::str::from_utf8(token).map_err(|_| self.err(JcsErrorKind::Syntax))?;
        let value: f64 = text.parse().map_err(|_| JcsError {
            kind: JcsErrorKind::Syntax,
            offset: start,
        })?;
        if !value.is_finite() || (nonzero && !value.is_normal()) {
            self.violate(JcsErrorKind::InexactNumber, start);
            self.push(K_NUM, 0, start, p);
            return Ok(());
        }
        let mut buf = ryu_js::Buffer::new();
        let out = buf.format_finite(value).as_bytes();
        if must_be_exact && !same_decimal(token, out) {
            // Two different decimals would share this canonical form: one of them would replay
            // the other's record, although a parser that keeps every digit reads them apart.
            self.violate(JcsErrorKind::InexactNumber, start);
            self.push(K_NUM, 0, start, p);
            return Ok(());
        }
        self.len += out.len() as u64;
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

/// A JSON number token as `(negative, digits, point)`, its value being `0.digits x 10^point`,
/// with no leading or trailing zero in `digits` (empty for zero). `token` has JSON's grammar.
fn decimal_parts(token: &[u8]) -> (bool, Vec<u8>, i64) {
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
fn same_decimal(a: &[u8], b: &[u8]) -> bool {
    let (an, ad, ap) = decimal_parts(a);
    let (bn, bd, bp) = decimal_parts(b);
    if ad.is_empty() || bd.is_empty() {
        return ad.is_empty() && bd.is_empty();
    }
    an == bn && ad == bd && ap == bp
}

fn hex4(src: &[u8], at: usize) -> Option<u32> {
    let h = src.get(at..at + 4)?;
    let mut v = 0;
    for &c in h {
        v = v * 16 + (c as char).to_digit(16)?;
    }
    Some(v)
}

/// Decodes the escape at `at` (a backslash): the code point, the offset after it, and whether
/// it was a lone surrogate (then the code point is U+FFFD). `None` for a malformed escape.
fn decode_escape(src: &[u8], at: usize) -> Option<(u32, usize, bool)> {
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
fn canonical_char(c: u32, buf: &mut [u8; 6]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
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

/// The first 8 bytes of a member name as a big-endian integer, padded with zero bytes: two
/// names whose prefixes differ are in the order of their prefixes (byte order; a padding zero
/// marks the end of the shorter name, which then is a prefix of the other), so most member
/// comparisons are one integer comparison.
fn name_prefix(buf: &[u8], a: usize, b: usize) -> u64 {
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
fn tok_prefix(t: &Tok) -> u64 {
    (u64::from(t.c) << 32) | u64::from(t.d)
}

/// The member name order of RFC 8785 section 3.2.3 (UTF-16 code units) between two name tokens.
#[inline]
fn name_cmp(tx: &Tok, ty: &Tok, src: &[u8], side: &[u8]) -> Ordering {
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
fn whole_name_cmp(tx: &Tok, ty: &Tok, src: &[u8], side: &[u8]) -> Ordering {
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
fn key_bytes<'x>(t: &Tok, src: &'x [u8], side: &'x [u8]) -> &'x [u8] {
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
fn utf16_cmp(x: &[u8], y: &[u8]) -> Ordering {
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

impl Tape<'_> {
    fn emit_all(&self, out: &mut impl Sink) {
        if self.verbatim {
            out.put(self.src);
        } else {
            self.emit(0, out);
        }
    }

    /// Writes the value at tape index `i`; the index after it.
    fn emit(&self, i: usize, out: &mut impl Sink) -> usize {
        let t = self.s.tape[i];
        let range = t.a as usize..t.b as usize;
        match t.kind {
            K_OBJ | K_ARR if t.flags & F_CLEAN != 0 => {
                out.put(&self.src[range]);
                t.c as usize
            }
            K_OBJ => {
                out.byte(b'{');
                if t.flags & F_ORDERED != 0 {
                    let mut j = i + 1;
                    while j < t.c as usize {
                        if j > i + 1 {
                            out.byte(b',');
                        }
                        j = self.emit_member(j, out);
                    }
                } else {
                    let d = t.d as usize;
                    let n = self.s.order[d] as usize;
                    for (m, &k) in self.s.order[d + 1..=d + n].iter().enumerate() {
                        if m > 0 {
                            out.byte(b',');
                        }
                        self.emit_member(k as usize, out);
                    }
                }
                out.byte(b'}');
                t.c as usize
            }
            K_ARR => {
                out.byte(b'[');
                let mut j = i + 1;
                while j < t.c as usize {
                    if j > i + 1 {
                        out.byte(b',');
                    }
                    j = self.emit(j, out);
                }
                out.byte(b']');
                t.c as usize
            }
            K_STR if t.flags & F_REWRITE != 0 => {
                self.rewrite_string(&self.src[range], out);
                i + 1
            }
            K_NUM if t.flags & F_SIDE != 0 => {
                out.put(&self.s.numbuf[range]);
                i + 1
            }
            _ => {
                out.put(&self.src[range]);
                i + 1
            }
        }
    }

    /// Writes the member whose name is at tape index `i` (the name, the colon and the value);
    /// the index after its value. A joined name with a canonical value is one source range.
    fn emit_member(&self, i: usize, out: &mut impl Sink) -> usize {
        let t = self.s.tape[i];
        if t.flags & F_JOINED != 0 {
            let v = self.s.tape[i + 1];
            let (canonical, next) = match v.kind {
                K_OBJ | K_ARR => (v.flags & F_CLEAN != 0, v.c as usize),
                K_STR => (v.flags & F_REWRITE == 0, i + 2),
                K_NUM => (v.flags & F_SIDE == 0, i + 2),
                _ => (true, i + 2),
            };
            if canonical {
                out.put(&self.src[t.a as usize - 1..v.b as usize]);
                return next;
            }
        }
        self.emit_key(i, out);
        self.emit(i + 1, out)
    }

    /// Writes the member name at tape index `i` and its colon.
    fn emit_key(&self, i: usize, out: &mut impl Sink) {
        let t = self.s.tape[i];
        let range = t.a as usize..t.b as usize;
        out.byte(b'"');
        if t.flags & F_SIDE != 0 {
            // Unescaped text: escape what RFC 8785 escapes.
            let text = &self.s.keybuf[range];
            let mut seg = 0;
            for (k, &b) in text.iter().enumerate() {
                if STRING_STOP[b as usize] {
                    out.put(&text[seg..k]);
                    let mut buf = [0; 6];
                    out.put(canonical_char(u32::from(b), &mut buf));
                    seg = k + 1;
                }
            }
            out.put(&text[seg..]);
        } else {
            out.put(&self.src[range]);
        }
        out.put(b"\":");
    }

    /// Writes a string (with its quotes) whose escapes are not all canonical.
    fn rewrite_string(&self, s: &[u8], out: &mut impl Sink) {
        let mut seg = 0;
        let mut k = 1;
        out.byte(b'"');
        while k < s.len() - 1 {
            if s[k] == b'\\' {
                out.put(&s[seg.max(1)..k]);
                let (c, next, _) = decode_escape(s, k).expect("validated");
                let mut buf = [0; 6];
                out.put(canonical_char(c, &mut buf));
                k = next;
                seg = k;
            } else {
                k += 1;
            }
        }
        out.put(&s[seg.max(1)..s.len() - 1]);
        out.byte(b'"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
    use std::collections::HashSet;

    /// The tree-based canonicalizer fingerprint version 1 used before this module
    /// (`serde_json::Value` serialized by `serde_json_canonicalizer`), behind a guard on number
    /// tokens written independently of the parser's: the oracle.
    fn oracle(body: &[u8]) -> Option<Vec<u8>> {
        if !oracle_numbers_fit_doubles(body) {
            return None;
        }
        let value: serde_json::Value = serde_json::from_slice(body).ok()?;
        serde_json_canonicalizer::to_vec(&value).ok()
    }

    fn oracle_numbers_fit_doubles(body: &[u8]) -> bool {
        let mut i = 0;
        let mut in_string = false;
        while i < body.len() {
            let b = body[i];
            if in_string {
                match b {
                    b'\\' => i += 1,
                    b'"' => in_string = false,
                    _ => {}
                }
                i += 1;
                continue;
            }
            match b {
                b'"' => {
                    in_string = true;
                    i += 1;
                }
                b'-' | b'0'..=b'9' => {
                    let start = i;
                    while i < body.len()
                        && matches!(body[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                    {
                        i += 1;
                    }
                    if !oracle_number_fits_double(&body[start..i]) {
                        return false;
                    }
                }
                _ => i += 1,
            }
        }
        true
    }

    fn oracle_number_fits_double(tok: &[u8]) -> bool {
        let (mantissa, exponent) = match tok.iter().position(|&b| b == b'e' || b == b'E') {
            Some(p) => (&tok[..p], Some(&tok[p + 1..])),
            None => (tok, None),
        };
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
        let Ok(v) = std::str::from_utf8(tok).unwrap_or("x").parse::<f64>() else {
            return false;
        };
        if !v.is_finite() || (v != 0.0 && !v.is_normal()) {
            return false;
        }
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
        serde_json::from_slice::<serde_json::Value>(body).is_ok()
            && serde_json::from_slice::<NoDuplicates>(body).is_err()
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
                // The output is canonical (the fast path takes it as is) and a fixed point,
                // unless version 1's guard refuses it: the guard counts the trailing zeros of an
                // integer, and `10e14` comes out as `1000000000000000` (16 digits).
                if oracle_numbers_fit_doubles(c) {
                    prop_assert_eq!(is_canonical(c), Ok(true));
                    prop_assert_eq!(&canonicalize(c).unwrap(), c);
                }
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
                // The guard of version 1, or a value that overflows or is not a normal double.
                JcsErrorKind::InexactNumber => {
                    if let Some(o) = &old {
                        let v: serde_json::Value = serde_json::from_slice(o).unwrap();
                        prop_assert!(has_tiny_number(&v), "{:?}", String::from_utf8_lossy(o));
                    }
                }
                JcsErrorKind::TooLarge => prop_assert!(false),
            },
        }
        // Whatever version 1 canonicalized, this one canonicalizes the same, unless it refuses
        // a duplicate name or a number below the normal range.
        if let Some(o) = &old
            && new.is_err()
        {
            let kind = new.unwrap_err().kind();
            prop_assert!(
                kind == JcsErrorKind::DuplicateName || kind == JcsErrorKind::InexactNumber,
                "{:?} for {:?}",
                kind,
                String::from_utf8_lossy(o)
            );
        }
        Ok(())
    }

    fn has_tiny_number(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Number(n) => n.as_f64().is_some_and(|f| !f.is_normal()),
            serde_json::Value::Array(a) => a.iter().any(has_tiny_number),
            serde_json::Value::Object(m) => m.values().any(has_tiny_number),
            _ => false,
        }
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
        // A number is refused when its canonical form (the shortest form of its nearest double)
        // is a different decimal: another body would share it.
        for n in [
            "9007199254740993",
            "18014398509481985",
            "1152921504606846976",
            "3.1415926535897932",
            "0.1000000000000000000001",
            "0.1000000000000000055511151231257827021181583404541015625",
            "999999999999999e300",
            "0.0000000001e-300",
            "1e99999",
        ] {
            assert_eq!(kind(n), JcsErrorKind::InexactNumber, "{n}");
        }
        // Beyond 15 significant digits or an exponent of 300, a number that is the same decimal
        // as its nearest double's shortest form is I-JSON (what JavaScript's `Math.PI` and
        // `0.1 + 0.2` serialize to, a 16-digit id, an integer up to 2^53, or a larger one that
        // is its double's shortest form, as 2^54). 2^60 written in full is not: its shortest
        // form is `1152921504606847000`, another decimal.
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
            ("314159265358979.30e-14", "3.141592653589793"),
        ] {
            let got = canonicalize(n.as_bytes()).unwrap_or_else(|e| panic!("{n}: {e}"));
            assert_eq!(String::from_utf8(got).unwrap(), want, "{n}");
            assert_eq!(
                oracle(n.as_bytes()).as_deref(),
                Some(want.as_bytes()),
                "{n}"
            );
        }
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
    /// be refused when a double may not carry it exactly.
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
                match canonicalize(text.as_bytes()) {
                    Ok(c) => assert_eq!(c, want.as_bytes(), "{text}"),
                    Err(e) => {
                        assert_eq!(e.kind(), JcsErrorKind::InexactNumber, "{text}");
                        assert!(digits > 15, "{text}");
                    }
                }
            }
        }
        // NaN and the infinities have no JSON form at all.
        for text in ["NaN", "Infinity", "-Infinity"] {
            assert_eq!(kind(text), JcsErrorKind::Syntax);
        }
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let number = prop_oneof![
            (-1_000_000_000_000_000_i64..1_000_000_000_000_000).prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            (-99_999_i64..99_999, -30_i32..30)
                .prop_map(|(m, e)| serde_json::Value::from(m as f64 * 10f64.powi(e))),
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
                serde_json::Value::String(s) => self.string(s, out),
                serde_json::Value::Number(n) => self.number(n, out),
                other => out.push_str(&other.to_string()),
            }
            self.ws(out);
        }
    }

    /// Inserts a copy of one member of some object (a duplicate name), when there is one.
    fn with_duplicate(v: &serde_json::Value) -> Option<serde_json::Value> {
        let s = serde_json::to_string(v).ok()?;
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
        /// double or a neighbour, and are refused (they would share a canonical form).
        #[test]
        fn every_double_in_shortest_form_is_accepted(bits in any::<u64>(), extra in 1_u8..10) {
            let v = f64::from_bits(bits);
            prop_assume!(v.is_normal());
            let want = ryu_js::Buffer::new().format_finite(v).to_owned();
            let got = canonicalize(want.as_bytes());
            prop_assert_eq!(got.as_deref().ok(), Some(want.as_bytes()), "{}", want);
            // Rust's own shortest forms are the same decimal, except where the double lies
            // exactly halfway between two 17-digit decimals: ECMAScript takes the even one and
            // Rust may not; the other decimal is then refused like any that is not the
            // canonical form's.
            for text in [format!("{v:e}"), format!("{v:?}")] {
                let got = canonicalize(text.as_bytes());
                if oracle_scientific(text.as_bytes()) == oracle_scientific(want.as_bytes()) {
                    prop_assert_eq!(got.as_deref().ok(), Some(want.as_bytes()), "{}", text);
                } else {
                    prop_assert_eq!(got.map_err(|e| e.kind()), Err(JcsErrorKind::InexactNumber), "{}", text);
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
            if r.is_ok() {
                // Accepted only if it is the same decimal after all (never: the digit is not 0).
                prop_assert!(false, "{} accepted as {:?}", longer, r);
            }
            prop_assert_eq!(r.unwrap_err().kind(), JcsErrorKind::InexactNumber);
        }

        #[test]
        fn same_as_the_tree_on_generated_json(v in json_value(), seed in any::<u64>()) {
            check(&serde_json::to_vec(&v).unwrap())?;
            let mut styled = String::new();
            Style { seed: seed | 1 }.write(&v, &mut styled);
            check(styled.as_bytes())?;
            if let Some(serde_json::Value::String(dup)) = with_duplicate(&v) {
                check(dup.as_bytes())?;
            }
        }

        #[test]
        fn same_as_the_tree_on_mutated_json(v in json_value(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0..3u8), 1..4)) {
            let mut body = serde_json::to_vec(&v).unwrap();
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
    }
}
