//! Failure points for tests ([`FaultInjector`]), compiled with the `testing` feature only:
//! release builds of the binary carry none (without the feature, `faults_absent.rs` stands
//! in: an injector that cannot be built and never fires).
//!
//! May touch: `error`.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// Where a test wants a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail `operator` (any subtask) when its `nth` record (counted over all subtasks and
    /// attempts, from 1) arrives.
    AtRecord {
        /// The operator's name.
        operator: String,
        /// Which record, counted over all subtasks and attempts.
        nth: u64,
    },
    /// Fail a task during the synchronous part of checkpoint `checkpoint`.
    SyncSnapshot {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Fail the asynchronous write of checkpoint `checkpoint` (the task declines it).
    AsyncSnapshot {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Make the coordinator decline checkpoint `checkpoint`.
    Decline {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// A storage error while a task writes its part of checkpoint `checkpoint`.
    StorageWrite {
        /// The checkpoint id.
        checkpoint: u64,
        /// What the storage says.
        error: StorageFault,
    },
    /// A storage error while the coordinator writes checkpoint `checkpoint`'s metadata.
    MetadataWrite {
        /// The checkpoint id.
        checkpoint: u64,
        /// What the storage says.
        error: StorageFault,
    },
    /// End the whole process (exit status 70) right after checkpoint `checkpoint`'s metadata
    /// is durable and before any sink hears that it completed: a crash between pre-commit
    /// and commit.
    ExitBeforeCommit {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// End the whole process (exit status 70) once the first task has applied checkpoint
    /// `checkpoint`'s completion (its sinks committed, if it has any) and before the others
    /// have.
    ExitAfterFirstCommit {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// End the whole process (exit status 70) after checkpoint `checkpoint`'s `_metadata` was
    /// written to its temporary file and before it was renamed into place.
    ExitBeforeMetadataRename {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Stop the whole process (SIGSTOP, as a GC or VM pause would) after the coordinator
    /// checked that it still owns the checkpoint directory and before it puts checkpoint
    /// `checkpoint` into the object store; it goes on when continued (SIGCONT).
    StopBeforePublish {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// End the whole process (exit status 70) in the middle of a task's write of checkpoint
    /// `checkpoint`: its task file is left half written, and no acknowledgement is sent.
    ExitMidTaskWrite {
        /// The checkpoint id.
        checkpoint: u64,
    },
    /// Fail the first task polled in the attempt after restart `restart` (counted from 1):
    /// a failure right after the restore (from a checkpoint, or from the start when none had
    /// completed), before the attempt got anywhere.
    RightAfterRestore {
        /// Which restart.
        restart: u64,
    },
}

/// What an injected storage failure looks like to the code that writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StorageFault {
    /// The disk is full (`ENOSPC`).
    DiskFull,
    /// The file or folder may not be written (`EACCES`).
    PermissionDenied,
    /// `fsync` failed (`EIO`): what was written may not be durable.
    FsyncFailed,
}

impl StorageFault {
    /// The I/O error the storage would return.
    pub fn to_io_error(self) -> io::Error {
        match self {
            StorageFault::DiskFull => io::Error::new(io::ErrorKind::StorageFull, "No space left on device (injected)"),
            StorageFault::PermissionDenied => {
                io::Error::new(io::ErrorKind::PermissionDenied, "Permission denied (injected)")
            }
            StorageFault::FsyncFailed => io::Error::other("fsync failed: Input/output error (injected)"),
        }
    }
}

/// One-shot failure points for tests: each fault fires once, then is spent.
#[derive(Default, Debug)]
pub struct FaultInjector {
    faults: Mutex<Vec<(Fault, bool)>>,
    /// Records seen per operator (for [`Fault::AtRecord`]).
    seen: Mutex<HashMap<String, Arc<AtomicU64>>>,
    fired: AtomicU64,
    armed: AtomicBool,
    /// A record fault already fired in this attempt: the next may fire only after a restart
    /// (two subtasks failing at once would otherwise spend two faults on one failover).
    record_fault_this_attempt: AtomicBool,
    /// Attempts started, the first included.
    attempts: AtomicU64,
}

impl FaultInjector {
    /// Injects `faults`, each once.
    pub fn new(faults: Vec<Fault>) -> Arc<Self> {
        let armed = !faults.is_empty();
        Arc::new(FaultInjector {
            faults: Mutex::new(faults.into_iter().map(|f| (f, false)).collect()),
            armed: AtomicBool::new(armed),
            ..Default::default()
        })
    }

    /// A new attempt of the job starts (called by the runtime).
    pub fn new_attempt(&self) {
        self.record_fault_this_attempt.store(false, Ordering::SeqCst);
        self.attempts.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether the task being polled should fail now, right after this attempt's restore.
    pub fn fail_after_restore(&self) -> bool {
        let restart = self.attempts.load(Ordering::SeqCst).saturating_sub(1);
        restart > 0 && self.fire_if(|f| *f == Fault::RightAfterRestore { restart })
    }

    /// Whether the process should die in the middle of writing a task file of checkpoint `id`.
    pub fn exit_mid_task_write(&self, id: u64) -> bool {
        self.fire_if(|f| *f == Fault::ExitMidTaskWrite { checkpoint: id })
    }

    /// How many faults have fired.
    pub fn fired(&self) -> u64 {
        self.fired.load(Ordering::SeqCst)
    }

    fn fire_if(&self, mut matches: impl FnMut(&Fault) -> bool) -> bool {
        if !self.armed.load(Ordering::Relaxed) {
            return false;
        }
        let mut faults = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        for (f, spent) in faults.iter_mut() {
            if !*spent && matches(f) {
                *spent = true;
                self.fired.fetch_add(1, Ordering::SeqCst);
                return true;
            }
        }
        false
    }

    /// Whether the process should end after checkpoint `id`'s metadata (the coordinator asks).
    pub fn exit_before_commit(&self, id: u64) -> bool {
        self.fire_if(|f| *f == Fault::ExitBeforeCommit { checkpoint: id })
    }

    /// Whether the process should end now that a task applied checkpoint `id`'s completion.
    pub fn exit_after_first_commit(&self, id: u64) -> bool {
        self.fire_if(|f| *f == Fault::ExitAfterFirstCommit { checkpoint: id })
    }

    /// Whether the process should end between writing checkpoint `id`'s metadata and renaming
    /// it into place.
    pub fn exit_before_metadata_rename(&self, id: u64) -> bool {
        self.fire_if(|f| *f == Fault::ExitBeforeMetadataRename { checkpoint: id })
    }

    /// Stops the process (SIGSTOP) if it is to pause before it publishes checkpoint `id`;
    /// returns once it was continued.
    pub fn stop_before_publish(&self, id: u64) {
        if self.fire_if(|f| *f == Fault::StopBeforePublish { checkpoint: id }) {
            let pid = std::process::id().to_string();
            // The whole process stops, this thread with it, until someone continues it.
            let _ = std::process::Command::new("kill").args(["-STOP", &pid]).status();
        }
    }

    /// Counts `n` records arriving at `operator`; fails if a fault's record is among them.
    pub fn on_records(&self, operator: &str, n: usize) -> Result<()> {
        if !self.armed.load(Ordering::Relaxed) || n == 0 {
            return Ok(());
        }
        let counter = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(seen.entry(operator.to_string()).or_default())
        };
        let after = counter.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
        // One failure per batch; a fault whose record passed in the same batch as another's
        // fires with the next batch.
        if self.record_fault_this_attempt.load(Ordering::SeqCst) {
            return Ok(());
        }
        if self.fire_if(|f| matches!(f, Fault::AtRecord { operator: o, nth } if o == operator && *nth <= after)) {
            self.record_fault_this_attempt.store(true, Ordering::SeqCst);
            return Err(Error::OperatorPanicked {
                operator: operator.to_string(),
                subtask: 0,
                message: format!("injected failure at record {}", after),
            });
        }
        Ok(())
    }

    /// Whether the synchronous part of `checkpoint` should fail now.
    pub fn fail_sync(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::SyncSnapshot { checkpoint })
    }
    /// Whether the asynchronous part of `checkpoint` should fail now.
    pub fn fail_async(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::AsyncSnapshot { checkpoint })
    }
    /// Fires the first unspent fault `which` maps to a storage error, and returns the error.
    fn storage_error(&self, which: impl Fn(&Fault) -> Option<StorageFault>) -> Option<io::Error> {
        let mut error = None;
        self.fire_if(|f| {
            error = which(f);
            error.is_some()
        });
        error.map(StorageFault::to_io_error)
    }
    /// The storage error a task's write of `checkpoint` should meet now, if any.
    pub fn storage_write(&self, checkpoint: u64) -> Option<io::Error> {
        self.storage_error(|f| match f {
            Fault::StorageWrite { checkpoint: c, error } if *c == checkpoint => Some(*error),
            _ => None,
        })
    }
    /// The storage error the metadata write of `checkpoint` should meet now, if any.
    pub fn metadata_write(&self, checkpoint: u64) -> Option<io::Error> {
        self.storage_error(|f| match f {
            Fault::MetadataWrite { checkpoint: c, error } if *c == checkpoint => Some(*error),
            _ => None,
        })
    }
    /// Whether the coordinator should decline `checkpoint`.
    pub fn decline(&self, checkpoint: u64) -> bool {
        self.fire_if(|f| *f == Fault::Decline { checkpoint })
    }
}
