//! The failover run's network: four namespaces, `stela-fo-{primary,standby,witness,client}-<pid>`
//! (named after the role each host *starts* in: after a failover the node in the "standby"
//! namespace is the primary), and with three nodes a fifth, `stela-fo-standby2-<pid>`, for the
//! third node; each with one interface `fo0` holding 10.231.<n>.<k>/24, whose veth peers are
//! ports of one bridge.
//!
//! The bridge lives in a fifth namespace of its own, `stela-fo-bridge-<pid>`, not in the root
//! namespace, so that the run adds nothing at all to the host's interfaces, addresses and routes:
//! the veth pairs are made with both ends already in the run's namespaces, the 10.231.<n>.0/24
//! addresses exist only there (the host has no route to them, so they cannot clash with its own
//! networks; `n` is still chosen to avoid any 10.231.<n>. the host uses, so that a reader of `ip`
//! output is never confused), and the host's firewall (bridge netfilter hooks) never sees the
//! bridged traffic. Dropping the [`Topology`] deletes the namespaces, which deletes every
//! interface in them; nothing else is touched.
//!
//! The faults act on the hosts' own ends: `fo0` set down (a host cut off from everyone), a
//! blackhole route to one peer (a pair cut off from each other, the rest still reachable), a
//! lossy and slow link: netem on both ends of a host's veth pair (netem shapes what leaves an
//! interface, so both ends make the link lossy and slow in both directions), or, on a kernel
//! built without netem, the same loss and delay by netfilter in the host's namespace, on what
//! leaves and what reaches `fo0` ([`crate::impair`]).

use crate::impair::LossyLink;
use crate::netns::{ip_output, Namespace};
use std::net::Ipv4Addr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// A host of the run, by the role it starts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Primary,
    Standby,
    Witness,
    Client,
    /// The third node's (a second standby), only in a run of three nodes. Last, so that a
    /// two-node run's hosts keep their indexes and addresses.
    Standby2,
}

impl Host {
    pub const ALL: [Host; 5] = [
        Host::Primary,
        Host::Standby,
        Host::Witness,
        Host::Client,
        Host::Standby2,
    ];

    /// The hosts of the nodes of a run of `nodes` nodes, in the nodes' order (`a`, `b`, `c`).
    pub fn nodes(nodes: usize) -> &'static [Host] {
        debug_assert!((2..=3).contains(&nodes), "{nodes} nodes");
        &[Host::Primary, Host::Standby, Host::Standby2][..nodes]
    }

    /// The hosts of a run of `nodes` nodes, in [`Host::index`] order.
    fn of_run(nodes: usize) -> &'static [Host] {
        if nodes >= 3 {
            &Host::ALL
        } else {
            &Host::ALL[..4]
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Host::Primary => "primary",
            Host::Standby => "standby",
            Host::Witness => "witness",
            Host::Client => "client",
            Host::Standby2 => "standby2",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The host's interface, in its own namespace.
pub const INTERFACE: &str = "fo0";

/// The namespaces and the bridge; removed when dropped.
pub struct Topology {
    subnet: u8,
    /// The links made lossy by netfilter (none where netem does it), indexed by
    /// [`Host::index`]. Declared before `hosts`, so taken away before the namespaces go.
    lossy: Mutex<[Option<LossyLink>; 5]>,
    /// Found on first use (a netem qdisc tried on the bridge).
    lossy_method: OnceLock<LossyMethod>,
    /// Indexed by [`Host::index`] (the third node's only in a run of three). Declared before
    /// `bridge`, so dropped first: the veth ends in the bridge namespace go with their peers.
    hosts: Vec<Namespace>,
    bridge: Namespace,
}

/// How [`Topology::set_lossy`] makes a link lossy and slow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossyMethod {
    /// netem on both ends of the host's veth pair.
    Netem,
    /// iptables's statistic match and a netfilter queue in the host's namespace
    /// ([`crate::impair`]): for kernels built without netem.
    Netfilter,
}

impl LossyMethod {
    pub fn name(self) -> &'static str {
        match self {
            LossyMethod::Netem => "netem",
            LossyMethod::Netfilter => "netfilter",
        }
    }
}

impl Topology {
    /// Builds the network of a two-node run, named after this process's pid.
    ///
    /// # Errors
    /// Not root (`ip netns add` fails), or any `ip` command fails; what was built is removed.
    pub fn create() -> anyhow::Result<Topology> {
        Topology::create_for(2)
    }

    /// Builds the network of a run of `nodes` nodes (2 or 3): a host per node, the witness's
    /// and the client's.
    ///
    /// # Errors
    /// As [`Topology::create`]; also a number of nodes other than 2 or 3.
    pub fn create_for(nodes: usize) -> anyhow::Result<Topology> {
        anyhow::ensure!(
            (2..=3).contains(&nodes),
            "a run has 2 or 3 nodes, not {nodes}"
        );
        let pid = std::process::id();
        let subnet = free_subnet(pid)?;
        let bridge = Namespace::create(&format!("stela-fo-bridge-{pid}"))?;
        bridge.ip(&["link", "add", "br0", "type", "bridge"])?;
        bridge.ip(&["link", "set", "br0", "up"])?;
        let mut hosts = Vec::new();
        for &host in Host::of_run(nodes) {
            debug_assert_eq!(host.index(), hosts.len());
            let namespace = Namespace::create(&format!("stela-fo-{}-{pid}", host.name()))?;
            let port = bridge_port(host);
            bridge.ip(&[
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                INTERFACE,
                "netns",
                namespace.name(),
            ])?;
            hosts.push(namespace);
            bridge.ip(&["link", "set", &port, "master", "br0"])?;
            bridge.ip(&["link", "set", &port, "up"])?;
            let namespace = hosts.last().expect("just pushed");
            let cidr = format!("{}/24", address(subnet, host));
            namespace.ip(&["addr", "add", &cidr, "dev", INTERFACE])?;
            namespace.ip(&["link", "set", INTERFACE, "up"])?;
        }
        Ok(Topology {
            subnet,
            lossy: Mutex::new(Default::default()),
            lossy_method: OnceLock::new(),
            hosts,
            bridge,
        })
    }

    /// The namespace of `host`. Panics for the third node's in a run of two (a caller's bug).
    pub fn namespace(&self, host: Host) -> &Namespace {
        self.hosts
            .get(host.index())
            .unwrap_or_else(|| panic!("this run has no {} host", host.name()))
    }

    /// The number of nodes this network has hosts for.
    pub fn nodes(&self) -> usize {
        self.hosts.len() - 2
    }

    pub fn address(&self, host: Host) -> Ipv4Addr {
        address(self.subnet, host)
    }

    /// The third octet of this run's 10.231.n.0/24.
    pub fn subnet(&self) -> u8 {
        self.subnet
    }

    /// Sets `host`'s interface up or down (down: the host is cut off from everyone).
    pub fn set_link(&self, host: Host, up: bool) -> anyhow::Result<()> {
        self.namespace(host)
            .ip(&["link", "set", INTERFACE, if up { "up" } else { "down" }])
    }

    /// Adds (or removes) blackhole routes between `a` and `b`, both ways: the two can no longer
    /// reach each other; everyone else still reaches both.
    pub fn set_blackhole(&self, a: Host, b: Host, on: bool) -> anyhow::Result<()> {
        let verb = if on { "add" } else { "del" };
        for (from, to) in [(a, b), (b, a)] {
            let target = format!("{}/32", self.address(to));
            self.namespace(from)
                .ip(&["route", verb, "blackhole", &target])?;
        }
        Ok(())
    }

    /// Drops (or stops dropping) every packet from `from` to `to`, silently, by an iptables
    /// rule on `to`'s input in its own namespace: `from`'s packets leave and vanish (no reset,
    /// no ICMP), the other way is untouched. Both ways: call it for each direction.
    ///
    /// # Errors
    /// `iptables` fails (Debian's iptables package; needs root).
    pub fn set_dropped(&self, from: Host, to: Host, on: bool) -> anyhow::Result<()> {
        let source = self.address(from).to_string();
        crate::netns::run(
            "ip",
            &[
                "netns",
                "exec",
                self.namespace(to).name(),
                "iptables",
                "-w",
                if on { "-A" } else { "-D" },
                "INPUT",
                "-s",
                &source,
                "-j",
                "DROP",
            ],
        )
    }

    /// Whether this kernel has netem (`CONFIG_NET_SCH_NETEM`; some VM kernels are built
    /// without it), tried on the bridge, which carries no traffic of its own.
    pub fn netem_available(&self) -> bool {
        let added = self
            .bridge
            .tc(&[
                "qdisc", "add", "dev", "br0", "root", "netem", "delay", "1ms",
            ])
            .is_ok();
        if added {
            let _ = self.bridge.tc(&["qdisc", "del", "dev", "br0", "root"]);
        }
        added
    }

    /// How this kernel lets [`Topology::set_lossy`] work: netem where it has it, else
    /// netfilter.
    pub fn lossy_method(&self) -> LossyMethod {
        *self.lossy_method.get_or_init(|| {
            if self.netem_available() {
                LossyMethod::Netem
            } else {
                LossyMethod::Netfilter
            }
        })
    }

    /// Makes `host`'s link drop `loss_percent` % of packets and delay the rest by `delay_ms`,
    /// each way (`on`), or takes that away again, by [`Topology::lossy_method`].
    ///
    /// # Errors
    /// The `tc` or `iptables` commands fail, or (netfilter) the thread that held packets
    /// failed, so the link may have dropped what it should only have delayed.
    pub fn set_lossy(
        &self,
        host: Host,
        loss_percent: u32,
        delay_ms: u32,
        on: bool,
    ) -> anyhow::Result<()> {
        match self.lossy_method() {
            LossyMethod::Netem => self.set_netem(host, on.then_some((loss_percent, delay_ms))),
            LossyMethod::Netfilter => {
                let mut lossy = self.lossy.lock().unwrap_or_else(|p| p.into_inner());
                let slot = &mut lossy[host.index()];
                if on {
                    anyhow::ensure!(slot.is_none(), "{} is lossy already", host.name());
                    *slot = Some(LossyLink::add(
                        self.namespace(host).name(),
                        INTERFACE,
                        loss_percent,
                        Duration::from_millis(delay_ms.into()),
                        LOSSY_QUEUE,
                    )?);
                } else {
                    let link = slot
                        .take()
                        .ok_or_else(|| anyhow::anyhow!("{} is not lossy", host.name()))?;
                    link.remove()?;
                }
                Ok(())
            }
        }
    }

    /// The netfilter-made lossy link of `host` while there is one (for tests: its counters).
    pub fn with_lossy_link<T>(&self, host: Host, look: impl FnOnce(&LossyLink) -> T) -> Option<T> {
        let lossy = self.lossy.lock().unwrap_or_else(|p| p.into_inner());
        lossy[host.index()].as_ref().map(look)
    }

    /// Puts `netem loss <loss>% delay <delay_ms>ms` on both ends of `host`'s veth (`Some((loss,
    /// delay_ms))`), or removes it (`None`).
    fn set_netem(&self, host: Host, netem: Option<(u32, u32)>) -> anyhow::Result<()> {
        let port = bridge_port(host);
        let ends = [
            (self.namespace(host), INTERFACE),
            (&self.bridge, port.as_str()),
        ];
        for (namespace, dev) in ends {
            if let Some((loss_percent, delay_ms)) = netem {
                namespace.tc(&[
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "netem",
                    "loss",
                    &format!("{loss_percent}%"),
                    "delay",
                    &format!("{delay_ms}ms"),
                ])?;
            } else {
                namespace.tc(&["qdisc", "del", "dev", dev, "root"])?;
            }
        }
        Ok(())
    }
}

/// The netfilter queue the lossy links use (one per namespace; each host has its own).
const LOSSY_QUEUE: u16 = 7;

/// The bridge's port to `host` (in the bridge namespace).
fn bridge_port(host: Host) -> String {
    format!("to-{}", host.name())
}

fn address(subnet: u8, host: Host) -> Ipv4Addr {
    Ipv4Addr::new(10, 231, subnet, host.index() as u8 + 1)
}

/// A third octet for 10.231.n.0/24 that no address or route of this (the host's) namespace
/// mentions, starting from one derived from `pid` so that runs side by side differ.
fn free_subnet(pid: u32) -> anyhow::Result<u8> {
    let used =
        ip_output(&["-4", "addr", "show"])? + &ip_output(&["-4", "route", "show", "table", "all"])?;
    pick_subnet(pid, &used)
        .ok_or_else(|| anyhow::anyhow!("every 10.231.n.0/24 is in use on this host"))
}

fn pick_subnet(pid: u32, used: &str) -> Option<u8> {
    (0..250u32)
        .map(|i| ((pid + i) % 250 + 1) as u8)
        .find(|n| !used.contains(&format!("10.231.{n}.")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subnet_avoids_what_the_host_uses() {
        assert_eq!(pick_subnet(0, ""), Some(1));
        let used = "inet 10.231.1.7/24 scope global eth1\n10.231.2.0/24 dev eth1";
        assert_eq!(pick_subnet(0, used), Some(3));
        assert_eq!(pick_subnet(249, ""), Some(250));
        assert_eq!(address(7, Host::Client), Ipv4Addr::new(10, 231, 7, 4));
        assert_eq!(address(7, Host::Standby2), Ipv4Addr::new(10, 231, 7, 5));
        // A run's hosts are in index order; a two-node run has no third node's.
        for nodes in [2, 3] {
            let hosts = Host::of_run(nodes);
            assert_eq!(hosts.len(), nodes + 2);
            assert!(hosts.iter().enumerate().all(|(i, h)| h.index() == i));
            assert!(Host::nodes(nodes).iter().all(|h| hosts.contains(h)));
        }
        assert!(!Host::of_run(2).contains(&Host::Standby2));
        // Interface names fit Linux's 15 bytes.
        assert!(Host::ALL.iter().all(|h| bridge_port(*h).len() <= 15));
    }
}
