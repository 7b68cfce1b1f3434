//! What a Redis node keeps across a restart ([`Persistence`]), classified from its settings.
//! Reading the settings from the nodes is `durability.rs`'s.

/// What one Redis node keeps across a restart, read at connect time with `CONFIG GET
/// appendonly`, `CONFIG GET appendfsync` and `CONFIG GET save` (or, where `CONFIG` is refused,
/// the `aof_enabled` line of `INFO persistence`).
///
/// A Redis that keeps nothing forgets every idempotency key on restart: a client's retry across
/// the restart finds no record and the request executes again (a measured run of 20,000 payments
/// with one restart gave 27 duplicate payments; none with `appendonly yes`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Persistence {
    /// `appendonly yes`, `appendfsync always`: every acknowledged write is on disk first.
    AppendOnlyAlways,
    /// `appendonly yes`, `appendfsync everysec` (Redis's default): a crash of the machine or
    /// of the process can lose up to about one second of acknowledged writes.
    AppendOnlyEverySec,
    /// `appendonly yes`, `appendfsync no`: the operating system decides when to write (on
    /// Linux typically within 30 seconds); a machine crash loses that much.
    AppendOnlyNoFsync,
    /// The append-only file is on, but the fsync policy could not be read.
    AppendOnlyUnknownFsync,
    /// `appendonly no` with RDB snapshot rules (the `save` value): a restart loses every write
    /// since the last snapshot.
    SnapshotsOnly(String),
    /// `appendonly no` and `save ""`: a restart loses every record.
    Nothing,
    /// `CONFIG` was refused and `INFO persistence` shows the append-only file off, so whether
    /// snapshots are taken is unknown. Treated like [`Persistence::Nothing`].
    Unconfirmed(String),
}

impl Persistence {
    /// Whether a restart can lose every record (so the store refuses it unless
    /// [`RedisConfig::accept_volatile`](crate::RedisConfig::accept_volatile) is set).
    pub fn keeps_nothing(&self) -> bool {
        matches!(self, Self::Nothing | Self::Unconfirmed(_))
    }

    /// What a restart can lose, for a warning; `None` when nothing acknowledged is lost.
    pub fn warning(&self) -> Option<String> {
        match self {
            Self::AppendOnlyAlways => None,
            Self::AppendOnlyEverySec => Some(
                "appendfsync everysec: a crash can lose up to about 1 second of acknowledged records (claims and stored responses); a retry of a lost one executes again (a split store's progress ledger still replays it or answers a mismatch). Use appendfsync always, or replicas with wait_replicas, to close that window".into(),
            ),
            Self::AppendOnlyNoFsync => Some(
                "appendfsync no: a machine crash can lose the acknowledged records the operating system had not written yet (typically up to 30 seconds)".into(),
            ),
            Self::AppendOnlyUnknownFsync => Some(
                "the append-only file is on but appendfsync could not be read; a crash can lose up to the fsync interval of records".into(),
            ),
            Self::SnapshotsOnly(rules) => Some(format!(
                "RDB snapshots only (save \"{rules}\"), no append-only file: a restart loses every record written since the last snapshot"
            )),
            Self::Nothing | Self::Unconfirmed(_) => Some(format!("{self}")),
        }
    }
}

impl std::fmt::Display for Persistence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AppendOnlyAlways => {
                f.write_str("keeps every write (appendonly yes, appendfsync always)")
            }
            Self::AppendOnlyEverySec => f.write_str(
                "keeps writes up to the last second (appendonly yes, appendfsync everysec)",
            ),
            Self::AppendOnlyNoFsync => {
                f.write_str("keeps what the OS wrote (appendonly yes, appendfsync no)")
            }
            Self::AppendOnlyUnknownFsync => {
                f.write_str("keeps an append-only file (appendfsync unknown)")
            }
            Self::SnapshotsOnly(rules) => write!(
                f,
                "keeps RDB snapshots only (appendonly no, save \"{rules}\")"
            ),
            Self::Nothing => f.write_str("persists nothing (appendonly no, save \"\")"),
            Self::Unconfirmed(why) => write!(
                f,
                "could not confirm any persistence (CONFIG GET refused: {why}; INFO persistence shows aof_enabled:0)"
            ),
        }
    }
}

/// Classifies one node from its `CONFIG GET` answers.
pub(crate) fn classify(
    appendonly: Option<&str>,
    appendfsync: Option<&str>,
    save: Option<&str>,
) -> Persistence {
    if appendonly == Some("yes") {
        return match appendfsync {
            Some("always") => Persistence::AppendOnlyAlways,
            Some("everysec") => Persistence::AppendOnlyEverySec,
            Some("no") => Persistence::AppendOnlyNoFsync,
            _ => Persistence::AppendOnlyUnknownFsync,
        };
    }
    match save.map(str::trim) {
        Some("") | None => Persistence::Nothing,
        Some(rules) => Persistence::SnapshotsOnly(rules.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(
            classify(Some("no"), Some("everysec"), Some("")),
            Persistence::Nothing
        );
        assert!(classify(Some("no"), None, Some("")).keeps_nothing());
        assert_eq!(
            classify(Some("no"), Some("everysec"), Some("3600 1 300 100")),
            Persistence::SnapshotsOnly("3600 1 300 100".into())
        );
        assert_eq!(
            classify(Some("yes"), Some("everysec"), Some("")),
            Persistence::AppendOnlyEverySec
        );
        assert_eq!(
            classify(Some("yes"), Some("always"), None),
            Persistence::AppendOnlyAlways
        );
        assert_eq!(
            classify(Some("yes"), Some("no"), None),
            Persistence::AppendOnlyNoFsync
        );
        assert!(Persistence::AppendOnlyAlways.warning().is_none());
        assert!(
            Persistence::AppendOnlyEverySec
                .warning()
                .unwrap()
                .contains("1 second")
        );
        assert!(!Persistence::SnapshotsOnly("1 1".into()).keeps_nothing());
        assert!(Persistence::Unconfirmed("NOPERM".into()).keeps_nothing());
    }
}
