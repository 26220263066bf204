//! A fixed set of worker threads for the requests that wait for the disk: opening a log
//! (recovery reads its files), closing one (its buffers are written out first), reads of records
//! no longer buffered, truncation, the power-failure flush. The event loop hands such a request
//! over as a job and goes on serving everyone else; the job posts its answer back.
//!
//! Two lanes: reads of records ([`Workers::submit_bulk`]) queue behind every other job
//! ([`Workers::submit`]), so clients that pipeline large reads (and perhaps never read the
//! answers) make an `Open`, a close or a truncation wait for at most the reads already running,
//! never for the whole queue of them (issue 54: in a debug build, never-reading clients' reads
//! starved honest `Open`s on the two workers).
//!
//! Invariants: the number of threads never grows with the number of connections or requests;
//! jobs queue (unbounded in count, but each connection has at most one job in flight, so the
//! queue is bounded by the connections); a worker takes a bulk job only when no other job
//! waits; after [`Workers::stop`] every job queued before it has run.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub(crate) type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    urgent: VecDeque<Job>,
    bulk: VecDeque<Job>,
    stopping: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

pub(crate) struct Workers {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

fn lock(shared: &Shared) -> std::sync::MutexGuard<'_, Queue> {
    shared.queue.lock().unwrap_or_else(|e| e.into_inner())
}

impl Workers {
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let shared = Arc::new(Shared::default());
        let mut threads = Vec::new();
        for index in 0..count {
            let shared = Arc::clone(&shared);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("stela-worker-{index}"))
                    .spawn(move || work(&shared))?,
            );
        }
        Ok(Workers {
            shared,
            threads: Mutex::new(threads),
        })
    }

    /// Queues `job` ahead of every bulk job. After [`Workers::stop`] the job runs on the
    /// caller's thread instead, so nothing handed over is ever silently dropped.
    pub fn submit(&self, job: Job) {
        self.queue(job, false);
    }

    /// Queues `job` (a read of records) behind every other job.
    pub fn submit_bulk(&self, job: Job) {
        self.queue(job, true);
    }

    fn queue(&self, job: Job, bulk: bool) {
        let refused = {
            let mut queue = lock(&self.shared);
            if queue.stopping {
                Some(job)
            } else {
                if bulk {
                    queue.bulk.push_back(job);
                } else {
                    queue.urgent.push_back(job);
                }
                None
            }
        };
        match refused {
            Some(job) => job(),
            None => self.shared.ready.notify_one(),
        }
    }

    /// Lets the queued jobs finish and stops the threads.
    pub fn stop(&self) {
        lock(&self.shared).stopping = true;
        self.shared.ready.notify_all();
        for thread in self
            .threads
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            if thread.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
    }
}

/// A worker: the next urgent job, else the next bulk one; returns once stopping and empty.
fn work(shared: &Shared) {
    loop {
        let job = {
            let mut queue = lock(shared);
            loop {
                if let Some(job) = queue.urgent.pop_front() {
                    break job;
                }
                if let Some(job) = queue.bulk.pop_front() {
                    break job;
                }
                if queue.stopping {
                    return;
                }
                queue = shared.ready.wait(queue).unwrap_or_else(|e| e.into_inner());
            }
        };
        crate::engine::abort_on_panic("a worker", job);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn an_open_queued_behind_many_reads_runs_before_them() {
        let workers = Workers::start(1).unwrap();
        let (release, blocked) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel::<()>();
        workers.submit(Box::new(move || {
            started.send(()).unwrap();
            blocked.recv().unwrap();
        }));
        running.recv().unwrap(); // the only worker is busy from now on
        let order = Arc::new(Mutex::new(Vec::new()));
        for read in 0..16 {
            let order = Arc::clone(&order);
            workers.submit_bulk(Box::new(move || order.lock().unwrap().push(read)));
        }
        let open = Arc::clone(&order);
        workers.submit(Box::new(move || open.lock().unwrap().push(-1)));
        release.send(()).unwrap();
        workers.stop();
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 17, "every job ran before stop returned");
        assert_eq!(order[0], -1, "the open waited for the reads: {order:?}");
    }
}
