//! The serde mirror of `proxy.yaml`: every key the file may hold, nothing checked beyond types.
//!
//! Every struct denies unknown keys (a misspelt `burts:` must not silently leave a limit at its
//! default). Every field is a [`Field`], so that one bad value does not hide the next (see
//! [`super::de`]); values with a format of their own (durations, rates, addresses) are kept as
//! text here and parsed in [`super::validate`], which knows their key paths.

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::problem::Path;

/// A field of the raw mirror: absent (or null), present but invalid (already reported), or
/// present and well-typed.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) enum Field<T> {
    /// not in the file, or `~`
    #[default]
    Absent,
    /// in the file but unusable; the problem is already recorded
    Invalid,
    /// in the file and of the right type
    Present(T),
}

impl<T> Field<T> {
    /// The value if present and valid.
    pub fn get(&self) -> Option<&T> {
        match self {
            Field::Present(v) => Some(v),
            Field::Absent | Field::Invalid => None,
        }
    }

    /// Whether the key is in the file at all (valid or not).
    pub fn is_given(&self) -> bool {
        !matches!(self, Field::Absent)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Field<T>, D::Error> {
        // The error is dropped here because `NodeDe` recorded it (see `super::de`): raw types
        // are read only through `de::from_node`.
        Ok(match Option::<T>::deserialize(d) {
            Ok(Some(v)) => Field::Present(v),
            Ok(None) => Field::Absent,
            Err(_) => Field::Invalid,
        })
    }
}

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub listen: Field<StrList>,
    pub workers: Field<u64>,
    pub tls: Field<RawTls>,
    pub admin: Field<RawAdmin>,
    pub store: Field<RawStore>,
    pub trusted_proxies: Field<StrList>,
    pub rate_limit_headers: Field<RawHeaderStyle>,
    pub timeouts: Field<RawTimeouts>,
    pub max_body_size: Field<String>,
    pub paths: Field<RawPaths>,
    pub access_log: Field<RawAccessLog>,
    pub forwarded_headers: Field<RawForwardedHeaders>,
    pub upstreams: Field<Entries<Field<RawUpstream>>>,
    pub routes: Field<Vec<Field<RawRoute>>>,
}

/// `tls`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawTls {
    pub cert: Field<String>,
    pub key: Field<String>,
}

/// `admin`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub listen: Field<String>,
    pub token: Field<String>,
    pub token_file: Field<String>,
    pub max_connections: Field<u64>,
    pub hosts: Field<StrList>,
}

/// `store`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawStore {
    pub backend: Field<RawBackend>,
    pub url: Field<String>,
    pub cluster: Field<StrList>,
    pub key_prefix: Field<String>,
    pub timeout: Field<String>,
    pub on_error: Field<RawOnError>,
    pub instances: Field<u64>,
    pub max_keys: Field<u64>,
    pub leases: Field<bool>,
    pub sentinel: Field<RawSentinel>,
    pub tls: Field<RawClientTls>,
}

/// `store.sentinel`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawSentinel {
    pub master_name: Field<String>,
    pub nodes: Field<StrList>,
    pub username: Field<String>,
    pub password: Field<String>,
    pub db: Field<u64>,
}

/// `store.backend`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawBackend {
    Memory,
    Redis,
}

/// `store.on_error`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawOnError {
    Allow,
    Deny,
    Local,
}

/// `rate_limit_headers`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawHeaderStyle {
    Ietf,
    Legacy,
    Both,
    None,
}

/// `paths`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawPaths {
    pub escaped_slashes: Field<RawEscapedSlashes>,
    pub segment_params: Field<RawSegmentParams>,
}

/// `paths.escaped_slashes`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawEscapedSlashes {
    Reject,
    Decode,
    Keep,
}

/// `paths.segment_params`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawSegmentParams {
    Ignore,
    Keep,
}

/// `access_log`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawAccessLog {
    pub query: Field<bool>,
    pub client: Field<RawLogClient>,
}

/// `forwarded_headers`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawForwardedHeaders {
    pub x_real_ip: Field<bool>,
    pub forwarded: Field<bool>,
}

/// `access_log.client`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawLogClient {
    Address,
    Hash,
}

/// `timeouts`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawTimeouts {
    pub client_header: Field<String>,
    pub upstream_connect: Field<String>,
    pub upstream_response: Field<String>,
    pub idle: Field<String>,
    pub send: Field<String>,
    pub linger: Field<String>,
    pub shutdown: Field<String>,
}

/// `upstreams.NAME`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub targets: Field<StrList>,
    pub preserve_host: Field<bool>,
    pub pace: Field<RawPace>,
    pub protocol: Field<RawProtocol>,
    pub http2: Field<RawHttp2>,
    pub tls: Field<RawClientTls>,
}

/// `upstreams.NAME.http2`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawHttp2 {
    pub keepalive_interval: Field<String>,
    pub keepalive_timeout: Field<String>,
    pub max_connections: Field<u64>,
}

/// `upstreams.NAME.protocol`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawProtocol {
    Http1,
    Http2,
    Auto,
}

/// `upstreams.NAME.tls` and `store.tls`: how tollgate checks a server and shows itself to it
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawClientTls {
    pub ca: Field<String>,
    pub cert: Field<String>,
    pub key: Field<String>,
    pub server_name: Field<String>,
    pub verify: Field<bool>,
}

/// `upstreams.NAME.pace`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawPace {
    pub rate: Field<String>,
    pub max_delay: Field<String>,
    pub max_waiting: Field<u64>,
    pub concurrency: Field<u64>,
    pub adaptive: Field<RawAdaptive>,
}

/// `upstreams.NAME.pace.adaptive`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawAdaptive {
    pub min: Field<String>,
    pub max: Field<String>,
    pub target_latency: Field<String>,
    pub increase: Field<String>,
    pub decrease: Field<f64>,
    pub interval: Field<String>,
}

/// `routes[N]`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub name: Field<String>,
    #[serde(rename = "match")]
    pub matcher: Field<RawMatch>,
    pub strip_prefix: Field<bool>,
    pub upstream: Field<String>,
    pub limits: Field<Vec<Field<RawLimit>>>,
}

/// `routes[N].match`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub host: Field<String>,
    pub path_prefix: Field<String>,
    pub path: Field<String>,
    pub methods: Field<StrList>,
    pub headers: Field<Entries<Field<String>>>,
    pub case_sensitive: Field<bool>,
}

/// `routes[N].limits[M]`: the limit's own keys and every algorithm parameter; which
/// parameters belong to which algorithm is checked in validation, with a better message than
/// "unknown key".
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawLimit {
    pub name: Field<String>,
    pub algorithm: Field<RawAlgorithm>,
    pub key: Field<StrList>,
    pub mode: Field<RawMode>,
    pub exempt: Field<StrList>,
    pub overrides: Field<Entries<Field<RawParams>>>,
    pub rate: Field<String>,
    pub burst: Field<u64>,
    pub cost: Field<u64>,
    pub max_delay: Field<String>,
    pub limit: Field<u64>,
    pub window: Field<String>,
    pub lease: Field<String>,
    pub charge: Field<RawCharge>,
    pub duplicate_key: Field<RawDuplicateKey>,
}

/// `routes[N].limits[M].charge`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawCharge {
    pub response_header: Field<String>,
    pub missing: Field<u64>,
}

impl RawLimit {
    /// The algorithm parameters of the limit itself.
    pub fn params(&self) -> RawParams {
        RawParams {
            rate: self.rate.clone(),
            burst: self.burst.clone(),
            cost: self.cost.clone(),
            max_delay: self.max_delay.clone(),
            limit: self.limit.clone(),
            window: self.window.clone(),
            lease: self.lease.clone(),
        }
    }
}

/// Algorithm parameters: a limit's own, or one entry of its `overrides`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawParams {
    pub rate: Field<String>,
    pub burst: Field<u64>,
    pub cost: Field<u64>,
    pub max_delay: Field<String>,
    pub limit: Field<u64>,
    pub window: Field<String>,
    pub lease: Field<String>,
}

/// `routes[N].limits[M].algorithm`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawAlgorithm {
    TokenBucket,
    LeakyBucket,
    FixedWindow,
    SlidingWindow,
    SlidingWindowCounter,
    Concurrency,
}

/// `routes[N].limits[M].duplicate_key`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawDuplicateKey {
    Reject,
    First,
    Last,
}

/// `routes[N].limits[M].mode`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawMode {
    Enforce,
    Shadow,
}

/// A mapping whose keys are names chosen by the user (upstreams, header matches, overrides),
/// kept in file order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Entries<T>(pub Vec<(String, T)>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entries<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Entries<T>, D::Error> {
        struct EntriesVisitor<T>(std::marker::PhantomData<T>);

        impl<'de, T: Deserialize<'de>> Visitor<'de> for EntriesVisitor<T> {
            type Value = Entries<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<T>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, T>()? {
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }

        d.deserialize_map(EntriesVisitor(std::marker::PhantomData))
    }
}

/// One string or a list of strings (`key: ip` or `key: [ip, header:x-api-key]`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StrList {
    /// the single form
    One(String),
    /// the list form; each item may be invalid on its own
    Many(Vec<Field<String>>),
}

impl StrList {
    /// Each valid item with its key path (`listen` for the single form, `listen[1]` for the
    /// list form); invalid items are already reported and left out.
    pub fn items(&self, path: &Path) -> Vec<(Path, &str)> {
        match self {
            StrList::One(s) => vec![(path.clone(), s.as_str())],
            StrList::Many(items) => items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| item.get().map(|s| (path.index(i), s.as_str())))
                .collect(),
        }
    }

    /// Whether the list form is empty.
    pub fn is_empty(&self) -> bool {
        matches!(self, StrList::Many(items) if items.is_empty())
    }
}

impl<'de> Deserialize<'de> for StrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<StrList, D::Error> {
        d.deserialize_any(StrListVisitor)
    }
}

struct StrListVisitor;

macro_rules! one_from_text {
    ($($name:ident($ty:ty)),*) => {
        $(fn $name<E: de::Error>(self, v: $ty) -> Result<StrList, E> {
            Ok(StrList::One(v.to_string()))
        })*
    };
}

impl<'de> Visitor<'de> for StrListVisitor {
    type Value = StrList;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string or a list of strings")
    }

    one_from_text!(
        visit_str(&str),
        visit_u64(u64),
        visit_i64(i64),
        visit_f64(f64)
    );
    one_from_text!(visit_bool(bool));

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrList, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Field<String>>()? {
            items.push(item);
        }
        Ok(StrList::Many(items))
    }
}
