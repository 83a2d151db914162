//! The one way our state files are written: whole or not at all, and on disk when `write` returns.
//! A temporary file in the target's directory (mode 0600, a name no other writer takes) is written
//! and synced, renamed over the target, and the directory is synced so that the rename itself
//! survives a crash. A failure (a full disk, a read-only mount) is a CNI I/O error naming the path,
//! and leaves the target as it was and no temporary file.
//!
//! Users: what plugins save on ADD to undo on DEL (`netkit::saved`), and, without the two syncs
//! ([`write_unsynced`]), the runtime's result cache (`cache`).

use crate::error::{Error, Result};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Temporary names are `.tmp-<final name>-<writer pid>-<counter>`: hidden, so no listing takes one
/// for an entry, and never shared by two writers.
const TEMP_PREFIX: &str = ".tmp-";
/// A write takes milliseconds: a temporary file this old was left by a writer that is gone, even if
/// its pid now belongs to another process.
const TEMP_STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Writes `bytes` to `path`, creating its directory (mode 0700) when missing. `what` names the
/// content for errors: `"<what>: write <path>: <os error>"`, code 5.
pub fn write(path: &Path, bytes: &[u8], what: &str) -> Result<()> {
    write_as(path, bytes, what, true)
}

/// [`write`] without syncing the file or the directory: the file is still whole or absent, but a
/// crash of the node may lose it. For the runtime's result cache, which upstream libcni does not
/// sync either: it is read back only by this node's runtime, and a crash that loses an entry also
/// ended the container it describes. A sync costs 0.5-5 ms on every ADD (docs/bench/README.md).
pub fn write_unsynced(path: &Path, bytes: &[u8], what: &str) -> Result<()> {
    write_as(path, bytes, what, false)
}

fn write_as(path: &Path, bytes: &[u8], what: &str, sync: bool) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format_args!("{what}: create directory {}", dir.display()), &e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(
        "{TEMP_PREFIX}{name}-{}-{}",
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(format_args!("{what}: write {}", path.display()), &e));
    }
    if !sync {
        return Ok(());
    }
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(format_args!("{what}: sync directory {}", dir.display()), &e))
}

/// The writer's pid, if `name` is a temporary name `write` makes.
fn temp_writer(name: &str) -> Option<i32> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let mut fields = rest.rsplitn(3, '-');
    let _counter: u64 = fields.next()?.parse().ok()?;
    let pid: i32 = fields.next()?.parse().ok()?;
    let target = fields.next()?;
    (pid > 0 && !target.is_empty()).then_some(pid)
}

/// Whether a process `pid` exists (in this pid namespace).
fn process_exists(pid: i32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Removes the temporary files that writers killed between creating and renaming them left in
/// `dir`: only names `write` makes, only regular files, and only stale ones (the writer's process
/// is gone, or the file is older than a minute). How many were removed; a missing directory has
/// none. `what` names the directory for errors.
pub fn remove_stale_temp_files(dir: &Path, what: &str) -> Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(format_args!("{what}: read directory {}", dir.display()), &e)),
    };
    let mut removed = 0;
    for entry in entries.filter_map(|e| e.ok()) {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temp_writer) else { continue };
        let Ok(meta) = entry.metadata() else { continue };
        let age = meta.modified().ok().and_then(|m| m.elapsed().ok()).unwrap_or_default();
        if !meta.is_file() || (process_exists(pid) && age < TEMP_STALE_AFTER) {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tempdir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("cni-durable-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn names(d: &Path) -> Vec<String> {
        let mut v: Vec<String> =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    }

    #[test]
    fn writes_whole_files_in_a_private_directory() {
        let d = tempdir("modes");
        let path = d.join("sub/a.json");
        write(&path, b"{\"a\":1}", "test").unwrap();
        write(&path, b"{}", "test").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(d.join("sub")).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(names(&d.join("sub")), ["a.json"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
