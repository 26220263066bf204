//! A flood of a standby's replication port (issue 54, finding 3), in a test binary of its own:
//! it reads this process's thread count and resident memory, which tests running beside it in
//! one process would change.

mod common;

use common::{rec, NoHang, RawClient};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use stela_proto::Durability;
use stela_server::{DaemonConfig, Server};

fn config(dir: &Path) -> DaemonConfig {
    let mut config = DaemonConfig::new(dir);
    config.assume_write_rate = Some(100 << 20);
    config.spin = Duration::ZERO;
    config
}

fn standby(dir: &Path) -> NoHang {
    let mut config = config(dir);
    config.repl_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.node = "standby".into();
    NoHang::new(Server::start(config).expect("the standby starts"))
}

fn primary(dir: &Path, standby: SocketAddr) -> NoHang {
    let mut config = config(dir);
    config.standby = Some(standby);
    config.node = "primary".into();
    NoHang::new(Server::start(config).expect("the primary starts"))
}

/// This process's threads and resident memory (the standby and the primary run in it).
fn threads_and_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("Threads:"), field("VmRSS:") * 1024)
}

/// This process's threads as the kernel lists them (`/proc/self/task`): sampled often while a
/// flood churns, so that threads that live only a moment are counted too.
fn tasks() -> u64 {
    std::fs::read_dir("/proc/self/task").unwrap().count() as u64
}

/// A flood of the standby's replication port (issue 54, finding 3; the `repl-flood` attack of
/// `stela-bench hostile`): for 3 s, connections that say nothing are made as fast as they can
/// be (300 kept open, the oldest closed), and 30 more announce a 64 MiB `Open` and keep sending
/// its body, while a real primary ships to the standby and a client commits at `replicated`.
/// Connections awaiting their `Open` cost the standby a slot in a bounded table, no thread:
/// the process's thread count, sampled every few milliseconds through the flood, stays within
/// a few of what it was before it, and the commits keep being acknowledged.
///
/// On the code before the table (a thread per connection until its `Open` was read, the
/// oldest of 16 cut when another came) this took the process from 21 to 71 threads (load 12;
/// `stela-bench hostile` saw a standby at 408); with it, 21 to 25 (the test's own three and
/// one).
#[test]
fn a_flood_of_the_replication_port_costs_the_standby_neither_threads_nor_memory() {
    use std::io::Write;
    use std::sync::atomic::{AtomicBool, Ordering};
    let root = tempfile::tempdir().unwrap();
    let (p_dir, s_dir) = (root.path().join("p"), root.path().join("s"));
    let standby = standby(&s_dir);
    let repl = standby.repl_addr().expect("listening");
    let primary = primary(&p_dir, repl);
    let mut client = RawClient::connect(primary.socket_path());
    let handle = client.open("ledger");
    let (_, last) = client
        .append(handle, Durability::Replicated, &[rec(1, 0, 100)])
        .expect("a replicated commit before the flood");
    assert_eq!(last, 1);
    let (_, rss_before) = threads_and_rss();
    let threads_before = tasks();

    let stop = AtomicBool::new(false);
    let (peak, commits, rss) = std::thread::scope(|scope| {
        // Silent connections, as fast as they can be made.
        scope.spawn(|| {
            let mut held = std::collections::VecDeque::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(socket) = std::net::TcpStream::connect(repl) {
                    held.push_back(socket);
                    if held.len() > 300 {
                        held.pop_front();
                    }
                }
            }
        });
        // Partial `Open`s: a 64 MiB body announced, 64 KiB of it sent every 50 ms.
        scope.spawn(|| {
            let mut header = [0u8; stela_proto::FRAME_HEADER_BYTES];
            header[..4].copy_from_slice(&(64u32 << 20).to_le_bytes());
            let body = vec![0x5Au8; 64 << 10];
            let mut held: Vec<std::net::TcpStream> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.retain(|s| s.peer_addr().is_ok());
                while held.len() < 30 {
                    let Ok(mut socket) = std::net::TcpStream::connect(repl) else {
                        break;
                    };
                    socket.set_nonblocking(true).unwrap();
                    let _ = socket.write_all(&header);
                    held.push(socket);
                }
                for socket in &mut held {
                    let _ = socket.write(&body);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        // The real primary's commits go on being acknowledged through the flood.
        let committer = scope.spawn(|| {
            let mut commits = 0u64;
            for seq in 1.. {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                client
                    .append(handle, Durability::Replicated, &[rec(1, seq, 100)])
                    .expect("a replicated commit during the flood");
                commits += 1;
            }
            commits
        });
        let mut peak = 0;
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while std::time::Instant::now() < until {
            peak = peak.max(tasks());
            std::thread::sleep(Duration::from_millis(2));
        }
        let rss = threads_and_rss().1;
        stop.store(true, Ordering::Relaxed);
        (peak, committer.join().unwrap(), rss)
    });
    eprintln!(
        "3 s of flood: threads {threads_before} -> peak {peak}, RSS {:.1} -> {:.1} MB, {commits} replicated commits",
        rss_before as f64 / 1e6,
        rss as f64 / 1e6
    );
    assert!(
        commits >= 20,
        "only {commits} replicated commits in 3 s of flood"
    );
    // The test's own three threads (two flooders, the committer), and a few for the daemons'
    // own comings and goings (a stream reopened, a TLS-less acknowledgement reader replaced).
    assert!(
        peak <= threads_before + 3 + 8,
        "the flood took the process from {threads_before} to {peak} threads"
    );
    assert!(
        rss < rss_before + (64 << 20),
        "the flood took the process from {rss_before} to {rss} bytes resident"
    );
    drop(client);
    primary.shutdown().expect("primary stops cleanly");
    standby.shutdown().expect("standby stops cleanly");
}
