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
    /// The batching buffer of [`HashSink`], kept per thread: a fresh zeroed array on every
    /// call cost more than hashing a small body (as profiled; docs/DESIGN.md, "The fingerprint").
    pub(super) static SINK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Batches small writes (up to [`SINK_BUF`] bytes) before they reach the hasher.
pub(super) struct HashSink<'h> {
    pub(super) h: &'h mut Sha256,
    pub(super) buf: &'h mut Vec<u8>,
}

impl HashSink<'_> {
    pub(super) fn flush(&mut self) {
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
