//! Atomic, idempotent placement of files into host directories that others share.
//!
//! A kubelet or container runtime may exec a plugin, or read the conflist, at any moment. Writing in
//! place would let it see a half-written file or fail with "text file busy", so every file is written
//! to a temporary name in the same directory, synced, and renamed over the target: the target is
//! always either the old complete file or the new complete file. Files not named by us are never
//! opened, so other vendors' plugins and configurations stay as they are.

use sha2::{Digest, Sha256};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Installed { sha256: String },
    Unchanged,
}

/// Puts `content` at `dir/name` with `mode`, unless the file there already has exactly that
/// content and mode.
pub fn place(dir: &Path, name: &str, content: &[u8], mode: u32) -> Result<Outcome, String> {
    let target = dir.join(name);
    if is_identical(&target, content, mode)? {
        return Ok(Outcome::Unchanged);
    }
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = write_synced(&temp, content, mode)
        .and_then(|()| fs::rename(&temp, &target).map_err(|e| io_error("rename", &temp, e)))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        // Best effort: a stale temp file is harmless (hidden name) and removed on the next run.
        let _ = fs::remove_file(&temp);
    }
    result?;
    Ok(Outcome::Installed { sha256: sha256_hex(content) })
}

/// Copies every regular file of `src` (symlinks followed) into `dest`, in name order.
pub fn install_dir(src: &Path, dest: &Path) -> Result<Vec<(String, Outcome)>, String> {
    let mut names = Vec::new();
    let entries = fs::read_dir(src).map_err(|e| io_error("read directory", src, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| io_error("read directory", src, e))?;
        let path = entry.path();
        let meta = fs::metadata(&path).map_err(|e| io_error("stat", &path, e))?;
        if !meta.is_file() {
            continue;
        }
        let name = entry
            .file_name()
            .into_string()
            .map_err(|raw| format!("{}: file name {raw:?} is not UTF-8", src.display()))?;
        names.push(name);
    }
    if names.is_empty() {
        return Err(format!("{}: no plugin binaries to install", src.display()));
    }
    names.sort();

    let mut outcomes = Vec::new();
    for name in names {
        let from = src.join(&name);
        let content = fs::read(&from).map_err(|e| io_error("read", &from, e))?;
        let outcome = place(dest, &name, &content, 0o755)?;
        outcomes.push((name, outcome));
    }
    Ok(outcomes)
}

/// Removes temp files a crashed earlier run left behind for the names we own. In a container the
/// installer is always PID 1, so the next run would overwrite them anyway; this keeps the host tidy
/// when the PID differs.
pub fn remove_stale_temps(dir: &Path, owned: &[&str]) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let is_ours = owned.iter().any(|name| {
            file_name
                .strip_prefix('.')
                .and_then(|rest| rest.strip_prefix(name))
                .is_some_and(|rest| rest.starts_with(".tmp-"))
        });
        if is_ours {
            let _ = fs::remove_file(entry.path());
        }
    }
}

pub fn sha256_hex(content: &[u8]) -> String {
    Sha256::digest(content).iter().map(|byte| format!("{byte:02x}")).collect()
}

fn is_identical(target: &Path, content: &[u8], mode: u32) -> Result<bool, String> {
    let meta = match fs::symlink_metadata(target) {
        Ok(meta) => meta,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(io_error("stat", target, err)),
    };
    if !meta.is_file() || meta.len() != content.len() as u64 || meta.permissions().mode() & 0o7777 != mode {
        return Ok(false);
    }
    let existing = fs::read(target).map_err(|e| io_error("read", target, e))?;
    Ok(existing == content)
}

fn write_synced(temp: &Path, content: &[u8], mode: u32) -> Result<(), String> {
    match fs::remove_file(temp) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_error("remove stale", temp, err)),
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(temp)
        .map_err(|e| io_error("create", temp, e))?;
    file.write_all(content).map_err(|e| io_error("write", temp, e))?;
    // The umask may have narrowed the mode given to open.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| io_error("chmod", temp, e))?;
    file.sync_all().map_err(|e| io_error("fsync", temp, e))
}

/// Makes the rename itself durable across a node crash.
fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(|e| io_error("fsync directory", dir, e))
}

fn io_error(action: &str, path: &Path, err: io::Error) -> String {
    format!("{action} {}: {err}", path.display())
}

/// A directory under the system temp dir, removed on drop; std has none.
#[cfg(test)]
pub struct TempDir(pub std::path::PathBuf);

#[cfg(test)]
impl TempDir {
    pub fn new(label: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "cni-installer-{label}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

#[cfg(test)]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn listing(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    #[test]
    fn copies_atomically_with_mode_and_leaves_no_temp() {
        let src = TempDir::new("src");
        let dest = TempDir::new("dest");
        fs::write(src.0.join("bridge"), b"new bridge").unwrap();
        fs::write(src.0.join("loopback"), b"new loopback").unwrap();
        fs::create_dir(src.0.join("subdir")).unwrap();
        fs::write(dest.0.join("bridge"), b"old bridge, longer than the new one").unwrap();
        let old_inode = fs::metadata(dest.0.join("bridge")).unwrap().ino();

        let outcomes = install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(outcomes.len(), 2);
        assert_eq!(outcomes[0].0, "bridge");
        assert_eq!(outcomes[0].1, Outcome::Installed { sha256: sha256_hex(b"new bridge") });
        assert_eq!(fs::read(dest.0.join("bridge")).unwrap(), b"new bridge");
        assert_eq!(fs::read(dest.0.join("loopback")).unwrap(), b"new loopback");
        let meta = fs::metadata(dest.0.join("bridge")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        // A rename gives a new inode; an in-place write would keep the one a running exec holds.
        assert_ne!(meta.ino(), old_inode);
        assert_eq!(listing(&dest.0), ["bridge", "loopback"]);
    }

    #[test]
    fn identical_files_are_skipped() {
        let src = TempDir::new("src");
        let dest = TempDir::new("dest");
        fs::write(src.0.join("loopback"), b"loopback").unwrap();
        install_dir(&src.0, &dest.0).unwrap();
        let inode = fs::metadata(dest.0.join("loopback")).unwrap().ino();

        let outcomes = install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(outcomes, [("loopback".to_string(), Outcome::Unchanged)]);
        assert_eq!(fs::metadata(dest.0.join("loopback")).unwrap().ino(), inode);
    }

    #[test]
    fn same_content_wrong_mode_is_reinstalled() {
        let dest = TempDir::new("dest");
        fs::write(dest.0.join("portmap"), b"portmap").unwrap();
        fs::set_permissions(dest.0.join("portmap"), fs::Permissions::from_mode(0o644)).unwrap();
        let outcome = place(&dest.0, "portmap", b"portmap", 0o755).unwrap();
        assert!(matches!(outcome, Outcome::Installed { .. }));
        let mode = fs::metadata(dest.0.join("portmap")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    #[test]
    fn other_files_are_untouched() {
        let src = TempDir::new("src");
        let dest = TempDir::new("dest");
        fs::write(src.0.join("bridge"), b"ours").unwrap();
        fs::write(dest.0.join("flannel"), b"theirs").unwrap();
        fs::set_permissions(dest.0.join("flannel"), fs::Permissions::from_mode(0o700)).unwrap();
        let before = fs::metadata(dest.0.join("flannel")).unwrap();

        install_dir(&src.0, &dest.0).unwrap();

        let after = fs::metadata(dest.0.join("flannel")).unwrap();
        assert_eq!(fs::read(dest.0.join("flannel")).unwrap(), b"theirs");
        assert_eq!(after.ino(), before.ino());
        assert_eq!(after.mtime_nsec(), before.mtime_nsec());
        assert_eq!(after.permissions().mode(), before.permissions().mode());
        assert_eq!(listing(&dest.0), ["bridge", "flannel"]);
    }

    #[test]
    fn replaces_a_symlink_target_name_not_what_it_points_to() {
        let src = TempDir::new("src");
        let dest = TempDir::new("dest");
        fs::write(src.0.join("loopback"), b"ours").unwrap();
        fs::write(dest.0.join("elsewhere"), b"theirs").unwrap();
        std::os::unix::fs::symlink("elsewhere", dest.0.join("loopback")).unwrap();

        install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(fs::read(dest.0.join("elsewhere")).unwrap(), b"theirs");
        assert!(fs::symlink_metadata(dest.0.join("loopback")).unwrap().is_file());
        assert_eq!(fs::read(dest.0.join("loopback")).unwrap(), b"ours");
    }

    #[test]
    fn stale_temps_of_our_names_only_are_removed() {
        let dest = TempDir::new("dest");
        for name in [".bridge.tmp-7", ".bridgex.tmp-7", ".flannel.tmp-7", "bridge"] {
            fs::write(dest.0.join(name), b"x").unwrap();
        }
        remove_stale_temps(&dest.0, &["bridge", "loopback"]);
        assert_eq!(listing(&dest.0), [".bridgex.tmp-7", ".flannel.tmp-7", "bridge"]);
    }

    #[test]
    fn missing_or_empty_source_is_an_error() {
        let dest = TempDir::new("dest");
        let err = install_dir(&dest.0.join("nope"), &dest.0).unwrap_err();
        assert!(err.contains("read directory"), "{err}");
        let empty = TempDir::new("empty");
        let err = install_dir(&empty.0, &dest.0).unwrap_err();
        assert!(err.contains("no plugin binaries"), "{err}");
    }

    #[test]
    fn failed_write_leaves_target_and_no_temp() {
        let dest = TempDir::new("dest");
        // A directory in the target's place makes the rename fail after the temp is written.
        fs::create_dir(dest.0.join("bridge")).unwrap();
        fs::write(dest.0.join("bridge").join("keep"), b"x").unwrap();
        let err = place(&dest.0, "bridge", b"ours", 0o755).unwrap_err();
        assert!(err.contains("rename"), "{err}");
        assert_eq!(listing(&dest.0), ["bridge"]);
    }
}
