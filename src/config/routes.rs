//! `routes`: names, `match`, `strip_prefix`, the upstream reference, and the warning for a
//! route that an earlier one shadows.

use http::{HeaderName, HeaderValue, Method};

use super::check::{check_name, Checker};
use super::limits;
use super::problem::{closest, or_list, Path};
use super::raw::{Field, RawMatch, RawRoute, StrList};
use super::types::{LimitConfig, RouteConfig};
use crate::routing::{HostPattern, PathError, PathMatch, PathPolicy, RouteMatch};

/// Validates every route; duplicate names are errors, shadowed routes warnings. `upstreams`
/// are the names routes may refer to; `None` when they are unknown (`upstreams` is invalid).
pub(crate) fn routes(
    chk: &mut Checker<'_>,
    raw: &Field<Vec<Field<RawRoute>>>,
    upstreams: Option<&[&str]>,
    paths: &PathPolicy,
) -> Vec<RouteConfig> {
    let path = Path::root().key("routes");
    let items = match raw {
        Field::Present(items) => items.as_slice(),
        Field::Invalid => return Vec::new(),
        Field::Absent => &[],
    };
    if items.is_empty() {
        chk.warn(
            path.clone(),
            "no routes: every request will be answered 404",
        );
    }
    // (index in the file, route) of every route that is valid, for the shadowing check
    let mut built: Vec<(usize, RouteConfig)> = Vec::new();
    let mut names: Vec<(&str, usize)> = Vec::new();
    for (i, field) in items.iter().enumerate() {
        let rpath = path.index(i);
        let Some(raw) = chk.item(
            field,
            &rpath,
            "a route (a mapping with name, match, upstream)",
        ) else {
            continue;
        };
        if let Some(name) = raw.name.get() {
            if let Some(&(_, first)) = names.iter().find(|(n, _)| *n == name.as_str()) {
                let line = on_line(chk.error_line_of(&path.index(first)));
                let message =
                    format!("duplicate route name {name:?}: routes[{first}]{line} has it");
                chk.error(rpath.key("name"), message);
            } else {
                names.push((name, i));
            }
        }
        if let Some(route) = route(chk, raw, &rpath, upstreams, paths) {
            built.push((i, route));
        }
    }
    warn_shadowed(chk, &built);
    built.into_iter().map(|(_, route)| route).collect()
}

fn route(
    chk: &mut Checker<'_>,
    raw: &RawRoute,
    path: &Path,
    upstreams: Option<&[&str]>,
    paths: &PathPolicy,
) -> Option<RouteConfig> {
    let name = chk.required(&raw.name, path, "name").cloned();
    if let Some(Err(message)) = name.as_deref().map(check_name) {
        chk.error(path.key("name"), message);
    }
    let matcher = match &raw.matcher {
        Field::Present(m) => matcher(chk, m, &path.key("match"), paths),
        Field::Absent => Some(RouteMatch {
            host: None,
            path: PathMatch::Any,
            methods: Vec::new(),
            headers: Vec::new(),
            case_sensitive: true,
        }),
        Field::Invalid => None,
    };
    let strip_prefix = raw.strip_prefix.get().copied().unwrap_or(false);
    if strip_prefix
        && !matches!(
            matcher,
            Some(RouteMatch {
                path: PathMatch::Prefix(_),
                ..
            })
        )
    {
        let message = "strip_prefix needs match.path_prefix (there is no prefix to strip)";
        chk.error(path.key("strip_prefix"), message);
    }
    let upstream = chk.required(&raw.upstream, path, "upstream").cloned();
    if let (Some(up), Some(upstreams)) = (&upstream, upstreams) {
        if !upstreams.contains(&up.as_str()) {
            chk.error(path.key("upstream"), missing_upstream(up, upstreams));
        }
    }
    // An upstream's pacing schedule is kept at `<key_prefix>:upstream:<upstream>:pace`, and its
    // adaptive rate at `...:rate`: on a route named `upstream`, a limit named like an upstream
    // would share them (with the client key `pace` or `rate`, which a header or query key lets
    // a client choose)
    let pacing_keys = match (name.as_deref(), upstreams) {
        (Some("upstream"), Some(upstreams)) => upstreams,
        _ => &[],
    };
    let limits = route_limits(chk, raw, path, pacing_keys);
    Some(RouteConfig {
        name: name?,
        matcher: matcher?,
        strip_prefix,
        upstream: upstream?,
        limits,
    })
}

/// ` on line N`, or nothing when the line was not looked up.
fn on_line(line: Option<usize>) -> String {
    line.map_or(String::new(), |n| format!(" on line {n}"))
}

fn missing_upstream(name: &str, upstreams: &[&str]) -> String {
    if upstreams.is_empty() {
        return format!("no upstream named {name:?}: the file defines no upstreams");
    }
    match closest(name, upstreams.iter().copied()) {
        Some(close) => format!("no upstream named {name:?} (did you mean {close:?}?)"),
        None => format!(
            "no upstream named {name:?}; upstreams defines {}",
            or_list(upstreams)
        ),
    }
}

/// The route's limits; a limit named like one of `pacing_keys` (the upstreams, on a route named
/// `upstream`) is refused, so that no client can write over the schedule every instance paces
/// that upstream by.
fn route_limits(
    chk: &mut Checker<'_>,
    raw: &RawRoute,
    path: &Path,
    pacing_keys: &[&str],
) -> Vec<LimitConfig> {
    let Some(items) = raw.limits.get() else {
        return Vec::new();
    };
    let lpath = path.key("limits");
    let mut names: Vec<(&str, usize)> = Vec::new();
    let mut out = Vec::new();
    for (j, field) in items.iter().enumerate() {
        let Some(limit) = chk.item(field, &lpath.index(j), "a limit (a mapping)") else {
            continue;
        };
        if let Some(name) = limit.name.get() {
            if let Some(&(_, first)) = names.iter().find(|(n, _)| *n == name.as_str()) {
                let line = on_line(chk.error_line_of(&lpath.index(first)));
                let message = format!(
                    "duplicate limit name {name:?} in this route: limits[{first}]{line} has it"
                );
                chk.error(lpath.index(j).key("name"), message);
            } else {
                names.push((name, j));
            }
            if pacing_keys.contains(&name.as_str()) {
                let message = format!(
                    "a limit named {name:?} on a route named \"upstream\" would keep its counts \
                     where upstream {name:?} keeps its pacing schedule \
                     (<key_prefix>:upstream:{name}:pace); rename the route or the limit"
                );
                chk.error(lpath.index(j).key("name"), message);
            }
        }
        out.extend(limits::limit(chk, limit, &lpath.index(j)));
    }
    out
}

fn matcher(
    chk: &mut Checker<'_>,
    raw: &RawMatch,
    path: &Path,
    paths: &PathPolicy,
) -> Option<RouteMatch> {
    let errors_before = chk.errors.len();
    let host = chk.parse(&raw.host, &path.key("host"), parse_host);
    let prefix = chk.parse(&raw.path_prefix, &path.key("path_prefix"), |p| {
        parse_path(p).map(|p| {
            let trimmed = p.trim_end_matches('/');
            PathMatch::Prefix(if trimmed.is_empty() { "/" } else { trimmed }.to_owned())
        })
    });
    let exact = chk.parse(&raw.path, &path.key("path"), |p| {
        parse_path(p).map(|p| PathMatch::Exact(p.to_owned()))
    });
    warn_unmatched_paths(chk, raw, path, paths);
    if raw.path_prefix.is_given() && raw.path.is_given() {
        let message = "give either path_prefix or path, not both";
        chk.key_error(path.key("path"), message);
    }
    let methods = methods(chk, &raw.methods, &path.key("methods"));
    let headers = headers(chk, raw, path);
    let case_sensitive = raw.case_sensitive.get().copied().unwrap_or(true);
    if !case_sensitive && !raw.path_prefix.is_given() && !raw.path.is_given() {
        let message = "has no effect: the match has no path_prefix or path";
        chk.warn(path.key("case_sensitive"), message);
    }
    if chk.errors.len() > errors_before {
        return None;
    }
    Some(RouteMatch {
        host,
        path: prefix.or(exact).unwrap_or(PathMatch::Any),
        methods,
        headers,
        case_sensitive,
    })
}

/// Warns of a `path_prefix` or `path` that no request's normalised path can match.
fn warn_unmatched_paths(chk: &mut Checker<'_>, raw: &RawMatch, path: &Path, paths: &PathPolicy) {
    for (given, key) in [(&raw.path_prefix, "path_prefix"), (&raw.path, "path")] {
        let Some(text) = given.get().filter(|t| t.starts_with('/')) else {
            continue;
        };
        if let Some(message) = unmatchable_path(text) {
            chk.warn(path.key(key), message);
            continue;
        }
        match paths.read(text) {
            Ok(read) if read.matched() != text => {
                let normal = read.matched();
                let message = format!(
                    "never matches as written: requests are matched on their normalised path, \
                     and {text:?} normalises to {normal:?}; write that"
                );
                chk.warn(path.key(key), message);
            }
            Err(PathError::EscapedSlash { .. }) => {
                let message = "never matches: requests whose path holds an encoded slash or \
                               backslash are refused (paths.escaped_slashes: reject)";
                chk.warn(path.key(key), message);
            }
            Err(PathError::Nul { .. }) => {
                let message = "never matches: requests whose path holds %00 are refused";
                chk.warn(path.key(key), message);
            }
            _ => {}
        }
    }
}

/// `headers`: each name and the value it must have.
fn headers(chk: &mut Checker<'_>, raw: &RawMatch, path: &Path) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::new();
    for (name, value) in raw.headers.get().map_or(&[][..], |h| h.0.as_slice()) {
        let hpath = path.key("headers").key(name);
        let header = HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()).map_err(|_| {
            chk.key_error(hpath.clone(), format!("not a valid header name: {name:?}"))
        });
        let value = chk.item(value, &hpath, "a header value").and_then(|v| {
            HeaderValue::from_str(v)
                .map_err(|_| chk.error(hpath.clone(), format!("not a valid header value: {v:?}")))
                .ok()
        });
        if let (Ok(header), Some(value)) = (header, value) {
            headers.push((header, value));
        }
    }
    headers
}

fn methods(chk: &mut Checker<'_>, raw: &Field<StrList>, path: &Path) -> Vec<Method> {
    if raw.get().is_some_and(StrList::is_empty) {
        let message = "an empty list matches no request; leave methods out to match every method";
        chk.error(path.clone(), message);
    }
    let mut methods: Vec<Method> = Vec::new();
    // Methods are case-sensitive on the wire, but nobody writing `get` means another method.
    let parsed = chk.parse_list(raw, path, |m| {
        Method::from_bytes(m.trim().to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("expected an HTTP method such as GET or POST, found {m:?}"))
    });
    for (j, method) in parsed.into_iter().enumerate() {
        if let Some(message) = unmatchable_method(&method) {
            chk.warn(path.index(j), message);
        }
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    methods
}

/// Methods clients send beyond RFC 9110's and PATCH: WebDAV's, CalDAV's, caches' PURGE, the
/// QUERY draft's.
const KNOWN_EXTENSION_METHODS: [&str; 14] = [
    "PROPFIND",
    "PROPPATCH",
    "MKCOL",
    "COPY",
    "MOVE",
    "LOCK",
    "UNLOCK",
    "REPORT",
    "SEARCH",
    "MKCALENDAR",
    "PURGE",
    "LINK",
    "UNLINK",
    "QUERY",
];

/// Why a route's `methods` entry would match no request, or likely none (a misspelling).
fn unmatchable_method(method: &Method) -> Option<String> {
    let name = method.as_str();
    if name == "*" {
        return Some("\"*\" is no wildcard here: it matches no request; leave methods out to match every method".into());
    }
    if *method == Method::CONNECT {
        return Some("CONNECT is refused (400) before routing: this never matches".into());
    }
    let standard = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::OPTIONS,
        Method::TRACE,
        Method::PATCH,
    ];
    (!standard.contains(method) && !KNOWN_EXTENSION_METHODS.contains(&name)).then(|| {
        format!("{name:?} is not a method clients are known to send: only a request with exactly that method matches (a misspelling of another?)")
    })
}

/// Why a route's `path` or `path_prefix` can never equal a request's path, with what to write
/// instead: a request's path carries no query or fragment, and what is not allowed in a URI
/// (spaces, non-ASCII letters) arrives percent-encoded.
fn unmatchable_path(text: &str) -> Option<String> {
    if let Some(c) = text.chars().find(|c| matches!(c, '?' | '#')) {
        return Some(format!(
            "never matches: a request's path does not hold its query or fragment, and {text:?} has {c:?}; match the path alone"
        ));
    }
    let needs_encoding = |b: u8| !b.is_ascii_graphic() || b"\"<>\\^`{|}".contains(&b);
    if !text.bytes().any(needs_encoding) {
        return None;
    }
    let mut encoded = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if needs_encoding(b) {
            encoded.push_str(&format!("%{b:02X}"));
        } else {
            encoded.push(b as char);
        }
    }
    Some(format!(
        "never matches as written: clients send {text:?} percent-encoded; write {encoded:?}"
    ))
}

/// `api.example.com` (exact) or `*.example.com` (any subdomain), compared in lowercase.
fn parse_host(text: &str) -> Result<HostPattern, String> {
    let host = text.trim().to_ascii_lowercase();
    let (pattern, name) = match host.strip_prefix("*.") {
        Some(rest) => (HostPattern::Suffix(format!(".{rest}")), rest),
        None => (HostPattern::Exact(host.clone()), host.as_str()),
    };
    if name.contains('*') {
        return Err(format!(
            "a wildcard is allowed only as a leading \"*.\", as in *.example.com, found {text:?}"
        ));
    }
    let bracketed_v6 = name.starts_with('[') && name.ends_with(']');
    if !bracketed_v6 && name.contains(':') {
        return Err(format!(
            "a host is matched without its port; leave the port out of {text:?}"
        ));
    }
    let ok = bracketed_v6
        || (!name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if !ok {
        return Err(format!(
            "expected a host such as api.example.com or *.example.com, found {text:?}"
        ));
    }
    Ok(pattern)
}

fn parse_path(text: &str) -> Result<&str, String> {
    if text.starts_with('/') {
        Ok(text)
    } else {
        Err(format!("a path must start with \"/\", found {text:?}"))
    }
}

/// Warns about every route that an earlier route matches whenever it would match: first match
/// wins, so it can never be reached.
fn warn_shadowed(chk: &mut Checker<'_>, routes: &[(usize, RouteConfig)]) {
    for (k, (j, later)) in routes.iter().enumerate() {
        let earlier = routes[..k]
            .iter()
            .find(|(_, e)| e.matcher.shadows(&later.matcher));
        if let Some((i, first)) = earlier {
            let line = chk.warning_line_of(&Path::root().key("routes").index(*i));
            let line = line.map_or(String::new(), |n| format!(", line {n}"));
            let message = format!(
                "route {:?} can never match: route {:?} (routes[{i}]{line}) comes first \
                 and matches every request it would",
                later.name, first.name
            );
            chk.warn(Path::root().key("routes").index(*j), message);
        }
    }
}
