//! Savepoints in an object store on the command line: `--savepoint-dir s3://BUCKET/PREFIX`
//! (a stop-with-savepoint is taken into a working folder, then goes up whole as
//! `PREFIX/savepoint-<n>/`, `_metadata` last) and `--restore s3://BUCKET/PREFIX/savepoint-<n>`
//! (brought down into a working folder, then restored as a local one).
//!
//! Without the crate's `object-store` feature an `s3://` folder is refused with an error that
//! names the feature (the store's client needs a C compiler to build).
//!
//! May touch: nothing else in the crate (weir's checkpoint mirror, `weir-object-store`).

use std::path::{Path, PathBuf};

use weir::checkpoint::CheckpointMirror;
use weir::{Error, Result};

/// Whether `folder` names a place in an object store (`s3://BUCKET/PREFIX`) rather than a
/// local folder.
pub fn is_stored(folder: &str) -> bool {
    folder.starts_with("s3://")
}

/// The client of the store at `url` (`s3://BUCKET/PREFIX`).
fn open_store(url: &str) -> Result<CheckpointMirror> {
    #[cfg(feature = "object-store")]
    {
        Ok(CheckpointMirror::new(weir_object_store::open(url)?))
    }
    #[cfg(not(feature = "object-store"))]
    {
        Err(Error::config(format!(
            "{url} is in an object store, and this program was built without weir-ops' `object-store` feature"
        )))
    }
}

/// Where a stop-with-savepoint goes.
#[derive(Debug)]
pub enum SavepointDir {
    /// A local folder.
    Local(PathBuf),
    /// An object store: taken into `staging`, then put under the store's prefix.
    Stored {
        /// `s3://BUCKET/PREFIX` as given, without a trailing `/`.
        url: String,
        /// The store's client.
        mirror: CheckpointMirror,
        /// The working folder the savepoint is taken into before it goes up.
        staging: PathBuf,
    },
}

impl SavepointDir {
    /// `dir` as a savepoint directory: a store's is checked now (a listing), a folder is
    /// created now, so a bad one is found at start, not when the savepoint is asked for.
    pub fn open(dir: &Path) -> Result<SavepointDir> {
        match dir.to_str().filter(|d| is_stored(d)) {
            Some(url) => {
                let mirror = open_store(url)?;
                mirror.probe()?;
                let staging = crate::scratch_dir("savepoints");
                Ok(SavepointDir::Stored { url: url.trim_end_matches('/').to_string(), mirror, staging })
            }
            None => {
                std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create the savepoint directory", dir, e))?;
                Ok(SavepointDir::Local(dir.to_path_buf()))
            }
        }
    }

    /// The folder the savepoint is taken into.
    pub fn folder(&self) -> &Path {
        match self {
            SavepointDir::Local(dir) => dir,
            SavepointDir::Stored { staging, .. } => staging,
        }
    }

    /// Where the savepoint taken into `taken` (a folder under [`SavepointDir::folder`]) is for
    /// good: itself, or, put into the store, its address there.
    pub fn keep(&self, taken: &Path) -> Result<String> {
        match self {
            SavepointDir::Local(_) => Ok(taken.display().to_string()),
            SavepointDir::Stored { url, mirror, staging } => {
                let name = taken.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
                mirror.upload_folder(taken, &name)?;
                let _ = std::fs::remove_dir_all(staging);
                Ok(format!("{url}/{name}"))
            }
        }
    }
}

/// The folder to restore `path` from: itself, or for `s3://BUCKET/PREFIX/savepoint-<n>` (or
/// `chk-<n>`), a working folder it was brought down into.
pub fn restorable(path: &Path) -> Result<PathBuf> {
    let Some(url) = path.to_str().filter(|p| is_stored(p)) else { return Ok(path.to_path_buf()) };
    let url = url.trim_end_matches('/');
    let name = url.rsplit_once('/').map(|(_, n)| n).unwrap_or_default();
    if !(name.starts_with("savepoint-") || name.starts_with("chk-")) {
        return Err(Error::config(format!(
            "{url} is not a savepoint or checkpoint in a store: expected s3://BUCKET/PREFIX/savepoint-<n> (or chk-<n>)"
        )));
    }
    let mirror = open_store(url)?;
    let to = crate::scratch_dir("restore").join(name);
    if mirror.download_folder("", &to)? == 0 {
        return Err(Error::config(format!("{url} holds nothing: no savepoint or checkpoint there")));
    }
    Ok(to)
}
