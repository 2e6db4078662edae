//! Leases: tokens of a busy token bucket taken ahead by a joined call, and handed to the next
//! checks of that bucket without a script run.
//!
//! Joining ([`super::coalesce`]) turns the checks of one bucket that wait together into one
//! script run. Under steady load that is still one run per round trip to Redis, and those runs
//! cost Redis CPU and wake-ups. So when a bucket is far from empty, its joined call takes more
//! tokens than its checks need ([`Leases::ahead`] says how many). The checks of that bucket
//! that reach the lane during the lease's [`LIFE`] are answered from those tokens, in order.
//! Each gets the remaining count and the reset that the script would have answered had the
//! lease's tokens been taken after it ([`super::coalesce::share`]).
//!
//! Why this stays within the limit:
//!
//! * Redis counted every token a lease hands out: it was taken from the bucket before any
//!   check is answered with it.
//! * It was taken early, though. If the bucket in Redis fills up to its burst meanwhile, a span
//!   of time may admit the lease's tokens on top of the burst. A lease is a small share of the
//!   burst ([`SHARE`]), and a bucket under half its burst gets none, so this happens at most
//!   once per lane and by little.
//! * A lease is taken only when the bucket, as its last joined reply showed it, keeps at least
//!   half its burst afterwards. A small bucket never leases: each of its checks is the
//!   script's, as before.
//! * Tokens a lease has not handed out by the end of its [`LIFE`] are given back
//!   (`lua/give_back.lua` moves the bucket's TAT back by their time). Only a give-back written
//!   as its connection breaks is lost, or, on a Cluster, one that meets its slot moved to
//!   another primary (`MOVED`, `ASK`): either way the bucket keeps fewer tokens, never more.
//! * A reply from a lease counts from the lease's reply. It does not see the refill since, nor
//!   what others took since, as any count is out of date once others take tokens. Tokens given
//!   back raise the count as a refill does, so two checks may be told the same count. Within
//!   one lease, and on one connection's requests in turn, counts still go down one by one.
//!
//! Leases belong to a lane: one Redis connection of one worker. The lane's driver takes and
//! ends them. A caller is answered from them before its call is sent ([`Lane::hand_out`]), so
//! such a check costs neither the channel to the driver nor a wake-up. The lock is the
//! worker's own, and is not taken while the lane holds no lease.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::coalesce::{self, Join, Kind};
use super::resp::{bulk, push_count};
use super::scripts::Check;

/// How long a lease's tokens are handed out; what is left then is given back.
pub(crate) const LIFE: Duration = Duration::from_millis(20);
/// A lease takes this many times the joined checks' tokens.
const AHEAD: u64 = 8;
/// A lease is at most 1/SHARE of the bucket's burst.
const SHARE: u64 = 1000;
/// Buckets a lane keeps leases (or the last reply) of, at most: the buckets checked by more
/// than one request at a time in the last [`LIFE`].
const MAX: usize = 64;

/// `give_back.lua`, sent whole with `EVAL` (Redis keeps it by its hash; a give-back is rare, and
/// needs no `NOSCRIPT` round).
const GIVE_BACK: &str = include_str!("../../lua/give_back.lua");

/// The leases of one lane, as its callers and its driver share them.
pub(crate) struct Lane {
    /// whether any lease holds tokens: callers look no further when not
    holding: AtomicBool,
    leases: Mutex<Leases>,
}

impl Lane {
    pub(crate) fn new() -> Lane {
        Lane {
            holding: AtomicBool::new(false),
            leases: Mutex::new(Leases::new()),
        }
    }

    /// The reply of `check` from its bucket's lease, if the lane holds one with its tokens.
    pub(crate) fn hand_out(&self, check: &Check) -> Option<[i64; 4]> {
        if !self.holding.load(Ordering::Relaxed) {
            return None;
        }
        self.with(|leases| leases.hand_out(check, Instant::now()))
    }

    /// Runs `f` on the leases (for the driver), keeping the callers' shortcut true.
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Leases) -> T) -> T {
        let mut leases: MutexGuard<'_, Leases> =
            self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        let result = f(&mut leases);
        self.holding.store(leases.holding(), Ordering::Relaxed);
        result
    }
}

/// The leases of one lane.
pub(crate) struct Leases {
    /// whether leases are taken at all (`store.leases`): when not, no bucket's reply is kept
    /// ([`Leases::taken`]), so none ever leases, and the lane's alarm never rings for one
    pub(crate) enabled: bool,
    held: Vec<Held>,
    /// the give-back commands to write next, and how many
    returns: Vec<u8>,
    count: usize,
}

/// One bucket's lease.
struct Held {
    /// the first check of the joined call that took it: its bucket ([`Check::same_bucket`])
    check: Check,
    /// tokens taken and not yet handed out
    tokens: u64,
    /// the size of the last lease taken (0: none yet)
    grant: u64,
    /// the reply of the joined call that took them: the bucket after the lease
    reply: [i64; 4],
    /// when that reply came
    at: Instant,
}

impl Leases {
    pub(crate) fn new() -> Leases {
        Leases {
            enabled: true,
            held: Vec::new(),
            returns: Vec::new(),
            count: 0,
        }
    }

    /// Drops every lease, its tokens unused: their buckets were reset, and tokens given back
    /// to a bucket made anew would be tokens it never had.
    pub(crate) fn clear(&mut self) {
        self.held.clear();
    }

    /// Whether any lease holds tokens.
    fn holding(&self) -> bool {
        self.held.iter().any(|h| h.tokens > 0)
    }

    /// Where the lease of `check`'s bucket is kept.
    fn position(&self, check: &Check) -> Option<usize> {
        self.held.iter().position(|h| h.check.same_bucket(check))
    }

    /// The reply of `check` from its bucket's lease, if it holds the tokens.
    pub(crate) fn hand_out(&mut self, check: &Check, now: Instant) -> Option<[i64; 4]> {
        let join = check.join;
        let cost = join.cost();
        let at = self.position(check)?;
        let held = &mut self.held[at];
        if held.tokens < cost || now >= held.at + LIFE {
            return None;
        }
        held.tokens -= cost;
        let [allowed, remaining, retry, reset] = coalesce::share(&held.reply, held.tokens, &join);
        // never sooner than the bucket is full: whole ms of the time since the reply only
        let since = now.duration_since(held.at).as_millis() as i64;
        Some([allowed, remaining, retry, (reset - since).max(1)])
    }

    /// How many tokens a joined call of `joins` (the first `check`) takes ahead for a lease: none unless its bucket's last reply shows it keeps half
    /// its burst after them. The first lease of a bucket is as many tokens as the checks take;
    /// each one after (its checks came back for more within a lease's life: the last one was
    /// handed out) twice the last, up to [`AHEAD`] times the checks' tokens. A burst of
    /// requests that ends leaves little to give back; a steady flow gets the large leases.
    pub(crate) fn ahead(&self, check: &Check, joins: &[Join]) -> u64 {
        let Some(Kind::Tokens { burst, .. }) = joins.first().map(|j| j.kind) else {
            return 0;
        };
        let Some(at) = self.position(check) else {
            return 0;
        };
        let held = &self.held[at];
        let cost: u64 = joins.iter().map(Join::cost).sum();
        let next = if held.grant == 0 {
            cost
        } else {
            2 * held.grant
        };
        let lease = next.min(AHEAD * cost).min(burst / SHARE);
        let left = u64::try_from(held.reply[1]).unwrap_or(0);
        if lease == 0 || left < cost + lease + burst / 2 {
            return 0;
        }
        lease
    }

    /// Keeps what a joined call of `check`'s bucket answered (`reply`, admitted, with `ahead`
    /// tokens taken for the lease) at `now`: the lease, and the bucket's tokens for the next
    /// [`Leases::ahead`]. Returns when the lease ends, for the lane's alarm.
    pub(crate) fn taken(
        &mut self,
        check: &Check,
        reply: &[i64; 4],
        ahead: u64,
        now: Instant,
    ) -> Option<Instant> {
        if !self.enabled {
            return None;
        }
        let at = match self.position(check) {
            Some(at) => at,
            None if self.held.len() < MAX => {
                self.held.push(Held {
                    check: check.clone(),
                    tokens: 0,
                    grant: 0,
                    reply: *reply,
                    at: now,
                });
                self.held.len() - 1
            }
            None => {
                if ahead > 0 {
                    // (no room: nothing may be held that is not kept; `ahead` took room for it)
                    give_back(&mut self.returns, check, ahead);
                    self.count += 1;
                }
                return None;
            }
        };
        let held = &mut self.held[at];
        // tokens left of an earlier lease (fewer than a check's cost) stay taken, after these
        held.tokens += ahead;
        if ahead > 0 {
            held.grant = ahead;
        }
        held.reply = *reply;
        held.at = now;
        Some(now + LIFE)
    }

    /// A joined call of the bucket was refused: no lease until a reply shows it far from empty
    /// again (tokens still held stay so).
    pub(crate) fn refused(&mut self, check: &Check) {
        if let Some(at) = self.position(check) {
            self.held[at].reply[1] = 0;
        }
    }

    /// Ends the leases past their life at `now`: their tokens left are to be given back.
    /// Returns when the next one ends.
    pub(crate) fn expire(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let (returns, count) = (&mut self.returns, &mut self.count);
        self.held.retain(|held| {
            let end = held.at + LIFE;
            if end > now {
                next = Some(next.map_or(end, |n| n.min(end)));
                return true;
            }
            if held.tokens > 0 {
                give_back(returns, &held.check, held.tokens);
                *count += 1;
            }
            false
        });
        next
    }

    /// Give-backs waiting to be written.
    pub(crate) fn returning(&self) -> bool {
        self.count > 0
    }

    /// Appends the give-backs waiting to `out`; returns how many (each gets one reply, which
    /// no one waits for).
    pub(crate) fn write_returns(&mut self, out: &mut Vec<u8>) -> usize {
        out.extend_from_slice(&self.returns);
        self.returns.clear();
        std::mem::take(&mut self.count)
    }
}

/// `EVAL give_back.lua 1 key token_bucket taken_ms`: `tokens` of `check`'s bucket back.
fn give_back(out: &mut Vec<u8>, check: &Check, tokens: u64) {
    out.push(b'*');
    push_count(out, 6);
    bulk(out, b"EVAL");
    bulk(out, GIVE_BACK.as_bytes());
    bulk(out, b"1");
    bulk(out, check.key().as_bytes());
    bulk(out, b"token_bucket");
    let taken = tokens as f64 * check.join.interval_ms;
    bulk(out, taken.to_string().as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(cost: u64, burst: u64) -> Join {
        Join {
            interval_ms: 10.0,
            kind: Kind::Tokens { cost, burst },
        }
    }

    /// A check of `key` at 100 tokens a second (10 ms each).
    fn check(key: &str, cost: u32, burst: u32) -> Check {
        let bucket = crate::limit::Bucket::new(
            crate::limit::Rate::per_second(100.0).unwrap(),
            std::num::NonZeroU32::new(burst).unwrap(),
            std::num::NonZeroU32::new(cost).unwrap(),
        );
        let alg = crate::limit::Algorithm::TokenBucket(bucket.unwrap());
        let scripts = super::super::scripts::Scripts::new();
        let check = scripts.check(key, &alg, None).check().unwrap();
        assert_eq!(check.join, join(cost.into(), burst.into()));
        check
    }

    /// A bucket under 1 000 tokens never leases; a larger one leases only while its last reply
    /// shows half its burst kept after the lease, growing from the checks' own tokens to eight
    /// times them, and never over a thousandth of the burst.
    #[test]
    fn leases_only_from_buckets_far_from_empty() {
        let now = Instant::now();
        let mut leases = Leases::new();
        // no reply seen yet: no lease
        assert_eq!(
            leases.ahead(&check("k", 1, 100_000), &[join(1, 100_000); 3]),
            0
        );
        leases.taken(&check("k", 1, 100_000), &[1, 90_000, 0, 5], 0, now);
        // the first lease as many tokens as the checks', then twice the last, up to 8 times
        let mut grants = Vec::new();
        for _ in 0..5 {
            let ahead = leases.ahead(&check("k", 1, 100_000), &[join(1, 100_000); 3]);
            leases.taken(&check("k", 1, 100_000), &[1, 90_000, 0, 5], ahead, now);
            grants.push(ahead);
        }
        assert_eq!(grants, [3, 6, 12, 24, 24]);
        // and never over a thousandth of the burst
        for want in [48, 96, 100, 100] {
            let ahead = leases.ahead(&check("k", 1, 100_000), &[join(1, 100_000); 80]);
            assert_eq!(ahead, want);
            leases.taken(&check("k", 1, 100_000), &[1, 90_000, 0, 5], ahead, now);
        }
        // under half the burst kept after it: none
        leases.taken(&check("k", 1, 100_000), &[1, 50_005, 0, 5], 0, now);
        assert_eq!(
            leases.ahead(&check("k", 1, 100_000), &[join(1, 100_000); 3]),
            0
        );
        // a small bucket, full: none
        let small = check("s", 1, 999);
        leases.taken(&small, &[1, 990, 0, 5], 0, now);
        assert_eq!(leases.ahead(&small, &[join(1, 999); 3]), 0);
    }

    /// With leases off (`store.leases: false`) no bucket's reply is kept: none leases, and no
    /// lease's end is set for the lane's alarm.
    #[test]
    fn leases_off_keep_nothing() {
        let now = Instant::now();
        let mut leases = Leases::new();
        leases.enabled = false;
        for _ in 0..3 {
            let end = leases.taken(&check("k", 1, 100_000), &[1, 90_000, 0, 5], 0, now);
            assert_eq!(end, None);
            assert_eq!(
                leases.ahead(&check("k", 1, 100_000), &[join(1, 100_000); 3]),
                0
            );
        }
        assert_eq!(leases.expire(now + LIFE), None);
    }

    /// A lease hands its tokens out in order, each check told what the script would have told
    /// it in its turn; then the next check is not served from it; past its life its tokens go
    /// back, in one give-back naming the key and their time.
    #[test]
    fn a_lease_answers_in_order_then_gives_back_what_is_left() {
        let now = Instant::now();
        let mut leases = Leases::new();
        // a joined call took 3 checks' tokens and 4 ahead: 1000 left after all of it
        let end = leases.taken(&check("k", 1, 100_000), &[1, 1000, 0, 990_000], 4, now);
        assert_eq!(end, Some(now + LIFE));
        let got: Vec<_> = (0..3)
            .map(|_| leases.hand_out(&check("k", 1, 100_000), now))
            .collect();
        assert_eq!(
            got,
            vec![
                Some([1, 1003, 0, 989_970]),
                Some([1, 1002, 0, 989_980]),
                Some([1, 1001, 0, 989_990]),
            ]
        );
        // a check of cost 2 does not fit the one token left; one of cost 1 does, 5 ms later
        assert_eq!(leases.hand_out(&check("k", 2, 100_000), now), None);
        let later = now + Duration::from_millis(5);
        assert_eq!(
            leases.hand_out(&check("k", 1, 100_000), later),
            Some([1, 1000, 0, 989_995])
        );
        assert_eq!(leases.hand_out(&check("k", 1, 100_000), later), None);
        assert!(!leases.returning());
        assert_eq!(leases.expire(later), Some(now + LIFE));

        // another lease, not used: given back at its end
        leases.taken(&check("k", 1, 100_000), &[1, 990, 0, 5], 7, now);
        assert_eq!(leases.expire(now + LIFE), None);
        assert!(leases.returning());
        let mut out = Vec::new();
        assert_eq!(leases.write_returns(&mut out), 1);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("*6\r\n$4\r\nEVAL\r\n"), "{text}");
        assert!(text.ends_with("\r\n$1\r\n1\r\n$1\r\nk\r\n$12\r\ntoken_bucket\r\n$2\r\n70\r\n"));
        assert!(!leases.returning());
        // and past its life, a lease answers nothing
        assert_eq!(leases.hand_out(&check("k", 1, 100_000), now + LIFE), None);
    }
}
