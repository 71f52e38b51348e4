//! The background flusher: forces a flush of the whole hierarchy every
//! period, so that no read sees statistics older than that.

use super::hierarchy::Shared;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::Duration;

/// A running background flusher. Stopping (or dropping the hierarchy) wakes
/// it and waits for it to finish its current flush.
pub(crate) struct Flusher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
    id: ThreadId,
}

impl Flusher {
    /// Start flushing `shared` every `period`. The thread holds only a weak
    /// reference, so it never keeps a dropped hierarchy alive.
    pub(crate) fn start(shared: Weak<Shared>, period: Duration) -> std::io::Result<Flusher> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("splitcount-flusher".into())
            .spawn(move || loop {
                let (flag, cv) = &*s;
                let guard = flag.lock().unwrap_or_else(|e| e.into_inner());
                let (guard, _) = cv
                    .wait_timeout_while(guard, period, |stopped| !*stopped)
                    .unwrap_or_else(|e| e.into_inner());
                if *guard {
                    return;
                }
                drop(guard);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                shared.stats.flush(&shared.root.stats, true);
            })?;
        let id = thread.thread().id();
        Ok(Flusher {
            stop,
            thread: Some(thread),
            id,
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        let (flag, cv) = &*self.stop;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
        // The flusher itself may hold the last reference to the hierarchy;
        // it must not wait for itself.
        if std::thread::current().id() != self.id {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}
