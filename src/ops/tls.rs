//! The gRPC listener's TLS material: the server certificate and key, and
//! for mTLS the CAs a client certificate must chain to, read from PEM files
//! ([`TlsFiles`]) into a rustls configuration.
//!
//! [`ServerTls`] holds the configuration in force. The accept loop takes a
//! snapshot of it for every new connection, so a reload (SIGHUP,
//! [`ServerTls::reload`]) changes what new connections are served with and
//! leaves the open ones as they are: nothing is dropped. A reload whose
//! files do not load keeps the configuration in force.
//!
//! [`peer_certificate`] reads what auth needs from a verified client
//! certificate: its subject (RFC 4514) and URI SANs (SPIFFE IDs).

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls;
use tokio_rustls::rustls::server::WebPkiClientVerifier;

use crate::domain::policy::{PeerCertificate, TlsFiles};

/// Why TLS material did not load; names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {reason}")]
    File {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("tls configuration: {0}")]
    Config(String),
}

/// The TLS configuration in force, and the files it is read from; a cheap
/// clone handle.
#[derive(Debug, Clone)]
pub struct ServerTls {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    files: TlsFiles,
    // A std RwLock: readers (one per accepted connection) only clone an
    // Arc inside it, and nobody holds it across an await.
    current: RwLock<Arc<rustls::ServerConfig>>,
}

impl ServerTls {
    /// Reads `files`; fails, naming the file, when one does not load.
    pub fn load(files: TlsFiles) -> Result<ServerTls, TlsError> {
        let config = server_config(&files)?;
        Ok(ServerTls {
            shared: Arc::new(Shared {
                files,
                current: RwLock::new(Arc::new(config)),
            }),
        })
    }

    /// The files this configuration is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.shared.files
    }

    /// Whether clients must show a certificate signed by `client_ca`.
    pub fn mutual(&self) -> bool {
        self.shared.files.client_ca.is_some()
    }

    /// Reads the files again. On success returns the new configuration,
    /// not yet in force ([`ServerTls::install`]); on failure nothing changes.
    pub fn prepare_reload(&self) -> Result<PreparedTls, TlsError> {
        Ok(PreparedTls(Arc::new(server_config(&self.shared.files)?)))
    }

    /// Puts a prepared configuration in force for new connections.
    pub fn install(&self, prepared: PreparedTls) {
        match self.shared.current.write() {
            Ok(mut current) => *current = prepared.0,
            Err(poisoned) => *poisoned.into_inner() = prepared.0,
        }
    }

    /// Reads the files again and puts them in force; keeps the old
    /// configuration when they do not load.
    pub fn reload(&self) -> Result<(), TlsError> {
        let prepared = self.prepare_reload()?;
        self.install(prepared);
        Ok(())
    }

    /// The acceptor for a new connection, with the configuration in force.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        let config = match self.shared.current.read() {
            Ok(current) => Arc::clone(&current),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        };
        tokio_rustls::TlsAcceptor::from(config)
    }
}

/// A configuration read by [`ServerTls::prepare_reload`], not yet in force.
#[derive(Debug)]
pub struct PreparedTls(Arc<rustls::ServerConfig>);

fn file_error(what: &'static str, path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate of a PEM file (at least one).
fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| file_error(what, path, error))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(what, path, error))?;
    if certificates.is_empty() {
        return Err(file_error(what, path, "no PEM certificate in the file"));
    }
    Ok(certificates)
}

/// The rustls server configuration of `files` (ring; TLS 1.2 and 1.3; ALPN h2).
fn server_config(files: &TlsFiles) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("tls certificate", &files.cert)?;
    // The key's own error never quotes the file's contents.
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|error| file_error("tls key", &files.key, error))?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| TlsError::Config(error.to_string()))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates("tls client CA", path)? {
                roots
                    .add(certificate)
                    .map_err(|error| file_error("tls client CA", path, error))?;
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
                    .build()
                    .map_err(|error| file_error("tls client CA", path, error))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|error| {
        let path = format!("{} and {}", files.cert.display(), files.key.display());
        file_error("tls certificate and key", Path::new(&path), error)
    })?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The subject and URI SANs of a (verified) peer certificate; `None` when
/// it does not parse.
pub fn peer_certificate(der: &[u8]) -> Option<PeerCertificate> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = rfc4514(certificate.subject());
    let mut uris = Vec::new();
    if let Ok(Some(names)) = certificate.subject_alternative_name() {
        for name in &names.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                uris.push((*uri).to_string());
            }
        }
    }
    Some(PeerCertificate { subject, uris })
}

/// A distinguished name as RFC 4514 writes it: the last RDN first, `,`
/// between RDNs, `+` inside one, short names (CN, O, OU, …) where known,
/// special characters escaped. The same as
/// `openssl x509 -noout -subject -nameopt RFC2253` prints.
fn rfc4514(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let rdns: Vec<String> = name
        .iter_rdn()
        .map(|rdn| {
            rdn.iter()
                .map(|attribute| {
                    let key = x509_parser::objects::oid2abbrev(attribute.attr_type(), registry)
                        .map(str::to_string)
                        .unwrap_or_else(|_| attribute.attr_type().to_id_string());
                    let value = attribute.as_str().map(escape).unwrap_or_else(|_| {
                        format!("#{}", hex::encode(attribute.attr_value().data))
                    });
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// RFC 4514 §2.4 escaping of an attribute value.
fn escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (index, character) in value.chars().enumerate() {
        let special = matches!(character, '"' | '+' | ',' | ';' | '<' | '>' | '\\')
            || (index == 0 && matches!(character, '#' | ' '))
            || (index == last && character == ' ');
        if special {
            escaped.push('\\');
        }
        escaped.push(character);
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_certificate_reads_its_subject_as_rfc4514_and_its_uri_sans() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "Acme, Inc.");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "host-a");
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://example.org/host/a".try_into().expect("ia5"),
        ));
        let key = rcgen::KeyPair::generate().expect("key");
        let certificate = params.self_signed(&key).expect("certificate");
        let peer = peer_certificate(certificate.der()).expect("parses");
        // rcgen writes CN first; RFC 4514 prints the last RDN first, as
        // `openssl x509 -noout -subject -nameopt RFC2253` does.
        assert_eq!(peer.subject, "O=Acme\\, Inc.,CN=host-a");
        assert_eq!(peer.uris, vec!["spiffe://example.org/host/a".to_string()]);
    }
}
