//! What a plugin saves on ADD to undo on DEL, one file per attachment in a directory its
//! configuration names (`dataDir`): `<dir>/<containerID>_<ifname>.json`, written whole or not at
//! all (a temporary file renamed over it), readable by root only.

use libcni::{Error, Result};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `<dir>/<containerID>_<ifname>.json`; skel has checked that neither part can form a path.
pub fn path(dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    dir.join(format!("{container_id}_{ifname}.json"))
}

/// Writes `bytes` to `path`, creating its directory (mode 0700). `what` names the content for
/// errors (`tuning: save original link attributes`).
pub fn write(path: &Path, bytes: &[u8], what: &str) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format_args!("{what}: create dataDir {}", dir.display()), &e))?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format_args!("{what} to {}", path.display()), &e)
    })
}

/// The saved bytes, `None` when nothing was saved.
pub fn read(path: &Path, what: &str) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format_args!("{what}: read {}", path.display()), &e)),
    }
}

/// The records in `dir` (`*.json`, not the temporary files `write` renames), sorted; none when
/// `dir` does not exist.
pub fn list(dir: &Path, what: &str) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format_args!("{what}: list {}", dir.display()), &e)),
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            name.ends_with(".json") && !name.starts_with('.')
        })
        .collect();
    paths.sort();
    Ok(paths)
}

/// Removes the file; one already gone is success.
pub fn remove(path: &Path, what: &str) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format_args!("{what}: remove {}", path.display()), &e)),
    }
}

/// The directory a configuration's `dataDir` names (absolute), else `default`.
pub fn dir(data_dir: Option<String>, default: &str, plugin: &str) -> Result<PathBuf> {
    match data_dir.filter(|d| !d.is_empty()) {
        None => Ok(PathBuf::from(default)),
        Some(d) if d.starts_with('/') && !d.contains('\0') => Ok(PathBuf::from(d)),
        Some(d) => Err(Error::config(format!("{plugin}: dataDir {d:?} must be an absolute path"))),
    }
}

/// `dataDir` as a configuration that may not validate otherwise spells it (Go's case-insensitive
/// keys): for DEL, which undoes what was saved whatever else the configuration says.
pub fn dir_for_del(raw: &serde_json::Value, default: &str, plugin: &str) -> Result<PathBuf> {
    let value = match raw.as_object().and_then(|o| libcni::gojson::get(o, "dataDir")) {
        Some((_, serde_json::Value::String(s))) => Some(s.clone()),
        _ => None,
    };
    dir(value, default, plugin)
}
