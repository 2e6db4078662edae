//! `proxy.yaml`: reading, environment expansion, validation into the typed [`Config`], and
//! problems that name the file, line, column and key path.
//!
//! The path from text to config, one private module per step (and the public [`units`], whose
//! parsers and formatters are also fuzzed on their own):
//!
//! * `tree`: the YAML text as a plain tree (syntax errors stop here); repeated keys are
//!   reported, merge keys (`<<: *anchor`) applied, top-level `x-` fields (anchor holders)
//!   dropped, and `${VAR}` expanded in every string value (`env`).
//! * `de` + `raw`: the tree read into the serde mirror of the file, which denies unknown keys;
//!   the deserializer records every problem and keeps going, so one check reports them all.
//! * `validate`, `backend`, `routes`, `limits`: the mirror turned into [`Config`] (formats in
//!   [`units`], defaults, cross references, warnings).
//! * `locate`: the key path of each problem turned into a line and column.
//! * `summary`: the config told back, for `tollgate check` ([`Config::summary`]) and the admin
//!   `/config` endpoint ([`Config::to_json`]).
//!
//! This module owns no I/O beyond reading the file in [`load`] and, when asked, the TLS files
//! it names; reloading (SIGHUP, a changed
//! file) is the caller's: it calls [`load`] again and keeps the old config on an error.

mod adaptive;
mod backend;
mod check;
mod client_tls;
mod de;
mod env;
mod limits;
mod locate;
mod problem;
mod raw;
mod routes;
mod summary;
mod tree;
mod types;
pub mod units;
mod validate;

#[cfg(test)]
mod tests;

use std::path::Path as FilePath;

pub use problem::{ConfigError, Problem};
pub use types::AdaptiveConfig;
pub use types::{
    AccessLog, AdminConfig, AdminToken, Backend, ClientTls, Config, ForwardedHeaders, HeaderStyle,
    Http2Config, LimitConfig, LogClient, Mode, OnError, PaceConcurrency, PemFile, Protocol,
    RouteConfig, SentinelConfig, StoreConfig, Timeouts, TlsConfig, UpstreamConfig,
};

use locate::Locator;
use problem::{Path, Pending, MAX_PROBLEMS};

/// A configuration that passed validation, with the warnings it drew.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// the typed configuration
    pub config: Config,
    /// problems that do not stop the proxy (an unreachable route, no routes, an unused
    /// upstream), in file order
    pub warnings: Vec<Problem>,
}

/// Reads and validates the file at `path`, expanding `${VAR}` from the process environment.
/// Problems name the file as `path` is written.
pub fn load(path: &FilePath) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_with(
        &text,
        &path.display().to_string(),
        &|name| std::env::var(name).ok(),
        true,
    )
}

/// Validates `text` as the contents of `file` (used only in messages), expanding `${VAR}` with
/// `env`. On failure, every problem found is returned, in file order.
/// Files the configuration names (the TLS certificate and key) are not read: see [`load`].
pub fn parse(
    text: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Loaded, ConfigError> {
    parse_with(text, file, env, false)
}

/// [`parse`]; with `read_files`, the files the configuration names are read and checked too,
/// so that `check` (and a reload) finds a missing or unusable certificate, as `nginx -t` does.
fn parse_with(
    text: &str,
    file: &str,
    env: &dyn Fn(&str) -> Option<String>,
    read_files: bool,
) -> Result<Loaded, ConfigError> {
    // a file saved with a byte order mark (as some Windows editors write UTF-8)
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut tree = match tree::parse(text) {
        Ok(tree) => tree,
        Err(e) => {
            return Err(ConfigError::Invalid(vec![Problem {
                file: file.to_owned(),
                line: e.line,
                column: e.column,
                path: String::new(),
                message: e.message,
            }]))
        }
    };
    let locator = Locator::new(text);
    let mut errors = Vec::new();
    tree::drop_extensions(&mut tree);
    tree::prepare(&mut tree, &Path::root(), env, &locator, &mut errors);
    let ctx = de::Ctx::default();
    let raw: Option<raw::RawConfig> = de::from_node(&tree, &ctx);
    errors.extend(ctx.into_problems());
    let mut chk = check::Checker::new(&locator);
    chk.read_files = read_files;
    let config = raw.map(|raw| validate::config(&mut chk, &raw));
    errors.append(&mut chk.errors);
    let errors = place(errors, file, &locator);
    match config {
        Some(config) if errors.is_empty() => Ok(Loaded {
            config,
            warnings: place(chk.warnings, file, &locator),
        }),
        _ => Err(ConfigError::Invalid(errors)),
    }
}

/// Gives each problem its position; sorts them into file order and drops exact repeats. Past
/// [`MAX_PROBLEMS`], the rest are counted in one last problem, at the position of the one before.
fn place(mut pending: Vec<Pending>, file: &str, locator: &Locator<'_>) -> Vec<Problem> {
    let untold = pending.len().saturating_sub(MAX_PROBLEMS);
    pending.truncate(MAX_PROBLEMS);
    let mut problems: Vec<Problem> = pending
        .into_iter()
        .map(|p| {
            let (line, column) = locator.locate(&p.path, p.at);
            Problem {
                file: file.to_owned(),
                line,
                column,
                path: p.path.to_string(),
                message: p.message,
            }
        })
        .collect();
    // A stable sort keeps problems at one position in the order they were found.
    problems.sort_by_key(|p| (p.line, p.column));
    problems.dedup();
    if let Some(last) = problems.last().filter(|_| untold > 0) {
        let message = format!("{untold} more not shown: fix the problems above and check again");
        problems.push(Problem {
            path: String::new(),
            message,
            ..last.clone()
        });
    }
    problems
}
