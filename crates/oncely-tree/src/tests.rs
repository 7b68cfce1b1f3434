//! The rules of the crate's documentation, each on a small tree of its own.

use super::*;

fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

fn problems(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tree(files);
    scan(dir.path())
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect()
}

const DOCS: (&str, &str) = (
    "book/DESIGN.md",
    "# Design\n\n## The claim\n\n```sh\n# not a heading\n```\n\n## Update (round 2): fewer\n",
);

#[test]
fn paths_from_the_root_must_exist() {
    // The workspace's folder, built at run time so that this file names no path outside.
    let outside = format!("{OUTSIDE}/cases/client.md");
    let text = format!(
        "//! See book/DESIGN.md and `book/GONE.md`; pkgs/a/src/lib.rs.\n\
         //! Patterns: `pkgs/a/src/<name>.rs`, book/history-*.md, pkgs/{{a,b}}, book/....\n\
         //! The workspace's `{outside}`; https://x.invalid/book/none.md.\n"
    );
    let found = problems(&[
        DOCS,
        ("pkgs/a/src/lib.rs", text.as_str()),
        ("pkgs/a/Cargo.toml", "[package]\n"),
    ]);
    assert_eq!(
        found,
        [
            "pkgs/a/src/lib.rs:1: names `book/GONE.md`, which is not in the tree".to_owned(),
            format!("pkgs/a/src/lib.rs:3: names `{outside}`, which is not in the tree"),
        ]
    );
}

#[test]
fn paths_from_the_package_must_exist_and_other_projects_paths_are_skipped() {
    let found = problems(&[
        ("pkgs/a/Cargo.toml", "[package]\n"),
        (
            "pkgs/a/examples/x.rs",
            "//! Drives `lib/lib.rs` and `lib/gone.rs`, as tokio's `runtime/time/mod.rs` does.\n",
        ),
        ("pkgs/a/lib/lib.rs", "//! A crate.\n"),
    ]);
    assert_eq!(
        found,
        ["pkgs/a/examples/x.rs:1: names `lib/gone.rs`, which is not in the tree"]
    );
}

#[test]
fn markdown_links_and_their_anchors_must_lead_somewhere() {
    let found = problems(&[
        DOCS,
        (
            "book/GUIDE.md",
            "# Guide\n\nSee [the claim](DESIGN.md#the-claim), [round 2](DESIGN.md#update-round-2-fewer),\n\
             [gone](GONE.md), [no anchor](DESIGN.md#the-lease), [here](#guide), [web](https://x.invalid/a.md).\n",
        ),
    ]);
    assert_eq!(
        found,
        [
            "book/GUIDE.md:4: names `GONE.md`, which is not in the tree",
            "book/GUIDE.md:4: links to `DESIGN.md#the-lease`, which is no heading there",
        ]
    );
}

#[test]
fn cited_headings_must_exist_even_over_two_comment_lines() {
    let found = problems(&[
        DOCS,
        (
            "pkgs/a/src/lib.rs",
            "//! The claim (book/DESIGN.md, \"The claim\"), a part (book/DESIGN.md, \"round 2\"),\n\
             //! over two lines (book/DESIGN.md, \"The\n\
             //! claim\"), and a heading that is gone (`book/DESIGN.md`, \"The lease\").\n\
             fn f() { let _ = \"book/DESIGN.md\"; let _ = \"not a citation\"; }\n",
        ),
    ]);
    assert_eq!(
        found,
        ["pkgs/a/src/lib.rs:3: cites book/DESIGN.md, \"The lease\", which has no such heading"]
    );
}

#[test]
fn issue_numbers_and_outside_cases_are_refused_but_in_the_history() {
    // Built at run time, so that this file itself says neither.
    let issue = format!("{} 11", "Issue");
    let case = format!("{} S3", "case");
    let text = format!("# {issue}: the transactional bench, {case}\n");
    let found = problems(&[
        ("book/NOTES.md", text.as_str()),
        ("docs/performance-history-2026-12.md", text.as_str()),
    ]);
    assert_eq!(
        found,
        [
            format!(
                "book/NOTES.md:1: cites \"{issue}\": cite a heading of a file in the repository instead"
            ),
            format!(
                "book/NOTES.md:1: cites \"{case}\": cite a heading of a file in the repository instead"
            ),
        ]
    );
}
