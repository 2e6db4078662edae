//! The first-match route table.
//!
//! Owns the order of routes and the search for unreachable ones; what a single route matches is
//! [`RouteMatch`]'s business.

use super::{RequestParts, RouteMatch};

/// Routes in order; the first whose [`RouteMatch`] matches a request wins.
///
/// `R` is what a route leads to (limits, upstream); routing does not look inside it. Lookup is
/// a linear scan: route lists are short and each test is a few comparisons without allocation.
#[derive(Debug, Clone)]
pub struct RouteTable<R> {
    /// In file order: the order is the meaning (first match wins).
    routes: Vec<(RouteMatch, R)>,
}

impl<R> RouteTable<R> {
    /// A table of `routes`, tried in the order given.
    pub fn new(routes: Vec<(RouteMatch, R)>) -> Self {
        RouteTable { routes }
    }

    /// The first route that matches the request, if any (none: the proxy answers 404).
    pub fn find(&self, req: &RequestParts<'_>) -> Option<&R> {
        self.find_match(req).map(|(_, route)| route)
    }

    /// Like [`find`](Self::find), with the conditions that matched (for [`strip_prefix`]).
    pub fn find_match(&self, req: &RequestParts<'_>) -> Option<(&RouteMatch, &R)> {
        self.routes
            .iter()
            .find(|(conditions, _)| conditions.matches(req))
            .map(|(conditions, route)| (conditions, route))
    }

    /// Every unreachable route, as `(index, index of the earlier route that shadows it)`, each
    /// later route reported once, for the earliest route that shadows it.
    pub fn shadowed(&self) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        for (later, (conditions, _)) in self.routes.iter().enumerate() {
            let earlier = self.routes[..later]
                .iter()
                .position(|(e, _)| e.shadows(conditions));
            if let Some(earlier) = earlier {
                found.push((later, earlier));
            }
        }
        found
    }

    /// The routes, in order.
    pub fn routes(&self) -> &[(RouteMatch, R)] {
        &self.routes
    }

    /// The number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are no routes (every request gets 404).
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::{normalize_path, PathMatch};
    use http::{HeaderMap, Method};

    fn prefix(p: &str) -> RouteMatch {
        RouteMatch {
            host: None,
            path: PathMatch::Prefix(p.into()),
            methods: vec![],
            headers: vec![],
            case_sensitive: true,
        }
    }

    fn request<'a>(path: &'a str, headers: &'a HeaderMap) -> RequestParts<'a> {
        RequestParts {
            host: None,
            path,
            method: &Method::GET,
            headers,
        }
    }

    /// The first matching route wins, in the order given.
    #[test]
    fn first_match_wins() {
        let table = RouteTable::new(vec![
            (prefix("/v1/admin"), "admin"),
            (prefix("/v1"), "v1"),
            (prefix("/"), "fallback"),
            (prefix("/v1"), "never"),
        ]);
        let headers = HeaderMap::new();
        let find = |path| table.find(&request(path, &headers)).copied();
        assert_eq!(find("/v1/admin/x"), Some("admin"));
        assert_eq!(find("/v1/x"), Some("v1"));
        assert_eq!(find("/v1x"), Some("fallback"));
        let empty: RouteTable<()> = RouteTable::new(vec![]);
        assert!(empty.find(&request("/", &headers)).is_none());
    }

    /// `/v1/../admin` cannot reach `/v1`'s route once normalised.
    #[test]
    fn dot_dot_cannot_borrow_a_prefix() {
        let table = RouteTable::new(vec![(prefix("/v1"), "v1"), (prefix("/admin"), "admin")]);
        let headers = HeaderMap::new();
        let path = normalize_path("/v1/%2e%2e/admin").expect("valid");
        assert_eq!(table.find(&request(&path, &headers)), Some(&"admin"));
    }

    /// The table reports each unreachable route with the earliest route that hides it.
    #[test]
    fn table_reports_shadowed_routes() {
        let table = RouteTable::new(vec![
            (prefix("/v1"), ()),
            (prefix("/v1/x"), ()),
            (prefix("/"), ()),
            (prefix("/v2"), ()),
        ]);
        assert_eq!(table.shadowed(), vec![(1, 0), (3, 2)]);
    }
}
