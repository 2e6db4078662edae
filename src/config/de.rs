//! A serde `Deserializer` over the [`Node`] tree that keeps going after a problem.
//!
//! serde stops at the first error; a config check must report them all. Three things make that
//! work here:
//!
//! * [`NodeDe`] records every error, with the key path of the value it concerns, in a shared
//!   [`Ctx`] the moment it arises, and passes on only a marker that it has done so;
//! * the raw mirror wraps fields and list items in [`super::raw::Field`], which turns that
//!   marker into `Field::Invalid` instead of failing its parent, so siblings are still read;
//! * unknown keys are reported and dropped before a struct's visitor sees them (serde gives the
//!   list of known fields to `deserialize_struct`), so one misspelt key costs nothing else.
//!
//! `Field` swallows errors, which is sound only because `NodeDe` has recorded them: raw types
//! must be read through [`from_node`], never through another deserializer.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::value::StrDeserializer;
use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, Unexpected, Visitor};

use super::problem::{one_of, or_list, unknown_key, Path, Pending};
use super::tree::Node;

/// Collects the problems found while reading the raw mirror.
#[derive(Debug, Default)]
pub(crate) struct Ctx {
    problems: RefCell<Vec<Pending>>,
}

impl Ctx {
    fn record(&self, problem: Pending) {
        self.problems.borrow_mut().push(problem);
    }

    /// Every problem recorded, in the order found.
    pub fn into_problems(self) -> Vec<Pending> {
        self.problems.into_inner()
    }
}

/// Reads `T` from the tree; `None` when even the top level is unusable (already recorded).
pub(crate) fn from_node<'a, T: Deserialize<'a>>(node: &'a Node, ctx: &'a Ctx) -> Option<T> {
    T::deserialize(NodeDe {
        node,
        path: Path::root(),
        ctx,
    })
    .ok()
}

/// A deserialisation error: the message, or the marker that it is already recorded.
#[derive(Debug)]
pub(crate) struct DeError {
    message: String,
    recorded: bool,
}

impl DeError {
    fn new(message: impl Into<String>) -> DeError {
        DeError {
            message: message.into(),
            recorded: false,
        }
    }

    fn recorded() -> DeError {
        DeError {
            message: "already reported".to_owned(),
            recorded: true,
        }
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> DeError {
        DeError::new(msg.to_string())
    }

    fn invalid_type(unexp: Unexpected<'_>, exp: &dyn de::Expected) -> DeError {
        DeError::new(format!("expected {exp}, found {}", unexpected(&unexp)))
    }

    fn invalid_value(unexp: Unexpected<'_>, exp: &dyn de::Expected) -> DeError {
        DeError::new(format!("expected {exp}, found {}", unexpected(&unexp)))
    }

    fn unknown_variant(variant: &str, expected: &'static [&'static str]) -> DeError {
        DeError::new(one_of(variant, expected))
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> DeError {
        DeError::new(unknown_key(field, expected))
    }

    fn missing_field(field: &'static str) -> DeError {
        DeError::new(format!("missing required key {field:?}"))
    }
}

fn unexpected(u: &Unexpected<'_>) -> String {
    match u {
        Unexpected::Bool(b) => b.to_string(),
        Unexpected::Unsigned(n) => n.to_string(),
        Unexpected::Signed(n) => n.to_string(),
        Unexpected::Float(x) => x.to_string(),
        Unexpected::Str(s) => format!("{s:?}"),
        Unexpected::Unit => "nothing (null)".to_owned(),
        Unexpected::Seq => "a list".to_owned(),
        Unexpected::Map => "a mapping".to_owned(),
        other => other.to_string(),
    }
}

/// Deserializes one node; see the module comment.
pub(crate) struct NodeDe<'a> {
    node: &'a Node,
    path: Path,
    ctx: &'a Ctx,
}

impl<'a> NodeDe<'a> {
    /// Records an error that is not yet recorded, at this node, and passes on the marker.
    fn guard<T>(&self, result: Result<T, DeError>) -> Result<T, DeError> {
        result.map_err(|e| {
            if !e.recorded {
                let problem = Pending::value(self.path.clone(), e.message);
                self.ctx.record(problem);
            }
            DeError::recorded()
        })
    }

    /// `expected X, found Y`; for a node already reported, only the marker.
    fn mismatch<T>(&self, expected: &str) -> Result<T, DeError> {
        Err(match self.node {
            Node::Invalid => DeError::recorded(),
            other => DeError::new(format!("expected {expected}, found {}", other.describe())),
        })
    }

    fn entries(&self, fields: Option<&[&str]>) -> Result<MapAcc<'a>, DeError> {
        let Node::Map(entries) = self.node else {
            return self.mismatch("a mapping");
        };
        let mut kept: Vec<(&'a str, &'a Node)> = Vec::with_capacity(entries.len());
        let mut seen = HashSet::with_capacity(entries.len());
        for (key, value) in entries {
            // A repeated key is reported by `tree::prepare`; the first one counts. (A set, not a
            // search of `kept`: `overrides` may hold tens of thousands of keys.)
            if !seen.insert(key.as_str()) {
                continue;
            }
            if let Some(fields) = fields.filter(|f| !f.contains(&key.as_str())) {
                let problem = Pending::key(self.path.key(key), 0, unknown_key(key, fields));
                self.ctx.record(problem);
                continue;
            }
            kept.push((key, value));
        }
        Ok(MapAcc {
            entries: kept.into_iter(),
            value: None,
            path: self.path.clone(),
            ctx: self.ctx,
        })
    }

    fn items(&self) -> Result<SeqAcc<'a>, DeError> {
        match self.node {
            Node::Seq(items) => Ok(SeqAcc {
                items: items.iter().enumerate(),
                path: self.path.clone(),
                ctx: self.ctx,
            }),
            _ => self.mismatch("a list"),
        }
    }

    /// A whole number; a string holding one (from `${VAR}`) counts, and so does a number
    /// written with an exponent or a zero fraction that is whole (`1e3`, `20.0`).
    fn integer(&self, min: i128, max: i128) -> Result<i128, DeError> {
        // within ±2^53 every whole f64 is exact
        const EXACT: f64 = 9_007_199_254_740_992.0;
        let n = match self.node {
            Node::Int(n) => *n,
            Node::Float(f) if f.fract() == 0.0 && f.abs() <= EXACT => *f as i128,
            Node::Str(s) => match s.trim().parse::<i128>() {
                Ok(n) => n,
                Err(_) => return self.mismatch("a whole number"),
            },
            _ => return self.mismatch("a whole number"),
        };
        let range = match (n < min, n > max) {
            (true, _) if min == 0 => "of 0 or more".to_owned(),
            (false, true) => format!("no larger than {max}"),
            (true, _) => format!("from {min} to {max}"),
            (false, false) => return Ok(n),
        };
        Err(DeError::new(format!(
            "expected a whole number {range}, found {n}"
        )))
    }

    fn visit_integer<'de, V: Visitor<'de>>(
        self,
        visitor: V,
        min: i128,
        max: i128,
    ) -> Result<V::Value, DeError> {
        let result = self.integer(min, max).and_then(|n| match u64::try_from(n) {
            Ok(u) => visitor.visit_u64(u),
            Err(_) => visitor.visit_i64(i64::try_from(n).unwrap_or(i64::MIN)),
        });
        self.guard(result)
    }
}

macro_rules! integers {
    ($($method:ident: $ty:ty),*) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            self.visit_integer(visitor, i128::from(<$ty>::MIN), i128::from(<$ty>::MAX))
        })*
    };
}

impl<'de> Deserializer<'de> for NodeDe<'_> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match self.node {
            Node::Null => visitor.visit_unit(),
            Node::Bool(b) => visitor.visit_bool(*b),
            Node::Int(n) => match (u64::try_from(*n), i64::try_from(*n)) {
                (Ok(u), _) => visitor.visit_u64(u),
                (_, Ok(i)) => visitor.visit_i64(i),
                _ => visitor.visit_i128(*n),
            },
            Node::Float(x) => visitor.visit_f64(*x),
            Node::Str(s) => visitor.visit_str(s),
            Node::Seq(_) => self.items().and_then(|seq| visitor.visit_seq(seq)),
            Node::Map(_) => self.entries(None).and_then(|map| visitor.visit_map(map)),
            Node::Invalid => Err(DeError::recorded()),
        };
        self.guard(result)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match self.node {
            Node::Bool(b) => visitor.visit_bool(*b),
            Node::Str(s) if s == "true" || s == "false" => visitor.visit_bool(s == "true"),
            _ => self.mismatch("true or false"),
        };
        self.guard(result)
    }

    integers!(deserialize_i8: i8, deserialize_i16: i16, deserialize_i32: i32, deserialize_i64: i64);
    integers!(deserialize_u8: u8, deserialize_u16: u16, deserialize_u32: u32, deserialize_u64: u64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match self.node {
            Node::Int(n) => visitor.visit_f64(*n as f64),
            Node::Float(x) => visitor.visit_f64(*x),
            Node::Str(s) => match s.trim().parse::<f64>() {
                Ok(x) => visitor.visit_f64(x),
                Err(_) => self.mismatch("a number"),
            },
            _ => self.mismatch("a number"),
        };
        self.guard(result)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        // Numbers and booleans read as their text: `max_body_size: 1000`, a key value `12345`.
        let result = match self.node.scalar_text() {
            Some(text) => visitor.visit_str(&text),
            None => self.mismatch("a string"),
        };
        self.guard(result)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match self.node {
            Node::Null => visitor.visit_none(),
            Node::Invalid => Err(DeError::recorded()),
            _ => {
                let path = self.path.clone();
                visitor.visit_some(NodeDe {
                    node: self.node,
                    path,
                    ctx: self.ctx,
                })
            }
        };
        self.guard(result)
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = match self.node {
            Node::Null => visitor.visit_unit(),
            _ => self.mismatch("nothing (null)"),
        };
        self.guard(result)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = self.items().and_then(|seq| visitor.visit_seq(seq));
        self.guard(result)
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let result = self.entries(None).and_then(|map| visitor.visit_map(map));
        self.guard(result)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let result = self
            .entries(Some(fields))
            .and_then(|map| visitor.visit_map(map));
        self.guard(result)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        // Only unit variants appear in the file (`algorithm: token_bucket`); any scalar is
        // taken as a name, so that `mode: 1` gets the list of names, not a type complaint.
        let result = match self.node.scalar_text() {
            Some(text) => visitor.visit_enum(StrDeserializer::<DeError>::new(&text)),
            None => self.mismatch(&or_list(variants)),
        };
        self.guard(result)
    }

    serde::forward_to_deserialize_any! { bytes byte_buf ignored_any }
}

/// The entries of a mapping, unknown and repeated keys already taken out.
struct MapAcc<'a> {
    entries: std::vec::IntoIter<(&'a str, &'a Node)>,
    value: Option<(&'a str, &'a Node)>,
    path: Path,
    ctx: &'a Ctx,
}

impl<'de> de::MapAccess<'de> for MapAcc<'_> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        let Some((key, node)) = self.entries.next() else {
            return Ok(None);
        };
        self.value = Some((key, node));
        seed.deserialize(StrDeserializer::<DeError>::new(key))
            .map(Some)
            .map_err(|e| {
                if !e.recorded {
                    let problem = Pending::key(self.path.key(key), 0, e.message);
                    self.ctx.record(problem);
                }
                DeError::recorded()
            })
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, DeError> {
        let (key, node) = self
            .value
            .take()
            .ok_or_else(|| DeError::new("a value was asked for before its key"))?;
        seed.deserialize(NodeDe {
            node,
            path: self.path.key(key),
            ctx: self.ctx,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// The items of a list.
struct SeqAcc<'a> {
    items: std::iter::Enumerate<std::slice::Iter<'a, Node>>,
    path: Path,
    ctx: &'a Ctx,
}

impl<'de> de::SeqAccess<'de> for SeqAcc<'_> {
    type Error = DeError;

    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, DeError> {
        let Some((i, node)) = self.items.next() else {
            return Ok(None);
        };
        seed.deserialize(NodeDe {
            node,
            path: self.path.index(i),
            ctx: self.ctx,
        })
        .map(Some)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.items.len())
    }
}
