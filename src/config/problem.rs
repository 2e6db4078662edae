//! What the config layer reports: a [`Problem`] at a file position with a key path, and the
//! [`ConfigError`] that carries every problem of a file at once.
//!
//! Inside the layer, problems are first collected as [`Pending`] (a key path and whether the key
//! or its value is meant); [`super::locate`] turns the path into a line and column at the end, so
//! that validation code never has to carry positions around.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// The text a null key (`~: x`) reads as: in paths, and when a problem is located.
pub(crate) const KEY_NULL: &str = "null";

/// One problem at a position in the file.
///
/// Displays as `FILE:LINE:COLUMN: KEY.PATH: message`, for example
/// `proxy.yaml:31:15: routes[0].limits[1].rate: expected N/unit such as 10/s, found "ten"`
/// (the key path is left out for problems that concern no key, such as YAML syntax errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// the file name as given to [`super::parse`] or [`super::load`]
    pub file: String,
    /// 1-based line
    pub line: usize,
    /// 1-based column
    pub column: usize,
    /// the key path, such as `routes[0].limits[1].rate`; empty when no key is concerned
    pub path: String,
    /// what is wrong, lowercase, without a trailing period
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read (missing, unreadable, not UTF-8).
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// the file asked for
        path: PathBuf,
        /// what the operating system said
        source: io::Error,
    },
    /// The file was read but is not a valid configuration: every problem found, in file order.
    #[error("{}", ProblemList(.0))]
    Invalid(Vec<Problem>),
}

/// Displays problems one per line.
struct ProblemList<'a>(&'a [Problem]);

impl fmt::Display for ProblemList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

/// Problems shown per check, and warnings apart: placing one reads the file again (see
/// `super::locate`), so a file with thousands (a route list pasted twice) would take minutes.
/// The first ones found are shown, the rest counted; nothing is located for a problem that will
/// not be shown.
pub(crate) const MAX_PROBLEMS: usize = 100;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Seg {
    /// a mapping key
    Key(String),
    /// a list index
    Index(usize),
}

/// A key path from the top of the file, such as `routes[0].limits[1].rate`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct Path(pub Vec<Seg>);

impl Path {
    /// The top of the file.
    pub fn root() -> Path {
        Path(Vec::new())
    }

    /// This path extended by a mapping key.
    pub fn key(&self, key: &str) -> Path {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_owned()));
        Path(segs)
    }

    /// This path extended by a list index.
    pub fn index(&self, index: usize) -> Path {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        Path(segs)
    }

    /// Whether `prefix` is this path or one of its ancestors.
    pub fn starts_with(&self, prefix: &Path) -> bool {
        self.0.starts_with(&prefix.0)
    }

    /// The parent path; the root is its own parent.
    pub fn parent(&self) -> Path {
        let mut segs = self.0.clone();
        segs.pop();
        Path(segs)
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Index(n) => write!(f, "[{n}]")?,
                // Keys that are user data (an override's key value, a header name) may hold
                // dots or spaces; quoting them keeps the path readable and unambiguous.
                Seg::Key(k) if !is_plain_key(k) => write!(f, "[{k:?}]")?,
                Seg::Key(k) if i == 0 => f.write_str(k)?,
                Seg::Key(k) => write!(f, ".{k}")?,
            }
        }
        Ok(())
    }
}

fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Which part of the entry at a path a problem points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum At {
    /// the value (for a missing key: the mapping that lacks it)
    Value,
    /// the key itself, in its n-th occurrence (0: the first; duplicates come later)
    Key(usize),
}

/// A problem before its position is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    /// where in the tree
    pub path: Path,
    /// the key or the value at `path`
    pub at: At,
    /// what is wrong
    pub message: String,
}

impl Pending {
    /// A problem with the value at `path`.
    pub fn value(path: Path, message: impl Into<String>) -> Pending {
        Pending {
            path,
            at: At::Value,
            message: message.into(),
        }
    }

    /// A problem with the key at `path` (its `occurrence`-th appearance).
    pub fn key(path: Path, occurrence: usize, message: impl Into<String>) -> Pending {
        Pending {
            path,
            at: At::Key(occurrence),
            message: message.into(),
        }
    }
}

/// `expected one of a, b or c, found "x"`, with a hint when `x` is a likely misspelling.
pub(crate) fn one_of(found: &str, expected: &[&str]) -> String {
    let mut message = format!("expected {}, found {found:?}", or_list(expected));
    if let Some(close) = closest(found, expected.iter().copied()) {
        message.push_str(&format!(" (did you mean {close:?}?)"));
    }
    message
}

/// `unknown key "x"`, with the likely intended key or else the keys allowed here.
pub(crate) fn unknown_key(key: &str, expected: &[&str]) -> String {
    match closest(key, expected.iter().copied()) {
        Some(close) => format!("unknown key {key:?} (did you mean {close:?}?)"),
        None => format!("unknown key {key:?}; expected {}", or_list(expected)),
    }
}

/// `a`, `a or b`, `a, b or c`.
pub(crate) fn or_list(items: &[&str]) -> String {
    match items {
        [] => "nothing".to_owned(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The closest of `candidates` to `word`, if it is close enough to be a likely misspelling.
pub(crate) fn closest<'c>(
    word: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    // The distance table is the product of the lengths, and both may be the user's (a route's
    // `upstream` against the upstream names): a 100 KB value took 800 MB. A long word is no typo.
    if word.len() > 128 {
        return None;
    }
    let word = word.to_ascii_lowercase();
    let len = word.chars().count();
    // A third of the word's length (at least one edit, at most three) separates typos
    // (`burts`, `windw`, `path-prefix`) from different words (`rate` vs `mode`).
    let budget = (len / 3).clamp(1, 3);
    candidates
        .into_iter()
        // The distance is at least the difference in length: skip the table when that is over.
        .filter(|c| c.chars().count().abs_diff(len) <= budget)
        .map(|c| (edit_distance(&word, &c.to_ascii_lowercase()), c))
        .filter(|&(d, _)| d <= budget)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// Levenshtein distance, with a swap of two neighbours counted as one edit (`burts`/`burst`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j]
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}
