//! The examples of README.md and docs/*.md run as the reader would run them: each marked
//! `console` block against the real binary, a real Redis and a real upstream (see
//! tests/common/docs.rs for the convention). A drifted example fails with its file and line.

mod common;

use common::docs::{self, Block};

const PAGES: [&str; 4] = [
    "README.md",
    "docs/algorithms.md",
    "docs/configuration.md",
    "docs/operations.md",
];

/// Every `sh` or `console` block of the docs is marked as run, or says why it is not.
#[test]
fn every_runnable_block_is_marked() {
    let problems: Vec<String> = PAGES.iter().flat_map(|p| docs::blocks(p).1).collect();
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// Each marked block prints what the doc shows. Blocks run two at a time, each with its own
/// Redis and ports.
#[test]
fn marked_blocks_print_what_the_docs_show() {
    let blocks: Vec<Block> = PAGES.iter().flat_map(|p| docs::blocks(p).0).collect();
    assert!(blocks.len() >= 10, "only {} marked blocks", blocks.len());
    let (left, right) = blocks.split_at(blocks.len() / 2);
    let problems: Vec<String> = std::thread::scope(|s| {
        let other = s.spawn(|| right.iter().flat_map(docs::check).collect::<Vec<_>>());
        let mut mine: Vec<String> = left.iter().flat_map(docs::check).collect();
        mine.extend(other.join().expect("a checking thread"));
        mine
    });
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// The matcher: `[..]` within a line, `...` for any number of lines, nothing else loose.
#[test]
fn wildcards_match_only_what_they_say() {
    let v = |s: &[&str]| s.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    assert!(docs::matches(&v(&["a [..] c"]), &v(&["a b c"])));
    assert!(!docs::matches(&v(&["a [..] c"]), &v(&["a b d"])));
    assert!(docs::matches(&v(&["a", "...", "z"]), &v(&["a", "z"])));
    assert!(docs::matches(
        &v(&["a", "...", "z"]),
        &v(&["a", "b", "c", "z"])
    ));
    assert!(!docs::matches(&v(&["a", "z"]), &v(&["a", "b", "z"])));
    assert!(!docs::matches(&v(&["a"]), &v(&["a", "b"])));
    assert_eq!(
        docs::swap_port("curl localhost:8080/ 18080", 8080, 41234),
        "curl localhost:41234/ 18080"
    );
}
