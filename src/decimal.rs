//! Unsigned integers as decimal text without the formatting machinery: the hot path writes
//! them into every rate-limit header and every Redis command.

/// `n` in decimal, written at the end of `buf` (20 bytes hold every `u64`): ASCII digits, as
/// bytes (a `&str` would cost a UTF-8 check per number; every caller appends to bytes).
pub(crate) fn digits(n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    let mut n = n;
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[at..]
}

#[cfg(test)]
mod tests {
    /// Every magnitude, the edges included, reads as `Display` writes it.
    #[test]
    fn digits_match_display() {
        let mut buf = [0; 20];
        for n in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(super::digits(n, &mut buf), n.to_string().as_bytes());
        }
    }
}
