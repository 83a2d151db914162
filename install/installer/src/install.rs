//! Atomic, idempotent placement of files into host directories that others share.
//!
//! A kubelet or container runtime may exec a plugin, or read the conflist, at any moment. Writing in
//! place would let it see a half-written file or fail with "text file busy", so every file is written
//! to a temporary name in the same directory, synced, and renamed over the target: the target is
//! always either the old complete file or the new complete file. The plugin names of the multi-call
//! binary are made the same way, a hard link to a temporary name renamed over the target. Files not
//! named by us are never opened, so other vendors' plugins and configurations stay as they are.

use libcni::{registry, Error, Result};
use nix::errno::Errno;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// The multi-call binary: it runs the plugin named by the file name it is executed under.
pub const MULTI_CALL: &str = registry::MULTI_CALL;
/// In the source directory, the plugin names to install as hard links to [`MULTI_CALL`], one per
/// line (blank lines and `#` comments ignored). Without it every file of the source is a plain copy.
pub const MANIFEST: &str = ".plugins";

/// How one plugin name was put in place in the target directory.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement {
    /// Written from the source (a temp file renamed over the target).
    Installed { sha256: String },
    /// Already there: same bytes and mode, or a hard link to the installed multi-call binary.
    Unchanged,
    /// Now a hard link to the installed multi-call binary (linked to a temp name, renamed over the target).
    Linked,
    /// Hard links are not possible in the directory, so a full copy of the multi-call binary.
    Copied { sha256: String },
}

/// What an install did, name by name, in the order it happened.
#[derive(Debug, PartialEq, Eq)]
pub struct Report {
    pub outcomes: Vec<(String, Placement)>,
    /// Why plugin names were copied instead of linked, when they were.
    pub link_error: Option<String>,
}

/// Creates a hard link; a parameter so tests can make it fail.
pub type LinkFn = fn(&Path, &Path) -> io::Result<()>;

pub fn system_hard_link(original: &Path, link: &Path) -> io::Result<()> {
    fs::hard_link(original, link)
}

/// The files of a source directory, sorted by name.
#[derive(Debug, PartialEq, Eq)]
pub struct Source {
    /// Copied as they are.
    pub plain: Vec<String>,
    /// With a manifest: the plugin names that become hard links to [`MULTI_CALL`] (which is then not
    /// in `plain`). Empty without one.
    pub links: Vec<String>,
}

impl Source {
    pub fn read(src: &Path) -> Result<Source> {
        let mut plain = Vec::new();
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
                .map_err(|raw| Error::config(format!("{}: file name {raw:?} is not UTF-8", src.display())))?;
            if name != MANIFEST {
                plain.push(name);
            }
        }
        plain.sort();

        let manifest = src.join(MANIFEST);
        let text = match fs::read_to_string(&manifest) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                if plain.is_empty() {
                    return Err(Error::config(format!("{}: no plugin binaries to install", src.display())));
                }
                return Ok(Source { plain, links: Vec::new() });
            }
            Err(err) => return Err(io_error("read", &manifest, err)),
        };
        let links = parse_manifest(&text).map_err(|err| err.context(manifest.display()))?;
        if !plain.iter().any(|name| name == MULTI_CALL) {
            return Err(Error::config(format!(
                "{}: lists plugin names but {} has no {MULTI_CALL}",
                manifest.display(),
                src.display()
            )));
        }
        plain.retain(|name| name != MULTI_CALL);
        if let Some(both) = plain.iter().find(|name| links.contains(name)) {
            return Err(Error::config(format!(
                "{}: {both:?} is listed as a link to {MULTI_CALL} and is also a file in {}",
                manifest.display(),
                src.display()
            )));
        }
        Ok(Source { plain, links })
    }

    /// Every name this source puts into the target directory.
    pub fn names(&self) -> Vec<&str> {
        let multi_call = if self.links.is_empty() { None } else { Some(MULTI_CALL) };
        self.plain.iter().map(String::as_str).chain(multi_call).chain(self.links.iter().map(String::as_str)).collect()
    }
}

fn parse_manifest(text: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = Vec::new();
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty() && !line.starts_with('#')) {
        let plain = !line.starts_with('.') && !line.contains(['/', '\0']) && !line.chars().any(char::is_whitespace);
        if !plain {
            return Err(Error::config(format!("{line:?} is not a plain file name")));
        }
        if line == MULTI_CALL {
            return Err(Error::config(format!("{MULTI_CALL} cannot be a link to itself")));
        }
        if names.iter().any(|name| name == line) {
            return Err(Error::config(format!("{line:?} is listed twice")));
        }
        names.push(line.to_string());
    }
    if names.is_empty() {
        return Err(Error::config("lists no plugin names"));
    }
    names.sort();
    Ok(names)
}

/// Puts `content` at `dir/name` with `mode`, unless the file there already has exactly that
/// content and mode.
pub fn place(dir: &Path, name: &str, content: &[u8], mode: u32) -> Result<Placement> {
    let target = dir.join(name);
    if is_identical(&target, content, mode)? {
        return Ok(Placement::Unchanged);
    }
    let temp = temp_path(dir, name);
    let result = write_synced(&temp, content, mode)
        .and_then(|()| fs::rename(&temp, &target).map_err(|e| io_error("rename", &temp, e)))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        // Best effort: a stale temp file is harmless (hidden name) and removed on the next run.
        let _ = fs::remove_file(&temp);
    }
    result?;
    Ok(Placement::Installed { sha256: sha256_hex(content) })
}

/// Installs `src` into `dest`: every plain file is copied (symlinks followed), in name order; with
/// a manifest, [`MULTI_CALL`] is copied and then linked under each listed name.
pub fn install_dir(src: &Path, dest: &Path) -> Result<Report> {
    install_dir_with(src, dest, system_hard_link)
}

pub fn install_dir_with(src: &Path, dest: &Path, link: LinkFn) -> Result<Report> {
    let source = Source::read(src)?;
    let mut report = Report { outcomes: Vec::new(), link_error: None };
    for name in &source.plain {
        let from = src.join(name);
        let content = fs::read(&from).map_err(|e| io_error("read", &from, e))?;
        let outcome = place(dest, name, &content, 0o755)?;
        report.outcomes.push((name.clone(), outcome));
    }
    if !source.links.is_empty() {
        install_multi_call(src, dest, &source.links, link, &mut report)?;
    }
    Ok(report)
}

/// Copies the multi-call binary, then makes each name a hard link to it.
///
/// A name already linked to the installed binary is left alone. Any other file at a name (an older
/// cni-rs, a Go plugin a runtime is executing right now) is replaced by linking the binary to a temp
/// name and renaming that over it, so the name always refers to one complete binary and a running
/// process keeps its own. Where the file system refuses hard links, each name gets a full copy.
fn install_multi_call(src: &Path, dest: &Path, names: &[String], link: LinkFn, report: &mut Report) -> Result<()> {
    let from = src.join(MULTI_CALL);
    let content = fs::read(&from).map_err(|e| io_error("read", &from, e))?;
    let outcome = place(dest, MULTI_CALL, &content, 0o755)?;
    report.outcomes.push((MULTI_CALL.to_string(), outcome));
    let binary = dest.join(MULTI_CALL);
    let binary_meta = fs::symlink_metadata(&binary).map_err(|e| io_error("stat", &binary, e))?;

    for name in names {
        let outcome = if report.link_error.is_some() {
            copied(place(dest, name, &content, 0o755)?)
        } else {
            match link_name(dest, name, &binary, &binary_meta, link)? {
                Ok(outcome) => outcome,
                Err(err) => {
                    report.link_error = Some(format!("hard link {MULTI_CALL} in {}: {err}", dest.display()));
                    copied(place(dest, name, &content, 0o755)?)
                }
            }
        };
        report.outcomes.push((name.clone(), outcome));
    }
    Ok(())
}

fn copied(outcome: Placement) -> Placement {
    match outcome {
        Placement::Installed { sha256 } => Placement::Copied { sha256 },
        other => other,
    }
}

/// Makes `dest/name` a hard link to `binary`. The inner error is a link failure that a copy can
/// stand in for (the file system does not do hard links); anything else is the outer error.
fn link_name(
    dest: &Path,
    name: &str,
    binary: &Path,
    binary_meta: &fs::Metadata,
    link: LinkFn,
) -> Result<Result<Placement, io::Error>> {
    let target = dest.join(name);
    match fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_file() && meta.dev() == binary_meta.dev() && meta.ino() == binary_meta.ino() => {
            return Ok(Ok(Placement::Unchanged));
        }
        Ok(_) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(io_error("stat", &target, err)),
    }
    let temp = temp_path(dest, name);
    remove_if_present(&temp)?;
    if let Err(err) = link(binary, &temp) {
        if links_unsupported(&err) {
            return Ok(Err(err));
        }
        return Err(Error::io(format_args!("hard link {} to {}", temp.display(), binary.display()), &err));
    }
    let result = fs::rename(&temp, &target).map_err(|e| io_error("rename", &temp, e)).and_then(|()| sync_dir(dest));
    // After a failed rename, and also after a successful one that did nothing: rename(2) leaves
    // both names when they are already links to one file (another writer got there first).
    let _ = fs::remove_file(&temp);
    result?;
    Ok(Ok(Placement::Linked))
}

/// The link(2) errors that mean "not here": another file system (EXDEV), one without hard links
/// (EPERM, EOPNOTSUPP), or too many links to the file (EMLINK).
fn links_unsupported(err: &io::Error) -> bool {
    let unsupported = [Errno::EXDEV, Errno::EPERM, Errno::EOPNOTSUPP, Errno::EMLINK];
    err.raw_os_error().is_some_and(|code| unsupported.iter().any(|errno| *errno as i32 == code))
}

/// Bytes on disk of the named files in `dir` counting each inode once, and how many inodes.
pub fn installed_size(dir: &Path, names: &[&str]) -> (u64, usize) {
    let mut seen = HashSet::new();
    let mut bytes = 0;
    for name in names {
        if let Ok(meta) = fs::symlink_metadata(dir.join(name)) {
            if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
                bytes += meta.len();
            }
        }
    }
    (bytes, seen.len())
}

fn temp_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!(".{name}.tmp-{}", std::process::id()))
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_error("remove stale", path, err)),
    }
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

fn is_identical(target: &Path, content: &[u8], mode: u32) -> Result<bool> {
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

fn write_synced(temp: &Path, content: &[u8], mode: u32) -> Result<()> {
    remove_if_present(temp)?;
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
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(|e| io_error("fsync directory", dir, e))
}

/// `<action> <path>: <os error>`, code 5 (I/O), with the errno.
fn io_error(action: &str, path: &Path, err: io::Error) -> Error {
    Error::io(format_args!("{action} {}", path.display()), &err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cni_tests::TempDir;
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

        let outcomes = install_dir(&src.0, &dest.0).unwrap().outcomes;

        assert_eq!(outcomes.len(), 2);
        assert_eq!(outcomes[0].0, "bridge");
        assert_eq!(outcomes[0].1, Placement::Installed { sha256: sha256_hex(b"new bridge") });
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

        let report = install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(report.outcomes, [("loopback".to_string(), Placement::Unchanged)]);
        assert_eq!(report.link_error, None);
        assert_eq!(fs::metadata(dest.0.join("loopback")).unwrap().ino(), inode);
    }

    #[test]
    fn same_content_wrong_mode_is_reinstalled() {
        let dest = TempDir::new("dest");
        fs::write(dest.0.join("portmap"), b"portmap").unwrap();
        fs::set_permissions(dest.0.join("portmap"), fs::Permissions::from_mode(0o644)).unwrap();
        let outcome = place(&dest.0, "portmap", b"portmap", 0o755).unwrap();
        assert!(matches!(outcome, Placement::Installed { .. }));
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
        assert!(err.msg.contains("read directory"), "{err}");
        assert_eq!((err.code, err.errno), (libcni::code::IO, Some(Errno::ENOENT as i32)), "{err}");
        let empty = TempDir::new("empty");
        let err = install_dir(&empty.0, &dest.0).unwrap_err();
        assert!(err.msg.contains("no plugin binaries"), "{err}");
        assert_eq!(err.code, libcni::code::INVALID_CONFIG, "{err}");
    }

    #[test]
    fn failed_write_leaves_target_and_no_temp() {
        let dest = TempDir::new("dest");
        // A directory in the target's place makes the rename fail after the temp is written.
        fs::create_dir(dest.0.join("bridge")).unwrap();
        fs::write(dest.0.join("bridge").join("keep"), b"x").unwrap();
        let err = place(&dest.0, "bridge", b"ours", 0o755).unwrap_err();
        assert!(err.msg.contains("rename"), "{err}");
        assert_eq!(listing(&dest.0), ["bridge"]);
    }

    const NAMES: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

    /// A source like the image's: the multi-call binary, its manifest, and one plain extra file.
    fn multi_call_src(binary: &[u8]) -> TempDir {
        let src = TempDir::new("src");
        fs::write(src.0.join(MULTI_CALL), binary).unwrap();
        fs::write(src.0.join(MANIFEST), "# plugin names\nbridge\nhost-local\n\nloopback\nportmap\n").unwrap();
        fs::write(src.0.join("extra"), b"a plain file").unwrap();
        src
    }

    fn inode(path: &Path) -> (u64, u64) {
        let meta = fs::symlink_metadata(path).unwrap();
        (meta.dev(), meta.ino())
    }

    fn link_unsupported(_: &Path, _: &Path) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(Errno::EXDEV as i32))
    }

    fn link_denied(_: &Path, _: &Path) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(Errno::EACCES as i32))
    }

    #[test]
    fn multi_call_fresh_install_shares_one_inode() {
        let src = multi_call_src(b"multi-call v1");
        let dest = TempDir::new("dest");

        let report = install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(report.link_error, None);
        let names: Vec<&str> = report.outcomes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["extra", "cni-rs", "bridge", "host-local", "loopback", "portmap"]);
        assert_eq!(report.outcomes[0].1, Placement::Installed { sha256: sha256_hex(b"a plain file") });
        assert_eq!(report.outcomes[1].1, Placement::Installed { sha256: sha256_hex(b"multi-call v1") });
        assert!(report.outcomes[2..].iter().all(|(_, outcome)| *outcome == Placement::Linked));

        let binary = dest.0.join(MULTI_CALL);
        let meta = fs::metadata(&binary).unwrap();
        assert_eq!(meta.nlink(), 5);
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        for name in NAMES {
            assert_eq!(inode(&dest.0.join(name)), inode(&binary), "{name}");
        }
        assert_eq!(fs::read(dest.0.join("extra")).unwrap(), b"a plain file");
        assert_ne!(inode(&dest.0.join("extra")), inode(&binary));
        // No temp file, no manifest.
        assert_eq!(listing(&dest.0), ["bridge", "cni-rs", "extra", "host-local", "loopback", "portmap"]);
        assert_eq!(installed_size(&dest.0, &["cni-rs", "bridge", "loopback", "missing"]), (13, 1));
    }

    #[test]
    fn multi_call_second_run_rewrites_nothing() {
        let src = multi_call_src(b"multi-call v1");
        let dest = TempDir::new("dest");
        install_dir(&src.0, &dest.0).unwrap();
        let before: Vec<_> = listing(&dest.0).iter().map(|name| fingerprint(&dest.0.join(name))).collect();

        let report = install_dir(&src.0, &dest.0).unwrap();

        assert!(report.outcomes.iter().all(|(_, outcome)| *outcome == Placement::Unchanged), "{report:?}");
        assert_eq!(report.outcomes.len(), 6);
        let after: Vec<_> = listing(&dest.0).iter().map(|name| fingerprint(&dest.0.join(name))).collect();
        assert_eq!(after, before);
    }

    /// Content, inode, link count, ctime (changes with any link or write) and mode.
    fn fingerprint(path: &Path) -> (Vec<u8>, u64, u64, i64, i64, u32) {
        let meta = fs::symlink_metadata(path).unwrap();
        (fs::read(path).unwrap(), meta.ino(), meta.nlink(), meta.ctime(), meta.ctime_nsec(), meta.mode())
    }

    #[test]
    fn multi_call_replaces_a_foreign_plugin_atomically_and_leaves_others() {
        let src = multi_call_src(b"multi-call v1");
        let dest = TempDir::new("dest");
        // Another binary at one of our names, held open as a running exec would hold it.
        fs::write(dest.0.join("bridge"), b"the Go reference bridge").unwrap();
        let running = File::open(dest.0.join("bridge")).unwrap();
        let old_bridge = inode(&dest.0.join("bridge"));
        fs::write(dest.0.join("flannel"), b"theirs").unwrap();
        fs::hard_link(dest.0.join("flannel"), dest.0.join("flannel-too")).unwrap();
        let flannel = fingerprint(&dest.0.join("flannel"));

        install_dir(&src.0, &dest.0).unwrap();

        assert_eq!(inode(&dest.0.join("bridge")), inode(&dest.0.join(MULTI_CALL)));
        assert_ne!(inode(&dest.0.join("bridge")), old_bridge);
        assert_eq!(fs::read(dest.0.join("bridge")).unwrap(), b"multi-call v1");
        // The old file was replaced by rename, never written: its reader still sees all of it.
        assert_eq!(io::read_to_string(running).unwrap(), "the Go reference bridge");
        assert_eq!(fingerprint(&dest.0.join("flannel")), flannel);
        assert_eq!(
            listing(&dest.0),
            ["bridge", "cni-rs", "extra", "flannel", "flannel-too", "host-local", "loopback", "portmap"]
        );
    }

    #[test]
    fn multi_call_upgrade_relinks_every_name() {
        let dest = TempDir::new("dest");
        install_dir(&multi_call_src(b"multi-call v1").0, &dest.0).unwrap();
        let old = inode(&dest.0.join(MULTI_CALL));

        let report = install_dir(&multi_call_src(b"multi-call v2").0, &dest.0).unwrap();

        assert_eq!(report.outcomes[1].1, Placement::Installed { sha256: sha256_hex(b"multi-call v2") });
        let new = inode(&dest.0.join(MULTI_CALL));
        assert_ne!(new, old);
        for name in NAMES {
            assert_eq!(inode(&dest.0.join(name)), new, "{name}");
        }
        assert_eq!(fs::metadata(dest.0.join(MULTI_CALL)).unwrap().nlink(), 5);
    }

    #[test]
    fn multi_call_falls_back_to_copies_where_links_fail() {
        let src = multi_call_src(b"multi-call v1");
        let dest = TempDir::new("dest");
        fs::write(dest.0.join("loopback"), b"an older loopback").unwrap();

        let report = install_dir_with(&src.0, &dest.0, link_unsupported).unwrap();

        let err = report.link_error.unwrap();
        assert!(err.contains("hard link cni-rs in") && err.contains("(os error 18)"), "{err}");
        let copy = Placement::Copied { sha256: sha256_hex(b"multi-call v1") };
        assert!(report.outcomes[2..].iter().all(|(_, outcome)| *outcome == copy), "{:?}", report.outcomes);
        let mut inodes = HashSet::new();
        for name in NAMES.iter().chain(&[MULTI_CALL]) {
            let path = dest.0.join(name);
            assert_eq!(fs::read(&path).unwrap(), b"multi-call v1", "{name}");
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o7777, 0o755, "{name}");
            assert!(inodes.insert(inode(&path)), "{name} shares an inode");
        }
        assert_eq!(listing(&dest.0), ["bridge", "cni-rs", "extra", "host-local", "loopback", "portmap"]);
        assert_eq!(installed_size(&dest.0, &["cni-rs", "bridge", "host-local", "loopback", "portmap"]), (65, 5));

        // Identical copies are left alone on the next run.
        let report = install_dir_with(&src.0, &dest.0, link_unsupported).unwrap();
        assert!(report.outcomes.iter().all(|(_, outcome)| *outcome == Placement::Unchanged), "{report:?}");
        assert!(report.link_error.is_some());

        // Once links work there, the copies become links.
        let report = install_dir(&src.0, &dest.0).unwrap();
        assert!(report.outcomes[2..].iter().all(|(_, outcome)| *outcome == Placement::Linked));
        assert_eq!(fs::metadata(dest.0.join(MULTI_CALL)).unwrap().nlink(), 5);
    }

    #[test]
    fn multi_call_other_link_errors_fail_and_leave_the_target() {
        let src = multi_call_src(b"multi-call v1");
        let dest = TempDir::new("dest");
        fs::write(dest.0.join("bridge"), b"old bridge").unwrap();
        let err = install_dir_with(&src.0, &dest.0, link_denied).unwrap_err();
        assert!(err.msg.contains("hard link") && err.msg.contains("(os error 13)"), "{err}");
        assert_eq!(fs::read(dest.0.join("bridge")).unwrap(), b"old bridge");
        assert_eq!(listing(&dest.0), ["bridge", "cni-rs", "extra"]);
    }

    #[test]
    fn manifest_errors() {
        for (manifest, files, why) in [
            ("bridge\n", &["bridge"][..], "has no cni-rs"),
            ("bridge\n", &["cni-rs", "bridge"][..], "also a file"),
            ("../bridge\n", &["cni-rs"][..], "not a plain file name"),
            (".hidden\n", &["cni-rs"][..], "not a plain file name"),
            ("two words\n", &["cni-rs"][..], "not a plain file name"),
            ("cni-rs\n", &["cni-rs"][..], "link to itself"),
            ("bridge\nbridge\n", &["cni-rs"][..], "listed twice"),
            ("# nothing\n\n", &["cni-rs"][..], "lists no plugin names"),
        ] {
            let src = TempDir::new("src");
            fs::write(src.0.join(MANIFEST), manifest).unwrap();
            for file in files {
                fs::write(src.0.join(file), b"x").unwrap();
            }
            let err = Source::read(&src.0).unwrap_err();
            assert!(err.msg.contains(why), "{manifest:?} {files:?}: {err}");
        }

        let src = multi_call_src(b"x");
        let source = Source::read(&src.0).unwrap();
        assert_eq!(source.plain, ["extra"]);
        assert_eq!(source.names(), ["extra", "cni-rs", "bridge", "host-local", "loopback", "portmap"]);
    }
}
