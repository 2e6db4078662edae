//! How log lines look with `--log-format text`: tracing's usual format, except for the access
//! log, whose lines read like nginx's combined format followed by `key=value` fields:
//!
//! ```text
//! 2026-12-07T05:03:21.285515Z  INFO tollgate::access: 127.0.0.1 "GET /v1/items HTTP/1.1" 200 2 "curl/8.5.0" host=localhost:8080 route=api ...
//! ```
//!
//! The access events themselves carry plain fields (see `proxy::access`), so JSON lines and any
//! other subscriber get them as fields; only their text form is made here.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::proxy::access::TARGET;

/// The fields of the access line's head, in order: `client "method path protocol" status
/// bytes_out "user_agent"`. The others follow as `key=value`, in the order they were recorded.
const HEAD: [&str; 7] = [
    "client",
    "method",
    "path",
    "protocol",
    "status",
    "bytes_out",
    "user_agent",
];

/// The text format: tracing's default for every line, the access log's own for access lines.
#[derive(Debug, Default)]
pub struct TextLines {
    usual: Format,
}

impl<S, N> FormatEvent<S, N> for TextLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        if meta.target() != TARGET {
            return self.usual.format_event(ctx, writer, event);
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        SystemTime.format_time(&mut writer)?;
        write!(writer, " {:>5} {}: ", meta.level(), meta.target())?;
        writer.write_str(&fields.access_line())?;
        writeln!(writer)
    }
}

/// An event's fields as text, in the order recorded.
#[derive(Default)]
struct Fields(Vec<(&'static str, String)>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push((field.name(), format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name(), value.to_owned()));
    }
}

impl Fields {
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("-", |(_, v)| v.as_str())
    }

    /// `client "method path protocol" status bytes_out "user_agent" key=value...`
    fn access_line(&self) -> String {
        let mut line = String::with_capacity(256);
        let _ = write!(
            line,
            "{} \"{} {} {}\" {} {} ",
            self.get("client"),
            self.get("method"),
            self.get("path"),
            self.get("protocol"),
            self.get("status"),
            self.get("bytes_out"),
        );
        push_quoted(&mut line, self.get("user_agent"));
        for (name, value) in self.0.iter().filter(|(n, _)| !HEAD.contains(n)) {
            line.push(' ');
            line.push_str(name);
            line.push('=');
            if value.is_empty() || value.contains([' ', '"', '=']) {
                push_quoted(&mut line, value);
            } else {
                line.push_str(value);
            }
        }
        line
    }
}

/// `"value"`, with `"` and `\` escaped.
fn push_quoted(line: &mut String, value: &str) {
    line.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\') {
            line.push('\\');
        }
        line.push(c);
    }
    line.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// An access event reads as the combined-like head then `key=value` fields, values with a
    /// space or a quote quoted; any other event keeps tracing's usual form.
    #[test]
    fn access_lines_read_like_combined_then_key_values() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .event_format(TextLines::default())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                target: TARGET,
                client = "192.0.2.7",
                method = "GET",
                path = "/v1/items",
                protocol = "HTTP/1.1",
                status = 200u64,
                bytes_out = 2u64,
                user_agent = "curl/8 \"x\"",
                route = "api",
                limit = "-",
                duration_ms = 1.5,
                note = "two words",
                complete = true,
            );
            tracing::info!(target: "tollgate::app", addr = "x", "listening");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let (_, access) = lines[0].split_once("Z  INFO tollgate::access: ").unwrap();
        assert_eq!(
            access,
            r#"192.0.2.7 "GET /v1/items HTTP/1.1" 200 2 "curl/8 \"x\"" route=api limit=- duration_ms=1.5 note="two words" complete=true"#
        );
        assert!(
            lines[1].ends_with("INFO tollgate::app: listening addr=\"x\""),
            "{}",
            lines[1]
        );
    }
}
