//! Member names, and the sort of each object's members when it closes.

use super::Parser;
use crate::jcs::error::{JcsError, JcsErrorKind};
use crate::jcs::lex::string_run_end;
use crate::jcs::order::{insertion_sort, key_bytes, name_cmp, name_prefix, tok_prefix};
use crate::jcs::tape::{
    F_CLEAN, F_HIGH, F_JOINED, F_ORDERED, F_SIDE, K_KEY, Scratch, SortCache, Tok,
};
use std::cmp::Ordering;

impl Parser<'_> {
    /// A member name, the colon and the whitespace before the value.
    #[inline(always)]
    pub(super) fn key(&mut self) -> Result<(), JcsError> {
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
    pub(super) fn close(&mut self) {
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

    /// Pushes a member name token: `a..b` in the body, or in the side buffer for [`F_SIDE`].
    pub(super) fn push_key(&mut self, flags: u8, a: usize, b: usize) {
        let buf = if flags & F_SIDE != 0 {
            &self.s.keybuf[..]
        } else {
            self.src
        };
        let t = key_tok(buf, flags, a, b);
        self.s.tape.push(t);
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
