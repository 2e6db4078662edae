//! The config told back: a short text for `tollgate check` and JSON for the admin `/config`
//! endpoint. Both redact secrets (a Redis password in a URL or in `store.sentinel`).

use std::num::NonZeroUsize;

use serde_json::{json, Value};

use super::backend::redact_url;
use super::types::AdaptiveConfig;
use super::types::{
    AccessLog, AdminConfig, AdminToken, Backend, ClientTls, Config, ForwardedHeaders, HeaderStyle,
    Http2Config, LimitConfig, LogClient, Mode, OnError, PaceConcurrency, Protocol, RouteConfig,
    SentinelConfig, UpstreamConfig,
};
use super::units::{format_duration, format_rate, format_size};
use crate::identity::{DuplicateKey, KeyPart};
use crate::limit::Algorithm;
use crate::routing::{
    EscapedSlashes, HostPattern, PathMatch, PathPolicy, RouteMatch, SegmentParams,
};

impl Config {
    /// A short human summary for `tollgate check`: listeners, store, upstreams (targets and
    /// pacing), routes (match, upstream, and each limit). Passwords in URLs are shown as `***`.
    pub fn summary(&self) -> String {
        let mut out = Vec::new();
        let addrs: Vec<String> = self.listen.iter().map(ToString::to_string).collect();
        let tls = if self.tls.is_some() { " (tls)" } else { "" };
        out.push(format!("listen: {}{tls}", addrs.join(", ")));
        if let Some(admin) = &self.admin {
            let cap = match admin.max_connections {
                AdminConfig::DEFAULT_MAX_CONNECTIONS => String::new(),
                n => format!(", max_connections {n}"),
            };
            let hosts = match admin.hosts.is_empty() {
                true => String::new(),
                false => format!(", hosts {}", admin.hosts.join(", ")),
            };
            match admin.token {
                Some(_) => out.push(format!(
                    "admin: {}{cap}{hosts} (api token set)",
                    admin.listen
                )),
                None => out.push(format!("admin: {}{cap}{hosts}", admin.listen)),
            }
        }
        out.push(format!("store: {}", store_line(self)));
        if let Some(size) = self.max_body_size {
            out.push(format!("max_body_size: {}", format_size(size)));
        }
        if self.paths != PathPolicy::default() {
            let (slashes, params) = paths_names(&self.paths);
            out.push(format!(
                "paths: escaped_slashes {slashes}, segment_params {params}"
            ));
        }
        if self.access_log != AccessLog::default() {
            let (query, client) = access_log_names(&self.access_log);
            let query = if query { "kept" } else { "left out" };
            out.push(format!("access_log: client {client}, query {query}"));
        }
        if self.forwarded_headers != ForwardedHeaders::default() {
            let on = |set: bool| if set { "set" } else { "left as sent" };
            let f = &self.forwarded_headers;
            out.push(format!(
                "forwarded_headers: x_real_ip {}, forwarded {}",
                on(f.x_real_ip),
                on(f.forwarded)
            ));
        }
        out.push(format!("upstreams ({}):", self.upstreams.len()));
        out.extend(
            self.upstreams
                .iter()
                .map(|u| format!("  {}", upstream_line(u))),
        );
        out.push(format!("routes ({}):", self.routes.len()));
        for route in &self.routes {
            out.push(format!("  {}", route_line(route)));
            out.extend(
                route
                    .limits
                    .iter()
                    .map(|l| format!("    {}", limit_line(l))),
            );
        }
        out.join("\n")
    }

    /// The effective configuration as JSON, defaults filled in, for the admin `/config`
    /// endpoint. Passwords in Redis URLs are replaced by `***`.
    pub fn to_json(&self) -> Value {
        let t = &self.timeouts;
        json!({
            "listen": self.listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            // the threads in force (unset: one per core)
            "workers": self.worker_count(),
            "tls": self.tls.as_ref().map(|t| json!({"cert": t.cert, "key": t.key})),
            "admin": self.admin.as_ref().map(|a| json!({
                "listen": a.listen.to_string(),
                "max_connections": a.max_connections,
                "hosts": a.hosts,
                "token": match &a.token {
                    None => Value::Null,
                    Some(AdminToken::Value(_)) => json!("<redacted>"),
                    Some(AdminToken::File(path)) => json!(format!("<redacted: {}>", path.display())),
                },
            })),
            "store": store_json(self),
            "trusted_proxies": self.trusted_proxies.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "rate_limit_headers": header_style(self.rate_limit_headers),
            "timeouts": {
                "client_header": format_duration(t.client_header),
                "upstream_connect": format_duration(t.upstream_connect),
                "upstream_response": format_duration(t.upstream_response),
                "idle": format_duration(t.idle),
                "send": format_duration(t.send),
                "linger": format_duration(t.linger),
                "shutdown": format_duration(t.shutdown),
            },
            "max_body_size": self.max_body_size,
            "paths": {
                "escaped_slashes": paths_names(&self.paths).0,
                "segment_params": paths_names(&self.paths).1,
            },
            "access_log": {
                "query": self.access_log.query,
                "client": access_log_names(&self.access_log).1,
            },
            "forwarded_headers": {
                "x_real_ip": self.forwarded_headers.x_real_ip,
                "forwarded": self.forwarded_headers.forwarded,
            },
            "upstreams": self.upstreams.iter().map(upstream_json).collect::<Vec<_>>(),
            "routes": self.routes.iter().map(route_json).collect::<Vec<_>>(),
        })
    }
}

fn backend_text(backend: &Backend) -> String {
    match backend {
        Backend::Memory => "memory".to_owned(),
        Backend::Redis { url } => format!("redis {}", redact_url(url)),
        Backend::Cluster { urls } => {
            let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
            format!("redis cluster {}", urls.join(", "))
        }
        Backend::Sentinel(s) => {
            let nodes: Vec<String> = s.nodes.iter().map(|u| redact_url(u)).collect();
            let mut text = format!("redis sentinel {} via {}", s.master_name, nodes.join(", "));
            if s.db != 0 {
                text.push_str(&format!(", db {}", s.db));
            }
            text
        }
    }
}

/// `tls ca /etc/ca.pem, client cert /etc/c.pem, server_name r.internal`, or `tls not verified`.
fn tls_text(tls: &ClientTls) -> String {
    let mut parts = vec!["tls".to_owned()];
    if let Some(ca) = &tls.ca {
        parts.push(format!("ca {}", ca.path.display()));
    }
    if let Some((cert, _)) = &tls.identity {
        parts.push(format!("client cert {}", cert.path.display()));
    }
    if let Some(name) = &tls.server_name {
        parts.push(format!("server_name {name}"));
    }
    if !tls.verify {
        parts.push("NOT VERIFIED".to_owned());
    }
    parts.join(" ")
}

fn tls_json(tls: &ClientTls) -> Value {
    json!({
        "ca": tls.ca.as_ref().map(|f| &f.path),
        "cert": tls.identity.as_ref().map(|(cert, _)| &cert.path),
        "key": tls.identity.as_ref().map(|(_, key)| &key.path),
        "server_name": tls.server_name,
        "verify": tls.verify,
    })
}

fn sentinel_json(s: &SentinelConfig) -> Value {
    json!({
        "master_name": s.master_name,
        "nodes": s.nodes.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
        "username": s.username,
        "password": s.password.as_ref().map(|_| "***"),
        "db": s.db,
    })
}

fn store_line(config: &Config) -> String {
    let s = &config.store;
    let mut line = backend_text(&s.backend);
    if s.backend != Backend::Memory {
        line.push_str(&format!(
            ", key_prefix {}, timeout {}, on_error {}",
            s.key_prefix,
            format_duration(s.timeout),
            on_error(s.on_error)
        ));
        if s.instances.get() > 1 {
            line.push_str(&format!(", instances {}", s.instances));
        }
        if !s.leases {
            line.push_str(", no leases");
        }
        if let Some(tls) = &s.tls {
            line.push_str(&format!(", {}", tls_text(tls)));
        }
    }
    line.push_str(&format!(", max_keys {}", s.max_keys));
    line
}

fn store_json(config: &Config) -> Value {
    let s = &config.store;
    let (backend, url, cluster, sentinel) = match &s.backend {
        Backend::Memory => ("memory", None, None, None),
        Backend::Redis { url } => ("redis", Some(redact_url(url)), None, None),
        Backend::Cluster { urls } => {
            let urls: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
            ("redis", None, Some(urls), None)
        }
        Backend::Sentinel(sentinel) => ("redis", None, None, Some(sentinel_json(sentinel))),
    };
    json!({
        "backend": backend,
        "url": url,
        "cluster": cluster,
        "sentinel": sentinel,
        "tls": s.tls.as_ref().map(tls_json),
        "key_prefix": s.key_prefix,
        "timeout": format_duration(s.timeout),
        "on_error": on_error(s.on_error),
        "instances": s.instances.get(),
        "max_keys": s.max_keys.get(),
        "leases": s.leases,
    })
}

fn on_error(policy: OnError) -> &'static str {
    match policy {
        OnError::Allow => "allow",
        OnError::Deny => "deny",
        OnError::Local => "local",
    }
}

/// The names of the `paths` settings, as written in the file.
fn paths_names(paths: &PathPolicy) -> (&'static str, &'static str) {
    let slashes = match paths.escaped_slashes {
        EscapedSlashes::Reject => "reject",
        EscapedSlashes::Decode => "decode",
        EscapedSlashes::Keep => "keep",
    };
    let params = match paths.segment_params {
        SegmentParams::Ignore => "ignore",
        SegmentParams::Keep => "keep",
    };
    (slashes, params)
}

/// The `access_log` settings, as written in the file.
fn access_log_names(log: &AccessLog) -> (bool, &'static str) {
    let client = match log.client {
        LogClient::Address => "address",
        LogClient::Hash => "hash",
    };
    (log.query, client)
}

fn header_style(style: HeaderStyle) -> &'static str {
    match style {
        HeaderStyle::Ietf => "ietf",
        HeaderStyle::Legacy => "legacy",
        HeaderStyle::Both => "both",
        HeaderStyle::None => "none",
    }
}

fn upstream_line(u: &UpstreamConfig) -> String {
    let targets: Vec<String> = u.targets.iter().map(target_text).collect();
    let mut line = format!("{}: {}", u.name, targets.join(", "));
    if !u.preserve_host {
        line.push_str(" (host rewritten)");
    }
    if u.protocol != Protocol::Auto {
        line.push_str(&format!(" ({})", u.protocol.as_str()));
    }
    if u.http2 != Http2Config::default() {
        let h = &u.http2;
        line.push_str(&format!(
            " (http2 keepalive {} timeout {}, max_connections {})",
            format_duration(h.keepalive_interval),
            format_duration(h.keepalive_timeout),
            h.max_connections
        ));
    }
    if let Some(tls) = &u.tls {
        line.push_str(&format!(" ({})", tls_text(tls)));
    }
    if let Some(pace) = &u.pace {
        line.push_str(&format!("; pace {}", format_rate(pace.rate)));
        if let Some(ms) = pace.max_delay_ms {
            line.push_str(&format!(" max_delay {}", format_ms(ms)));
        }
        if let Some(n) = u.max_waiting {
            line.push_str(&format!(" max_waiting {n}"));
        }
    }
    if let Some(c) = &u.concurrency {
        line.push_str(&concurrency_text(
            c,
            u.pace.is_none().then_some(u.max_waiting),
        ));
    }
    if let Some(a) = &u.adaptive {
        line.push_str(&adaptive_text(a));
    }
    line
}

/// `; concurrency N` (in flight at once), with its wait when no rate states it.
fn concurrency_text(c: &PaceConcurrency, alone: Option<Option<NonZeroUsize>>) -> String {
    let mut text = format!("; concurrency {}", c.slots.limit);
    if let Some(max_waiting) = alone {
        if let Some(d) = c.max_delay {
            text.push_str(&format!(" max_delay {}", format_duration(d)));
        }
        if let Some(n) = max_waiting {
            text.push_str(&format!(" max_waiting {n}"));
        }
    }
    text
}

/// `; adaptive 1/s..200/s +1/s x0.7 per 500ms target_latency 300ms`
fn adaptive_text(a: &AdaptiveConfig) -> String {
    let p = &a.aimd;
    let mut text = format!(
        "; adaptive {}..{} +{} x{} per {}",
        format_rate(p.min()),
        format_rate(p.max()),
        format_increase(p.increase()),
        p.decrease(),
        format_ms(p.period_ms())
    );
    if let Some(t) = a.target_latency {
        text.push_str(&format!(" target_latency {}", format_duration(t)));
    }
    text
}

/// `increase` as a rate, the way the file writes it.
fn format_increase(per_sec: f64) -> String {
    crate::limit::Rate::per_second(per_sec).map_or_else(|_| per_sec.to_string(), format_rate)
}

fn adaptive_json(a: &AdaptiveConfig) -> Value {
    let p = &a.aimd;
    json!({
        "min": format_rate(p.min()),
        "max": format_rate(p.max()),
        "increase": format_increase(p.increase()),
        "decrease": p.decrease(),
        "interval": format_ms(p.period_ms()),
        "target_latency": a.target_latency.map(format_duration),
    })
}

fn upstream_json(u: &UpstreamConfig) -> Value {
    json!({
        "name": u.name,
        "targets": u.targets.iter().map(target_text).collect::<Vec<_>>(),
        "preserve_host": u.preserve_host,
        "protocol": u.protocol.as_str(),
        "http2": {
            "keepalive_interval": format_duration(u.http2.keepalive_interval),
            "keepalive_timeout": format_duration(u.http2.keepalive_timeout),
            "max_connections": u.http2.max_connections,
        },
        "tls": u.tls.as_ref().map(tls_json),
        "pace": pace_json(u),
    })
}

/// `pace` with proxy.yaml's keys: the rate's, `concurrency`'s and `adaptive`'s.
fn pace_json(u: &UpstreamConfig) -> Value {
    if u.pace.is_none() && u.concurrency.is_none() {
        return Value::Null;
    }
    let max_delay = match (u.pace, u.concurrency) {
        (Some(p), _) => p.max_delay_ms.map(format_ms),
        (None, Some(c)) => c.max_delay.map(format_duration),
        (None, None) => None,
    };
    json!({
        "rate": u.pace.map(|p| format_rate(p.rate)),
        "max_delay": max_delay,
        "max_waiting": u.max_waiting.map(|n| n.get()),
        "concurrency": u.concurrency.map(|c| c.slots.limit.get()),
        "adaptive": u.adaptive.as_ref().map(adaptive_json),
    })
}

/// `http://127.0.0.1:8000`, as written (a `Uri` displays a `/` path after it).
fn target_text(uri: &http::Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}"),
        _ => uri.to_string(),
    }
}

fn format_ms(ms: f64) -> String {
    format_duration(std::time::Duration::from_secs_f64(ms / 1000.0))
}

fn host_text(host: &HostPattern) -> String {
    match host {
        HostPattern::Exact(h) => h.clone(),
        HostPattern::Suffix(s) => format!("*{s}"),
    }
}

fn match_parts(m: &RouteMatch) -> Vec<String> {
    let mut parts = Vec::new();
    if let Some(host) = &m.host {
        parts.push(format!("host {}", host_text(host)));
    }
    match &m.path {
        PathMatch::Any => {}
        PathMatch::Prefix(p) => parts.push(format!("path_prefix {p}")),
        PathMatch::Exact(p) => parts.push(format!("path {p}")),
    }
    if !m.case_sensitive {
        parts.push("any case".to_owned());
    }
    if !m.methods.is_empty() {
        let methods: Vec<&str> = m.methods.iter().map(http::Method::as_str).collect();
        parts.push(format!("methods {}", methods.join(" ")));
    }
    for (name, value) in &m.headers {
        parts.push(format!(
            "header {name}={}",
            value.to_str().unwrap_or("(binary)")
        ));
    }
    parts
}

fn route_line(r: &RouteConfig) -> String {
    let mut parts = match_parts(&r.matcher);
    if parts.is_empty() {
        parts.push("every request".to_owned());
    }
    let strip = if r.strip_prefix {
        " (prefix stripped)"
    } else {
        ""
    };
    format!("{}: {} -> {}{strip}", r.name, parts.join(", "), r.upstream)
}

/// A route's `match` with proxy.yaml's keys, only those that apply.
fn match_json(m: &RouteMatch) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(host) = &m.host {
        out.insert("host".into(), host_text(host).into());
    }
    match &m.path {
        PathMatch::Any => {}
        PathMatch::Prefix(p) => {
            out.insert("path_prefix".into(), p.as_str().into());
        }
        PathMatch::Exact(p) => {
            out.insert("path".into(), p.as_str().into());
        }
    }
    if !m.case_sensitive {
        out.insert("case_sensitive".into(), false.into());
    }
    if !m.methods.is_empty() {
        let methods: Vec<&str> = m.methods.iter().map(http::Method::as_str).collect();
        out.insert("methods".into(), methods.into());
    }
    if !m.headers.is_empty() {
        let headers: serde_json::Map<String, Value> = m
            .headers
            .iter()
            .map(|(name, value)| {
                let value = value.to_str().unwrap_or("(binary)");
                (name.to_string(), value.into())
            })
            .collect();
        out.insert("headers".into(), headers.into());
    }
    out.into()
}

fn route_json(r: &RouteConfig) -> Value {
    json!({
        "name": r.name,
        "match": match_json(&r.matcher),
        "strip_prefix": r.strip_prefix,
        "upstream": r.upstream,
        "limits": r.limits.iter().map(limit_json).collect::<Vec<_>>(),
    })
}

/// `token_bucket 10/s burst 20 cost 1`, `sliding_window 1000 per 1h`.
pub(crate) fn algorithm_text(alg: &Algorithm) -> String {
    match alg {
        Algorithm::TokenBucket(b) => format!(
            "token_bucket {} burst {} cost {}",
            format_rate(b.rate),
            b.burst,
            b.cost
        ),
        Algorithm::LeakyBucket(p) => match p.max_delay_ms {
            Some(ms) => format!(
                "leaky_bucket {} max_delay {}",
                format_rate(p.rate),
                format_ms(ms)
            ),
            None => format!("leaky_bucket {}", format_rate(p.rate)),
        },
        Algorithm::FixedWindow(w)
        | Algorithm::SlidingWindow(w)
        | Algorithm::SlidingWindowCounter(w) => {
            let window = std::time::Duration::from_millis(w.window_ms.get());
            format!("{} {} per {}", alg.name(), w.limit, format_duration(window))
        }
        Algorithm::Concurrency(s) => {
            format!(
                "concurrency {} lease {}",
                s.limit,
                format_duration(s.lease())
            )
        }
    }
}

fn key_text(key: &[KeyPart]) -> String {
    let parts: Vec<String> = key.iter().map(KeyPart::to_string).collect();
    parts.join("+")
}

fn limit_line(l: &LimitConfig) -> String {
    let mut line = format!(
        "{}: {}, key {}",
        l.name,
        algorithm_text(&l.algorithm),
        key_text(&l.key)
    );
    if l.mode == Mode::Shadow {
        line.push_str(", shadow");
    }
    if !l.exempt.is_empty() {
        let nets: Vec<String> = l.exempt.iter().map(ToString::to_string).collect();
        line.push_str(&format!(", exempt {}", nets.join(" ")));
    }
    match l.overrides.len() {
        0 => {}
        1 => line.push_str(", 1 override"),
        n => line.push_str(&format!(", {n} overrides")),
    }
    if let Some(charge) = &l.charge {
        line.push_str(&format!(", charge {}", charge.response_header));
        if let Some(missing) = charge.missing {
            line.push_str(&format!(" missing {missing}"));
        }
    }
    match l.duplicate_key {
        DuplicateKey::Reject => {}
        DuplicateKey::First => line.push_str(", duplicate_key first"),
        DuplicateKey::Last => line.push_str(", duplicate_key last"),
    }
    line
}

/// An algorithm's name and parameters with proxy.yaml's keys (`algorithm`, `rate`, `burst`...).
fn algorithm_json(alg: &Algorithm, out: &mut serde_json::Map<String, Value>) {
    out.insert("algorithm".into(), alg.name().into());
    match alg {
        Algorithm::TokenBucket(b) => {
            out.insert("rate".into(), format_rate(b.rate).into());
            out.insert("burst".into(), b.burst.get().into());
            out.insert("cost".into(), b.cost.get().into());
        }
        Algorithm::LeakyBucket(p) => {
            out.insert("rate".into(), format_rate(p.rate).into());
            out.insert("max_delay".into(), p.max_delay_ms.map(format_ms).into());
        }
        Algorithm::FixedWindow(w)
        | Algorithm::SlidingWindow(w)
        | Algorithm::SlidingWindowCounter(w) => {
            let window = std::time::Duration::from_millis(w.window_ms.get());
            out.insert("limit".into(), w.limit.get().into());
            out.insert("window".into(), format_duration(window).into());
        }
        Algorithm::Concurrency(s) => {
            out.insert("limit".into(), s.limit.get().into());
            out.insert("lease".into(), format_duration(s.lease()).into());
        }
    }
}

/// A limit with proxy.yaml's keys. The client-key values of its overrides (often API keys)
/// are not shown, only how many there are.
fn limit_json(l: &LimitConfig) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("name".into(), l.name.as_str().into());
    algorithm_json(&l.algorithm, &mut out);
    let key: Value = match l.key.as_slice() {
        [one] => key_text(std::slice::from_ref(one)).into(),
        parts => parts
            .iter()
            .map(|p| key_text(std::slice::from_ref(p)))
            .collect::<Vec<_>>()
            .into(),
    };
    out.insert("key".into(), key);
    let mode = match l.mode {
        Mode::Enforce => "enforce",
        Mode::Shadow => "shadow",
    };
    out.insert("mode".into(), mode.into());
    let exempt: Vec<String> = l.exempt.iter().map(ToString::to_string).collect();
    out.insert("exempt".into(), exempt.into());
    out.insert("overrides".into(), l.overrides.len().into());
    let charge = l.charge.as_ref().map(|c| {
        let missing = c.missing.map(|n| n.get());
        serde_json::json!({"response_header": c.response_header.as_str(), "missing": missing})
    });
    out.insert("charge".into(), charge.into());
    let duplicate_key = match l.duplicate_key {
        DuplicateKey::Reject => "reject",
        DuplicateKey::First => "first",
        DuplicateKey::Last => "last",
    };
    out.insert("duplicate_key".into(), duplicate_key.into());
    out.into()
}
