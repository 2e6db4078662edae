//! `routes[N].limits[M]`: the algorithm and its parameters, the key, the mode, exemptions and
//! per-key overrides.
//!
//! Each parameter is parsed once where it is written (the limit or an override), so a bad
//! value is reported once; an override is then merged over the limit's own parameters and the
//! result built like the limit itself.

use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use http::HeaderName;

use super::check::{check_name, parse_net, Checker};
use super::problem::{one_of, or_list, Path};
use super::raw::{
    Field, RawAlgorithm, RawCharge, RawDuplicateKey, RawLimit, RawMode, RawParams, StrList,
};
use super::types::{Charge, LimitConfig, Mode};
use super::units::{self, ParsedRate};
use crate::identity::{self, DuplicateKey, KeyPart};
use crate::limit::{Algorithm, Bucket, Pace, ParamError, Slots, Window};

/// Validates one limit; `None` when it cannot be built (the reasons are reported).
pub(crate) fn limit(chk: &mut Checker<'_>, raw: &RawLimit, path: &Path) -> Option<LimitConfig> {
    let name = chk.required(&raw.name, path, "name").cloned();
    if let Some(Err(message)) = name.as_deref().map(check_name) {
        chk.error(path.key("name"), message);
    }
    let kind = chk.required(&raw.algorithm, path, "algorithm").copied();
    let (key, key_whole) = key(chk, raw, path);
    let exempt = chk.parse_list(&raw.exempt, &path.key("exempt"), parse_net);
    let own = Params::read(chk, &raw.params(), path);
    let algorithm = kind.and_then(|kind| {
        own.check_belongs(chk, kind);
        own.build(chk, kind, path)
    });
    // (once for the limit, not again for each of its overrides)
    if matches!(algorithm, Some(Algorithm::LeakyBucket(_))) && own.max_delay.value().is_none() {
        let message = "leaky_bucket without max_delay: a request waits for its slot however \
                       far off it is; set max_delay to answer 429 past it";
        chk.warn(path.clone(), message);
    }
    let mut overrides: Vec<(String, Algorithm)> = Vec::new();
    // the client keys named so far, with the value naming each
    let mut named = std::collections::HashMap::new();
    for (value, field) in raw.overrides.get().map_or(&[][..], |o| o.0.as_slice()) {
        let opath = path.key("overrides").key(value);
        let Some(params) = chk.item(field, &opath, "parameters such as {rate: 100/s}") else {
            continue;
        };
        let client = override_client(chk, (&key, key_whole), value, &opath);
        if let Some(first) = named.insert(client.clone(), value) {
            let message = format!("names the same client as {first:?}; this one applies");
            chk.warn(opath.clone(), message);
        }
        let given = Params::read(chk, params, &opath);
        if let Some(kind) = kind {
            given.check_belongs(chk, kind);
            // Built only over a valid limit: a limit's own problem would repeat per override.
            if algorithm.is_some() {
                if let Some(alg) = given.over(&own).build(chk, kind, &opath) {
                    overrides.push((client, alg));
                }
            }
        }
    }
    let duplicate_key = duplicate_key(chk, raw, &key, path);
    let charge = raw
        .charge
        .get()
        .and_then(|c| charge(chk, c, kind, &path.key("charge")));
    // (a charged token bucket keeps its debt: see `Bucket::debt`)
    let charged = |alg: Algorithm| match charge {
        Some(_) => alg.charged(),
        None => alg,
    };
    Some(LimitConfig {
        name: name?,
        algorithm: charged(algorithm?),
        key,
        mode: match raw.mode.get() {
            Some(RawMode::Enforce) | None => Mode::Enforce,
            Some(RawMode::Shadow) => Mode::Shadow,
        },
        exempt,
        overrides: overrides
            .into_iter()
            .map(|(k, a)| (k, charged(a)))
            .collect(),
        charge,
        duplicate_key,
    })
}

/// `key`, the client's address when it is not given, and whether every part of it was read
/// (a key with a problem of its own is not checked against its overrides).
fn key(chk: &mut Checker<'_>, raw: &RawLimit, path: &Path) -> (Vec<KeyPart>, bool) {
    if raw.key.get().is_some_and(|k| k.is_empty()) {
        chk.error(path.key("key"), "needs at least one part, such as ip");
    }
    let mut key = chk.parse_list(&raw.key, &path.key("key"), parse_key_part);
    let whole = raw.key.get().is_none_or(|k| match k {
        StrList::One(_) => key.len() == 1,
        StrList::Many(items) => key.len() == items.len(),
    });
    if !raw.key.is_given() {
        key.push(KeyPart::Ip);
    }
    (key, whole)
}

/// The client the override `value` names, as the proxy keys it: escaped, an address in one
/// notation. One no request can have is kept as written, with a warning when the key is
/// whole. The documented example has one: an API key under `key: ip`.
fn override_client(
    chk: &mut Checker<'_>,
    (key, whole): (&[KeyPart], bool),
    value: &str,
    path: &Path,
) -> String {
    match identity::override_key(key, value) {
        Ok(client) => client,
        Err(message) => {
            if whole {
                chk.warn(path.clone(), format!("matches no request: {message}"));
            }
            value.to_owned()
        }
    }
}

/// `duplicate_key`, with a warning when the key reads no header or query parameter.
fn duplicate_key(
    chk: &mut Checker<'_>,
    raw: &RawLimit,
    key: &[KeyPart],
    path: &Path,
) -> DuplicateKey {
    let Some(given) = raw.duplicate_key.get() else {
        return DuplicateKey::Reject;
    };
    if !key
        .iter()
        .any(|p| matches!(p, KeyPart::Header(_) | KeyPart::Query(_)))
    {
        let message = "has no effect: the key reads no header: or query: part";
        chk.warn(path.key("duplicate_key"), message);
    }
    match given {
        RawDuplicateKey::Reject => DuplicateKey::Reject,
        RawDuplicateKey::First => DuplicateKey::First,
        RawDuplicateKey::Last => DuplicateKey::Last,
    }
}

/// `charge`: the header is a valid name, the algorithm one that can take a charge, and
/// `missing` a whole number as `cost` is.
fn charge(
    chk: &mut Checker<'_>,
    raw: &RawCharge,
    kind: Option<RawAlgorithm>,
    path: &Path,
) -> Option<Charge> {
    if let Some(
        kind
        @ (RawAlgorithm::LeakyBucket | RawAlgorithm::SlidingWindow | RawAlgorithm::Concurrency),
    ) = kind
    {
        let why = match kind {
            RawAlgorithm::LeakyBucket => "a leaky bucket has paced the request already",
            RawAlgorithm::Concurrency => "a slot counts requests running, not what they used",
            _ => "a sliding log would need one entry per unit charged",
        };
        let message = format!(
            "charge needs token_bucket, fixed_window or sliding_window_counter, not {} ({why})",
            takes(kind).0
        );
        chk.key_error(path.clone(), message);
        return None;
    }
    let missing = whole(chk, &raw.missing, &path.key("missing"), "missing", |n| {
        u32::try_from(n).ok().and_then(NonZeroU32::new)
    });
    let name = chk.required(&raw.response_header, path, "response_header")?;
    let header_path = path.key("response_header");
    let response_header = match HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
    {
        Ok(header) => header,
        Err(_) => {
            chk.error(header_path, format!("not a valid header name: {name:?}"));
            return None;
        }
    };
    let missing = match missing {
        Param::Broken => return None,
        Param::Given(n, _) => Some(n),
        Param::Absent => None,
    };
    Some(Charge {
        response_header,
        missing,
    })
}

/// The names `key` accepts, for messages.
const KEY_PARTS: [&str; 6] = ["ip", "header:NAME", "query:NAME", "host", "path", "route"];

/// `ip`, `header:NAME`, `query:NAME`, `host`, `path` or `route`.
fn parse_key_part(text: &str) -> Result<KeyPart, String> {
    let t = text.trim();
    if let Some(name) = t.strip_prefix("header:") {
        return HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
            .map(KeyPart::Header)
            .map_err(|_| format!("not a valid header name in {text:?}"));
    }
    if let Some(name) = t.strip_prefix("query:") {
        if name.trim().is_empty() {
            return Err(format!(
                "query: needs a parameter name, as in query:api_key, found {text:?}"
            ));
        }
        return Ok(KeyPart::Query(name.trim().to_owned()));
    }
    match t {
        "ip" => Ok(KeyPart::Ip),
        "host" => Ok(KeyPart::Host),
        "path" => Ok(KeyPart::Path),
        "route" => Ok(KeyPart::Route),
        _ => Err(one_of(text, &KEY_PARTS)),
    }
}

/// One parameter: not written, written but invalid (reported), or valid at a path.
#[derive(Debug, Clone)]
enum Param<T> {
    Absent,
    Broken,
    Given(T, Path),
}

impl<T: Clone> Param<T> {
    fn value(&self) -> Option<T> {
        match self {
            Param::Given(v, _) => Some(v.clone()),
            Param::Absent | Param::Broken => None,
        }
    }

    fn path(&self) -> Option<&Path> {
        match self {
            Param::Given(_, p) => Some(p),
            Param::Absent | Param::Broken => None,
        }
    }

    fn is_broken(&self) -> bool {
        matches!(self, Param::Broken)
    }

    fn or(&self, base: &Param<T>) -> Param<T> {
        match self {
            Param::Absent => base.clone(),
            given => given.clone(),
        }
    }
}

/// The parameters written in one place (a limit or one override), parsed.
#[derive(Debug, Clone)]
struct Params {
    rate: Param<ParsedRate>,
    burst: Param<NonZeroU32>,
    cost: Param<NonZeroU32>,
    max_delay: Param<Duration>,
    limit: Param<NonZeroU64>,
    window: Param<Duration>,
    lease: Param<Duration>,
    /// the keys written, for the check that each belongs to the algorithm
    written: Vec<(&'static str, Path)>,
}

impl Params {
    fn read(chk: &mut Checker<'_>, raw: &RawParams, path: &Path) -> Params {
        let written = [
            ("rate", raw.rate.is_given()),
            ("burst", raw.burst.is_given()),
            ("cost", raw.cost.is_given()),
            ("max_delay", raw.max_delay.is_given()),
            ("limit", raw.limit.is_given()),
            ("window", raw.window.is_given()),
            ("lease", raw.lease.is_given()),
        ];
        Params {
            rate: text(chk, &raw.rate, &path.key("rate"), units::parse_rate),
            burst: whole(chk, &raw.burst, &path.key("burst"), "burst", |n| {
                u32::try_from(n).ok().and_then(NonZeroU32::new)
            }),
            cost: whole(chk, &raw.cost, &path.key("cost"), "cost", |n| {
                u32::try_from(n).ok().and_then(NonZeroU32::new)
            }),
            max_delay: text(
                chk,
                &raw.max_delay,
                &path.key("max_delay"),
                units::parse_duration,
            ),
            limit: whole(
                chk,
                &raw.limit,
                &path.key("limit"),
                "limit",
                NonZeroU64::new,
            ),
            window: text(chk, &raw.window, &path.key("window"), |w| {
                units::parse_duration(w).and_then(|d| {
                    if d.is_zero() {
                        Err(format!("window must be greater than zero, found {w:?}"))
                    } else {
                        Ok(d)
                    }
                })
            }),
            lease: text(chk, &raw.lease, &path.key("lease"), units::parse_duration),
            written: written
                .into_iter()
                .filter(|(_, given)| *given)
                .map(|(key, _)| (key, path.key(key)))
                .collect(),
        }
    }

    /// These parameters merged over `base`'s.
    fn over(&self, base: &Params) -> Params {
        Params {
            rate: self.rate.or(&base.rate),
            burst: self.burst.or(&base.burst),
            cost: self.cost.or(&base.cost),
            max_delay: self.max_delay.or(&base.max_delay),
            limit: self.limit.or(&base.limit),
            window: self.window.or(&base.window),
            lease: self.lease.or(&base.lease),
            written: self.written.clone(),
        }
    }

    /// Reports each written parameter that `kind` does not take.
    fn check_belongs(&self, chk: &mut Checker<'_>, kind: RawAlgorithm) {
        let (name, takes) = takes(kind);
        for (key, path) in &self.written {
            if !takes.contains(key) {
                let message = format!(
                    "{key} is not a parameter of {name}, which takes {}",
                    or_list(takes).replacen(" or ", " and ", 1)
                );
                chk.key_error(path.clone(), message);
            }
        }
    }

    /// The algorithm; `scope` is where these parameters were written (for a missing one, and
    /// to place a conflict between two on the one written there).
    fn build(&self, chk: &mut Checker<'_>, kind: RawAlgorithm, scope: &Path) -> Option<Algorithm> {
        let broken = [
            self.rate.is_broken(),
            self.burst.is_broken(),
            self.cost.is_broken(),
            self.max_delay.is_broken(),
            self.limit.is_broken(),
            self.window.is_broken(),
            self.lease.is_broken(),
        ];
        if broken.contains(&true) {
            return None;
        }
        let (name, _) = takes(kind);
        match kind {
            RawAlgorithm::TokenBucket => {
                let rate = self.require(chk, self.rate.value(), scope, name, "rate")?;
                self.bucket(chk, rate, scope).map(Algorithm::TokenBucket)
            }
            RawAlgorithm::LeakyBucket => {
                let rate = self.require(chk, self.rate.value(), scope, name, "rate")?;
                let pace = Pace::new(rate.rate, self.max_delay.value());
                self.report(chk, pace, scope).map(Algorithm::LeakyBucket)
            }
            RawAlgorithm::FixedWindow => self.window(chk, scope, name).map(Algorithm::FixedWindow),
            RawAlgorithm::SlidingWindow => {
                self.window(chk, scope, name).map(Algorithm::SlidingWindow)
            }
            RawAlgorithm::SlidingWindowCounter => self
                .window(chk, scope, name)
                .map(Algorithm::SlidingWindowCounter),
            RawAlgorithm::Concurrency => self.slots(chk, scope, name).map(Algorithm::Concurrency),
        }
    }

    /// A required parameter's value, or the report that it is missing.
    fn require<T>(
        &self,
        chk: &mut Checker<'_>,
        value: Option<T>,
        scope: &Path,
        algorithm: &str,
        key: &str,
    ) -> Option<T> {
        if value.is_none() {
            let message = format!("missing required key {key:?} ({algorithm} needs it)");
            chk.error(scope.clone(), message);
        }
        value
    }

    fn window(&self, chk: &mut Checker<'_>, scope: &Path, algorithm: &str) -> Option<Window> {
        let limit = self.require(chk, self.limit.value(), scope, algorithm, "limit");
        let window = self.require(chk, self.window.value(), scope, algorithm, "window");
        Some(Window::new(limit?, window?))
    }

    fn slots(&self, chk: &mut Checker<'_>, scope: &Path, algorithm: &str) -> Option<Slots> {
        let limit = self.require(chk, self.limit.value(), scope, algorithm, "limit")?;
        let at = |p: Option<&Path>| p.cloned().unwrap_or_else(|| scope.clone());
        let Some(limit) = u32::try_from(limit.get()).ok().and_then(NonZeroU32::new) else {
            let message = format!("limit is too large, found {limit}");
            chk.error(at(self.limit.path()), message);
            return None;
        };
        let lease = self.lease.value().unwrap_or(Slots::DEFAULT_LEASE);
        self.report(chk, Slots::new(limit, lease), &at(self.lease.path()))
    }

    fn bucket(&self, chk: &mut Checker<'_>, rate: ParsedRate, scope: &Path) -> Option<Bucket> {
        // Default burst: the rate's N rounded up, so `10/s` admits 10 at once, and `0.5/s` 1.
        let default_burst =
            NonZeroU32::new(rate.count.ceil().clamp(1.0, f64::from(u32::MAX)) as u32)
                .unwrap_or(NonZeroU32::MIN);
        let burst = self.burst.value().unwrap_or(default_burst);
        let cost = self.cost.value().unwrap_or(NonZeroU32::MIN);
        let bucket = Bucket::new(rate.rate, burst, cost);
        // The conflict is placed on whichever of the two was written in this scope.
        let site = [self.cost.path(), self.burst.path()]
            .into_iter()
            .flatten()
            .find(|p| p.starts_with(scope))
            .cloned()
            .unwrap_or_else(|| scope.clone());
        self.report(chk, bucket, &site)
    }

    fn report<T>(
        &self,
        chk: &mut Checker<'_>,
        built: Result<T, ParamError>,
        at: &Path,
    ) -> Option<T> {
        built.map_err(|e| chk.error(at.clone(), e.to_string())).ok()
    }
}

/// The algorithm's name in the file and the parameters it takes.
fn takes(kind: RawAlgorithm) -> (&'static str, &'static [&'static str]) {
    match kind {
        RawAlgorithm::TokenBucket => ("token_bucket", &["rate", "burst", "cost"]),
        RawAlgorithm::LeakyBucket => ("leaky_bucket", &["rate", "max_delay"]),
        RawAlgorithm::FixedWindow => ("fixed_window", &["limit", "window"]),
        RawAlgorithm::SlidingWindow => ("sliding_window", &["limit", "window"]),
        RawAlgorithm::SlidingWindowCounter => ("sliding_window_counter", &["limit", "window"]),
        RawAlgorithm::Concurrency => ("concurrency", &["limit", "lease"]),
    }
}

fn text<T>(
    chk: &mut Checker<'_>,
    field: &Field<String>,
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Param<T> {
    match field {
        Field::Absent => Param::Absent,
        Field::Invalid => Param::Broken,
        Field::Present(_) => match chk.parse(field, path, parse) {
            Some(v) => Param::Given(v, path.clone()),
            None => Param::Broken,
        },
    }
}

fn whole<T>(
    chk: &mut Checker<'_>,
    field: &Field<u64>,
    path: &Path,
    key: &str,
    convert: impl FnOnce(u64) -> Option<T>,
) -> Param<T> {
    match field {
        Field::Absent => Param::Absent,
        Field::Invalid => Param::Broken,
        Field::Present(n) => match convert(*n) {
            Some(v) => Param::Given(v, path.clone()),
            None if *n == 0 => {
                chk.error(path.clone(), format!("{key} must be at least 1, found 0"));
                Param::Broken
            }
            None => {
                chk.error(path.clone(), format!("{key} is too large, found {n}"));
                Param::Broken
            }
        },
    }
}
