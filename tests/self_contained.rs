//! The repository stands alone: its code, comments, scripts and docs cite no document it does
//! not hold, such as a product contract by its name or an issue tracker's numbered entries.

use std::path::{Path, PathBuf};

#[path = "common/tree.rs"]
mod tree;

/// The files a reader of the repository reads: sources, tests, scripts and docs.
fn files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for dir in [
        "src", "tests", "lua", "docs", "bench", "benches", "pgo", "fuzz/src",
    ] {
        out.extend(tree::files(&root.join(dir)));
    }
    for file in [
        "README.md",
        "ARCHITECTURE.md",
        "BENCHMARKS.md",
        "RELIABILITY.md",
        "Dockerfile",
    ] {
        out.push(root.join(file));
    }
    out
}

/// Where `line` cites an outside document: the word `SPEC`, or `issue` followed by a number.
fn citation(line: &str) -> Option<&'static str> {
    if line
        .split(|c: char| !c.is_ascii_alphanumeric())
        .any(|w| w == "SPEC")
    {
        return Some("SPEC");
    }
    let lower = line.to_ascii_lowercase();
    let numbered = lower.match_indices("issue ").any(|(i, m)| {
        lower[i + m.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    });
    numbered.then_some("issue N")
}

/// No source, test, script or doc cites a document the repository does not hold.
#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let this = Path::new(file!()).file_name().expect("a file name");
    let mut found = Vec::new();
    for path in files() {
        if path.file_name() == Some(this) {
            continue;
        }
        // binary files (the PGO profile) are no reading matter
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(what) = citation(line) {
                found.push(format!(
                    "{}:{}: {what}: {}",
                    path.display(),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check sees what it looks for, and lets ordinary words and RFC sections be.
#[test]
fn citations_are_told_from_ordinary_text() {
    // (the citations are put together here, so that this file cites nothing itself)
    assert_eq!(citation(&format!("see {} §3.4", "SPEC")), Some("SPEC"));
    assert_eq!(
        citation(&format!("fixed in {} 12", "issue")),
        Some("issue N")
    );
    assert_eq!(
        citation(&format!("({} 5, point 2)", "Issue")),
        Some("issue N")
    );
    assert_eq!(citation("RFC 9112 §6.3"), None);
    assert_eq!(citation("an issue with the spec"), None);
    assert_eq!(citation("SPECIAL"), None);
}
