//! Reload: SIGHUP, or a change of the config file, swaps in new routes, limits and upstreams
//! without dropping a connection; requests in flight finish under the config they started with.
//! An invalid file is rejected with the same messages as `tollgate check`, and the old config
//! stays in force. The store is rebuilt only when the `store` section changed.
//! docs/operations.md describes reload for operators.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{admin_token, build_proxy, build_store, Shared};
use crate::config::{self, Config, ConfigError};
use crate::console::Reloaded;

/// Applies new configurations to a running [`super::Server`]. Cheap to clone.
#[derive(Clone)]
pub struct Reloader {
    shared: Arc<Shared>,
}

/// Why a reload did not take effect.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// the file is unreadable or invalid
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// the new store could not be built (e.g. a malformed Redis URL)
    #[error("cannot apply the new configuration: {0:#}")]
    Apply(anyhow::Error),
}

/// Events closer together than this are one change (editors write a file in several steps).
const SETTLE: Duration = Duration::from_millis(150);

impl Reloader {
    pub(super) fn new(shared: Arc<Shared>) -> Reloader {
        Reloader { shared }
    }

    /// Puts a validated `config` in force.
    pub async fn apply(&self, config: Config) -> anyhow::Result<()> {
        let (old_store_config, old_store) = self.shared.store();
        let store = if old_store_config == config.store {
            old_store
        } else {
            tracing::info!("store settings changed: building a new store");
            // (the workers running, which a reload does not change)
            let workers = self.shared.clients.workers();
            build_store(&config.store, workers, &self.shared.metrics).await?
        };
        let token = admin_token(&config)?;
        let proxy = build_proxy(
            &config,
            store.clone(),
            self.shared.clients.clone(),
            self.shared.metrics.clone(),
            self.shared.tunnels.clone(),
            self.shared.refusals.clone(),
        )?;
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let was = &current.0;
        // the same certificate and key files: read again (a renewed certificate, as certbot
        // or cert-manager write it, is served from the next connection on)
        if let (Some(t), Some(swap)) = (config.tls.as_ref(), self.shared.live.tls.as_ref()) {
            if was.tls.as_ref() == Some(t) {
                match crate::tls::server_config(&t.cert, &t.key) {
                    Ok(server) => swap.store(server),
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS certificate not reloaded; the one before stays")
                    }
                }
            }
        }
        if was.listen != config.listen
            || was.tls != config.tls
            || was.workers != config.workers
            || was.admin.as_ref().map(|a| (a.listen, a.max_connections))
                != config.admin.as_ref().map(|a| (a.listen, a.max_connections))
            || was.timeouts.upstream_connect != config.timeouts.upstream_connect
        {
            tracing::warn!(
                "listen, tls, workers, admin.listen, admin.max_connections and \
                 timeouts.upstream_connect changes take effect at the next restart"
            );
        }
        // what is in force: those stay as they were at the start (so /config shows them, and a
        // file put back to them is no change); the admin token and hosts are the new ones
        let admin = was.admin.clone().map(|a| config::AdminConfig {
            token: config.admin.as_ref().and_then(|new| new.token.clone()),
            hosts: config
                .admin
                .as_ref()
                .map_or_else(Vec::new, |new| new.hosts.clone()),
            ..a
        });
        let config = Config {
            listen: was.listen.clone(),
            tls: was.tls.clone(),
            workers: was.workers,
            admin,
            timeouts: config::Timeouts {
                upstream_connect: was.timeouts.upstream_connect,
                ..config.timeouts
            },
            ..config
        };
        crate::proxy::adapt::carry_over(&self.shared.live.proxy.load(), &proxy);
        self.shared.live.proxy.store(Arc::new(proxy));
        self.shared.live.timeouts.store(Arc::new(config.timeouts));
        *self.shared.token.lock().unwrap_or_else(|e| e.into_inner()) = token;
        *current = (config, store);
        Ok(())
    }

    /// Loads `path` and puts it in force. On error the old config stays and every problem is
    /// logged, as `tollgate check` prints them.
    pub async fn reload_file(&self, path: &Path) -> Result<(), ReloadError> {
        // Reading and validating the file is blocking work; keep it off the request workers.
        let owned = path.to_path_buf();
        let result = match tokio::task::spawn_blocking(move || config::load(&owned)).await {
            Err(e) => Err(ReloadError::Apply(anyhow::anyhow!(
                "config loader stopped: {e}"
            ))),
            Ok(Ok(loaded)) => {
                for warning in &loaded.warnings {
                    tracing::warn!("{warning}");
                }
                // in a task of its own: should building the new configuration panic, that
                // reload fails and the next one is still made (the watch goes on)
                let reloader = Reloader::new(self.shared.clone());
                match tokio::spawn(async move { reloader.apply(loaded.config).await }).await {
                    Ok(applied) => applied.map_err(ReloadError::Apply),
                    Err(e) => Err(ReloadError::Apply(anyhow::anyhow!(
                        "building the new configuration failed: {e}"
                    ))),
                }
            }
            Ok(Err(e)) => Err(ReloadError::Config(e)),
        };
        self.shared.metrics.config_reload(result.is_ok());
        let error = result.as_ref().err().map(ToString::to_string);
        *self
            .shared
            .reloaded
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Reloaded {
            at: std::time::SystemTime::now(),
            error,
        });
        match &result {
            Ok(()) => tracing::info!(path = %path.display(), "configuration reloaded"),
            Err(ReloadError::Config(ConfigError::Invalid(problems))) => {
                for p in problems {
                    tracing::error!("{p}");
                }
                tracing::error!(path = %path.display(), "reload rejected; the previous configuration stays in force");
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "reload rejected; the previous configuration stays in force");
            }
        }
        result
    }

    /// Reloads `path` on SIGHUP and whenever the file changes, until the task is aborted. The
    /// watch and the signal handler are in place when this returns (it must be called on the
    /// runtime): a change made right after is seen, not lost to a task not yet run.
    pub fn watch(self, path: PathBuf) -> tokio::task::JoinHandle<()> {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(16);
        let watch = crate::watch::watch_file(&path, tx.clone());
        spawn_sighup(tx);
        tokio::spawn(async move {
            let _watch = watch;
            while rx.recv().await.is_some() {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
                let _ = self.reload_file(&path).await;
            }
        })
    }
}

fn spawn_sighup(tx: tokio::sync::mpsc::Sender<()>) {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP received: reloading");
                    if tx.send(()).await.is_err() {
                        return;
                    }
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP"),
    }
}
