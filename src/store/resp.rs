//! RESP2, the protocol Redis speaks: commands encoded as arrays of bulk strings, and replies
//! parsed straight from the read buffer, with no intermediate frames. The store's own
//! connection ([`super::pipe`]) and the scripts' calls ([`super::scripts`]) write with it.

use ::redis::{ErrorKind, RedisError, Value};

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
/// bytes are needed. Error replies become `Value::ServerError` (see `Value::extract_error`).
/// Public for the fuzz targets and property tests only.
pub fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, RedisError> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Value, usize)>, RedisError> {
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    let Some(end) = buf[at..].iter().position(|&b| b == b'\n').map(|i| at + i) else {
        if buf.len() - at > MAX_REPLY_BYTES {
            return Err(protocol("a line too long"));
        }
        return Ok(None);
    };
    if end < at + 2 || buf[end - 1] != b'\r' {
        return Err(protocol("a line not ended by CRLF"));
    }
    let line = &buf[at + 1..end - 1];
    let next = end + 1;
    let value = match kind {
        b':' => Value::Int(number(line)?),
        b'+' if line == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(text(line)?),
        b'-' => ::redis::parse_redis_value(&buf[at..next])?,
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
                return Err(protocol("a bulk string not ended by CRLF"));
            }
            return Ok(Some((
                Value::BulkString(buf[next..stop].to_vec()),
                stop + 2 - at,
            )));
        }
        b'*' => {
            let Some(count) = length(line)? else {
                return Ok(Some((Value::Nil, next - at)));
            };
            if depth >= MAX_DEPTH {
                return Err(protocol("arrays nested too deep"));
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
        _ => return Err(protocol("an unknown reply type")),
    };
    Ok(Some((value, next - at)))
}

/// The length of a bulk string or array: `None` for `-1` (nil), an error past
/// [`MAX_REPLY_BYTES`] or for another negative number.
fn length(line: &[u8]) -> Result<Option<usize>, RedisError> {
    match number(line)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_REPLY_BYTES)
            .map(Some)
            .ok_or_else(|| protocol("a length out of range")),
    }
}

/// A RESP integer: an optional `-`, then decimal digits that fit an `i64`.
fn number(line: &[u8]) -> Result<i64, RedisError> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    let not_one = || protocol("a number that is not one");
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

fn text(line: &[u8]) -> Result<String, RedisError> {
    String::from_utf8(line.to_vec()).map_err(|_| protocol("a status line that is not UTF-8"))
}

pub(crate) fn protocol(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "invalid reply from Redis",
        what.to_owned(),
    ))
}
