//! Key path to file position.
//!
//! `serde_yaml` keeps no positions in its values, but every error it raises carries the line
//! and column of the YAML event being read. [`Locator`] uses exactly that: it reads the text
//! again with a seed that walks down a key path and fails on purpose at the target, then takes
//! the position from the error. Only problems need a position, so this runs once per problem
//! (a few times per file at most), and it stays in safe code.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::problem::{At, Path, Seg, KEY_NULL};

/// The message of the deliberate error; never shown to anyone.
const FOUND: &str = "\u{0}tollgate-config-locate-target";

/// Finds the line and column of key paths in one text.
pub(crate) struct Locator<'t> {
    text: &'t str,
    cache: RefCell<HashMap<(Path, At), (usize, usize)>>,
}

impl<'t> Locator<'t> {
    /// A locator for `text`, which must be a well-formed single YAML document.
    pub fn new(text: &'t str) -> Locator<'t> {
        Locator {
            text,
            cache: RefCell::new(HashMap::new()),
        }
    }

    /// The 1-based (line, column) of the key or value at `path`. A path that is not in the
    /// file (a missing key) falls back to its nearest existing ancestor's value, which is the
    /// mapping that lacks the key; the top of the file is (1, 1).
    pub fn locate(&self, path: &Path, at: At) -> (usize, usize) {
        if let Some(&pos) = self.cache.borrow().get(&(path.clone(), at)) {
            return pos;
        }
        // The top of the file is its first line, whatever comments come before the first key
        // (and for an empty file, the parser's position is past the end).
        let pos = if path.0.is_empty() {
            (1, 1)
        } else {
            match self.probe(&path.0, at) {
                Some(pos) => pos,
                None => self.locate(&path.parent(), At::Value),
            }
        };
        self.cache.borrow_mut().insert((path.clone(), at), pos);
        pos
    }

    fn probe(&self, path: &[Seg], at: At) -> Option<(usize, usize)> {
        let de = serde_yaml::Deserializer::from_str(self.text);
        match (Seek { path, at }).deserialize(de) {
            Err(e) if e.to_string().contains(FOUND) => {
                e.location().map(|loc| (loc.line(), loc.column()))
            }
            _ => None,
        }
    }
}

/// Walks down `path`; fails with [`FOUND`] at the target.
struct Seek<'p> {
    path: &'p [Seg],
    at: At,
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.path.first() {
            None => d.deserialize_any(Target),
            Some(Seg::Key(_)) => d.deserialize_map(self),
            Some(Seg::Index(_)) => d.deserialize_seq(self),
        }
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (Some(Seg::Key(wanted)), rest) = (self.path.first(), &self.path[1..]) else {
            return Ok(());
        };
        let fail_at_key = match self.at {
            At::Key(n) if rest.is_empty() => Some(n),
            At::Key(_) | At::Value => None,
        };
        let seen = Cell::new(0);
        let probe = || KeyProbe {
            wanted,
            fail_at: fail_at_key,
            seen: &seen,
        };
        while let Some(key) = map.next_key_seed(probe())? {
            // Values are read from the first occurrence of a key, as the tree does.
            if key == *wanted && seen.get() == 1 && fail_at_key.is_none() {
                return map.next_value_seed(Seek {
                    path: rest,
                    at: self.at,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (Some(&Seg::Index(wanted)), rest) = (self.path.first(), &self.path[1..]) else {
            return Ok(());
        };
        for _ in 0..wanted {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Seek {
            path: rest,
            at: self.at,
        })?;
        Ok(())
    }
}

/// Reads a key; fails when it is the `fail_at`-th occurrence of `wanted`.
struct KeyProbe<'p> {
    wanted: &'p str,
    fail_at: Option<usize>,
    seen: &'p Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        // The check runs inside the visitor: only an error raised while the key's event is
        // being read carries the key's position.
        d.deserialize_any(self)
    }
}

impl KeyProbe<'_> {
    fn check<E: de::Error>(&self, key: String) -> Result<String, E> {
        if key == self.wanted {
            let n = self.seen.get();
            self.seen.set(n + 1);
            if self.fail_at == Some(n) {
                return Err(E::custom(FOUND));
            }
        }
        Ok(key)
    }
}

macro_rules! key_text {
    ($($name:ident($ty:ty)),*) => {
        $(fn $name<E: de::Error>(self, v: $ty) -> Result<String, E> {
            self.check(v.to_string())
        })*
    };
}

impl Visitor<'_> for KeyProbe<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a plain key")
    }

    key_text!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128)
    );
    key_text!(visit_u128(u128), visit_f64(f64), visit_str(&str));

    fn visit_unit<E: de::Error>(self) -> Result<String, E> {
        self.check(KEY_NULL.to_owned())
    }
}

/// Fails on whatever it is given, so that the error carries the value's position.
struct Target;

macro_rules! fail {
    ($($name:ident($ty:ty)),*) => {
        $(fn $name<E: de::Error>(self, _: $ty) -> Result<(), E> {
            Err(E::custom(FOUND))
        })*
    };
}

impl<'de> Visitor<'de> for Target {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("anything")
    }

    fail!(
        visit_bool(bool),
        visit_i64(i64),
        visit_u64(u64),
        visit_i128(i128)
    );
    fail!(visit_u128(u128), visit_f64(f64), visit_str(&str));

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_some<D: Deserializer<'de>>(self, _: D) -> Result<(), D::Error> {
        Err(de::Error::custom(FOUND))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }

    fn visit_enum<A: de::EnumAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
}
