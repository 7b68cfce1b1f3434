//! Turning a record hash (and script replies) back into [`oncely_core`] types. Anything that
//! does not decode is [`StoreError::Corrupt`]: never guessed, never half-returned.

use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordState, Redrives, Scope, StoreError,
    StoredRequest, StoredResponse, UnixMillis,
};
use redis::Value;
use std::collections::HashMap;

/// The fields of one record hash, as `HGETALL` returns them.
pub(crate) type Fields = HashMap<Vec<u8>, Vec<u8>>;

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("redis record: {what}"))
}

fn bytes<'a>(f: &'a Fields, name: &str) -> Result<&'a [u8], StoreError> {
    f.get(name.as_bytes())
        .map(Vec::as_slice)
        .ok_or_else(|| corrupt(format!("field `{name}` is missing")))
}

fn text(f: &Fields, name: &str) -> Result<String, StoreError> {
    String::from_utf8(bytes(f, name)?.to_vec())
        .map_err(|_| corrupt(format!("field `{name}` is not UTF-8")))
}

fn int(f: &Fields, name: &str) -> Result<i64, StoreError> {
    parse_int(bytes(f, name)?).ok_or_else(|| corrupt(format!("field `{name}` is not an integer")))
}

/// Parses decimal integer text.
pub(crate) fn parse_int(b: &[u8]) -> Option<i64> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Decodes `HGETALL` output; an empty hash (the key does not exist) is `None`.
pub(crate) fn record(f: &Fields) -> Result<Option<Record>, StoreError> {
    if f.is_empty() {
        return Ok(None);
    }
    let scope = Scope::new(text(f, "scope")?);
    let key = IdempotencyKey::new(&text(f, "key")?).map_err(|e| corrupt(format!("key: {e}")))?;
    let fingerprint = Fingerprint::from_stored(int(f, "fp_v")?, bytes(f, "fp")?)
        .map_err(|e| corrupt(format!("fingerprint: {e}")))?;
    let request = match f.get(b"req".as_slice()) {
        Some(b) => Some(StoredRequest::decode(b).map_err(|e| corrupt(format!("request: {e}")))?),
        None => None,
    };
    let state = match bytes(f, "state")? {
        b"in_flight" => RecordState::InFlight {
            lease_expires_at: int(f, "lease")?,
            recovery_point: match f.get(b"rp".as_slice()) {
                Some(_) => Some(text(f, "rp")?),
                None => None,
            },
        },
        b"complete" => RecordState::Complete {
            response: response(
                f.get(b"status".as_slice()).map(Vec::as_slice),
                f.get(b"headers".as_slice()).map(Vec::as_slice),
                f.get(b"body".as_slice()).map(Vec::as_slice),
                f.get(b"retained".as_slice()).map(Vec::as_slice),
            )?,
            completed_at: int(f, "completed")?,
        },
        b"released" => RecordState::Released,
        other => {
            return Err(corrupt(format!(
                "unknown state {:?}",
                String::from_utf8_lossy(other)
            )));
        }
    };
    let opt_int = |name: &str| match f.get(name.as_bytes()) {
        Some(_) => int(f, name).map(Some),
        None => Ok(None),
    };
    // Absent in records written before the completer counted its attempts: never re-driven.
    let redrives = Redrives {
        attempts: match opt_int("attempts")? {
            Some(n) => u32::try_from(n).map_err(|_| corrupt("field `attempts` out of range"))?,
            None => 0,
        },
        next_attempt_at: opt_int("next_attempt")?,
        marked_at: opt_int("marked")?,
    };
    Ok(Some(Record {
        scope,
        key,
        fingerprint,
        token: FencingToken(int(f, "token")?),
        state,
        created_at: int(f, "created")?,
        expires_at: int(f, "expires")?,
        request,
        redrives,
    }))
}

/// Rebuilds a stored response from its four fields.
pub(crate) fn response(
    status: Option<&[u8]>,
    headers: Option<&[u8]>,
    body: Option<&[u8]>,
    retained: Option<&[u8]>,
) -> Result<StoredResponse, StoreError> {
    let status = status
        .and_then(parse_int)
        .and_then(|s| u16::try_from(s).ok())
        .ok_or_else(|| corrupt("response status"))?;
    let headers = StoredResponse::decode_headers(headers.ok_or_else(|| corrupt("headers"))?)
        .map_err(|e| corrupt(format!("headers: {e}")))?;
    let body = body.ok_or_else(|| corrupt("body"))?.to_vec();
    let body_retained = match retained {
        Some(b"1") => true,
        Some(b"0") => false,
        _ => return Err(corrupt("retained flag")),
    };
    Ok(StoredResponse {
        status,
        headers,
        body,
        body_retained,
    })
}

/// A script reply as a list of optional byte strings (numbers become their decimal text).
pub(crate) fn reply(v: Value) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt(format!("unexpected script reply {v:?}")));
    };
    items
        .into_iter()
        .map(|item| match item {
            Value::Nil => Ok(None),
            Value::BulkString(b) => Ok(Some(b)),
            Value::SimpleString(s) => Ok(Some(s.into_bytes())),
            Value::Int(i) => Ok(Some(i.to_string().into_bytes())),
            Value::Okay => Ok(Some(b"OK".to_vec())),
            other => Err(corrupt(format!("unexpected script reply item {other:?}"))),
        })
        .collect()
}

/// Item `i` of a script reply as an integer.
pub(crate) fn reply_int(r: &[Option<Vec<u8>>], i: usize) -> Result<UnixMillis, StoreError> {
    r.get(i)
        .and_then(Option::as_deref)
        .and_then(parse_int)
        .ok_or_else(|| corrupt(format!("script reply item {i} is not an integer")))
}

/// Item `i` of a script reply as bytes, if present.
pub(crate) fn reply_bytes(r: &[Option<Vec<u8>>], i: usize) -> Option<&[u8]> {
    r.get(i).and_then(Option::as_deref)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &[u8])]) -> Fields {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn empty_hash_is_absent() {
        assert_eq!(record(&Fields::new()).unwrap(), None);
    }

    #[test]
    fn in_flight_record_decodes_exactly() {
        let digest = [7u8; 32];
        let f = fields(&[
            ("scope", b"acct"),
            ("key", b"k-1"),
            ("fp_v", b"1"),
            ("fp", &digest),
            ("token", b"3"),
            ("state", b"in_flight"),
            ("lease", b"1000"),
            ("rp", b"charged"),
            ("created", b"10"),
            ("expires", b"99"),
        ]);
        let r = record(&f).unwrap().unwrap();
        assert_eq!(r.token, FencingToken(3));
        assert_eq!(r.fingerprint, Fingerprint::from_parts(1, digest));
        assert_eq!(
            r.state,
            RecordState::InFlight {
                lease_expires_at: 1000,
                recovery_point: Some("charged".into())
            }
        );
        assert_eq!((r.created_at, r.expires_at, r.request), (10, 99, None));
        assert_eq!(
            r.redrives,
            Redrives::default(),
            "a record from before the completer's fields"
        );
        let mut f = f;
        f.insert(b"attempts".to_vec(), b"2".to_vec());
        f.insert(b"next_attempt".to_vec(), b"5000".to_vec());
        f.insert(b"marked".to_vec(), b"6000".to_vec());
        assert_eq!(
            record(&f).unwrap().unwrap().redrives,
            Redrives {
                attempts: 2,
                next_attempt_at: Some(5000),
                marked_at: Some(6000)
            }
        );
        f.insert(b"attempts".to_vec(), b"-1".to_vec());
        assert!(matches!(record(&f), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn damage_is_corrupt_not_a_guess() {
        let f = fields(&[("scope", b"acct"), ("state", b"in_flight")]);
        assert!(matches!(record(&f), Err(StoreError::Corrupt(_))));
        assert!(matches!(
            response(Some(b"70000"), Some(b"[]"), Some(b""), Some(b"1")),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(
            response(Some(b"200"), Some(b"[]"), Some(b""), Some(b"yes")),
            Err(StoreError::Corrupt(_))
        ));
    }
}
