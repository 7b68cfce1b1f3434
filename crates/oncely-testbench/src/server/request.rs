//! Reading a request: the head with `httparse`, then the body by `content-length` or
//! chunked, within the size limits.

use std::time::Instant;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Largest request head read, in bytes (64 KiB).
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body read, in bytes (16 MiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A parsed request.
pub(super) struct Request {
    pub(super) method: String,
    pub(super) path: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    pub(super) arrived: Instant,
    pub(super) close: bool,
}

impl Request {
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

pub(super) enum ReadError {
    /// The peer closed (cleanly or not) before a whole request.
    Closed,
    /// Malformed or too large: answer 400/413 and close.
    Bad(u16, String),
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => Err(ReadError::Closed),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

pub(super) async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Request, ReadError> {
    let (method, path, headers, head_len) = loop {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Request::new(&mut slots);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let headers = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect::<Vec<_>>();
                break (
                    parsed.method.unwrap_or("GET").to_owned(),
                    parsed.path.unwrap_or("/").to_owned(),
                    headers,
                    n,
                );
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD {
                    return Err(ReadError::Bad(431, "request head over 64 KiB".into()));
                }
                read_more(stream, buf).await?;
            }
            Err(e) => return Err(ReadError::Bad(400, format!("malformed request: {e}"))),
        }
    };
    let arrived = Instant::now();
    buf.drain(..head_len);
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.ends_with("chunked"));
    let body = if chunked {
        loop {
            match decode_chunked(buf) {
                Ok(Some((body, used))) => {
                    buf.drain(..used);
                    break body;
                }
                Ok(None) if buf.len() > MAX_BODY => {
                    return Err(ReadError::Bad(413, "request body over 16 MiB".into()));
                }
                Ok(None) => read_more(stream, buf).await?,
                Err(why) => return Err(ReadError::Bad(400, why)),
            }
        }
    } else {
        let len = match find("content-length") {
            None => 0,
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| ReadError::Bad(400, "bad content-length".into()))?,
        };
        if len > MAX_BODY {
            return Err(ReadError::Bad(413, "request body over 16 MiB".into()));
        }
        while buf.len() < len {
            read_more(stream, buf).await?;
        }
        buf.drain(..len).collect()
    };
    let close = find("connection").is_some_and(|v| v.contains("close"));
    Ok(Request {
        method,
        path,
        headers,
        body,
        arrived,
        close,
    })
}

/// Decodes a whole chunked body from the start of `buf`: `Ok(None)` if more bytes are needed,
/// else the body and the bytes used (trailers skipped).
fn decode_chunked(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, String> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let (used, size) = match httparse::parse_chunk_size(&buf[pos..]) {
            Ok(httparse::Status::Complete(c)) => c,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err("malformed chunk size".into()),
        };
        pos += used;
        let size = usize::try_from(size).map_err(|_| "chunk too large".to_owned())?;
        if size == 0 {
            let rest = &buf[pos..];
            if rest.starts_with(b"\r\n") {
                return Ok(Some((body, pos + 2)));
            }
            return Ok(rest
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| (body, pos + i + 4)));
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[pos..pos + size]);
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        pos += size + 2;
        if body.len() > MAX_BODY {
            return Err("request body over 16 MiB".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_with_and_without_trailers() {
        assert_eq!(
            decode_chunked(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nGET"),
            Ok(Some((b"hello world".to_vec(), 26)))
        );
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n"),
            Ok(Some((b"abc".to_vec(), 21)))
        );
        assert_eq!(decode_chunked(b"5\r\nhel"), Ok(None));
        assert_eq!(decode_chunked(b"3\r\nabc\r\n0\r\n"), Ok(None));
        assert!(decode_chunked(b"zz\r\n").is_err());
    }
}
