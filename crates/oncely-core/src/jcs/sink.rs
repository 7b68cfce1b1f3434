//! Where canonical bytes go: a `Vec<u8>`, or the fingerprint's SHA-256 through a batching
//! buffer.

use sha2::{Digest, Sha256};
use std::cell::RefCell;

/// Where canonical bytes go.
pub(super) trait Sink {
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

pub(super) const SINK_BUF: usize = 4096;

thread_local! {
    /// The batching buffer of [`HashSink`] ([`SINK_BUF`] bytes once used), kept per thread: a
    /// fresh zeroed array on every call cost more than hashing a small body (as profiled;
    /// docs/DESIGN.md, "The fingerprint").
    pub(super) static SINK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Batches small writes (up to [`SINK_BUF`] bytes) before they reach the hasher.
pub(super) struct HashSink<'h> {
    pub(super) h: &'h mut Sha256,
    pub(super) buf: &'h mut [u8; SINK_BUF],
    /// How many bytes of `buf` are waiting for the hasher.
    pub(super) len: usize,
}

impl HashSink<'_> {
    pub(super) fn flush(&mut self) {
        self.h.update(&self.buf[..self.len]);
        self.len = 0;
    }
}

/// Copies `src` into `dst` (of the same length). Most writes are a member of 10 to 40 bytes:
/// two overlapping fixed-size copies each, where a copy of a variable length is a call.
#[inline(always)]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    debug_assert_eq!(dst.len(), n);
    if n > 32 {
        dst.copy_from_slice(src);
    } else if n >= 16 {
        dst[..16].copy_from_slice(&src[..16]);
        dst[n - 16..].copy_from_slice(&src[n - 16..]);
    } else if n >= 8 {
        dst[..8].copy_from_slice(&src[..8]);
        dst[n - 8..].copy_from_slice(&src[n - 8..]);
    } else if n >= 4 {
        dst[..4].copy_from_slice(&src[..4]);
        dst[n - 4..].copy_from_slice(&src[n - 4..]);
    } else if n > 0 {
        dst[0] = src[0];
        dst[n / 2] = src[n / 2];
        dst[n - 1] = src[n - 1];
    }
}

impl Sink for HashSink<'_> {
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        if bytes.len() > SINK_BUF - self.len {
            self.flush();
            if bytes.len() >= SINK_BUF / 2 {
                self.h.update(bytes);
                return;
            }
        }
        let end = self.len + bytes.len();
        copy_short(&mut self.buf[self.len..end], bytes);
        self.len = end;
    }
    #[inline(always)]
    fn byte(&mut self, b: u8) {
        if self.len == SINK_BUF {
            self.flush();
        }
        self.buf[self.len] = b;
        self.len += 1;
    }
}
