//! The scheduling tricks that exist for throughput, and the one switch that turns them off.
//!
//! Each trick makes a task wait a turn of its worker's runtime, so that work of one kind
//! gathers and leaves together. tokio promises no order for a task that yields. So each trick
//! leans on how tokio schedules today, and any of them may stop paying after a tokio upgrade.
//! The tricks:
//!
//! * **The pass** (`server/pass.rs`). A response whose worker has other requests under way
//!   waits one turn, so the responses of a scheduler pass leave together. A client waiting on
//!   several of them is woken once, not once each.
//! * **The outbox** (`proxy/h1/outbox.rs`). Under load a request head is left in a per-worker
//!   outbox, and one task writes every head after one turn. An upstream asleep in
//!   `epoll_wait` is then woken once for them.
//! * **Gather turns** (`store/pipe.rs`). Under load a batch of Redis calls waits a few turns
//!   before it is written. More checks of one bucket are then joined, and Redis runs fewer
//!   scripts.
//!
//! BENCHMARKS.md gives what each buys. With `TOLLGATE_TURNS=off` in the environment, none
//! runs: responses and heads are written at once, and Redis batches go as they come. Use it to
//! tell whether a trick is at fault, or to measure what the tricks buy on a new machine.

use std::sync::OnceLock;

/// The environment variable that turns the tricks off: `TOLLGATE_TURNS=off`.
pub const SWITCH: &str = "TOLLGATE_TURNS";

/// Whether the tricks run. Read from the environment once, at the first call.
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(SWITCH).map_or(true, |v| v != "off"))
}
