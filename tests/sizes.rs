//! The code stays in pieces a reader can hold: no file in `src/` runs past 800 lines before its
//! tests, and no function past 80 lines unless a `// Long:` comment above it says why.

use std::path::{Path, PathBuf};

#[path = "common/tree.rs"]
mod tree;

/// The most lines a file in `src/` may hold before its tests.
const FILE_LINES: usize = 800;

/// The most lines a function may span, from its `fn` line to its closing brace.
const FN_LINES: usize = 80;

/// The comment that lets a function run long; the reason follows it on the same line.
const REASON: &str = "// Long:";

/// The source files under `src/`, without the files that only hold tests.
fn sources() -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    tree::files(&src)
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .filter(|path| {
            let inside = path.strip_prefix(&src).expect("under src");
            !inside
                .iter()
                .any(|part| part == "tests" || part == "tests.rs")
        })
        .collect()
}

/// The lines of a file before its trailing `#[cfg(test)] mod tests { … }`, or all of them when
/// its tests live in another file.
fn before_tests(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0] == "#[cfg(test)]" && w[1].starts_with("mod tests {"))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Whether `line` opens a function: `fn name` after optional qualifiers.
fn opens_fn(line: &str) -> bool {
    let mut words = line.split_whitespace();
    for word in words.by_ref() {
        match word {
            "pub" | "async" | "const" | "unsafe" | "default" => continue,
            w if w.starts_with("pub(") => continue,
            "extern" => continue,
            w if w.starts_with('"') => continue,
            "fn" => return true,
            _ => return false,
        }
    }
    false
}

/// Whether the comments and attributes just above line `at` give a reason to run long.
fn has_reason(lines: &[&str], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .map(|l| l.trim_start())
        .take_while(|l| l.starts_with("//") || l.starts_with("#["))
        .any(|l| l.starts_with(REASON))
}

/// Each function in `lines` longer than `FN_LINES` without a reason: its line and its length.
fn long_functions(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        if !opens_fn(line) {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        // a body on the `fn` line itself, or none at all (a trait item), is short
        if line.trim_end().ends_with('}') || line.trim_end().ends_with(';') {
            continue;
        }
        let close = lines[at + 1..].iter().position(|l| {
            l.len() - l.trim_start().len() == indent && l.trim_start().starts_with('}')
        });
        let Some(close) = close else { continue };
        let length = close + 2;
        if length > FN_LINES && !has_reason(lines, at) {
            found.push((at + 1, length));
        }
    }
    found
}

/// What in one file breaks a limit, as `path:line: what`.
fn offences(path: &Path, text: &str) -> Vec<String> {
    let lines = before_tests(text);
    let mut found = Vec::new();
    if lines.len() > FILE_LINES {
        found.push(format!(
            "{}:1: {} lines before its tests, over {FILE_LINES}",
            path.display(),
            lines.len()
        ));
    }
    for (line, length) in long_functions(&lines) {
        found.push(format!(
            "{}:{line}: a function of {length} lines, over {FN_LINES}, without `{REASON}`",
            path.display()
        ));
    }
    found
}

/// No file in `src/` and no function in it outgrows what a reader can hold.
#[test]
fn no_file_or_function_outgrows_a_reader() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for path in sources() {
        let text = std::fs::read_to_string(&path).expect("a source file is text");
        let shown = path.strip_prefix(root).unwrap_or(&path);
        found.extend(offences(shown, &text));
    }
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// A long file, a long function and a long function with a reason are told apart.
#[test]
fn the_check_sees_long_code_and_reasons() {
    let body = "    x += 1;\n".repeat(FN_LINES);
    let long = format!("fn long() {{\n{body}}}\n");
    let found = offences(Path::new("a.rs"), &long);
    assert_eq!(
        found,
        [format!(
            "a.rs:1: a function of {} lines, over {FN_LINES}, without `{REASON}`",
            FN_LINES + 2
        )]
    );

    let excused = format!("{REASON} one arm per metric\n/// Adds.\npub fn long() {{\n{body}}}\n");
    assert!(offences(Path::new("a.rs"), &excused).is_empty());

    let nested = format!(
        "impl A {{\n    pub(crate) async fn long(\n        &self,\n    ) {{\n{body}    }}\n}}\n"
    );
    assert_eq!(offences(Path::new("a.rs"), &nested).len(), 1);

    let short = "fn short() {\n    x += 1;\n}\n";
    assert!(offences(Path::new("a.rs"), short).is_empty());

    let file = "const A: u8 = 1;\n".repeat(FILE_LINES + 1);
    assert_eq!(offences(Path::new("a.rs"), &file).len(), 1);

    let tested = format!(
        "{}#[cfg(test)]\nmod tests {{\n{}}}\n",
        "const A: u8 = 1;\n".repeat(FILE_LINES - 1),
        "    fn t() {}\n".repeat(50)
    );
    assert!(offences(Path::new("a.rs"), &tested).is_empty());
}
