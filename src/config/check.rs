//! The [`Checker`] that collects a file's errors and warnings while the typed config is built,
//! and the small parsers every section shares. `validate` and the section modules
//! (`backend`, `limits`, `routes`) use it; it uses none of them.

use std::net::IpAddr;
use std::time::Duration;

use ipnet::IpNet;

use super::locate::Locator;
use super::problem::{At, Path, Pending, MAX_PROBLEMS};
use super::raw::{Field, StrList};
use super::units;

/// Collects errors and warnings while the typed config is built.
pub(crate) struct Checker<'l> {
    /// problems that make the file invalid
    pub errors: Vec<Pending>,
    /// problems that do not (an unreachable route, no routes at all)
    pub warnings: Vec<Pending>,
    /// read the files the configuration names (TLS certificate and key) and check them
    pub read_files: bool,
    locator: &'l Locator<'l>,
}

impl<'l> Checker<'l> {
    /// An empty checker for one file.
    pub fn new(locator: &'l Locator<'l>) -> Checker<'l> {
        Checker {
            errors: Vec::new(),
            warnings: Vec::new(),
            read_files: false,
            locator,
        }
    }

    /// An error about the value at `path`.
    pub fn error(&mut self, path: Path, message: impl Into<String>) {
        self.errors.push(Pending::value(path, message));
    }

    /// An error about the key at `path` itself (a name chosen by the user).
    pub fn key_error(&mut self, path: Path, message: impl Into<String>) {
        self.errors.push(Pending::key(path, 0, message));
    }

    /// A warning about the value at `path`.
    pub fn warn(&mut self, path: Path, message: impl Into<String>) {
        self.warnings.push(Pending::value(path, message));
    }

    /// The line of the value at `path`, for an error that points to another place; `None` when
    /// [`MAX_PROBLEMS`] errors are already collected: this one will not be shown, and finding a
    /// line reads the file again.
    pub fn error_line_of(&self, path: &Path) -> Option<usize> {
        (self.errors.len() < MAX_PROBLEMS).then(|| self.locator.locate(path, At::Value).0)
    }

    /// [`Checker::error_line_of`] for a warning.
    pub fn warning_line_of(&self, path: &Path) -> Option<usize> {
        (self.warnings.len() < MAX_PROBLEMS).then(|| self.locator.locate(path, At::Value).0)
    }

    /// The value of a required key; reports it at the mapping when it is missing.
    pub fn required<'f, T>(&mut self, field: &'f Field<T>, map: &Path, key: &str) -> Option<&'f T> {
        if let Field::Absent = field {
            self.error(map.clone(), format!("missing required key {key:?}"));
        }
        field.get()
    }

    /// A list item or a mapping value that must not be empty (`- ` with nothing after it).
    pub fn item<'f, T>(&mut self, field: &'f Field<T>, path: &Path, what: &str) -> Option<&'f T> {
        if let Field::Absent = field {
            self.error(
                path.clone(),
                format!("expected {what}, found nothing (null)"),
            );
        }
        field.get()
    }

    /// Parses a present text value; its error is reported at `path`.
    pub fn parse<T>(
        &mut self,
        field: &Field<String>,
        path: &Path,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let text = field.get()?;
        parse(text)
            .map_err(|message| self.error(path.clone(), message))
            .ok()
    }

    /// The items of a one-or-many value with their paths; null items are reported.
    pub fn strings<'f>(&mut self, list: &'f StrList, path: &Path) -> Vec<(Path, &'f str)> {
        if let StrList::Many(items) = list {
            for (i, item) in items.iter().enumerate() {
                self.item(item, &path.index(i), "a string");
            }
        }
        list.items(path)
    }

    /// Parses each item of a one-or-many value, reporting each failure at its own path.
    pub fn parse_list<T>(
        &mut self,
        field: &Field<StrList>,
        path: &Path,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Vec<T> {
        let Some(list) = field.get() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (item_path, text) in self.strings(list, path) {
            match parse(text) {
                Ok(v) => out.push(v),
                Err(message) => self.error(item_path, message),
            }
        }
        out
    }

    /// A whole-number key that must be at least 1.
    pub fn positive(&mut self, field: &Field<u64>, path: &Path, key: &str) -> Option<u64> {
        match field.get() {
            Some(0) => {
                self.error(path.clone(), format!("{key} must be at least 1, found 0"));
                None
            }
            other => other.copied(),
        }
    }

    /// [`Checker::positive`], and at most `max`.
    pub fn positive_to(
        &mut self,
        field: &Field<u64>,
        path: &Path,
        key: &str,
        max: u64,
    ) -> Option<u64> {
        match self.positive(field, path, key)? {
            n if n > max => {
                self.error(
                    path.clone(),
                    format!("{key} must be at most {max}, found {n}"),
                );
                None
            }
            n => Some(n),
        }
    }

    /// A duration key (a timeout) with a default; zero is refused, and so is more than a
    /// year, which no timeout needs and which past the clock's range would not add to an
    /// instant (tokio would panic, or never fire).
    pub fn duration(&mut self, field: &Field<String>, path: &Path, default: Duration) -> Duration {
        let parsed = self.parse(field, path, units::parse_duration);
        if parsed.is_some_and(|d| d.is_zero()) {
            self.error(path.clone(), "must be greater than zero");
        }
        self.at_most_a_year(parsed, path).unwrap_or(default)
    }

    /// `parsed`, with an error at `path` when it is more than a year.
    pub fn at_most_a_year(&mut self, parsed: Option<Duration>, path: &Path) -> Option<Duration> {
        const LONGEST: Duration = Duration::from_secs(365 * 24 * 3600);
        if parsed.is_some_and(|d| d > LONGEST) {
            self.error(path.clone(), "must be at most 365d");
        }
        parsed
    }
}

/// Names of upstreams, routes and limits: they become parts of store keys
/// (`prefix:route:limit:client`) and metric labels, so `:` and spaces are kept out.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "a name may hold only letters, digits, \"-\", \"_\" and \".\", found {name:?}"
        ))
    }
}

/// `10.0.0.0/8`, `fd00::/8`, or a bare address (a /32 or /128 network).
pub(crate) fn parse_net(text: &str) -> Result<IpNet, String> {
    let t = text.trim();
    t.parse::<IpNet>()
        .map(|net| net.trunc())
        .or_else(|_| t.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!(
                "expected an address or network such as 10.0.0.0/8 or 192.0.2.1, found {text:?}"
            )
        })
}
