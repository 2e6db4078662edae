//! `tls` of a connection tollgate makes, `store.tls` and `upstreams.<name>.tls`: the roots,
//! client certificate and server name, and `verify: false`. The files are read here when the
//! loader asks ([`Checker::read_files`]), so `tollgate check` and a reload report a missing or
//! unusable one, and a reload that finds one changed builds the connections anew.

use std::path::PathBuf;

use super::backend::{redact_url, wants_redis};
use super::check::Checker;
use super::problem::Path;
use super::raw::{Field, RawClientTls, RawStore};
use super::types::{Backend, ClientTls, PemFile};
use crate::tls::{self, Pem};

/// The warning of every way of turning verification of Redis off.
const UNVERIFIED: &str = "the certificate of Redis is not verified: anyone on the way to \
                          Redis can pose as it and read every key; use this only to try \
                          things out";

/// The warning of `verify: false` on an upstream.
const UPSTREAM_UNVERIFIED: &str = "the upstream's certificate is not verified: anyone on the \
                                   way to it can pose as it and read the traffic; use this \
                                   only to try things out";

/// Validates `store.tls` against the backend it serves; also warns of a `#insecure` URL.
pub(crate) fn store(chk: &mut Checker<'_>, raw: &RawStore, backend: &Backend) -> Option<ClientTls> {
    let store = Path::root().key("store");
    insecure_urls(chk, raw, &store);
    let raw_tls = raw.tls.get()?;
    let path = store.key("tls");
    let tls = client_tls(chk, raw_tls, &path, UNVERIFIED);
    applies(chk, raw, backend, &path);
    Some(tls)
}

/// Validates an upstream's `tls` at `path`.
pub(crate) fn upstream(chk: &mut Checker<'_>, raw_tls: &RawClientTls, path: &Path) -> ClientTls {
    client_tls(chk, raw_tls, path, UPSTREAM_UNVERIFIED)
}

/// Validates a `tls` mapping at `path`; `unverified` is the warning of `verify: false`.
fn client_tls(
    chk: &mut Checker<'_>,
    raw_tls: &RawClientTls,
    path: &Path,
    unverified: &str,
) -> ClientTls {
    let path = path.clone();
    let ca = file(chk, &raw_tls.ca, &path, "ca", "root certificate");
    let cert = file(chk, &raw_tls.cert, &path, "cert", "certificate");
    let key = file(chk, &raw_tls.key, &path, "key", "private key");
    let identity = match (raw_tls.cert.is_given(), raw_tls.key.is_given()) {
        (true, false) => {
            let message = "missing required key \"key\": a client certificate (cert) needs its \
                           private key";
            chk.error(path.clone(), message);
            None
        }
        (false, true) => {
            let message = "missing required key \"cert\": a private key (key) needs its \
                           client certificate";
            chk.error(path.clone(), message);
            None
        }
        _ => cert.zip(key),
    };
    check_contents(chk, ca.as_ref(), identity.as_ref(), &path);
    let server_name = raw_tls.server_name.get().cloned();
    if let Some(problem) = server_name.as_deref().and_then(tls::server_name_problem) {
        chk.error(path.key("server_name"), problem);
    }
    let verify = raw_tls.verify.get().copied().unwrap_or(true);
    if !verify {
        chk.warn(path.key("verify"), unverified);
    }
    ClientTls {
        ca,
        identity,
        server_name,
        verify,
    }
}

/// A file key: its path, and its contents when the loader reads files.
fn file(
    chk: &mut Checker<'_>,
    field: &Field<String>,
    map: &Path,
    key: &str,
    what: &'static str,
) -> Option<PemFile> {
    let text = field.get()?;
    if text.is_empty() {
        chk.error(map.key(key), "expected a file path, found \"\"");
        return None;
    }
    let path = PathBuf::from(text);
    let contents = if chk.read_files {
        match Pem::read(&path, what) {
            Ok(pem) => Some(pem.bytes),
            Err(e) => {
                chk.error(map.key(key), e.to_string());
                return None;
            }
        }
    } else {
        None
    };
    Some(PemFile { path, contents })
}

/// Whether the files read hold what their keys promise: roots, and a certificate with its key.
fn check_contents(
    chk: &mut Checker<'_>,
    ca: Option<&PemFile>,
    identity: Option<&(PemFile, PemFile)>,
    path: &Path,
) {
    let pem = |file: &PemFile| {
        file.contents.as_ref().map(|bytes| Pem {
            path: file.path.clone(),
            bytes: bytes.clone(),
        })
    };
    if let Some(problem) = ca.and_then(pem).and_then(|ca| tls::root_problem(&ca)) {
        chk.error(path.key("ca"), problem.to_string());
    }
    if let Some((cert, key)) = identity.and_then(|(c, k)| pem(c).zip(pem(k))) {
        if let Some(problem) = tls::identity_problem(&cert, &key) {
            let name = if problem.is_about_key() {
                "key"
            } else {
                "cert"
            };
            chk.error(path.key(name), problem.to_string());
        }
    }
}

/// `store.tls` serves `rediss://` only: set beside a plain URL it would protect nothing, so it
/// is an error rather than a setting that is quietly unused.
fn applies(chk: &mut Checker<'_>, raw: &RawStore, backend: &Backend, path: &Path) {
    let plain = |urls: &[String]| {
        urls.iter()
            .find(|u| !u.starts_with("rediss://"))
            .map(|u| redact_url(u))
    };
    let without_tls = match backend {
        // the backend's own problem is reported already
        Backend::Memory if wants_redis(raw) => None,
        Backend::Memory => {
            chk.key_error(path.clone(), "tls is only used with backend: redis");
            None
        }
        Backend::Redis { url } => plain(std::slice::from_ref(url)),
        Backend::Cluster { urls } => plain(urls),
        Backend::Sentinel(sentinel) => plain(&sentinel.nodes),
    };
    if let Some(url) = without_tls {
        chk.error(
            path.clone(),
            format!(
                "tls needs rediss:// URLs, and {url:?} connects without TLS: write rediss:// \
                 to connect over TLS, or remove tls"
            ),
        );
    }
}

/// A `#insecure` URL turns verification off as `verify: false` does, with the same warning.
fn insecure_urls(chk: &mut Checker<'_>, raw: &RawStore, store: &Path) {
    if raw.url.get().is_some_and(|u| is_insecure(u)) {
        chk.warn(store.key("url"), UNVERIFIED);
    }
    if let Some(list) = raw.cluster.get() {
        for (item, url) in list.items(&store.key("cluster")) {
            if is_insecure(url) {
                chk.warn(item, UNVERIFIED);
            }
        }
    }
}

fn is_insecure(url: &str) -> bool {
    let url = url.trim();
    url.starts_with("rediss://") && url.ends_with("#insecure")
}
