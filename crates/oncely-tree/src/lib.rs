//! # oncely-tree: checks of the repository's own tree
//!
//! A reader who clones the repository must be able to follow every pointer its documents and
//! comments give. [`scan`] reads every text file of the tree and returns a [`Finding`] for each
//! pointer that leads nowhere; `tests/references.rs` runs it on this repository and fails on any
//! finding, so `cargo test --workspace` (what `.ci/run` runs) keeps the tree honest.
//!
//! What counts as a pointer ([`Problem`] has one variant per rule):
//!
//! - **A path from the root**: a word that starts with one of the root's directories
//!   (`docs/`, `crates/`, `conformance/`, `sdks/`, `.ci/`, ...) or with the folder `shared`
//!   (the team's workspace beside the repository, which a clone does not have), bare or in
//!   backticks, must name a file or directory of the tree. A word followed by a placeholder
//!   (`<name>`, `{a,b}`, `*`, `...`) is a pattern, not a path, and is skipped.
//! - **A path from the package**: a backticked word whose first segment is a directory beside
//!   the file or in its package (the nearest folder with a `Cargo.toml`, `package.json` or
//!   `pyproject.toml`), such as `src/lib.rs` or `tests/references.rs` in this crate, must exist
//!   there. Words whose first segment is no directory of the package name another project's
//!   files (`runtime/time/mod.rs` in tokio's tree) and are skipped, as is build output
//!   (`target/...`).
//! - **A Markdown link** `[text](target)` must lead to a file, relative to the Markdown file;
//!   its `#anchor`, and a link to `#anchor` alone, must be a heading of the target (GitHub's
//!   anchors: lower case, punctuation dropped, spaces as `-`).
//! - **A cited heading**: `FILE.md, "Heading"` (also `FILE.md` `"Heading"`, `FILE.md (section
//!   "Heading")`) in a comment or a Markdown file must name a heading of that file; the quoted
//!   text may be the heading's start or any part of it (`"round 2"`), case aside.
//! - **No citation of what the repository does not hold**: no "issue" followed by a number and
//!   no "case S" followed by a number, anywhere but in the dated performance history
//!   (`docs/performance-history-*.md`), which records the rounds as they were named at the time.
//!
//! Skipped: `target/`, `.git/` and every other hidden directory but `.ci/`, `node_modules/`,
//! Python caches and virtual environments, lock files, and the shipped migrations (every
//! `migrations/` folder): a migration is never edited once shipped (sqlx checks each one's
//! checksum), so what its comments say stays as it was written.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use regex::Regex;

/// One pointer that leads nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// The file it is in, relative to the root, with `/` between segments.
    pub file: String,
    /// Its line, from 1.
    pub line: usize,
    /// What is wrong.
    pub problem: Problem,
}

/// What is wrong with a pointer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A path (as written) that is not in the tree.
    MissingPath(String),
    /// A Markdown link's `#anchor` (as written) that is no heading of its target.
    MissingAnchor(String),
    /// A cited heading that its file does not have.
    MissingHeading {
        /// The file, as written.
        file: String,
        /// The quoted heading.
        heading: String,
    },
    /// An issue number or a case of a list outside the repository, as written.
    OutsideCitation(String),
}

impl Problem {
    /// The pointer as written: the path, the link, the heading or the citation.
    pub fn text(&self) -> &str {
        match self {
            Self::MissingPath(s) | Self::MissingAnchor(s) | Self::OutsideCitation(s) => s,
            Self::MissingHeading { heading, .. } => heading,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file, self.line)?;
        match &self.problem {
            Problem::MissingPath(p) => write!(f, "names `{p}`, which is not in the tree"),
            Problem::MissingAnchor(a) => write!(f, "links to `{a}`, which is no heading there"),
            Problem::MissingHeading { file, heading } => {
                write!(f, "cites {file}, \"{heading}\", which has no such heading")
            }
            Problem::OutsideCitation(c) => write!(
                f,
                "cites \"{c}\": cite a heading of a file in the repository instead"
            ),
        }
    }
}

/// The extensions of the files read.
const TEXT: &[&str] = &[
    "md", "rs", "toml", "sh", "py", "ts", "js", "mjs", "json", "yaml", "yml", "proto", "sql", "txt",
];

/// Directories never entered (hidden ones, but `.ci`, are skipped too).
const SKIP_DIRS: &[&str] = &[
    "target",
    "node_modules",
    "__pycache__",
    "venv",
    "dist-newstyle",
];

/// Generated files, never read.
const SKIP_FILES: &[&str] = &["Cargo.lock", "package-lock.json", "uv.lock", "poetry.lock"];

/// The folder beside the repository that a clone does not have: a path into it is reported.
const OUTSIDE: &str = "shared";

/// The folder whose files are never read: shipped migrations are never edited.
const FROZEN: &str = "migrations";

/// The files the outside-citation rule leaves alone: the dated performance history.
fn is_history(rel: &str) -> bool {
    rel.strip_prefix("docs/")
        .is_some_and(|name| name.starts_with("performance-history-") && name.ends_with(".md"))
}

static OUTSIDE_CITATION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\bissues?\s+#?\d+|\bcases?\s+S\d+").expect("a regex"));
static LINK: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\]\(([^)\s]+)\)").expect("a regex"));
static TICKED: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"`([^`\n]+)`").expect("a regex"));
static HEADING: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^#{1,6}\s+(.*?)\s*#*\s*$").expect("a regex"));
static CITED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:^|[^\w./-])([\w./-]*[\w-]\.md)`?\)?[ ,(]*(?:(?:section|heading|under) )?["“]([^"”\n]+)["”]"#,
    )
    .expect("a regex")
});

/// Placeholder characters: a path followed by one is a pattern.
const PLACEHOLDER: &[char] = &['<', '{', '*', '$', '…', '['];

/// Scans the tree under `root` (the repository's top folder) and returns every finding, in
/// file order, then line order.
///
/// # Errors
///
/// The root cannot be listed; files that cannot be read as UTF-8 text are skipped.
pub fn scan(root: &Path) -> std::io::Result<Vec<Finding>> {
    let tops = top_dirs(root)?;
    let mut files = Vec::new();
    let walk = walkdir::WalkDir::new(root)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            let name = e.file_name().to_string_lossy();
            !(e.file_type().is_dir()
                && e.depth() > 0
                && ((name.starts_with('.') && name != ".ci")
                    || name == FROZEN
                    || SKIP_DIRS.contains(&name.as_ref())))
        });
    for entry in walk {
        let entry = entry.map_err(std::io::Error::other)?;
        if entry.file_type().is_file() && is_text(entry.path()) {
            files.push(entry.into_path());
        }
    }
    let mut tree = Tree {
        root: root.to_path_buf(),
        tops,
        headings: HashMap::new(),
    };
    let mut out = Vec::new();
    for path in files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        out.extend(tree.check_file(&path, &text));
    }
    Ok(out)
}

fn is_text(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    if SKIP_FILES.contains(&name.as_ref()) {
        return false;
    }
    match path.extension() {
        Some(ext) => TEXT.contains(&ext.to_string_lossy().as_ref()),
        // Scripts without an extension in `.ci/` (`.ci/run`).
        None => path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|d| d == ".ci"),
    }
}

/// The root's directories a path from the root may start with, and [`OUTSIDE`].
fn top_dirs(root: &Path) -> std::io::Result<Vec<String>> {
    let mut tops = vec![OUTSIDE.to_owned()];
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir()
            && !SKIP_DIRS.contains(&name.as_str())
            && (!name.starts_with('.') || name == ".ci")
        {
            tops.push(name);
        }
    }
    Ok(tops)
}

struct Tree {
    root: PathBuf,
    tops: Vec<String>,
    /// Per Markdown file, its headings (outside code fences), as written.
    headings: HashMap<PathBuf, Vec<String>>,
}

impl Tree {
    fn check_file(&mut self, path: &Path, text: &str) -> Vec<Finding> {
        let rel = path
            .strip_prefix(&self.root)
            .unwrap_or(path)
            .to_string_lossy()
            .replace('\\', "/");
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        let package = package_root(&self.root, &dir);
        let markdown = path.extension().is_some_and(|e| e == "md");
        let mut out = Vec::new();
        let mut report = |line: usize, problem: Problem| {
            out.push(Finding {
                file: rel.clone(),
                line,
                problem,
            });
        };
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if !is_history(&rel) {
                for m in OUTSIDE_CITATION.find_iter(line) {
                    report(n, Problem::OutsideCitation(m.as_str().to_owned()));
                }
            }
            let mut seen = BTreeSet::new();
            for token in self.root_paths(line) {
                if seen.insert(token.clone()) && !self.root.join(strip_anchor(&token)).exists() {
                    report(n, Problem::MissingPath(token));
                }
            }
            for m in TICKED.captures_iter(line) {
                let token = m[1].trim();
                if seen.contains(token) || !looks_relative(token) {
                    continue;
                }
                let first = token.split('/').next().unwrap_or_default();
                // Build output (`target/...`) is made by the run, never kept in the tree.
                let base = [&dir, &package].into_iter().find(|b| {
                    !first.is_empty() && !SKIP_DIRS.contains(&first) && b.join(first).is_dir()
                });
                if let Some(base) = base
                    && seen.insert(token.to_owned())
                    && !base.join(strip_anchor(token)).exists()
                {
                    report(n, Problem::MissingPath(token.to_owned()));
                }
            }
            if markdown {
                for m in LINK.captures_iter(line) {
                    if let Some(problem) = self.check_link(path, &dir, &m[1]) {
                        report(n, problem);
                    }
                }
            }
        }
        for (n, file, heading) in citations(path, text) {
            let Some(target) = self.resolve_md(&file, &dir, &package) else {
                continue;
            };
            let wanted = normalize(&heading);
            if wanted.is_empty() || heading.contains('<') {
                continue;
            }
            if !self
                .headings_of(&target)
                .iter()
                .any(|h| normalize(h).contains(&wanted))
            {
                report(n, Problem::MissingHeading { file, heading });
            }
        }
        out.sort_by_key(|f| f.line);
        out
    }

    /// The words of `line` that are paths from the root (see the crate's documentation).
    fn root_paths(&self, line: &str) -> Vec<String> {
        let mut out = Vec::new();
        let bytes = line.as_bytes();
        let mut i = 0;
        while i < line.len() {
            let starts_word = i == 0 || !is_path_char(char::from(bytes[i - 1]));
            let top = self.tops.iter().find(|t| {
                line[i..].starts_with(t.as_str()) && line[i + t.len()..].starts_with('/')
            });
            let (true, Some(_)) = (starts_word, top) else {
                i += line[i..].chars().next().map_or(1, char::len_utf8);
                continue;
            };
            let end = line[i..]
                .find(|c: char| !is_path_char(c))
                .map_or(line.len(), |e| i + e);
            let after = &line[end..];
            let token = line[i..end].trim_end_matches(['.', ',', ':', ';']);
            if !(after.starts_with(PLACEHOLDER)
                || after.starts_with("...")
                || token.contains("..."))
            {
                out.push(token.to_owned());
            }
            i = end.max(i + 1);
        }
        out
    }

    fn check_link(&mut self, file: &Path, dir: &Path, target: &str) -> Option<Problem> {
        if target.contains(':') || target.contains(PLACEHOLDER) {
            return None; // a URL (`https:`, `mailto:`), or a pattern
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target, None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        if !resolved.exists() {
            return Some(Problem::MissingPath(target.to_owned()));
        }
        let anchor = anchor.filter(|a| !a.is_empty())?;
        if resolved.extension().is_some_and(|e| e == "md")
            && !anchors(self.headings_of(&resolved)).contains(anchor)
        {
            return Some(Problem::MissingAnchor(target.to_owned()));
        }
        None
    }

    /// The Markdown file a citation names: from the root when it starts with one of the root's
    /// directories, else beside the citing file, in its package, at the root, in `docs/`.
    fn resolve_md(&self, file: &str, dir: &Path, package: &Path) -> Option<PathBuf> {
        let first = file.split('/').next().unwrap_or_default();
        if file.contains('/') && self.tops.iter().any(|t| t == first) {
            let p = self.root.join(file);
            return p.is_file().then_some(p);
        }
        [
            dir.to_path_buf(),
            package.to_path_buf(),
            self.root.clone(),
            self.root.join("docs"),
        ]
        .into_iter()
        .map(|b| b.join(file))
        .find(|p| p.is_file())
    }

    fn headings_of(&mut self, path: &Path) -> &[String] {
        self.headings
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let mut fenced = false;
                let mut out = Vec::new();
                for line in text.lines() {
                    if line.trim_start().starts_with("```") {
                        fenced = !fenced;
                    } else if !fenced && let Some(c) = HEADING.captures(line) {
                        out.push(c[1].to_owned());
                    }
                }
                out
            })
            .as_slice()
    }
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

fn strip_anchor(token: &str) -> &str {
    token.split('#').next().unwrap_or(token)
}

/// A backticked word that may be a path from the package: one word of path characters with a
/// `/` in it, not absolute, not a URL, not a pattern.
fn looks_relative(token: &str) -> bool {
    token.contains('/')
        && !token.starts_with(['/', '.', '~'])
        && token.chars().all(|c| is_path_char(c) || c == '#')
}

/// The nearest folder from `dir` up to `root` with a package manifest; `root` if none.
fn package_root(root: &Path, dir: &Path) -> PathBuf {
    let mut d = dir;
    loop {
        if d == root
            || ["Cargo.toml", "package.json", "pyproject.toml"]
                .iter()
                .any(|m| d.join(m).is_file())
        {
            return d.to_path_buf();
        }
        match d.parent() {
            Some(p) if p.starts_with(root) => d = p,
            _ => return root.to_path_buf(),
        }
    }
}

/// Lower case, backticks dropped, white space collapsed, trailing punctuation dropped.
fn normalize(s: &str) -> String {
    let s = s.replace('`', "").to_lowercase();
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    s.trim_end_matches(['.', ',', ';', ':']).to_owned()
}

/// GitHub's anchors of `headings`: lower case, punctuation but `-` and `_` dropped, spaces as
/// `-`; a repeated heading's later anchors get `-1`, `-2`, ...
fn anchors(headings: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut count: HashMap<String, usize> = HashMap::new();
    for h in headings {
        let slug: String = h
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let n = count.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// The comment marker of a line of `path`'s kind, if the line is a comment (Markdown: every
/// line is prose); `None` for a line of code.
fn prose_of<'a>(path: &Path, line: &'a str) -> Option<&'a str> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().into_owned())
        .unwrap_or_default();
    let t = line.trim_start();
    let markers: &[&str] = match ext.as_str() {
        "md" => return Some(line),
        "rs" | "ts" | "js" | "mjs" | "proto" => &["//!", "///", "//", "/**", "/*", "*"],
        "sql" => &["--"],
        "json" => &[],
        _ => &["#"],
    };
    markers
        .iter()
        .find(|m| t.starts_with(**m))
        .map(|m| t[m.len()..].trim_start())
}

/// Every `FILE.md, "Heading"` citation in the comments of `text` (a citation may run over
/// several comment lines, never over a line of code): line, file as written, heading.
fn citations(path: &Path, text: &str) -> Vec<(usize, String, String)> {
    let mut prose = String::new();
    let mut starts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        match prose_of(path, line) {
            Some(p) if !p.trim().is_empty() => {
                starts.push((prose.len(), i + 1));
                prose.push_str(p);
                prose.push(' ');
            }
            _ => prose.push('\n'),
        }
    }
    CITED
        .captures_iter(&prose)
        .map(|c| {
            let at = c.get(1).map_or(0, |m| m.start());
            let line = match starts.binary_search_by_key(&at, |(o, _)| *o) {
                Ok(i) => starts[i].1,
                Err(i) => starts[i.saturating_sub(1)].1,
            };
            let heading = c[2].split_whitespace().collect::<Vec<_>>().join(" ");
            (line, c[1].to_owned(), heading)
        })
        .collect()
}

#[cfg(test)]
mod tests;
