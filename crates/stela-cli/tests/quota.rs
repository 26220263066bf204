//! Per-credential quotas (issue 54, finding 6: a TCP client could create logs until the disk
//! was full), on a real daemon process over TLS with two client tokens and an admin token:
//! `--quota-logs` refuses a credential's creation past its count with `QuotaExceeded` and leaves
//! no directory behind; `--quota-bytes` refuses an append past its bytes (charged to the log's
//! owner, whoever appends) and places nothing; another credential and administrators are not
//! held by it; deletion and truncation give back; all of it holds across a restart (the owner
//! is read back from the log's `OWNER` file).

mod common;

use common::Daemon;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use stela_client::{Address, Durability, ErrorCode, TlsTarget, Wal, WalOptions};

const ALICE: &str = "alice-token-3c9e1b7f20a4d865";
const BOB: &str = "bob-token-71f0c2d9e4b8a536";
const ADMIN: &str = "admin-token-0b6d8e2f4a1c9735";

struct Setup {
    _temp: tempfile::TempDir,
    dir: PathBuf,
    cert: stela_testkit::SelfSigned,
    tokens: PathBuf,
    admin_tokens: PathBuf,
    token_files: [PathBuf; 3],
}

fn setup() -> Setup {
    let temp = tempfile::tempdir().unwrap();
    let pki = temp.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let cert = stela_testkit::self_signed(&pki, "daemon");
    let tokens = pki.join("client.tokens");
    let admin_tokens = pki.join("admin.tokens");
    stela_testkit::write_secret(&tokens, format!("{ALICE}\n{BOB}\n"));
    stela_testkit::write_secret(&admin_tokens, format!("{ADMIN}\n"));
    let token_files = [ALICE, BOB, ADMIN].map(|token| {
        let path = pki.join(format!("{}.token", &token[..4]));
        stela_testkit::write_secret(&path, format!("{token}\n"));
        path
    });
    Setup {
        dir: temp.path().join("daemon"),
        _temp: temp,
        cert,
        tokens,
        admin_tokens,
        token_files,
    }
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Two logs and 256 KiB of records per client credential; 64 KiB segments, so that a
/// truncation has sealed segments to remove.
fn start(setup: &Setup) -> (Daemon, u16) {
    let mut daemon = Daemon::start(
        &setup.dir,
        &[
            "--tcp",
            "127.0.0.1:0",
            "--tls-cert",
            s(&setup.cert.cert),
            "--tls-key",
            s(&setup.cert.key),
            "--token-file",
            s(&setup.tokens),
            "--admin-token-file",
            s(&setup.admin_tokens),
            "--segment-size",
            "64KiB",
            "--quota-logs",
            "2",
            "--quota-bytes",
            "256KiB",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        let output = daemon.output();
        if let Some(addr) = output
            .lines()
            .find_map(|l| l.strip_prefix("stela serve: listening on tcp://"))
        {
            break addr.trim().rsplit_once(':').unwrap().1.parse().unwrap();
        }
        daemon.assert_alive("before printing its TCP address");
        assert!(Instant::now() < deadline, "no TCP address in:\n{output}");
        std::thread::sleep(Duration::from_millis(10));
    };
    (daemon, port)
}

/// Who: 0 alice, 1 bob, 2 the administrator.
fn open(setup: &Setup, port: u16, who: usize, log: &str) -> stela_client::Result<Wal<Vec<u8>>> {
    let target = TlsTarget::new(&format!("tls://localhost:{port}"), &setup.cert.cert)
        .unwrap()
        .token_file(&setup.token_files[who]);
    Wal::open(
        Address::Tls(Box::new(target)),
        log,
        WalOptions::default().durability(Durability::Disk),
    )
}

fn code<T: std::fmt::Debug>(result: &stela_client::Result<T>) -> Option<ErrorCode> {
    result.as_ref().err().and_then(|e| e.code())
}

/// Appends 1 KiB records until the daemon refuses one; returns how many were taken and the
/// refusal's message.
fn fill(wal: &Wal<Vec<u8>>) -> (usize, String) {
    for taken in 0..10_000 {
        match wal.append(&vec![b'x'; 1024]) {
            Ok(lsn) => wal.commit(lsn).unwrap(),
            Err(error) => {
                assert_eq!(error.code(), Some(ErrorCode::QuotaExceeded), "{error}");
                return (taken, error.to_string());
            }
        }
    }
    panic!("10,000 KiB appended under a 256 KiB quota");
}

#[test]
fn a_credential_is_held_to_its_logs_and_bytes_and_nobody_else_is() {
    let setup = setup();
    let (daemon, port) = start(&setup);
    let a1 = open(&setup, port, 0, "a1").unwrap();
    let _a2 = open(&setup, port, 0, "a2").unwrap();
    let third = open(&setup, port, 0, "a3");
    assert_eq!(code(&third), Some(ErrorCode::QuotaExceeded), "{third:?}");
    let message = third.unwrap_err().to_string();
    assert!(
        message.contains("token:") && message.contains("--quota-logs"),
        "{message}"
    );
    assert!(
        !message.contains(ALICE),
        "the token itself is never told: {message}"
    );
    assert!(
        !setup.dir.join("logs/a3").exists(),
        "a refused creation left its directory behind"
    );
    // Another credential has its own count; an administrator has none.
    let b1 = open(&setup, port, 1, "b1").unwrap();
    for log in ["admin1", "admin2", "admin3"] {
        open(&setup, port, 2, log).unwrap();
    }

    // Bytes: alice fills her quota; the refused append placed nothing.
    let (taken, message) = fill(&a1);
    assert!(
        (200..256).contains(&taken),
        "{taken} KiB records under 256 KiB"
    );
    assert!(message.contains("--quota-bytes"), "{message}");
    let last = a1.last_lsn().unwrap();
    assert_eq!(last.get(), taken as u64, "a refused append took no LSN");
    // Bob appending to alice's log is charged to her, and refused; his own log is his.
    let bob_on_a1 = open(&setup, port, 1, "a1").unwrap();
    assert_eq!(
        code(&bob_on_a1.append(&vec![b'y'; 1024])),
        Some(ErrorCode::QuotaExceeded)
    );
    let lsn = b1.append(&vec![b'z'; 1024]).unwrap();
    b1.commit(lsn).unwrap();
    drop(bob_on_a1);

    // A truncation gives the removed segments' bytes back.
    let admin_a1 = open(&setup, port, 2, "a1").unwrap();
    let removed = admin_a1.truncate_before(last).unwrap();
    assert!(removed >= 2, "{removed} segments removed");
    let lsn = a1.append(&vec![b'x'; 1024]).unwrap();
    a1.commit(lsn).unwrap();
    let (more, _) = fill(&a1);
    assert!(more > 100, "only {more} KiB more after the truncation");
    drop((a1, admin_a1, b1, _a2));
    daemon.terminate();

    // After a restart the owners and their bytes are read back.
    let (daemon, port) = start(&setup);
    assert_eq!(
        code(&open(&setup, port, 0, "a3")),
        Some(ErrorCode::QuotaExceeded)
    );
    let a1 = open(&setup, port, 0, "a1").unwrap();
    assert_eq!(
        code(&a1.append(&vec![b'x'; 1024])),
        Some(ErrorCode::QuotaExceeded)
    );
    drop(a1);
    // Deleting one of alice's logs (an administrator's request) lets her create one again.
    let mut admin =
        stela_client::Connection::connect_admin(&Address::Unix(daemon.socket())).unwrap();
    admin
        .request(stela_proto::RequestBody::DeleteLog { log: "a2".into() })
        .unwrap();
    open(&setup, port, 0, "a3").unwrap();
    assert!(setup.dir.join("logs/a3/OWNER").exists());
    daemon.terminate();
}
