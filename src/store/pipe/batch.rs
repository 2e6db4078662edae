//! Batches of calls on one lane: how the calls waiting together are written as commands, and
//! how the replies of joined commands are shared out again.
//!
//! Checks of one bucket or pacing schedule become one joined call ([`super::super::coalesce`]).
//! Token-bucket checks of different keys with the same limit become one call with all their
//! keys. Everything else goes as it came.

use super::*;
use crate::store::cluster::slot;

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
    cluster: bool,
) {
    let alone = batch.len() == 1;
    let now = Instant::now();
    leases.expire(now);
    for mut call in batch.drain(..) {
        if call.slot.expire(now).is_none() {
            continue; // late or given up: not sent, so no reply to wait for
        }
        let Some(check) = call.check() else {
            entries.push((0, Entry::Alone(call)));
            continue;
        };
        if let Some(reply) = leases.hand_out(check, now) {
            call.slot.reply(Ok(Reply::Leased(reply)));
            continue;
        }
        if alone {
            entries.push((0, Entry::Alone(call)));
            continue;
        }
        let hash = check.hash;
        let same = entries.iter_mut().find(|(h, entry)| {
            *h == hash && entry.first().check().is_some_and(|c| c.same_bucket(check))
        });
        match same {
            Some((_, entry)) => entry.push(call),
            None => entries.push((hash, Entry::Alone(call))),
        }
    }
    write(entries, alone, cluster, joins, leases, out, waiting);
}

/// Writes the entries of a batch: the checks of one bucket joined; token-bucket checks of
/// different keys with the same script and arguments as one call (a batch of one call has
/// nothing to put with it, and goes as it is); every other call as it came. On a `cluster`'s
/// primary, only keys of one slot go together: Redis refuses a script whose keys do not.
fn write(
    entries: &mut Vec<(u64, Entry)>,
    alone: bool,
    cluster: bool,
    joins: &mut Vec<Join>,
    leases: &mut Leases,
    out: &mut Vec<u8>,
    waiting: &mut VecDeque<Waiting>,
) {
    let mut keyed: Vec<(u16, Vec<Call>)> = Vec::new();
    for (_, entry) in entries.drain(..) {
        match entry {
            Entry::Alone(call) if !alone && keyable(&call) => {
                let slot = match call.check() {
                    Some(check) if cluster => slot(check.key().as_bytes()),
                    _ => 0,
                };
                match keyed
                    .iter_mut()
                    .find(|(s, calls)| *s == slot && same_but_key(&calls[0], &call))
                {
                    Some((_, calls)) => calls.push(call),
                    None => keyed.push((slot, vec![call])),
                }
            }
            Entry::Alone(call) => call.write(out, waiting),
            Entry::Joined(calls) => {
                let Some(first) = calls[0].check() else {
                    unreachable!("joined calls are checks")
                };
                joins.clear();
                joins.extend(calls.iter().filter_map(|c| c.check().map(|c| c.join)));
                let ahead = leases.ahead(first, joins);
                if let Some(joined) = coalesce::joined(joins, ahead) {
                    first.write_joined(joined, out);
                    waiting.push_back(Waiting::Joined(calls, ahead));
                } else {
                    for call in calls {
                        call.write(out, waiting);
                    }
                }
            }
        }
    }
    for (_, mut calls) in keyed {
        if calls.len() > 1 {
            encode_keys(&calls, out);
            waiting.push_back(Waiting::Keys(calls));
        } else if let Some(call) = calls.pop() {
            call.write(out, waiting);
        }
    }
}

/// A token-bucket check that may go in one call with the checks of other keys.
fn keyable(call: &Call) -> bool {
    call.check()
        .is_some_and(|c| matches!(c.join.kind, coalesce::Kind::Tokens { .. }))
}

/// Two keyable checks that differ in their key only.
fn same_but_key(a: &Call, b: &Call) -> bool {
    match (a.check(), b.check()) {
        (Some(a), Some(b)) => a.same_but_key(b),
        _ => false,
    }
}

/// Writes the one command of `calls` (keyable, [`same_but_key`] as the first): the script with
/// every call's key and the first call's arguments.
fn encode_keys(calls: &[Call], out: &mut Vec<u8>) {
    let Some(first) = calls[0].check() else {
        unreachable!("keyable calls are checks")
    };
    let checks = calls.iter().filter_map(Call::check);
    first.write_keys(calls.len(), checks, out);
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
        _ => again.extend(calls.into_iter().map(Call::alone)),
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
            joins.extend(calls.iter().filter_map(|c| c.check().map(|c| c.join)));
            let replies = coalesce::answer(&reply, joins, ahead);
            let mut end = None;
            if let (Reply::Four(four), Some(first)) = (&reply, calls[0].check()) {
                if matches!(first.join.kind, coalesce::Kind::Tokens { .. }) {
                    if four[0] == 1 {
                        end = leases.taken(first, four, ahead, Instant::now());
                    } else {
                        leases.refused(first);
                    }
                }
            }
            match replies {
                Some(replies) => {
                    for (mut call, reply) in calls.into_iter().zip(replies) {
                        call.slot.reply(Ok(reply));
                    }
                }
                None => again.extend(calls.into_iter().map(Call::alone)),
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
