//! The validating tokenizer: reads the body once into the tape, sorts the members of each
//! object, and computes the length of the canonical form. One file per kind of token:
//! `object.rs` (member names, and the sort of each object's members when it closes),
//! `string.rs` (string values and escapes), `number.rs` (numbers); here the parser, its loop
//! over the body, and the literals.

mod number;
mod object;
mod string;

use super::error::{JcsError, JcsErrorKind, MAX_DEPTH};
use super::tape::{
    F_CLEAN, F_REWRITE, F_SIDE, Frame, K_ARR, K_LIT, K_NUM, K_OBJ, K_STR, Scratch, Tok,
};

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

    fn literal(&mut self, word: &'static [u8]) -> Result<(), JcsError> {
        if !self.src[self.pos..].starts_with(word) {
            return Err(self.err(JcsErrorKind::Syntax));
        }
        self.push(K_LIT, 0, self.pos, self.pos + word.len());
        self.pos += word.len();
        Ok(())
    }
}
