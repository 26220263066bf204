//! A node: primary or standby, one machine. It owns the node's log (in memory; the disk is
//! told what to write through [`Action`]s), the newest term it has seen (`promised`), its
//! role, and, as primary, each standby's stream and the `replicated` waiters.
//!
//! Rules, each asserted where it can break:
//! - **Terms fence.** `promised` never goes down and is written durably (`PersistTerm`) before
//!   anything that depends on it leaves the node. A node takes a stream only from the holder of
//!   a term at least `promised`, and a node that has seen a newer term than its own stops being
//!   primary at once (every waiter is answered `InDoubt`): it never acknowledges in an older
//!   term again.
//! - **Grants, not configuration.** A node starts as a standby, whatever its configured role,
//!   and becomes primary only with a `Granted` for the epoch it promised (the configured role
//!   is sent with the promise, as a preference).
//! - **K of N.** A primary ships to every standby; a `replicated` commit is answered `Ok` only
//!   once K standbys acknowledged holding it synced and the primary synced it too (K + 1
//!   durable copies, which any N − K promises of an election meet); at its deadline without
//!   that, it is answered `Unprotected`, never `Ok`.
//! - **Cut only what diverged.** A stream opens with the standby's term history; the primary
//!   finds the last LSN the two logs agree on and the standby cuts only what follows it (into
//!   salvage), then takes the primary's records from there.
//! - **Links checked both ways.** Shipments (or empty heartbeats) go every `heartbeat`, and each
//!   is acknowledged; a primary that hears nothing on a stream for `deadline` tears it down and
//!   opens a new one; a standby drops a stream silent as long.
//! - **Resolutions are final.** Only the primary of the newest term it knows, once its own term
//!   is protected, answers `resolve` (see `log::resolve`); any other node says it cannot.
//! - **Damage is not a torn tail.** [`recover`] cuts a bad record past the synced mark (a write
//!   the crash tore) and refuses a bad record at or below it (corruption).

use crate::log::{divergence, resolve, Log, Lsn, Record, Term};
use crate::msg::{ClientId, FromCoordinator, NodeId, Peer, Reply, Request, Time, ToCoordinator};
use std::collections::BTreeMap;

/// Deviations from the rules, each one line in this file, for the simulator to find.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// A standby takes a stream of a term older than one it has seen.
    pub accept_stale_term: bool,
    /// A primary counts a record held by a standby once it has sent it there.
    pub ack_before_held: bool,
    /// A node that is not the current primary answers `resolve` from its own log.
    pub fenced_resolve: bool,
    /// A node configured primary that hears no coordinator at start becomes primary of the
    /// newest term it has seen.
    pub configured_role_fallback: bool,
}

/// A node's settings.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub id: NodeId,
    /// The other nodes.
    pub peers: Vec<NodeId>,
    /// Standbys that must hold a record before `replicated` is answered `Ok`.
    pub k: usize,
    /// The configured role: a preference sent with promises, never a grant.
    pub prefers_primary: bool,
    pub heartbeat: Time,
    pub deadline: Time,
    /// How long a starting node waits for the coordinator before it says so (it stays a
    /// standby either way).
    pub start_wait: Time,
    /// Most records in one shipment.
    pub chunk: usize,
    pub bugs: Bugs,
}

/// What a node finds on its disk at start: records with whether their checksum holds, the
/// synced mark (written at each sync), and the newest term it had seen.
#[derive(Clone, Debug, Default)]
pub struct DiskImage {
    pub records: Vec<(Record, bool)>,
    pub synced: Lsn,
    pub promised: Term,
}

/// A synced record failed its checksum: the node stops rather than cut it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "record at LSN {lsn} is damaged although it was synced (synced up to {synced}): corruption"
)]
pub struct Corruption {
    pub lsn: Lsn,
    pub synced: Lsn,
}

/// A node's log from its disk: what precedes the first bad record, if that record was never
/// synced (a torn write); corruption if it was.
///
/// # Errors
/// [`Corruption`] when a record at or below the synced mark is damaged.
pub fn recover(image: &DiskImage) -> Result<(Log, Lsn), Corruption> {
    let mut records = Vec::new();
    for &(record, intact) in &image.records {
        if !intact {
            if record.lsn <= image.synced {
                return Err(Corruption {
                    lsn: record.lsn,
                    synced: image.synced,
                });
            }
            break;
        }
        records.push(record);
    }
    let log = Log::from_records(records);
    let synced = image.synced.min(log.last_lsn());
    Ok((log, synced))
}

/// An input, with the time it happens.
#[derive(Clone, Debug)]
pub enum Input {
    Tick,
    Peer {
        from: NodeId,
        msg: Peer,
    },
    Coordinator(FromCoordinator),
    Client {
        from: ClientId,
        request: Request,
    },
    /// The disk synced everything written up to `upto`, in cut `generation`.
    Synced {
        upto: Lsn,
        generation: u64,
    },
}

/// An output, to carry out in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write `term` durably as the newest term seen (before what follows leaves the node).
    PersistTerm {
        term: Term,
    },
    /// Append these records to the log file (not synced).
    Write {
        records: Vec<Record>,
    },
    /// Sync what was written; answer `Synced { upto, generation }`.
    Sync {
        upto: Lsn,
        generation: u64,
    },
    /// Cut every record after `keep` into salvage, durably, with everything before synced.
    Cut {
        keep: Lsn,
        salvage: Vec<Record>,
    },
    Peer {
        to: NodeId,
        msg: Peer,
    },
    Coordinator(ToCoordinator),
    Client {
        to: ClientId,
        reply: Reply,
    },
}

#[derive(Clone, Debug)]
struct Follow {
    primary: NodeId,
    term: Term,
    stream: u64,
    cut_done: bool,
    last_heard: Time,
}

#[derive(Clone, Debug)]
struct Link {
    stream: u64,
    opened_at: Time,
    /// `None` until the standby's `Hello`; then the last LSN shipped.
    sent: Option<Lsn>,
    durable: Lsn,
    last_heard: Time,
    last_sent: Time,
    last_progress: Time,
}

#[derive(Clone, Debug)]
struct Waiter {
    client: ClientId,
    payload: u64,
    lsn: Lsn,
    deadline: Time,
}

#[derive(Clone, Debug)]
struct Primary {
    term: Term,
    /// LSN of the record that opened this term.
    start: Lsn,
    links: BTreeMap<NodeId, Link>,
    waiters: Vec<Waiter>,
    protected: Lsn,
    last_renew: Time,
}

#[derive(Clone, Debug)]
enum Role {
    Standby(Option<Follow>),
    Primary(Primary),
}

/// A node's state machine.
#[derive(Clone, Debug)]
pub struct Node {
    config: NodeConfig,
    log: Log,
    synced: Lsn,
    sync_asked: Lsn,
    generation: u64,
    promised: Term,
    /// An election this node is to promise, once its log is synced.
    promise_due: Option<Term>,
    /// The epoch this node last promised (a grant for it is taken).
    promise_sent: Option<Term>,
    role: Role,
    started: Time,
    heard_coordinator: bool,
    next_stream: u64,
    last_hello: Time,
    /// The newest stream this standby took, as (primary, term, stream): an `Open` of it or
    /// of an older one of that primary (a duplicate, or late) is ignored, so a stream's cut is
    /// made once and what the standby acknowledged on it never goes back.
    newest_stream: Option<(NodeId, Term, u64)>,
}

impl Node {
    /// A node starting at `now` on what [`recover`] read. It is a standby until granted.
    pub fn start(
        config: NodeConfig,
        log: Log,
        synced: Lsn,
        promised: Term,
        now: Time,
    ) -> (Node, Vec<Action>) {
        let promised = promised.max(log.last_term());
        let node = Node {
            config,
            log,
            synced,
            sync_asked: synced,
            generation: 0,
            promised,
            promise_due: None,
            promise_sent: None,
            role: Role::Standby(None),
            started: now,
            heard_coordinator: false,
            // Stream numbers grow across this node's restarts too (they start from the time
            // of the start), so a standby never takes a new stream for a duplicate of an old one.
            next_stream: u64::from(now as u32) << 16,
            newest_stream: None,
            last_hello: now,
        };
        (node, vec![Action::Coordinator(ToCoordinator::Hello)])
    }

    pub fn id(&self) -> NodeId {
        self.config.id
    }

    pub fn log(&self) -> &Log {
        &self.log
    }

    pub fn promised(&self) -> Term {
        self.promised
    }

    /// The term this node is primary of, if it is one.
    pub fn primary_term(&self) -> Option<Term> {
        match &self.role {
            Role::Primary(p) => Some(p.term),
            Role::Standby(_) => None,
        }
    }

    pub fn step(&mut self, now: Time, input: Input) -> Vec<Action> {
        let before = self.promised;
        let mut out = Vec::new();
        match input {
            Input::Tick => self.tick(now, &mut out),
            Input::Peer { from, msg } => self.peer(now, from, msg, &mut out),
            Input::Coordinator(msg) => self.coordinator(now, msg, &mut out),
            Input::Client { from, request } => self.client(now, from, request, &mut out),
            Input::Synced { upto, generation } => self.synced(upto, generation, &mut out),
        }
        debug_assert!(self.promised >= before, "terms never go down");
        self.debug_check();
        out
    }

    fn debug_check(&self) {
        debug_assert!(self.log.last_term() <= self.promised);
        debug_assert!(self.synced <= self.log.last_lsn());
        if let Role::Primary(p) = &self.role {
            debug_assert_eq!(p.term, self.promised, "a primary has seen no newer term");
            debug_assert!(p.protected <= self.log.last_lsn());
            debug_assert!(self.log.get(p.start).is_some_and(|r| r.term == p.term));
        }
    }

    // ---- time ----

    fn tick(&mut self, now: Time, out: &mut Vec<Action>) {
        self.sync_if_behind(out);
        if !self.heard_coordinator && now.saturating_sub(self.last_hello) >= self.config.heartbeat {
            self.last_hello = now;
            out.push(Action::Coordinator(ToCoordinator::Hello));
            let waited = now.saturating_sub(self.started) >= self.config.start_wait;
            if waited
                && self.config.prefers_primary
                && self.config.bugs.configured_role_fallback
                && self.primary_term().is_none()
            {
                self.become_primary(now, self.promised.max(Term(1)), out);
            }
        }
        match &mut self.role {
            Role::Standby(follow) => {
                if follow
                    .as_ref()
                    .is_some_and(|f| now.saturating_sub(f.last_heard) >= self.config.deadline)
                {
                    *follow = None;
                }
            }
            Role::Primary(_) => self.primary_tick(now, out),
        }
    }

    fn sync_if_behind(&mut self, out: &mut Vec<Action>) {
        if self.sync_asked < self.log.last_lsn() {
            self.sync_asked = self.log.last_lsn();
            out.push(Action::Sync {
                upto: self.sync_asked,
                generation: self.generation,
            });
        }
    }

    fn primary_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        if now.saturating_sub(p.last_renew) >= self.config.heartbeat {
            p.last_renew = now;
            out.push(Action::Coordinator(ToCoordinator::Renew { term: p.term }));
        }
        let peers: Vec<NodeId> = p.links.keys().copied().collect();
        for peer in peers {
            self.link_tick(now, peer, out);
        }
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let (expired, waiting): (Vec<Waiter>, Vec<Waiter>) =
            p.waiters.drain(..).partition(|w| w.deadline <= now);
        p.waiters = waiting;
        for w in expired {
            out.push(Action::Client {
                to: w.client,
                reply: Reply::Unprotected {
                    payload: w.payload,
                    term: p.term,
                    lsn: w.lsn,
                },
            });
        }
    }

    fn link_tick(&mut self, now: Time, peer: NodeId, out: &mut Vec<Action>) {
        let (heartbeat, deadline) = (self.config.heartbeat, self.config.deadline);
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let link = p.links.get_mut(&peer).expect("a link per peer");
        let silent = match link.sent {
            None => now.saturating_sub(link.opened_at),
            Some(_) => now.saturating_sub(link.last_heard),
        };
        if silent >= deadline {
            self.open_link(now, peer, out);
            return;
        }
        if let Some(sent) = link.sent {
            if sent > link.durable && now.saturating_sub(link.last_progress) >= 3 * heartbeat {
                // Shipments went unanswered: send again from what the standby holds.
                link.sent = Some(link.durable);
                link.last_progress = now;
            }
            let idle = now.saturating_sub(link.last_sent) >= heartbeat;
            self.ship(now, peer, idle, out);
        }
    }

    // ---- the coordinator ----

    fn coordinator(&mut self, now: Time, msg: FromCoordinator, out: &mut Vec<Action>) {
        self.heard_coordinator = true;
        match msg {
            FromCoordinator::Current { epoch, .. } => self.see_term(now, epoch, out),
            FromCoordinator::Renewed { .. } => {}
            FromCoordinator::Prepare { epoch } => {
                if epoch < self.promised {
                    return;
                }
                self.see_term(now, epoch, out);
                if self.primary_term() == Some(epoch) {
                    return;
                }
                if let Role::Standby(follow) = &mut self.role {
                    if follow.as_ref().is_some_and(|f| f.term < epoch) {
                        *follow = None;
                    }
                }
                self.promise_due = Some(epoch);
                self.sync_if_behind(out);
                self.send_promise(out);
            }
            FromCoordinator::Granted { epoch } => {
                let promised_it = self.promise_sent == Some(epoch) && self.promised == epoch;
                if promised_it && self.primary_term().is_none() {
                    self.become_primary(now, epoch, out);
                }
            }
        }
    }

    /// Learns of `term`: records it durably if newer, and a primary of an older term steps
    /// down.
    fn see_term(&mut self, _now: Time, term: Term, out: &mut Vec<Action>) {
        if term <= self.promised {
            return;
        }
        self.promised = term;
        self.promise_due = None;
        out.push(Action::PersistTerm { term });
        if let Role::Primary(p) = &mut self.role {
            for w in p.waiters.drain(..) {
                out.push(Action::Client {
                    to: w.client,
                    reply: Reply::InDoubt {
                        payload: w.payload,
                        term: p.term,
                        lsn: w.lsn,
                    },
                });
            }
            self.role = Role::Standby(None);
        }
    }

    fn send_promise(&mut self, out: &mut Vec<Action>) {
        let Some(epoch) = self.promise_due else {
            return;
        };
        if self.synced < self.log.last_lsn() || epoch != self.promised {
            return;
        }
        self.promise_sent = Some(epoch);
        out.push(Action::Coordinator(ToCoordinator::Promise {
            epoch,
            position: self.log.position(),
            prefers_primary: self.config.prefers_primary,
        }));
    }

    fn become_primary(&mut self, now: Time, term: Term, out: &mut Vec<Action>) {
        debug_assert!(term >= self.log.last_term());
        if term > self.promised {
            self.promised = term;
            out.push(Action::PersistTerm { term });
        }
        self.promise_due = None;
        let start = self.log.last_lsn() + 1;
        let opening = Record {
            term,
            lsn: start,
            payload: 0,
        };
        self.log.push(opening);
        out.push(Action::Write {
            records: vec![opening],
        });
        self.sync_if_behind(out);
        self.role = Role::Primary(Primary {
            term,
            start,
            links: BTreeMap::new(),
            waiters: Vec::new(),
            protected: 0,
            last_renew: now,
        });
        for peer in self.config.peers.clone() {
            self.open_link(now, peer, out);
        }
        out.push(Action::Coordinator(ToCoordinator::Renew { term }));
    }

    // ---- the primary's streams ----

    fn open_link(&mut self, now: Time, peer: NodeId, out: &mut Vec<Action>) {
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        self.next_stream += 1;
        let link = Link {
            stream: self.next_stream,
            opened_at: now,
            sent: None,
            durable: 0,
            last_heard: now,
            last_sent: now,
            last_progress: now,
        };
        p.links.insert(peer, link);
        out.push(Action::Peer {
            to: peer,
            msg: Peer::Open {
                term: p.term,
                stream: self.next_stream,
            },
        });
        self.recompute_protection(out);
    }

    /// Ships what `peer` lacks (or a heartbeat if `idle` and nothing is due).
    fn ship(&mut self, now: Time, peer: NodeId, idle: bool, out: &mut Vec<Action>) {
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let Some(link) = p.links.get_mut(&peer) else {
            return;
        };
        let Some(sent) = link.sent else { return };
        let records = self.log.slice_after(sent, self.config.chunk);
        if records.is_empty() && !idle {
            return;
        }
        link.sent = Some(sent + records.len() as Lsn);
        link.last_sent = now;
        let msg = Peer::Ship {
            term: p.term,
            stream: link.stream,
            after: sent,
            cut: false,
            records,
        };
        out.push(Action::Peer { to: peer, msg });
        self.recompute_protection(out);
    }

    fn hello(
        &mut self,
        now: Time,
        from: NodeId,
        stream: u64,
        history: &crate::log::History,
        last: Lsn,
        out: &mut Vec<Action>,
    ) {
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let Some(link) = p.links.get_mut(&from) else {
            return;
        };
        if link.stream != stream || link.sent.is_some() {
            return;
        }
        let agreed = divergence((&self.log.history(), self.log.last_lsn()), (history, last));
        debug_assert!(agreed <= last && agreed <= self.log.last_lsn());
        let records = self.log.slice_after(agreed, self.config.chunk);
        link.sent = Some(agreed + records.len() as Lsn);
        link.last_heard = now;
        link.last_sent = now;
        link.last_progress = now;
        let msg = Peer::Ship {
            term: p.term,
            stream,
            after: agreed,
            cut: true,
            records,
        };
        out.push(Action::Peer { to: from, msg });
    }

    fn ack(&mut self, now: Time, from: NodeId, stream: u64, durable: Lsn, out: &mut Vec<Action>) {
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let Some(link) = p.links.get_mut(&from) else {
            return;
        };
        if link.stream != stream || link.sent.is_none() {
            return;
        }
        link.last_heard = now;
        if durable > link.durable {
            link.durable = durable.min(self.log.last_lsn());
            link.last_progress = now;
        }
        self.recompute_protection(out);
    }

    /// Protected = the K-th highest LSN the standbys hold; releases the waiters it covers.
    fn recompute_protection(&mut self, out: &mut Vec<Action>) {
        let (k, early) = (self.config.k, self.config.bugs.ack_before_held);
        let Role::Primary(p) = &mut self.role else {
            return;
        };
        let mut held: Vec<Lsn> = p
            .links
            .values()
            .map(|l| {
                if early {
                    l.sent.unwrap_or(0)
                } else {
                    l.durable
                }
            })
            .collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        let protected = if k == 0 {
            self.log.last_lsn()
        } else {
            held.get(k - 1).copied().unwrap_or(0)
        };
        // The primary's own copy counts only once synced: a crash takes what it has not synced,
        // and an election hears only N - K nodes, so the K standbys and the primary must all
        // hold the record durably for one of those N - K to have it.
        p.protected = p.protected.max(protected.min(self.synced));
        let (done, waiting): (Vec<Waiter>, Vec<Waiter>) =
            p.waiters.drain(..).partition(|w| w.lsn <= p.protected);
        p.waiters = waiting;
        for w in done {
            out.push(Action::Client {
                to: w.client,
                reply: Reply::Ok {
                    payload: w.payload,
                    term: p.term,
                    lsn: w.lsn,
                },
            });
        }
    }

    // ---- the standby's side ----

    fn peer(&mut self, now: Time, from: NodeId, msg: Peer, out: &mut Vec<Action>) {
        match msg {
            Peer::Open { term, stream } => self.open(now, from, term, stream, out),
            Peer::Ship {
                term,
                stream,
                after,
                cut,
                records,
            } => self.take(now, from, (term, stream), after, cut, records, out),
            Peer::Hello {
                term,
                stream,
                history,
                last,
            } if self.primary_term() == Some(term) => {
                self.hello(now, from, stream, &history, last, out)
            }
            Peer::Ack {
                term,
                stream,
                durable,
            } if self.primary_term() == Some(term) => self.ack(now, from, stream, durable, out),
            Peer::Gap { term, stream } if self.primary_term() == Some(term) => {
                let Role::Primary(p) = &self.role else { return };
                if p.links.get(&from).is_some_and(|l| l.stream == stream) {
                    self.open_link(now, from, out);
                }
            }
            Peer::Refuse { seen } => self.see_term(now, seen, out),
            Peer::Hello { .. } | Peer::Ack { .. } | Peer::Gap { .. } => {}
        }
    }

    /// Whether a stream of `term` may be taken; refuses it (telling the sender) if not.
    fn admits(&mut self, now: Time, from: NodeId, term: Term, out: &mut Vec<Action>) -> bool {
        let stale = term < self.promised && !self.config.bugs.accept_stale_term;
        if stale || self.primary_term().is_some_and(|own| own >= term) {
            out.push(Action::Peer {
                to: from,
                msg: Peer::Refuse {
                    seen: self.promised,
                },
            });
            return false;
        }
        self.see_term(now, term, out);
        true
    }

    fn open(&mut self, now: Time, from: NodeId, term: Term, stream: u64, out: &mut Vec<Action>) {
        let seen = self
            .newest_stream
            .is_some_and(|(p, t, s)| (p, t) == (from, term) && stream <= s);
        if seen || !self.admits(now, from, term, out) {
            return;
        }
        self.newest_stream = Some((from, term, stream));
        self.role = Role::Standby(Some(Follow {
            primary: from,
            term,
            stream,
            cut_done: false,
            last_heard: now,
        }));
        let msg = Peer::Hello {
            term,
            stream,
            history: self.log.history(),
            last: self.log.last_lsn(),
        };
        out.push(Action::Peer { to: from, msg });
    }

    #[allow(clippy::too_many_arguments)]
    fn take(
        &mut self,
        now: Time,
        from: NodeId,
        (term, stream): (Term, u64),
        after: Lsn,
        cut: bool,
        records: Vec<Record>,
        out: &mut Vec<Action>,
    ) {
        if !self.admits(now, from, term, out) {
            return;
        }
        let Role::Standby(Some(follow)) = &mut self.role else {
            out.push(Action::Peer {
                to: from,
                msg: Peer::Gap { term, stream },
            });
            return;
        };
        if (follow.primary, follow.term, follow.stream) != (from, term, stream) {
            out.push(Action::Peer {
                to: from,
                msg: Peer::Gap { term, stream },
            });
            return;
        }
        follow.last_heard = now;
        if cut && !follow.cut_done {
            if after > self.log.last_lsn() {
                out.push(Action::Peer {
                    to: from,
                    msg: Peer::Gap { term, stream },
                });
                return;
            }
            follow.cut_done = true;
            self.cut(after, out);
        }
        let Role::Standby(Some(follow)) = &self.role else {
            return;
        };
        if !follow.cut_done || after > self.log.last_lsn() {
            return; // reordered ahead of what it continues: the primary sends it again
        }
        if !self.append(&records, out) {
            out.push(Action::Peer {
                to: from,
                msg: Peer::Gap { term, stream },
            });
            return;
        }
        self.sync_if_behind(out);
        out.push(Action::Peer {
            to: from,
            msg: Peer::Ack {
                term,
                stream,
                durable: self.synced,
            },
        });
    }

    /// Cuts what follows `keep` (the last LSN this log agrees on with its primary's).
    fn cut(&mut self, keep: Lsn, out: &mut Vec<Action>) {
        if self.log.last_lsn() <= keep {
            return;
        }
        let salvage = self.log.cut_after(keep);
        self.generation += 1;
        self.synced = keep;
        self.sync_asked = keep;
        out.push(Action::Cut { keep, salvage });
    }

    /// Appends the records that continue the log (skipping those it holds); false if one
    /// contradicts it.
    fn append(&mut self, records: &[Record], out: &mut Vec<Action>) -> bool {
        let mut new = Vec::new();
        for &record in records {
            match self.log.get(record.lsn) {
                Some(held) if *held == record => {}
                Some(_) => return false,
                None if record.lsn == self.log.last_lsn() + 1 => {
                    self.log.push(record);
                    new.push(record);
                }
                None => break,
            }
        }
        if !new.is_empty() {
            out.push(Action::Write { records: new });
        }
        true
    }

    fn synced(&mut self, upto: Lsn, generation: u64, out: &mut Vec<Action>) {
        if generation != self.generation {
            return;
        }
        self.synced = self.synced.max(upto.min(self.log.last_lsn()));
        self.send_promise(out);
        self.recompute_protection(out);
        if let Role::Standby(Some(f)) = &self.role {
            if f.cut_done {
                out.push(Action::Peer {
                    to: f.primary,
                    msg: Peer::Ack {
                        term: f.term,
                        stream: f.stream,
                        durable: self.synced,
                    },
                });
            }
        }
    }

    // ---- clients ----

    fn client(&mut self, now: Time, from: ClientId, request: Request, out: &mut Vec<Action>) {
        match request {
            Request::Commit { payload, deadline } => self.commit(now, from, payload, deadline, out),
            Request::Resolve { term, lsn } => {
                let reply = match self.resolution(term, lsn) {
                    Some(resolution) => Reply::Resolved {
                        term,
                        lsn,
                        resolution,
                    },
                    None => Reply::CannotResolve { term, lsn },
                };
                out.push(Action::Client { to: from, reply });
            }
        }
    }

    fn commit(
        &mut self,
        now: Time,
        from: ClientId,
        payload: u64,
        deadline: Time,
        out: &mut Vec<Action>,
    ) {
        let Role::Primary(p) = &mut self.role else {
            out.push(Action::Client {
                to: from,
                reply: Reply::NotPrimary { payload },
            });
            return;
        };
        let record = Record {
            term: p.term,
            lsn: self.log.last_lsn() + 1,
            payload,
        };
        self.log.push(record);
        p.waiters.push(Waiter {
            client: from,
            payload,
            lsn: record.lsn,
            deadline,
        });
        out.push(Action::Write {
            records: vec![record],
        });
        out.push(Action::Client {
            to: from,
            reply: Reply::Appended {
                payload,
                term: p.term,
                lsn: record.lsn,
            },
        });
        self.sync_if_behind(out);
        for peer in self.config.peers.clone() {
            self.ship(now, peer, false, out);
        }
    }

    /// The answer to `resolve(term, lsn)`, if this node may give one.
    fn resolution(&self, term: Term, lsn: Lsn) -> Option<crate::log::Resolution> {
        let current = match &self.role {
            Role::Primary(p) => p.term == self.promised && p.protected >= p.start,
            Role::Standby(_) => false,
        };
        if !current {
            return self
                .config
                .bugs
                .fenced_resolve
                .then(|| naive_resolution(&self.log, term, lsn));
        }
        let Role::Primary(p) = &self.role else {
            return None;
        };
        resolve(&self.log, p.term, p.start, p.protected, (term, lsn))
    }
}

/// What a node answers from its own log alone (the planted bug's answer): held means kept.
fn naive_resolution(log: &Log, term: Term, lsn: Lsn) -> crate::log::Resolution {
    match log.get(lsn) {
        Some(record) if record.term == term => crate::log::Resolution::Kept,
        _ => crate::log::Resolution::Lost,
    }
}

#[cfg(test)]
mod tests;
