//! Stands in for the `testing` feature's failure points in builds without it: an injector
//! that cannot be built (so no configuration holds one) and never fires. The failure points
//! stay in the code as calls that the compiler removes.
//!
//! May touch: `error`.

use crate::error::Result;

/// No failure points: this build was made without the `testing` feature.
#[derive(Debug)]
pub enum FaultInjector {}

impl FaultInjector {
    pub(crate) fn new_attempt(&self) {}
    pub(crate) fn on_records(&self, _operator: &str, _n: usize) -> Result<()> {
        Ok(())
    }
    pub(crate) fn fail_sync(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn fail_async(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn storage_write(&self, _checkpoint: u64) -> Option<std::io::Error> {
        None
    }
    pub(crate) fn metadata_write(&self, _checkpoint: u64) -> Option<std::io::Error> {
        None
    }
    pub(crate) fn decline(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn exit_before_commit(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn exit_before_metadata_rename(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn stop_before_publish(&self, _checkpoint: u64) {}
    pub(crate) fn exit_after_first_commit(&self, _checkpoint: u64) -> bool {
        false
    }
    pub(crate) fn fail_after_restore(&self) -> bool {
        false
    }
    pub(crate) fn exit_mid_task_write(&self, _checkpoint: u64) -> bool {
        false
    }
}
