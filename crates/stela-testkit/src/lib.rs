//! Helpers that tests of several crates share: a self-signed certificate written to files, and
//! a log directory's segment files read whole (to compare a standby's copy with its primary's
//! byte for byte). Only ever a dev-dependency; it depends on no stela crate, so any of them may
//! use it.

use std::path::{Path, PathBuf};

/// A self-signed certificate for `localhost` and `127.0.0.1`, its key, and where both were
/// written.
pub struct SelfSigned {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Writes `DIR/NAME.pem` and `DIR/NAME.key`: a certificate whose common name is `name`, valid
/// for `localhost` and `127.0.0.1`. It is its own CA, so a peer trusts it by naming the
/// certificate file as its CA.
///
/// # Panics
/// The key cannot be generated or the files written (a test's own environment is broken).
pub fn self_signed(dir: &Path, name: &str) -> SelfSigned {
    let key = rcgen::KeyPair::generate().expect("a key pair");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("certificate names");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("a self-signed certificate");
    let (cert_path, key_path) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&cert_path, cert.pem()).expect("write the certificate");
    std::fs::write(&key_path, key.serialize_pem()).expect("write the key");
    SelfSigned {
        cert: cert_path,
        key: key_path,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Every segment file (`*.wal`) of the log directory `dir`, by name, with its whole contents,
/// sorted by name.
///
/// # Panics
/// The directory or a file cannot be read.
pub fn segment_files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry"))
        .filter(|entry| entry.file_name().to_string_lossy().ends_with(".wal"))
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                std::fs::read(entry.path())
                    .unwrap_or_else(|e| panic!("reading {}: {e}", entry.path().display())),
            )
        })
        .collect();
    files.sort();
    files
}
