//! Route table: a request's host, normalised path, method and headers select the first route
//! that matches, in file order.
//!
//! Owns path normalisation ([`normalize_path`], [`PathPolicy`]), the match conditions
//! ([`RouteMatch`]), the first-match table ([`RouteTable`]) and the analysis that finds
//! unreachable routes ([`RouteMatch::shadows`]). It does not own what a route *does*: the table
//! is generic over its limits and upstream. Uses nothing else of the crate but `host`, and only
//! `http` types, not hyper's.
//!
//! Requests are compared in normal form, so the paths of a [`PathMatch`] should be too: build
//! them through [`normalize_path`] (a prefix such as `/v1/%7euser` would otherwise never match).
//!
//! Submodules: `path` (normalisation), `table` (the ordered table and `strip_prefix`).

mod path;
mod table;

pub use path::{
    normalize_path, strip_prefix, EscapedSlashes, PathError, PathPolicy, RequestPath, SegmentParams,
};
pub use table::RouteTable;

use http::{HeaderName, HeaderValue, Method};

/// A host pattern: exact (`api.example.com`) or a leading wildcard (`*.example.com`).
/// Compared case-insensitively, without the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// the whole host, lowercase
    Exact(String),
    /// `*.example.com` stored as `.example.com` (lowercase): matches `a.example.com`, not `example.com`
    Suffix(String),
}

/// How the path must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// any path
    Any,
    /// segment-aware prefix: `/v1` matches `/v1` and `/v1/x`, not `/v1x`
    Prefix(String),
    /// exactly this path
    Exact(String),
}

/// What a route matches; every present condition must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteMatch {
    /// `match.host`
    pub host: Option<HostPattern>,
    /// `match.path_prefix` or `match.path`
    pub path: PathMatch,
    /// `match.methods`; empty: any method
    pub methods: Vec<Method>,
    /// `match.headers`: exact values
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `match.case_sensitive`: `false` compares the path without regard to ASCII case
    pub case_sensitive: bool,
}

/// The parts of a request that routing looks at, borrowed from it.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// `Host` header or `:authority`; may carry a port (`api.example.com:8080`, `[::1]:8080`)
    /// and any case.
    pub host: Option<&'a str>,
    /// The path as returned by [`normalize_path`].
    pub path: &'a str,
    /// The request method.
    pub method: &'a Method,
    /// The request headers.
    pub headers: &'a http::HeaderMap,
}

impl HostPattern {
    /// Whether the request host (any case, with or without port or trailing dot) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = crate::host::name(host);
        match self {
            HostPattern::Exact(name) => crate::host::name(name).eq_ignore_ascii_case(host),
            HostPattern::Suffix(suffix) => has_label_suffix(host, trim_dot(suffix)),
        }
    }

    /// Whether `self` matches every host that `later` matches.
    fn covers(&self, later: &HostPattern) -> bool {
        match (self, later) {
            (_, HostPattern::Exact(name)) => self.matches(name),
            (HostPattern::Suffix(mine), HostPattern::Suffix(theirs)) => {
                let (mine, theirs) = (trim_dot(mine), trim_dot(theirs));
                mine.eq_ignore_ascii_case(theirs) || has_label_suffix(theirs, mine)
            }
            (HostPattern::Exact(_), HostPattern::Suffix(_)) => false,
        }
    }
}

/// What keeps an authority from being a plain `host[:port]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityFault {
    /// user information before the host (`user:pw@host`)
    UserInfo,
    /// a port that is not a number of 16 bits (`host:99999`)
    Port,
}

/// Why `authority` is not a plain `host[:port]` (an empty port is the scheme's), if it is
/// not: a request's target or `:authority`, an upstream target.
pub fn authority_fault(authority: &str) -> Option<AuthorityFault> {
    if authority.contains('@') {
        return Some(AuthorityFault::UserInfo);
    }
    // (an IPv6 literal's colons are inside its brackets)
    let after_host = authority
        .rfind(']')
        .map_or(authority, |i| &authority[i + 1..]);
    let port = after_host.rsplit_once(':').map_or("", |(_, port)| port);
    (!port.is_empty() && port.parse::<u16>().is_err()).then_some(AuthorityFault::Port)
}

fn trim_dot(name: &str) -> &str {
    name.strip_suffix('.').unwrap_or(name)
}

/// Whether `host` is `suffix` preceded by at least one more label (case-insensitive).
/// `suffix` is normally `.example.com`; without its leading dot a label boundary is still required.
fn has_label_suffix(host: &str, suffix: &str) -> bool {
    let (host, suffix) = (host.as_bytes(), suffix.as_bytes());
    let Some(cut) = host.len().checked_sub(suffix.len()).filter(|&cut| cut > 0) else {
        return false;
    };
    host[cut..].eq_ignore_ascii_case(suffix)
        && (suffix.first() == Some(&b'.') || host[cut - 1] == b'.')
}

impl PathMatch {
    /// Whether the normalised `path` matches. `Prefix` is segment aware: `/v1` matches `/v1`,
    /// `/v1/` and `/v1/x` but not `/v1x`; a prefix ending in `/` matches what starts with it;
    /// `Prefix("/")` matches every path.
    pub fn matches(&self, path: &str) -> bool {
        self.matches_case(path, true)
    }

    /// [`PathMatch::matches`], ignoring ASCII case unless `case_sensitive`: `/api` then
    /// matches `/API/x`. Other characters, and `%XX` escapes, are compared as they are.
    pub fn matches_case(&self, path: &str, case_sensitive: bool) -> bool {
        let fold = !case_sensitive;
        match self {
            PathMatch::Any => true,
            PathMatch::Exact(exact) => same(exact, path, fold),
            PathMatch::Prefix(prefix) => prefix == "/" || is_under(prefix, path, fold),
        }
    }

    fn matches_everything(&self) -> bool {
        matches!(self, PathMatch::Any) || matches!(self, PathMatch::Prefix(p) if p == "/")
    }

    /// Whether `self` (compared with `case_sensitive`) matches every path that `later`
    /// (compared with `later_case_sensitive`) matches. A case-sensitive `self` covers a
    /// case-insensitive `later` only where its path holds no letter: `/api` does not match
    /// `/API`, which `later` may.
    fn covers(&self, case_sensitive: bool, later: &PathMatch, later_case_sensitive: bool) -> bool {
        if self.matches_everything() {
            return true;
        }
        let (mine, theirs) = match (self, later) {
            (PathMatch::Prefix(mine), PathMatch::Prefix(theirs) | PathMatch::Exact(theirs))
            | (PathMatch::Exact(mine), PathMatch::Exact(theirs)) => (mine, theirs),
            _ => return false,
        };
        if case_sensitive && !later_case_sensitive && mine.bytes().any(|b| b.is_ascii_alphabetic())
        {
            return false;
        }
        // Every path under `/v1/x` (or equal to it) is under `/v1`, since `/v1/x` is.
        match self {
            PathMatch::Prefix(_) => is_under(mine, theirs, !case_sensitive),
            _ => same(mine, theirs, !case_sensitive),
        }
    }
}

/// Whether `a` and `b` are the same path, ignoring ASCII case when `fold`.
fn same(a: &str, b: &str, fold: bool) -> bool {
    match fold {
        true => a.eq_ignore_ascii_case(b),
        false => a == b,
    }
}

/// Segment-aware prefix test: `path` is `prefix`, or continues it at a `/`; ignoring ASCII case
/// when `fold`.
fn is_under(prefix: &str, path: &str, fold: bool) -> bool {
    let Some(head) = path.as_bytes().get(..prefix.len()) else {
        return false;
    };
    let equal = match fold {
        true => head.eq_ignore_ascii_case(prefix.as_bytes()),
        false => head == prefix.as_bytes(),
    };
    let rest = &path.as_bytes()[prefix.len()..];
    equal && (rest.is_empty() || rest[0] == b'/' || prefix.ends_with('/'))
}

impl RouteMatch {
    /// Whether the request meets every condition: host (case-insensitive, port ignored), path,
    /// method (empty list: any), and each listed header present with exactly that value on one of
    /// its lines.
    pub fn matches(&self, req: &RequestParts<'_>) -> bool {
        self.path.matches_case(req.path, self.case_sensitive)
            && (self.methods.is_empty() || self.methods.contains(req.method))
            && match (&self.host, req.host) {
                (None, _) => true,
                (Some(pattern), Some(host)) => pattern.matches(host),
                (Some(_), None) => false,
            }
            && self
                .headers
                .iter()
                .all(|(name, value)| req.headers.get_all(name).iter().any(|line| line == value))
    }

    /// Whether `self` certainly matches every request that `later` matches, so that a route
    /// with `later`'s conditions after one with `self`'s can never be reached.
    ///
    /// Conservative: `true` only when each of `self`'s conditions is implied by one of `later`'s
    /// (same or narrower host, path under `self`'s prefix, methods a subset, headers a superset).
    /// It can answer `false` for pairs that do in fact shadow, never `true` for pairs that do not.
    pub fn shadows(&self, later: &RouteMatch) -> bool {
        let host = match (&self.host, &later.host) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(mine), Some(theirs)) => mine.covers(theirs),
        };
        let methods = self.methods.is_empty()
            || (!later.methods.is_empty()
                && later.methods.iter().all(|m| self.methods.contains(m)));
        let headers = self
            .headers
            .iter()
            .all(|header| later.headers.contains(header));
        let path = (self.path).covers(self.case_sensitive, &later.path, later.case_sensitive);
        host && methods && headers && path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    /// An authority is plain `host[:port]`: user information or a port past 16 bits is not,
    /// and an IPv6 literal's colons are not a port's.
    #[test]
    fn authority_faults() {
        for plain in ["h", "h:80", "h:", "[::1]", "[::1]:443", "10.0.0.1:65535"] {
            assert_eq!(authority_fault(plain), None, "{plain}");
        }
        for (bad, fault) in [
            ("u@h", AuthorityFault::UserInfo),
            ("u:pw@h:80", AuthorityFault::UserInfo),
            ("h:99999", AuthorityFault::Port),
            ("[::1]:65536", AuthorityFault::Port),
            ("h:8o", AuthorityFault::Port),
        ] {
            assert_eq!(authority_fault(bad), Some(fault), "{bad}");
        }
    }

    fn prefix(p: &str) -> RouteMatch {
        RouteMatch {
            host: None,
            path: PathMatch::Prefix(p.into()),
            methods: vec![],
            headers: vec![],
            case_sensitive: true,
        }
    }

    fn with_host(host: HostPattern) -> RouteMatch {
        RouteMatch {
            host: Some(host),
            ..prefix("/")
        }
    }

    fn request<'a>(
        host: Option<&'a str>,
        path: &'a str,
        method: &'a Method,
        headers: &'a HeaderMap,
    ) -> RequestParts<'a> {
        RequestParts {
            host,
            path,
            method,
            headers,
        }
    }

    fn matches_host(m: &RouteMatch, host: Option<&str>) -> bool {
        m.matches(&request(host, "/", &Method::GET, &HeaderMap::new()))
    }

    fn matches_path(m: &RouteMatch, path: &str) -> bool {
        m.matches(&request(None, path, &Method::GET, &HeaderMap::new()))
    }

    /// Exact hosts compare case-insensitively and ignore the port, brackets and a trailing dot.
    #[test]
    fn exact_host_ignores_case_port_and_trailing_dot() {
        let m = with_host(HostPattern::Exact("api.example.com".into()));
        for host in [
            "api.example.com",
            "API.Example.COM",
            "api.example.com:8080",
            "api.example.com.",
        ] {
            assert!(matches_host(&m, Some(host)), "{host}");
        }
        for host in [
            "example.com",
            "xapi.example.com",
            "api.example.com.evil",
            "api.example.com:80x",
        ] {
            assert!(!matches_host(&m, Some(host)), "{host}");
        }
        assert!(!matches_host(&m, None), "a host condition needs a host");
    }

    /// IPv6 literal hosts match with or without brackets and port.
    #[test]
    fn ipv6_host_with_port_matches() {
        let m = with_host(HostPattern::Exact("[::1]".into()));
        assert!(matches_host(&m, Some("[::1]:8080")));
        assert!(matches_host(&m, Some("[::1]")));
        let bare = with_host(HostPattern::Exact("::1".into()));
        assert!(matches_host(&bare, Some("[::1]:8080")));
        assert!(!matches_host(&bare, Some("[::2]:8080")));
    }

    /// `*.example.com` matches any deeper name, not the bare domain or a look-alike.
    #[test]
    fn wildcard_host_matches_subdomains_only() {
        let m = with_host(HostPattern::Suffix(".example.com".into()));
        for host in ["a.example.com", "a.b.example.com", "A.EXAMPLE.com:443"] {
            assert!(matches_host(&m, Some(host)), "{host}");
        }
        for host in [
            "example.com",
            ".example.com",
            "badexample.com",
            "example.com.evil",
        ] {
            assert!(!matches_host(&m, Some(host)), "{host}");
        }
    }

    /// Prefixes are segment aware: `/v1` covers `/v1`, `/v1/`, `/v1/x`, not `/v1x`.
    #[test]
    fn prefix_is_segment_aware() {
        let m = prefix("/v1");
        for path in ["/v1", "/v1/", "/v1/x", "/v1/x/y"] {
            assert!(matches_path(&m, path), "{path}");
        }
        for path in ["/v1x", "/v", "/", "/v2/v1"] {
            assert!(!matches_path(&m, path), "{path}");
        }
        let slash = prefix("/v1/");
        assert!(matches_path(&slash, "/v1/x"));
        assert!(!matches_path(&slash, "/v1"));
    }

    /// `Prefix("/")` and `Any` match every path; `Exact` only its own.
    #[test]
    fn root_prefix_matches_everything_and_exact_only_itself() {
        for path in ["/", "/x", "/v1/y/"] {
            assert!(matches_path(&prefix("/"), path));
        }
        let exact = RouteMatch {
            path: PathMatch::Exact("/health".into()),
            ..prefix("/")
        };
        assert!(matches_path(&exact, "/health"));
        assert!(!matches_path(&exact, "/health/"));
        assert!(!matches_path(&exact, "/healthz"));
    }

    /// A method list admits only its methods; an empty one admits all.
    #[test]
    fn methods_restrict_when_listed() {
        let m = RouteMatch {
            methods: vec![Method::GET, Method::POST],
            ..prefix("/")
        };
        let headers = HeaderMap::new();
        assert!(m.matches(&request(None, "/", &Method::POST, &headers)));
        assert!(!m.matches(&request(None, "/", &Method::DELETE, &headers)));
        assert!(prefix("/").matches(&request(None, "/", &Method::DELETE, &headers)));
    }

    /// Every listed header must be present with exactly that value, on any of its lines.
    #[test]
    fn headers_need_exact_values() {
        let m = RouteMatch {
            headers: vec![(
                HeaderName::from_static("x-tenant"),
                HeaderValue::from_static("gold"),
            )],
            ..prefix("/")
        };
        let with = |values: &[&'static str]| {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append("x-tenant", HeaderValue::from_static(v));
            }
            m.matches(&request(None, "/", &Method::GET, &headers))
        };
        assert!(with(&["gold"]));
        assert!(with(&["silver", "gold"]));
        assert!(!with(&[]));
        assert!(!with(&["Gold"]));
        assert!(!with(&["gold, silver"]));
    }

    /// A catch-all shadows everything; narrower conditions shadow only what they certainly cover.
    #[test]
    fn shadows_only_when_certain() {
        let any = RouteMatch {
            path: PathMatch::Any,
            ..prefix("/")
        };
        let v1_get = RouteMatch {
            methods: vec![Method::GET],
            ..prefix("/v1")
        };
        assert!(prefix("/").shadows(&v1_get));
        assert!(any.shadows(&prefix("/")));
        assert!(prefix("/v1").shadows(&prefix("/v1/x")));
        assert!(prefix("/v1").shadows(&RouteMatch {
            path: PathMatch::Exact("/v1".into()),
            ..prefix("/")
        }));
        assert!(!prefix("/v1").shadows(&prefix("/v1x")));
        assert!(!prefix("/v1/").shadows(&prefix("/v1")));
        assert!(!prefix("/v1").shadows(&prefix("/")));
        assert!(
            !v1_get.shadows(&prefix("/v1")),
            "a method condition the later route lacks"
        );
        let v1_get_head = RouteMatch {
            methods: vec![Method::GET, Method::HEAD],
            ..prefix("/v1")
        };
        assert!(v1_get_head.shadows(&v1_get));
        assert!(!v1_get.shadows(&v1_get_head));
    }

    fn any_case(m: RouteMatch) -> RouteMatch {
        RouteMatch {
            case_sensitive: false,
            ..m
        }
    }

    /// `case_sensitive: false` folds ASCII letters only, segment aware as ever; escapes and
    /// other characters compare as they are.
    #[test]
    fn any_case_prefix_folds_ascii_letters() {
        let m = any_case(prefix("/api"));
        for path in ["/api", "/API/users", "/Api/", "/aPi/x/Y"] {
            assert!(matches_path(&m, path), "{path}");
        }
        for path in ["/apix", "/API%2Fx", "/ap", "/Àpi"] {
            assert!(!matches_path(&m, path), "{path}");
        }
        assert!(!matches_path(&prefix("/api"), "/API/users"));
        let exact = any_case(RouteMatch {
            path: PathMatch::Exact("/health".into()),
            ..prefix("/")
        });
        assert!(matches_path(&exact, "/HEALTH"));
        assert!(!matches_path(&exact, "/HEALTH/"));
        let caf = any_case(prefix("/caf%C3%A9"));
        assert!(matches_path(&caf, "/CAF%C3%A9/x"));
        assert!(!matches_path(&caf, "/caf%C3%89"), "escapes are not folded");
    }

    /// An earlier route that ignores case shadows later routes in any case; a case-sensitive
    /// one shadows a later route that ignores case only where its path has no letter.
    #[test]
    fn shadows_knows_case() {
        assert!(any_case(prefix("/api/")).shadows(&prefix("/API/users")));
        assert!(any_case(prefix("/api")).shadows(&any_case(prefix("/Api/x"))));
        assert!(!prefix("/api").shadows(&prefix("/API/users")));
        assert!(!prefix("/api").shadows(&any_case(prefix("/api/users"))));
        assert!(prefix("/1").shadows(&any_case(prefix("/1/users"))));
        assert!(prefix("/").shadows(&any_case(prefix("/api"))));
        let exact = |p: &str| RouteMatch {
            path: PathMatch::Exact(p.into()),
            ..prefix("/")
        };
        assert!(any_case(exact("/a")).shadows(&exact("/A")));
        assert!(!exact("/a").shadows(&any_case(exact("/a"))));
    }

    /// Host and header conditions shadow only later routes that are at least as narrow.
    #[test]
    fn shadows_compares_hosts_and_headers() {
        let wild = with_host(HostPattern::Suffix(".example.com".into()));
        let exact = with_host(HostPattern::Exact("a.example.com".into()));
        let deeper = with_host(HostPattern::Suffix(".b.example.com".into()));
        assert!(wild.shadows(&exact));
        assert!(wild.shadows(&deeper));
        assert!(!deeper.shadows(&wild));
        assert!(!exact.shadows(&wild));
        assert!(!exact.shadows(&prefix("/")));
        assert!(!wild.shadows(&with_host(HostPattern::Exact("example.com".into()))));
        let gold = (
            HeaderName::from_static("x-tenant"),
            HeaderValue::from_static("gold"),
        );
        let tenant = RouteMatch {
            headers: vec![gold.clone()],
            ..prefix("/")
        };
        let tenant_v1 = RouteMatch {
            headers: vec![gold],
            ..prefix("/v1")
        };
        assert!(tenant.shadows(&tenant_v1));
        assert!(!tenant.shadows(&prefix("/v1")));
    }
}
