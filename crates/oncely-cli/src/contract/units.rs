//! Durations as the contract writes them for a person.

use std::time::Duration;

/// `d` in words: `500 ms`, `1 second`, `30 seconds`, `24 hours (86400 seconds)`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    if d.subsec_millis() != 0 || s == 0 {
        format!("{} ms", d.as_millis())
    } else if s.is_multiple_of(3600) {
        let h = s / 3600;
        format!("{h} hour{} ({s} seconds)", if h == 1 { "" } else { "s" })
    } else if s == 1 {
        "1 second".to_owned()
    } else {
        format!("{s} seconds")
    }
}
