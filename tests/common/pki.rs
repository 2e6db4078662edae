//! Certificates made by the test: a CA of its own, and server and client certificates it
//! signs, written as PEM files to a temporary directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and the directory its files are in.
pub struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate chain and its key, as files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// A new CA; its certificate is [`Pki::ca`].
    pub fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A file in the directory (for a file that is not there, or one of the test's own).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A certificate for `names` (DNS names or IP addresses) signed by the CA, written as
    /// `<stem>.pem` and `<stem>-key.pem`.
    pub fn issue(&self, stem: &str, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let params = CertificateParams::new(names).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: self.path(&format!("{stem}.pem")),
            key: self.path(&format!("{stem}-key.pem")),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }

    /// A server config presenting `server`, offering `alpn`; with `client_auth`, it asks for
    /// a client certificate the CA signed and refuses connections without one.
    pub fn server_config(
        &self,
        server: &Issued,
        alpn: &[&[u8]],
        client_auth: bool,
    ) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(certs(&self.ca()).remove(0)).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let key = PrivateKeyDer::from_pem_file(&server.key).unwrap();
        let mut config = builder.with_single_cert(certs(&server.cert), key).unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .map(Result::unwrap)
        .collect()
}
