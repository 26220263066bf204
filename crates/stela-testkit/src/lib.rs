//! Helpers that tests of several crates share: a self-signed certificate written to files, a
//! log directory's segment files read whole (to compare a standby's copy with its primary's
//! byte for byte), free loopback ports, and crash tests' child processes ([`child`]). Only ever
//! a dev-dependency; it depends on no stela crate, so any of them may use it.

pub mod child;
#[cfg(feature = "powercut")]
pub mod powercut;

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
    write_secret(&key_path, key.serialize_pem());
    SelfSigned {
        cert: cert_path,
        key: key_path,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// Writes a secret (a key, a token file) as the daemon and the client accept it: mode 0600,
/// its owner's alone, also when the file existed with another mode.
///
/// # Panics
/// The file cannot be written.
pub fn write_secret(path: &Path, contents: impl AsRef<[u8]>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod 600 {}: {e}", path.display()));
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

/// A loopback TCP port that is free now, below the kernel's ephemeral range (32768 and up by
/// default) and different from every other this process was given. Tests start daemons on
/// such ports, and restart them on the same ones seconds later: a port the kernel handed out
/// for `127.0.0.1:0` could meanwhile be the source port of one of the many connections the
/// tests make (CI once failed a daemon's restart on "Address already in use" that way), and two
/// picks of `:0` in a row could in principle get the same port.
///
/// # Panics
/// No port in the range can be bound.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    // Each test process starts at a random place in the range, so that processes running at
    // the same time rarely try the same ports; within one, the ports are handed out in turn.
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = *START.get_or_init(|| {
        let hasher = std::collections::hash_map::RandomState::new().build_hasher();
        (hasher.finish() % u64::from(COUNT)) as u32
    });
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (FIRST + (start + n) % COUNT) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + COUNT);
}

/// `127.0.0.1` on a [`free_port`].
pub fn free_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
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

/// Every entry under `top` (not `top` itself), depth first, with its metadata as
/// `symlink_metadata` gives it: links are listed, never followed.
///
/// # Panics
/// A directory cannot be read (the test's own tree is broken).
pub fn tree_entries(top: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut out = Vec::new();
    let mut pending = vec![top.to_owned()];
    while let Some(dir) = pending.pop() {
        let listing =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for entry in listing {
            let path = entry.expect("a directory entry").path();
            let meta = std::fs::symlink_metadata(&path)
                .unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
            if meta.is_dir() {
                pending.push(path.clone());
            }
            out.push((path, meta));
        }
    }
    out
}
