//! Unary calls for handlers that build their own response: decode the request message, and say
//! the reply (or a status) as the exact HTTP response tonic would send.
//!
//! Why a handler would: a transactional handler (`oncely-sqlx`'s `Tx`) commits its response
//! with its last phase, in the same database transaction as its writes, so the response must
//! exist, bytes and trailers, before the commit; a tonic-generated server encodes the reply
//! only after the handler returned. Such a handler is a plain tower (or axum) handler at the
//! method's path, behind [`GrpcIdempotencyLayer`](crate::GrpcIdempotencyLayer), and any gRPC
//! client calls it like a generated one (the framing is gRPC over HTTP/2's "Length-Prefixed
//! Message": a compression flag byte, a 4-byte big-endian length, the message).
//!
//! ```
//! use oncely_grpc::payments::v1::GetPaymentRequest;
//! use oncely_grpc::unary::{decode_request, reply};
//!
//! let msg = GetPaymentRequest { id: "pay_1".into() };
//! let res = reply(&msg);
//! assert_eq!(res.headers()["content-type"], "application/grpc");
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use http_body_util::BodyExt;
//! let collected = res.into_body().collect().await.unwrap();
//! assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
//! let back: GetPaymentRequest = decode_request(&collected.to_bytes()).unwrap();
//! assert_eq!(back, msg);
//! # });
//! ```

use bytes::{BufMut, BytesMut};
use http::{HeaderMap, HeaderValue, Response};
use http_body::Frame;
use oncely_tower::{Body, BoxError};

/// Decodes the one message of a unary request body (uncompressed).
///
/// # Errors
///
/// A `tonic::Status`: `INVALID_ARGUMENT` when the body is not exactly one length-prefixed
/// message or the message does not decode, `UNIMPLEMENTED` when the message is compressed
/// (this decoder takes none; a client that compresses should not for this method).
pub fn decode_request<M: prost::Message + Default>(body: &[u8]) -> Result<M, tonic::Status> {
    let Some((&flag, rest)) = body.split_first() else {
        return Err(tonic::Status::invalid_argument(
            "the request has no message",
        ));
    };
    if flag != 0 {
        return Err(tonic::Status::unimplemented(
            "compressed request messages are not accepted by this method: send it uncompressed",
        ));
    }
    let (len, message) = rest
        .split_first_chunk::<4>()
        .ok_or_else(|| tonic::Status::invalid_argument("the message's length prefix is cut"))?;
    if u32::from_be_bytes(*len) as usize != message.len() {
        return Err(tonic::Status::invalid_argument(
            "the request is not exactly one length-prefixed message",
        ));
    }
    M::decode(message)
        .map_err(|e| tonic::Status::invalid_argument(format!("the message does not decode: {e}")))
}

/// The response of a successful unary call: `content-type: application/grpc`, the message in
/// one length-prefixed frame, then the trailer `grpc-status: 0`: what tonic sends for it.
pub fn reply<M: prost::Message>(message: &M) -> Response<Body> {
    let len = message.encoded_len();
    let mut buf = BytesMut::with_capacity(5 + len);
    buf.put_u8(0);
    buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    message.encode(&mut buf).unwrap_or_default();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let frames = [
        Ok::<_, BoxError>(Frame::data(buf.freeze())),
        Ok(Frame::trailers(trailers)),
    ];
    let body = http_body_util::StreamBody::new(tokio_stream::iter(frames));
    let mut res = Response::new(Body::new(body));
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    res
}

/// The response of a failed call: a trailers-only response carrying `status` (its code,
/// message and details), as tonic sends it.
pub fn status_response(status: tonic::Status) -> Response<Body> {
    let mut res: Response<Body> = status.into_http();
    res.extensions_mut().remove::<tonic::Status>();
    res
}
