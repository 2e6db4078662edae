//! The rest of a charged response whose client left before the response said what it used.
//!
//! A client that closes its connection (or resets its HTTP/2 stream) just before the trailer
//! would otherwise be charged its admission cost only, while the upstream did all the work.
//! So the body is read on, in a task of its own on the same worker, and discarded, until the
//! number arrives or a bound is reached: [`MAX_BYTES`], or `timeouts.upstream_response` from
//! the hang-up (each pause of the body is bounded by that too, as for any response).
//!
//! The drain holds the upstream's body and the charges, nothing of the request: the limits'
//! and the upstream's concurrency slots are given back when the client leaves, as before. It
//! runs on the proxy's task tracker, so a shutdown waits for it within `timeouts.shutdown`.
//! A body read to its end hands its upstream connection back to the pool; one cut at the bound
//! closes it.

use std::time::Duration;

use http::HeaderMap;
use http_body_util::BodyExt;

use super::{Charges, Unread};
use crate::proxy::Body;

/// The most a drain reads of what the client left behind. A streamed answer of thousands of
/// tokens is well under a megabyte of server-sent events; past this, the answer is more likely
/// a download than a priced stream, and reading on costs more than the charge is worth.
pub(super) const MAX_BYTES: u64 = 8 * 1024 * 1024;

/// Reads the rest of `body` in the background and settles `charges` with what it says. Off a
/// runtime (a worker shutting down), it settles at once as cut at the bound.
pub(super) fn start(body: Body, charges: Charges) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return charges.give_up(Unread::DrainBound);
    };
    let tracker = charges.tasks.clone();
    let within = charges.drain_for;
    let unsettled = Unsettled(Some(charges));
    runtime.spawn(tracker.track_future(drain(body, unsettled, within)));
}

/// What the rest of a body brought.
enum Rest {
    /// its trailers: the fields that may hold the number
    Trailers(HeaderMap),
    /// its end, or a failure, with no trailers
    Ended,
    /// more than [`MAX_BYTES`]
    TooLong,
}

async fn drain(mut body: Body, mut unsettled: Unsettled, within: Duration) {
    let rest = tokio::time::timeout(within, read_rest(&mut body)).await;
    // (the body goes first: read to its end, its connection is back in the pool already; cut,
    // it closes here, before the charge is made)
    drop(body);
    let Some(mut charges) = unsettled.0.take() else {
        return;
    };
    match rest {
        Ok(Rest::Trailers(fields)) => charges.settle(&fields, true, None),
        Ok(Rest::Ended) => charges.settle(&HeaderMap::new(), true, None),
        Ok(Rest::TooLong) | Err(_) => {
            tracing::debug!(route = %charges.route, ?within, max_bytes = MAX_BYTES, "drain cut at its bound");
            charges.give_up(Unread::DrainBound);
        }
    }
}

/// Reads and discards `body` up to its trailers, its end, or [`MAX_BYTES`].
async fn read_rest(body: &mut Body) -> Rest {
    let mut read = 0u64;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Rest::Ended;
        };
        match frame.into_data() {
            Ok(data) => {
                read += data.len() as u64;
                if read > MAX_BYTES {
                    return Rest::TooLong;
                }
            }
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    return Rest::Trailers(trailers);
                }
            }
        }
    }
    Rest::Ended
}

/// The charges of a drain under way: a drain dropped before it finished (its worker stopped
/// after `timeouts.shutdown`) counts them as cut at the bound.
struct Unsettled(Option<Charges>);

impl Drop for Unsettled {
    fn drop(&mut self) {
        if let Some(charges) = self.0.take() {
            charges.give_up(Unread::DrainBound);
        }
    }
}
