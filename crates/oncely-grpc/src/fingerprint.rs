//! [`GrpcFingerprinter`]: the fingerprint of a gRPC call.
//!
//! Fingerprint version 1 ([`oncely_core::DefaultFingerprinter`]) over the method path and the
//! request's message bytes as sent: the length-prefixed messages (gRPC's five-byte prefix, a
//! compression flag and a length, frames each message unambiguously), with the
//! `grpc-encoding` header when the client compresses (the layer passes it as a fingerprint
//! header). The media type is normalized: `application/grpc` and `application/grpc+proto` are
//! the same encoding (gRPC over HTTP/2), so they fingerprint alike. Metadata (credentials
//! included) never takes part, nor does `grpc-timeout`: a retry with less time left is the same
//! call.
//!
//! Protobuf is not canonical: two encoders may write the same message with different bytes
//! (field order, packed or unpacked repeated fields). A stock client retries with the bytes of
//! its first attempt, so its retries match; a client that re-encodes a message differently
//! gets `FAILED_PRECONDITION idempotency_key_mismatch`, never a wrong replay.

use oncely_core::fingerprint::{FingerprintError, RequestParts};
use oncely_core::{DefaultFingerprinter, Fingerprint, Fingerprinter};

/// See the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcFingerprinter;

fn normalized<'a>(parts: &RequestParts<'a>) -> RequestParts<'a> {
    let content_type = parts.content_type.map(|ct| {
        let essence = oncely_core::fingerprint::media_type_essence(ct);
        if essence == "application/grpc+proto" || essence == "application/grpc" {
            &b"application/grpc"[..]
        } else {
            ct
        }
    });
    parts.with_query(None).with_content_type(content_type)
}

impl Fingerprinter for GrpcFingerprinter {
    fn fingerprint(&self, parts: &RequestParts<'_>) -> Fingerprint {
        DefaultFingerprinter.fingerprint(&normalized(parts))
    }

    fn try_fingerprint(&self, parts: &RequestParts<'_>) -> Result<Fingerprint, FingerprintError> {
        DefaultFingerprinter.try_fingerprint(&normalized(parts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(ct: &[u8], body: &[u8], path: &str) -> Fingerprint {
        GrpcFingerprinter
            .fingerprint(&RequestParts::new("POST", path, body).with_content_type(Some(ct)))
    }

    #[test]
    fn media_type_spellings_agree_and_messages_or_methods_differ() {
        let m = b"\0\0\0\0\x02\x08\x01";
        assert_eq!(
            fp(b"application/grpc", m, "/a.B/C"),
            fp(b"application/grpc+proto", m, "/a.B/C")
        );
        assert_ne!(
            fp(b"application/grpc", m, "/a.B/C"),
            fp(b"application/grpc", m, "/a.B/D")
        );
        assert_ne!(
            fp(b"application/grpc", m, "/a.B/C"),
            fp(b"application/grpc", b"\0\0\0\0\x02\x08\x02", "/a.B/C")
        );
    }
}
