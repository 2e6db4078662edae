//! `docs/configuration.md` is the reference of every key of `proxy.yaml`. These tests learn the
//! keys from the parser itself, as a user would: they write an unknown key at a mapping level
//! and read the list of allowed keys from the error. They walk down from the top level, trying
//! each key as a mapping, a mapping of names, and a list of mappings, so a new nested level is
//! found too. A key the parser accepts without a `### \`path\`` heading in the page fails them,
//! and so does a heading for a key the parser refuses.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;

use tollgate::config::{self, ConfigError, Problem};

/// A key that resembles no real key, so the parser lists the allowed keys rather than a hint.
const UNKNOWN: &str = "zzzzqqq";

/// The start of the parser's message for [`UNKNOWN`], before the list of allowed keys.
const UNKNOWN_PREFIX: &str = "unknown key \"zzzzqqq\"; expected ";

/// The page under test, from the crate's root.
const DOC: &str = "docs/configuration.md";

/// One step down from a mapping level.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    /// a fixed key, such as `tls`
    Key(String),
    /// a name the user chooses, such as an entry of `upstreams`; the probes use [`UNKNOWN`]
    Name,
    /// an item of a list, such as a route
    Item,
}

/// A mapping level, as the steps from the top of the file; the top level is empty.
type Level = Vec<Step>;

/// A level as the page writes it: `upstreams.<name>.pace`, `routes[].limits[]`; the top is "".
fn doc_path(level: &[Step]) -> String {
    let mut out = String::new();
    for step in level {
        match step {
            Step::Key(key) if out.is_empty() => out.push_str(key),
            Step::Key(key) => out.push_str(&format!(".{key}")),
            Step::Name => out.push_str(".<name>"),
            Step::Item => out.push_str("[]"),
        }
    }
    out
}

/// The key path of [`UNKNOWN`] written at `level`, as the parser's problems print it.
fn problem_path(level: &[Step]) -> String {
    let mut out = String::new();
    for step in level {
        match step {
            Step::Key(key) if out.is_empty() => out.push_str(key),
            Step::Key(key) => out.push_str(&format!(".{key}")),
            Step::Name => out.push_str(&format!(".{UNKNOWN}")),
            Step::Item => out.push_str("[0]"),
        }
    }
    if out.is_empty() {
        UNKNOWN.to_owned()
    } else {
        format!("{out}.{UNKNOWN}")
    }
}

/// A file, in YAML flow style, whose mapping at `level` holds [`UNKNOWN`] and nothing else.
/// The file is otherwise incomplete: the parser reads every key before it checks what is
/// missing, so the unknown key is reported all the same.
fn file_with_unknown_key_at(level: &[Step]) -> String {
    level
        .iter()
        .rev()
        .fold(format!("{{{UNKNOWN}: 1}}"), |inner, step| match step {
            Step::Key(key) => format!("{{{key}: {inner}}}"),
            Step::Name => format!("{{{UNKNOWN}: {inner}}}"),
            Step::Item => format!("[{inner}]"),
        })
}

/// `a`, `a or b`, `a, b or c`, as the parser joins the allowed keys, split back into keys.
fn split_or_list(list: &str) -> Vec<String> {
    let (init, last) = match list.rsplit_once(" or ") {
        Some((init, last)) => (Some(init), last),
        None => (None, list),
    };
    let mut keys: Vec<String> = init
        .map(|init| init.split(", ").map(str::to_owned).collect())
        .unwrap_or_default();
    keys.push(last.to_owned());
    keys
}

/// The keys the parser accepts at `level`; `None` when `level` is no mapping of fixed keys
/// (the parser then reports no unknown key there).
fn allowed_keys(level: &[Step]) -> Option<Vec<String>> {
    let text = file_with_unknown_key_at(level);
    let problems: Vec<Problem> = match config::parse(&text, "proxy.yaml", &|_| None) {
        Err(ConfigError::Invalid(problems)) => problems,
        Err(e) => panic!("parsing {text:?} did not validate it: {e}"),
        Ok(_) => panic!("{text:?} has an unknown key, yet it parsed"),
    };
    let path = problem_path(level);
    problems
        .iter()
        .filter(|p| p.path == path)
        .find_map(|p| p.message.strip_prefix(UNKNOWN_PREFIX))
        .map(split_or_list)
}

/// Every mapping level of fixed keys the parser knows, by its path in the page, with the keys
/// it accepts there, in the parser's order.
fn discover_levels() -> BTreeMap<String, Vec<String>> {
    let mut found = BTreeMap::new();
    let mut queue: VecDeque<Level> = VecDeque::from([Vec::new()]);
    while let Some(level) = queue.pop_front() {
        let keys = allowed_keys(&level).unwrap_or_else(|| {
            panic!(
                "no list of allowed keys at {:?} in {}",
                doc_path(&level),
                file_with_unknown_key_at(&level)
            )
        });
        assert!(
            level.len() < 8,
            "levels nest too deep: {}",
            doc_path(&level)
        );
        for key in &keys {
            let mut under = level.clone();
            under.push(Step::Key(key.clone()));
            // the key's value as a mapping, a mapping of names, or a list of mappings
            for tail in [vec![], vec![Step::Name], vec![Step::Item]] {
                let mut child = under.clone();
                child.extend(tail);
                if allowed_keys(&child).is_some() {
                    queue.push_back(child);
                }
            }
        }
        found.insert(doc_path(&level), keys);
    }
    found
}

/// `level.key` as the page writes it: `listen`, `upstreams.<name>.targets`.
fn key_path(level: &str, key: &str) -> String {
    if level.is_empty() {
        key.to_owned()
    } else {
        format!("{level}.{key}")
    }
}

/// Every heading the page must have: each accepted key, and each entry whose name the user
/// chooses (`upstreams.<name>`), under which keys are documented.
fn expected_headings(levels: &BTreeMap<String, Vec<String>>) -> BTreeSet<String> {
    let keys = levels
        .iter()
        .flat_map(|(level, keys)| keys.iter().map(move |key| key_path(level, key)));
    let named = levels
        .keys()
        .filter(|level| level.ends_with(".<name>"))
        .cloned();
    keys.chain(named).collect()
}

/// The page's text.
fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DOC);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Every `### ` heading of the page, in order; a heading that is not exactly
/// `### \`path\`` fails the test.
fn headings(doc: &str) -> Vec<String> {
    doc.lines()
        .filter(|line| line.starts_with("###"))
        .map(|line| {
            line.strip_prefix("### `")
                .and_then(|rest| rest.strip_suffix('`'))
                .filter(|path| !path.is_empty() && !path.contains('`'))
                .unwrap_or_else(|| panic!("{DOC}: a heading that is not ### `key.path`: {line:?}"))
                .to_owned()
        })
        .collect()
}

/// Every key the parser accepts, at every mapping level, has its own heading in the page.
#[test]
fn every_accepted_key_has_a_heading() {
    let levels = discover_levels();
    for (level, keys) in &levels {
        let shown = if level.is_empty() { "top" } else { level };
        println!("{shown}: {} keys: {}", keys.len(), keys.join(", "));
    }
    let documented: BTreeSet<String> = headings(&doc()).into_iter().collect();
    let missing: Vec<String> = expected_headings(&levels)
        .into_iter()
        .filter(|path| !documented.contains(path))
        .collect();
    assert!(
        missing.is_empty(),
        "{DOC} has no `### \\`path\\`` heading for these keys the parser accepts:\n{}",
        missing.join("\n")
    );
}

/// Every heading in the page names a key the parser accepts, and no key has two headings.
#[test]
fn every_heading_names_an_accepted_key() {
    let expected = expected_headings(&discover_levels());
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for heading in headings(&doc()) {
        if !expected.contains(&heading) {
            problems.push(format!("{heading}: the parser accepts no such key"));
        }
        if !seen.insert(heading.clone()) {
            problems.push(format!("{heading}: a second heading for the same key"));
        }
    }
    assert!(problems.is_empty(), "{DOC}:\n{}", problems.join("\n"));
}

/// The walk reaches every mapping level known today, so it cannot pass by finding nothing.
#[test]
fn discovery_reaches_every_known_level() {
    let levels = discover_levels();
    let known = [
        "",
        "tls",
        "admin",
        "store",
        "store.sentinel",
        "store.tls",
        "timeouts",
        "paths",
        "access_log",
        "upstreams.<name>",
        "upstreams.<name>.pace",
        "upstreams.<name>.pace.adaptive",
        "routes[]",
        "routes[].match",
        "routes[].limits[]",
        "routes[].limits[].overrides.<name>",
    ];
    for level in known {
        assert!(
            levels.get(level).is_some_and(|keys| !keys.is_empty()),
            "no keys found at {level:?}; found levels {:?}",
            levels.keys().collect::<Vec<_>>()
        );
    }
}

/// The page's first YAML example, its minimal file, is a valid configuration.
#[test]
fn the_minimal_example_is_valid() {
    let doc = doc();
    let example = doc
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(example, _)| example)
        .unwrap_or_else(|| panic!("{DOC} has no ```yaml example"));
    if let Err(e) = config::parse(example, "minimal.yaml", &|_| None) {
        panic!("the minimal example of {DOC} is invalid:\n{e}\n\n{example}");
    }
}

/// The first example line of the entry headed `### \`path\``: its first line indented by four
/// spaces.
fn first_example(doc: &str, path: &str) -> String {
    let heading = format!("### `{path}`\n");
    let (_, entry) = doc
        .split_once(&heading)
        .unwrap_or_else(|| panic!("{DOC} has no entry {path}"));
    entry
        .lines()
        .take_while(|line| !line.starts_with("###"))
        .find_map(|line| line.strip_prefix("    "))
        .unwrap_or_else(|| panic!("{DOC}: {path} has no example"))
        .to_owned()
}

/// The examples of the concurrency keys, each put in its place in a small file, are valid.
#[test]
fn the_concurrency_examples_are_valid() {
    let doc = doc();
    let head = "listen: 127.0.0.1:0\nupstreams:\n  api:\n    targets: [http://127.0.0.1:9]\n";
    let route = "routes:\n  - name: all\n    upstream: api\n    limits:\n      ";
    let override_line = first_example(&doc, "routes[].limits[].overrides.<name>.lease");
    let files = [
        format!(
            "{head}    {}\n",
            first_example(&doc, "upstreams.<name>.pace.concurrency")
        ),
        format!(
            "{head}{route}{}\n",
            first_example(&doc, "routes[].limits[].lease")
        ),
        format!(
            "{head}{route}- {{name: d, algorithm: concurrency, limit: 2, overrides: {{{override_line}}}}}\n"
        ),
    ];
    for file in files {
        if let Err(e) = config::parse(&file, "example.yaml", &|_| None) {
            panic!("an example of {DOC} is invalid:\n{e}\n\n{file}");
        }
    }
}

/// Every `pace:` example line of the page is a valid pace of an upstream, and every
/// `adaptive:` one a valid part of a pace starting at 100/s.
#[test]
fn every_pace_example_is_valid() {
    let doc = doc();
    let examples: Vec<String> = doc
        .lines()
        .map(str::trim)
        .filter_map(|l| match l {
            _ if l.starts_with("pace: {") => Some(l.to_owned()),
            _ if l.starts_with("adaptive: {") => {
                Some(format!("pace: {{rate: 100/s, max_delay: 1s, {l}}}"))
            }
            _ => None,
        })
        .collect();
    assert!(examples.len() >= 10, "too few pace examples: {examples:?}");
    for pace in examples {
        let file = format!(
            "listen: 127.0.0.1:0\nupstreams:\n  api:\n    targets: [http://127.0.0.1:1]\n    \
             {pace}\nroutes:\n  - {{name: all, upstream: api}}\n"
        );
        if let Err(e) = config::parse(&file, "pace.yaml", &|_| None) {
            panic!("the example {pace:?} of {DOC} is invalid:\n{e}");
        }
    }
}
