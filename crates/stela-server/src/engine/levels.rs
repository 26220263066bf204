//! Which acknowledgement levels this daemon serves, and how a wait at each is registered:
//! `disk` with the pool (the flusher's completion), `replicated` with K standbys'
//! acknowledgements that they hold the record in memory ([`crate::replication`]), `all` with
//! the local sync, then K standbys' acknowledgements that it is synced on their disks.

use super::local_copy::LocalCopy;
use super::{Engine, ReleaseHook, Waiter};
use crate::config::DaemonConfig;
use crate::error::{Error, Result};
use crate::pool::LogId;
use crate::replication::{Holds, Replicas, Replication};
use crate::sync::lock;
use std::sync::{Arc, Mutex, OnceLock};
use stela_proto::Durability;

/// What high availability adds to the engine: this node's role and epoch, its shipping to the
/// standby, what `stela status` shows of the standby role, and how opens are kept apart.
pub struct Availability {
    /// Shipping to the standby (`--standby`): what `replicated` and `all` wait for.
    pub(super) replication: Option<Arc<Replicas>>,
    /// The standby role's streams, for `stela status` (`--repl-listen`).
    pub(super) standby_view: OnceLock<StandbyView>,
    /// This node's role and epoch (fixed by configuration, or by the failover coordinator).
    pub(super) node: Arc<crate::cluster::Node>,
    /// Opens in progress and the logs held open for shipping.
    pub(super) opens: super::queries::Opens,
    /// With three nodes or more: the primary's own copy of `replicated` records, written before
    /// they are acknowledged ([`LocalCopy`]).
    pub(super) local_copy: Option<Arc<LocalCopy>>,
}

/// This node and its shipping, as `config` describes them.
///
/// # Errors
/// The node's epoch file cannot be read, or the TLS files for the standby do not load.
pub(super) fn availability(
    config: &DaemonConfig,
    hook: &Arc<OnceLock<ReleaseHook>>,
) -> std::result::Result<Availability, crate::error::StartError> {
    let node = Arc::new(
        crate::cluster::Node::from_config(config)
            .map_err(|e| crate::error::StartError::Config(e.to_string()))?,
    );
    let replication = replication(config, &node, hook)?;
    let local_copy = (replication.is_some() && node.elects_by_promises()).then(|| {
        let hook = Arc::clone(hook);
        let released: Arc<dyn Fn() + Send + Sync> = Arc::new(move || {
            if let Some(hook) = hook.get() {
                hook(false);
            }
        });
        Arc::new(LocalCopy::new(Arc::clone(&config.storage), released))
    });
    Ok(Availability {
        replication,
        standby_view: OnceLock::new(),
        opens: super::queries::Opens::default(),
        node,
        local_copy,
    })
}

/// The primary's replication, if this daemon has a standby. After releasing waiters it calls
/// the release hook once, as a flusher does after a round, so the event loop is woken once per
/// acknowledgement of the standby, not once per waiter.
///
/// # Errors
/// The TLS files for the standby do not load.
fn replication(
    config: &DaemonConfig,
    node: &Arc<crate::cluster::Node>,
    hook: &Arc<OnceLock<ReleaseHook>>,
) -> std::result::Result<Option<Arc<Replicas>>, crate::error::StartError> {
    let standbys = config.standbys();
    if standbys.is_empty() {
        return Ok(None);
    }
    let hook = Arc::clone(hook);
    let released: crate::replication::Released = Arc::new(move || {
        if let Some(hook) = hook.get() {
            hook(false);
        }
    });
    let token = config
        .standby_token_file
        .as_deref()
        .map(stela_net::tls::read_client_token)
        .transpose()?;
    let mut peers = Vec::with_capacity(standbys.len());
    for standby in standbys {
        peers.push(Arc::new(Replication::new(
            standby,
            Arc::clone(node),
            Arc::clone(&released),
            config.degrade_after,
            standby_tls(config, standby)?,
            token.clone(),
        )));
    }
    Ok(Some(Arc::new(Replicas::new(peers, config.replicas))))
}

/// TLS to `standby`, if the configuration asks for it.
///
/// # Errors
/// The TLS files do not load.
fn standby_tls(
    config: &DaemonConfig,
    standby: std::net::SocketAddr,
) -> std::result::Result<Option<crate::replication::StandbyTls>, crate::error::StartError> {
    let Some(files) = &config.standby_tls else {
        return Ok(None);
    };
    let host = config
        .standby_name
        .clone()
        .unwrap_or_else(|| standby.ip().to_string());
    Ok(Some(crate::replication::StandbyTls {
        config: stela_net::tls::client_config(files)?,
        name: stela_net::tls::server_name(&host)?,
    }))
}

/// What `stela status` shows of the standby role.
pub type StandbyView = Box<dyn Fn() -> stela_proto::ReplicationStatus + Send + Sync>;

impl Engine {
    /// Installs what `stela status` shows of the standby role (the server, once it listens).
    pub fn on_standby_status(&self, view: StandbyView) {
        let _ = self.ha.standby_view.set(view);
    }

    /// The replication part of `stela status`: the primary's shipping or the standby's streams.
    pub(super) fn replication_status(
        &self,
        end: impl Fn(LogId) -> (u64, Option<(u64, u64, u64)>),
    ) -> Option<stela_proto::ReplicationStatus> {
        match (&self.ha.replication, self.ha.standby_view.get()) {
            // A node of a failover pair has both ends. While it is the standby, its status is
            // the streams it mirrors (a follower on the standby, `stela mount-follow` or
            // `stela store-follow`, applies only what they report durable); its shipping side
            // has no logs then.
            (Some(_), Some(view)) if !self.node().is_primary() => Some(view()),
            (Some(replication), _) => Some(replication.status(end)),
            (None, Some(view)) => Some(view()),
            (None, None) => None,
        }
    }

    /// Refuses a level this daemon cannot serve: `replicated` and `all` need a standby.
    pub fn check_level(&self, durability: Durability) -> Result<()> {
        match durability {
            Durability::Unsafe | Durability::Buffered | Durability::Disk => Ok(()),
            Durability::Replicated | Durability::All if self.ha.replication.is_some() => Ok(()),
            Durability::Replicated | Durability::All => Err(Error::Unsupported(durability)),
        }
    }

    /// Whether an acknowledgement at `durability` waits for something after the append.
    pub fn waits(durability: Durability) -> bool {
        matches!(
            durability,
            Durability::Disk | Durability::Replicated | Durability::All
        )
    }

    /// Calls `waiter` once `lsn` of `log` is acknowledged at `durability` (a level that
    /// [`Engine::waits`]). `Ok(true)`: it already is, and `waiter` is dropped uncalled.
    pub fn when_acked(
        &self,
        log: LogId,
        lsn: u64,
        durability: Durability,
        waiter: Waiter,
    ) -> Result<bool> {
        let replication = match (&self.ha.replication, durability) {
            (_, Durability::Disk) => return self.when_durable(log, lsn, waiter),
            (Some(replication), _) => Arc::clone(replication),
            (None, level) => return Err(Error::Unsupported(level)),
        };
        let received = |holds: Holds, waiter: Waiter| match replication
            .when_received(log, lsn, holds, waiter)
        {
            Ok(already) => Ok(already),
            Err(error) => Err(self.log_error(log, error)),
        };
        if durability == Durability::Replicated {
            return match &self.ha.local_copy {
                None => received(Holds::Received, waiter),
                Some(local) => self.when_held_here_and_received(local, log, lsn, waiter),
            };
        }
        // `all`: on the primary's disk first, then synced on K standbys. The waiter sits in a
        // slot so that whichever path ends the wait takes it, exactly once.
        let slot = Arc::new(Mutex::new(Some(waiter)));
        let for_disk = Arc::clone(&slot);
        let then = Arc::clone(&replication);
        let chained: Waiter = Box::new(move |outcome| {
            let Some(waiter) = lock(&*for_disk).take() else {
                return;
            };
            match outcome {
                Err(error) => waiter(Err(error)),
                Ok(()) => wait_received(&then, log, lsn, waiter),
            }
        });
        if self.when_durable(log, lsn, chained)? {
            let waiter = lock(&*slot).take();
            let waiter = waiter.expect("a waiter dropped uncalled is still in its slot");
            return received(Holds::Durable, waiter);
        }
        Ok(false)
    }

    /// `replicated` with three nodes or more: calls `waiter` once K standbys hold `lsn` and
    /// this node's copy does too ([`LocalCopy`]). That copy is written at the end of the
    /// event loop's turn that appended the record, before any standby's answer can come, so
    /// it is looked at once the standbys answered and is waited for only when it lags.
    fn when_held_here_and_received(
        &self,
        local: &Arc<LocalCopy>,
        log: LogId,
        lsn: u64,
        waiter: Waiter,
    ) -> Result<bool> {
        let replication = self
            .ha
            .replication
            .as_ref()
            .expect("a local copy is kept only beside the shipping");
        // The waiter sits in a slot: the standbys' answer takes it if it comes later, else it
        // is still there when they already hold the record.
        let slot = Arc::new(Mutex::new(Some(waiter)));
        let then: Waiter = {
            let (slot, local, pool) =
                (Arc::clone(&slot), Arc::clone(local), Arc::clone(&self.pool));
            Box::new(move |outcome| {
                let Some(waiter) = lock(&*slot).take() else {
                    return;
                };
                match outcome {
                    Err(error) => waiter(Err(error)),
                    Ok(()) => match local.when_written(&pool, log, lsn, waiter) {
                        Ok(None) => {}
                        Ok(Some(waiter)) => waiter(Ok(())),
                        Err((waiter, error)) => waiter(Err(error)),
                    },
                }
            })
        };
        let standbys_hold = replication
            .when_received(log, lsn, Holds::Received, then)
            .map_err(|error| self.log_error(log, error))?;
        if !standbys_hold {
            return Ok(false);
        }
        let waiter = lock(&*slot)
            .take()
            .expect("a waiter dropped uncalled is still in its slot");
        match local.when_written(&self.pool, log, lsn, waiter) {
            Ok(None) => Ok(false),
            Ok(Some(_)) => Ok(true),
            Err((_, error)) => Err(self.log_error(log, error)),
        }
    }

    /// Notes an append for the shipping at the end of the turn ([`Engine::end_turn`]).
    pub(super) fn shipper_has_work(&self, log: LogId) {
        if let Some(replication) = &self.ha.replication {
            replication.appended(log);
        }
        if let Some(local) = &self.ha.local_copy {
            local.appended(log);
        }
    }

    /// The event loop ends its turn: what it appended is shipped (from the loop itself when a
    /// `replicated` commit waits for it, see [`Replication::ship_unsent`]), and acknowledgements
    /// already arrived for waiting commits are taken ([`Replication::take_acks`]); `spinning`:
    /// the loop turns again without sleeping, so it takes the reading over.
    ///
    /// `true`: commits still wait for the standby's acknowledgement.
    pub fn end_turn(&self, spinning: bool) -> bool {
        match &self.ha.replication {
            Some(replication) => {
                replication.ship_unsent(&self.pool);
                if let Some(local) = &self.ha.local_copy {
                    local.write_appended(&self.pool);
                }
                replication.take_acks(spinning)
            }
            None => false,
        }
    }

    /// The event loop is about to sleep: the standby's acknowledgements are read by their own
    /// threads until it turns again.
    pub fn loop_sleeps(&self) {
        if let Some(replication) = &self.ha.replication {
            replication.loop_sleeps();
        }
    }

    /// This node stepped down: every `replicated` wait ends in doubt, nothing more is shipped
    /// or written into the primary's copy.
    pub fn step_down_shipping(&self, why: &str) {
        if let Some(replication) = &self.ha.replication {
            replication.step_down(why);
        }
        if let Some(local) = &self.ha.local_copy {
            local.step_down(why);
        }
    }

    /// The primary's replication, if it has a standby.
    pub fn replication(&self) -> Option<&Arc<Replicas>> {
        self.ha.replication.as_ref()
    }
}

/// Registers `waiter` for K standbys' acknowledgement that `lsn` is synced on their disks
/// (`all`), or calls it at once if that is already in, or cannot come.
fn wait_received(replication: &Replicas, log: LogId, lsn: u64, waiter: Waiter) {
    let slot = Arc::new(Mutex::new(Some(waiter)));
    let registered = Arc::clone(&slot);
    let forward: Waiter = Box::new(move |outcome| {
        if let Some(waiter) = lock(&*registered).take() {
            waiter(outcome);
        }
    });
    let now = match replication.when_received(log, lsn, Holds::Durable, forward) {
        Ok(false) => return,
        Ok(true) => Ok(()),
        Err(error) => Err(error),
    };
    let waiter = lock(&*slot).take();
    if let Some(waiter) = waiter {
        waiter(now);
    }
}
