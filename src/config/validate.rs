//! From the raw mirror to the typed [`Config`]: parses every formatted value, fills in defaults,
//! checks cross references, and collects every problem with its key path.
//!
//! This file holds the checker, the top-level keys and `upstreams`; `store` is in
//! [`super::backend`], routes and matches in [`super::routes`], limits in [`super::limits`].

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;

use super::adaptive;
use super::backend;
use super::check::{check_name, parse_net, Checker};
use super::client_tls;
use super::problem::Path;
use super::raw::{
    Field, RawAccessLog, RawAdmin, RawConfig, RawEscapedSlashes, RawForwardedHeaders,
    RawHeaderStyle, RawHttp2, RawLogClient, RawPace, RawPaths, RawProtocol, RawSegmentParams,
    RawStore, RawTimeouts, RawUpstream, StrList,
};
use super::routes;
use super::types::{
    AccessLog, AdminConfig, AdminToken, Config, ForwardedHeaders, HeaderStyle, Http2Config,
    LogClient, PaceConcurrency, Protocol, RouteConfig, StoreConfig, Timeouts, TlsConfig,
    UpstreamConfig,
};
use super::units;
use crate::limit::{Pace, Slots};
use crate::routing::{AuthorityFault, EscapedSlashes, PathPolicy, SegmentParams};
use http::uri::Scheme;
use ipnet::IpNet;

/// Builds the typed config. The config is meaningful only when `chk.errors` stays empty.
pub(crate) fn config(chk: &mut Checker<'_>, raw: &RawConfig) -> Config {
    let root = Path::root();
    let listen = listen(chk, raw);
    let workers = chk
        .positive(&raw.workers, &root.key("workers"), "workers")
        .and_then(|n| NonZeroUsize::new(usize::try_from(n).unwrap_or(usize::MAX)));
    let tls = raw
        .tls
        .get()
        .and_then(|t| tls(chk, t.cert.clone(), t.key.clone()));
    let admin = raw.admin.get().and_then(|a| admin(chk, a, &listen));
    let upstreams = upstreams(chk, raw);
    // Every name written under `upstreams`, valid or not: a route naming an upstream whose own
    // problem is already reported must not add "no upstream named ..." on top; nor may every
    // route when `upstreams` itself is invalid (`None`: references are not checked).
    let names: Option<Vec<&str>> = match &raw.upstreams {
        Field::Invalid => None,
        field => Some(field.get().map_or(Vec::new(), |e| {
            e.0.iter().map(|(name, _)| name.as_str()).collect()
        })),
    };
    let paths = paths(raw.paths.get());
    let routes = routes::routes(chk, &raw.routes, names.as_deref(), &paths);
    warn_unused(chk, &upstreams, &routes);
    let trusted_proxies = trusted_proxies(chk, raw);
    Config {
        listen,
        workers,
        tls,
        admin,
        store: store(chk, raw.store.get()),
        trusted_proxies,
        rate_limit_headers: match raw.rate_limit_headers.get() {
            Some(RawHeaderStyle::Ietf) | None => HeaderStyle::Ietf,
            Some(RawHeaderStyle::Legacy) => HeaderStyle::Legacy,
            Some(RawHeaderStyle::Both) => HeaderStyle::Both,
            Some(RawHeaderStyle::None) => HeaderStyle::None,
        },
        timeouts: raw
            .timeouts
            .get()
            .map_or_else(Timeouts::default, |t| timeouts(chk, t)),
        // 0 is no bound, as nginx's `client_max_body_size 0`
        max_body_size: chk
            .parse(
                &raw.max_body_size,
                &root.key("max_body_size"),
                units::parse_size,
            )
            .filter(|&size| size > 0),
        paths,
        access_log: access_log(raw.access_log.get()),
        forwarded_headers: forwarded_headers(raw.forwarded_headers.get()),
        upstreams,
        routes,
    }
}

/// `admin`, checked against the proxy's listeners: `None` when it has an error.
fn admin(chk: &mut Checker<'_>, a: &RawAdmin, listen: &[SocketAddr]) -> Option<AdminConfig> {
    let path = Path::root().key("admin");
    chk.required(&a.listen, &path, "listen")?;
    let addr = chk.parse(&a.listen, &path.key("listen"), parse_addr)?;
    // port 0 asks the system for a free port: two of those never collide
    if listen.iter().any(|l| collide(l, &addr)) {
        let message = format!("{addr} is also a proxy listener's port; give admin its own port");
        chk.error(path.key("listen"), message);
    }
    let max_connections = chk
        .positive(
            &a.max_connections,
            &path.key("max_connections"),
            "max_connections",
        )
        .map_or(AdminConfig::DEFAULT_MAX_CONNECTIONS, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        });
    let token = admin_token(chk, a, &path);
    if token.is_none() && !addr.ip().is_loopback() {
        let message = format!(
            "{addr} is not a loopback address and admin.token is not set: anyone who can \
             reach it can read /api/stats, which names clients; set admin.token, or listen \
             on 127.0.0.1"
        );
        chk.warn(path.key("listen"), message);
    }
    Some(AdminConfig {
        listen: addr,
        token,
        max_connections,
        hosts: chk.parse_list(&a.hosts, &path.key("hosts"), parse_admin_host),
    })
}

/// Warns of each upstream no route sends to.
fn warn_unused(chk: &mut Checker<'_>, upstreams: &[UpstreamConfig], routes: &[RouteConfig]) {
    for upstream in upstreams {
        if !routes.iter().any(|r| r.upstream == upstream.name) {
            let path = Path::root().key("upstreams").key(&upstream.name);
            let message = format!("upstream {:?} is not used by any route", upstream.name);
            chk.warn(path, message);
        }
    }
}

/// `trusted_proxies`, with a warning for a network of every address.
fn trusted_proxies(chk: &mut Checker<'_>, raw: &RawConfig) -> Vec<IpNet> {
    let root = Path::root();
    let trusted_proxies = chk.parse_list(
        &raw.trusted_proxies,
        &root.key("trusted_proxies"),
        parse_net,
    );
    // a network of every address trusts any client to name itself in X-Forwarded-For
    if let Some(list) = raw.trusted_proxies.get() {
        for (path, text) in list.items(&root.key("trusted_proxies")) {
            if parse_net(text).is_ok_and(|net| net.prefix_len() == 0) {
                let message = format!(
                    "{text:?} trusts every peer: any client can choose the address it is limited \
                     by with X-Forwarded-For; list the proxies in front of tollgate"
                );
                chk.warn(path, message);
            }
        }
    }
    trusted_proxies
}

/// `access_log`, with its defaults: no query, the client's address.
fn access_log(raw: Option<&RawAccessLog>) -> AccessLog {
    let Some(raw) = raw else {
        return AccessLog::default();
    };
    AccessLog {
        query: raw.query.get().copied().unwrap_or(false),
        client: match raw.client.get() {
            Some(RawLogClient::Address) | None => LogClient::Address,
            Some(RawLogClient::Hash) => LogClient::Hash,
        },
    }
}

/// `forwarded_headers`, with its defaults: both headers set by tollgate.
fn forwarded_headers(raw: Option<&RawForwardedHeaders>) -> ForwardedHeaders {
    let on = ForwardedHeaders::default();
    let Some(raw) = raw else {
        return on;
    };
    ForwardedHeaders {
        x_real_ip: raw.x_real_ip.get().copied().unwrap_or(on.x_real_ip),
        forwarded: raw.forwarded.get().copied().unwrap_or(on.forwarded),
    }
}

/// One `admin.hosts` entry: a host name as a `Host` header carries it, without port or scheme;
/// kept lowercase and without a trailing dot, the form requests are compared in.
fn parse_admin_host(text: &str) -> Result<String, String> {
    let name = text.trim().trim_end_matches('.').to_ascii_lowercase();
    let fits = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_');
    if name.is_empty() || !name.bytes().all(fits) {
        return Err(format!(
            "expected a host name such as console.example.com, without port or scheme, \
             found {text:?}"
        ));
    }
    Ok(name)
}

/// `paths`, with its defaults: refuse encoded slashes, ignore `;parameters` when matching.
fn paths(raw: Option<&RawPaths>) -> PathPolicy {
    let Some(raw) = raw else {
        return PathPolicy::default();
    };
    PathPolicy {
        escaped_slashes: match raw.escaped_slashes.get() {
            Some(RawEscapedSlashes::Reject) | None => EscapedSlashes::Reject,
            Some(RawEscapedSlashes::Decode) => EscapedSlashes::Decode,
            Some(RawEscapedSlashes::Keep) => EscapedSlashes::Keep,
        },
        segment_params: match raw.segment_params.get() {
            Some(RawSegmentParams::Ignore) | None => SegmentParams::Ignore,
            Some(RawSegmentParams::Keep) => SegmentParams::Keep,
        },
    }
}

/// Whether two listeners cannot both be bound: the same port (not 0, which asks for a free one)
/// on the same address, or on a wildcard address that covers the other (`0.0.0.0` every IPv4
/// address; `[::]` every address, IPv4 too, as Linux binds it by default).
fn collide(a: &SocketAddr, b: &SocketAddr) -> bool {
    let covers =
        |x: &SocketAddr, y: &SocketAddr| x.ip().is_unspecified() && (x.is_ipv6() || y.is_ipv4());
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

fn listen(chk: &mut Checker<'_>, raw: &RawConfig) -> Vec<SocketAddr> {
    let path = Path::root().key("listen");
    chk.required(&raw.listen, &Path::root(), "listen");
    if raw.listen.get().is_some_and(StrList::is_empty) {
        chk.error(
            path.clone(),
            "needs at least one address, such as 0.0.0.0:8080",
        );
    }
    let Some(list) = raw.listen.get() else {
        return Vec::new();
    };
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for (item_path, text) in chk.strings(list, &path) {
        match parse_addr(text) {
            Ok(addr) if addrs.contains(&addr) && addr.port() != 0 => {
                chk.error(item_path, format!("{addr} is listed twice"));
            }
            Ok(addr) if let Some(other) = addrs.iter().find(|a| collide(a, &addr)) => {
                let message = format!("{addr} and {other} are one port: only one can listen");
                chk.error(item_path, message);
            }
            Ok(addr) => addrs.push(addr),
            Err(message) => chk.error(item_path, message),
        }
    }
    addrs
}

fn tls(chk: &mut Checker<'_>, cert: Field<String>, key: Field<String>) -> Option<TlsConfig> {
    let path = Path::root().key("tls");
    let mut file = |field: &Field<String>, name: &str| -> Option<PathBuf> {
        let text = chk.required(field, &path, name)?;
        if text.is_empty() {
            chk.error(path.key(name), "expected a file path, found \"\"");
            return None;
        }
        Some(PathBuf::from(text))
    };
    // both looked at, and each file read, before giving up, so that every problem is reported
    let (cert, key) = (file(&cert, "cert"), file(&key, "key"));
    if chk.read_files {
        for e in crate::tls::problems(cert.as_deref(), key.as_deref()) {
            let name = if e.is_about_key() { "key" } else { "cert" };
            chk.error(path.key(name), e.to_string());
        }
    }
    Some(TlsConfig {
        cert: cert?,
        key: key?,
    })
}

/// `admin.token` or `admin.token_file`, one of them; the file is read when files are.
fn admin_token(chk: &mut Checker<'_>, raw: &RawAdmin, path: &Path) -> Option<AdminToken> {
    let token = match (raw.token.get(), raw.token_file.get()) {
        (Some(_), Some(_)) => {
            let message = "set token or token_file, not both";
            chk.key_error(path.key("token_file"), message);
            return None;
        }
        (Some(value), None) if value.trim().is_empty() => {
            chk.error(path.key("token"), "the admin token is empty");
            return None;
        }
        (Some(value), None) => AdminToken::Value(value.clone()),
        (None, Some(file)) => AdminToken::File(PathBuf::from(file)),
        (None, None) => return None,
    };
    if chk.read_files && matches!(token, AdminToken::File(_)) {
        if let Err(why) = token.read() {
            chk.error(path.key("token_file"), why);
        }
    }
    Some(token)
}

/// `store`: the backend's keys, then `store.tls`, which reads what the backend is.
fn store(chk: &mut Checker<'_>, raw: Option<&RawStore>) -> StoreConfig {
    let mut store = backend::store(chk, raw);
    if let Some(raw) = raw {
        store.tls = client_tls::store(chk, raw, &store.backend);
    }
    store
}

fn timeouts(chk: &mut Checker<'_>, raw: &RawTimeouts) -> Timeouts {
    let path = Path::root().key("timeouts");
    let default = Timeouts::default();
    Timeouts {
        client_header: chk.duration(
            &raw.client_header,
            &path.key("client_header"),
            default.client_header,
        ),
        upstream_connect: chk.duration(
            &raw.upstream_connect,
            &path.key("upstream_connect"),
            default.upstream_connect,
        ),
        upstream_response: chk.duration(
            &raw.upstream_response,
            &path.key("upstream_response"),
            default.upstream_response,
        ),
        idle: chk.duration(&raw.idle, &path.key("idle"), default.idle),
        send: chk.duration(&raw.send, &path.key("send"), default.send),
        // Zero turns lingering off: close at once, as nginx's `lingering_close off`.
        linger: {
            let path = path.key("linger");
            let parsed = chk.parse(&raw.linger, &path, units::parse_duration);
            chk.at_most_a_year(parsed, &path).unwrap_or(default.linger)
        },
        // Zero is a valid drain time: stop at once.
        shutdown: {
            let path = path.key("shutdown");
            let parsed = chk.parse(&raw.shutdown, &path, units::parse_duration);
            chk.at_most_a_year(parsed, &path)
                .unwrap_or(default.shutdown)
        },
    }
}

fn upstreams(chk: &mut Checker<'_>, raw: &RawConfig) -> Vec<UpstreamConfig> {
    let path = Path::root().key("upstreams");
    let Some(entries) = raw.upstreams.get() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (name, field) in &entries.0 {
        let upath = path.key(name);
        if let Err(message) = check_name(name) {
            chk.key_error(upath.clone(), message);
        }
        if let Some(raw) = chk.item(field, &upath, "a mapping with targets") {
            out.extend(upstream(chk, name, raw, &upath));
        }
    }
    out
}

fn upstream(
    chk: &mut Checker<'_>,
    name: &str,
    raw: &RawUpstream,
    path: &Path,
) -> Option<UpstreamConfig> {
    chk.required(&raw.targets, path, "targets");
    if raw.targets.get().is_some_and(StrList::is_empty) {
        chk.error(
            path.key("targets"),
            "needs at least one target, such as http://127.0.0.1:8000",
        );
    }
    let targets = chk.parse_list(&raw.targets, &path.key("targets"), parse_target);
    let (pace, max_waiting) = match raw.pace.get() {
        Some(p) => pace(chk, p, &path.key("pace"))?,
        None => (None, None),
    };
    let concurrency = raw
        .pace
        .get()
        .and_then(|p| pace_concurrency(chk, p, &path.key("pace")));
    let adaptive = raw.pace.get().and_then(|p| {
        let start = pace.map(|p| p.rate);
        adaptive::adaptive(chk, p.adaptive.get()?, start, &path.key("pace"))
    });
    let protocol = match raw.protocol.get() {
        Some(RawProtocol::Http1) => Protocol::Http1,
        Some(RawProtocol::Http2) => Protocol::Http2,
        Some(RawProtocol::Auto) | None => Protocol::Auto,
    };
    let http2 = raw
        .http2
        .get()
        .map(|h| http2(chk, h, &path.key("http2")))
        .unwrap_or_default();
    let tls = (raw.tls.get()).map(|t| client_tls::upstream(chk, t, &path.key("tls")));
    if tls.is_some() && !targets.iter().any(|t| t.scheme() == Some(&Scheme::HTTPS)) {
        let message = "tls applies to https:// targets only, and this upstream has none";
        chk.warn(path.key("tls"), message);
    }
    Some(UpstreamConfig {
        name: name.to_owned(),
        targets,
        preserve_host: raw.preserve_host.get().copied().unwrap_or(true),
        pace,
        max_waiting,
        concurrency,
        adaptive,
        protocol,
        http2,
        tls,
    })
}

fn http2(chk: &mut Checker<'_>, raw: &RawHttp2, path: &Path) -> Http2Config {
    let default = Http2Config::default();
    // (more connections than this to one target is a misconfiguration, not a need)
    const MOST_CONNECTIONS: u64 = 1024;
    let max_connections = chk
        .positive_to(
            &raw.max_connections,
            &path.key("max_connections"),
            "max_connections",
            MOST_CONNECTIONS,
        )
        .and_then(|n| NonZeroUsize::new(n as usize))
        .unwrap_or(default.max_connections);
    Http2Config {
        keepalive_interval: chk.duration(
            &raw.keepalive_interval,
            &path.key("keepalive_interval"),
            default.keepalive_interval,
        ),
        keepalive_timeout: chk.duration(
            &raw.keepalive_timeout,
            &path.key("keepalive_timeout"),
            default.keepalive_timeout,
        ),
        max_connections,
    }
}

type PaceParts = (Option<Pace>, Option<NonZeroUsize>);

fn pace(chk: &mut Checker<'_>, raw: &RawPace, path: &Path) -> Option<PaceParts> {
    // (`concurrency` alone bounds requests in flight, with no rate; an adaptive rate starts
    // from `rate`)
    let rate_needed = !raw.concurrency.is_given() || raw.adaptive.is_given();
    if rate_needed {
        chk.required(&raw.rate, path, "rate");
    }
    let rate = chk.parse(&raw.rate, &path.key("rate"), units::parse_rate);
    let max_delay = chk.parse(
        &raw.max_delay,
        &path.key("max_delay"),
        units::parse_duration,
    );
    // (more would be beyond any process's memory, and past the permits a semaphore holds)
    const MOST_WAITING: u64 = 10_000_000;
    let max_waiting = chk
        .positive_to(
            &raw.max_waiting,
            &path.key("max_waiting"),
            "max_waiting",
            MOST_WAITING,
        )
        .and_then(|n| NonZeroUsize::new(usize::try_from(n).unwrap_or(usize::MAX)));
    if !raw.max_delay.is_given() && !raw.max_waiting.is_given() {
        let message = "pace without max_delay or max_waiting: requests wait for their slot \
                       however far off it is, and any number of them; set max_delay to answer \
                       503 past it";
        chk.warn(path.clone(), message);
    }
    if !rate_needed && !raw.rate.is_given() {
        return Some((None, max_waiting));
    }
    let pace = Pace::new(rate?.rate, max_delay)
        .map_err(|e| chk.error(path.key("max_delay"), e.to_string()))
        .ok()?;
    Some((Some(pace), max_waiting))
}

/// `pace.concurrency`, with the `max_delay` its waiters keep (`pace` reports that one's
/// problems).
fn pace_concurrency(chk: &mut Checker<'_>, raw: &RawPace, path: &Path) -> Option<PaceConcurrency> {
    let key = path.key("concurrency");
    let n = chk.positive_to(&raw.concurrency, &key, "concurrency", u64::from(u32::MAX))?;
    let limit = std::num::NonZeroU32::new(u32::try_from(n).ok()?)?;
    let slots = Slots::new(limit, Slots::DEFAULT_LEASE).ok()?;
    let max_delay = raw
        .max_delay
        .get()
        .and_then(|t| units::parse_duration(t).ok());
    Some(PaceConcurrency { slots, max_delay })
}

/// `0.0.0.0:8080`, `[::1]:9901`.
pub(crate) fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    text.trim().parse().map_err(|_| {
        format!("expected an address such as 0.0.0.0:8080 or [::]:8080, found {text:?}")
    })
}

/// `http://host[:port]` or `https://host[:port]`, nothing after the authority.
fn parse_target(text: &str) -> Result<http::Uri, String> {
    let bad = || format!("expected a URL such as http://127.0.0.1:8000, found {text:?}");
    let uri: http::Uri = text.trim().parse().map_err(|_| bad())?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => {
            return Err(format!(
                "a target must start with http:// or https://, found {text:?}"
            ))
        }
    }
    if uri.host().unwrap_or_default().is_empty() {
        return Err(bad());
    }
    match crate::routing::authority_fault(uri.authority().map_or("", |a| a.as_str())) {
        // (tollgate would not send them, and they would be shown wherever the target is)
        Some(AuthorityFault::UserInfo) => {
            return Err(format!(
                "a target takes no user or password (send credentials with the client's \
                 Authorization header), found {text:?}"
            ))
        }
        Some(AuthorityFault::Port) => {
            return Err(format!("a target's port is at most 65535, found {text:?}"))
        }
        None => {}
    }
    let path = uri.path_and_query().map_or("/", |pq| pq.as_str());
    if path != "/" && !path.is_empty() {
        return Err(format!(
            "a target is scheme://host[:port] with no path or query, found {text:?}"
        ));
    }
    Ok(uri)
}
