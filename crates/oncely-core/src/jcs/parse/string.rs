//! String values: validated, and whether their escapes are canonical.

use super::Parser;
use crate::jcs::error::{JcsError, JcsErrorKind};
use crate::jcs::lex::{canonical_char, decode_escape, string_run_end};
use crate::jcs::tape::{F_REWRITE, F_SIDE, K_STR};

impl Parser<'_> {
    /// A string value (member names are read by [`Parser::key`]): validates it and records
    /// whether its escapes are canonical.
    #[inline]
    pub(super) fn string(&mut self) -> Result<(), JcsError> {
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
    pub(super) fn escaped_string(&mut self, key: bool) -> Result<(), JcsError> {
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
}
