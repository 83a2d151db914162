//! What a plugin saves on ADD to undo on DEL, one file per attachment in a directory its
//! configuration names (`dataDir`): `<dir>/<containerID>_<ifname>.json`, written whole or not at
//! all and synced (`libcni::durable`), readable by root only.

use libcni::{Error, Result};
use std::path::{Path, PathBuf};

/// `<dir>/<containerID>_<ifname>.json`; skel has checked that neither part can form a path.
pub fn path(dir: &Path, container_id: &str, ifname: &str) -> PathBuf {
    dir.join(format!("{container_id}_{ifname}.json"))
}

/// Writes `bytes` to `path` whole or not at all, synced, creating its directory (mode 0700).
/// `what` names the content for errors (`tuning: save original link attributes`).
pub use libcni::durable::write;

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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// Two ADDs saving one attachment's record at once (a retried ADD) each write a whole record:
    /// no error, no torn file, no temporary file left.
    #[test]
    fn concurrent_saves_of_one_record() {
        let d = std::env::temp_dir().join(format!("netkit-saved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let p = path(&d, "c1", "eth0");
        let writers: Vec<_> = (0..2u8)
            .map(|w| {
                let p = p.clone();
                std::thread::spawn(move || {
                    for i in 0..200usize {
                        write(&p, &vec![b'a' + w; (i % 4 + 1) * 20_000], "test: save").unwrap();
                    }
                })
            })
            .collect();
        while writers.iter().any(|w| !w.is_finished()) {
            if let Some(got) = read(&p, "test").unwrap() {
                assert!(got.len() % 20_000 == 0 && got.iter().all(|b| *b == got[0]), "torn: {} bytes", got.len());
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        assert_eq!(list(&d, "test").unwrap(), [p]);
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1, "a temporary file stays");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
