//! The task that keeps adaptive pacing rates: one per process, started by `Server::run` and
//! stopped when it drains. Each tick reads the proxy in force, so a reload's new upstreams
//! (and their new adapters) report from the next tick on, and those it dropped stop.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::proxy::adapt::{tick, TICK};

/// How often the task looks while no upstream is paced adaptively: a reload that adds one is
/// followed within this.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Reports each adaptive upstream's periods to the store and reads back its rate, until the
/// server drains.
pub(super) async fn adapt_rates(shared: Arc<Shared>) {
    loop {
        let proxy = shared.live.proxy.load_full();
        let adaptive = tick(&proxy).await;
        drop(proxy);
        tokio::time::sleep(if adaptive { TICK } else { IDLE_TICK }).await;
        if shared.draining.load(Ordering::Acquire) {
            return;
        }
    }
}
