//! `store`: the backend (memory, one Redis server, a Redis Cluster, or the master that Redis
//! Sentinels name), its URLs, and the failure policy; and the redaction of passwords in Redis
//! URLs for messages and summaries. `store.tls` is in `client_tls.rs`, which reads the backend
//! this file finds.

use std::num::{NonZeroU32, NonZeroUsize};

use super::check::Checker;
use super::problem::Path;
use super::raw::{RawBackend, RawOnError, RawSentinel, RawStore, StrList};
use super::types::{Backend, OnError, SentinelConfig, StoreConfig};

/// Validates `store`; no `store` is the memory store with every default.
pub(crate) fn store(chk: &mut Checker<'_>, raw: Option<&RawStore>) -> StoreConfig {
    let default = StoreConfig::default();
    let Some(raw) = raw else {
        return default;
    };
    let path = Path::root().key("store");
    let timeout = chk.duration(&raw.timeout, &path.key("timeout"), default.timeout);
    let key_prefix = match raw.key_prefix.get() {
        Some(p) if p.is_empty() => {
            chk.error(path.key("key_prefix"), "must not be empty");
            default.key_prefix.clone()
        }
        Some(p) => p.clone(),
        None => default.key_prefix.clone(),
    };
    let instances = chk
        .positive(&raw.instances, &path.key("instances"), "instances")
        .map(|n| {
            u32::try_from(n).map_err(|_| {
                let message = format!("instances must be at most {}, found {n}", u32::MAX);
                chk.error(path.key("instances"), message);
            })
        })
        .and_then(Result::ok)
        .and_then(NonZeroU32::new)
        .unwrap_or(default.instances);
    let max_keys = chk
        .positive(&raw.max_keys, &path.key("max_keys"), "max_keys")
        .and_then(|n| NonZeroUsize::new(usize::try_from(n).unwrap_or(usize::MAX)))
        .unwrap_or(default.max_keys);
    let backend = backend(chk, raw, &path);
    StoreConfig {
        // `tls` reads the backend: `store` below fills it in
        tls: None,
        backend,
        key_prefix,
        timeout,
        on_error: match raw.on_error.get() {
            Some(RawOnError::Allow) => OnError::Allow,
            Some(RawOnError::Deny) => OnError::Deny,
            Some(RawOnError::Local) | None => OnError::Local,
        },
        instances,
        max_keys,
        leases: raw.leases.get().copied().unwrap_or(default.leases),
    }
}

/// The keys that each name a Redis backend; exactly one may be given.
const REDIS_KEYS: [&str; 3] = ["url", "cluster", "sentinel"];

/// Whether the file asks for Redis: `backend: redis`, or no `backend` and a Redis key.
pub(crate) fn wants_redis(raw: &RawStore) -> bool {
    match raw.backend.get() {
        Some(RawBackend::Redis) => true,
        Some(RawBackend::Memory) => false,
        // silently running on memory next to a configured Redis would be the worse reading
        None => !given_keys(raw).is_empty(),
    }
}

fn given_keys(raw: &RawStore) -> Vec<&'static str> {
    let given = [
        raw.url.is_given(),
        raw.cluster.is_given(),
        raw.sentinel.is_given(),
    ];
    REDIS_KEYS
        .into_iter()
        .zip(given)
        .filter_map(|(key, given)| given.then_some(key))
        .collect()
}

fn backend(chk: &mut Checker<'_>, raw: &RawStore, path: &Path) -> Backend {
    let given = given_keys(raw);
    if !wants_redis(raw) {
        for key in given {
            chk.key_error(
                path.key(key),
                format!("{key} is only used with backend: redis"),
            );
        }
        return Backend::Memory;
    }
    match given.as_slice() {
        [] => {
            let message = "backend redis needs url (one server), cluster (a list of nodes) or \
                           sentinel (a master watched by Sentinels)";
            chk.error(path.clone(), message);
            Backend::Memory
        }
        [first, second, ..] => {
            chk.key_error(
                path.key(second),
                format!(
                    "give one of url (one server), cluster or sentinel, not {first} and {second}"
                ),
            );
            Backend::Memory
        }
        ["url"] => chk
            .parse(&raw.url, &path.key("url"), parse_redis_url)
            .map_or(Backend::Memory, |url| Backend::Redis { url }),
        ["cluster"] => cluster(chk, raw, path),
        _ => raw
            .sentinel
            .get()
            .and_then(|s| sentinel(chk, s, &path.key("sentinel")))
            .map_or(Backend::Memory, Backend::Sentinel),
    }
}

fn cluster(chk: &mut Checker<'_>, raw: &RawStore, path: &Path) -> Backend {
    if raw.cluster.get().is_some_and(StrList::is_empty) {
        chk.error(path.key("cluster"), "needs at least one node URL");
    }
    let urls = chk.parse_list(&raw.cluster, &path.key("cluster"), parse_cluster_url);
    // the Cluster client signs in to every node with one user and password
    let signs_in = |url: &String| {
        let info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).ok()?;
        let settings = info.redis_settings();
        Some((
            settings.username().map(str::to_owned),
            settings.password().map(str::to_owned),
        ))
    };
    if let Some(other) = urls.iter().position(|u| signs_in(u) != signs_in(&urls[0])) {
        chk.error(
            path.key("cluster"),
            format!(
                "every node URL must give the same user and password (the Cluster client \
                 signs in to all nodes with one): node {other} differs from node 0"
            ),
        );
    }
    // and over TLS or not: the nodes it learns from the cluster come with no scheme
    let tls = |url: &String| url.trim_start().starts_with("rediss://");
    if let Some(other) = urls.iter().position(|u| tls(u) != tls(&urls[0])) {
        chk.error(
            path.key("cluster"),
            format!(
                "every node URL must be redis:// or every one rediss:// (the Cluster client \
                 reaches all nodes the same way): node {other} differs from node 0"
            ),
        );
    }
    Backend::Cluster { urls }
}

/// `store.sentinel`: the master's name, the Sentinels, and how to sign in to the master.
fn sentinel(chk: &mut Checker<'_>, raw: &RawSentinel, path: &Path) -> Option<SentinelConfig> {
    let master_name = chk.required(&raw.master_name, path, "master_name").cloned();
    if let Some(name) = &master_name {
        if name.is_empty() || name.contains(char::is_whitespace) {
            let message = format!("expected the name the Sentinels monitor, found {name:?}");
            chk.error(path.key("master_name"), message);
        }
    }
    chk.required(&raw.nodes, path, "nodes");
    if raw.nodes.get().is_some_and(StrList::is_empty) {
        chk.error(
            path.key("nodes"),
            "needs at least one Sentinel, such as redis://10.0.0.1:26379",
        );
    }
    let nodes = chk.parse_list(&raw.nodes, &path.key("nodes"), parse_sentinel_url);
    let over_tls = nodes.iter().filter(|u| u.starts_with("rediss://")).count();
    if over_tls != 0 && over_tls != nodes.len() {
        chk.error(
            path.key("nodes"),
            "every Sentinel URL must use the same scheme: tollgate reaches the master as it \
             reaches them, over TLS with rediss:// or without it with redis://",
        );
    }
    if raw.username.get().is_some() && !raw.password.is_given() {
        chk.error(
            path.key("username"),
            "a username needs a password (Redis's AUTH takes both)",
        );
    }
    let db = match raw.db.get() {
        Some(&db) => i64::try_from(db)
            .map_err(|_| chk.error(path.key("db"), format!("db must be at most {}", i64::MAX)))
            .ok()?,
        None => 0,
    };
    Some(SentinelConfig {
        master_name: master_name?,
        nodes,
        username: raw.username.get().cloned(),
        password: raw.password.get().cloned(),
        db,
    })
}

/// `redis://`, `rediss://`, `redis+unix://` or `unix://` followed by something.
fn parse_redis_url(text: &str) -> Result<String, String> {
    checked_url(text).map(|(url, _)| url)
}

/// A Cluster node's URL: as [`parse_redis_url`], and no database but 0 (a Cluster has no
/// other; the node would refuse the `SELECT`).
fn parse_cluster_url(text: &str) -> Result<String, String> {
    let (url, db) = checked_url(text)?;
    if db != 0 {
        return Err(format!(
            "a Redis Cluster has only database 0; leave /{db} out of {:?}",
            redact_url(&url)
        ));
    }
    Ok(url)
}

/// A Sentinel's URL: `redis://` or `rediss://`, without a database (a Sentinel has none).
fn parse_sentinel_url(text: &str) -> Result<String, String> {
    let (url, db) = checked_url(text)?;
    if !url.starts_with("redis://") && !url.starts_with("rediss://") {
        return Err(format!(
            "a Sentinel is reached over TCP: expected redis://HOST:PORT or rediss://HOST:PORT, \
             found {:?}",
            redact_url(&url)
        ));
    }
    if db != 0 {
        return Err(format!(
            "a Sentinel has no databases: give the master's as sentinel.db, and leave /{db} out \
             of {:?}",
            redact_url(&url)
        ));
    }
    if url.ends_with("#insecure") {
        return Err(format!(
            "#insecure does not apply to Sentinels; store.tls.verify: false turns verification \
             off for them and the master: {:?}",
            redact_url(&url)
        ));
    }
    Ok(url)
}

/// The URL, trimmed, and the database it selects: read by the store's own parser, so that a URL
/// that passes here also opens at start-up.
fn checked_url(text: &str) -> Result<(String, i64), String> {
    let t = text.trim();
    let schemes = ["redis://", "rediss://", "redis+unix://", "unix://"];
    match schemes.iter().find_map(|s| t.strip_prefix(s)) {
        Some(rest) if !rest.is_empty() => match redis::IntoConnectionInfo::into_connection_info(t) {
            Ok(info) => {
                unread_parameter(t)?;
                Ok((t.to_owned(), info.redis_settings().db()))
            }
            Err(e) => {
                // redis-rs's reason where it has a specific one (none quotes the URL)
                let reason = match e.detail() {
                    Some(detail) => detail.to_owned(),
                    None if e.to_string().contains("did not parse") => {
                        "bad host, port or database".to_owned()
                    }
                    // "Invalid database number - InvalidClientConfig": the kind is noise here
                    None => {
                        let text = e.to_string();
                        text.rsplit_once(" - ").map_or(text.clone(), |(r, _)| r.to_owned())
                    }
                };
                Err(format!(
                    "not a Redis URL that can be used ({reason}): {:?}",
                    redact_url(t)
                ))
            }
        },
        _ => Err(format!(
            "expected a URL starting with redis://, rediss://, redis+unix:// or unix://, found {:?}",
            redact_url(t)
        )),
    }
}

/// An error for a query parameter the Redis client does not read (it would be ignored, the
/// password of `?password=` above all, and the server then refuses every call).
fn unread_parameter(url: &str) -> Result<(), String> {
    let unix = url.starts_with("redis+unix://") || url.starts_with("unix://");
    let read: &[&str] = if unix {
        &["db", "user", "pass", "protocol"]
    } else {
        &["protocol"]
    };
    // (after the user-info, which may hold a `?`)
    let after_user = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let Some((_, query)) = after_user.split_once('?') else {
        return Ok(());
    };
    let query = query.split('#').next().unwrap_or_default();
    for name in query
        .split('&')
        .map(|p| p.split('=').next().unwrap_or_default())
    {
        if name.is_empty() || read.contains(&name) {
            continue;
        }
        let hint = match (unix, name) {
            (false, "pass" | "password") => {
                "a password goes in the user-info: redis://:PASSWORD@host:port/db".to_owned()
            }
            (true, "password") => "the password parameter is `pass=`".to_owned(),
            _ => format!("those read are {}", read.join(", ")),
        };
        return Err(format!(
            "the Redis client does not read the URL's `{name}` parameter ({hint}): {:?}",
            redact_url(url)
        ));
    }
    Ok(())
}

/// A URL with its password replaced by `***`, for messages and summaries: the user-info's
/// (`redis://user:pw@host`) and a `pass=` or `password=` query parameter's (the form
/// `redis+unix://` URLs carry it in).
pub(crate) fn redact_url(url: &str) -> String {
    // the user-info first, up to the last `@` (a password may hold a `?`), then the query
    // after what is left
    let hidden = redact_user_info(url);
    let Some((base, query)) = hidden.split_once('?') else {
        return hidden;
    };
    let params: Vec<String> = query
        .split('&')
        .map(|param| match param.split_once('=') {
            Some((key, _)) if key == "pass" || key == "password" => format!("{key}=***"),
            _ => param.to_owned(),
        })
        .collect();
    format!("{base}?{}", params.join("&"))
}

fn redact_user_info(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // the authority ends at the first `/` after its last `@` (a password may hold `/` or `?`)
    let at_end = rest.rfind('@').map_or(0, |at| at + 1);
    let authority_end = rest[at_end..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| at_end + i);
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user_info = &rest[..at];
            let user = user_info.split_once(':').map_or("", |(user, _)| user);
            let hidden = if user_info.contains(':') {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{scheme}://{hidden}{}", &rest[at..])
        }
        None => url.to_owned(),
    }
}
