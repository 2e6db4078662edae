//! Batches of calls on one lane: how the calls waiting together are written as commands, and
//! how the replies of joined commands are shared out again.
//!
//! Checks of one bucket or pacing schedule become one joined call ([`super::super::coalesce`]).
//! Token-bucket checks of different keys with the same limit become one call with all their
//! keys. Everything else goes as it came.

use super::*;
use crate::store::resp::{bulk, push_count};

/// Writes the calls of `batch` into `out`, the checks of one bucket joined into one command, and
/// queues what each command is answered to. Calls given up, or past their deadline (answered
/// [`Failure::Late`] here), are not sent.
pub(super) fn queue(
    batch: &mut Vec<Call>,
    entries: &mut Vec<(u64, Entry)>,
    joins: &mut Vec<Join>,
    leases: &mut Leases,
    out: &mut Vec<u8>,
    waiting: &mut VecDeque<Waiting>,
) {
    let alone = batch.len() == 1;
    let now = Instant::now();
    leases.expire(now);
    for mut call in batch.drain(..) {
        if call.slot.expire(now).is_none() {
            continue; // late or given up: not sent, so no reply to wait for
        }
        let Some(join) = call.join else {
            entries.push((0, Entry::Alone(call)));
            continue;
        };
        let head = &call.command[..join.same];
        let hash = coalesce::hash(head);
        if let Some(reply) = leases.hand_out(hash, head, join, now) {
            call.slot.reply(Ok(Reply::Leased(reply)));
            continue;
        }
        if alone {
            entries.push((0, Entry::Alone(call)));
            continue;
        }
        let same = entries.iter_mut().find(|(h, entry)| {
            let first = entry.first();
            *h == hash && first.join.is_some_and(|j| first.command[..j.same] == *head)
        });
        match same {
            Some((_, entry)) => entry.push(call),
            None => entries.push((hash, Entry::Alone(call))),
        }
    }
    write(entries, alone, joins, leases, out, waiting);
}

/// Writes the entries of a batch: the checks of one bucket joined; token-bucket checks of
/// different keys with the same script and arguments as one call (a batch of one call has
/// nothing to put with it, and goes as it is); every other call as it came.
fn write(
    entries: &mut Vec<(u64, Entry)>,
    alone: bool,
    joins: &mut Vec<Join>,
    leases: &mut Leases,
    out: &mut Vec<u8>,
    waiting: &mut VecDeque<Waiting>,
) {
    let mut keyed: Vec<Vec<Call>> = Vec::new();
    for (hash, entry) in entries.drain(..) {
        match entry {
            Entry::Alone(call) if !alone && keyable(&call) => {
                match keyed
                    .iter_mut()
                    .find(|calls| same_but_key(&calls[0], &call))
                {
                    Some(calls) => calls.push(call),
                    None => keyed.push(vec![call]),
                }
            }
            Entry::Alone(call) => {
                out.extend_from_slice(&call.command);
                waiting.push_back(Waiting::One(call.slot));
            }
            Entry::Joined(calls) => {
                joins.clear();
                joins.extend(calls.iter().filter_map(|c| c.join));
                let head = &calls[0].command[..joins[0].same];
                let ahead = leases.ahead(hash, head, joins);
                if coalesce::encode(&calls[0].command, joins, ahead, out) {
                    waiting.push_back(Waiting::Joined(calls, ahead));
                } else {
                    for call in calls {
                        out.extend_from_slice(&call.command);
                        waiting.push_back(Waiting::One(call.slot));
                    }
                }
            }
        }
    }
    for mut calls in keyed {
        if calls.len() > 1 {
            encode_keys(&calls, out);
            waiting.push_back(Waiting::Keys(calls));
        } else if let Some(call) = calls.pop() {
            out.extend_from_slice(&call.command);
            waiting.push_back(Waiting::One(call.slot));
        }
    }
}

/// `numkeys` of a call with one key, just before the key
const ONE_KEY: &[u8] = b"$1\r\n1\r\n";

/// A token-bucket check that may go in one call with the checks of other keys.
fn keyable(call: &Call) -> bool {
    call.join.is_some_and(|j| {
        matches!(j.kind, coalesce::Kind::Tokens { .. })
            && call.command[..j.key.0].ends_with(ONE_KEY)
    })
}

/// Two keyable checks whose commands differ in their key only.
fn same_but_key(a: &Call, b: &Call) -> bool {
    let (Some(ja), Some(jb)) = (a.join, b.join) else {
        return false;
    };
    a.command[..ja.key.0] == b.command[..jb.key.0] && a.command[ja.key.1..] == b.command[jb.key.1..]
}

/// Writes the one command of `calls` (keyable, [`same_but_key`] as the first): the script with
/// every call's key and the first call's arguments.
fn encode_keys(calls: &[Call], out: &mut Vec<u8>) {
    let first = &calls[0];
    let Some(join) = first.join else {
        unreachable!("keyable calls are joinable")
    };
    let command = &first.command;
    // the words of one call, one key more for each other call; the first call's `*words` line
    // is skipped by its length, known from the count it says
    let line = 3 + crate::decimal::digits(join.words, &mut [0; 20]).len();
    out.push(b'*');
    push_count(out, join.words + calls.len() as u64 - 1);
    out.extend_from_slice(&command[line..join.key.0 - ONE_KEY.len()]);
    bulk(
        out,
        crate::decimal::digits(calls.len() as u64, &mut [0; 20]),
    );
    for call in calls {
        if let Some(j) = call.join {
            out.extend_from_slice(&call.command[j.key.0..j.key.1]);
        }
    }
    out.extend_from_slice(&command[join.key.1..]);
}

/// Shares the reply of a call for several keys out, one element each (a key's own error is its
/// element). Anything else is an error of the whole call (`NOSCRIPT`, a usage error), which the
/// script answers before it writes anything: each check goes again alone, to get its own.
pub(super) fn answer_keys(reply: Reply, calls: Vec<Call>, again: &mut Vec<Call>) {
    match reply {
        Reply::Value(Value::Array(replies)) if replies.len() == calls.len() => {
            for (mut call, reply) in calls.into_iter().zip(replies) {
                call.slot.reply(checked(Reply::Value(reply)));
            }
        }
        _ => again.extend(calls.into_iter().map(|call| Call { join: None, ..call })),
    }
}

/// Shares the reply of a joined call out among its checks; when it was refused, refuses each
/// check if the reply proves it would be refused alone, or else puts the checks into `again` to
/// be decided one by one (see [`super::coalesce`]). An admitted token-bucket call's reply, and
/// the `ahead` tokens it took, are kept in `leases`; returns when that lease ends.
pub(super) fn answer_joined(
    reply: Reply,
    calls: Vec<Call>,
    ahead: u64,
    joins: &mut Vec<Join>,
    leases: &mut Leases,
    again: &mut Vec<Call>,
) -> Option<Instant> {
    match checked(reply) {
        Ok(reply) => {
            joins.clear();
            joins.extend(calls.iter().filter_map(|c| c.join));
            let replies = coalesce::answer(&reply, joins, ahead);
            let mut end = None;
            if let (Reply::Four(four), Some(&join)) = (&reply, joins.first()) {
                if matches!(join.kind, coalesce::Kind::Tokens { .. }) {
                    let head = &calls[0].command[..join.same];
                    let hash = coalesce::hash(head);
                    if four[0] == 1 {
                        end = leases.taken(hash, head, join, four, ahead, Instant::now());
                    } else {
                        leases.refused(hash, head);
                    }
                }
            }
            match replies {
                Some(replies) => {
                    for (mut call, reply) in calls.into_iter().zip(replies) {
                        call.slot.reply(Ok(reply));
                    }
                }
                None => again.extend(calls.into_iter().map(|call| Call { join: None, ..call })),
            }
            end
        }
        Err(e) => {
            for mut call in calls {
                call.slot.reply(Err(e.clone()));
            }
            None
        }
    }
}
