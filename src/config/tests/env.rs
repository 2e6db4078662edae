//! `${VAR}` expansion: values, defaults, `$$`, and the errors.

use super::*;
use crate::config::env::expand;

fn env(name: &str) -> Option<String> {
    match name {
        "PORT" => Some("9090".to_owned()),
        "EMPTY" => Some(String::new()),
        "HOST" => Some("10.0.0.5".to_owned()),
        _ => None,
    }
}

/// A set variable is substituted, with or without a default.
#[test]
fn set_variables_are_substituted() {
    assert_eq!(
        expand("${HOST}:${PORT}", &env).as_deref(),
        Ok("10.0.0.5:9090")
    );
    assert_eq!(expand("${PORT:-80}", &env).as_deref(), Ok("9090"));
}

/// The default applies when the variable is unset or empty, as in the shell's `:-`.
#[test]
fn defaults_apply_when_unset_or_empty() {
    assert_eq!(
        expand("${NOPE:-redis://h:1/0}", &env).as_deref(),
        Ok("redis://h:1/0")
    );
    assert_eq!(expand("${EMPTY:-x}", &env).as_deref(), Ok("x"));
    assert_eq!(expand("a${EMPTY}b", &env).as_deref(), Ok("ab"));
    assert_eq!(expand("${NOPE:-}", &env).as_deref(), Ok(""));
}

/// `$$` is a literal `$`; a `$` not followed by `{` stays as written.
#[test]
fn dollar_dollar_is_a_literal_dollar() {
    assert_eq!(expand("pa$$word", &env).as_deref(), Ok("pa$word"));
    assert_eq!(expand("$${PORT}", &env).as_deref(), Ok("${PORT}"));
    assert_eq!(expand("cost $5", &env).as_deref(), Ok("cost $5"));
}

/// Malformed references are errors that say what to write.
#[test]
fn malformed_references_are_errors() {
    let unterminated = expand("${PORT", &env).expect_err("unterminated");
    assert_eq!(
        unterminated,
        "unterminated ${ in \"${PORT\": add the closing }"
    );
    let bad_name = expand("${1X}", &env).expect_err("bad name");
    assert!(
        bad_name.starts_with("${1X} is not a valid reference"),
        "{bad_name}"
    );
}

/// Expansion happens in the file, before typing: a variable can hold a number or an address.
#[test]
fn expanded_values_are_typed_after_expansion() {
    let text = "listen: ${HOST}:${PORT}\nworkers: ${WORKERS:-4}\nmax_body_size: ${BODY:-1MiB}\n";
    let config = parse(text, "proxy.yaml", &env).expect("valid").config;
    assert_eq!(config.listen, [addr("10.0.0.5:9090")]);
    assert_eq!(config.workers.map(|w| w.get()), Some(4));
    assert_eq!(config.max_body_size, Some(1 << 20));
    // 0: no bound (nginx's client_max_body_size 0)
    let zero = parse(
        "listen: 0.0.0.0:1\nmax_body_size: 0\n",
        "proxy.yaml",
        &no_env,
    )
    .unwrap();
    assert_eq!(zero.config.max_body_size, None);
}

/// An unset variable without a default is an error at its value, naming the variable, and
/// draws no second complaint about the value it left behind.
#[test]
fn unset_variable_without_default_is_an_error_naming_it() {
    let text = "listen: 0.0.0.0:8080\nstore:\n  backend: redis\n  url: ${REDIS_URL}\n";
    let Err(ConfigError::Invalid(found)) = parse(text, "proxy.yaml", &env) else {
        panic!("expected problems");
    };
    let found: Vec<String> = found.iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        ["proxy.yaml:4:8: store.url: environment variable REDIS_URL is not set (write ${REDIS_URL:-default} to give a default)"]
    );
}
