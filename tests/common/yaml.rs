//! One way to write a test's `proxy.yaml`: [`Yaml`], built up in parts.
//!
//! ```ignore
//! let yaml = Yaml::to(&[upstream.url()])
//!     .redis(&redis, "timeout: 500ms")
//!     .upstream("pace: {rate: 10/s, max_delay: 2s}")
//!     .route("api", "/", "")
//!     .build();
//! ```
//!
//! Each part is YAML text as it would stand at the top of a file; the builder indents it to
//! its place. A test reads as the keys it sets, and the parts every test needs (a free port,
//! upstream `api`) are written once, here.

use super::Redis;

/// A test's `proxy.yaml`: it listens on a free port and has an upstream `api`, and maybe others.
#[derive(Debug, Clone)]
pub struct Yaml {
    top: String,
    targets: Vec<String>,
    upstream: String,
    others: String,
    routes: String,
}

impl Yaml {
    /// A file whose upstream `api` has `targets`, with no routes yet.
    pub fn to<T: AsRef<str>>(targets: &[T]) -> Yaml {
        Yaml {
            top: String::new(),
            targets: targets.iter().map(|t| t.as_ref().to_owned()).collect(),
            upstream: String::new(),
            others: String::new(),
            routes: String::new(),
        }
    }

    /// Top-level keys: `"workers: 1"`, `"trusted_proxies: [127.0.0.1/32]"`.
    pub fn top(mut self, text: &str) -> Yaml {
        push_indented(&mut self.top, text, 0);
        self
    }

    /// The store in `redis`, with `more` of its keys, one per line: `"timeout: 500ms\non_error:
    /// deny"`. (The store's keys are flat, so each line's own indent is dropped.)
    pub fn redis(self, redis: &Redis, more: &str) -> Yaml {
        let mut store = format!("store:\n  backend: redis\n  url: {}\n", redis.url());
        let flat: String = more.lines().map(|l| format!("{}\n", l.trim())).collect();
        push_indented(&mut store, &flat, 2);
        self.top(&store)
    }

    /// More keys of upstream `api`: `"pace: {rate: 10/s}"`.
    pub fn upstream(mut self, text: &str) -> Yaml {
        push_indented(&mut self.upstream, text, 4);
        self
    }

    /// Another upstream, `name`, at `targets`, with `more` of its keys.
    pub fn also_upstream<T: AsRef<str>>(mut self, name: &str, targets: &[T], more: &str) -> Yaml {
        let targets: Vec<&str> = targets.iter().map(AsRef::as_ref).collect();
        let head = format!("{name}:\n  targets: [{}]\n", targets.join(", "));
        push_indented(&mut self.others, &head, 2);
        push_indented(&mut self.others, more, 4);
        self
    }

    /// A route `name` to `api` for the paths under `prefix`, with `more` of its keys:
    /// `"strip_prefix: true"`, or a `limits:` list.
    pub fn route(self, name: &str, prefix: &str, more: &str) -> Yaml {
        self.route_to(name, prefix, "api", more)
    }

    /// [`Yaml::route`] to the upstream `upstream`.
    pub fn route_to(self, name: &str, prefix: &str, upstream: &str, more: &str) -> Yaml {
        self.route_matching(name, &format!("{{path_prefix: {prefix}}}"), upstream, more)
    }

    /// A route `name` to `upstream` for the requests `matching` picks, its `match:` as a flow
    /// mapping: `"{host: api.example.com, path_prefix: /v1}"`.
    pub fn route_matching(
        mut self,
        name: &str,
        matching: &str,
        upstream: &str,
        more: &str,
    ) -> Yaml {
        let head = format!("- name: {name}\n  match: {matching}\n  upstream: {upstream}\n");
        push_indented(&mut self.routes, &head, 2);
        push_indented(&mut self.routes, more, 4);
        self
    }

    /// The file's text.
    pub fn build(&self) -> String {
        format!(
            "listen: 127.0.0.1:0\n{}upstreams:\n  api:\n    targets: [{}]\n{}{}routes:\n{}",
            self.top,
            self.targets.join(", "),
            self.upstream,
            self.others,
            self.routes
        )
    }
}

/// Appends `text` to `out`, each non-empty line indented by `by` spaces past its own.
fn push_indented(out: &mut String, text: &str, by: usize) {
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        out.extend(std::iter::repeat_n(' ', by));
        out.push_str(line);
        out.push('\n');
    }
}
