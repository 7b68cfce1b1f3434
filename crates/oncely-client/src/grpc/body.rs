//! Buffering a unary request so every attempt resends it byte for byte.
//!
//! tonic encodes a unary message synchronously: its request body is complete the moment it
//! is first polled. So the layer reads the body *without waiting*: if it ends before any read
//! would wait, and within [`MAX_BUFFERED`], it is kept and replayed; if a read would wait (a
//! client-streaming or bidirectional call producing messages as it goes) or the body is
//! larger, what was read is sent on, followed by the rest as it comes, once: a stream is never
//! resent empty or partial, and never held back waiting for its end (which, for a
//! bidirectional call, could be never).

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;

use crate::error::BoxError;

/// Largest request body buffered for retries, in bytes (4 MiB, tonic's default limit on a
/// decoded message).
pub const MAX_BUFFERED: usize = 4 * 1024 * 1024;

/// A request body, as the retry loop holds it.
pub(crate) enum RequestBody {
    /// Complete: resent on every attempt.
    Whole(Bytes),
    /// A stream (or too large): sent once.
    Stream(Body),
}

impl RequestBody {
    /// Reads what is ready now, without waiting.
    ///
    /// # Errors
    ///
    /// The body's own error (the encoder refused the message).
    pub(crate) fn read_ready(mut body: Body) -> Result<Self, BoxError> {
        let mut cx = Context::from_waker(Waker::noop());
        let mut buf = BytesMut::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(None) => return Ok(Self::Whole(buf.freeze())),
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => {
                        buf.extend_from_slice(&data);
                        if buf.len() > MAX_BUFFERED {
                            return Ok(Self::stream(buf.freeze(), None, body));
                        }
                    }
                    // Request trailers: not something a unary gRPC call sends; stream it on.
                    Err(frame) => return Ok(Self::stream(buf.freeze(), Some(frame), body)),
                },
                Poll::Ready(Some(Err(e))) => return Err(e.into()),
                Poll::Pending => return Ok(Self::stream(buf.freeze(), None, body)),
            }
        }
    }

    fn stream(read: Bytes, frame: Option<Frame<Bytes>>, rest: Body) -> Self {
        let mut head: Vec<Frame<Bytes>> = Vec::new();
        if !read.is_empty() {
            head.push(Frame::data(read));
        }
        head.extend(frame);
        head.reverse();
        Self::Stream(Body::new(Prefixed { head, rest }))
    }
}

/// Frames already read, then the rest of the body.
struct Prefixed {
    /// In reverse order (popped from the end).
    head: Vec<Frame<Bytes>>,
    rest: Body,
}

impl HttpBody for Prefixed {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Some(frame) = self.head.pop() {
            return Poll::Ready(Some(Ok(frame)));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let head: u64 = self
            .head
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + head);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + head);
        }
        hint
    }
}
