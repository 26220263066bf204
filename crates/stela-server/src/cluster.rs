//! A node of a failover pair: its role, its epoch (the cluster's term, granted by the
//! coordinator), and the thread that keeps them: the primary renews with the coordinator on
//! every heartbeat; the standby, having heard nothing from its primary for the suspicion
//! period, asks the coordinator to promote it.
//!
//! Invariants:
//! - **The epoch never goes down** and is durable (`DIR/cluster/TERMS`, a `TermStore` whose
//!   current term is the epoch) before this node acts in it: a promoted node records its new
//!   epoch before it takes a client; a standby records an epoch it sees in a stream before it
//!   mirrors a byte of it.
//! - **Primary only by a grant.** A node is primary of an epoch only if the coordinator granted
//!   it that epoch, and the grant is recorded in the same file's history before it acts (the
//!   history lists the epochs this node held; an epoch it only followed is never in it). `--role`
//!   is a preference: it decides whether a node asks for the first grant of a new pair, never
//!   whether it is primary. A node that cannot reach the coordinator at start is a standby until
//!   one is granted. A node never becomes primary of an epoch it followed as a standby, nor of
//!   one older than the newest it has seen.
//! - **One primary per epoch, seen from a standby.** A standby takes a stream only from an
//!   epoch at least as new as its own, and within one epoch only from one node: a stream that
//!   claims an epoch this node holds itself, or one it followed from another node, is refused.
//! - **Fencing needs no coordinator.** Log terms carry the epoch in their high 32 bits, so a
//!   promoted node's terms are above every term of the primaries before it; its standby
//!   listener refuses streams of a lower epoch, so an old primary can never collect a
//!   `replicated` acknowledgement after a promotion, whatever the coordinator knows.
//! - **Losing the coordinator never demotes.** An unreachable coordinator makes failover
//!   unavailable (shown in `stela status`); only a coordinator that answers with a newer epoch,
//!   or a peer that shows one, makes a primary step down.
//! - **Stepping down is fail-stop.** A primary that learns of a newer epoch stops taking
//!   writes at once, tells every `replicated` waiter its commit is in doubt, writes what it
//!   buffered and exits (status 75); started again, it finds the coordinator's holder and
//!   rejoins as the standby, keeping what diverged in a salvage folder.

use crate::config::{FailoverConfig, NodeRole};
use crate::sync::lock;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use stela_coord::{CoordError, Coordinator, Election, Grant, Holder, Renewal, Report};
use stela_format::term::Term;
use stela_wal::storage::Storage;
use stela_wal::TermStore;

const PRIMARY: u8 = 0;
const STANDBY: u8 = 1;
const STEPPED_DOWN: u8 = 2;

/// What happens on a promotion, installed by the server: stop the standby's streams (every
/// chunk held is written and synced), then let clients in.
pub type PromoteHook = Box<dyn Fn(u64) + Send + Sync>;
/// What happens when this primary learns of a newer epoch: stop and exit.
pub type StepDownHook = Box<dyn Fn(String) + Send + Sync>;
/// What a standby does before it promises an epoch (it has recorded the epoch already): end
/// every stream it takes (each writes and syncs what it held), then say where each log ends.
pub type PromiseHook = Box<
    dyn Fn() -> Result<Vec<stela_coord::LogPosition>, Box<dyn std::error::Error + Send + Sync>>
        + Send
        + Sync,
>;

/// Why this node cannot take, record or follow an epoch. The messages are what the logs and a
/// refused stream say.
#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    /// The epoch file (`DIR/cluster/TERMS`) could not be created, read or written.
    #[error("{what}: {error}")]
    Store {
        what: String,
        error: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A node with a fixed role holds no grant.
    #[error("a node without a coordinator holds no grant")]
    NoCoordinator,
    /// A grant of an epoch older than one this node has seen, or one it followed as a standby.
    #[error("epoch {epoch} cannot be this node's: it has seen epoch {seen}{}", if *.as_standby { " as another node's standby" } else { "" })]
    NotThisNodes {
        epoch: u64,
        seen: u64,
        as_standby: bool,
    },
    /// A stream of an epoch older than this node's.
    #[error("stale epoch {epoch}: this standby is in epoch {ours}")]
    Stale { epoch: u64, ours: u64 },
    /// A stream claiming the epoch the coordinator granted this node.
    #[error("{primary} ships in epoch {epoch}, which the coordinator granted to this node ({node}): refused")]
    GrantedHere {
        primary: String,
        epoch: u64,
        node: String,
    },
    /// A second node shipping in one epoch.
    #[error("{primary} ships in epoch {epoch}, which {other} already shipped in: refused (one primary per epoch)")]
    SecondPrimary {
        primary: String,
        epoch: u64,
        other: String,
    },
    /// No way to read where this node's logs end (no promise hook installed).
    #[error("no way to read this node's positions")]
    NoPositions,
    /// Reading where this node's logs end failed.
    #[error("{0}")]
    Positions(Box<dyn std::error::Error + Send + Sync>),
}

/// A step of a stream's handshake in progress ([`Node::handshake_step`]).
pub struct HandshakeStep<'a>(&'a Node);

impl Drop for HandshakeStep<'_> {
    fn drop(&mut self) {
        self.0.heard_from_primary();
        self.0.handshake_steps.fetch_sub(1, Ordering::SeqCst);
    }
}

/// This node's place in the pair. Shared by the engine (which refuses writes unless primary),
/// the replication (terms, fencing) and the standby listener (epochs of streams).
pub struct Node {
    pub name: String,
    role: AtomicU8,
    epoch: AtomicU64,
    /// Whether a coordinator decides the roles (otherwise they are fixed by configuration and
    /// the epoch stays 0).
    clustered: bool,
    store: Mutex<Option<TermStore>>,
    /// The standby's last message from its primary.
    heard: Mutex<Instant>,
    /// Steps of a stream's handshake this standby is working on now (opening its copy,
    /// cutting it): the primary is waiting for this node then, so it is not silent.
    handshake_steps: AtomicU64,
    /// Unix ms since when a promoted primary acknowledges `replicated` without a standby; 0
    /// while protected.
    unprotected_since_ms: AtomicU64,
    after_failover_blocks: bool,
    /// `--role primary`: at start, with no holder at the coordinator, this node asks for the
    /// first grant (a preference only: the coordinator decides).
    prefers_primary: bool,
    /// The node whose stream last made this standby take up its epoch, with that epoch: no
    /// other node may ship in the same epoch (one primary per epoch).
    followed: Mutex<Option<(u64, String)>>,
    last_failover: Mutex<Option<stela_proto::FailoverReport>>,
    coordinator_view: Mutex<Option<stela_proto::CoordinatorStatus>>,
    last_answer: Mutex<Option<Instant>>,
    on_promote: OnceLock<PromoteHook>,
    on_step_down: OnceLock<StepDownHook>,
    on_promise: OnceLock<PromiseHook>,
    /// The other nodes (`--peer` flags) and K (`--replicas`): with more than one other node,
    /// elections are by promises and a promoted primary waits for K standbys.
    peers: usize,
    replicas: usize,
    /// The epoch this node promised in an election by promises, with what it reported, until
    /// the election is decided: its position cannot grow meanwhile (it takes no older stream).
    promised: Mutex<Option<(u64, Report)>>,
    /// The last epoch whose election this node said it waits for.
    waiting_logged: AtomicU64,
    stopping: AtomicBool,
    /// Whether the threads every `replicated` acknowledgement passes through ask for realtime
    /// scheduling (the event loop's setting, `--no-realtime`; see `crate::sched`).
    realtime_threads: AtomicBool,
}

impl Node {
    /// The node `config` describes: of a failover pair (`--coordinator`), or with its role fixed
    /// by `--standby` / `--repl-listen`.
    ///
    /// # Errors
    /// The pair's epoch file cannot be read.
    pub fn from_config(config: &crate::config::DaemonConfig) -> Result<Node, EpochError> {
        let node = match &config.failover {
            Some(failover) => Node::clustered(
                &config.node,
                &config.dir,
                Arc::clone(&config.storage),
                failover,
            )
            .map_err(|e| EpochError::Store {
                what: "the node's epoch".into(),
                error: Box::new(e),
            }),
            None if config.repl_listen.is_some() && config.standby.is_none() => {
                Ok(Node::fixed(&config.node, NodeRole::Standby))
            }
            None => Ok(Node::fixed(&config.node, NodeRole::Primary)),
        }?;
        let mut node = node;
        node.peers = config.standbys().len().max(1);
        node.replicas = config.replicas.clamp(1, node.peers);
        node.realtime_threads
            .store(config.realtime_loop, Ordering::Relaxed);
        Ok(node)
    }

    /// Whether the replication threads ask for realtime scheduling.
    pub(crate) fn realtime_threads(&self) -> bool {
        self.realtime_threads.load(Ordering::Relaxed)
    }

    /// A node whose role is fixed by configuration (no coordinator): epoch 0.
    pub fn fixed(name: &str, role: NodeRole) -> Node {
        Node::new(name, role, false, None, 0, false)
    }

    /// A node of a failover pair, its epoch read from `dir/cluster`.
    ///
    /// # Errors
    /// The epoch file cannot be read (damaged: refused, never read as 0).
    pub fn clustered(
        name: &str,
        dir: &Path,
        storage: Arc<dyn Storage>,
        config: &FailoverConfig,
    ) -> Result<Node, EpochError> {
        let dir = dir.join("cluster");
        // Durably: the epoch and the promises kept here must not vanish with a directory entry
        // a power cut took (found by the power-cut layer's runs for the logs' directories).
        stela_wal::storage::create_dir_durably(storage.as_ref(), &dir).map_err(|e| {
            EpochError::Store {
                what: format!("creating {}", dir.display()),
                error: Box::new(e),
            }
        })?;
        let store = TermStore::open(storage, &dir).map_err(|e| EpochError::Store {
            what: format!("reading {}", dir.display()),
            error: Box::new(e),
        })?;
        let epoch = store.current().0;
        Ok(Node::new(
            name,
            config.initial_role,
            true,
            Some(store),
            epoch,
            config.after_failover == crate::config::AfterFailover::Block,
        ))
    }

    fn new(
        name: &str,
        role: NodeRole,
        clustered: bool,
        store: Option<TermStore>,
        epoch: u64,
        after_failover_blocks: bool,
    ) -> Node {
        Node {
            name: name.to_owned(),
            // A node of a pair is a standby until the coordinator grants it an epoch
            // (`decide_role`); a fixed node has the role it is configured with.
            role: AtomicU8::new(match role {
                NodeRole::Primary if !clustered => PRIMARY,
                _ => STANDBY,
            }),
            epoch: AtomicU64::new(epoch),
            clustered,
            store: Mutex::new(store),
            heard: Mutex::new(Instant::now()),
            handshake_steps: AtomicU64::new(0),
            unprotected_since_ms: AtomicU64::new(0),
            after_failover_blocks,
            prefers_primary: role == NodeRole::Primary,
            followed: Mutex::new(None),
            last_failover: Mutex::new(None),
            coordinator_view: Mutex::new(None),
            last_answer: Mutex::new(None),
            on_promote: OnceLock::new(),
            on_step_down: OnceLock::new(),
            on_promise: OnceLock::new(),
            peers: 1,
            replicas: 1,
            promised: Mutex::new(None),
            waiting_logged: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            realtime_threads: AtomicBool::new(false),
        }
    }

    pub fn clustered_node(&self) -> bool {
        self.clustered
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    pub fn is_primary(&self) -> bool {
        self.role.load(Ordering::SeqCst) == PRIMARY
    }

    /// The epoch this node holds as the primary, the only one it may begin terms in: its epoch
    /// while it is the primary and (with a coordinator) holds that epoch. `None` once it has
    /// stepped down, or has seen a newer epoch (another node's: the step-down follows) — a
    /// log it opens then must not begin a term in that newer epoch, which belongs to another
    /// node (a failover run found a stepping-down primary beginning term 7.2 in its log while
    /// b held epoch 7: b's stream in 7.1 was then refused by that log for good).
    pub fn primary_epoch(&self) -> Option<u64> {
        if !self.is_primary() {
            return None;
        }
        let epoch = self.epoch();
        match lock(&self.store).as_ref() {
            None => Some(epoch),
            Some(store) => (store.history().last_term() == Term(epoch)).then_some(epoch),
        }
    }

    pub fn role_name(&self) -> &'static str {
        match self.role.load(Ordering::SeqCst) {
            PRIMARY => "primary",
            STANDBY => "standby",
            _ => "stepped down",
        }
    }

    /// Why this node takes no client writes, or `None` if it does.
    pub fn refusal(&self) -> Option<String> {
        if !self.clustered || self.is_primary() {
            return None;
        }
        Some(format!(
            "node {} is the {} in epoch {}; open the log on the primary",
            self.name,
            self.role_name(),
            self.epoch()
        ))
    }

    /// Why this node must not say what became of a record (`History`, behind
    /// `Wal::resolve`), or `None` if it may: only the primary of the newest epoch it knows the
    /// coordinator granted answers. A standby, a primary that stepped down, or one whose
    /// coordinator has named a newer epoch holds a history a newer primary may have replaced:
    /// its `Kept` or `Lost` would not be final.
    pub fn resolution_refusal(&self) -> Option<String> {
        if !self.clustered {
            return None;
        }
        if let Some(refusal) = self.refusal() {
            return Some(refusal);
        }
        let granted = lock(&self.coordinator_view).as_ref().map_or(0, |v| v.epoch);
        (granted > self.epoch()).then(|| {
            format!(
                "node {} is the primary of epoch {}, but the coordinator has granted epoch {granted}: ask the newer primary",
                self.name,
                self.epoch()
            )
        })
    }

    /// Raises the epoch durably to `epoch` (no-op if not higher). Fails if the file cannot be
    /// written: the node must not act in an epoch it could forget.
    fn observe_epoch(&self, epoch: u64) -> Result<(), EpochError> {
        let mut store = lock(&self.store);
        if epoch <= self.epoch() {
            return Ok(());
        }
        if let Some(store) = store.as_mut() {
            store.observe(Term(epoch)).map_err(|e| EpochError::Store {
                what: format!("recording epoch {epoch}"),
                error: Box::new(e),
            })?;
        }
        self.epoch.store(epoch, Ordering::SeqCst);
        Ok(())
    }

    /// A message from the primary arrived (the standby's suspicion clock restarts).
    pub fn heard_from_primary(&self) {
        *lock(&self.heard) = Instant::now();
    }

    /// The standby works on a step of a stream's handshake until the guard is dropped: the
    /// suspicion clock stands still meanwhile and restarts at the end (the primary waits for
    /// this node; the time it takes, opening or cutting a large copy, is not the primary's
    /// silence). Only this node's own work is covered, never a wait for the primary.
    pub fn handshake_step(&self) -> HandshakeStep<'_> {
        self.handshake_steps.fetch_add(1, Ordering::SeqCst);
        HandshakeStep(self)
    }

    /// Whether this node became the primary by a promotion in this process (its logs' current
    /// terms began with records it received from the old primary's streams).
    pub fn promoted_here(&self) -> bool {
        lock(&self.last_failover).is_some()
    }

    /// Whether a promoted primary acknowledges `replicated` without a standby now; counts it.
    pub fn unprotected(&self) -> bool {
        self.unprotected_since_ms.load(Ordering::SeqCst) != 0
    }

    /// The old primary rejoined as this primary's standby and holds, for every log, what the
    /// log acknowledged without it: called only by the replication's registry of those logs
    /// (`replication::reprotection`), never for one log alone.
    pub fn protected_again(&self) {
        if self.unprotected_since_ms.swap(0, Ordering::SeqCst) != 0 {
            tracing::warn!("a standby is back: replicated commits wait for it again");
        }
    }

    /// Installs what a promotion does (the server).
    pub fn on_promote(&self, hook: PromoteHook) {
        let _ = self.on_promote.set(hook);
    }

    /// Installs what stepping down does (the server).
    pub fn on_step_down(&self, hook: StepDownHook) {
        let _ = self.on_step_down.set(hook);
    }

    /// Installs what a standby does before it promises an epoch (the server).
    pub fn on_promise(&self, hook: PromiseHook) {
        let _ = self.on_promise.set(hook);
    }

    /// Whether elections are by promises: more than two nodes.
    pub fn elects_by_promises(&self) -> bool {
        self.clustered && self.peers > 1
    }

    /// Promises an election needs: N − K.
    fn promises_needed(&self) -> u32 {
        (self.peers + 1 - self.replicas) as u32
    }

    /// A newer epoch exists: stop being primary at once (once).
    pub fn step_down(&self, why: String) {
        if !self.clustered {
            tracing::error!(why, "a newer primary exists");
            return;
        }
        let was = self.role.swap(STEPPED_DOWN, Ordering::SeqCst);
        if was == STEPPED_DOWN {
            return;
        }
        tracing::error!(why, "stepping down: a newer epoch exists");
        if let Some(hook) = self.on_step_down.get() {
            hook(why);
        }
    }

    /// Stops the coordination thread (shutdown).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether the daemon is shutting down ([`Node::stop`]).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Status fields of this node: its role, epoch, view of the coordinator, last failover and
    /// since when it is unprotected. The role is read first: a promotion records its report
    /// before its role ([`Node::promote`]), so a status that says primary has the report too.
    pub fn status(
        &self,
    ) -> (
        &'static str,
        u64,
        Option<stela_proto::CoordinatorStatus>,
        Option<stela_proto::FailoverReport>,
        u64,
    ) {
        let role = self.role_name();
        let view = lock(&self.coordinator_view).clone().map(|mut view| {
            view.last_answer_ms =
                lock(&self.last_answer).map_or(u64::MAX, |at| at.elapsed().as_millis() as u64);
            view
        });
        (
            role,
            self.epoch(),
            view,
            lock(&self.last_failover).clone(),
            self.unprotected_since_ms.load(Ordering::SeqCst),
        )
    }

    fn answered(&self, describe: &str, epoch: u64, holder: Option<String>) {
        *lock(&self.last_answer) = Some(Instant::now());
        *lock(&self.coordinator_view) = Some(stela_proto::CoordinatorStatus {
            describe: describe.to_owned(),
            reachable: true,
            last_answer_ms: 0,
            epoch,
            holder,
        });
    }

    fn unreachable(&self, describe: &str, error: &CoordError) {
        let mut view = lock(&self.coordinator_view);
        let was_reachable = view.as_ref().is_none_or(|v| v.reachable);
        let (epoch, holder) = view
            .as_ref()
            .map_or((self.epoch(), None), |v| (v.epoch, v.holder.clone()));
        *view = Some(stela_proto::CoordinatorStatus {
            describe: describe.to_owned(),
            reachable: false,
            last_answer_ms: 0,
            epoch,
            holder,
        });
        if was_reachable {
            tracing::warn!(coordinator = describe, %error, "the coordinator is unreachable: the pair runs on, but failover is unavailable until it answers");
        }
    }

    /// At start: the role the coordinator grants. Its holder is this node, in an epoch this
    /// node recorded as granted to it (or newer than any it has seen: the answer to a grant
    /// was lost): primary of that epoch. Another node: standby. No holder yet: a node that
    /// prefers to be primary (`--role primary`) asks for the first grant. Anything else, an
    /// unreachable coordinator included, is a standby, which asks for a grant once no primary
    /// is heard from for the suspicion period (`run`).
    pub fn decide_role(&self, coordinator: &dyn Coordinator) {
        let describe = coordinator.describe();
        match coordinator.current() {
            Ok(holder) => {
                self.answered(&describe, holder.epoch, holder.holder.clone());
                match holder.holder.as_deref() {
                    Some(name) if name == self.name => match self.take_grant(holder.epoch) {
                        Ok(()) => self.role.store(PRIMARY, Ordering::SeqCst),
                        Err(why) => tracing::warn!(
                            why = %why,
                            "the coordinator names this node, but it cannot resume that epoch: starting as a standby"
                        ),
                    },
                    Some(other) => {
                        // A standby's epoch is the newest it followed or held, never one it
                        // only heard of: it is what it shows the coordinator when it asks to be
                        // promoted, and an epoch it missed may hold records it lacks (the
                        // coordinator refuses it then). Adopting the holder's epoch here made
                        // an old primary, restarted and not yet caught up, a candidate: a new
                        // primary that was slow to renew for one lease lost its place to it, and
                        // its whole epoch went to salvage (`tests/failover.rs`; the likely
                        // reading of a CI failure on 2026-11-28). The epoch is taken up when the
                        // holder's stream arrives (`Node::accept_stream`).
                        tracing::info!(
                            primary = other,
                            epoch = holder.epoch,
                            "the coordinator names another primary: starting as its standby"
                        );
                    }
                    // With elections by promises, only a new cluster's first epoch is asked
                    // for so; an open election (no holder, a later epoch) is joined by
                    // promising once the primary is silent (`run`).
                    None if self.prefers_primary
                        && (!self.elects_by_promises() || holder.epoch == 0) =>
                    {
                        self.claim_first_grant(coordinator)
                    }
                    None => {}
                }
            }
            Err(error) => {
                self.unreachable(&describe, &error);
                tracing::warn!(
                    "the coordinator cannot be reached at start: starting as a standby until it grants this node an epoch (--role is a preference, never a grant)"
                );
            }
        }
        *lock(&self.heard) = Instant::now();
    }

    /// A new pair (no holder at the coordinator) and this node prefers to be primary: asks
    /// for the first grant; primary only if it is granted.
    fn claim_first_grant(&self, coordinator: &dyn Coordinator) {
        let describe = coordinator.describe();
        match coordinator.promote(&self.name, self.epoch()) {
            Ok(Grant::Granted { epoch }) => {
                self.answered(&describe, epoch, Some(self.name.clone()));
                match self.take_grant(epoch) {
                    Ok(()) => self.role.store(PRIMARY, Ordering::SeqCst),
                    Err(why) => {
                        tracing::error!(why = %why, "cannot take the granted epoch: standby")
                    }
                }
            }
            Ok(Grant::Refused {
                epoch,
                holder,
                reason,
            }) => {
                self.answered(&describe, epoch, holder);
                tracing::info!(reason, "the coordinator refuses the first grant: standby");
            }
            Err(error) => self.unreachable(&describe, &error),
        }
    }

    /// Records that the coordinator granted this node `epoch`, durably, before it acts as its
    /// primary: the epoch enters this node's history of held epochs and becomes its current
    /// one. Refused for an epoch older than the newest this node has seen, and for one it has
    /// seen without holding it (it followed another node's stream in it): a node never
    /// acknowledges in an epoch older than one it has seen, and never shares one.
    fn take_grant(&self, epoch: u64) -> Result<(), EpochError> {
        // An epoch this node promised (and followed no one in) is one it may take: it saw it
        // only as a candidate, and the coordinator grants it to one node. Read before the
        // store's lock, which `accept_stream` takes under `followed`.
        let promised = lock(&self.promised).as_ref().map(|(e, _)| *e);
        let followed = lock(&self.followed).as_ref().map(|(e, _)| *e);
        let promised_here = promised == Some(epoch) && followed != Some(epoch);
        let mut store = lock(&self.store);
        let Some(store) = store.as_mut() else {
            return Err(EpochError::NoCoordinator);
        };
        let ours = self.epoch();
        let held = store.history().last_term() == Term(epoch);
        if epoch == 0 || epoch < ours || (epoch == ours && !held && !promised_here) {
            return Err(EpochError::NotThisNodes {
                epoch,
                seen: ours,
                as_standby: epoch == ours,
            });
        }
        if !held {
            store.begin(Term(epoch), 1).map_err(|e| EpochError::Store {
                what: format!("recording the grant of epoch {epoch}"),
                error: Box::new(e),
            })?;
        }
        debug_assert_eq!(store.current(), Term(epoch));
        debug_assert_eq!(store.history().last_term(), Term(epoch));
        self.epoch.store(epoch, Ordering::SeqCst);
        Ok(())
    }

    /// Whether this standby takes a stream from `primary` shipping in `epoch`, and if so the
    /// epoch is recorded first. Refused: a stream from an epoch older than this node's, one
    /// claiming an epoch this node holds itself, or one another node already ships in (two
    /// nodes claiming one epoch: at most one was granted it).
    pub(crate) fn accept_stream(&self, epoch: u64, primary: &str) -> Result<(), EpochError> {
        let mut followed = lock(&self.followed);
        let ours = self.epoch();
        if epoch < ours {
            return Err(EpochError::Stale { epoch, ours });
        }
        if epoch == ours {
            let held_here = lock(&self.store)
                .as_ref()
                .is_some_and(|s| s.history().last_term() == Term(epoch));
            if held_here {
                return Err(EpochError::GrantedHere {
                    primary: primary.to_owned(),
                    epoch,
                    node: self.name.clone(),
                });
            }
            if let Some((_, other)) = followed
                .as_ref()
                .filter(|(e, n)| *e == epoch && n != primary)
            {
                return Err(EpochError::SecondPrimary {
                    primary: primary.to_owned(),
                    epoch,
                    other: other.clone(),
                });
            }
        }
        self.observe_epoch(epoch)?;
        *followed = Some((epoch, primary.to_owned()));
        drop(followed);
        // An election this node promised in is decided: its winner ships now.
        lock(&self.promised).take_if(|(promised, _)| *promised <= epoch);
        Ok(())
    }

    /// The coordination loop (its own thread): renewals while primary, suspicion and promotion
    /// requests while standby.
    pub fn run(self: &Arc<Node>, coordinator: &dyn Coordinator, config: &FailoverConfig) {
        let describe = coordinator.describe();
        let mut refused_logged = false;
        let mut beats = 0u64;
        while !self.stopping.load(Ordering::SeqCst) {
            std::thread::sleep(self.pause(config));
            beats += 1;
            match self.role.load(Ordering::SeqCst) {
                PRIMARY => match coordinator.renew(&self.name, self.epoch()) {
                    Ok(Renewal::Renewed { epoch }) => {
                        self.answered(&describe, epoch, Some(self.name.clone()));
                    }
                    Ok(Renewal::Superseded { epoch, holder }) => {
                        self.answered(&describe, epoch, Some(holder.clone()));
                        self.step_down(format!(
                            "the coordinator gave epoch {epoch} to {holder} (this node is in epoch {})",
                            self.epoch()
                        ));
                    }
                    Err(error) => self.unreachable(&describe, &error),
                },
                STANDBY => {
                    let silent = if self.handshake_steps.load(Ordering::SeqCst) > 0 {
                        Duration::ZERO
                    } else {
                        lock(&self.heard).elapsed()
                    };
                    if silent >= config.heartbeat * 2
                        && silent < config.suspect_after
                        && self.take_handover(coordinator, &describe, silent)
                    {
                        continue;
                    }
                    if silent < config.suspect_after {
                        // A healthy standby still looks at the coordinator now and then, so
                        // that `stela status` says whether failover is available; with
                        // elections by promises every beat, and it joins an election another
                        // node opened at once rather than after its own suspicion period
                        // (`joins_open_election`).
                        let every = if self.elects_by_promises() { 1 } else { 10 };
                        if beats.is_multiple_of(every) {
                            match coordinator.current() {
                                Ok(holder) => {
                                    let join = self.joins_open_election(&holder);
                                    self.answered(&describe, holder.epoch, holder.holder);
                                    if join {
                                        self.elect(coordinator, silent, &mut refused_logged);
                                    }
                                }
                                Err(error) => self.unreachable(&describe, &error),
                            }
                        }
                        continue;
                    }
                    if self.elects_by_promises() {
                        self.elect(coordinator, silent, &mut refused_logged);
                        continue;
                    }
                    match coordinator.promote(&self.name, self.epoch()) {
                        Ok(Grant::Granted { epoch }) => {
                            self.answered(&describe, epoch, Some(self.name.clone()));
                            self.promote(epoch, silent);
                            refused_logged = false;
                        }
                        Ok(Grant::Refused {
                            epoch,
                            holder,
                            reason,
                        }) => {
                            self.answered(&describe, epoch, holder);
                            if !refused_logged {
                                tracing::warn!(
                                    silent_ms = silent.as_millis() as u64,
                                    reason,
                                    "the primary is silent, but the coordinator refuses a promotion"
                                );
                                refused_logged = true;
                            }
                        }
                        Err(error) => self.unreachable(&describe, &error),
                    }
                }
                _ => return,
            }
        }
    }

    /// How long the coordination loop sleeps before its next step: a heartbeat, but a standby
    /// whose suspicion period ends sooner wakes when it ends. Woken only every heartbeat, a
    /// standby suspected its primary up to a heartbeat late (on average half of one: 25 ms of
    /// the 300 ms suspicion with the defaults), and every failover waited for it.
    fn pause(&self, config: &FailoverConfig) -> Duration {
        if self.role.load(Ordering::SeqCst) != STANDBY
            || self.handshake_steps.load(Ordering::SeqCst) > 0
        {
            return config.heartbeat;
        }
        let silent = lock(&self.heard).elapsed();
        match config.suspect_after.checked_sub(silent) {
            Some(left) => left
                .saturating_add(Duration::from_millis(1))
                .min(config.heartbeat),
            None => config.heartbeat,
        }
    }

    /// Whether this standby, not yet suspecting its primary, promises in the election the
    /// coordinator shows open (no holder, an epoch at least this node's, past a new cluster's
    /// first grant). Another node suspected the primary and opened it; from then the old
    /// holder's renewals are refused and it steps down, so waiting out this node's own
    /// suspicion period would only delay the next primary: a node restarted a moment ago, or
    /// one that heard from the primary later than the node that asked, promised up to a
    /// second after the first promise (`stela-bench failover --nodes 3`, pause-new), and an
    /// election needs two.
    fn joins_open_election(&self, shown: &Holder) -> bool {
        self.elects_by_promises()
            && shown.holder.is_none()
            && shown.epoch > 0
            && shown.epoch >= self.epoch()
    }

    /// A planned switchover (`stela cluster switchover`, [`stela_coord::rules::hand_over`])
    /// handed this node the next epoch: its primary went quiet because it stepped down, so it
    /// takes the epoch now rather than a suspicion period later. Asked once the primary has
    /// missed two heartbeats; `true` if this node was promoted.
    fn take_handover(
        &self,
        coordinator: &dyn Coordinator,
        describe: &str,
        silent: Duration,
    ) -> bool {
        let Ok(current) = coordinator.current() else {
            return false;
        };
        if current.holder.as_deref() != Some(self.name.as_str()) || current.epoch <= self.epoch() {
            return false;
        }
        match coordinator.promote(&self.name, self.epoch()) {
            Ok(Grant::Granted { epoch }) => {
                tracing::warn!(
                    epoch,
                    "the primary handed this node the next epoch (switchover): promoting"
                );
                self.answered(describe, epoch, Some(self.name.clone()));
                self.promote(epoch, silent);
                true
            }
            _ => false,
        }
    }

    /// One step of an election by promises (more than two nodes), once the primary has been
    /// silent for the suspicion period: ask for an election, or promise again the epoch this
    /// node promised (with what it reported then), and act on the answer.
    fn elect(&self, coordinator: &dyn Coordinator, silent: Duration, logged: &mut bool) {
        let describe = coordinator.describe();
        let needed = self.promises_needed();
        let promised = lock(&self.promised)
            .clone()
            .filter(|(epoch, _)| *epoch >= self.epoch());
        let answer = match &promised {
            Some((epoch, report)) => coordinator.promise(&self.name, *epoch, needed, report),
            None => coordinator.ask(&self.name, self.epoch(), needed),
        };
        let answer = match answer {
            Ok(Election::Prepare { epoch }) if epoch < self.epoch() => {
                tracing::warn!(
                    epoch,
                    ours = self.epoch(),
                    "the coordinator prepares an epoch older than this node's: no promise"
                );
                return;
            }
            Ok(Election::Prepare { epoch }) => match self.make_promise(epoch) {
                Ok(report) => coordinator.promise(&self.name, epoch, needed, &report),
                Err(why) => {
                    tracing::error!(
                        epoch,
                        why = %why,
                        "cannot promise the epoch: this node takes no part in the election"
                    );
                    return;
                }
            },
            other => other,
        };
        match answer {
            Err(error) => self.unreachable(&describe, &error),
            Ok(answer) => self.election_answer(&describe, answer, silent, logged),
        }
    }

    /// Records `epoch` as seen (durably, before anything is reported: from now on this node
    /// takes no stream of an older epoch), ends the streams it takes (each writes and syncs
    /// what it held), and reads where each log ends: what it promises with. Its position
    /// cannot grow after this but by the stream of the epoch's winner.
    fn make_promise(&self, epoch: u64) -> Result<Report, EpochError> {
        let started = Instant::now();
        self.observe_epoch(epoch)?;
        let recorded = started.elapsed();
        let positions = match self.on_promise.get() {
            Some(hook) => hook().map_err(EpochError::Positions)?,
            None => return Err(EpochError::NoPositions),
        };
        let report = Report {
            positions,
            prefers_primary: self.prefers_primary,
        };
        // The time each step took: a promise is on every failover's path.
        tracing::warn!(
            epoch,
            positions = ?report.positions,
            record_epoch_ms = recorded.as_millis() as u64,
            took_ms = started.elapsed().as_millis() as u64,
            "promised the epoch to the coordinator"
        );
        *lock(&self.promised) = Some((epoch, report.clone()));
        Ok(report)
    }

    fn election_answer(
        &self,
        describe: &str,
        answer: Election,
        silent: Duration,
        logged: &mut bool,
    ) {
        match answer {
            Election::Granted { epoch } => {
                self.answered(describe, epoch, Some(self.name.clone()));
                self.promote(epoch, silent);
                *logged = false;
            }
            Election::Waiting {
                epoch,
                heard,
                needed,
                reason,
            } => {
                self.answered(describe, epoch, None);
                // Said once per epoch (the answer comes every heartbeat while it waits).
                if self.waiting_logged.swap(epoch, Ordering::SeqCst) != epoch {
                    tracing::warn!(
                        epoch,
                        heard,
                        needed,
                        reason,
                        "the election waits for more promises"
                    );
                }
            }
            Election::Refused {
                epoch,
                holder,
                reason,
            } => {
                self.answered(describe, epoch, holder.clone());
                let decided = holder.as_deref().is_some_and(|h| h != self.name);
                let open = holder.is_none()
                    && lock(&self.promised)
                        .as_ref()
                        .is_some_and(|(e, _)| *e == epoch);
                if decided || !open {
                    // Another node won (its stream comes next: the suspicion clock restarts),
                    // or the election moved on: ask again next time.
                    *lock(&self.promised) = None;
                    if decided {
                        self.heard_from_primary();
                    }
                }
                if !*logged {
                    tracing::warn!(
                        silent_ms = silent.as_millis() as u64,
                        reason,
                        "the primary is silent, but the coordinator does not grant this node"
                    );
                    *logged = true;
                }
            }
            Election::Prepare { epoch } => {
                tracing::warn!(epoch, "the coordinator asked for a promise again");
            }
        }
    }

    /// Becomes the primary of `epoch`: records it, stops the streams (everything held is
    /// written), then takes clients.
    fn promote(&self, epoch: u64, silent: Duration) {
        let started = Instant::now();
        if let Err(why) = self.take_grant(epoch) {
            tracing::error!(why = %why, "cannot take the granted epoch: not promoting");
            return;
        }
        let recorded = started.elapsed();
        if let Some(hook) = self.on_promote.get() {
            hook(epoch);
        }
        let hooked = started.elapsed() - recorded;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        // With more than two nodes the remaining standbys protect a promoted primary at once:
        // its `replicated` commits wait for K of them, never answered from its memory alone.
        if !self.after_failover_blocks && !self.elects_by_promises() {
            self.unprotected_since_ms.store(now_ms, Ordering::SeqCst);
        }
        *lock(&self.promised) = None;
        let took = silent + started.elapsed();
        // The report before the role: a status that says primary also says how it became one
        // (read between the two, it said primary with no failover, and a test failed so).
        *lock(&self.last_failover) = Some(stela_proto::FailoverReport {
            at_unix_ms: now_ms,
            epoch,
            reason: format!(
                "the primary was silent for {} ms and the coordinator granted epoch {epoch}",
                silent.as_millis()
            ),
            took_ms: took.as_millis() as u64,
        });
        self.role.store(PRIMARY, Ordering::SeqCst);
        tracing::warn!(
            epoch,
            took_ms = took.as_millis() as u64,
            record_epoch_ms = recorded.as_millis() as u64,
            end_streams_ms = hooked.as_millis() as u64,
            "promoted: this node is the primary"
        );
    }
}

#[cfg(test)]
mod tests;
