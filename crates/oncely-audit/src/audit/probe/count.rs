//! The count URL: how many resources the audited API lists, read before and after the checks
//! that must not execute twice.

use super::evidence::truncate_body;
use super::exchange::id_of;
use super::prober::Prober;
use super::request::{Cred, Dest, Key, Probe};
use http::Method;

impl Prober {
    /// Reads the count URL with the first credential: the number of resources it lists.
    ///
    /// Accepted shapes: a JSON array; an object with a numeric `count`, `total`, `total_count`
    /// or `totalCount`; an object with an array under `data`, `items` or `results`.
    pub(crate) async fn count(&self) -> Option<Result<Counted, String>> {
        self.count_as(Cred::First).await.map(|r| r.map(|(c, _)| c))
    }

    /// Reads the count URL with `cred`: the count and the ids listed (when the listing is an
    /// array of objects with `id`s).
    pub(crate) async fn count_as(
        &self,
        cred: Cred,
    ) -> Option<Result<(Counted, Vec<String>), String>> {
        let url = self.targets.count.clone()?;
        let p = Probe {
            method: Method::GET,
            dest: Dest::Url(url),
            key: Key::Absent,
            body: None,
            cred,
            cookies_of: cred,
            extra: Vec::new(),
        };
        Some(match self.send(&p).await {
            Err(e) => Err(format!("count URL: {e}")),
            Ok(ex) if !ex.status.is_success() => {
                Err(format!("count URL answered {}", ex.response_line()))
            }
            Ok(ex) => match serde_json::from_slice::<serde_json::Value>(&ex.body)
                .ok()
                .as_ref()
                .and_then(count_in)
            {
                Some(n) => Ok((
                    Counted {
                        n,
                        evidence: match cred {
                            Cred::First => format!("count URL: {n} resource(s)"),
                            c => format!("count URL read with the {}: {n} resource(s)", c.label()),
                        },
                    },
                    ex.json().map(|v| ids_in(&v)).unwrap_or_default(),
                )),
                None => Err(format!(
                    "count URL body has no recognisable count: {}",
                    truncate_body(&ex.body)
                )),
            },
        })
    }
}

/// A count-URL reading.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    pub(crate) n: u64,
    pub(crate) evidence: String,
}

/// The count a listing states (`count`, `total`, `total_count`, `totalCount`) or the length of
/// the array it is or holds (`data`, `items`, `results`).
pub(super) fn count_in(v: &serde_json::Value) -> Option<u64> {
    if let Some(a) = v.as_array() {
        return Some(a.len() as u64);
    }
    let o = v.as_object()?;
    for k in ["count", "total", "total_count", "totalCount"] {
        if let Some(n) = o.get(k).and_then(serde_json::Value::as_u64) {
            return Some(n);
        }
    }
    for k in ["data", "items", "results"] {
        if let Some(a) = o.get(k).and_then(serde_json::Value::as_array) {
            return Some(a.len() as u64);
        }
    }
    None
}

/// The `id`s of the objects a listing holds (a JSON array, or one under `data` / `items` /
/// `results`).
pub(super) fn ids_in(v: &serde_json::Value) -> Vec<String> {
    let list = v.as_array().or_else(|| {
        ["data", "items", "results"]
            .iter()
            .find_map(|k| v.get(*k).and_then(serde_json::Value::as_array))
    });
    list.map(|a| a.iter().filter_map(id_of).collect())
        .unwrap_or_default()
}
