//! A deterministic simulator of a stela cluster (after TigerBeetle's VOPR and FoundationDB's
//! simulation): N nodes ([`crate::node`]), the coordinator ([`crate::coordinator`]) and
//! clients in one process, every message, timer and disk completion scheduled by one seeded
//! PRNG. The network drops, delays, duplicates and reorders messages and partitions links
//! (one way too); disks lose what was not synced at a crash, tear the last write and flip
//! bits; processes crash, pause and restart (always as the node they are configured to be);
//! the coordinator goes down and comes back. After every step [`check`] looks at every node
//! and every answer a client got. A run ends with every fault healed and a quiet spell, then
//! a last check that the cluster has a primary holding every acknowledged record and that
//! every node converged on its log.
//!
//! Invariants of the simulator itself: the same seed and configuration give the same run
//! (one PRNG, events ordered by (time, sequence number)); a message is delivered to the
//! incarnation of a node it was sent to or later, never to a dead one; time never goes back.

mod check;
mod client;
mod disk;
mod rng;

pub use check::Violation;
pub use client::{Answer, Answered};

use crate::coordinator::{self, Coordinator, CoordinatorConfig};
use crate::msg::{ClientId, FromCoordinator, NodeId, Peer, Reply, Request, Time, ToCoordinator};
use crate::node::{self, Action, Bugs, Node, NodeConfig};
use check::Checker;
use client::{Client, ClientTimes};
use disk::Disk;
use rng::Rng;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt::Write as _;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub nodes: u8,
    pub k: usize,
    pub clients: u16,
    /// Faults and commits happen during this long; then everything heals.
    pub run_ms: Time,
    /// How long a healed cluster runs before the last check.
    pub heal_ms: Time,
    pub faults: bool,
    pub bugs: Bugs,
    /// Keep a readable trace (slower; used to replay a failing seed).
    pub trace: bool,
}

impl SimConfig {
    pub fn three_nodes() -> SimConfig {
        SimConfig {
            nodes: 3,
            k: 1,
            clients: 2,
            run_ms: 1500,
            heal_ms: 1500,
            faults: true,
            bugs: Bugs::default(),
            trace: false,
        }
    }

    pub fn two_nodes() -> SimConfig {
        SimConfig {
            nodes: 2,
            ..SimConfig::three_nodes()
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub steps: u64,
    pub failure: Option<Violation>,
    pub trace: Vec<String>,
    pub counts: HashMap<&'static str, u64>,
}

impl Outcome {
    /// The seed, the failure, and the trace (its last `lines` lines if it was kept).
    pub fn report(&self) -> String {
        let mut text = format!("seed {} ran {} steps", self.seed, self.steps);
        if let Some(failure) = &self.failure {
            let _ = write!(text, "; FAILED at step {}: {failure}", self.steps);
        }
        let mut counts: Vec<_> = self.counts.iter().collect();
        counts.sort();
        let _ = write!(text, "\n  answers: {counts:?}");
        for line in &self.trace {
            let _ = write!(text, "\n  {line}");
        }
        text
    }
}

/// Runs one seed. A failure is replayed with a trace kept, so the outcome carries it.
pub fn run(seed: u64, config: &SimConfig) -> Outcome {
    let outcome = Sim::new(seed, config.clone()).run();
    if outcome.failure.is_some() && !config.trace {
        return Sim::new(
            seed,
            SimConfig {
                trace: true,
                ..config.clone()
            },
        )
        .run();
    }
    outcome
}

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ep {
    Node(NodeId),
    Coord,
    Client(ClientId),
}

#[derive(Clone, Debug)]
enum Msg {
    Peer(Peer),
    ToCoord(ToCoordinator),
    FromCoord(FromCoordinator),
    Request(Request),
    Reply(Reply),
}

#[derive(Clone, Debug)]
enum Event {
    Deliver {
        from: Ep,
        to: Ep,
        msg: Msg,
    },
    TickNode(NodeId),
    TickCoord,
    TickClient(ClientId),
    Synced {
        node: NodeId,
        life: u64,
        upto: u64,
        generation: u64,
    },
    Fault,
    Unblock(Vec<(Ep, Ep)>),
    Restart(NodeId),
    CoordUp,
    Calm,
    Heal,
}

struct Scheduled {
    at: Time,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

struct Slot {
    node: Option<Node>,
    config: NodeConfig,
    disk: Disk,
    life: u64,
    paused_until: Time,
    corrupt: bool,
}

const NODE_TICK: Time = 5;
const COORD_TICK: Time = 10;
const CLIENT_TICK: Time = 5;
const TIMES: ClientTimes = ClientTimes {
    commit_deadline: 400,
    timeout: 500,
    retry: 40,
};

struct Sim {
    config: SimConfig,
    seed: u64,
    rng: Rng,
    now: Time,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    slots: Vec<Slot>,
    coord: Option<Coordinator>,
    coord_config: CoordinatorConfig,
    coord_durable: coordinator::Durable,
    clients: Vec<Client>,
    blocked: HashMap<(Ep, Ep), u32>,
    drop_per_mille: u64,
    flipped: Option<NodeId>,
    healed: bool,
    checker: Checker,
    steps: u64,
    trace: Vec<String>,
    counts: HashMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64, config: SimConfig) -> Sim {
        let ids: Vec<NodeId> = (0..config.nodes).collect();
        let slots = ids
            .iter()
            .map(|&id| Slot::new(node_config(id, &ids, &config)))
            .collect();
        let coord_config = CoordinatorConfig {
            nodes: ids.clone(),
            reports_needed: ids.len() - config.k,
            lease: 150,
            retry: 40,
        };
        let clients = (0..config.clients)
            .map(|c| Client::new(c, config.nodes))
            .collect();
        Sim {
            seed,
            rng: Rng::new(seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            slots,
            coord: None,
            coord_config,
            coord_durable: coordinator::Durable::default(),
            clients,
            blocked: HashMap::new(),
            drop_per_mille: 10,
            flipped: None,
            healed: false,
            checker: Checker::default(),
            steps: 0,
            trace: Vec::new(),
            counts: HashMap::new(),
            config,
        }
    }

    fn schedule(&mut self, after: Time, event: Event) {
        self.seq += 1;
        let at = self.now + after;
        self.queue.push(Reverse(Scheduled {
            at,
            seq: self.seq,
            event,
        }));
    }

    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.config.trace {
            let line = format!("{:>6} ms  {}", self.now, line());
            self.trace.push(line);
        }
    }

    fn run(mut self) -> Outcome {
        self.schedule(0, Event::CoordUp);
        for id in 0..self.config.nodes {
            self.schedule(0, Event::Restart(id));
        }
        for c in 0..self.config.clients {
            self.schedule(1, Event::TickClient(c));
        }
        if self.config.faults {
            self.schedule(200, Event::Fault);
        }
        self.schedule(self.config.run_ms, Event::Heal);
        let end = self.config.run_ms + self.config.heal_ms;
        let failure = self.drive(end).err().or_else(|| self.final_check().err());
        Outcome {
            seed: self.seed,
            steps: self.steps,
            failure,
            trace: self.trace,
            counts: self.counts,
        }
    }

    fn drive(&mut self, end: Time) -> check::Verdict {
        while let Some(Reverse(next)) = self.queue.pop() {
            if next.at > end {
                break;
            }
            debug_assert!(next.at >= self.now, "time never goes back");
            self.now = next.at;
            self.steps += 1;
            self.handle(next.event)?;
            self.check_nodes()?;
        }
        Ok(())
    }

    fn check_nodes(&mut self) -> check::Verdict {
        for slot in &self.slots {
            let Some(node) = &slot.node else { continue };
            self.checker
                .node(node.id(), node.promised(), node.primary_term())?;
            if let Some(term) = node.primary_term() {
                self.checker.primary_log(node.id(), term, node.log())?;
            }
        }
        Ok(())
    }

    fn handle(&mut self, event: Event) -> check::Verdict {
        match event {
            Event::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Event::TickNode(id) => self.tick_node(id),
            Event::TickCoord => {
                if self.coord.is_some() {
                    self.coord_step(coordinator::Input::Tick { now: self.now });
                    self.schedule(COORD_TICK, Event::TickCoord);
                }
                Ok(())
            }
            Event::TickClient(c) => self.tick_client(c),
            Event::Synced {
                node,
                life,
                upto,
                generation,
            } => self.synced(node, life, upto, generation),
            Event::Fault => {
                self.fault();
                Ok(())
            }
            Event::Unblock(links) => {
                self.unblock(&links);
                Ok(())
            }
            Event::Restart(id) => self.restart(id),
            Event::CoordUp => {
                self.coord_up();
                Ok(())
            }
            Event::Calm => {
                self.drop_per_mille = if self.healed { 0 } else { 10 };
                Ok(())
            }
            Event::Heal => self.heal(),
        }
    }

    // ---- nodes ----

    fn restart(&mut self, id: NodeId) -> check::Verdict {
        let slot = &mut self.slots[usize::from(id)];
        if slot.node.is_some() || slot.corrupt {
            return Ok(());
        }
        slot.life += 1;
        slot.paused_until = 0;
        let image = slot.disk.image();
        match node::recover(&image) {
            Err(corruption) => {
                slot.corrupt = true;
                self.count("corrupt node stopped");
                self.note(|| format!("node {id} restarts and refuses its disk: {corruption}"));
                Ok(())
            }
            Ok((log, synced)) => {
                let dropped = image
                    .records
                    .iter()
                    .take(image.synced as usize)
                    .find(|(r, _)| log.get(r.lsn) != Some(r));
                if let Some((record, _)) = dropped {
                    return Err(Violation::SyncedRecordDropped {
                        node: id,
                        lsn: record.lsn,
                    });
                }
                slot.disk.drop_after(log.last_lsn());
                let (node, actions) =
                    Node::start(slot.config.clone(), log, synced, image.promised, self.now);
                let started = format!(
                    "node {id} starts: term {} log {:?}",
                    node.promised().0,
                    node.log().position()
                );
                slot.node = Some(node);
                self.note(|| started);
                self.schedule(1, Event::TickNode(id));
                self.carry_out(id, actions)
            }
        }
    }

    fn tick_node(&mut self, id: NodeId) -> check::Verdict {
        let slot = &self.slots[usize::from(id)];
        if slot.node.is_none() {
            return Ok(());
        }
        if slot.paused_until > self.now {
            let wait = slot.paused_until - self.now;
            self.schedule(wait, Event::TickNode(id));
            return Ok(());
        }
        self.schedule(NODE_TICK, Event::TickNode(id));
        self.node_step(id, node::Input::Tick)
    }

    fn node_step(&mut self, id: NodeId, input: node::Input) -> check::Verdict {
        let now = self.now;
        let Some(node) = self.slots[usize::from(id)].node.as_mut() else {
            return Ok(());
        };
        if self.config.trace && !matches!(input, node::Input::Tick) {
            self.trace
                .push(format!("{now:>6} ms  node {id} <- {input:?}"));
        }
        let actions = node.step(now, input);
        self.carry_out(id, actions)
    }

    fn carry_out(&mut self, id: NodeId, actions: Vec<Action>) -> check::Verdict {
        for action in actions {
            if self.config.trace
                && !matches!(action, Action::Coordinator(ToCoordinator::Renew { .. }))
            {
                self.trace
                    .push(format!("{:>6} ms  node {id} -> {action:?}", self.now));
            }
            self.act(id, action)?;
        }
        Ok(())
    }

    fn act(&mut self, id: NodeId, action: Action) -> check::Verdict {
        let slot = &mut self.slots[usize::from(id)];
        match action {
            Action::PersistTerm { term } => slot.disk.persist_term(term),
            Action::Write { records } => slot.disk.write(&records),
            Action::Sync { upto, generation } => {
                let (life, delay) = (slot.life, self.rng.between(1, 6));
                self.schedule(
                    delay,
                    Event::Synced {
                        node: id,
                        life,
                        upto,
                        generation,
                    },
                );
            }
            Action::Cut { keep, salvage } => {
                slot.disk.cut(keep, &salvage);
                self.count("records cut into salvage");
                self.check_cut(id, keep, &salvage)?;
            }
            Action::Peer { to, msg } => self.send(Ep::Node(id), Ep::Node(to), Msg::Peer(msg)),
            Action::Coordinator(msg) => self.send(Ep::Node(id), Ep::Coord, Msg::ToCoord(msg)),
            Action::Client { to, reply } => {
                self.send(Ep::Node(id), Ep::Client(to), Msg::Reply(reply))
            }
        }
        Ok(())
    }

    /// The primary a cut was ordered by is the live node primary of the standby's term.
    fn check_cut(&self, id: NodeId, keep: u64, salvage: &[crate::log::Record]) -> check::Verdict {
        let Some(standby) = &self.slots[usize::from(id)].node else {
            return Ok(());
        };
        let term = standby.promised();
        let primary = self
            .slots
            .iter()
            .filter_map(|s| s.node.as_ref())
            .find(|n| n.primary_term() == Some(term));
        match primary {
            Some(primary) => Checker::cut(standby.log(), keep, salvage, primary.log()),
            None => Ok(()),
        }
    }

    fn synced(&mut self, id: NodeId, life: u64, upto: u64, generation: u64) -> check::Verdict {
        let slot = &mut self.slots[usize::from(id)];
        if slot.life != life || slot.node.is_none() {
            return Ok(());
        }
        if slot.paused_until > self.now {
            let wait = slot.paused_until - self.now;
            self.schedule(
                wait,
                Event::Synced {
                    node: id,
                    life,
                    upto,
                    generation,
                },
            );
            return Ok(());
        }
        slot.disk.sync();
        self.node_step(id, node::Input::Synced { upto, generation })
    }

    // ---- the network ----

    fn send(&mut self, from: Ep, to: Ep, msg: Msg) {
        let involves_client = matches!(from, Ep::Client(_)) || matches!(to, Ep::Client(_));
        if involves_client {
            let delay = self.rng.between(1, 3);
            self.schedule(delay, Event::Deliver { from, to, msg });
            return;
        }
        if self.blocked.get(&(from, to)).is_some_and(|&n| n > 0)
            || self.rng.chance(self.drop_per_mille)
        {
            return;
        }
        let copies = if self.rng.chance(10) { 2 } else { 1 };
        for _ in 0..copies {
            let spike = self.rng.chance(50);
            let delay = if spike {
                self.rng.between(10, 80)
            } else {
                self.rng.between(1, 8)
            };
            self.schedule(
                delay,
                Event::Deliver {
                    from,
                    to,
                    msg: msg.clone(),
                },
            );
        }
    }

    fn deliver(&mut self, from: Ep, to: Ep, msg: Msg) -> check::Verdict {
        match to {
            Ep::Node(id) => {
                let slot = &self.slots[usize::from(id)];
                if slot.node.is_none() {
                    return Ok(());
                }
                if slot.paused_until > self.now {
                    let wait = slot.paused_until - self.now;
                    self.schedule(wait, Event::Deliver { from, to, msg });
                    return Ok(());
                }
                let input = match (from, msg) {
                    (Ep::Node(peer), Msg::Peer(msg)) => node::Input::Peer { from: peer, msg },
                    (Ep::Coord, Msg::FromCoord(msg)) => node::Input::Coordinator(msg),
                    (Ep::Client(c), Msg::Request(request)) => {
                        node::Input::Client { from: c, request }
                    }
                    _ => unreachable!("no such route"),
                };
                self.node_step(id, input)
            }
            Ep::Coord => {
                if let (Ep::Node(node), Msg::ToCoord(msg)) = (from, msg) {
                    self.coord_step(coordinator::Input::From {
                        now: self.now,
                        node,
                        msg,
                    });
                }
                Ok(())
            }
            Ep::Client(c) => {
                if let Msg::Reply(reply) = msg {
                    let answered = self.clients[usize::from(c)].reply(self.now, reply);
                    return self.record(answered);
                }
                Ok(())
            }
        }
    }

    // ---- the coordinator and clients ----

    fn coord_up(&mut self) {
        if self.coord.is_some() {
            return;
        }
        self.note(|| "coordinator starts".into());
        self.coord = Some(Coordinator::start(
            self.coord_config.clone(),
            self.coord_durable,
            self.now,
        ));
        self.schedule(COORD_TICK, Event::TickCoord);
    }

    fn coord_step(&mut self, input: coordinator::Input) {
        let Some(coord) = self.coord.as_mut() else {
            return;
        };
        let sends = coord.step(input);
        self.coord_durable = coord.durable();
        for send in sends {
            if self.config.trace {
                self.trace.push(format!(
                    "{:>6} ms  coordinator -> node {}: {:?}",
                    self.now, send.to, send.msg
                ));
            }
            self.send(Ep::Coord, Ep::Node(send.to), Msg::FromCoord(send.msg));
        }
    }

    fn tick_client(&mut self, c: ClientId) -> check::Verdict {
        let committing = self.now < self.config.run_ms;
        let (request, answered) = self.clients[usize::from(c)].tick(self.now, committing, TIMES);
        if let Some((node, request)) = request {
            self.send(Ep::Client(c), Ep::Node(node), Msg::Request(request));
        }
        self.schedule(CLIENT_TICK, Event::TickClient(c));
        self.record(answered)
    }

    fn record(&mut self, answered: Option<Answered>) -> check::Verdict {
        let Some(answered) = answered else {
            return Ok(());
        };
        self.note(|| format!("client {} told {:?}", answered.client, answered));
        let name = match answered.answer {
            Answer::Ok => "ok",
            Answer::Unprotected => "unprotected",
            Answer::InDoubt => "in doubt",
            Answer::Unknown => "unknown",
            Answer::Kept => "kept",
            Answer::Lost => "lost",
        };
        self.count(name);
        self.checker.answer(&answered)
    }

    fn count(&mut self, what: &'static str) {
        *self.counts.entry(what).or_default() += 1;
    }

    // ---- faults ----

    fn fault(&mut self) {
        if self.healed {
            return;
        }
        let gap = self.rng.between(30, 300);
        self.schedule(gap, Event::Fault);
        let n = u64::from(self.config.nodes);
        let node = self.rng.below(n) as NodeId;
        let other = ((u64::from(node) + self.rng.between(1, n - 1)) % n) as NodeId;
        let lasting = self.rng.between(20, 1200);
        let kind = self.rng.below(11);
        self.count("faults");
        match kind {
            0 | 1 => self.crash(node, lasting),
            10 => {
                // A power cut of two machines at once.
                self.crash(node, lasting);
                self.crash(other, lasting);
            }
            2 => self.pause(node, lasting),
            3 => self.block(links_of(Ep::Node(node), n), lasting),
            4 => self.block(
                vec![(Ep::Node(node), Ep::Coord), (Ep::Coord, Ep::Node(node))],
                lasting,
            ),
            5 => self.block(vec![(Ep::Node(node), Ep::Node(other))], lasting),
            6 => self.block(
                vec![
                    (Ep::Node(node), Ep::Node(other)),
                    (Ep::Node(other), Ep::Node(node)),
                ],
                lasting,
            ),
            7 => self.coord_down(lasting),
            8 => {
                self.note(|| "the network drops a third of its messages".into());
                self.drop_per_mille = 330;
                self.schedule(lasting.min(300), Event::Calm);
            }
            _ => self.flip(node),
        }
    }

    /// A fault that lasts until `lasting` ms pass, or (one time in four) until the heal.
    fn until(&mut self, lasting: Time) -> Time {
        if self.rng.chance(250) {
            self.config.run_ms.saturating_sub(self.now) + 1
        } else {
            lasting
        }
    }

    fn crash(&mut self, id: NodeId, lasting: Time) {
        // After a disk fault, only the damaged node crashes: one lost disk is the budget.
        if self.flipped.is_some_and(|f| f != id) {
            return;
        }
        let slot = &mut self.slots[usize::from(id)];
        if slot.node.take().is_none() {
            return;
        }
        slot.disk.crash(&mut self.rng);
        let back = self.until(lasting);
        self.note(|| format!("CRASH node {id} (back in {back} ms)"));
        self.schedule(back, Event::Restart(id));
    }

    fn pause(&mut self, id: NodeId, lasting: Time) {
        let back = lasting.min(2000);
        self.note(|| format!("PAUSE node {id} for {back} ms"));
        let slot = &mut self.slots[usize::from(id)];
        slot.paused_until = slot.paused_until.max(self.now + back);
    }

    fn block(&mut self, links: Vec<(Ep, Ep)>, lasting: Time) {
        let back = self.until(lasting);
        self.note(|| format!("BLOCK {links:?} for {back} ms"));
        for &link in &links {
            *self.blocked.entry(link).or_default() += 1;
        }
        self.schedule(back, Event::Unblock(links));
    }

    fn unblock(&mut self, links: &[(Ep, Ep)]) {
        if self.healed {
            return;
        }
        for link in links {
            if let Some(n) = self.blocked.get_mut(link) {
                *n = n.saturating_sub(1);
            }
        }
    }

    fn coord_down(&mut self, lasting: Time) {
        if self.coord.take().is_none() {
            return;
        }
        let back = self.until(lasting);
        self.note(|| format!("COORDINATOR DOWN for {back} ms"));
        self.schedule(back, Event::CoordUp);
    }

    fn flip(&mut self, id: NodeId) {
        if self.flipped.is_some() || self.rng.chance(700) {
            return;
        }
        if let Some(lsn) = self.slots[usize::from(id)].disk.flip(&mut self.rng) {
            self.flipped = Some(id);
            self.note(|| format!("BIT FLIP in node {id}'s synced record {lsn}"));
        }
    }

    fn heal(&mut self) -> check::Verdict {
        self.note(|| "HEAL: every link, node and the coordinator back".into());
        self.healed = true;
        self.blocked.clear();
        self.drop_per_mille = 0;
        for id in 0..self.config.nodes {
            self.slots[usize::from(id)].paused_until = 0;
            self.restart(id)?;
        }
        self.coord_up();
        Ok(())
    }

    fn final_check(&self) -> check::Verdict {
        let primary = self
            .slots
            .iter()
            .filter_map(|s| s.node.as_ref())
            .filter(|n| n.primary_term().is_some())
            .max_by_key(|n| n.primary_term());
        let Some(primary) = primary else {
            return Err(Violation::NoPrimary {
                heal_ms: self.config.heal_ms,
            });
        };
        let term = primary.primary_term().expect("a primary");
        self.checker.holds_all(primary.id(), term, primary.log())?;
        for node in self.slots.iter().filter_map(|s| s.node.as_ref()) {
            Checker::converged(node.id(), node.log(), primary.log())?;
        }
        Ok(())
    }
}

impl Slot {
    fn new(config: NodeConfig) -> Slot {
        Slot {
            node: None,
            config,
            disk: Disk::default(),
            life: 0,
            paused_until: 0,
            corrupt: false,
        }
    }
}

fn node_config(id: NodeId, ids: &[NodeId], config: &SimConfig) -> NodeConfig {
    NodeConfig {
        id,
        peers: ids.iter().copied().filter(|&p| p != id).collect(),
        k: config.k,
        prefers_primary: id == 0,
        heartbeat: 20,
        deadline: 100,
        start_wait: 60,
        chunk: 16,
        bugs: config.bugs,
    }
}

/// Every link into and out of `ep` among `n` nodes and the coordinator.
fn links_of(ep: Ep, n: u64) -> Vec<(Ep, Ep)> {
    let mut others: Vec<Ep> = (0..n)
        .map(|i| Ep::Node(i as NodeId))
        .filter(|&o| o != ep)
        .collect();
    others.push(Ep::Coord);
    others
        .into_iter()
        .flat_map(|o| [(ep, o), (o, ep)])
        .collect()
}

/// Runs `seeds`: how many passed, or the first failure.
///
/// # Errors
/// The first failing seed's outcome (boxed: it carries the trace).
pub fn sweep(seeds: std::ops::Range<u64>, config: &SimConfig) -> Result<u64, Box<Outcome>> {
    let mut runs = 0;
    for seed in seeds {
        let outcome = run(seed, config);
        if outcome.failure.is_some() {
            return Err(Box::new(outcome));
        }
        runs += 1;
    }
    Ok(runs)
}

/// Keeps the trace's last `lines` lines (a failure's report stays readable).
pub fn tail(mut outcome: Outcome, lines: usize) -> Outcome {
    let skip = outcome.trace.len().saturating_sub(lines);
    outcome.trace.drain(..skip);
    outcome
}
