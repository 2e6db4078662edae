//! A Cluster's seed nodes, from `store.cluster`'s URLs, for the store's own connection.

use std::time::Duration;

use ::redis::{ConnectionAddr, IntoConnectionInfo};

use super::{own_tls, ClientTls};
use crate::store::cluster::Cluster;
use crate::store::pipe::{Addr, Endpoint};
use crate::store::StoreError;

/// The store's own connections to a Cluster, first reached through the nodes `urls` name.
/// Every node is signed in to with the first URL's user and password (they must agree), over
/// TLS when a URL is `rediss://`.
pub(super) fn own_cluster(
    urls: &[String],
    tls: &ClientTls,
    connect_timeout: Duration,
    lanes: usize,
) -> Result<Cluster, StoreError> {
    let mut seeds = Vec::with_capacity(urls.len());
    let mut template = None;
    for url in urls {
        let info = url.as_str().into_connection_info()?;
        let (host, port, tls) = match info.addr() {
            ConnectionAddr::Tcp(host, port) => (host, *port, None),
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure,
                ..
            } => (host, *port, Some(own_tls(tls, *insecure)?)),
            _ => {
                return Err(StoreError::from(::redis::RedisError::from((
                    ::redis::ErrorKind::InvalidClientConfig,
                    "a Cluster node is reached over TCP: redis:// or rediss://",
                ))))
            }
        };
        seeds.push((host.clone(), port));
        let settings = info.redis_settings();
        template.get_or_insert_with(|| Endpoint {
            addr: Addr::Tcp(host.clone(), port),
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: 0,
            connect_timeout,
            tls,
            cluster: true,
        });
    }
    let Some(template) = template else {
        return Err(StoreError::from(::redis::RedisError::from((
            ::redis::ErrorKind::InvalidClientConfig,
            "no Cluster node given",
        ))));
    };
    Ok(Cluster::new(seeds, template, lanes))
}
