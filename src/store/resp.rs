//! RESP2, the protocol Redis speaks, for the store's own connection: commands encoded as
//! arrays of bulk strings, and replies parsed straight from the read buffer into this module's
//! [`Value`], with no intermediate frames. Failures are this module's [`Error`]. The scripts'
//! calls ([`super::scripts`]) are written with it too. redis-rs keeps its own types for the
//! connections it serves (the library path).
//!
//! The parser takes any bytes: it never panics, never reads past the buffer, and refuses
//! replies nested or sized beyond what our commands get.

use std::fmt;
use std::io;
use std::sync::Arc;

/// Nested arrays deeper than this are not a reply of ours.
const MAX_DEPTH: usize = 4;
/// Replies to our commands are a few dozen bytes: a longer line or bulk string (or a length
/// claiming one) is a broken connection, not a reason to buffer without end.
pub(crate) const MAX_REPLY_BYTES: usize = 1 << 20;

/// A command of plain words: `*n`, then each word as a bulk string.
pub(crate) fn encode_command(out: &mut Vec<u8>, words: &[&[u8]]) {
    out.push(b'*');
    push_count(out, words.len() as u64);
    for word in words {
        bulk(out, word);
    }
}

/// One bulk string: `$len\r\nbytes\r\n`.
pub(crate) fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'$');
    push_count(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// A count in decimal followed by `\r\n`, for the RESP headers.
pub(crate) fn push_count(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(crate::decimal::digits(n, &mut [0; 20]));
    out.extend_from_slice(b"\r\n");
}

/// The counting scripts' reply, an array of four integers (`*4` then four `:` lines), read
/// without building a [`Value`]: the four and the bytes they took. `None` for anything else,
/// and for an incomplete reply ([`parse`] then says which it is).
pub fn parse_four(buf: &[u8]) -> Option<([i64; 4], usize)> {
    if !buf.starts_with(b"*4\r\n") {
        return None;
    }
    let mut at = 4;
    let mut four = [0; 4];
    for n in &mut four {
        let rest = buf.get(at..)?.strip_prefix(b":")?;
        let end = rest.iter().position(|&b| b == b'\r')?;
        if rest.get(end + 1) != Some(&b'\n') {
            return None;
        }
        *n = number(&rest[..end]).ok()?;
        at += 1 + end + 2;
    }
    Some((four, at))
}

/// One complete RESP2 reply at the start of `buf`, and its length in bytes; `None` when more
/// bytes are needed. Error replies become [`Value::Error`] (see [`Value::checked`]).
/// Public for the fuzz targets and property tests only.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, Error> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, Error> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = buf[at..].iter().position(|&b| b == b'\n').map(|i| at + i) else {
        if buf.len() - at > MAX_REPLY_BYTES {
            return Err(Error::Protocol("a line too long"));
        }
        return Ok(None);
    };
    if end < at + 2 || buf[end - 1] != b'\r' {
        return Err(Error::Protocol("a line not ended by CRLF"));
    }
    let line = &buf[at + 1..end - 1];
    let next = end + 1;
    let value = match kind {
        b':' => Value::Int(number(line)?),
        b'+' => Value::Status(text(line)?),
        b'-' => Value::Error(ServerError::new(&text(line)?)),
        b'$' => {
            let len = length(line)?;
            let Some(len) = len else {
                return Ok(Some((Value::Nil, next - at)));
            };
            let stop = next + len;
            let Some(tail) = buf.get(stop..stop + 2) else {
                return Ok(None);
            };
            if tail != b"\r\n" {
                return Err(Error::Protocol("a bulk string not ended by CRLF"));
            }
            return Ok(Some((Value::Bulk(buf[next..stop].to_vec()), stop + 2 - at)));
        }
        b'*' => {
            let Some(count) = length(line)? else {
                return Ok(Some((Value::Nil, next - at)));
            };
            if depth >= MAX_DEPTH {
                return Err(Error::Protocol("arrays nested too deep"));
            }
            let mut items = Vec::with_capacity(count.min(64));
            let mut pos = next;
            for _ in 0..count {
                let Some((item, used)) = parse_at(buf, pos, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                pos += used;
            }
            return Ok(Some((Value::Array(items), pos - at)));
        }
        _ => return Err(Error::Protocol("an unknown reply type")),
    };
    Ok(Some((value, next - at)))
}

/// The length of a bulk string or array: `None` for `-1` (nil), an error past
/// [`MAX_REPLY_BYTES`] or for another negative number.
fn length(line: &[u8]) -> Result<Option<usize>, Error> {
    match number(line)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_REPLY_BYTES)
            .map(Some)
            .ok_or(Error::Protocol("a length out of range")),
    }
}

/// A RESP integer: an optional `-`, then decimal digits that fit an `i64`.
fn number(line: &[u8]) -> Result<i64, Error> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    let not_one = || Error::Protocol("a number that is not one");
    if digits.is_empty() {
        return Err(not_one());
    }
    // accumulated as a negative number, so that i64::MIN reads too
    let mut n: i64 = 0;
    for &b in digits {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return Err(not_one());
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_sub(i64::from(digit)))
            .ok_or_else(not_one)?;
    }
    if negative {
        Ok(n)
    } else {
        n.checked_neg().ok_or_else(not_one)
    }
}

fn text(line: &[u8]) -> Result<String, Error> {
    String::from_utf8(line.to_vec()).map_err(|_| Error::Protocol("a status line that is not UTF-8"))
}

/// One RESP2 reply.
#[derive(Clone, PartialEq)]
pub enum Value {
    /// `$-1` or `*-1`
    Nil,
    /// `:n`
    Int(i64),
    /// `$len` and its bytes
    Bulk(Vec<u8>),
    /// `+text`, `OK` among them
    Status(String),
    /// `*n` and its items
    Array(Vec<Value>),
    /// `-CODE detail`: an error in the reply, made an [`Error`] by [`Value::checked`]
    Error(ServerError),
}

impl Value {
    /// The reply, or the first error reply in it (an error inside an array fails it whole,
    /// as when it stands alone).
    pub fn checked(self) -> Result<Value, Error> {
        match self {
            Value::Error(e) => Err(Error::Server(e)),
            Value::Array(items) => Ok(Value::Array(
                items
                    .into_iter()
                    .map(Value::checked)
                    .collect::<Result<_, _>>()?,
            )),
            value => Ok(value),
        }
    }

    /// The text of a bulk or status reply.
    pub(crate) fn text(&self) -> Option<&str> {
        match self {
            Value::Bulk(bytes) => std::str::from_utf8(bytes).ok(),
            Value::Status(text) => Some(text),
            _ => None,
        }
    }
}

/// Written as redis-rs writes its own replies, since these texts reach the logs in the
/// `unexpected reply` errors.
impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("nil"),
            Value::Int(n) => write!(f, "int({n:?})"),
            Value::Bulk(bytes) => match std::str::from_utf8(bytes) {
                Ok(text) => write!(f, "bulk-string('{text:?}')"),
                Err(_) => write!(f, "binary-data({bytes:?})"),
            },
            Value::Status(text) if text == "OK" => f.write_str("ok"),
            Value::Status(text) => write!(f, "simple-string({text:?})"),
            Value::Array(items) => write!(f, "array({items:?})"),
            Value::Error(e) => match &e.detail {
                Some(detail) => write!(f, "Server error: `{}: {detail}`", e.code),
                None => write!(f, "Server error: `{}`", e.code),
            },
        }
    }
}

/// An error reply: its code (the first word) and the rest of its line.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerError {
    code: Box<str>,
    detail: Option<Box<str>>,
}

impl ServerError {
    /// The error of the line `CODE detail` (after the `-`).
    pub fn new(line: &str) -> ServerError {
        let (code, detail) = match line.split_once(' ') {
            Some((code, detail)) => (code, Some(detail.into())),
            None => (line, None),
        };
        ServerError {
            code: code.into(),
            detail,
        }
    }

    /// The first word: `ERR`, `NOSCRIPT`, `WRONGTYPE`…
    pub fn code(&self) -> &str {
        &self.code
    }

    /// The rest of the line, if there is one.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }
}

/// The codes that earlier releases, through redis-rs, wrote by a name of their own: the logs
/// keep those names.
const NAMED: [(&str, &str); 14] = [
    ("ERR", "ResponseError"),
    ("EXECABORT", "ExecAbort"),
    ("LOADING", "BusyLoading"),
    ("NOSCRIPT", "NoScript"),
    ("MOVED", "Moved"),
    ("ASK", "Ask"),
    ("TRYAGAIN", "TryAgain"),
    ("CLUSTERDOWN", "ClusterDown"),
    ("CROSSSLOT", "CrossSlot"),
    ("MASTERDOWN", "MasterDown"),
    ("READONLY", "ReadOnly"),
    ("NOTBUSY", "NotBusy"),
    ("NOSUB", "NoSub"),
    ("NOPERM", "NoPerm"),
];

impl fmt::Display for ServerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match NAMED.iter().find(|(code, _)| **code == *self.code) {
            Some((_, name)) => f.write_str(name)?,
            None => write!(f, "{:?}", self.code)?,
        }
        match &self.detail {
            Some(detail) => write!(f, ": {detail}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for ServerError {}

/// Why the store's own connection got no reply: cheap to clone, since one broken connection
/// fails every call waiting on it with the same error.
#[derive(Clone)]
pub enum Error {
    /// the socket failed, or the connection was dropped on purpose (see the message)
    Io(Arc<io::Error>),
    /// Redis answered with an error
    Server(ServerError),
    /// Redis sent bytes that are not a reply to our commands
    Protocol(&'static str),
    /// `READONLY`: the server is a replica now, and the connection is dropped
    ReadOnly(ServerError),
    /// the name to verify a TLS certificate against is not one
    TlsName(String),
    /// not sent: a Cluster's primary that failed its last calls is skipped for a while (the
    /// message says which and for how long)
    Skipped(String),
}

impl Error {
    /// An I/O error of `kind` saying `what`.
    pub(crate) fn io(kind: io::ErrorKind, what: impl Into<String>) -> Error {
        Error::Io(Arc::new(io::Error::new(kind, what.into())))
    }

    /// The error code of an error reply (`READONLY` included).
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Server(e) | Error::ReadOnly(e) => Some(e.code()),
            _ => None,
        }
    }

    /// The I/O error, when the socket failed.
    pub fn as_io(&self) -> Option<&io::Error> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }

    /// Whether Redis answered that it does not have the script.
    pub fn is_noscript(&self) -> bool {
        matches!(self, Error::Server(e) if e.code() == "NOSCRIPT")
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::Io(Arc::new(e))
    }
}

/// The texts of earlier releases, where redis-rs's errors carried these failures.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => e.fmt(f),
            Error::Server(e) => e.fmt(f),
            Error::Protocol(what) => write!(f, "invalid reply from Redis - Parse: {what}"),
            Error::ReadOnly(e) => write!(
                f,
                "Redis is a read-only replica now - Server(ReadOnly): {}",
                e.detail().unwrap_or_default()
            ),
            Error::TlsName(e) => write!(f, "not a TLS server name - InvalidClientConfig: {e}"),
            Error::Skipped(why) => write!(f, "not sent - {why}"),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(&**e),
            Error::Server(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every reply type our scripts and commands get is parsed whole, with its length; a cut
    /// anywhere asks for more bytes; garbage is an error, not a panic.
    #[test]
    fn replies_parse_whole_or_wait_for_more() {
        let cases: &[(&[u8], Value)] = &[
            (b":42\r\n", Value::Int(42)),
            (b":-1\r\n", Value::Int(-1)),
            (b":9223372036854775807\r\n", Value::Int(i64::MAX)),
            (b":-9223372036854775808\r\n", Value::Int(i64::MIN)),
            (b"+OK\r\n", Value::Status("OK".into())),
            (b"+PONG\r\n", Value::Status("PONG".into())),
            (b"$5\r\n12.50\r\n", Value::Bulk(b"12.50".to_vec())),
            (b"$0\r\n\r\n", Value::Bulk(Vec::new())),
            (b"$-1\r\n", Value::Nil),
            (
                b"*4\r\n:1\r\n:9\r\n:0\r\n:1000\r\n",
                Value::Array(vec![
                    Value::Int(1),
                    Value::Int(9),
                    Value::Int(0),
                    Value::Int(1000),
                ]),
            ),
            (
                b"*2\r\n:0\r\n$5\r\n0.000\r\n",
                Value::Array(vec![Value::Int(0), Value::Bulk(b"0.000".to_vec())]),
            ),
        ];
        for (wire, want) in cases {
            let mut buf = wire.to_vec();
            buf.extend_from_slice(b":7\r\n"); // the next reply is not consumed
            assert_eq!(
                parse(&buf).unwrap(),
                Some((want.clone(), wire.len())),
                "{}",
                String::from_utf8_lossy(wire)
            );
            for cut in 0..wire.len() {
                assert_eq!(parse(&wire[..cut]).unwrap(), None, "cut at {cut}");
            }
        }
        // a line that never ends is not buffered without bound
        let endless = vec![b'+'; MAX_REPLY_BYTES + 2];
        assert!(parse(&endless).is_err());
        assert_eq!(parse(&endless[..1000]).unwrap(), None);
        let (err, used) = parse(b"-NOSCRIPT No matching script.\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(used, 31);
        assert!(err.checked().unwrap_err().is_noscript());
        for bad in [
            &b"?x\r\n"[..],
            b":x\r\n",
            b":\r\n",
            b":-\r\n",
            b":1-\r\n",
            b":9223372036854775808\r\n",
            b":1\n",
            b"$2\r\nabcd\r\n",
            b"$-2\r\n",
            b"*-5\r\n",
            b"$9223372036854775807\r\n",
            b"*1\r\n!\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Error replies, the values in the store's `unexpected reply` errors, and redis-rs's
    /// replies made ours read as the same text as redis-rs gives them: the logs do not change
    /// with the connection.
    #[test]
    fn texts_are_those_redis_rs_gives() {
        for wire in [
            &b"-NOSCRIPT No matching script. Please use EVAL.\r\n"[..],
            b"-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
            b"-ERR\r\n",
            b"-ERR \r\n",
            b"-\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
        ] {
            let theirs = ::redis::parse_redis_value(wire).expect("an error reply");
            let (ours, _) = parse(wire).expect("parses").expect("whole");
            assert_eq!(ours, Value::from(theirs.clone()));
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
            let (ours, theirs) = (ours.checked(), theirs.extract_error());
            assert_eq!(
                ours.expect_err("an error").to_string(),
                theirs.expect_err("an error").to_string()
            );
        }
        for wire in [
            &b"*2\r\n:1\r\n$5\r\n0.000\r\n"[..],
            b"+OK\r\n",
            b"+PONG\r\n",
            b"$-1\r\n",
            b"$2\r\n\xff\xfe\r\n",
        ] {
            let theirs = ::redis::parse_redis_value(wire).expect("a reply");
            let (ours, _) = parse(wire).expect("parses").expect("whole");
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"));
        }
        let bad = parse(b"?\r\n").expect_err("no such type");
        assert_eq!(
            bad.to_string(),
            "invalid reply from Redis - Parse: an unknown reply type"
        );
    }
}
