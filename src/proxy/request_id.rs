//! Request ids: the `X-Request-Id` a request arrived with when it is usable, a new one when it
//! is not. The id goes upstream in the request, back to the client in the response, and into
//! the access log, so one request can be followed through tollgate and its upstream.
//!
//! Does not own where the id is put: [`super::Proxy::handle`] does that.

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};

use bytes::Bytes;
use http::header::{Entry, HeaderMap, HeaderName, HeaderValue};

/// `X-Request-Id`, as Heroku, nginx (`$request_id`) and Envoy name it.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest id kept: long enough for any id scheme in use (a UUID is 36 bytes, a W3C
/// `traceparent` 55), short enough that a client cannot make every log line long.
const MAX_LEN: usize = 200;

/// The request's id: the one in `headers` when there is exactly one and it is usable (see
/// [`usable`]), else a new one, which then replaces whatever `headers` had.
pub fn keep_or_make(headers: &mut HeaderMap) -> HeaderValue {
    // (one lookup of the name serves the reading and the writing)
    match headers.entry(&X_REQUEST_ID) {
        Entry::Occupied(mut sent) => {
            let mut ids = sent.iter();
            if let (Some(id), None) = (ids.next(), ids.next()) {
                if usable(id) {
                    return id.clone();
                }
            }
            let id = make();
            sent.insert(id.clone());
            id
        }
        Entry::Vacant(none) => none.insert(make()).clone(),
    }
}

/// 1 to [`MAX_LEN`] bytes of visible ASCII: no spaces, tabs or control bytes, which could split
/// or forge a line of a text log, and no bytes beyond ASCII, which are no text.
pub fn usable(id: &HeaderValue) -> bool {
    let bytes = id.as_bytes();
    (1..=MAX_LEN).contains(&bytes.len()) && bytes.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// A new id: a random UUID, version 4 (RFC 9562 §5.4), in its 36-character text form.
pub fn make() -> HeaderValue {
    // octets 0 to 7, then 8 to 15; the version, 4, in the high nibble of octet 6, and the
    // variant, binary 10, in the two high bits of octet 8
    let high = (next_random() & !0xf000) | 0x4000;
    let low = (next_random() & !(0b11 << 62)) | (0b10 << 62);
    let mut text = [b'-'; 36];
    hex(high, &mut text[..8], 32);
    hex(high, &mut text[9..13], 16);
    hex(high, &mut text[14..18], 0);
    hex(low, &mut text[19..23], 48);
    hex(low, &mut text[24..36], 0);
    // One allocation, which holds the text: the request, the response and the log line share
    // it by reference count.
    HeaderValue::from_maybe_shared(Bytes::copy_from_slice(&text))
        .expect("hex digits and hyphens are a valid header value")
}

/// Writes the bits of `bits` from bit `from` upwards as lower-case hex digits into `out`, the
/// last digit the lowest.
fn hex(bits: u64, out: &mut [u8], from: u32) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut bits = bits >> from;
    for digit in out.iter_mut().rev() {
        *digit = DIGITS[(bits & 0xf) as usize];
        bits >>= 4;
    }
}

thread_local! {
    /// The state of this thread's generator, seeded from the randomness std's hash maps use.
    static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(0x5eed_u64));
}

/// 64 random bits from this thread's SplitMix64 generator: fast, with every output of a seed
/// distinct over 2^64 draws. Not for secrets: an id names a request, it guards nothing.
fn next_random() -> u64 {
    STATE.with(|state| {
        // the constants are SplitMix64's: the golden-ratio increment and the two multipliers
        // of its finaliser
        let s = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made id is a version 4 UUID in text (8-4-4-4-12 lower-case hex digits, `4` as the
    /// version, `8`–`b` as the variant), and ids do not repeat.
    #[test]
    fn made_ids_are_uuid_v4() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = make();
            let text = id.to_str().expect("ASCII");
            let groups: Vec<&str> = text.split('-').collect();
            let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{text}");
            assert!(text
                .bytes()
                .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(groups[2].starts_with('4'), "{text}");
            assert!(groups[3].starts_with(['8', '9', 'a', 'b']), "{text}");
            assert!(usable(&id));
            assert!(seen.insert(text.to_owned()), "{text} twice");
        }
    }

    /// An id is kept when it is one field of 1 to 200 visible ASCII bytes; otherwise a new one
    /// replaces it, and every field it had.
    #[test]
    fn keeps_usable_ids_and_replaces_the_rest() {
        let with = |values: &[&[u8]]| {
            let mut headers = HeaderMap::new();
            for v in values {
                let v = HeaderValue::from_bytes(v).expect("a test value");
                headers.append(X_REQUEST_ID.clone(), v);
            }
            headers
        };
        let long = vec![b'x'; MAX_LEN];
        for kept in [&b"abc-123"[..], b"{\"quoted\"}", &long] {
            let mut headers = with(&[kept]);
            assert_eq!(keep_or_make(&mut headers).as_bytes(), kept);
            assert_eq!(headers.get_all(&X_REQUEST_ID).iter().count(), 1);
        }
        let longer = vec![b'x'; MAX_LEN + 1];
        let replaced: [&[&[u8]]; 7] = [
            &[],
            &[b""],
            &[b"a b"],
            &[b"a\tb"],
            &[b"caf\xc3\xa9"],
            &[&longer],
            &[b"one", b"two"],
        ];
        for values in replaced {
            let mut headers = with(values);
            let id = keep_or_make(&mut headers);
            assert_eq!(id.len(), 36, "{values:?}");
            let sent: Vec<&HeaderValue> = headers.get_all(&X_REQUEST_ID).iter().collect();
            assert_eq!(sent, [&id], "{values:?}");
        }
    }
}
