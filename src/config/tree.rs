//! The YAML document as a plain tree ([`Node`]), read with `serde_yaml`, before any schema.
//!
//! The tree keeps mapping entries in file order, duplicates included, so that a repeated key is
//! reported instead of silently replacing the first. Environment variables are expanded here,
//! once, in every string value ([`prepare`]).

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::env;
use super::locate::Locator;
use super::problem::{At, Path, Pending, KEY_NULL, MAX_PROBLEMS};

/// One YAML value. Scalars are typed as YAML 1.2 reads them (`10` is an integer, `"10"` and
/// `10/s` are strings).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// `~`, `null` or nothing
    Null,
    /// `true` / `false`
    Bool(bool),
    /// a whole number
    Int(i128),
    /// a number with a fraction or exponent
    Float(f64),
    /// any other scalar, quoted or not
    Str(String),
    /// a list
    Seq(Vec<Node>),
    /// a mapping, in file order, duplicate keys included
    Map(Vec<(String, Node)>),
    /// a value that was already reported (an unset environment variable): later stages skip
    /// it instead of adding a second, confusing complaint
    Invalid,
}

impl Node {
    /// How the value reads in a message: `"ten"`, `10`, `a list`.
    pub fn describe(&self) -> String {
        match self {
            Node::Null => "nothing (null)".to_owned(),
            Node::Bool(b) => b.to_string(),
            Node::Int(n) => n.to_string(),
            Node::Float(x) => x.to_string(),
            Node::Str(s) => format!("{s:?}"),
            Node::Seq(_) => "a list".to_owned(),
            Node::Map(_) => "a mapping".to_owned(),
            Node::Invalid => "an invalid value".to_owned(),
        }
    }

    /// The text of a scalar (a number as written in decimal); `None` for null and collections.
    pub fn scalar_text(&self) -> Option<String> {
        match self {
            Node::Bool(b) => Some(b.to_string()),
            Node::Int(n) => Some(n.to_string()),
            Node::Float(x) => Some(x.to_string()),
            Node::Str(s) => Some(s.clone()),
            Node::Null | Node::Seq(_) | Node::Map(_) | Node::Invalid => None,
        }
    }
}

/// A YAML syntax error, with its 1-based position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyntaxError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Reads the document. An empty document (nothing but comments) reads as an empty mapping.
pub(crate) fn parse(text: &str) -> Result<Node, SyntaxError> {
    match serde_yaml::from_str::<Node>(text) {
        Ok(Node::Null) => Ok(Node::Map(Vec::new())),
        Ok(node) => Ok(node),
        Err(e) => {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            // serde_yaml appends "at line L column C"; the position is reported in front.
            let message = e
                .to_string()
                .replace(&format!(" at line {line} column {column}"), "");
            Err(SyntaxError {
                line,
                column,
                message,
            })
        }
    }
}

/// Reports duplicate keys and expands `${VAR}` in every string value, in place.
pub(crate) fn prepare(
    node: &mut Node,
    path: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    locator: &Locator,
    out: &mut Vec<Pending>,
) {
    match node {
        Node::Str(s) => match env::expand(s, env) {
            Ok(expanded) => *s = expanded,
            Err(message) => {
                out.push(Pending::value(path.clone(), message));
                *node = Node::Invalid;
            }
        },
        Node::Seq(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                prepare(item, &path.index(i), env, locator, out);
            }
        }
        Node::Map(entries) => {
            merge(entries);
            // Counted in a map: `overrides` may hold tens of thousands of keys, and comparing
            // each key with every one before it took seconds.
            let mut seen: HashMap<&str, usize> = HashMap::with_capacity(entries.len());
            for (key, _) in entries.iter() {
                let count = seen.entry(key.as_str()).or_insert(0);
                let earlier = *count;
                *count += 1;
                if earlier > 0 {
                    // Past the problems shown, the line is not worth reading the file again.
                    let line = (out.len() < MAX_PROBLEMS)
                        .then(|| locator.locate(&path.key(key), At::Key(0)).0)
                        .map_or("above".to_owned(), |n| format!("on line {n}"));
                    let message = format!(
                        "duplicate key {key:?}: it is already defined {line}, \
                         and YAML keys must be unique"
                    );
                    out.push(Pending::key(path.key(key), earlier, message));
                }
            }
            for (key, value) in entries.iter_mut() {
                let child = path.key(key);
                prepare(value, &child, env, locator, out);
            }
        }
        Node::Null | Node::Bool(_) | Node::Int(_) | Node::Float(_) | Node::Invalid => {}
    }
}

/// Applies a YAML merge key (`<<: *defaults` or `<<: [*a, *b]`): the merged mappings' entries
/// are added unless the mapping writes them itself, as YAML 1.1 defines it. A `<<` whose value
/// is not a mapping stays, and is reported as an unknown key.
fn merge(entries: &mut Vec<(String, Node)>) {
    let Some(at) = entries.iter().position(|(k, _)| k == "<<") else {
        return;
    };
    let sources: Vec<Vec<(String, Node)>> = match &entries[at].1 {
        Node::Map(map) => vec![map.clone()],
        Node::Seq(items) if items.iter().all(|n| matches!(n, Node::Map(_))) => items
            .iter()
            .filter_map(|n| match n {
                Node::Map(map) => Some(map.clone()),
                _ => None,
            })
            .collect(),
        _ => return,
    };
    entries.remove(at);
    // Earlier sources win over later ones, and the mapping's own keys over all of them.
    for (key, value) in sources.into_iter().flatten() {
        if !entries.iter().any(|(k, _)| *k == key) {
            entries.push((key, value));
        }
    }
}

/// Removes top-level keys starting with `x-`: extension fields that hold YAML anchors for
/// reuse (`x-defaults: &defaults ...`), as in Compose files. No real key starts with `x-`, so
/// this cannot hide a misspelling.
pub(crate) fn drop_extensions(root: &mut Node) {
    if let Node::Map(entries) = root {
        entries.retain(|(key, _)| !key.starts_with("x-"));
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(i128::from(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(i128::from(v)))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        Ok(Node::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        Ok(i128::try_from(v).map_or_else(|_| Node::Str(v.to_string()), Node::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(KeyText(key)) = map.next_key::<KeyText>()? {
            entries.push((key, map.next_value::<Node>()?));
        }
        Ok(Node::Map(entries))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<Node, A::Error> {
        Err(de::Error::custom(
            "YAML tags such as !name are not supported here",
        ))
    }
}

/// A mapping key as text: scalars only (`8080:` reads as `"8080"`).
pub(crate) struct KeyText(pub String);

impl<'de> Deserialize<'de> for KeyText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<KeyText, D::Error> {
        deserializer.deserialize_any(KeyTextVisitor).map(KeyText)
    }
}

struct KeyTextVisitor;

impl Visitor<'_> for KeyTextVisitor {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plain key (a mapping or a list cannot be a key)")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        Ok(KEY_NULL.to_owned())
    }
}
