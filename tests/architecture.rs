//! ARCHITECTURE.md's module rules hold. Its "Module rules" tables are the source: which modules
//! each top-level module may use, and where some crates may appear. This test reads every
//! `crate::`, `super::` and `self::` path in `src/` (`tollgate::` in `main.rs`), and fails on a
//! use the tables do not allow, on a row whose module is gone, on a module without a row, and on
//! any cycle between modules or between files. It also checks that every `src/` file the code map
//! names exists.
//!
//! Test code is left out: a `#[cfg(test)]` item, and the files of a `#[cfg(test)] mod`. The rules
//! are about what the built proxy depends on, and a test may reach further to set its case up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "common/tree.rs"]
mod tree;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One path a file names, resolved from the crate root, at the line of its last segment.
#[derive(Debug, Clone)]
struct Use {
    line: usize,
    path: Vec<String>,
}

/// A source file: where it is, the module path it defines, and what it names.
struct Source {
    /// `src/proxy/h1/head.rs`
    name: String,
    /// `["proxy", "h1", "head"]`; empty for `lib.rs`, `["main"]` for `main.rs`
    module: Vec<String>,
    uses: Vec<Use>,
    /// crate name and line of each use of another crate
    crates: Vec<(String, usize)>,
}

impl Source {
    /// The top-level module this file belongs to: `lib` for the crate root.
    fn top(&self) -> &str {
        self.module.first().map_or("lib", String::as_str)
    }
}

/// The module path a file under `src/` defines.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    match stem {
        "mod" => {}
        "lib" if parts.is_empty() => {}
        _ => parts.push(stem.to_string()),
    }
    parts
}

/// `text` with comments, strings and character literals blanked, lines kept, so that only code
/// is scanned and line numbers still hold.
fn code_only(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if (b[i] == b'r' || (b[i] == b'b' && rest.get(1) == Some(&b'r')))
            && (i == 0 || !ident(b[i - 1]))
            && {
                let start = if b[i] == b'b' { i + 2 } else { i + 1 };
                let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
                b.get(start + hashes) == Some(&b'"')
            }
        {
            let start = if b[i] == b'b' { i + 2 } else { i + 1 };
            let hashes = b[start..].iter().take_while(|&&c| c == b'#').count();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = start + hashes + 1;
            let end = b[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(b.len(), |n| body + n + close.len());
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, (j + 1).min(b.len()));
            i = j + 1;
        } else if b[i] == b'\'' {
            // a character literal, not a lifetime: 'x' or an escape
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|n| i + 2 + n + 1)
            } else {
                let width = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + width) == Some(&b'\'')).then_some(i + 2 + width)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The end of the item that starts at `from`: past its first `;` or its block's closing brace.
fn item_end(code: &[u8], from: usize) -> usize {
    let mut depth = 0usize;
    let mut i = from;
    while i < code.len() {
        match code[i] {
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    code.len()
}

/// Whether the attribute at the start of `code` is `#[cfg(test)]` or `#[cfg(all(test, ..))]`;
/// its length if so.
fn test_only(code: &[u8]) -> Option<usize> {
    let end = code.iter().position(|&c| c == b']')? + 1;
    let attr: String = String::from_utf8_lossy(&code[..end])
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    let first = attr.strip_prefix("#[cfg(")?;
    let first = first.strip_prefix("all(").unwrap_or(first);
    (first.starts_with("test)") || first.starts_with("test,")).then_some(end)
}

/// Blanks every test-only item of `code`; returns the names of the `mod x;` among them.
fn drop_test_code(code: &mut [u8]) -> Vec<String> {
    let mut test_mods = Vec::new();
    let marker = b"#[cfg(";
    let mut i = 0;
    while let Some(n) = code[i..].windows(marker.len()).position(|w| w == marker) {
        let start = i + n;
        let Some(len) = test_only(&code[start..]) else {
            i = start + marker.len();
            continue;
        };
        let end = item_end(code, start + len);
        let item = String::from_utf8_lossy(&code[start + len..end]).into_owned();
        let words: Vec<&str> = item
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ';'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(at) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(at + 1) {
                if let Some(name) = name.strip_suffix(';') {
                    test_mods.push(name.to_string());
                } else if words.get(at + 2) == Some(&";") {
                    test_mods.push(name.to_string());
                }
            }
        }
        for c in &mut code[start..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        i = end;
    }
    test_mods
}

/// Reads tokens of a path tree: identifiers, `::`, `{`, `}`, `,`, `*`.
struct Tokens<'a> {
    code: &'a [u8],
    at: usize,
    /// where each line break is
    lines: &'a [usize],
}

impl Tokens<'_> {
    fn skip_space(&mut self) {
        while self.at < self.code.len() && self.code[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }

    fn line(&self) -> usize {
        1 + self.lines.partition_point(|&n| n < self.at)
    }

    fn eat(&mut self, what: &[u8]) -> bool {
        self.skip_space();
        if self.code[self.at..].starts_with(what) {
            self.at += what.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let start = self.at;
        while self.at < self.code.len()
            && (self.code[self.at].is_ascii_alphanumeric() || self.code[self.at] == b'_')
        {
            self.at += 1;
        }
        (self.at > start).then(|| String::from_utf8_lossy(&self.code[start..self.at]).into_owned())
    }

    /// Reads the rest of a path after `prefix`, into one leaf per path in the tree.
    fn tree(&mut self, prefix: Vec<String>, out: &mut Vec<(Vec<String>, usize)>) {
        let mut path = prefix;
        loop {
            let line = self.line();
            if !self.eat(b"::") {
                out.push((path, line));
                let back = self.at;
                if self.ident().as_deref() == Some("as") {
                    self.ident();
                } else {
                    self.at = back;
                }
                return;
            }
            if self.eat(b"{") {
                loop {
                    if self.eat(b"}") {
                        return;
                    }
                    if self.eat(b"*") {
                        out.push((path.clone(), self.line()));
                    } else if let Some(first) = self.ident() {
                        let mut inner = path.clone();
                        if first != "self" {
                            inner.push(first);
                        }
                        self.tree(inner, out);
                    } else {
                        return;
                    }
                    // a `,` goes on to the next tree; a `}`, or anything else, ends the group
                    if !self.eat(b",") {
                        self.eat(b"}");
                        return;
                    }
                }
            }
            if self.eat(b"*") {
                out.push((path, self.line()));
                return;
            }
            let line = self.line();
            match self.ident() {
                Some(segment) => path.push(segment),
                None => {
                    out.push((path, line));
                    return;
                }
            }
        }
    }
}

/// Every path in `code` that starts at one of `roots`, as written, with its line.
fn paths_from(code: &[u8], roots: &[&str]) -> Vec<(Vec<String>, usize)> {
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let lines: Vec<usize> = (0..code.len()).filter(|&n| code[n] == b'\n').collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if !is_ident(code[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < code.len() && is_ident(code[i]) {
            i += 1;
        }
        let word = std::str::from_utf8(&code[start..i]).expect("ASCII");
        let before = code[..start]
            .iter()
            .rev()
            .find(|c| !c.is_ascii_whitespace())
            .copied();
        // `$crate`, and a segment in the middle of a path, start nothing
        let fresh = before != Some(b'$') && before != Some(b':') && before != Some(b'.');
        if fresh && roots.contains(&word) {
            let mut tokens = Tokens {
                code,
                at: i,
                lines: &lines,
            };
            if tokens.eat(b"::") {
                tokens.at = i;
                let mut found = Vec::new();
                tokens.tree(vec![word.to_string()], &mut found);
                i = tokens.at;
                out.extend(found);
            }
        }
    }
    out
}

/// `path`, written in the file of `module`, from the crate root; `None` for another crate's.
fn resolve(module: &[String], path: &[String], in_main: bool) -> Option<Vec<String>> {
    let (first, rest) = path.split_first()?;
    let mut base: Vec<String> = match first.as_str() {
        "crate" if in_main => return None,
        "crate" => Vec::new(),
        "tollgate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().saturating_sub(1)].to_vec(),
        _ => return None,
    };
    let mut rest = rest;
    while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
        base.pop();
        rest = tail;
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The sources, read once for all the tests of this file.
fn read_sources() -> &'static [Source] {
    static SOURCES: std::sync::OnceLock<Vec<Source>> = std::sync::OnceLock::new();
    SOURCES.get_or_init(scan_sources)
}

fn scan_sources() -> Vec<Source> {
    let src = root().join("src");
    let files: Vec<PathBuf> = tree::files(&src)
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect();
    let mut texts = BTreeMap::new();
    let mut test_dirs: Vec<Vec<String>> = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let module = if relative == Path::new("main.rs") {
            vec!["main".to_string()]
        } else {
            module_of(relative)
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        let mut code = code_only(&text);
        for name in drop_test_code(&mut code) {
            let mut m = module.clone();
            m.push(name);
            test_dirs.push(m);
        }
        texts.insert(relative.to_path_buf(), (module, code));
    }
    let crates = external_crates();
    let mut out = Vec::new();
    for (relative, (module, code)) in texts {
        if test_dirs.iter().any(|t| module.starts_with(t)) {
            continue;
        }
        let in_main = module == ["main"];
        let roots: &[&str] = if in_main {
            &["tollgate", "self", "super"]
        } else {
            &["crate", "self", "super"]
        };
        let uses = paths_from(&code, roots)
            .into_iter()
            .filter_map(|(path, line)| {
                resolve(&module, &path, in_main).map(|path| Use { line, path })
            })
            .collect();
        let names: Vec<&str> = crates.iter().map(String::as_str).collect();
        let crates = paths_from(&code, &names)
            .into_iter()
            .map(|(path, line)| (path[0].clone(), line))
            .chain(
                names
                    .iter()
                    .flat_map(|c| used_bare(&code, c).into_iter().map(|l| (c.to_string(), l))),
            )
            .collect();
        out.push(Source {
            name: format!("src/{}", relative.display()),
            module,
            uses,
            crates,
        });
    }
    out
}

/// Lines where `use NAME;` or `use NAME as ...` names a whole crate.
fn used_bare(code: &[u8], name: &str) -> Vec<usize> {
    let text = String::from_utf8_lossy(code);
    text.lines()
        .enumerate()
        .filter_map(|(n, l)| {
            let rest = l.trim().strip_prefix("use ")?.strip_prefix(name)?;
            (rest == ";" || rest.starts_with(" as ")).then_some(n + 1)
        })
        .collect()
}

/// The crates Cargo.toml depends on, by the names code uses.
fn external_crates() -> Vec<String> {
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line.ends_with("dependencies]")
                && !line.contains("dev-")
                && !line.contains("build-");
            continue;
        }
        if !in_deps || line.starts_with('#') {
            continue;
        }
        if let Some((name, _)) = line.split_once('=') {
            out.push(name.trim().replace('-', "_"));
        }
    }
    out
}

/// The file a resolved path lands in: the deepest one that exists, `src/lib.rs` at least.
fn file_of(path: &[String], files: &BTreeSet<String>) -> String {
    for n in (1..=path.len()).rev() {
        let joined = path[..n].join("/");
        for candidate in [format!("src/{joined}.rs"), format!("src/{joined}/mod.rs")] {
            if files.contains(&candidate) {
                return candidate;
            }
        }
    }
    "src/lib.rs".to_string()
}

/// The top-level module a resolved path lands in.
fn top_of(path: &[String], files: &BTreeSet<String>) -> String {
    let file = file_of(path, files);
    if file == "src/lib.rs" {
        "lib".to_string()
    } else {
        path[0].clone()
    }
}

/// A table of ARCHITECTURE.md: the rows below the heading line that reads `heading`, each as
/// its line number and cells with backticks taken off.
fn table(doc: &str, header: &str) -> Vec<(usize, Vec<Vec<String>>)> {
    let mut rows = Vec::new();
    let mut inside = false;
    for (n, line) in doc.lines().enumerate() {
        let line = line.trim();
        if line == header {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if !line.starts_with('|') {
            break;
        }
        if line.starts_with("| ---") || line.starts_with("|---") {
            continue;
        }
        let cells = line
            .trim_matches('|')
            .split('|')
            .map(|cell| {
                cell.split(',')
                    .map(|w| w.trim().trim_matches('`').to_string())
                    .filter(|w| !w.is_empty() && w != "nothing")
                    .collect()
            })
            .collect();
        rows.push((n + 1, cells));
    }
    assert!(!rows.is_empty(), "ARCHITECTURE.md has no table `{header}`");
    rows
}

const MODULES: &str = "| module | may use |";
const CRATES: &str = "| crate | only in |";

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The module table: each module and the modules it may use.
fn module_rules(doc: &str) -> BTreeMap<String, (usize, BTreeSet<String>)> {
    let mut rules = BTreeMap::new();
    for (line, cells) in table(doc, MODULES) {
        let [module, may] = cells.as_slice() else {
            panic!("ARCHITECTURE.md:{line}: a module row has two cells");
        };
        let module = module.first().expect("a module name").clone();
        rules.insert(module, (line, may.iter().cloned().collect()));
    }
    rules
}

/// Every use between top-level modules is one the table allows, and every module has one row.
#[test]
fn modules_use_only_what_architecture_md_allows() {
    let doc = architecture();
    let rules = module_rules(&doc);
    let sources = read_sources();
    let files: BTreeSet<String> = sources.iter().map(|s| s.name.clone()).collect();
    let tops: BTreeSet<String> = sources.iter().map(|s| s.top().to_string()).collect();
    let mut found = Vec::new();
    for (module, (line, may)) in &rules {
        if !tops.contains(module) {
            found.push(format!(
                "ARCHITECTURE.md:{line}: module `{module}` is no longer in src/"
            ));
        }
        for used in may {
            if !tops.contains(used) {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: `{module}` may use `{used}`, which is no longer in src/"
                ));
            }
        }
    }
    for top in &tops {
        if !rules.contains_key(top) {
            found.push(format!(
                "ARCHITECTURE.md: module `{top}` has no row in `{MODULES}`"
            ));
        }
    }
    for source in sources {
        let from = source.top();
        let Some((_, may)) = rules.get(from) else {
            continue;
        };
        for u in &source.uses {
            let to = top_of(&u.path, &files);
            if to != from && !may.contains(&to) {
                found.push(format!(
                    "{}:{}: `{from}` uses `{to}` ({}); ARCHITECTURE.md lets `{from}` use: {}",
                    source.name,
                    u.line,
                    u.path.join("::"),
                    may.iter().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
    }
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// The crates of the crate table appear only where the table says.
#[test]
fn crates_stay_where_architecture_md_keeps_them() {
    let doc = architecture();
    let sources = read_sources();
    let known = external_crates();
    let mut found = Vec::new();
    for (line, cells) in table(&doc, CRATES) {
        let [crates, places] = cells.as_slice() else {
            panic!("ARCHITECTURE.md:{line}: a crate row has two cells");
        };
        for krate in crates {
            if !known.contains(krate) {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: `{krate}` is not a dependency in Cargo.toml"
                ));
            }
        }
        for place in places {
            let gone = if place.starts_with("src/") {
                !sources.iter().any(|s| &s.name == place)
            } else {
                !sources.iter().any(|s| s.top() == place)
            };
            if gone {
                found.push(format!(
                    "ARCHITECTURE.md:{line}: `{place}` is no longer in src/"
                ));
            }
        }
        for source in sources {
            let allowed = places.contains(&source.name) || places.iter().any(|p| p == source.top());
            if allowed {
                continue;
            }
            for (krate, at) in &source.crates {
                if crates.contains(krate) {
                    found.push(format!(
                        "{}:{at}: `{krate}` in `{}`; ARCHITECTURE.md keeps it to: {}",
                        source.name,
                        source.top(),
                        places.join(", ")
                    ));
                }
            }
        }
    }
    found.sort();
    found.dedup();
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// The cycles of a graph given as edges, each as its nodes in order: one per strongly
/// connected part of more than one node.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.keys().chain(edges.values().flatten()).collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for next in edges.get(&n).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reached[n].contains(*n) {
            continue;
        }
        let part: Vec<String> = nodes
            .iter()
            .filter(|m| reached[n].contains(**m) && reached[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        done.extend(part.iter().cloned());
        out.push(part);
    }
    out
}

/// Tells a cycle: its nodes, and the uses that make each edge inside it.
fn tell(part: &[String], examples: &BTreeMap<(String, String), String>) -> String {
    let mut lines = vec![format!("cycle: {}", part.join(" <-> "))];
    for ((from, to), at) in examples {
        if part.contains(from) && part.contains(to) {
            lines.push(format!("  {from} -> {to}: {at}"));
        }
    }
    lines.join("\n")
}

/// No two top-level modules use each other, directly or around a loop.
#[test]
fn modules_form_no_cycle() {
    let sources = read_sources();
    let files: BTreeSet<String> = sources.iter().map(|s| s.name.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut examples = BTreeMap::new();
    for source in sources {
        let from = source.top().to_string();
        for u in &source.uses {
            let to = top_of(&u.path, &files);
            if to != from {
                edges.entry(from.clone()).or_default().insert(to.clone());
                examples.entry((from.clone(), to)).or_insert_with(|| {
                    format!("{}:{} ({})", source.name, u.line, u.path.join("::"))
                });
            }
        }
    }
    let found: Vec<String> = cycles(&edges).iter().map(|p| tell(p, &examples)).collect();
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// No two files use each other, directly or around a loop. A file's own submodules are its
/// parts, so its uses of them count for nothing; every other use between files points one way.
#[test]
fn files_form_no_cycle() {
    let sources = read_sources();
    let files: BTreeSet<String> = sources.iter().map(|s| s.name.clone()).collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut examples = BTreeMap::new();
    for source in sources {
        for u in &source.uses {
            let to = file_of(&u.path, &files);
            let part = u.path.starts_with(&source.module) && source.name != "src/main.rs";
            if to == source.name || part {
                continue;
            }
            edges
                .entry(source.name.clone())
                .or_default()
                .insert(to.clone());
            examples
                .entry((source.name.clone(), to))
                .or_insert_with(|| format!("{}:{} ({})", source.name, u.line, u.path.join("::")));
        }
    }
    let found: Vec<String> = cycles(&edges).iter().map(|p| tell(p, &examples)).collect();
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// Every `src/` path ARCHITECTURE.md names in backticks exists.
#[test]
fn the_code_map_names_files_that_exist() {
    let doc = architecture();
    let mut found = Vec::new();
    for (n, line) in doc.lines().enumerate() {
        for (i, quoted) in line.split('`').enumerate() {
            if i % 2 == 1 && quoted.starts_with("src/") && !root().join(quoted).exists() {
                found.push(format!(
                    "ARCHITECTURE.md:{}: `{quoted}` does not exist",
                    n + 1
                ));
            }
        }
    }
    assert!(found.is_empty(), "\n{}", found.join("\n"));
}

/// The scanner reads grouped, nested and relative paths, and skips comments, strings and tests.
#[test]
fn the_scanner_reads_paths_as_rust_does() {
    let text = "use crate::a::{b::{c, D}, self as e};\n\
                // crate::in_a_comment::X\n\
                let s = \"crate::in_a_string\"; let c = '{'; fn f<'a>() {}\n\
                super::super::f::g(); $crate::no::x;\n\
                #[cfg(test)]\nmod tests { use crate::only_in_tests::X; }\n\
                #[cfg(test)]\nmod more;\n\
                #[cfg(all(test, unix))]\nmod unix { use crate::unix_tests::X; }\n\
                #[cfg(not(test))]\nuse crate::kept::Y;\n";
    let mut code = code_only(text);
    assert_eq!(drop_test_code(&mut code), ["more"]);
    let found: Vec<String> = paths_from(&code, &["crate", "super", "self"])
        .into_iter()
        .map(|(p, line)| format!("{}@{line}", p.join("::")))
        .collect();
    assert_eq!(
        found,
        [
            "crate::a::b::c@1",
            "crate::a::b::D@1",
            "crate::a@1",
            "super::super::f::g@4",
            "crate::kept::Y@12",
        ]
    );
    let module: Vec<String> = ["x", "y", "z"].map(String::from).to_vec();
    let path: Vec<String> = ["super", "super", "f", "g"].map(String::from).to_vec();
    assert_eq!(
        resolve(&module, &path, false),
        Some(vec!["x".into(), "f".into(), "g".into()])
    );
}
