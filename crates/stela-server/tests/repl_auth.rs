//! Who may ship to a standby over plain TCP (issue 54, finding 4): any local user could connect
//! to a loopback `--repl-listen`, open a log with a huge term, and the real primary's next
//! stream for that log was refused as stale ("the standby refused term 1"): its `replicated`
//! commits fenced. A plain stream is now taken only from a loopback peer owned by the daemon's
//! own user, from a peer sending one of its admin tokens, or under `--repl-insecure`.

mod common;

use common::{rec, NoHang, RawClient, TYPE_TAG};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use stela_proto::repl::ReplMessage;
use stela_proto::Durability;
use stela_server::{DaemonConfig, Server};

fn config(dir: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(100 << 20);
    config.spin = Duration::ZERO;
    config
}

fn standby(dir: &Path, admin_tokens: Option<&Path>) -> NoHang {
    let mut config = config(dir);
    config.repl_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.node = "standby".into();
    config.admin_token_file = admin_tokens.map(Path::to_owned);
    NoHang::new(Server::start(config).expect("the standby starts"))
}

/// An `Open` of `log` claiming `term`, framed as a primary sends it.
fn open_frame(log: &str, term: u64, token: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    stela_proto::frame::encode(
        &ReplMessage::Open {
            term,
            node: "intruder".into(),
            log: log.into(),
            codec: "json".into(),
            type_tag: TYPE_TAG.into(),
            token: token.map(str::to_owned),
            history: vec![(term, 1)],
        },
        &mut out,
    )
    .unwrap();
    out
}

/// Sends `frame` to `addr` from a process running as uid and gid 65534 (`nobody`), another
/// local user than the daemon's, and waits until the standby has answered and closed (or 3 s).
fn send_as_another_user(addr: SocketAddr, frame: &[u8]) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test runs a process as another user (setpriv to uid 65534): run it as root"
    );
    let script = format!(
        "exec 3<>/dev/tcp/{}/{} || exit 9; cat >&3; timeout 3 cat <&3 >/dev/null; exit 0",
        addr.ip(),
        addr.port()
    );
    let mut child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "bash",
            "-c",
        ])
        .arg(script)
        .stdin(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux) and bash run");
    child.stdin.take().unwrap().write_all(frame).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "the other user's connection: {status}");
}

/// A local process of another user opens the log a primary is about to ship with a term far
/// above any real one. The standby refuses it before it records anything, and the real primary
/// then ships that log and has its `replicated` commits acknowledged. On the code before this
/// change the standby adopted the intruder's term durably, refused the primary's stream as
/// stale, and the primary's `replicated` commit failed.
#[test]
fn another_local_user_cannot_poison_a_log_s_term_on_plain_replication() {
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby = standby(&s_dir, None);
    let repl = standby.repl_addr().expect("listening");
    send_as_another_user(repl, &open_frame("ledger", (1 << 40) | 7, None));

    let mut primary_config = config(&p_dir);
    primary_config.standby = Some(repl);
    primary_config.node = "primary".into();
    let primary = NoHang::new(Server::start(primary_config).expect("the primary starts"));
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("ledger");
    for seq in 1..=3 {
        client
            .append(handle, Durability::Replicated, &[rec(1, seq, 64)])
            .unwrap_or_else(|e| panic!("replicated commit {seq} after the intruder: {e:?}"));
    }
    drop(client);
    primary.shutdown().expect("primary stops cleanly");
    standby.shutdown().expect("standby stops cleanly");
    let terms = stela_wal::TermStore::open(
        std::sync::Arc::new(stela_wal::storage::StdStorage),
        &s_dir.join("logs/ledger"),
    )
    .expect("the standby's copy has its terms");
    assert!(
        terms.current().0 < 1 << 40,
        "the standby's copy took the intruder's term: {:?}",
        terms.current()
    );
}

/// On plain TCP a token, when sent, decides, whoever sends it: a wrong one is refused (even
/// from the daemon's own user), one of the standby's admin tokens is accepted (even from
/// another user).
#[test]
fn on_plain_replication_a_token_decides() {
    let root = tempfile::tempdir().unwrap();
    let tokens = root.path().join("admin-tokens");
    stela_testkit::write_secret(&tokens, "replication-admin-0123456789\n");
    let s_dir = root.path().join("s");
    let standby = standby(&s_dir, Some(&tokens));
    let repl = standby.repl_addr().expect("listening");

    let first_answer = |frame: &[u8]| -> ReplMessage {
        let mut socket = std::net::TcpStream::connect(repl).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        socket.write_all(frame).unwrap();
        let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
        socket.read_exact(&mut header).unwrap();
        let parsed = stela_proto::frame::parse_header(header, 1 << 20).unwrap();
        let mut body = vec![0u8; parsed.body_len];
        socket.read_exact(&mut body).unwrap();
        stela_proto::frame::decode_body(parsed, &body).unwrap()
    };
    match first_answer(&open_frame("wrong", 5, Some("replication-admin-012345678"))) {
        ReplMessage::Refuse { message, .. } => assert!(
            message.contains("not authenticated"),
            "refused for another reason: {message}"
        ),
        other => panic!("a wrong token was answered {other:?}"),
    }
    assert!(!s_dir.join("logs/wrong").exists());
    match first_answer(&open_frame(
        "right",
        5,
        Some("replication-admin-0123456789"),
    )) {
        ReplMessage::Position { .. } => {}
        other => panic!("an admin token was answered {other:?}"),
    }
    // Another user with the token is a primary too: the log is created and takes its term.
    send_as_another_user(
        repl,
        &open_frame("theirs", 9, Some("replication-admin-0123456789")),
    );
    assert!(s_dir.join("logs/theirs").exists(), "the token was refused");
    standby.shutdown().expect("standby stops cleanly");
}

/// A primary sends its `--standby-token-file` token on plain TCP too, and the standby checks
/// it: with a token the standby does not hold, the primary's `replicated` commits are not
/// acknowledged (here answered `Unprotected` once the standby counts as unreachable), although
/// the same primary without a token would be taken as the daemon's own user on loopback.
#[test]
fn a_primary_s_token_is_checked_on_plain_replication() {
    let root = tempfile::tempdir().unwrap();
    let (tokens, wrong) = (root.path().join("admin"), root.path().join("wrong"));
    stela_testkit::write_secret(&tokens, "replication-admin-0123456789\n");
    stela_testkit::write_secret(&wrong, "replication-admin-9876543210\n");
    let standby = standby(&root.path().join("s"), Some(&tokens));
    let repl = standby.repl_addr().expect("listening");
    let primary_with = |dir: &str, token: &Path| {
        let mut config = config(&root.path().join(dir));
        config.standby = Some(repl);
        config.node = "primary".into();
        config.standby_token_file = Some(token.to_owned());
        config.degrade_after = Some(Duration::from_millis(300));
        NoHang::new(Server::start(config).expect("a primary starts"))
    };
    let good = primary_with("good", &tokens);
    let mut client = RawClient::connect(good.socket_path());
    let handle = client.open("good");
    client
        .append(handle, Durability::Replicated, &[rec(1, 1, 64)])
        .expect("replicated with the standby's token");
    drop(client);
    good.shutdown().unwrap();

    let bad = primary_with("bad", &wrong);
    let mut client = RawClient::connect(bad.socket_path());
    let handle = client.open("bad");
    let answer = client.append(handle, Durability::Replicated, &[rec(1, 1, 64)]);
    assert!(
        answer.is_err(),
        "a primary with a wrong token had its replicated commit acknowledged"
    );
    drop(client);
    bad.shutdown().unwrap();
    standby.shutdown().expect("standby stops cleanly");
}
