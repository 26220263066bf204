//! `stela-bench failover-client` (hidden): the client of the failover run. It runs inside the
//! client's network namespace (started there with `ip netns exec`, since a thread cannot
//! safely change namespace) and keeps committing records at `replicated` to the endpoint list
//! of both nodes, one at a time, until its standard input closes; then it settles what is still
//! in doubt and exits. Every event is one JSON line on standard output ([`Event`]).
//!
//! Each record is appended first, then committed with `commit_at(lsn, Replicated)`, so a commit
//! that loses its primary is in doubt at a known (term, LSN), which `resolve` later settles.
//! Every attempt gets a fresh sequence number, a failed append included: an append whose answer
//! was lost may still be in the log, and the checks after the run rely on a sequence number
//! naming one record.
//!
//! The loop ([`client_loop`]) is written against [`ReplicatedLog`], the few calls it makes, so
//! that its bookkeeping is tested here with a scripted log; [`DaemonLog`] puts those calls on
//! `stela_client::Wal` opened on an endpoint list (`Address::Cluster`), over TLS when given a CA.

use super::events::{mono_ms, record, Event, Outcome, Rec};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Arguments of the hidden `stela-bench failover-client`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// The nodes, tried in turn: `tls://A:PORT,tls://B:PORT` with --tls-ca, else
    /// `tcp://A:PORT,tcp://B:PORT`.
    #[arg(long)]
    pub endpoints: String,
    /// The CA the nodes' certificates chain to (PEM): the endpoints are spoken to over TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// With --tls-ca: the name the nodes' certificates carry, if not their addresses.
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub server_name: Option<String>,
    /// With --tls-ca: a file whose first token authenticates this client.
    #[arg(long, value_name = "FILE", requires = "tls_ca")]
    pub token_file: Option<std::path::PathBuf>,
    /// The log to commit to.
    #[arg(long, default_value = super::events::LOG)]
    pub log: String,
    /// Filler bytes per record.
    #[arg(long, default_value_t = 100)]
    pub record_bytes: usize,
    /// How long a request may wait before the client asks the other endpoint whether a newer
    /// primary has taken over (stela_client's `probe_after`).
    #[arg(long, default_value_t = 250)]
    pub probe_after_ms: u64,
}

/// Why a `replicated` commit did not return `Ok`.
#[derive(Debug, Clone, PartialEq)]
pub enum CommitError {
    /// The primary was lost during the commit (`stela_client::Error::InDoubt`).
    InDoubt {
        term: u64,
        lsn: Option<u64>,
        cause: String,
    },
    /// The primary holds the record without a standby (`stela_client::Error::Unprotected`):
    /// not acknowledged; the loop asks again.
    Unprotected { term: u64, lsn: u64 },
    /// Anything else. The record was appended, so its outcome is unknown all the same.
    Other(String),
}

/// What the new primary's history says of a commit in doubt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Kept,
    Lost,
    /// The node cannot tell yet (it is not the primary of a newer term yet).
    NotYet,
}

/// The calls the client loop makes on an open log.
pub trait ReplicatedLog {
    /// Why an open, an append or a resolution failed (written into the run's events).
    type Error: std::fmt::Display;
    /// Appends one record; its LSN.
    fn append(&mut self, record: &Rec) -> Result<u64, Self::Error>;
    /// Waits until every record up to `lsn` is held by the standby too (one answer: the loop
    /// asks again after [`CommitError::Unprotected`]).
    fn commit_replicated(&mut self, lsn: u64) -> Result<(), CommitError>;
    /// The term the node serves this log in.
    fn term(&self) -> u64;
    /// Settles a commit in doubt at (`term`, `lsn`).
    fn resolve(&mut self, term: u64, lsn: u64) -> Result<Resolution, Self::Error>;
}

/// A commit in doubt, waiting to be settled.
#[derive(Debug, Clone, Copy)]
struct Pending {
    seq: u64,
    term: u64,
    lsn: u64,
}

/// What one run of the loop did (for its tests; the events say the same).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tally {
    pub acked: u64,
    /// Commits answered `Unprotected` at least once.
    pub unprotected: u64,
    pub in_doubt: u64,
    pub resolved: u64,
    pub unresolved: u64,
}

/// How often the loop tries to settle commits in doubt while it runs, and how long it keeps
/// trying once told to stop.
const RESOLVE_EVERY_MS: f64 = 100.0;
const RESOLVE_AT_STOP: Duration = Duration::from_secs(5);
/// How often a commit answered `Unprotected` is asked again.
const UNPROTECTED_RETRY: Duration = Duration::from_millis(10);
/// Pause after a failed open, so that a cluster in the middle of a failover is not hammered.
const REOPEN_PAUSE: Duration = Duration::from_millis(10);

/// Commits records until `stop`, writing one event per line to `out`. `open` (re)opens the log
/// on whichever node takes it; any failure drops the open log and opens it again.
///
/// # Errors
/// Only writing to `out` (the run reading it has gone).
pub fn client_loop<L: ReplicatedLog>(
    mut open: impl FnMut() -> Result<L, L::Error>,
    record_bytes: usize,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> std::io::Result<Tally> {
    let mut emit = |event: Event| -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, &event)?;
        out.write_all(b"\n")?;
        out.flush()
    };
    let mut tally = Tally::default();
    let mut log: Option<L> = None;
    let mut pending: Vec<Pending> = Vec::new();
    let mut last_resolve = mono_ms();
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let Some(current) = log.as_mut() else {
            match open() {
                Ok(opened) => {
                    emit(Event::Opened {
                        t_ms: mono_ms(),
                        term: opened.term(),
                    })?;
                    log = Some(opened);
                }
                Err(error) => {
                    emit(Event::Failed {
                        t_ms: mono_ms(),
                        during: "open".into(),
                        error: error.to_string(),
                    })?;
                    std::thread::sleep(REOPEN_PAUSE);
                }
            }
            continue;
        };
        if !pending.is_empty() && mono_ms() - last_resolve >= RESOLVE_EVERY_MS {
            last_resolve = mono_ms();
            if let Err(error) = resolve_pending(current, &mut pending, &mut tally, &mut emit)? {
                emit(Event::Failed {
                    t_ms: mono_ms(),
                    during: "resolve".into(),
                    error: error.to_string(),
                })?;
                log = None;
                continue;
            }
        }
        seq += 1;
        let lsn = match current.append(&record(seq, record_bytes)) {
            Ok(lsn) => lsn,
            Err(error) => {
                emit(Event::Failed {
                    t_ms: mono_ms(),
                    during: "append".into(),
                    error: error.to_string(),
                })?;
                log = None;
                continue;
            }
        };
        let term = current.term();
        let started = mono_ms();
        let mut said_unprotected = false;
        let result = loop {
            match current.commit_replicated(lsn) {
                Err(CommitError::Unprotected { term: t, lsn: l })
                    if !stop.load(Ordering::SeqCst) =>
                {
                    if !said_unprotected {
                        said_unprotected = true;
                        tally.unprotected += 1;
                        emit(Event::Unprotected {
                            seq,
                            term: t,
                            lsn: l,
                            t_ms: mono_ms(),
                        })?;
                    }
                    std::thread::sleep(UNPROTECTED_RETRY);
                }
                other => break other,
            }
        };
        let t_ms = mono_ms();
        let wait_ms = t_ms - started;
        match result {
            Ok(()) => {
                tally.acked += 1;
                emit(Event::Ack {
                    seq,
                    term,
                    lsn,
                    t_ms,
                    wait_ms,
                })?;
            }
            Err(error) => {
                // Appended, not acknowledged: in doubt whatever the error says, at the (term,
                // LSN) the daemon reported or, if it did not, at those of the append.
                let (term, lsn, cause) = match error {
                    CommitError::InDoubt {
                        term: t,
                        lsn: l,
                        cause,
                    } => (t, l.unwrap_or(lsn), cause),
                    CommitError::Unprotected { term: t, lsn: l } => {
                        (t, l, "unprotected when told to stop".into())
                    }
                    CommitError::Other(cause) => (term, lsn, cause),
                };
                tally.in_doubt += 1;
                pending.push(Pending { seq, term, lsn });
                emit(Event::InDoubt {
                    seq,
                    term,
                    lsn,
                    t_ms,
                    wait_ms,
                    cause,
                })?;
                log = None;
            }
        }
    }
    // Told to stop: settle what is in doubt, reopening as needed, for a bounded time.
    let deadline = std::time::Instant::now() + RESOLVE_AT_STOP;
    while !pending.is_empty() && std::time::Instant::now() < deadline {
        if log.is_none() {
            log = open().ok();
        }
        // No node opens the log, or the one that did failed: open again.
        let settled = match log.as_mut() {
            Some(current) => resolve_pending(current, &mut pending, &mut tally, &mut emit)?.is_ok(),
            None => false,
        };
        if !settled {
            log = None;
        }
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    tally.unresolved = pending.len() as u64;
    Ok(tally)
}

/// Tries to settle every commit in doubt; those the node cannot settle yet stay pending.
/// The inner error is the log's (the caller reopens).
fn resolve_pending<L: ReplicatedLog>(
    log: &mut L,
    pending: &mut Vec<Pending>,
    tally: &mut Tally,
    emit: &mut impl FnMut(Event) -> std::io::Result<()>,
) -> std::io::Result<Result<(), L::Error>> {
    let mut still = Vec::new();
    let mut failure = None;
    for p in pending.drain(..) {
        if failure.is_some() {
            still.push(p);
            continue;
        }
        match log.resolve(p.term, p.lsn) {
            Ok(Resolution::NotYet) => still.push(p),
            Ok(resolution) => {
                tally.resolved += 1;
                emit(Event::Resolved {
                    seq: p.seq,
                    outcome: if resolution == Resolution::Kept {
                        Outcome::Kept
                    } else {
                        Outcome::Lost
                    },
                    t_ms: mono_ms(),
                })?;
            }
            Err(error) => {
                failure = Some(error);
                still.push(p);
            }
        }
    }
    *pending = still;
    Ok(failure.map_or(Ok(()), Err))
}

/// `stela-bench failover-client`: runs [`client_loop`] against the daemons until standard input
/// closes.
///
/// # Errors
/// Bad arguments, or standard output closed.
pub fn run(args: &ClientArgs) -> anyhow::Result<()> {
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let on_eof = std::sync::Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        on_eof.store(true, Ordering::SeqCst);
    });
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let tally = run_against_daemons(args, &stop, &mut out)?;
    eprintln!("failover-client: {tally:?}");
    Ok(())
}

fn run_against_daemons(
    args: &ClientArgs,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> anyhow::Result<Tally> {
    let address = daemon::address(args)?;
    Ok(client_loop(
        || DaemonLog::open(&address, args),
        args.record_bytes,
        stop,
        out,
    )?)
}

pub use daemon::DaemonLog;

mod daemon {
    use super::{ClientArgs, CommitError, Rec, ReplicatedLog, Resolution};
    use std::time::Duration;
    use stela_client::{Address, Durability, Error, Lsn, TlsTarget, Transport, Wal, WalOptions};

    /// The endpoint list of `args`: TLS targets with `--tls-ca`, else parsed as text.
    pub fn address(args: &ClientArgs) -> anyhow::Result<Address> {
        let Some(ca) = &args.tls_ca else {
            return Ok(Address::parse(&args.endpoints)?);
        };
        let endpoints = args
            .endpoints
            .split(',')
            .map(|one| {
                let mut target = TlsTarget::new(one.trim(), ca)?;
                if let Some(name) = &args.server_name {
                    target = target.server_name(name);
                }
                if let Some(file) = &args.token_file {
                    target = target.token_file(file);
                }
                Ok(Address::Tls(Box::new(target)))
            })
            .collect::<Result<Vec<_>, stela_client::Error>>()?;
        Ok(Address::Cluster(endpoints))
    }

    /// The log opened through the daemons of the endpoint list.
    pub struct DaemonLog(Wal<Rec>);

    impl DaemonLog {
        /// Opens the log on whichever node of `address` takes it. The client library's own
        /// reconnection is off: the loop reopens, and says so in its events.
        pub fn open(address: &Address, args: &ClientArgs) -> Result<DaemonLog, Error> {
            let options = WalOptions::default()
                .durability(Durability::Replicated)
                .type_tag(super::super::events::TYPE_TAG)
                .transport(Transport::Socket)
                .reconnect_within(Duration::ZERO)
                .probe_after(Duration::from_millis(args.probe_after_ms));
            Wal::open(address.clone(), &args.log, options).map(DaemonLog)
        }
    }

    impl ReplicatedLog for DaemonLog {
        type Error = Error;

        fn append(&mut self, record: &Rec) -> Result<u64, Error> {
            self.0.append(record).map(Lsn::get)
        }

        /// `Ok` only once a standby holds the record: a commit the primary answers without one
        /// (`Error::Unprotected`, a promoted primary not protected again yet) is
        /// [`CommitError::Unprotected`], which the loop records and asks again, so that the
        /// time until it is protected is the commit's wait, as a user who needs `replicated`
        /// would see it.
        fn commit_replicated(&mut self, lsn: u64) -> Result<(), CommitError> {
            match self.0.commit_at(Lsn::new(lsn), Durability::Replicated) {
                Ok(()) => Ok(()),
                Err(Error::Unprotected { term, lsn: at, .. }) => Err(CommitError::Unprotected {
                    term,
                    lsn: at.map_or(lsn, Lsn::get),
                }),
                Err(Error::InDoubt { term, lsn, cause }) => Err(CommitError::InDoubt {
                    term,
                    lsn: lsn.map(Lsn::get),
                    cause,
                }),
                Err(other) => Err(CommitError::Other(other.to_string())),
            }
        }

        fn term(&self) -> u64 {
            self.0.term()
        }

        fn resolve(&mut self, term: u64, lsn: u64) -> Result<Resolution, Error> {
            Ok(match self.0.resolve(term, Lsn::new(lsn))? {
                stela_client::Resolution::Kept => Resolution::Kept,
                stela_client::Resolution::Lost => Resolution::Lost,
                stela_client::Resolution::NotYet => Resolution::NotYet,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::VecDeque;

    /// A log whose answers follow a script shared by every open: a failover is a commit
    /// answered in doubt, then opens that fail, then a node in a newer term.
    struct Scripted<'a> {
        script: &'a RefCell<Script>,
        stop: &'a AtomicBool,
        term: u64,
    }

    #[derive(Default)]
    struct Script {
        term: u64,
        next_lsn: u64,
        /// Answers of the next commits (then Ok).
        commits: VecDeque<Result<(), CommitError>>,
        /// Opens that fail after the first in-doubt commit.
        failed_opens: u32,
        /// `resolve` answers NotYet this many times, then Kept for odd LSNs, Lost for even.
        not_yet: u32,
        /// The loop is told to stop after this many acknowledgements.
        stop_after_acks: u64,
        acks: u64,
    }

    /// The only failure the script plays: an open refused.
    #[derive(Debug)]
    struct Refused;

    impl std::fmt::Display for Refused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection refused")
        }
    }

    impl ReplicatedLog for Scripted<'_> {
        type Error = Refused;

        fn append(&mut self, record: &Rec) -> Result<u64, Refused> {
            assert!(super::super::events::genuine(record));
            let mut s = self.script.borrow_mut();
            s.next_lsn += 1;
            Ok(s.next_lsn)
        }
        fn commit_replicated(&mut self, _lsn: u64) -> Result<(), CommitError> {
            let mut s = self.script.borrow_mut();
            let answer = s.commits.pop_front().unwrap_or(Ok(()));
            if answer.is_ok() {
                s.acks += 1;
                if s.acks >= s.stop_after_acks {
                    self.stop.store(true, Ordering::SeqCst);
                }
            }
            answer
        }
        fn term(&self) -> u64 {
            self.term
        }
        fn resolve(&mut self, _term: u64, lsn: u64) -> Result<Resolution, Refused> {
            let mut s = self.script.borrow_mut();
            if s.not_yet > 0 {
                s.not_yet -= 1;
                return Ok(Resolution::NotYet);
            }
            Ok(if lsn % 2 == 1 {
                Resolution::Kept
            } else {
                Resolution::Lost
            })
        }
    }

    #[test]
    fn commits_in_doubt_are_reopened_and_resolved_and_no_seq_is_used_twice() {
        const T1: u64 = 1 << 32 | 1;
        let script = RefCell::new(Script {
            term: T1,
            commits: VecDeque::from([
                Ok(()),
                Err(CommitError::Unprotected { term: T1, lsn: 2 }),
                Err(CommitError::Unprotected { term: T1, lsn: 2 }),
                Ok(()),
                Err(CommitError::InDoubt {
                    term: T1,
                    lsn: None,
                    cause: "primary lost".into(),
                }),
                Err(CommitError::Other("connection reset".into())),
            ]),
            failed_opens: 2,
            not_yet: 1,
            stop_after_acks: 100,
            ..Script::default()
        });
        let stop = AtomicBool::new(false);
        let mut out = Vec::new();
        let tally = client_loop(
            || {
                let mut s = script.borrow_mut();
                if s.next_lsn >= 2 && s.failed_opens > 0 {
                    s.failed_opens -= 1;
                    return Err(Refused);
                }
                // Every open lands on a node of a newer epoch than the one before.
                let term = s.term;
                s.term += 1 << 32;
                Ok(Scripted {
                    script: &script,
                    stop: &stop,
                    term,
                })
            },
            10,
            &stop,
            &mut out,
        )
        .unwrap();
        let events: Vec<Event> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            tally,
            Tally {
                acked: 100,
                unprotected: 1,
                in_doubt: 2,
                resolved: 2,
                unresolved: 0
            },
            "{events:?}"
        );
        let mut seqs: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Ack { seq, .. } | Event::InDoubt { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        let n = seqs.len();
        seqs.sort_unstable();
        seqs.dedup();
        assert_eq!(seqs.len(), n, "a sequence number used twice");
        // Each commit in doubt carries the term and LSN of its append.
        let doubt: Vec<(u64, u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                Event::InDoubt { seq, term, lsn, .. } => Some((*seq, *term, *lsn)),
                _ => None,
            })
            .collect();
        assert_eq!(doubt, vec![(3, T1, 3), (4, T1 + (1 << 32), 4)]);
        // Asked again until acknowledged; said once.
        let unprotected: Vec<u64> = events
            .iter()
            .filter_map(|e| match e {
                Event::Unprotected { seq, .. } => Some(*seq),
                _ => None,
            })
            .collect();
        assert_eq!(unprotected, vec![2]);
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::Ack { seq: 2, .. })));
        let failed_opens = events
            .iter()
            .filter(|e| matches!(e, Event::Failed { during, .. } if during == "open"))
            .count();
        assert_eq!(failed_opens, 2);
        let mut outcomes: Vec<(u64, Outcome)> = events
            .iter()
            .filter_map(|e| match e {
                Event::Resolved { seq, outcome, .. } => Some((*seq, *outcome)),
                _ => None,
            })
            .collect();
        outcomes.sort_by_key(|o| o.0);
        assert_eq!(outcomes, vec![(3, Outcome::Kept), (4, Outcome::Lost)]);
    }
}
