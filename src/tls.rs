//! TLS, both ways: the listener's [`ServerConfig`] (PEM certificate chain and key, ALPN `h2`
//! then `http/1.1`) and its [`TlsAcceptor`]; and the client config of every connection
//! tollgate makes, to upstreams and to Redis ([`ClientTls`]), which verifies servers against
//! the bundled and system roots and whatever their `tls` settings add.
//!
//! Every config here names the `ring` provider explicitly instead of relying on rustls's
//! process-wide default, so nothing depends on which crypto features other crates turn on.
//!
//! Does not own the accept loop, the HTTP serving, or the Redis connection: `app` wires the
//! acceptor into the listener, and `proxy::pool` and `store::pipe` connect with the client
//! configs made here.
//! A Redis Cluster over TLS goes through the redis crate, which brings its own rustls setup.

mod client;

pub use client::{
    identity_problem, root_problem, server_name_problem, system_bundle_pem, ClientTls, Pem,
};

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

/// ALPN protocol ids the listener offers, in server preference order (RFC 7301 §3.2: the server
/// picks the first of its own list that the client also offers). `h2` is RFC 9113 §3.2's id.
const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Where Linux distributions keep the system CA bundle, checked in order when `SSL_CERT_FILE`
/// is unset (the same candidates openssl and rustls-native-certs probe).
const SYSTEM_CA_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt", // Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",   // Fedora, RHEL, CentOS
    "/etc/ssl/ca-bundle.pem",             // openSUSE
    "/etc/ssl/cert.pem",                  // Alpine's openssl link, BSDs
];

/// Why a TLS configuration could not be built; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be opened or read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// what the file should hold: "certificate", "private key", "root certificate"
        what: &'static str,
        /// the file
        path: PathBuf,
        /// the I/O error
        source: io::Error,
    },
    /// The file is not well-formed PEM (bad base64, a section without its END line).
    #[error("{}: malformed PEM: {detail}", path.display())]
    Pem {
        /// what the file should hold
        what: &'static str,
        /// the file
        path: PathBuf,
        /// what the PEM parser said
        detail: String,
    },
    /// The file holds no `CERTIFICATE` section.
    #[error("no certificate found in {}", path.display())]
    NoCertificate {
        /// the file
        path: PathBuf,
    },
    /// The file holds no unencrypted private key section.
    #[error(
        "no private key found in {} (expected an unencrypted PKCS#8, PKCS#1 or SEC1 PEM block)",
        path.display()
    )]
    NoPrivateKey {
        /// the file
        path: PathBuf,
    },
    /// The key parsed as PEM but the crypto provider cannot use it.
    #[error("unusable private key {}: {source}", path.display())]
    BadKey {
        /// the file
        path: PathBuf,
        /// rustls's reason
        source: rustls::Error,
    },
    /// The key is not the one the first certificate of the chain was issued for.
    #[error("certificate {} and key {} do not match", cert.display(), key.display())]
    KeyMismatch {
        /// the certificate file
        cert: PathBuf,
        /// the key file
        key: PathBuf,
    },
    /// A root certificate could not be used as a trust anchor.
    #[error("invalid root certificate in {}: {source}", path.display())]
    BadRoot {
        /// the file
        path: PathBuf,
        /// rustls's reason
        source: rustls::Error,
    },
}

impl TlsError {
    /// Whether the private key (rather than the certificate) is what is wrong.
    pub fn is_about_key(&self) -> bool {
        matches!(
            self,
            TlsError::NoPrivateKey { .. } | TlsError::BadKey { .. } | TlsError::KeyMismatch { .. }
        ) || matches!(self, TlsError::Read { what, .. } | TlsError::Pem { what, .. } if *what == "private key")
    }
}

/// The listener's TLS config: the PEM certificate chain in `cert` (leaf first) and the PEM
/// private key in `key` (PKCS#8, PKCS#1/RSA or SEC1/EC), the `ring` provider, TLS 1.2 and 1.3,
/// and ALPN `h2` preferred over `http/1.1`.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = read_certs(cert, "certificate")?;
    let private_key = read_key(key)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_no_client_auth()
        .with_single_cert(chain, private_key)
        .map_err(|e| key_error(e, cert, key))?;
    config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Every problem of the files given (for `tollgate check`): each read on its own, so that an
/// unreadable key is reported beside an unreadable certificate; then, when both read, the pair.
pub fn problems(cert: Option<&Path>, key: Option<&Path>) -> Vec<TlsError> {
    let chain = cert.map(|c| read_certs(c, "certificate"));
    let private_key = key.map(read_key);
    match (cert, key, chain, private_key) {
        (Some(cert), Some(key), Some(Ok(_)), Some(Ok(_))) => {
            server_config(cert, key).err().into_iter().collect()
        }
        (_, _, chain, private_key) => chain
            .and_then(Result::err)
            .into_iter()
            .chain(private_key.and_then(Result::err))
            .collect(),
    }
}

/// An acceptor that runs the server side of the handshake with `config`.
pub fn acceptor(config: Arc<ServerConfig>) -> TlsAcceptor {
    TlsAcceptor::from(config)
}

/// Whether ALPN chose `h2` on this accepted connection. `auto::Builder` detects HTTP/2 by its
/// preface anyway; this lets the caller skip the detection or label metrics.
pub fn negotiated_h2(conn: &tokio_rustls::server::TlsStream<TcpStream>) -> bool {
    conn.get_ref().1.alpn_protocol() == Some(b"h2".as_slice())
}

/// The ALPN id of HTTP/2 (RFC 9113 §3.2).
pub const ALPN_H2: &[u8] = b"h2";
/// The ALPN id of HTTP/1.1.
pub const ALPN_HTTP1: &[u8] = b"http/1.1";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate and key rustls refused as a pair: a mismatch, or a key it cannot use.
fn key_error(e: rustls::Error, cert: &Path, key: &Path) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        },
        other => TlsError::BadKey {
            path: key.to_path_buf(),
            source: other,
        },
    }
}

/// What upstream certificates are verified against.
struct Trust {
    /// every trust anchor: the bundled Mozilla roots and the certificates read from files
    anchors: RootCertStore,
    /// the certificates read from files (the system bundle, extra roots), whole: a server may
    /// present one of them itself ([`UpstreamVerifier`])
    held: Vec<CertificateDer<'static>>,
}

/// The Web PKI's verification (rustls's [`WebPkiServerVerifier`]), and the one certificate it
/// refuses that OpenSSL, and so nginx, HAProxy and curl, accept: a self-signed certificate
/// marked as a CA (`CA:TRUE`, which `openssl req -x509` writes by default) that the server
/// presents itself and the trust bundle holds itself (`SSL_CERT_FILE=cert.pem`, the documented
/// way to trust a self-signed upstream). webpki refuses any CA certificate as a server's
/// (`CaUsedAsEndEntity`); here such a certificate is accepted when it is byte for byte one of
/// the certificates read from the bundle and it names the host connected to. It is valid now:
/// webpki checks a certificate's validity period before its CA flag, so a refusal for the flag
/// means the period passed (an expired one is refused as expired; a test holds that order).
#[derive(Debug)]
struct UpstreamVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    held: Vec<CertificateDer<'static>>,
}

impl UpstreamVerifier {
    fn new(trust: Trust) -> UpstreamVerifier {
        let webpki =
            WebPkiServerVerifier::builder_with_provider(Arc::new(trust.anchors), provider())
                .build()
                .expect("the bundled roots are never empty");
        UpstreamVerifier {
            webpki,
            held: trust.held,
        }
    }

    /// Whether `refusal` is webpki's for a CA certificate presented as the server's.
    fn ca_as_server(refusal: &rustls::Error) -> bool {
        match refusal {
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) => {
                let cause: &(dyn std::error::Error + 'static) = &*other.0;
                cause.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
            }
            _ => false,
        }
    }
}

impl ServerCertVerifier for UpstreamVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(refusal)
                if Self::ca_as_server(&refusal)
                    && self.held.iter().any(|c| c.as_ref() == end_entity.as_ref()) =>
            {
                let cert = ParsedCertificate::try_from(end_entity)?;
                verify_server_name(&cert, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            verdict => verdict,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

/// webpki-roots, plus the system bundle from `SSL_CERT_FILE` or the usual paths.
fn default_trust() -> Trust {
    let env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    trust_with_system_bundle(
        env.into_iter()
            .chain(SYSTEM_CA_BUNDLES.iter().map(PathBuf::from)),
    )
}

/// webpki-roots, plus the certificates of the first candidate bundle that reads. A missing or
/// unreadable system bundle is not an error: the bundled roots still cover the public web.
fn trust_with_system_bundle(candidates: impl IntoIterator<Item = PathBuf>) -> Trust {
    let mut anchors = RootCertStore::empty();
    anchors.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let mut held = Vec::new();
    for bundle in candidates {
        match read_certs(&bundle, "root certificate") {
            Ok(certs) => {
                let (added, ignored) = anchors.add_parsable_certificates(certs.iter().cloned());
                tracing::debug!(bundle = %bundle.display(), added, ignored, "system CA roots loaded");
                held = certs;
                break;
            }
            Err(TlsError::Read { source, .. }) if source.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!("system CA roots skipped: {e}"),
        }
    }
    Trust { anchors, held }
}

fn read_certs(path: &Path, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| pem_error(e, what, path))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        pem::Error::NoItemsFound => TlsError::NoPrivateKey {
            path: path.to_path_buf(),
        },
        other => pem_error(other, "private key", path),
    })
}

fn pem_error(e: pem::Error, what: &'static str, path: &Path) -> TlsError {
    let path = path.to_path_buf();
    match e {
        pem::Error::Io(source) => TlsError::Read { what, path, source },
        other => TlsError::Pem {
            what,
            path,
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::SocketAddr;

    use bytes::Bytes;
    use http::{Request, Response, Version};
    use http_body_util::{BodyExt, Empty, Full};
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use rustls::ClientConfig;
    use rustls_pki_types::ServerName;
    use tokio::net::TcpListener;
    use tokio_rustls::TlsConnector;

    /// A self-signed `localhost` certificate and its key, as PEM files in a temp dir.
    struct Pems {
        dir: tempfile::TempDir,
        cert: PathBuf,
        key: PathBuf,
        cert_der: CertificateDer<'static>,
    }

    fn self_signed() -> Pems {
        made(rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap())
    }

    /// A self-signed certificate for `name` marked `CA:TRUE`, as `openssl req -x509` makes
    /// them; expired if `expired`.
    fn self_signed_ca(name: &str, expired: bool) -> Pems {
        let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        made(params)
    }

    fn made(params: rcgen::CertificateParams) -> Pems {
        let dir = tempfile::tempdir().unwrap();
        let signing_key = rcgen::KeyPair::generate().unwrap();
        let generated = params.self_signed(&signing_key).unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(&cert, generated.pem()).unwrap();
        std::fs::write(&key, signing_key.serialize_pem()).unwrap();
        let cert_der = generated.der().clone();
        Pems {
            dir,
            cert,
            key,
            cert_der,
        }
    }

    /// Answers with the HTTP version it saw and whether ALPN chose h2.
    async fn hello(
        req: Request<Incoming>,
        alpn_h2: bool,
    ) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
        let body = format!("{:?} alpn_h2={alpn_h2}", req.version());
        Ok(Response::new(Full::new(Bytes::from(body))))
    }

    /// A TLS server on 127.0.0.1:0 serving `hello` with `auto::Builder`.
    async fn tls_server(pems: &Pems) -> SocketAddr {
        let tls = acceptor(server_config(&pems.cert, &pems.key).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let tls = tls.clone();
                tokio::spawn(async move {
                    // A client that refuses our certificate aborts the handshake: not a failure.
                    let Ok(stream) = tls.accept(tcp).await else {
                        return;
                    };
                    let h2 = negotiated_h2(&stream);
                    let svc = service_fn(move |req| hello(req, h2));
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A TLS client stream to `addr` trusting only `root`, offering `alpn`.
    async fn tls_client(
        addr: SocketAddr,
        root: &CertificateDer<'static>,
        alpn: &[u8],
    ) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut roots = RootCertStore::empty();
        roots.add(root.clone()).unwrap();
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![alpn.to_vec()];
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap()
    }

    async fn body_text(resp: Response<Incoming>) -> String {
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn get(uri: &str) -> Request<Empty<Bytes>> {
        Request::get(uri)
            .header(http::header::HOST, "localhost")
            .body(Empty::new())
            .unwrap()
    }

    /// A client offering ALPN h2 gets h2 chosen and is served over HTTP/2.
    #[tokio::test]
    async fn alpn_h2_serves_http2() {
        let pems = self_signed();
        let addr = tls_server(&pems).await;
        let stream = tls_client(addr, &pems.cert_der, b"h2").await;
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
        let (mut send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let resp = send.send_request(get("https://localhost/")).await.unwrap();
        assert_eq!(resp.version(), Version::HTTP_2);
        assert_eq!(body_text(resp).await, "HTTP/2.0 alpn_h2=true");
    }

    /// A client offering only ALPN http/1.1 gets it chosen and is served over HTTP/1.1.
    #[tokio::test]
    async fn alpn_http11_serves_http1() {
        let pems = self_signed();
        let addr = tls_server(&pems).await;
        let stream = tls_client(addr, &pems.cert_der, b"http/1.1").await;
        assert_eq!(
            stream.get_ref().1.alpn_protocol(),
            Some(b"http/1.1".as_slice())
        );
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let resp = send.send_request(get("/")).await.unwrap();
        assert_eq!(resp.version(), Version::HTTP_11);
        assert_eq!(body_text(resp).await, "HTTP/1.1 alpn_h2=false");
    }

    /// Fetches `/` from the TLS server at `addr` as `localhost`, over `config` offering
    /// HTTP/1.1: the body, or the error chain of the handshake or the exchange.
    async fn fetch_with(addr: SocketAddr, mut config: ClientConfig) -> Result<String, String> {
        config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        let stream = TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| error_chain(&e))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| error_chain(&e))?;
        tokio::spawn(conn);
        let resp = send
            .send_request(get("/"))
            .await
            .map_err(|e| error_chain(&e))?;
        Ok(body_text(resp).await)
    }

    /// A client config trusting `ca` beside the defaults.
    fn trusting(ca: &Path) -> ClientConfig {
        let tls = ClientTls {
            ca: Some(Pem::read(ca, "root certificate").unwrap()),
            ..ClientTls::default()
        };
        (*tls.client_config().unwrap()).clone()
    }

    /// With the server's certificate as an extra root, the server is verified and answers.
    #[tokio::test]
    async fn an_extra_root_lets_its_server_be_verified() {
        let pems = self_signed();
        let addr = tls_server(&pems).await;
        let body = fetch_with(addr, trusting(&pems.cert)).await.unwrap();
        assert_eq!(body, "HTTP/1.1 alpn_h2=false");
    }

    /// Without the self-signed root (public roots only, or another CA's root), the server is
    /// refused: certificates are really verified. With `verify: false` it is taken.
    #[tokio::test]
    async fn untrusted_servers_are_refused_unless_verify_is_off() {
        let pems = self_signed();
        let other = self_signed();
        let addr = tls_server(&pems).await;
        let defaults = (*ClientTls::default().client_config().unwrap()).clone();
        for config in [defaults, trusting(&other.cert)] {
            let chain = fetch_with(addr, config).await.unwrap_err();
            assert!(
                chain.contains("invalid peer certificate"),
                "expected a certificate refusal, got: {chain}"
            );
        }
        let unchecked = ClientTls {
            verify: false,
            ..ClientTls::default()
        };
        let unchecked = (*unchecked.client_config().unwrap()).clone();
        let body = fetch_with(addr, unchecked).await;
        assert_eq!(body.unwrap(), "HTTP/1.1 alpn_h2=false");
    }

    /// A self-signed certificate marked `CA:TRUE` (what `openssl req -x509` makes) that the
    /// server presents and the trust file holds is accepted, as OpenSSL accepts it; the same
    /// kind of certificate is refused when the file does not hold it, when it names another
    /// host, or when it has expired.
    #[tokio::test]
    async fn a_held_self_signed_ca_certificate_is_accepted_as_the_servers() {
        async fn fetch(server: &Pems, trusted: &Pems) -> Result<String, String> {
            let addr = tls_server(server).await;
            fetch_with(addr, trusting(&trusted.cert)).await
        }
        let held = self_signed_ca("localhost", false);
        assert_eq!(fetch(&held, &held).await.unwrap(), "HTTP/1.1 alpn_h2=false");
        let other = self_signed_ca("localhost", false);
        let refusal = fetch(&held, &other).await.unwrap_err();
        assert!(refusal.contains("CaUsedAsEndEntity"), "{refusal}");
        let elsewhere = self_signed_ca("api.example.com", false);
        let refusal = fetch(&elsewhere, &elsewhere).await.unwrap_err();
        assert!(refusal.contains("not valid for name"), "{refusal}");
        let expired = self_signed_ca("localhost", true);
        let refusal = fetch(&expired, &expired).await.unwrap_err();
        assert!(refusal.contains("expired"), "{refusal}");
    }

    fn error_chain(err: &dyn std::error::Error) -> String {
        let mut out = err.to_string();
        let mut cur = err.source();
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
    }

    /// A missing certificate or key file is named with the OS reason.
    #[test]
    fn missing_files_are_named() {
        let pems = self_signed();
        let missing = pems.dir.path().join("nope.pem");
        let err = server_config(&missing, &pems.key).unwrap_err();
        assert!(matches!(
            err,
            TlsError::Read {
                what: "certificate",
                ..
            }
        ));
        let msg = err.to_string();
        assert!(
            msg.starts_with(&format!("cannot read certificate {}: ", missing.display())),
            "{msg}"
        );
        assert!(msg.contains("No such file"), "{msg}");
        let err = server_config(&pems.cert, &missing).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("cannot read private key {}: ", missing.display())),
            "{err}"
        );
        let err = Pem::read(&missing, "root certificate").unwrap_err();
        assert!(matches!(
            err,
            TlsError::Read {
                what: "root certificate",
                ..
            }
        ));
    }

    /// Files without the expected PEM section (empty, or the key where the cert belongs).
    #[test]
    fn empty_or_wrong_pem_is_reported() {
        let pems = self_signed();
        let empty = pems.dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let err = server_config(&empty, &pems.key).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("no certificate found in {}", empty.display())
        );
        let err = server_config(&pems.key, &pems.key).unwrap_err();
        assert!(matches!(err, TlsError::NoCertificate { .. }), "{err}");
        let err = server_config(&pems.cert, &empty).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("no private key found in {}", empty.display())),
            "{err}"
        );
        let err = server_config(&pems.cert, &pems.cert).unwrap_err();
        assert!(matches!(err, TlsError::NoPrivateKey { .. }), "{err}");
    }

    /// A section without its END line is malformed PEM, not "no certificate".
    #[test]
    fn truncated_pem_is_malformed() {
        let pems = self_signed();
        let truncated = pems.dir.path().join("truncated.pem");
        let text = std::fs::read_to_string(&pems.cert).unwrap();
        std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
        let err = server_config(&truncated, &pems.key).unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("{}: malformed PEM: ", truncated.display())),
            "{err}"
        );
    }

    /// Another certificate's key is refused as a mismatch, naming both files.
    #[test]
    fn key_of_another_certificate_is_a_mismatch() {
        let pems = self_signed();
        let other = self_signed();
        let err = server_config(&pems.cert, &other.key).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "certificate {} and key {} do not match",
                pems.cert.display(),
                other.key.display()
            )
        );
    }

    /// The first system bundle that reads is added to webpki-roots; missing ones are skipped.
    #[test]
    fn system_bundle_adds_to_bundled_roots() {
        let pems = self_signed();
        let bundled = webpki_roots::TLS_SERVER_ROOTS.len();
        let missing = pems.dir.path().join("missing.pem");
        let trust =
            trust_with_system_bundle([missing.clone(), pems.cert.clone(), pems.cert.clone()]);
        assert_eq!(trust.anchors.len(), bundled + 1);
        assert_eq!(trust.held, vec![pems.cert_der.clone()]);
        let trust = trust_with_system_bundle([missing]);
        assert_eq!(trust.anchors.len(), bundled);
        assert!(trust.held.is_empty());
    }

    /// The server config offers h2 before http/1.1.
    #[test]
    fn server_config_prefers_h2() {
        let pems = self_signed();
        let config = server_config(&pems.cert, &pems.key).unwrap();
        assert_eq!(
            config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
    }
}
