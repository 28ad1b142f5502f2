//! [`Shutdown`]: the process is stopping. One signal that the scheduling loop checks before
//! each pass, the API server awaits for its graceful shutdown, and Ctrl-C, SIGTERM, a run's
//! end or a lost lease trigger; and [`Shutdown::join_by`], the one bounded wait for a thread
//! to finish once it is triggered.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Whether the process is stopping. A watch channel rather than a flag: an async waiter
/// ([`Shutdown::triggered`]) wakes when it is triggered instead of polling, and every clone
/// sees the same signal. Triggering is final.
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// Not triggered yet.
    pub fn new() -> Self {
        Self {
            sender: Arc::new(watch::channel(false).0),
        }
    }

    /// Stops the process: every waiter wakes, and [`Shutdown::is_triggered`] holds from now on.
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// Whether it was triggered: what the scheduling loop checks before each pass.
    pub fn is_triggered(&self) -> bool {
        *self.sender.borrow()
    }

    /// Returns once it is triggered (at once if it already was).
    pub async fn triggered(&self) {
        let mut receiver = self.sender.subscribe();
        // The sender lives as long as `self`, so the wait ends only when triggered.
        let _ = receiver.wait_for(|stopping| *stopping).await;
    }

    /// Waits for `thread` to finish, for at most `patience`; whether it did. A thread still
    /// running then is left behind: the API server's graceful shutdown waits for open
    /// connections, and a live-feed subscriber never closes its own.
    pub fn join_by(thread: JoinHandle<()>, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        while !thread.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        thread.join().is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_wakes_an_async_waiter_and_every_clone_sees_it() {
        let shutdown = Shutdown::new();
        let clone = shutdown.clone();
        assert!(!clone.is_triggered());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let waiter = {
            let shutdown = shutdown.clone();
            std::thread::spawn(move || runtime.block_on(shutdown.triggered()))
        };
        clone.trigger();
        assert!(Shutdown::join_by(waiter, Duration::from_secs(30)));
        assert!(shutdown.is_triggered());
    }

    #[test]
    fn join_by_gives_up_on_a_thread_that_does_not_finish() {
        let (_keep, wait) = std::sync::mpsc::channel::<()>();
        let stuck = std::thread::spawn(move || {
            let _ = wait.recv();
        });
        assert!(!Shutdown::join_by(stuck, Duration::from_millis(50)));
    }
}
