//! The validating tokenizer: reads the body once into the tape, sorts the members of each
//! object, and computes the length of the canonical form.

use super::error::{JcsError, JcsErrorKind, MAX_DEPTH};
use super::lex::{canonical_char, decode_escape, same_decimal, string_run_end};
use super::order::{insertion_sort, key_bytes, name_cmp, name_prefix, tok_prefix};
use super::tape::{
    F_CLEAN, F_HIGH, F_JOINED, F_ORDERED, F_REWRITE, F_SIDE, Frame, K_ARR, K_KEY, K_LIT, K_NUM,
    K_OBJ, K_STR, Scratch, SortCache, Tok,
};
use std::cmp::Ordering;

pub(super) struct Parser<'a> {
    pub(super) src: &'a [u8],
    pub(super) pos: usize,
    pub(super) s: &'a mut Scratch,
    /// The length of the canonical form: the body's length, less what was read and is not
    /// written (whitespace, escapes and number digits written shorter), plus what is written
    /// longer (a number's exponent sign). Most tokens are written as they are and change nothing.
    pub(super) len: u64,
    /// The first I-JSON violation, reported once the whole body is known to be JSON.
    pub(super) violation: Option<JcsError>,
}

impl<'a> Parser<'a> {
    pub(super) fn new(src: &'a [u8], s: &'a mut Scratch) -> Self {
        Self {
            src,
            pos: 0,
            s,
            len: src.len() as u64,
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
        self.len -= (self.pos - start) as u64;
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
    pub(super) fn run(mut self) -> Result<(u64, bool), JcsError> {
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
                b'"' => self.string()?,
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
                    // A number cut short to its canonical form is a shorter canonical form.
                    let same_len = self.len == self.src.len() as u64;
                    return Ok((self.len, root_clean && same_len && !lead && !ws));
                };
                if ws {
                    self.dirty();
                }
                match (f.obj, self.src.get(self.pos)) {
                    (_, Some(b',')) => {
                        self.pos += 1;
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
    #[inline(always)]
    fn key(&mut self) -> Result<(), JcsError> {
        let src = self.src;
        let start = self.pos;
        if src.get(start) != Some(&b'"') {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        let tok = self.s.tape.len();
        // Most names have no escape: one scan to the closing quote.
        let end = string_run_end(src, start + 1);
        if src.get(end) == Some(&b'"') {
            self.pos = end + 1;
            self.s.tape.push(key_tok(src, 0, start + 1, end));
        } else {
            self.escaped_string(true)?;
        }
        let pos = self.pos;
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
            let t = &tape[tok];
            f.high |= t.flags & F_HIGH != 0;
            if members.len() > f.members as usize {
                let prev = &tape[members[members.len() - 1] as usize];
                match name_cmp(prev, t, src, keybuf) {
                    Ordering::Less => {}
                    Ordering::Equal => f.duplicate = true,
                    Ordering::Greater => f.ordered = false,
                }
            }
            members.push(tok as u32);
            // Compact JSON: the colon right after the name, the value right after the colon.
            if let Some(&[b':', next]) = src.get(pos..pos + 2)
                && next > b' '
            {
                self.pos = pos + 1;
                let t = &mut tape[tok];
                if t.flags & F_SIDE == 0 {
                    t.flags |= F_JOINED;
                }
                return Ok(());
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
        if self.skip_ws() {
            self.dirty();
            joined = false;
        }
        let t = &mut self.s.tape[tok];
        if joined && t.flags & F_SIDE == 0 {
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
        Ok(())
    }

    /// Pushes a member name token: `a..b` in the body, or in the side buffer for [`F_SIDE`].
    fn push_key(&mut self, flags: u8, a: usize, b: usize) {
        let buf = if flags & F_SIDE != 0 {
            &self.s.keybuf[..]
        } else {
            self.src
        };
        let t = key_tok(buf, flags, a, b);
        self.s.tape.push(t);
    }

    /// A string value (member names are read by [`Parser::key`]): validates it and records
    /// whether its escapes are canonical.
    #[inline]
    fn string(&mut self) -> Result<(), JcsError> {
        let src = self.src;
        let start = self.pos;
        // Most strings have no escape: one scan to the closing quote.
        let end = string_run_end(src, start + 1);
        if src.get(end) == Some(&b'"') {
            self.pos = end + 1;
            self.push(K_STR, 0, start, end + 1);
            return Ok(());
        }
        self.escaped_string(false)
    }

    /// A string with an escape (or a syntax error), a member name when `key`: validates it,
    /// records whether its escapes are canonical and, for a name, its unescaped text for
    /// sorting.
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
        self.len = self.len + canon_len - (self.pos - start) as u64;
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

    /// A number that no double carries (its decimal value is not the shortest form of its
    /// nearest double, or it is beyond the range of normal doubles): its canonical form is its
    /// token as written, digit for digit (docs/DESIGN.md, "Large numbers"). No normal double's
    /// shortest form is that token (it would then be the decimal of that form), so it never
    /// shares a canonical form with another number.
    #[cold]
    #[inline(never)]
    fn exact_digits(&mut self, start: usize, end: usize) {
        self.push(K_NUM, 0, start, end);
    }

    /// A number: validates its grammar (RFC 8259 section 6), and keeps it as is when already
    /// in ECMAScript shortest form, or when no double carries it ([`Parser::exact_digits`]).
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

/// The token of the member name `buf[a..b]`, with its [`name_prefix`] and [`F_HIGH`].
#[inline(always)]
fn key_tok(buf: &[u8], flags: u8, a: usize, b: usize) -> Tok {
    let prefix = name_prefix(buf, a, b);
    // The prefix holds the first 8 bytes: ASCII there, only the rest of a longer name is looked
    // at again.
    let text = &buf[a..b];
    let ascii = prefix & 0x8080_8080_8080_8080 == 0 && text.iter().skip(8).all(u8::is_ascii);
    let high = if !ascii && text.iter().any(|&c| c >= 0xee) {
        F_HIGH
    } else {
        0
    };
    Tok {
        kind: K_KEY,
        flags: flags | high,
        a: a as u32,
        b: b as u32,
        c: (prefix >> 32) as u32,
        d: prefix as u32,
    }
}
