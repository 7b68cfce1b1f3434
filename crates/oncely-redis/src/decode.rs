//! Turning a record hash (and script replies) back into [`oncely_core`] types. Anything that
//! does not decode is [`StoreError::Corrupt`]: never guessed, never half-returned.

use oncely_core::{
    FencingToken, Fingerprint, IdempotencyKey, Record, RecordKey, RecordState, Redrives, Scope,
    StoreError, StoredRequest, StoredResponse, UnixMillis,
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
///
/// `id` is the identity the hash's Redis key names. Records of the first form (older versions) also
/// carry it as the `scope` and `key` fields, which win when present; newer records leave them out
/// (the Redis key already holds the identity). A record with neither is corrupt.
pub(crate) fn record(f: &Fields, id: Option<&RecordKey>) -> Result<Option<Record>, StoreError> {
    if f.is_empty() {
        return Ok(None);
    }
    let (scope, key) = match (f.contains_key(b"scope".as_slice()), id) {
        (false, Some(id)) => (id.scope.clone(), id.key.clone()),
        _ => (
            Scope::new(text(f, "scope")?),
            IdempotencyKey::new(&text(f, "key")?).map_err(|e| corrupt(format!("key: {e}")))?,
        ),
    };
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
    let redrives = Redrives::new(
        match opt_int("attempts")? {
            Some(n) => u32::try_from(n).map_err(|_| corrupt("field `attempts` out of range"))?,
            None => 0,
        },
        opt_int("next_attempt")?,
        opt_int("marked")?,
    );
    Ok(Some(
        Record::new(
            scope,
            key,
            fingerprint,
            FencingToken(int(f, "token")?),
            state,
            int(f, "created")?,
            int(f, "expires")?,
        )
        .with_request(request)
        .with_redrives(redrives),
    ))
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
    let (headers, trailers) =
        StoredResponse::decode_header_fields(headers.ok_or_else(|| corrupt("headers"))?)
            .map_err(|e| corrupt(format!("headers: {e}")))?;
    let body = body.ok_or_else(|| corrupt("body"))?.to_vec();
    let body_retained = match retained {
        Some(b"1") => true,
        Some(b"0") => false,
        _ => return Err(corrupt("retained flag")),
    };
    Ok(StoredResponse::new(status, headers, body)
        .with_body_retained(body_retained)
        .with_trailers(trailers))
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

/// A record's fields as a script returns them: `HGETALL`'s flat `[field, value, ...]` (scripts
/// speak RESP2).
pub(crate) fn flat_fields(v: Value) -> Result<Fields, StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt(format!("unexpected fields {v:?}")));
    };
    let bytes = |v: Value| match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(corrupt(format!("unexpected field item {other:?}"))),
    };
    let mut out = Fields::with_capacity(items.len() / 2);
    let mut it = items.into_iter();
    while let Some(name) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| corrupt("a field without a value"))?;
        out.insert(bytes(name)?, bytes(value)?);
    }
    Ok(out)
}

/// An operator script's reply: `{'ok', fields}` as `(None, fields)`, `{'refused', now, fields}`
/// as `(Some(now), fields)`.
pub(crate) fn change_reply(v: Value) -> Result<(Option<UnixMillis>, Fields), StoreError> {
    let Value::Array(items) = v else {
        return Err(corrupt(format!("unexpected script reply {v:?}")));
    };
    let mut it = items.into_iter();
    let head = reply(Value::Array(it.next().into_iter().collect()))?;
    match reply_bytes(&head, 0) {
        Some(b"ok") => Ok((None, flat_fields(it.next().unwrap_or(Value::Nil))?)),
        Some(b"refused") => {
            let now = reply(Value::Array(it.next().into_iter().collect()))?;
            let now = reply_int(&now, 0)?;
            Ok((Some(now), flat_fields(it.next().unwrap_or(Value::Nil))?))
        }
        _ => Err(corrupt(format!(
            "unexpected operator script reply {head:?}"
        ))),
    }
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
        assert_eq!(record(&Fields::new(), None).unwrap(), None);
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
        let r = record(&f, None).unwrap().unwrap();
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
            record(&f, None).unwrap().unwrap().redrives,
            Redrives::new(2, Some(5000), Some(6000))
        );
        f.insert(b"attempts".to_vec(), b"-1".to_vec());
        assert!(matches!(record(&f, None), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn both_record_forms_decode() {
        let digest = [9u8; 32];
        let id = RecordKey::new(Scope::new("acct"), IdempotencyKey::new("k-1").unwrap());
        let common: [(&str, &[u8]); 9] = [
            ("fp_v", b"1"),
            ("fp", &digest),
            ("token", b"2"),
            ("state", b"complete"),
            ("status", b"201"),
            ("body", b"{}"),
            ("retained", b"1"),
            ("completed", b"50"),
            ("created", b"10"),
        ];
        let want = Record::new(
            id.scope.clone(),
            id.key.clone(),
            Fingerprint::from_parts(1, digest),
            FencingToken(2),
            RecordState::Complete {
                response: StoredResponse::new(
                    201,
                    vec![("content-type".into(), b"application/json".to_vec())],
                    b"{}".to_vec(),
                ),
                completed_at: 50,
            },
            10,
            99,
        );
        // Today's form: no identity fields, compact headers, no request once complete.
        let mut new = fields(&common);
        new.insert(b"expires".to_vec(), b"99".to_vec());
        new.insert(
            b"headers".to_vec(),
            br#"[["content-type","application/json"]]"#.to_vec(),
        );
        assert_eq!(record(&new, Some(&id)).unwrap(), Some(want.clone()));
        // Without the identity from the Redis key, it is corrupt, never guessed.
        assert!(matches!(record(&new, None), Err(StoreError::Corrupt(_))));
        // The first form (older versions): the identity as fields (they win), headers and the
        // request as arrays of byte values, and the request kept after completion.
        let mut old = fields(&common);
        old.insert(b"expires".to_vec(), b"99".to_vec());
        old.insert(b"scope".to_vec(), b"acct".to_vec());
        old.insert(b"key".to_vec(), b"k-1".to_vec());
        old.insert(
            b"headers".to_vec(),
            br#"[["content-type",[97,112,112,108,105,99,97,116,105,111,110,47,106,115,111,110]]]"#
                .to_vec(),
        );
        old.insert(
            b"req".to_vec(),
            br#"{"method":"POST","uri":"/v1/orders","headers":[],"body":[123,125]}"#.to_vec(),
        );
        let old_req = StoredRequest::new("POST", "/v1/orders", vec![], b"{}".to_vec());
        let got = record(&old, None).unwrap().unwrap();
        assert_eq!(got.request.as_ref(), Some(&old_req));
        assert_eq!(got.with_request(None), want);
        let other = RecordKey::new(Scope::new("elsewhere"), IdempotencyKey::new("x").unwrap());
        assert_eq!(record(&old, Some(&other)).unwrap().unwrap().scope, id.scope);
    }

    #[test]
    fn operator_replies_decode() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let fields = Value::Array(vec![b("state"), b("released"), b("token"), b("4")]);
        let (now, f) = change_reply(Value::Array(vec![b("ok"), fields.clone()])).unwrap();
        assert_eq!(now, None);
        assert_eq!(
            f.get(b"token".as_slice()).map(Vec::as_slice),
            Some(&b"4"[..])
        );
        let (now, f) = change_reply(Value::Array(vec![b("refused"), b("1700"), fields])).unwrap();
        assert_eq!((now, f.len()), (Some(1700), 2));
        let (_, gone) = change_reply(Value::Array(vec![
            b("refused"),
            b("1"),
            Value::Array(vec![]),
        ]))
        .unwrap();
        assert!(gone.is_empty());
        assert!(change_reply(Value::Array(vec![b("what")])).is_err());
        assert!(flat_fields(Value::Array(vec![b("state")])).is_err());
    }

    #[test]
    fn damage_is_corrupt_not_a_guess() {
        let f = fields(&[("scope", b"acct"), ("state", b"in_flight")]);
        assert!(matches!(record(&f, None), Err(StoreError::Corrupt(_))));
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
