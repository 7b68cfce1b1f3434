//! Reading the maintenance index (see [`RedisStore`], "The maintenance index"): the entries of
//! one kind with a score up to a bound, lowest score first, merged across the index keys (one on
//! a single endpoint, one per hash slot on a Redis Cluster), a page at a time.

use crate::conn::Primary;
use crate::keys::{self, IndexKind};
use crate::store::RedisStore;
use oncely_core::StoreError;
use redis::Value;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet, VecDeque};

/// One index entry: its score (epoch milliseconds) and the record's Redis key.
pub(crate) type Entry = (i64, Vec<u8>);

/// The most entries one read asks of one index key.
const MAX_PAGE: usize = 1000;

/// One index key, read in score order a page at a time.
struct Cursor {
    key: String,
    buf: VecDeque<Entry>,
    /// The highest score read so far and the members read at it: the next page starts at that
    /// score (inclusive) and skips them, so entries removed meanwhile shift nothing.
    last: Option<i64>,
    at_last: HashSet<Vec<u8>>,
    exhausted: bool,
}

impl Cursor {
    fn new(key: String) -> Self {
        Self {
            key,
            buf: VecDeque::new(),
            last: None,
            at_last: HashSet::new(),
            exhausted: false,
        }
    }

    /// `ZRANGE key <from> <max> BYSCORE LIMIT 0 <count> WITHSCORES` for the next page.
    fn next_page(&self, max: Option<i64>, page: usize) -> (redis::Cmd, usize) {
        let count = page + self.at_last.len();
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(&self.key);
        match self.last {
            Some(at) => cmd.arg(at),
            None => cmd.arg("-inf"),
        };
        match max {
            Some(at) => cmd.arg(at),
            None => cmd.arg("+inf"),
        };
        cmd.arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(count)
            .arg("WITHSCORES");
        (cmd, count)
    }

    /// Takes a page that answered a request for `asked` entries.
    fn take(&mut self, reply: Value, asked: usize) -> Result<(), StoreError> {
        let page = entries(reply)?;
        self.exhausted = page.len() < asked;
        for (score, member) in page {
            if self.last == Some(score) {
                if !self.at_last.insert(member.clone()) {
                    continue;
                }
            } else {
                self.last = Some(score);
                self.at_last.clear();
                self.at_last.insert(member.clone());
            }
            self.buf.push_back((score, member));
        }
        Ok(())
    }
}

/// The entries of one kind with a score up to `max`, lowest first, each record once.
pub(crate) struct IndexReader<'a> {
    store: &'a RedisStore,
    max: Option<i64>,
    page: usize,
    cursors: Vec<Cursor>,
    heads: BinaryHeap<Reverse<(i64, usize)>>,
    seen: HashSet<Vec<u8>>,
}

impl<'a> IndexReader<'a> {
    /// Reads the first page (at most `page` entries, capped at 1000) of every index key of
    /// `kind`: one `ZRANGE` on one endpoint; on a cluster one per slot, pipelined per primary
    /// (16,384 in all, whatever the number of records).
    pub(crate) async fn open(
        store: &'a RedisStore,
        kind: IndexKind,
        max: Option<i64>,
        page: usize,
    ) -> Result<Self, StoreError> {
        let page = page.clamp(1, MAX_PAGE);
        let mut conn = store.conn.clone();
        let groups = store.run(conn.slots_by_primary()).await?;
        let mut cursors = Vec::new();
        let mut reads = Vec::new();
        for (primary, slots) in groups {
            let first = cursors.len();
            if let Primary::Only = primary {
                cursors.push(Cursor::new(keys::index_key(&store.namespace, kind, None)));
            } else {
                cursors.extend(
                    slots
                        .iter()
                        .map(|s| Cursor::new(keys::index_key(&store.namespace, kind, Some(*s)))),
                );
            }
            let mut pipe = redis::pipe();
            for c in &cursors[first..] {
                pipe.add_command(c.next_page(max, page).0);
            }
            let mut conn = store.conn.clone();
            reads.push(async move {
                let replies: Vec<Value> = store.run(conn.pipeline_on(primary, &pipe)).await?;
                Ok::<_, StoreError>((first, replies))
            });
        }
        let mut reader = Self {
            store,
            max,
            page,
            cursors,
            heads: BinaryHeap::new(),
            seen: HashSet::new(),
        };
        for (first, replies) in futures::future::try_join_all(reads).await? {
            for (i, reply) in (first..).zip(replies) {
                reader.cursors[i].take(reply, page)?;
                reader.push_head(i);
            }
        }
        Ok(reader)
    }

    fn push_head(&mut self, i: usize) {
        if let Some((score, _)) = self.cursors[i].buf.front() {
            self.heads.push(Reverse((*score, i)));
        }
    }

    /// The next up to `n` entries, lowest score first, each record key once. A key whose page
    /// ran out is read again before any higher score is handed out, so the order holds across
    /// pages.
    pub(crate) async fn next(&mut self, n: usize) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        while out.len() < n {
            let Some(Reverse((_, i))) = self.heads.pop() else {
                break;
            };
            let Some(entry) = self.cursors[i].buf.pop_front() else {
                continue;
            };
            if self.cursors[i].buf.is_empty() && !self.cursors[i].exhausted {
                let (cmd, asked) = self.cursors[i].next_page(self.max, self.page);
                let mut conn = self.store.conn.clone();
                let reply: Value = self
                    .store
                    .run(async move { cmd.query_async(&mut conn).await })
                    .await?;
                self.cursors[i].take(reply, asked)?;
            }
            self.push_head(i);
            if self.seen.insert(entry.1.clone()) {
                out.push(entry);
            }
        }
        Ok(out)
    }
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("redis index: {what}"))
}

fn score(v: &Value) -> Result<i64, StoreError> {
    let f = match v {
        Value::Double(f) => *f,
        Value::Int(i) => return Ok(*i),
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .ok_or_else(|| corrupt("a score is not a number"))?,
        other => return Err(corrupt(format!("unexpected score {other:?}"))),
    };
    if !f.is_finite() {
        return Err(corrupt("a score is not finite"));
    }
    // Scores are epoch milliseconds, exact integers below 2^53.
    #[allow(clippy::cast_possible_truncation)]
    Ok(f as i64)
}

fn member(v: Value) -> Result<Vec<u8>, StoreError> {
    match v {
        Value::BulkString(b) => Ok(b),
        Value::SimpleString(s) => Ok(s.into_bytes()),
        other => Err(corrupt(format!("unexpected member {other:?}"))),
    }
}

/// A `ZRANGE … WITHSCORES` reply as entries: flat `[member, score, …]` (RESP2) or pairs
/// `[[member, score], …]` (RESP3).
fn entries(reply: Value) -> Result<Vec<Entry>, StoreError> {
    let Value::Array(items) = reply else {
        if let Value::ServerError(e) = reply {
            return Err(StoreError::unavailable(redis::RedisError::from(e)));
        }
        return Err(corrupt(format!("unexpected reply {reply:?}")));
    };
    let mut out = Vec::with_capacity(items.len() / 2 + 1);
    let mut it = items.into_iter();
    while let Some(first) = it.next() {
        let (m, s) = match first {
            Value::Array(pair) => {
                let mut pair = pair.into_iter();
                match (pair.next(), pair.next()) {
                    (Some(m), Some(s)) => (m, s),
                    _ => return Err(corrupt("a short pair")),
                }
            }
            m => match it.next() {
                Some(s) => (m, s),
                None => return Err(corrupt("a member without a score")),
            },
        };
        out.push((score(&s)?, member(m)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn both_reply_forms_read_as_entries() {
        let flat = Value::Array(vec![bulk("a"), bulk("1700000000000"), bulk("b"), bulk("5")]);
        let want = vec![(1_700_000_000_000, b"a".to_vec()), (5, b"b".to_vec())];
        assert_eq!(entries(flat).unwrap(), want);
        let pairs = Value::Array(vec![
            Value::Array(vec![bulk("a"), Value::Double(1_700_000_000_000.0)]),
            Value::Array(vec![bulk("b"), Value::Double(5.0)]),
        ]);
        assert_eq!(entries(pairs).unwrap(), want);
        assert!(entries(Value::Array(vec![bulk("a")])).is_err());
        assert!(entries(Value::Array(vec![bulk("a"), bulk("x")])).is_err());
    }

    #[test]
    fn a_page_skips_what_was_read_at_its_first_score() {
        let mut c = Cursor::new("k".into());
        c.take(
            Value::Array(vec![
                bulk("a"),
                bulk("1"),
                bulk("b"),
                bulk("2"),
                bulk("c"),
                bulk("2"),
            ]),
            3,
        )
        .unwrap();
        assert!(!c.exhausted, "a full page may have more behind it");
        assert_eq!(c.last, Some(2));
        // The next page starts at score 2 and asks for 2 more than the page, for b and c.
        let (cmd, asked) = c.next_page(Some(9), 3);
        assert_eq!(asked, 5);
        let args: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            })
            .collect();
        assert_eq!(
            args,
            [
                "ZRANGE",
                "k",
                "2",
                "9",
                "BYSCORE",
                "LIMIT",
                "0",
                "5",
                "WITHSCORES"
            ]
        );
        c.take(
            Value::Array(vec![
                bulk("b"),
                bulk("2"),
                bulk("c"),
                bulk("2"),
                bulk("d"),
                bulk("3"),
            ]),
            asked,
        )
        .unwrap();
        assert!(c.exhausted);
        let read: Vec<&[u8]> = c.buf.iter().map(|(_, m)| m.as_slice()).collect();
        assert_eq!(read, [&b"a"[..], b"b", b"c", b"d"]);
    }
}
