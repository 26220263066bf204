//! A lossy and slow link made with netfilter, for kernels built without netem
//! (`CONFIG_NET_SCH_NETEM` unset, as on the VMs this project runs on), so that the failover
//! run's lossy-standby fault runs there too.
//!
//! Loss: iptables's `statistic` match drops each packet that leaves or enters the interface
//! with the given probability, independently per packet and per direction, as netem's `loss`
//! does. Delay: every packet that survives goes to a netfilter queue (NFQUEUE) and waits in a
//! thread of this process, which gives the kernel its verdict (accept) once the delay has
//! passed since the thread received it. What leaves the host (OUTPUT) and what reaches it
//! (INPUT) both pass through, as they would through netem on both ends of the host's veth pair:
//! a round trip through the link gains twice the delay.
//!
//! What [`LossyLink`] keeps:
//! - its rules live in a chain of their own, jumped to from INPUT and OUTPUT for the one
//!   interface only, so loopback and every other interface of the namespace are untouched, and
//!   removing the chain removes exactly what was added;
//! - the queue is bound before the rules exist, and the rules are gone before the thread lets
//!   go of the queue: no packet is queued without a listener (the rules' `--queue-bypass` would
//!   pass it undelayed rather than drop it, should that ever happen);
//! - packets leave in the order they arrived; each waits at least the delay and at most the
//!   delay plus [`POLL_STEP`] (the thread cannot sleep on the queue's socket, which the `nfq`
//!   crate does not expose, so it looks every `POLL_STEP`);
//! - like netem's default limit of 1,000 packets, the kernel holds at most 1,024 packets
//!   waiting for a verdict and drops what comes beyond;
//! - on removal every packet still held is let through at once, none is dropped by the
//!   removal itself.
//!
//! Needs root and the `iptables` command (Debian's iptables package).

use crate::netns::{enter_on_this_thread, run};
use anyhow::Context;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the holding thread looks for new packets and due ones.
pub const POLL_STEP: Duration = Duration::from_micros(200);

/// The chain that holds the rules, in the namespace's filter table.
const CHAIN: &str = "stela-lossy";

/// An interface of a network namespace made lossy and slow until [`LossyLink::remove`] (or
/// drop).
pub struct LossyLink {
    namespace: String,
    interface: String,
    queue: u16,
    stop: Arc<AtomicBool>,
    held: Arc<AtomicU64>,
    holder: Option<JoinHandle<anyhow::Result<()>>>,
    rules_in: bool,
}

impl LossyLink {
    /// Makes `interface` of the namespace `namespace` (a name under /run/netns) drop
    /// `loss_percent` % of its packets each way and delay the rest by `delay` each way, using
    /// netfilter queue `queue` (a number no other user of the namespace binds).
    ///
    /// # Errors
    /// Not root, no `iptables`, or the kernel refuses the queue; nothing is left in place.
    pub fn add(
        namespace: &str,
        interface: &str,
        loss_percent: u32,
        delay: Duration,
        queue: u16,
    ) -> anyhow::Result<LossyLink> {
        anyhow::ensure!(loss_percent <= 100, "a loss of {loss_percent} %");
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let holder = {
            let namespace = namespace.to_owned();
            let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
            std::thread::Builder::new()
                .name("stela-lossy-link".into())
                .spawn(move || hold(&namespace, queue, delay, &stop, &held, ready_tx))
                .context("start the thread that delays packets")?
        };
        let mut link = LossyLink {
            namespace: namespace.to_owned(),
            interface: interface.to_owned(),
            queue,
            stop,
            held,
            holder: Some(holder),
            rules_in: false,
        };
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                link.stop_holder()?;
                return Err(e);
            }
            Err(_) => {
                // The thread ended without a word: its result says why.
                link.stop_holder()?;
                anyhow::bail!("the thread that delays packets ended at its start");
            }
        }
        link.rules_in = true;
        if let Err(e) = link.add_rules(loss_percent) {
            link.remove_rules();
            link.stop_holder()?;
            return Err(e);
        }
        Ok(link)
    }

    fn iptables(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["netns", "exec", self.namespace.as_str(), "iptables", "-w"];
        all.extend_from_slice(args);
        run("ip", &all).context("iptables (Debian's iptables package; needs root)")
    }

    fn add_rules(&self, loss_percent: u32) -> anyhow::Result<()> {
        self.iptables(&["-N", CHAIN])?;
        if loss_percent > 0 {
            // statistic takes a probability with up to ten decimals; a percentage is exact.
            let probability = format!("{:.2}", f64::from(loss_percent) / 100.0);
            self.iptables(&[
                "-A",
                CHAIN,
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                &probability,
                "-j",
                "DROP",
            ])?;
        }
        let queue = self.queue.to_string();
        self.iptables(&[
            "-A",
            CHAIN,
            "-j",
            "NFQUEUE",
            "--queue-num",
            &queue,
            "--queue-bypass",
        ])?;
        self.iptables(&["-I", "INPUT", "1", "-i", &self.interface, "-j", CHAIN])?;
        self.iptables(&["-I", "OUTPUT", "1", "-o", &self.interface, "-j", CHAIN])?;
        Ok(())
    }

    /// Removes the jumps and the chain, each step tried even if an earlier one failed (some may
    /// never have been made).
    fn remove_rules(&mut self) {
        if !self.rules_in {
            return;
        }
        let _ = self.iptables(&["-D", "INPUT", "-i", &self.interface, "-j", CHAIN]);
        let _ = self.iptables(&["-D", "OUTPUT", "-o", &self.interface, "-j", CHAIN]);
        let _ = self.iptables(&["-F", CHAIN]);
        let _ = self.iptables(&["-X", CHAIN]);
        self.rules_in = false;
    }

    fn stop_holder(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Release);
        match self.holder.take() {
            Some(holder) => holder
                .join()
                .map_err(|_| anyhow::anyhow!("the thread that delays packets panicked"))?,
            None => Ok(()),
        }
    }

    /// Packets held so far (each was let through or still waits).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Packets the loss rule dropped so far, each direction together, from the rule's counter.
    pub fn dropped(&self) -> anyhow::Result<u64> {
        let output = std::process::Command::new("ip")
            .args(["netns", "exec", &self.namespace, "iptables", "-w"])
            .args(["-L", CHAIN, "-v", "-x", "-n"])
            .output()
            .context("iptables -L")?;
        anyhow::ensure!(
            output.status.success(),
            "iptables -L {CHAIN}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(dropped_in_listing(&String::from_utf8_lossy(&output.stdout)))
    }

    /// Takes the rules away, then lets every held packet through and stops the thread.
    ///
    /// # Errors
    /// The thread failed (a verdict the kernel refused): the link may have dropped packets it
    /// should have delayed.
    pub fn remove(mut self) -> anyhow::Result<()> {
        self.remove_rules();
        self.stop_holder()
    }
}

impl Drop for LossyLink {
    fn drop(&mut self) {
        self.remove_rules();
        let _ = self.stop_holder();
    }
}

/// The packet count of the chain's DROP rule in `iptables -L CHAIN -v -x -n` output.
fn dropped_in_listing(listing: &str) -> u64 {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let packets = fields.next()?.parse::<u64>().ok()?;
            let _bytes = fields.next()?;
            (fields.next()? == "DROP").then_some(packets)
        })
        .sum()
}

/// The holding thread: moves into the namespace, binds the queue, says so on `ready`, then
/// holds each packet for `delay` until `stop`.
fn hold(
    namespace: &str,
    queue_num: u16,
    delay: Duration,
    stop: &AtomicBool,
    held_count: &AtomicU64,
    ready: mpsc::Sender<anyhow::Result<()>>,
) -> anyhow::Result<()> {
    let mut queue = match bind(namespace, queue_num) {
        Ok(queue) => queue,
        Err(e) => {
            let _ = ready.send(Err(e));
            return Ok(());
        }
    };
    let _ = ready.send(Ok(()));
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    // Once `stop` is seen the rules are already gone (`remove` takes them away first), so
    // what is in the socket now is the last of it: one more pass takes it, then all is let go.
    let mut last_pass = false;
    loop {
        let stopping = stop.load(Ordering::Acquire);
        loop {
            match queue.recv() {
                Ok(message) => {
                    held.push_back((Instant::now() + delay, message));
                    held_count.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e).context("read the netfilter queue"),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| stopping || *due <= now) {
            let (_, mut message) = held.pop_front().expect("looked at the front");
            message.set_verdict(nfq::Verdict::Accept);
            queue
                .verdict(message)
                .context("give a held packet its verdict")?;
        }
        if stopping {
            if last_pass {
                break;
            }
            last_pass = true;
        }
        let wait = held
            .front()
            .map_or(POLL_STEP, |(due, _)| due.saturating_duration_since(now))
            .min(POLL_STEP);
        std::thread::sleep(wait);
    }
    let _ = queue.unbind(queue_num);
    Ok(())
}

/// A queue bound to `queue_num` in the namespace, non-blocking, copying no packet bytes (a
/// verdict needs only the packet's id).
fn bind(namespace: &str, queue_num: u16) -> anyhow::Result<nfq::Queue> {
    // Only this thread moves: the netlink socket opened next is the namespace's.
    enter_on_this_thread(namespace)?;
    let mut queue = nfq::Queue::open().context("open a netfilter queue socket")?;
    queue
        .bind(queue_num)
        .with_context(|| format!("bind netfilter queue {queue_num}"))?;
    queue
        .set_copy_range(queue_num, 0)
        .context("set the queue to copy no packet bytes")?;
    queue.set_nonblocking(true);
    Ok(queue)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drop_rules_packets_are_read_off_the_listing() {
        let listing = "\
Chain stela-lossy (2 references)
    pkts      bytes target     prot opt in     out     source               destination
      37     2220 DROP       0    --  *      *       0.0.0.0/0            0.0.0.0/0            statistic mode random probability 0.20000000019
     151     9060 NFQUEUE    0    --  *      *       0.0.0.0/0            0.0.0.0/0            NFQUEUE num 7 bypass
";
        assert_eq!(dropped_in_listing(listing), 37);
        assert_eq!(dropped_in_listing("Chain stela-lossy (0 references)\n"), 0);
    }
}
