//! The client side of the TLS connections tollgate makes, to upstreams (`upstreams.<name>.tls`)
//! and to Redis (`store.tls`): extra roots to trust, a client certificate for servers that ask
//! for one, and verification turned off when asked. The files arrive already read ([`Pem`]),
//! so a configuration's files are read once, when it is loaded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use super::{default_trust, pem_error, provider, TlsError, Trust, UpstreamVerifier};

/// A PEM file's contents, with its path for messages.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    /// where the bytes came from
    pub path: PathBuf,
    /// the file's contents
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Pem {
    // (a private key's bytes must not reach a log line)
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Pem({}, {} bytes)",
            self.path.display(),
            self.bytes.len()
        )
    }
}

impl Pem {
    /// Reads the file at `path`, which should hold `what` ("root certificate", "certificate",
    /// "private key"): named in the error when it cannot be read.
    pub fn read(path: &Path, what: &'static str) -> Result<Pem, TlsError> {
        std::fs::read(path)
            .map(|bytes| Pem {
                path: path.to_path_buf(),
                bytes,
            })
            .map_err(|source| TlsError::Read {
                what,
                path: path.to_path_buf(),
                source,
            })
    }

    fn certs(&self, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let certs = CertificateDer::pem_slice_iter(&self.bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_error(e, what, &self.path))?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.path.clone(),
            });
        }
        Ok(certs)
    }

    fn key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.bytes).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoPrivateKey {
                path: self.path.clone(),
            },
            other => pem_error(other, "private key", &self.path),
        })
    }
}

/// How a TLS connection tollgate makes trusts the server and identifies itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// certificates to trust beside the bundled Mozilla roots and the system bundle
    pub ca: Option<Pem>,
    /// a client certificate chain and its private key
    pub identity: Option<(Pem, Pem)>,
    /// the name the server's certificate must be valid for, also sent in SNI; `None`: the
    /// host connected to
    pub server_name: Option<String>,
    /// false: no verification of the server's certificate at all
    pub verify: bool,
}

impl Default for ClientTls {
    /// Verified against the bundled and system roots, no client certificate.
    fn default() -> ClientTls {
        ClientTls {
            ca: None,
            identity: None,
            server_name: None,
            verify: true,
        }
    }
}

impl ClientTls {
    /// The rustls client config, offering no ALPN: a caller that speaks HTTP sets its own.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let verifier: Arc<dyn ServerCertVerifier> = if self.verify {
            let mut trust = default_trust();
            if let Some(ca) = &self.ca {
                add_roots(&mut trust, ca)?;
            }
            Arc::new(UpstreamVerifier::new(trust))
        } else {
            Arc::new(NoVerification(provider()))
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("the ring provider supports TLS 1.2 and 1.3")
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(cert.certs("certificate")?, key.key()?)
                .map_err(|e| match e {
                    rustls::Error::InconsistentKeys(_) => TlsError::KeyMismatch {
                        cert: cert.path.clone(),
                        key: key.path.clone(),
                    },
                    other => TlsError::BadKey {
                        path: key.path.clone(),
                        source: other,
                    },
                })?,
        };
        Ok(Arc::new(config))
    }
}

/// Why `ca` cannot serve as roots to trust, if it cannot.
pub fn root_problem(ca: &Pem) -> Option<TlsError> {
    let mut trust = Trust {
        anchors: rustls::RootCertStore::empty(),
        held: Vec::new(),
    };
    add_roots(&mut trust, ca).err()
}

/// Why `cert` and `key` cannot serve as a client certificate, if they cannot.
pub fn identity_problem(cert: &Pem, key: &Pem) -> Option<TlsError> {
    let tls = ClientTls {
        identity: Some((cert.clone(), key.clone())),
        verify: false,
        ..ClientTls::default()
    };
    tls.client_config().err()
}

/// Why `name` cannot be a TLS server name, if it cannot.
pub fn server_name_problem(name: &str) -> Option<String> {
    ServerName::try_from(name)
        .err()
        .map(|_| format!("expected a DNS name or an IP address, found {name:?}"))
}

/// The system CA bundle's PEM text (`SSL_CERT_FILE`, else the first of the usual paths that
/// reads), for a client that takes roots as PEM and trusts only those.
pub fn system_bundle_pem() -> Option<Vec<u8>> {
    let env = std::env::var_os("SSL_CERT_FILE").map(PathBuf::from);
    env.into_iter()
        .chain(super::SYSTEM_CA_BUNDLES.iter().map(PathBuf::from))
        .find_map(|path| std::fs::read(path).ok())
}

fn add_roots(trust: &mut Trust, ca: &Pem) -> Result<(), TlsError> {
    for cert in ca.certs("root certificate")? {
        trust
            .anchors
            .add(cert.clone())
            .map_err(|source| TlsError::BadRoot {
                path: ca.path.clone(),
                source,
            })?;
        trust.held.push(cert);
    }
    Ok(())
}

/// Accepts any certificate (`verify: false`); the handshake's signatures are still checked, so
/// the peer holds the key of the certificate it sent, whoever that is.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem(dir: &Path, name: &str, text: &str) -> Pem {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        Pem::read(&path, "certificate").unwrap()
    }

    /// A CA, and a leaf it signed with that leaf's key: each as PEM text.
    fn ca_and_leaf() -> (String, String, String) {
        let mut params = rcgen::CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["client".into()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        (ca.pem(), leaf.pem(), key.serialize_pem())
    }

    /// Roots, a client identity and a server name are checked as the store will use them,
    /// and every refusal names its file.
    #[test]
    fn problems_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf, key) = ca_and_leaf();
        let (_, _, other_key) = ca_and_leaf();
        let ca = pem(dir.path(), "ca.pem", &ca);
        let leaf = pem(dir.path(), "leaf.pem", &leaf);
        let key = pem(dir.path(), "key.pem", &key);
        let other_key = pem(dir.path(), "other.pem", &other_key);
        assert!(root_problem(&ca).is_none());
        assert!(identity_problem(&leaf, &key).is_none());
        let empty = pem(dir.path(), "empty.pem", "");
        let e = root_problem(&empty).unwrap();
        assert_eq!(
            e.to_string(),
            format!("no certificate found in {}", empty.path.display())
        );
        let e = identity_problem(&leaf, &other_key).unwrap();
        assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");
        assert!(e.is_about_key());
        let e = identity_problem(&leaf, &leaf).unwrap();
        assert!(matches!(e, TlsError::NoPrivateKey { .. }), "{e}");
        let e = identity_problem(&key, &key).unwrap();
        assert!(matches!(e, TlsError::NoCertificate { .. }), "{e}");
        let missing = Pem::read(&dir.path().join("nope.pem"), "root certificate").unwrap_err();
        assert!(
            missing
                .to_string()
                .starts_with("cannot read root certificate "),
            "{missing}"
        );
        assert!(server_name_problem("redis.internal").is_none());
        assert!(server_name_problem("10.0.0.7").is_none());
        assert!(server_name_problem("not a name").is_some());
    }

    /// A client config builds with extra roots and an identity, and with verification off.
    #[test]
    fn client_configs_build() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, leaf, key) = ca_and_leaf();
        let tls = ClientTls {
            ca: Some(pem(dir.path(), "ca.pem", &ca)),
            identity: Some((
                pem(dir.path(), "leaf.pem", &leaf),
                pem(dir.path(), "key.pem", &key),
            )),
            server_name: None,
            verify: true,
        };
        let config = tls.client_config().unwrap();
        assert!(config.client_auth_cert_resolver.has_certs());
        assert!(config.alpn_protocols.is_empty());
        let off = ClientTls {
            verify: false,
            ..ClientTls::default()
        };
        assert!(!off
            .client_config()
            .unwrap()
            .client_auth_cert_resolver
            .has_certs());
    }

    /// The key's bytes never reach a debug line.
    #[test]
    fn debug_hides_contents() {
        let key = Pem {
            path: PathBuf::from("/k.pem"),
            bytes: b"-----BEGIN PRIVATE KEY-----secret".to_vec(),
        };
        assert_eq!(format!("{key:?}"), "Pem(/k.pem, 33 bytes)");
    }
}
