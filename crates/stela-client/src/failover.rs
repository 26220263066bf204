//! Following a failover from the client's side, with an endpoint list
//! ([`crate::Address::Cluster`]): a request that waits longer than `probe_after` makes the
//! [`Watch`] ask the other endpoints whether a newer primary has taken over; if one has, the
//! stuck request's socket is cut, so the call fails at once (in doubt, for a commit) and the
//! next call opens the log on the new primary. A primary that is merely slow is never
//! abandoned: only a node that *is* the primary of a newer epoch ends the wait, so a long
//! `replicated` wait (its standby slow or away) is not turned into a false "in doubt".
//!
//! Invariants: the watch never sends anything on the watched connection (it only shuts its
//! socket down); at most one request is watched at a time (the `Wal` serializes calls); the
//! watch thread ends with the last `Wal` holding it.

use crate::connection::{Address, Connection};
use crate::deadline::Cut;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};
use stela_proto::{RequestBody, ResponseBody, Role};

/// How long a probe of one endpoint may take: connect, hello and status.
const PROBE_WITHIN: Duration = Duration::from_millis(200);
/// How often the watch looks at the request in progress, and so how often a request stuck
/// past `probe_after` has the other endpoints probed. Every failover of a primary that went
/// silent (stopped, cut off) waits for the probe that finds the new primary: at 50 ms it added
/// 25 ms to such a failover on average; a probe (connect, hello, status) costs a few
/// milliseconds of CPU, and only while a request is stuck.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(20);

/// The request in progress, if any.
struct Outstanding {
    since: Instant,
    endpoint: usize,
    epoch: u64,
    cut: Option<Cut>,
}

/// Watches the requests of one `Wal` with an endpoint list.
pub(crate) struct Watch {
    endpoints: Vec<Address>,
    probe_after: Duration,
    outstanding: Mutex<Option<Outstanding>>,
    changed: Condvar,
}

/// Ends the watch of a request when dropped.
pub(crate) struct Watched<'a>(&'a Watch);

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        *self.0.outstanding.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

impl Watch {
    pub(crate) fn start(endpoints: Vec<Address>, probe_after: Duration) -> Arc<Watch> {
        let watch = Arc::new(Watch {
            endpoints,
            probe_after,
            outstanding: Mutex::new(None),
            changed: Condvar::new(),
        });
        let weak = Arc::downgrade(&watch);
        let _ = std::thread::Builder::new()
            .name("stela-client-watch".into())
            .spawn(move || run(&weak));
        watch
    }

    /// A request on `endpoint`'s primary of `epoch` begins; `cut` shuts its socket.
    pub(crate) fn begin(&self, endpoint: usize, epoch: u64, cut: Option<Cut>) -> Watched<'_> {
        *self.outstanding.lock().unwrap_or_else(|e| e.into_inner()) = Some(Outstanding {
            since: Instant::now(),
            endpoint,
            epoch,
            cut,
        });
        self.changed.notify_all();
        Watched(self)
    }
}

fn run(weak: &Weak<Watch>) {
    loop {
        let Some(watch) = weak.upgrade() else {
            return;
        };
        let due = {
            let outstanding = watch.outstanding.lock().unwrap_or_else(|e| e.into_inner());
            let (outstanding, _) = watch
                .changed
                .wait_timeout(outstanding, PROBE_EVERY)
                .unwrap_or_else(|e| e.into_inner());
            outstanding
                .as_ref()
                .filter(|o| o.cut.is_some() && o.since.elapsed() >= watch.probe_after)
                .map(|o| (o.endpoint, o.epoch))
        };
        let Some((endpoint, epoch)) = due else {
            drop(watch);
            continue;
        };
        for (i, other) in watch.endpoints.iter().enumerate() {
            if i == endpoint {
                continue;
            }
            let Some(newer) = primary_epoch(other).filter(|&e| e > epoch) else {
                continue;
            };
            let mut outstanding = watch.outstanding.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(cut) = outstanding.as_mut().and_then(|o| o.cut.take()) {
                tracing::warn!(endpoint = %other, epoch = newer, "a newer primary took over: the request waiting on the old one is cut (in doubt)");
                cut();
            }
            break;
        }
        drop(watch);
    }
}

/// How an endpoint that opened the log ranks against another that did too: the newer epoch
/// (a term's upper half) first, then the one nearest `preferred` in list order.
pub(crate) fn rank(
    at: usize,
    preferred: usize,
    endpoints: usize,
    term: u64,
) -> (u64, std::cmp::Reverse<usize>) {
    debug_assert!(at < endpoints, "endpoint {at} of a list of {endpoints}");
    let nearness = (at + endpoints - preferred % endpoints) % endpoints;
    (term >> 32, std::cmp::Reverse(nearness))
}

/// The epoch `endpoint` is the primary of, if it is one. Blocking, bounded by `PROBE_WITHIN`
/// per step.
pub(crate) fn primary_epoch(endpoint: &Address) -> Option<u64> {
    let mut connection =
        Connection::connect_within(endpoint, Duration::ZERO, Role::Admin, Some(PROBE_WITHIN))
            .ok()?;
    let cut = connection.cutter();
    let answer = crate::deadline::guarded(cut, PROBE_WITHIN, || {
        connection.request(RequestBody::Status)
    })
    .ok()?;
    let ResponseBody::Status(report) = answer else {
        return None;
    };
    let replication = report.replication?;
    (replication.role == "primary").then_some(replication.epoch)
}
