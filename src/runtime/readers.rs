//! [`ReaderPool`]: the threads that read keyed state's pages back from spill files ahead of
//! their faults (a state memory budget's [`PageReader`]), so a worker's lookahead can hand its
//! reads over instead of blocking on each.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::state::PageReader;

type Read = Box<dyn FnOnce() + Send>;

/// Reader threads taking reads from one queue; they end when the pool is dropped.
pub(crate) struct ReaderPool {
    queue: Sender<Read>,
}

impl ReaderPool {
    /// `threads` readers, named after the job.
    pub(crate) fn start(job: &str, threads: usize) -> Result<Arc<Self>> {
        let (tx, rx) = channel::<Read>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            super::spawn_named(format!("weir-{job}-reader-{i}"), move || serve(&rx)).map_err(|e| Error::Io {
                context: "cannot start a reader thread for keyed state".into(),
                path: None,
                source: e,
            })?;
        }
        Ok(Arc::new(ReaderPool { queue: tx }))
    }
}

/// A reader's loop: one read at a time, until the queue closes.
fn serve(rx: &Mutex<Receiver<Read>>) {
    loop {
        let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
        match next {
            Ok(read) => read(),
            Err(_) => return,
        }
    }
}

impl PageReader for ReaderPool {
    fn submit(&self, read: Read) {
        // A closed queue (never, while the pool lives) leaves the read to its fault.
        let _ = self.queue.send(read);
    }
}
