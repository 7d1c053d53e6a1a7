//! TLS material for the backends: reading PEM files named by settings, and the rustls client
//! configurations the Postgres `sslmode` variants need. Redis builds its own rustls config
//! inside the `redis` crate from the same PEM bytes (see `infra::redis`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting}: cannot read {path}: {source}")]
    Read {
        setting: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{setting}: {path} holds no usable PEM certificate")]
    NoCertificate {
        setting: &'static str,
        path: PathBuf,
    },
    #[error("{setting}: {path} holds no usable PEM private key")]
    NoKey {
        setting: &'static str,
        path: PathBuf,
    },
    #[error("{setting}: {path}: {source}")]
    BadCertificate {
        setting: &'static str,
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
    #[error("{0}")]
    Verifier(#[from] rustls::client::VerifierBuilderError),
}

/// A PEM file's bytes, with errors that name the setting it came from.
pub(crate) fn read_pem(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting,
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file (at least one), as rustls wants them.
pub(crate) fn certificates(
    setting: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read_pem(setting, path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            setting,
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

/// Checks a PEM key file parses, so a wrong path fails at startup with the setting's name
/// rather than at the first connection with the library's words.
pub(crate) fn check_private_key(setting: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read_pem(setting, path)?;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(&pem).map_err(|_| TlsError::NoKey {
        setting,
        path: path.to_owned(),
    })?;
    Ok(pem)
}

/// The trust anchors for server verification: the given CA file, or webpki's bundled
/// Mozilla roots when none is given (public managed databases use public CAs).
pub(crate) fn root_store(
    setting: &'static str,
    ca_file: Option<&Path>,
) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in certificates(setting, path)? {
                roots.add(cert).map_err(|source| TlsError::BadCertificate {
                    setting,
                    path: path.to_owned(),
                    source,
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    Ok(roots)
}

/// How much of the server's certificate a client checks, as libpq's `sslmode` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verification {
    /// Encrypt, authenticate nobody (libpq `require` without a root certificate).
    None,
    /// The chain must lead to a trusted CA; the host name is not compared (`verify-ca`).
    Chain,
    /// Chain and host name (`verify-full`, and what every HTTPS client does).
    Full,
}

/// A rustls client configuration verifying the server as `verification` says.
pub(crate) fn client_config(
    verification: Verification,
    roots: RootCertStore,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match verification {
        Verification::Full => builder.with_root_certificates(roots).with_no_client_auth(),
        Verification::Chain => {
            let inner =
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build()?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                .with_no_client_auth()
        }
        Verification::None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth(),
    };
    Ok(config)
}

/// ring: the one backend compiled in (reqwest and lettre use it too), named explicitly so
/// no process-wide default has to be installed first.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `verify-ca`: the full webpki chain check, with a host-name mismatch forgiven.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            // webpki checks the name only after the chain, so this error means the chain is good.
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
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require` without a CA: any certificate is accepted (libpq's meaning: encryption against
/// passive eavesdropping, no protection against an active man in the middle). The handshake
/// signatures are still checked so the session keys belong to whoever holds the certificate.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
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
