//! A fixed set of worker threads for the requests that wait for the disk: opening a log
//! (recovery reads its files), closing one (its buffers are written out first), reads of records
//! no longer buffered, truncation, the power-failure flush. The event loop hands such a request
//! over as a job and goes on serving everyone else; the job posts its answer back.
//!
//! Invariant: the number of threads never grows with the number of connections or requests;
//! jobs queue (unbounded in count, but each connection has at most one job in flight, so the
//! queue is bounded by the connections).

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub(crate) type Job = Box<dyn FnOnce() + Send>;

pub(crate) struct Workers {
    sender: Mutex<Option<mpsc::Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Workers {
    pub fn start(count: usize) -> std::io::Result<Workers> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut threads = Vec::new();
        for index in 0..count {
            let receiver = Arc::clone(&receiver);
            threads.push(
                std::thread::Builder::new()
                    .name(format!("stela-worker-{index}"))
                    .spawn(move || loop {
                        let job = {
                            let receiver = receiver.lock().unwrap_or_else(|e| e.into_inner());
                            receiver.recv()
                        };
                        match job {
                            Ok(job) => crate::engine::abort_on_panic("a worker", job),
                            Err(_) => return, // the loop is gone
                        }
                    })?,
            );
        }
        Ok(Workers {
            sender: Mutex::new(Some(sender)),
            threads: Mutex::new(threads),
        })
    }

    /// Queues `job`. After [`Workers::stop`] the job runs on the caller's thread instead, so
    /// nothing handed over is ever silently dropped.
    pub fn submit(&self, job: Job) {
        let refused = {
            let sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
            match sender.as_ref() {
                Some(sender) => sender.send(job).err().map(|e| e.0),
                None => Some(job),
            }
        };
        if let Some(job) = refused {
            job();
        }
    }

    /// Lets the queued jobs finish and stops the threads.
    pub fn stop(&self) {
        drop(self.sender.lock().unwrap_or_else(|e| e.into_inner()).take());
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
