//! systemd integration: `stela serve` tells `$NOTIFY_SOCKET` it is ready once its socket
//! listens (Type=notify), with its pid, and that it is stopping on SIGTERM; the shipped unit
//! (contrib/systemd/stela.service) runs it that way, as its own user, with the socket's group.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn serve_notifies_systemd_when_ready_and_when_stopping() {
    let base = tempfile::tempdir().unwrap();
    let notify = base.path().join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let dir = base.path().join("d");
    let mut child = Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(["serve", "--assume-write-rate", "100000000", "--dir"])
        .arg(&dir)
        .env("NOTIFY_SOCKET", &notify)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut message = [0u8; 256];
    let n = listener.recv(&mut message).expect("no READY=1 within 30 s");
    let ready = String::from_utf8_lossy(&message[..n]).into_owned();
    assert_eq!(ready, format!("READY=1\nMAINPID={}", child.id()));
    // Ready means the socket answers.
    assert!(std::os::unix::net::UnixStream::connect(dir.join("stela.sock")).is_ok());
    unsafe {
        // SAFETY: signalling our own child process by its pid.
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let n = listener.recv(&mut message).expect("no STOPPING=1");
    assert_eq!(&message[..n], b"STOPPING=1");
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_shipped_unit_runs_serve_as_notify_with_its_own_user_and_group() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/systemd/stela.service"
    ))
    .unwrap();
    for line in [
        "Type=notify",
        "User=stela",
        "Group=stela",
        "LimitNOFILE=65536",
        "AmbientCapabilities=CAP_SYS_NICE",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "{line} missing from the unit"
        );
    }
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    for arg in [
        "--socket-group stela",
        "--socket-mode 660",
        "--assume-write-rate",
    ] {
        assert!(exec.contains(arg), "ExecStart lacks {arg}: {exec}");
    }
    // The flags parse: the same command line with --help instead of running.
    let args: Vec<&str> = exec.split_whitespace().skip(1).collect();
    let mut check = Command::new(env!("CARGO_BIN_EXE_stela"));
    check.args(&args).arg("--help");
    assert!(check.output().unwrap().status.success(), "{exec}");
    if let Ok(out) = Command::new("systemd-analyze").arg("--version").output() {
        if out.status.success() {
            let copy = tempfile::tempdir().unwrap();
            let path = copy.path().join("stela.service");
            std::fs::write(
                &path,
                unit.replace("/usr/bin/stela", env!("CARGO_BIN_EXE_stela")),
            )
            .unwrap();
            let verify = Command::new("systemd-analyze")
                .arg("verify")
                .arg(&path)
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&verify.stderr);
            // Outside a booted systemd the user may not exist here: only that is forgiven.
            assert!(
                verify.status.success()
                    || said
                        .lines()
                        .all(|l| l.contains("stela") && l.contains("user")),
                "systemd-analyze verify: {said}"
            );
        }
    }
}
