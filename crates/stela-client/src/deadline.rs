//! Bounding a blocking call on a connection: if it has not finished in time, its socket is
//! shut down from another thread so that the call fails instead of waiting on a node that does
//! not answer (a stopped or cut-off node of a failover pair). Used for connects and handshakes
//! to endpoints of a list and for the failover watch's probes.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Shuts a connection's socket down.
pub(crate) type Cut = Box<dyn Fn() + Send + Sync>;

/// Runs `work`; if it has not finished within `within`, `cut` shuts its socket so that it
/// fails instead of waiting on a node that does not answer.
pub(crate) fn guarded<R>(cut: Option<Cut>, within: Duration, work: impl FnOnce() -> R) -> R {
    let Some(cut) = cut else {
        return work();
    };
    let done = Arc::new((Mutex::new(false), Condvar::new()));
    let timer = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let (finished, wake) = &*done;
            let finished = finished.lock().unwrap_or_else(|e| e.into_inner());
            let (finished, _) = wake
                .wait_timeout_while(finished, within, |finished| !*finished)
                .unwrap_or_else(|e| e.into_inner());
            if !*finished {
                cut();
            }
        })
    };
    let result = work();
    *done.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
    done.1.notify_all();
    let _ = timer.join();
    result
}
