//! TLS for stela's TCP transport, shared by the daemon, its client, and (later) replication:
//! loading certificates, keys and tokens from files, building rustls configurations, and the
//! checks that turn a handshake into an identity.
//!
//! What it owns: the one place that decides which TLS versions and crypto provider stela uses
//! (rustls' safe defaults, TLS 1.2 and 1.3, the `ring` provider), how PEM files are read, how a
//! client certificate is recognised as an administrator's (one of its DNS subject alternative
//! names is on the configured list) and how shared tokens are compared.
//!
//! Invariants:
//! - **Nothing unauthenticated is trusted.** A client certificate is only ever accepted after
//!   rustls verified its chain against the configured CA; names are read from the verified
//!   end-entity certificate only.
//! - **Tokens are compared in constant time** ([`constant_time_eq`]) against every configured
//!   token (no early exit on the first match), so the time of a refusal says nothing about how
//!   much of a token was right. Only the length of the presented token can leak.
//! - **Every error names its file.** A daemon that cannot read its key says which file.
//! - **A secret is its owner's alone.** A private key or a token file that group or others may
//!   read (or write) is refused ([`TlsError::Exposed`], with its path and mode), at start and at
//!   every reload: a credential anyone on the machine can read proves nothing. As PostgreSQL
//!   does for its key, a file owned by root may also be read (not written) by its group, so
//!   `root:stela 0640` works for a daemon running as a member of `stela`.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use rustls;

/// Shortest token accepted in a token file: anything shorter can be guessed.
pub const MIN_TOKEN_BYTES: usize = 16;

/// What went wrong setting up TLS or reading a credential, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a PEM file of {what}: {message}")]
    Pem {
        path: PathBuf,
        what: &'static str,
        message: String,
    },
    #[error("{path}: holds no {what}")]
    Empty { path: PathBuf, what: &'static str },
    #[error("{path}: {message}")]
    Token { path: PathBuf, message: String },
    #[error("{what}: {source}")]
    Rustls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("client CA {path}: {message}")]
    Verifier { path: PathBuf, message: String },
    #[error("{path}: mode {mode:04o} lets {who} read or change this secret; it must be its owner's alone (chmod 600 {path})")]
    Exposed {
        path: PathBuf,
        mode: u32,
        who: &'static str,
    },
    #[error("{0:?} is not a valid TLS server name (a DNS name or an IP address)")]
    ServerName(String),
}

/// The crypto provider stela uses everywhere.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate of a PEM file (a chain: the end entity first).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |e: rustls::pki_types::pem::Error| pem_or_read(path, "certificates", e);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_owned(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// Refuses a secret (key, token file) that others than its owner may read or write: any bit
/// for others, and any bit for the group, except group read on a file owned by root.
pub fn check_private(path: &Path) -> Result<(), TlsError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mode = meta.mode() & 0o7777;
    let group_allowed = if meta.uid() == 0 { 0o040 } else { 0 };
    let who = if mode & 0o007 != 0 {
        "others"
    } else if mode & 0o070 & !group_allowed != 0 {
        "its group"
    } else {
        return Ok(());
    };
    Err(TlsError::Exposed {
        path: path.to_owned(),
        mode,
        who,
    })
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1); refused if others may read it
/// ([`check_private`]).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    check_private(path)?;
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_or_read(path, "a private key", e))
}

fn pem_or_read(path: &Path, what: &'static str, error: rustls::pki_types::pem::Error) -> TlsError {
    match error {
        rustls::pki_types::pem::Error::Io(source) => TlsError::Read {
            path: path.to_owned(),
            source,
        },
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            path: path.to_owned(),
            what,
        },
        other => TlsError::Pem {
            path: path.to_owned(),
            what,
            message: other.to_string(),
        },
    }
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            what: format!("CA certificate in {}", path.display()),
            source,
        })?;
    }
    Ok(roots)
}

/// The daemon's side of TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The daemon's certificate chain (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Clients must present a certificate issued by one of these CAs (PEM); `None`: no client
    /// certificates are asked for.
    pub client_ca: Option<PathBuf>,
}

/// The daemon's rustls configuration. With a client CA, a client certificate is verified
/// against it; `certificate_optional` lets a client without one through the handshake (it must
/// then prove itself with a token), while a certificate that does not verify is still refused
/// in the handshake.
pub fn server_config(
    files: &ServerTlsFiles,
    certificate_optional: bool,
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions".into(),
            source,
        })?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider,
            );
            let verifier = if certificate_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| TlsError::Verifier {
                path: ca.clone(),
                message: e.to_string(),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(load_certs(&files.cert)?, load_key(&files.key)?)
        .map_err(|source| TlsError::Rustls {
            what: format!(
                "certificate {} with key {}",
                files.cert.display(),
                files.key.display()
            ),
            source,
        })?;
    Ok(Arc::new(config))
}

/// A client's side of TLS: whom it trusts, and what it proves itself with.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ClientTlsFiles {
    /// The CA(s) the daemon's certificate must chain to (PEM).
    pub ca: PathBuf,
    /// A client certificate chain and its key (PEM), for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// The client's rustls configuration.
pub fn client_config(files: &ClientTlsFiles) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS protocol versions".into(),
            source,
        })?
        .with_root_certificates(roots(&files.ca)?);
    let config = match &files.identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|source| TlsError::Rustls {
                what: format!(
                    "client certificate {} with key {}",
                    cert.display(),
                    key.display()
                ),
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name a client checks the daemon's certificate against.
pub fn server_name(host: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(host.to_owned()).map_err(|_| TlsError::ServerName(host.to_owned()))
}

/// Whether a (verified) client certificate names one of `names` among its DNS subject
/// alternative names (or IP addresses). An unparsable certificate names nothing.
pub fn certificate_names_any(cert: &CertificateDer<'_>, names: &[String]) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    names.iter().any(|name| {
        ServerName::try_from(name.as_str())
            .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
    })
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = (a.len() != b.len()) as u8;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        difference |= std::hint::black_box(x ^ y);
    }
    difference == 0
}

/// The tokens of a token file: one per line; blank lines and lines starting with `#` are
/// skipped; surrounding whitespace is not part of a token. Each must have at least
/// [`MIN_TOKEN_BYTES`] bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct Tokens {
    tokens: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} hidden)", self.tokens.len())
    }
}

impl Tokens {
    /// Reads a token file: one token a line, `#` comments; refused if others may read it
    /// ([`check_private`]) or if a token is shorter than [`MIN_TOKEN_BYTES`].
    pub fn load(path: &Path) -> Result<Tokens, TlsError> {
        check_private(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| TlsError::Read {
            path: path.to_owned(),
            source,
        })?;
        let tokens: Vec<Vec<u8>> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| line.as_bytes().to_vec())
            .collect();
        if tokens.is_empty() {
            return Err(TlsError::Empty {
                path: path.to_owned(),
                what: "token",
            });
        }
        if let Some(short) = tokens.iter().position(|t| t.len() < MIN_TOKEN_BYTES) {
            return Err(TlsError::Token {
                path: path.to_owned(),
                message: format!(
                    "token {} has fewer than {MIN_TOKEN_BYTES} characters",
                    short + 1
                ),
            });
        }
        Ok(Tokens { tokens })
    }

    /// Whether `presented` is one of the tokens. Every token is compared, match or not.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mut any = false;
        for token in &self.tokens {
            any |= constant_time_eq(token, presented);
        }
        any
    }
}

/// The token a client sends: the first token of its token file.
pub fn read_client_token(path: &Path) -> Result<String, TlsError> {
    let tokens = Tokens::load(path)?;
    Ok(String::from_utf8(tokens.tokens[0].clone()).expect("read as text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"abc\0", b"abc"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn token_files_skip_comments_and_refuse_short_tokens() {
        let dir = std::env::temp_dir().join(format!("stela-tokens-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tokens");
        std::fs::write(
            &file,
            "# admins\n\n  0123456789abcdef0123  \nfedcba9876543210fedc\n",
        )
        .unwrap();
        private(&file, 0o600);
        let tokens = Tokens::load(&file).unwrap();
        assert!(tokens.matches(b"0123456789abcdef0123"));
        assert!(tokens.matches(b"fedcba9876543210fedc"));
        assert!(!tokens.matches(b"0123456789abcdef012"));
        assert!(!tokens.matches(b"# admins"));
        assert_eq!(
            read_client_token(&file).unwrap(),
            "0123456789abcdef0123".to_owned()
        );
        std::fs::write(&file, "short\n").unwrap();
        let error = Tokens::load(&file).unwrap_err().to_string();
        assert!(error.contains("fewer than 16"), "{error}");
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(Tokens::load(&file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn private(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Issue 54: a world-readable admin token file was accepted. A secret that others may read
    /// is refused, naming its path and mode; the owner's alone (0600, 0400) is accepted, and
    /// group read only on a file root owns.
    #[test]
    fn secrets_others_may_read_are_refused_with_path_and_mode() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "0123456789abcdef0123\n").unwrap();
        let key_pair = rcgen::KeyPair::generate().unwrap();
        let key = dir.path().join("key.pem");
        std::fs::write(&key, key_pair.serialize_pem()).unwrap();
        let by_root = std::fs::metadata(&tokens).unwrap().uid() == 0;
        for (mode, accepted) in [
            (0o600, true),
            (0o400, true),
            (0o640, by_root),
            (0o660, false),
            (0o604, false),
            (0o644, false),
            (0o602, false),
        ] {
            private(&tokens, mode);
            private(&key, mode);
            let loaded = (Tokens::load(&tokens), load_key(&key));
            let ((Ok(_), Ok(_)) | (Err(_), Err(_))) = &loaded else {
                panic!("token file and key judged differently at {mode:o}");
            };
            assert_eq!(loaded.0.is_ok(), accepted, "token file at {mode:o}");
            if let Err(error) = loaded.0 {
                let text = error.to_string();
                assert!(text.contains(&tokens.display().to_string()), "{text}");
                assert!(text.contains(&format!("{mode:04o}")), "{text}");
                let key_text = loaded.1.unwrap_err().to_string();
                assert!(key_text.contains(&key.display().to_string()), "{key_text}");
            }
        }
    }

    #[test]
    fn admin_names_are_read_from_the_certificate() {
        let key = rcgen::KeyPair::generate().unwrap();
        let params =
            rcgen::CertificateParams::new(vec!["ops-admin".into(), "ops.example".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let der = cert.der().clone();
        assert!(certificate_names_any(&der, &["ops-admin".into()]));
        assert!(certificate_names_any(
            &der,
            &["nobody".into(), "ops.example".into()]
        ));
        assert!(!certificate_names_any(&der, &["nobody".into()]));
        assert!(!certificate_names_any(&der, &[]));
    }
}
