//! The metrics server's TLS: a certificate and key from files (e.g. a cert-manager Secret
//! mounted into the pod), re-read when the files change so a renewed certificate is served
//! without a restart; or, without files, a self-signed certificate made at start-up (a scraper
//! then skips verification, as with controller-runtime's default; the token still travels
//! encrypted).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{Error, Result};

/// Where the server's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertSource {
    /// Made at start-up for these DNS names or IP addresses.
    SelfSigned { hosts: Vec<String> },
    /// PEM files: the certificate chain (leaf first) and its private key.
    Files { cert: PathBuf, key: PathBuf },
}

fn provider() -> Arc<CryptoProvider> {
    // ring, like kube's client and the backstop's TLS; never the process-wide default.
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server configuration for `source`: HTTP/1.1 only, no client certificates.
pub fn server_config(source: &CertSource) -> Result<Arc<ServerConfig>> {
    let provider = provider();
    let resolver: Arc<dyn ResolvesServerCert> = match source {
        CertSource::SelfSigned { hosts } => Arc::new(Fixed(self_signed(hosts, &provider)?)),
        CertSource::Files { cert, key } => Arc::new(Reloading::new(cert, key, provider.clone())?),
    };
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("metrics TLS: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn self_signed(hosts: &[String], provider: &CryptoProvider) -> Result<Arc<CertifiedKey>> {
    let made = rcgen::generate_simple_self_signed(hosts.to_vec())
        .map_err(|e| Error::Config(format!("self-signed metrics certificate: {e}")))?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
    certified(vec![made.cert.der().clone()], key, provider)
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>> {
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| Error::Config(format!("metrics TLS key: {e}")))?;
    let ck = CertifiedKey::new(chain, signing);
    ck.keys_match()
        .map_err(|e| Error::Config(format!("metrics TLS certificate and key: {e}")))?;
    Ok(Arc::new(ck))
}

/// Reads the PEM pair at `cert` and `key`.
pub fn load_pem(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<std::result::Result<Vec<_>, _>>())
        .map_err(|e| Error::Config(format!("metrics certificate {}: {e}", cert.display())))?;
    if chain.is_empty() {
        return Err(Error::Config(format!(
            "metrics certificate {}: no CERTIFICATE block",
            cert.display()
        )));
    }
    let private = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| Error::Config(format!("metrics key {}: {e}", key.display())))?;
    certified(chain, private, provider)
}

#[derive(Debug)]
struct Fixed(Arc<CertifiedKey>);

impl ResolvesServerCert for Fixed {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The files' pair, re-read on the first handshake after either file's modification time
/// changes (a Secret volume swaps both at once). A pair that does not load keeps the old one
/// in service, with a warning: an expiring certificate is better than none.
#[derive(Debug)]
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<(Stamp, Arc<CertifiedKey>)>,
}

type Stamp = (Option<SystemTime>, Option<SystemTime>);

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl Reloading {
    fn new(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> Result<Self> {
        let stamp = (modified(cert), modified(key));
        let ck = load_pem(cert, key, &provider)?;
        Ok(Reloading {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            loaded: Mutex::new((stamp, ck)),
        })
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let stamp = (modified(&self.cert), modified(&self.key));
        if stamp != loaded.0 {
            match load_pem(&self.cert, &self.key, &self.provider) {
                Ok(ck) => {
                    tracing::info!(cert = %self.cert.display(), "metrics certificate reloaded");
                    *loaded = (stamp, ck);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics certificate not reloaded; keeping the old one");
                    // Not retried on every handshake: the next change of the files is.
                    loaded.0 = stamp;
                }
            }
        }
        Some(loaded.1.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::{CertificateDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{CertSource, server_config};

    fn write_pair(dir: &std::path::Path, name: &str) -> (CertificateDer<'static>, CertSource) {
        let made = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (made.cert.der().clone(), CertSource::Files { cert, key })
    }

    /// The certificate a client sees, verified against `trusted` for `name`.
    async fn handshake(
        server: Arc<rustls::ServerConfig>,
        trusted: &CertificateDer<'static>,
        name: &str,
    ) -> Result<(), std::io::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(trusted.clone()).unwrap();
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let srv = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            if let Ok(mut s) = acceptor.accept(tcp).await {
                let _ = s.write_all(b"ok").await;
                let _ = s.shutdown().await;
            }
        });
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        srv.await.unwrap();
        assert_eq!(out, b"ok");
        Ok(())
    }

    #[tokio::test]
    async fn a_given_certificate_is_served_and_reloaded_when_its_files_change() {
        let dir = std::env::temp_dir().join(format!("sc-metrics-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (first, source) = write_pair(&dir, "metrics.example");
        let config = server_config(&source).unwrap();
        handshake(config.clone(), &first, "metrics.example")
            .await
            .expect("the given certificate verifies");
        // A renewed pair (cert-manager rewrites the Secret): served from the next handshake on.
        // The modification time must move; file systems may keep whole seconds.
        std::thread::sleep(std::time::Duration::from_millis(1100));
        let (second, _) = write_pair(&dir, "metrics.example");
        handshake(config.clone(), &second, "metrics.example")
            .await
            .expect("the renewed certificate is served");
        assert!(
            handshake(config.clone(), &first, "metrics.example")
                .await
                .is_err(),
            "the old certificate is no longer served"
        );
        // A broken renewal keeps the last good pair in service.
        std::fs::write(dir.join("tls.key"), "not a key").unwrap();
        handshake(config, &second, "metrics.example")
            .await
            .expect("the last good certificate stays");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_files_fail_at_start_up_with_the_path() {
        let missing = CertSource::Files {
            cert: "/nonexistent/tls.crt".into(),
            key: "/nonexistent/tls.key".into(),
        };
        let err = server_config(&missing).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/tls.crt"), "{err}");
        let dir = std::env::temp_dir().join(format!("sc-metrics-bad-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("b")).unwrap();
        let (_, source) = write_pair(&dir, "a");
        let (_, other) = write_pair(&dir.join("b"), "b");
        // A key that is not the certificate's.
        if let (CertSource::Files { cert, .. }, CertSource::Files { key, .. }) = (&source, &other) {
            let mismatched = CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            };
            let err = server_config(&mismatched).unwrap_err().to_string();
            assert!(err.contains("certificate and key"), "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_self_signed_certificate_is_made_without_files() {
        server_config(&CertSource::SelfSigned {
            hosts: vec!["localhost".into(), "127.0.0.1".into()],
        })
        .unwrap();
    }
}
