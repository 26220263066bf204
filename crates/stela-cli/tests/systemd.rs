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

/// `WatchdogSec=`: systemd sets WATCHDOG_USEC (and WATCHDOG_PID); the daemon pings
/// `WATCHDOG=1` once its event loop has answered on its socket, a third of the interval apart.
/// Without the variables it sends no ping.
#[test]
fn serve_pings_the_watchdog_only_when_systemd_asks() {
    for watchdog in [true, false] {
        let base = tempfile::tempdir().unwrap();
        let notify = base.path().join("notify.sock");
        let listener = UnixDatagram::bind(&notify).unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let dir = base.path().join("d");
        let mut command = Command::new(env!("CARGO_BIN_EXE_stela"));
        command
            .args(["serve", "--assume-write-rate", "100MB", "--dir"])
            .arg(&dir)
            .env("NOTIFY_SOCKET", &notify)
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if watchdog {
            command.env("WATCHDOG_USEC", "300000");
        }
        let mut child = command.spawn().unwrap();
        let mut message = [0u8; 256];
        let n = listener.recv(&mut message).expect("no READY=1");
        assert!(message[..n].starts_with(b"READY=1"));
        // Over a second: three or more pings at 100 ms with the watchdog, none without.
        listener
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let until = std::time::Instant::now() + Duration::from_millis(1200);
        let mut pings = 0;
        while std::time::Instant::now() < until {
            if let Ok(n) = listener.recv(&mut message) {
                assert_eq!(&message[..n], b"WATCHDOG=1");
                pings += 1;
            }
        }
        unsafe {
            // SAFETY: signalling our own child process by its pid.
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        assert!(child.wait().unwrap().success());
        if watchdog {
            assert!(pings >= 3, "{pings} watchdog pings in 1.2 s at 100 ms");
        } else {
            assert_eq!(pings, 0, "pings without WATCHDOG_USEC");
        }
    }
}

/// The shipped unit: notify with the watchdog, its own user and group, settings from
/// /etc/stela/stela.toml (the shipped example parses), `systemctl reload` as SIGHUP, private
/// files, and hardening that `systemd-analyze security` scores at most 3.0 (OK) while the
/// event loop keeps CAP_SYS_NICE and realtime scheduling.
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
        "CapabilityBoundingSet=CAP_SYS_NICE",
        "ExecStart=/usr/bin/stela serve --config /etc/stela/stela.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "UMask=0077",
        "WatchdogSec=30s",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "{line} missing from the unit"
        );
    }
    // What would break the daemon: realtime refused, or its capability made useless.
    for line in ["RestrictRealtime=yes", "PrivateUsers=yes"] {
        assert!(!unit.lines().any(|l| l == line), "{line} in the unit");
    }
    // The shipped settings file parses, and says what the old command line said.
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../contrib/systemd/stela.toml"
    );
    let printed = Command::new(env!("CARGO_BIN_EXE_stela"))
        .args(["serve", "--config", file, "--print-config"])
        .output()
        .unwrap();
    let settings = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.status.success(),
        "{settings}{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    for setting in [
        "dir = \"/var/lib/stela\"",
        "socket = \"/run/stela/stela.sock\"",
        "socket-group = \"stela\"",
        "socket-mode = \"660\"",
        "assume-write-rate = \"200MB\"",
    ] {
        assert!(
            settings.lines().any(|l| l == setting),
            "{setting}: {settings}"
        );
    }
    let copy = tempfile::tempdir().unwrap();
    let path = copy.path().join("stela.service");
    std::fs::write(
        &path,
        unit.replace("/usr/bin/stela", env!("CARGO_BIN_EXE_stela")),
    )
    .unwrap();
    let analyze = |args: &[&str]| {
        Command::new("systemd-analyze")
            .args(args)
            .arg(&path)
            .output()
            .unwrap_or_else(|e| {
                panic!("systemd-analyze cannot run ({e}): install systemd (./test does)")
            })
    };
    let verify = analyze(&["verify"]);
    let said = String::from_utf8_lossy(&verify.stderr);
    // Outside a booted systemd the user may not exist here: only that is forgiven.
    assert!(
        verify.status.success()
            || said
                .lines()
                .all(|l| l.contains("stela") && l.contains("user")),
        "systemd-analyze verify: {said}"
    );
    let security = analyze(&["security", "--offline=true"]);
    let report = String::from_utf8_lossy(&security.stdout);
    let exposure: f64 = report
        .lines()
        .find_map(|l| l.split("Overall exposure level for stela.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no exposure level in:\n{report}{}",
                String::from_utf8_lossy(&security.stderr)
            )
        });
    assert!(exposure <= 3.0, "exposure {exposure} > 3.0:\n{report}");
}
