//! What a chat sent its agent, saved into the folder's media directory
//! (`folders/<key>/workspace/media/`, `/workspace/media/` in the box).
//!
//! The workspace is the agent's: it may have put a symlink or a file where `media/` belongs,
//! a symlink where the file goes, or thousands of entries in the directory. The write walks
//! with `O_NOFOLLOW` ([`SafeDir`]), replaces a planted non-directory at `media/` (as a run's
//! preparation does), lands by `renameat` over whatever sits at the name (never writing
//! through it), and counts the directory's regular files against a per-folder limit, looking
//! at a bounded number of entries.

use std::io;

use hako_shared::GroupFolder;
use hako_shared::layout::{self, FolderDir};
use hako_shared::media;

use crate::Runner;
use crate::safefs::Usage;

/// Entries of a media directory looked at when counting it; more counts as full.
pub const MAX_ENTRIES: usize = 10_000;

/// Why a file was not saved.
#[derive(Debug, thiserror::Error)]
pub enum MediaError {
    /// The name breaks [`media::check_name`].
    #[error("{0}")]
    Name(String),
    /// The folder's media directory would pass its limit.
    #[error(
        "the folder's media directory holds {held} bytes in {files} files; this file's {bytes} \
         bytes would pass its limit of {limit} bytes (the agent, or the operator, removes \
         files from /workspace/media to make room)"
    )]
    Full {
        /// Bytes held now (the file it replaces not counted).
        held: u64,
        /// Files held now.
        files: usize,
        /// The new file's size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// More than [`MAX_ENTRIES`] entries: not counted, refused.
    #[error(
        "the folder's media directory holds more than {MAX_ENTRIES} entries (the agent, or the \
         operator, removes files from /workspace/media to make room)"
    )]
    TooManyEntries,
    /// The file system refused.
    #[error("saving the file failed: {0}")]
    Io(#[from] io::Error),
}

impl Runner {
    /// Saves `data` as `name` in `folder`'s media directory (replacing a file of that name),
    /// unless the directory's regular files would then pass `folder_max` bytes. Answers the
    /// bytes written. Safe while a run of the folder is live: the agent sees the file appear
    /// whole.
    pub async fn save_media(
        &self,
        folder: &GroupFolder,
        name: &str,
        data: bytes::Bytes,
        folder_max: u64,
    ) -> Result<u64, MediaError> {
        media::check_name(name).map_err(MediaError::Name)?;
        let storage = self.storage.clone();
        let owner = self.owner();
        let folder_rel = layout::folder_rel(folder);
        let name = name.to_owned();
        tokio::task::spawn_blocking(move || {
            let root = storage.root();
            // The folder's own directory is the host's; below it, the agent's.
            let dir = root.ensure_subdir(&folder_rel, 0o755, None)?;
            let ws = dir.ensure_subdir_replacing(FolderDir::Workspace.name(), 0o755, owner)?;
            let md = ws.ensure_subdir_replacing(media::DIR, 0o755, owner)?;
            let Some(Usage { files, bytes: held }) = md.usage(MAX_ENTRIES)? else {
                return Err(MediaError::TooManyEntries);
            };
            let replaced = md.file_size(&name)?.unwrap_or(0);
            let held = held - replaced.min(held);
            let bytes = data.len() as u64;
            if held + bytes > folder_max {
                return Err(MediaError::Full {
                    held,
                    files,
                    bytes,
                    limit: folder_max,
                });
            }
            md.write_atomic(&name, &data, 0o644, owner)?;
            Ok(bytes)
        })
        .await
        .map_err(|e| MediaError::Io(io::Error::other(e)))?
    }
}
