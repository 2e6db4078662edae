//! `${VAR}` and `${VAR:-default}` in string values, expanded from an injected environment.
//!
//! The rules follow the shell's, minus everything that needs a shell: `${VAR}` is the
//! variable's value and an error when it is unset; `${VAR:-default}` is the default when the
//! variable is unset or empty; `$$` is one literal `$`; a `$` followed by anything else stays
//! as it is (Redis passwords may hold one). Defaults are literal text: no nesting.

/// Expands every `${...}` in `text`. The error names the variable or the malformed reference.
pub(crate) fn expand(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    if !text.contains('$') {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| format!("unterminated ${{ in {text:?}: add the closing }}"))?;
            out.push_str(&substitute(&body[..end], env)?);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of one reference, `VAR` or `VAR:-default`.
fn substitute(reference: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let (name, default) = match reference.split_once(":-") {
        Some((name, default)) => (name, Some(default)),
        None => (reference, None),
    };
    if !is_name(name) {
        return Err(format!(
            "${{{reference}}} is not a valid reference: write ${{NAME}} or ${{NAME:-default}}, \
             where NAME is letters, digits and _"
        ));
    }
    match (env(name), default) {
        (Some(value), Some(default)) if value.is_empty() => Ok(default.to_owned()),
        (Some(value), _) => Ok(value),
        (None, Some(default)) => Ok(default.to_owned()),
        (None, None) => Err(format!(
            "environment variable {name} is not set (write ${{{name}:-default}} to give a default)"
        )),
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
