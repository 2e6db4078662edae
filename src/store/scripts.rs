//! The Lua scripts of `lua/`, compiled in, and the ARGV each algorithm takes (SPEC §5).

use ::redis::{Script, ScriptInvocation};

use crate::limit::{Algorithm, Millis, Pace};

/// The five scripts, hashed once at start-up.
pub(crate) struct Scripts {
    token_bucket: Script,
    leaky_bucket: Script,
    fixed_window: Script,
    sliding_window: Script,
    sliding_window_counter: Script,
    pace_defer: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            token_bucket: Script::new(include_str!("../../lua/token_bucket.lua")),
            leaky_bucket: Script::new(include_str!("../../lua/leaky_bucket.lua")),
            fixed_window: Script::new(include_str!("../../lua/fixed_window.lua")),
            sliding_window: Script::new(include_str!("../../lua/sliding_window.lua")),
            sliding_window_counter: Script::new(include_str!(
                "../../lua/sliding_window_counter.lua"
            )),
            pace_defer: Script::new(include_str!("../../lua/pace_defer.lua")),
        }
    }

    /// The invocation for one check: KEYS[1] = `key`, ARGV as SPEC §5 lists them, and `now`
    /// last when given. Numbers are written in Rust's shortest round-trip form, so the script's
    /// `tonumber` reads back exactly the `f64` the memory store computes with.
    pub(crate) fn invocation<'a>(
        &'a self,
        key: &str,
        alg: &Algorithm,
        now: Option<Millis>,
    ) -> ScriptInvocation<'a> {
        let mut inv = match alg {
            Algorithm::TokenBucket(b) => {
                let mut inv = self.token_bucket.key(key);
                inv.arg(b.rate.per_sec().to_string())
                    .arg(b.burst.get())
                    .arg(b.cost.get());
                inv
            }
            Algorithm::LeakyBucket(p) => {
                let mut inv = self.leaky_bucket.key(key);
                inv.arg(p.rate.per_sec().to_string());
                inv.arg(p.max_delay_ms.map(|d| d.to_string()).unwrap_or_default());
                inv
            }
            Algorithm::FixedWindow(w) => self.window(&self.fixed_window, key, w),
            Algorithm::SlidingWindow(w) => self.window(&self.sliding_window, key, w),
            Algorithm::SlidingWindowCounter(w) => self.window(&self.sliding_window_counter, key, w),
        };
        if let Some(now) = now {
            inv.arg(now.to_string());
        }
        inv
    }

    /// The invocation of `lua/pace_defer.lua` for upstream back-pressure.
    pub(crate) fn defer<'a>(
        &'a self,
        key: &str,
        pace: &Pace,
        hold_ms: u64,
        now: Option<Millis>,
    ) -> ScriptInvocation<'a> {
        let mut inv = self.pace_defer.key(key);
        inv.arg(pace.rate.per_sec().to_string()).arg(hold_ms);
        if let Some(now) = now {
            inv.arg(now.to_string());
        }
        inv
    }

    fn window<'a>(
        &self,
        script: &'a Script,
        key: &str,
        w: &crate::limit::Window,
    ) -> ScriptInvocation<'a> {
        let mut inv = script.key(key);
        inv.arg(w.limit.get()).arg(w.window_ms.get());
        inv
    }
}
