//! The limiting algorithms, pure: no I/O, no async, no Redis or hyper. A clock reading
//! (`now`, in milliseconds) is passed in, so tests drive time by hand.
//!
//! Each algorithm is the Rust twin of a script in `lua/`: the same state, the same `f64`
//! arithmetic in the same order, so that for the same sequence of (now, request) the memory
//! store and Redis give identical answers (the conformance suite in `tests/` holds them to it).
//!
//! * [`params`]: the typed parameters ([`Rate`], [`Algorithm`]), in which a zero rate, burst,
//!   limit or window cannot be built.
//! * [`decision`]: what a check answers ([`Decision`]).
//! * [`algorithms`]: the state kept per key ([`State`]) and the step function for each algorithm.
//! * [`charge`](mod@charge): what the upstream reported after the response, charged to a key.
//! * [`concurrency`]: slots held while requests run ([`acquire`], [`renew`], [`release`]).
//! * [`adapt`]: an upstream's adaptive pacing rate, moved as AIMD moves it ([`Aimd`]).

pub mod adapt;
mod algorithms;
mod charge;
mod concurrency;
mod decision;
mod params;

pub use adapt::{Adapted, Aimd, AimdError, Report};
pub use algorithms::{apply, defer, give_back, State};
pub use charge::{charge, Balance};
pub use concurrency::{acquire, release, renew};
pub use decision::Decision;
pub use params::{Algorithm, Bucket, Pace, ParamError, Rate, Slots, Window};

/// A reading of a clock in milliseconds since the Unix epoch; decimals carry sub-millisecond
/// precision, as in the Lua scripts.
pub type Millis = f64;

/// Slack allowed when comparing times: 1 microsecond. Epoch timestamps near 1.7e12 ms carry
/// about 0.25 us of `f64` rounding, and a request that comes within 1 us of its slot must not be
/// refused for it. The Lua scripts use the same constant (`EPS`).
pub const EPS_MS: f64 = 0.001;
