//! Tests of the config layer: the shipped example, defaults, formats, and every kind of
//! problem with its exact `file:line:column: path: message` text.

use super::{parse, ConfigError, Loaded};

mod explore;

/// The `proxy.yaml` of SPEC section 2, verbatim: the contract.
const SPEC_EXAMPLE: &str = include_str!("spec_example.yaml");

/// An environment with nothing set.
fn no_env(_: &str) -> Option<String> {
    None
}

/// Parses `text` as `proxy.yaml` with an empty environment; panics with the problems if invalid.
fn ok(text: &str) -> Loaded {
    match parse(text, "proxy.yaml", &no_env) {
        Ok(loaded) => loaded,
        Err(e) => panic!("expected a valid config, got:\n{e}"),
    }
}

/// The problems of an invalid `text`, each as displayed.
fn problems(text: &str) -> Vec<String> {
    match parse(text, "proxy.yaml", &no_env) {
        Ok(loaded) => panic!("expected problems, got a valid config: {:?}", loaded.config),
        Err(ConfigError::Invalid(problems)) => problems.iter().map(ToString::to_string).collect(),
        Err(e) => panic!("expected ConfigError::Invalid, got {e:?}"),
    }
}
