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

/// A single-node etcd (Debian's `etcd-server`) on free loopback ports in a temporary
/// directory, killed when dropped.
pub struct Etcd {
    child: std::process::Child,
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub client_url: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    /// Starts it; the caller waits until it answers.
    ///
    /// # Panics
    /// There is no `etcd` binary (the message says what to install), or it cannot be started.
    pub fn start() -> Etcd {
        let binary = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| {
                panic!("no etcd binary: install Debian's etcd-server (apt-get install etcd-server)")
            });
        let dir = tempfile::tempdir().expect("a temporary directory");
        let free_port = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port()
        };
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = std::process::Command::new(binary)
            .arg("--name")
            .arg("default")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start etcd");
        Etcd {
            child,
            client_url,
            _dir: dir,
        }
    }

    /// The URL a daemon takes: `etcd://127.0.0.1:PORT`.
    pub fn coordinator_url(&self) -> String {
        self.client_url.replace("http://", "etcd://")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `condition` every millisecond until it holds; panics naming `what` if it does not
/// within `within` (a test waiting on another thread or process fails instead of hanging).
pub fn eventually(what: &str, within: std::time::Duration, mut condition: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + within;
    while !condition() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
