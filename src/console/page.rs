//! The dashboard: one HTML page, compiled in, that the admin listener serves at `GET /`.
//!
//! The page holds no data. Its script asks `/api/stats` once a second, with the admin token
//! when the listener wants one, and draws the answer. Its script and style are inline, so the
//! page is one file with no build step; the Content-Security-Policy allows exactly those two,
//! by their SHA-256 hashes, and calls back to the same listener, and nothing else.

use base64::Engine as _;

/// The page, as served.
pub const HTML: &str = include_str!("page.html");

/// The `Content-Security-Policy` of [`HTML`]: no source but its own inline script and style
/// (named by hash, so an injected one would not run), calls to the listener that served it,
/// and the empty `data:` icon that keeps browsers from asking for `/favicon.ico`.
pub fn content_security_policy() -> String {
    format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
         img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        sha256_source(inline(HTML, "script")),
        sha256_source(inline(HTML, "style")),
    )
}

/// The text between the page's `<tag>` and `</tag>`: what a browser hashes to check it.
fn inline<'a>(html: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let start = html.find(&open).map(|at| at + open.len());
    let end = html.find(&format!("</{tag}>"));
    match (start, end) {
        (Some(start), Some(end)) if start <= end => &html[start..end],
        // the page is compiled in, and a unit test checks it has both
        _ => panic!("page.html has no <{tag}> element"),
    }
}

/// A CSP hash source, `sha256-<base64 of the SHA-256 of text>`.
fn sha256_source(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    let encoded = base64::engine::general_purpose::STANDARD.encode(digest.as_ref());
    format!("sha256-{encoded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash source is written as CSP wants it (the SHA-256 of nothing, a known value).
    #[test]
    fn hash_sources_are_base64_sha256() {
        assert_eq!(
            sha256_source(""),
            "sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
        );
    }

    /// The policy names the page's one script and one style, and the page needs nothing the
    /// policy forbids: no other element with inline code, no `style` attribute, no handler
    /// attribute, no address elsewhere. Line ends are `\n`, as the browser hashes them.
    #[test]
    fn the_policy_allows_exactly_what_the_page_holds() {
        let csp = content_security_policy();
        assert!(
            csp.contains(&sha256_source(inline(HTML, "script"))),
            "{csp}"
        );
        assert!(csp.contains(&sha256_source(inline(HTML, "style"))), "{csp}");
        assert!(csp.starts_with("default-src 'none';"), "{csp}");
        for once in ["<script", "</script>", "<style", "</style>"] {
            assert_eq!(HTML.matches(once).count(), 1, "{once}");
        }
        assert!(!HTML.contains('\r'));
        assert!(
            !HTML.contains(" style="),
            "a style attribute needs 'unsafe-inline'"
        );
        assert!(
            !HTML.contains(".innerHTML"),
            "API text must never be read as HTML"
        );
        let markup = HTML.replace(inline(HTML, "script"), "");
        let handler = markup.match_indices(" on").any(|(at, _)| {
            let name: String = markup[at + 3..]
                .chars()
                .take_while(char::is_ascii_lowercase)
                .collect();
            !name.is_empty() && markup[at + 3 + name.len()..].starts_with('=')
        });
        assert!(
            !handler,
            "an inline handler attribute needs 'unsafe-inline'"
        );
        assert!(
            !markup.contains(" src="),
            "nothing is loaded from elsewhere"
        );
        assert_eq!(markup.matches(" href=").count(), 1, "the data: icon only");
        assert_eq!(HTML.matches("://").count(), 1, "the SVG namespace only");
        assert!(HTML.contains("\"http://www.w3.org/2000/svg\""));
    }
}
