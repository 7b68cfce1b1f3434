//! This repository against its own pointers (the rules: the crate's documentation): every path a
//! document or comment names is in the tree, every cited heading and linked anchor exists, and
//! nothing cites an issue number or a case of a list the repository does not hold.

use std::collections::BTreeSet;
use std::path::Path;

/// Findings in crates that other work was reorganizing when this check landed, left to it: each
/// line is (file, the pointer as written, cut in two by `concat!` so that this file does not say
/// it). The test fails on a line that no longer matches, so whoever fixes one deletes its line
/// here, and the list only shrinks; it is empty now.
const KNOWN: &[(&str, &str)] = &[];

#[test]
fn every_pointer_in_the_repository_leads_into_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().expect("the repository's root");
    let found = oncely_tree::scan(&root).expect("the tree can be listed");
    let known: BTreeSet<(&str, &str)> = KNOWN.iter().copied().collect();
    let new: Vec<String> = found
        .iter()
        .filter(|f| !known.contains(&(f.file.as_str(), f.problem.text())))
        .map(ToString::to_string)
        .collect();
    let stale: Vec<String> = known
        .iter()
        .filter(|(file, text)| {
            !found
                .iter()
                .any(|f| f.file == *file && f.problem.text() == *text)
        })
        .map(|(file, text)| format!("{file}: {text}"))
        .collect();
    assert!(
        new.is_empty() && stale.is_empty(),
        "{} pointers lead nowhere:\n{}\n\n{} lines of KNOWN match nothing any more (delete them):\n{}",
        new.len(),
        new.join("\n"),
        stale.len(),
        stale.join("\n")
    );
}
