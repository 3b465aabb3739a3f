//! rustls client configurations for the three verifying levels of `sslmode`.
//!
//! tokio-postgres only knows disable / prefer / require and leaves verification to the TLS
//! connector, so the libpq levels are expressed here as rustls certificate verifiers.

use crate::{Error, Result};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ClientConfig, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::backstop::config::SslMode;

/// The TLS configuration for `mode`, or `None` for plain TCP.
pub(crate) fn client_config(
    mode: SslMode,
    roots: &[CertificateDer<'static>],
) -> Result<Option<ClientConfig>> {
    // ring, like the rest of the process (kube's rustls); never the process-wide default, which
    // may not be installed.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::BackstopConfig(format!("TLS: {e}")))?;
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::Prefer | SslMode::Require => Arc::new(NoVerification { algorithms }),
        SslMode::VerifyCa => Arc::new(ChainOnly {
            inner: webpki_verifier(root_store(roots)?, provider)?,
        }),
        SslMode::VerifyFull => {
            let store = if roots.is_empty() {
                system_roots()?
            } else {
                root_store(roots)?
            };
            webpki_verifier(store, provider)?
        }
    };
    Ok(Some(
        builder
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth(),
    ))
}

fn root_store(roots: &[CertificateDer<'static>]) -> Result<RootCertStore> {
    let mut store = RootCertStore::empty();
    for cert in roots {
        store
            .add(cert.clone())
            .map_err(|e| Error::BackstopConfig(format!("sslrootcert: {e}")))?;
    }
    Ok(store)
}

fn system_roots() -> Result<RootCertStore> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (_added, _ignored) = store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        return Err(Error::BackstopConfig(
            "sslmode verify-full without sslrootcert needs system CA certificates, and none were found"
                .into(),
        ));
    }
    Ok(store)
}

fn webpki_verifier(
    store: RootCertStore,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map_err(|e| Error::BackstopConfig(format!("TLS verifier: {e}")))
}

/// `require`: encrypt, accept any certificate (libpq's behaviour without a root certificate).
/// The handshake signature is still checked, so the peer holds the key of the certificate it
/// showed; only who that is goes unchecked.
#[derive(Debug)]
struct NoVerification {
    algorithms: WebPkiSupportedAlgorithms,
}

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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not checked. webpki checks the
/// chain before the name, so a name mismatch means the chain was good.
#[derive(Debug)]
struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
