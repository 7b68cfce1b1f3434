//! The tape: tokens as byte ranges, their kinds and flags, and the buffers reused between
//! calls on one thread.

use std::cell::RefCell;

// Token kinds.
pub(super) const K_LIT: u8 = 0;
pub(super) const K_NUM: u8 = 1;
pub(super) const K_STR: u8 = 2;
pub(super) const K_KEY: u8 = 3;
pub(super) const K_OBJ: u8 = 4;
pub(super) const K_ARR: u8 = 5;

// Token flags.
/// A string whose escapes must be re-written.
pub(super) const F_REWRITE: u8 = 1;
/// A number whose canonical text is in `numbuf`, or a name whose unescaped text is in `keybuf`.
pub(super) const F_SIDE: u8 = 2;
/// A container whose source range is canonical as it is.
pub(super) const F_CLEAN: u8 = 4;
/// An object whose members are in canonical order in the source.
pub(super) const F_ORDERED: u8 = 8;
/// A member name with a byte of `EE` or above (a character from U+E000 up), whose UTF-16 order
/// may differ from its byte order.
pub(super) const F_HIGH: u8 = 16;
/// A member name written as it is (no escapes) with its colon right after it and its value
/// right after that, so that the name, the colon and a canonical value are one source range.
pub(super) const F_JOINED: u8 = 32;

/// One token of the tape. `a..b` is a byte range (in the body, or for [`F_SIDE`] in the side
/// buffer); for containers `c` is the index of the token after the container and `d` the
/// offset of the sorted member list in `order` (unordered objects only); for member names
/// `c` and `d` are the high and low halves of [`name_prefix`].
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tok {
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) a: u32,
    pub(super) b: u32,
    pub(super) c: u32,
    pub(super) d: u32,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Frame {
    pub(super) tok: u32,
    pub(super) obj: bool,
    pub(super) clean: bool,
    pub(super) members: u32,
    /// Every member name so far is after the one before it (checked as each name is read).
    pub(super) ordered: bool,
    /// Two consecutive names so far are equal.
    pub(super) duplicate: bool,
    /// A name has a byte from `EE` up ([`F_HIGH`]): sorting then needs UTF-16 comparisons.
    pub(super) high: bool,
}

/// Buffers reused between calls on one thread (the tape, member lists, unescaped names and
/// re-formatted numbers), so that a fingerprint allocates nothing once they are warm.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub(super) tape: Vec<Tok>,
    pub(super) frames: Vec<Frame>,
    pub(super) members: Vec<u32>,
    pub(super) order: Vec<u32>,
    /// `(name prefix, position among its members)` of the object being sorted.
    pub(super) sortbuf: Vec<(u64, u32)>,
    /// Member orders of objects sorted before, on this thread.
    pub(super) sorts: SortCache,
    pub(super) keybuf: Vec<u8>,
    pub(super) numbuf: Vec<u8>,
}

impl Scratch {
    pub(super) fn clear(&mut self) {
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
pub(super) struct SortCache([SortSlot; SortCache::SLOTS]);

#[derive(Debug, Default)]
pub(super) struct SortSlot {
    /// The name prefixes in source order (empty: nothing remembered).
    pub(super) prefixes: Vec<u64>,
    /// The sorted order, as positions in `prefixes`.
    pub(super) perm: Vec<u32>,
}

impl SortCache {
    pub(super) const SLOTS: usize = 8;
    pub(super) const MAX_MEMBERS: usize = 64;

    pub(super) fn slot(members: usize, first_prefix: u64) -> usize {
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

thread_local! {
    pub(super) static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A parsed body, ready to be written out in canonical order.
pub(super) struct Tape<'a> {
    pub(super) src: &'a [u8],
    pub(super) s: &'a Scratch,
    /// The length of the canonical form, in bytes.
    pub(super) len: u64,
    /// The body is canonical as it is.
    pub(super) verbatim: bool,
}
