//! Writes the tape out in canonical order.

use super::lex::{STRING_STOP, canonical_char, decode_escape};
use super::sink::Sink;
use super::tape::{
    F_CLEAN, F_JOINED, F_ORDERED, F_REWRITE, F_SIDE, K_ARR, K_NUM, K_OBJ, K_STR, Tape,
};

impl Tape<'_> {
    pub(super) fn emit_all(&self, out: &mut impl Sink) {
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
                Self::rewrite_string(&self.src[range], out);
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
    #[inline(always)]
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
    fn rewrite_string(s: &[u8], out: &mut impl Sink) {
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
