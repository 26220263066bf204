//! Who is at the other end of a loopback TCP connection: the user owning the peer's socket, as
//! the kernel records it (the `uid` column of `/proc/net/tcp` and `/proc/net/tcp6`).
//!
//! Why: a plain-TCP listener on loopback (the replication stream of a pair on one machine) is
//! reachable by every local user. A Unix socket would tell its peer's uid (`SO_PEERCRED`); for
//! loopback TCP the kernel keeps the same fact on the peer's socket, which lives in this host's
//! (and this network namespace's) socket table, under the address we see as the peer's.
//!
//! Invariants:
//! - Only loopback peers are looked up: any other peer's socket is on another machine.
//! - The owner is the uid that created the socket (the kernel's `sk_uid`); a process cannot
//!   change it without privileges to change its own uid.
//! - Not found (the peer closed its socket, or is in another namespace) is `None`, never a
//!   guess: the caller refuses.

use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};

/// The uid owning the socket at the other end of `stream`, if that end is on loopback and its
/// socket is still in this namespace's table.
///
/// # Errors
/// The socket's addresses or the kernel's tables cannot be read.
pub fn loopback_peer_uid(stream: &TcpStream) -> io::Result<Option<u32>> {
    let (ours, theirs) = (stream.local_addr()?, stream.peer_addr()?);
    if !theirs.ip().is_loopback() {
        return Ok(None);
    }
    let table = match theirs {
        SocketAddr::V4(_) => "/proc/net/tcp",
        SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table)?;
    Ok(owner_in_table(&text, theirs, ours))
}

/// The uid of the socket in `table` (the text of `/proc/net/tcp{,6}`) whose local address is
/// `local` and remote address `remote`.
pub fn owner_in_table(table: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let (local, remote) = (proc_address(local), proc_address(remote));
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl, local_address, rem_address, st, tx:rx, tr:when, retrnsmt, uid, ...
        let (&l, &r, &uid) = (fields.get(1)?, fields.get(2)?, fields.get(7)?);
        (l.eq_ignore_ascii_case(&local) && r.eq_ignore_ascii_case(&remote))
            .then(|| uid.parse().ok())
            .flatten()
    })
}

/// An address as the kernel prints it in `/proc/net/tcp{,6}`: the address as 32-bit words in
/// host byte order, each in hexadecimal, then `:` and the port in hexadecimal.
fn proc_address(addr: SocketAddr) -> String {
    let words: Vec<[u8; 4]> = match addr.ip() {
        IpAddr::V4(ip) => vec![ip.octets()],
        IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|c| [c[0], c[1], c[2], c[3]])
            .collect(),
    };
    let mut out: String = words
        .iter()
        .map(|w| format!("{:08X}", u32::from_ne_bytes(*w)))
        .collect();
    out.push_str(&format!(":{:04X}", addr.port()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_of_a_loopback_peer_is_this_process_s_user() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(loopback_peer_uid(&accepted).unwrap(), Some(uid));
    }

    #[test]
    fn a_line_is_matched_by_both_addresses() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
             0: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000  65534        0 12345 1\n   \
             1: 0100007F:C350 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 12346 1\n";
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:8080".parse().unwrap(),
            "127.0.0.1:50000".parse().unwrap(),
        );
        if cfg!(target_endian = "little") {
            assert_eq!(owner_in_table(table, a, b), Some(65534));
            assert_eq!(owner_in_table(table, b, a), Some(0));
        }
        assert_eq!(owner_in_table(table, a, a), None);
    }
}
