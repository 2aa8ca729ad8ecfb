//! The acceptor thread every listening daemon runs: it takes connections
//! from a transport listener and hands them to the poll loop over a
//! channel, waking the loop's wait set; the node checks what they say.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use dataplane::time::Duration;
use dataplane::transport::{Error, Listener};
use dataplane::waitset::Notifier;

/// How long one `accept` waits before the thread checks its stop flag.
const ACCEPT_SLICE: Duration = Duration::from_millis(100);

/// A running acceptor thread; dropping it stops and joins the thread.
pub struct Acceptor<C> {
    incoming: mpsc::Receiver<C>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Send + 'static> Acceptor<C> {
    /// Starts thread `name` accepting on `listener`; each connection is
    /// queued and `wake` signalled.
    pub fn spawn<L>(name: &str, mut listener: L, wake: Notifier) -> std::io::Result<Acceptor<C>>
    where
        L: Listener<Conn = C> + 'static,
    {
        let (tx, incoming) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept(ACCEPT_SLICE) {
                    Ok(c) => {
                        if tx.send(c).is_err() {
                            return;
                        }
                        wake.signal();
                    }
                    Err(Error::Timeout) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a connection failed");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
            }
        })?;
        Ok(Acceptor {
            incoming,
            stop,
            thread: Some(thread),
        })
    }
}

impl<C> Acceptor<C> {
    /// The next accepted connection, if any (never blocks).
    pub fn try_next(&self) -> Option<C> {
        self.incoming.try_recv().ok()
    }
}

impl<C> Drop for Acceptor<C> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
