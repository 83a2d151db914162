//! The store of one network's reservations: `<dataDir>/<network>` in the reference's format
//! ([`reference`]: a file per address, the round-robin cursors, an flock on `lock` around every change),
//! read through the scan cache ([`cache`]), which spares a listing from reading every file.
//!
//! A reservation is written to a temporary file first and then hard-linked to its final name: link(2)
//! fails with EEXIST atomically, so an address is never handed out twice and a crash never leaves a
//! half-written reservation. Temporary names start with '.', so neither we nor the reference (which
//! parses every name in the directory as an IP) ever mistake one for a reservation.
//!
//! Nothing in the network directory is followed if it is a symbolic link: whoever can plant one there (a pod
//! with the directory mounted, a careless script) must not make a root plugin write, create, lock or read a
//! file elsewhere. `<dataDir>/<network>` is opened once with `O_NOFOLLOW` (a link there is an error naming it;
//! `dataDir` itself is taken as configured, links and all: the operator wrote it) and every file is reached
//! through that descriptor (openat, linkat, unlinkat), so swapping the directory afterwards changes
//! nothing. Files are opened with `O_NOFOLLOW` (a link where `lock`, the scan cache or
//! `last_reserved_ip.<n>` should be is an I/O error naming it), created with `O_EXCL` (temporary files), or
//! published with link(2), which acts on the name itself. A link with a reservation's name is not a
//! reservation: the listing skips it and link(2) refuses to publish over it.
//!
//! A read-only store (a file system remounted read-only after an I/O error) is still read: the lock is taken
//! through a read-only descriptor, or not at all when the lock file does not exist (nothing can change the
//! directory then), so DEL and GC succeed when there is nothing to release and name what they could not.

mod boot;
mod cache;
mod reference;

pub use boot::{Boot, TEST_BOOT_ENV};
pub use cache::Reservations;
pub use reference::{Owner, LINE_BREAK};

use cache::{DirStamp, Listing, INDEX_FILE};
use libcni::{code, Error, Result};
use nix::dir::{Dir, Type as FileType};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use reference::LOCK_FILE;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How every file of the store is opened: never through a symbolic link, never blocking on a FIFO planted there.
const FILE_FLAGS: OFlag = OFlag::O_NOFOLLOW.union(OFlag::O_NONBLOCK).union(OFlag::O_CLOEXEC);

fn io_error(e: Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e as i32)
}

/// Whether an error means the store cannot be written at all (and can still be read).
fn is_read_only(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(Errno::EROFS as i32)
}

/// Temporary files (ours): the name never parses as an address, and starts with '.'.
const TEMP_PREFIX: &str = ".host-local-tmp.";

/// The directory of one network's reservations, held open: every file is reached through this descriptor
/// (openat, linkat, unlinkat), so what `<dataDir>/<network>` names later (renamed, replaced by a
/// link) never matters once the store is open.
#[derive(Debug, Clone)]
pub struct Store {
    /// For messages.
    dir: PathBuf,
    handle: Arc<File>,
}

impl Store {
    fn path_for(data_dir: &Path, network: &str) -> Result<PathBuf> {
        if !data_dir.is_absolute() {
            return Err(Error::config(format!("ipam.dataDir {} must be an absolute path", data_dir.display())));
        }
        reference::check_network_name(network)?;
        Ok(data_dir.join(network))
    }

    /// Open the store, creating `<dataDir>/<network>` if needed (ADD, STATUS).
    pub fn create(data_dir: &Path, network: &str) -> Result<Store> {
        let dir = Self::path_for(data_dir, network)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| Error::io(format!("create data directory {}", dir.display()), &e))?;
        Self::open(dir)?.ok_or_else(|| {
            Error::new(code::IO, "data directory vanished right after it was created; try again".to_string())
        })
    }

    /// Open the store only if it exists (DEL, GC, CHECK): a missing directory holds no reservation.
    pub fn existing(data_dir: &Path, network: &str) -> Result<Option<Store>> {
        Self::open(Self::path_for(data_dir, network)?)
    }

    /// `<dataDir>/<network>` is ours to create: a symbolic link there was planted by someone else and is not
    /// followed (`dataDir` itself, the operator's choice, is).
    fn open(dir: PathBuf) -> Result<Option<Store>> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        match nix::fcntl::open(&dir, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(Store { dir, handle: Arc::new(File::from(fd)) })),
            Err(Errno::ENOENT) => Ok(None),
            // With O_DIRECTORY, Linux answers ENOTDIR for a link; ELOOP without it.
            Err(Errno::ELOOP | Errno::ENOTDIR)
                if fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) =>
            {
                Err(Error::new(
                    code::IO,
                    format!(
                        "data directory {} is a symbolic link: host-local never follows links in its data \
                         directory; remove it (set ipam.dataDir to the real location instead)",
                        dir.display()
                    ),
                ))
            }
            Err(Errno::ENOTDIR) => {
                Err(Error::new(code::IO, format!("data directory {} is not a directory", dir.display())))
            }
            Err(e) => Err(Error::io(format!("data directory {}", dir.display()), &io_error(e))),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of a file of the store, for messages.
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Open a file of the store (see [`FILE_FLAGS`]).
    fn open_file(&self, name: &str, flags: OFlag) -> std::io::Result<File> {
        let fd = nix::fcntl::openat(self.handle.as_fd(), name, flags | FILE_FLAGS, Mode::from_bits_truncate(0o644))
            .map_err(io_error)?;
        Ok(File::from(fd))
    }

    /// Whether the regular file `name` last changed (its inode: created, written, renamed) before `when`.
    fn changed_before(&self, name: &str, when: std::time::SystemTime) -> bool {
        let Ok(stat) = nix::sys::stat::fstatat(self.handle.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
            return false;
        };
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return false;
        }
        let (Ok(secs), Ok(nanos)) = (u64::try_from(stat.st_ctime), u32::try_from(stat.st_ctime_nsec)) else {
            // Before 1970: long before any boot of this kernel.
            return true;
        };
        std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos) < when
    }

    /// The type of a directory entry, without following a link.
    fn kind_of(&self, name: &str) -> Option<SFlag> {
        let stat = nix::sys::stat::fstatat(self.handle.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        Some(SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT)
    }

    /// Remove a file of the store (the name itself: a link is removed, never its target).
    fn unlink(&self, name: &str) -> std::io::Result<()> {
        nix::unistd::unlinkat(self.handle.as_fd(), name, UnlinkatFlags::NoRemoveDir).map_err(io_error)
    }

    /// The error for a store file that could not be opened: a symbolic link is named as such.
    fn open_error(&self, what: &str, name: &str, e: &std::io::Error) -> Error {
        let path = self.path(name);
        if e.raw_os_error() == Some(Errno::ELOOP as i32) && self.kind_of(name) == Some(SFlag::S_IFLNK) {
            return Error::new(
                code::IO,
                format!(
                    "{what} {} is a symbolic link: host-local never follows links in its data directory; \
                     remove it (nobody but host-local should create files there)",
                    path.display()
                ),
            );
        }
        Error::io(format!("{what} {}", path.display()), e)
    }

    /// A store file that must be a regular file, opened read-only; `None` if it does not exist.
    fn open_existing(&self, what: &str, name: &str) -> Result<Option<File>> {
        match self.open_file(name, OFlag::O_RDONLY) {
            Ok(file) => {
                let meta = file.metadata().map_err(|e| self.open_error(what, name, &e))?;
                if !meta.is_file() {
                    let path = self.path(name);
                    return Err(Error::new(
                        code::IO,
                        format!("{what} {} is not a regular file; remove it", path.display()),
                    ));
                }
                Ok(Some(file))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.open_error(what, name, &e)),
        }
    }

    /// The inode number and owner of a reservation file.
    fn read_reservation(&self, name: &str) -> std::io::Result<(u64, Owner)> {
        let mut file = self.open_file(name, OFlag::O_RDONLY)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(ErrorKind::InvalidInput.into());
        }
        let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).saturating_add(1));
        file.read_to_end(&mut bytes)?;
        Ok((meta.ino(), Owner::parse(&String::from_utf8_lossy(&bytes))))
    }

    /// Take the network's lock (shared with the reference plugin), blocking until it is free, and read every
    /// reservation. Temporary files left by a crash are removed on the way: ours exist only under the lock.
    ///
    /// On a read-only file system the lock file is opened read-only (flock needs no write access), or, when
    /// it does not exist, not locked at all: nobody can change the directory then. Changes fail later, each
    /// naming its file.
    pub fn lock(&self) -> Result<Locked<'_>> {
        let (file, read_only) = match self.open_file(LOCK_FILE, OFlag::O_RDWR | OFlag::O_CREAT) {
            Ok(file) => (Some(file), false),
            Err(e) if is_read_only(&e) => (self.open_existing("lock", LOCK_FILE)?, true),
            Err(e) => return Err(self.open_error("open lock", LOCK_FILE, &e)),
        };
        let flock = file
            .map(|file| {
                Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| {
                    Error::io(format!("lock {}", self.path(LOCK_FILE).display()), &io_error(errno))
                })
            })
            .transpose()?;
        let Listed { reservations, index_stale, temp_files, boot_markers } = self.list()?;
        let mut removed_any = false;
        for tmp in &temp_files {
            // A temporary name is never parsed as an address, so one that cannot be removed is harmless.
            removed_any |= self.unlink(tmp).is_ok();
        }
        Ok(Locked {
            store: self,
            reservations,
            boot_markers,
            index_stale: (index_stale || removed_any) && !read_only,
            _flock: flock,
        })
    }

    /// Every reservation, without the lock (CHECK, STATUS): owners may come from the scan cache, which is
    /// never written here. Unreadable or vanished files are skipped, as the reference does.
    pub fn scan(&self) -> Result<Reservations> {
        Ok(self.list()?.reservations)
    }

    /// One directory listing, merged with the scan cache (only files it does not know are read).
    fn list(&self) -> Result<Listed> {
        let stamp = self.handle.metadata().ok().map(|m| DirStamp::of(&m));
        let index_text = match stamp {
            Some(_) => self.read_index()?,
            None => String::new(),
        };
        let mut listing = Listing::new(index_text, stamp);
        // nix's iterator copies each name once; std's DirEntry::file_name copies it a second time.
        let mut dir = Dir::openat(
            self.handle.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(format!("read {}", self.dir.display()), &io_error(e)))?;
        let (mut temp_files, mut boot_markers) = (Vec::new(), Vec::new());
        for entry in dir.iter().flatten() {
            let Ok(name) = entry.file_name().to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                temp_files.push(name.to_string());
                continue;
            }
            if name.starts_with(boot::MARKER_PREFIX) {
                boot_markers.push(name.to_string());
                continue;
            }
            let Some(ip) = reference::reserved_address(name) else { continue };
            let is_file = match entry.file_type() {
                Some(kind) => kind == FileType::File,
                // Some file systems do not say in the listing.
                None => self.kind_of(name) == Some(SFlag::S_IFREG),
            };
            if !is_file || listing.known(ip, name, entry.ino()) {
                continue;
            }
            if let Ok((ino, owner)) = self.read_reservation(name) {
                listing.read(ip, name, ino, owner);
            }
        }
        let (reservations, index_stale) = listing.finish();
        Ok(Listed { reservations, index_stale, temp_files, boot_markers })
    }

    /// The scan cache's text; empty if it is missing or unreadable (a cache: the scan then reads every file).
    /// A symbolic link or anything but a regular file in its place is an error naming it.
    fn read_index(&self) -> Result<String> {
        let Some(mut file) = self.open_existing("scan cache", INDEX_FILE)? else { return Ok(String::new()) };
        let mut text = String::new();
        Ok(file.read_to_string(&mut text).map_or_else(|_| String::new(), |_| text))
    }

    /// Record the reservations in the scan cache. Overwritten in place (reusing the file's pages) and not
    /// synced: a torn, mixed or lost index only makes the next scan read every file. Must be the last change
    /// to the directory under the lock.
    fn write_index(&self, reservations: &Reservations) {
        let written = self.open_file(INDEX_FILE, OFlag::O_WRONLY | OFlag::O_CREAT).and_then(|mut file| {
            // Never write into anything but a regular file (a FIFO or a device planted under this name).
            if !file.metadata()?.is_file() {
                return Err(ErrorKind::InvalidInput.into());
            }
            // Stamped after the open, which creates the file the first time and so changes the directory.
            let stamp = DirStamp::of(&self.handle.metadata()?);
            let rendered = reservations.render_index(&stamp);
            file.write_all(rendered.as_bytes())?;
            file.set_len(rendered.len() as u64)
        });
        if written.is_err() {
            // It would be refused anyway; removing it spares the next scan the attempt.
            let _ = self.unlink(INDEX_FILE);
        }
    }

    /// The address last handed out from a set, if recorded and parsable. A symbolic link in its place is an
    /// error naming it.
    pub fn last_reserved(&self, set_index: usize) -> Result<Option<IpAddr>> {
        let name = reference::cursor_file(set_index);
        let Some(file) = self.open_existing("round-robin cursor", &name)? else { return Ok(None) };
        // An address is at most 45 bytes; a larger file is not ours and is read no further.
        let mut content = String::new();
        if file.take(64).read_to_string(&mut content).is_err() {
            return Ok(None);
        }
        Ok(reference::parse_cursor(&content))
    }

    /// Fails unless the store can be written (STATUS): opens the lock file for writing, creating it if needed.
    /// Creating and removing a probe file instead would change the directory and so invalidate the scan cache.
    pub fn probe_writable(&self) -> Result<()> {
        self.open_file(LOCK_FILE, OFlag::O_WRONLY | OFlag::O_CREAT)
            .map(drop)
            .map_err(|e| self.open_error("open for writing: lock", LOCK_FILE, &e))
    }

    /// A fresh file whose name can never parse as an address, created exclusively (O_EXCL: never through a
    /// link planted under that name, nor onto any existing file). Returns its name.
    fn temp_file(&self) -> Result<(String, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{TEMP_PREFIX}{}.{nanos}.{n}", std::process::id());
            match self.open_file(&name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL) {
                Ok(f) => return Ok((name, f)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(format!("create temporary file in {}", self.dir.display()), &e)),
            }
        }
    }

    /// Write `content` to a temporary file and hand its name to `publish`; the temporary name is always
    /// removed.
    ///
    /// Nothing is synced to disk, as the reference does not: publishing by link(2) keeps
    /// a reservation whole or absent for every reader, and a crash that could lose one (power loss,
    /// kernel panic) also ended the container it was for. A file a crash left empty reads as an
    /// old-format reservation of no container, which GC releases. An fdatasync here cost 1-5 ms
    /// per ADD on this machine's disk.
    fn write_via_temp<T>(&self, content: &str, publish: impl FnOnce(&str, &File) -> Result<T>) -> Result<T> {
        let (tmp, mut file) = self.temp_file()?;
        let written = file
            .write_all(content.as_bytes())
            .map_err(|e| Error::io(format!("write {}", self.path(&tmp).display()), &e));
        let result = written.and_then(|()| publish(&tmp, &file));
        drop(file);
        // The temporary name is harmless if it lingers (never parsed as an address), so a failure here is ignored.
        let _ = self.unlink(&tmp);
        result
    }
}

/// What one listing of the network directory found.
struct Listed {
    reservations: Reservations,
    /// The scan cache does not describe the directory.
    index_stale: bool,
    /// Ours, which outlive the lock only when a plugin crashed.
    temp_files: Vec<String>,
    /// The names of the files recording the boot of the last allocation ([`boot`]); one, normally.
    boot_markers: Vec<String>,
}

/// The store with its lock held and its reservations read; only here can reservations change.
pub struct Locked<'a> {
    store: &'a Store,
    /// The directory as this process has left it so far.
    reservations: Reservations,
    /// As listed when the lock was taken.
    boot_markers: Vec<String>,
    /// The scan cache does not describe the directory: rewrite it before the lock is released.
    index_stale: bool,
    /// Declared last: released after `drop` has rewritten the scan cache. `None` on a read-only store whose
    /// lock file does not exist.
    _flock: Option<Flock<File>>,
}

impl Drop for Locked<'_> {
    /// Every change made under the lock (reserve, release, ADD's rollback, GC, a repaired stale cache) is
    /// recorded here, on success and error paths alike.
    fn drop(&mut self) {
        if self.index_stale {
            self.store.write_index(&self.reservations);
        }
    }
}

impl Locked<'_> {
    pub fn store(&self) -> &Store {
        self.store
    }

    /// The reservations as recorded; see [`Locked::held_by`] and [`Locked::confirmed_owner`] before acting
    /// on an owner.
    pub fn reservations(&self) -> &Reservations {
        &self.reservations
    }

    /// The addresses an attachment holds, each confirmed by reading its file.
    pub fn held_by(&mut self, cid: &str, ifname: &str) -> Vec<IpAddr> {
        let (held, changed) = self.reservations.confirmed_held_by(self.store, cid, ifname);
        self.index_stale |= changed;
        held
    }

    /// The owner of `ip`, confirmed by reading its file.
    pub fn confirmed_owner(&mut self, ip: IpAddr) -> Option<Owner> {
        self.index_stale |= self.reservations.confirm(self.store, ip);
        self.reservations.owner(ip)
    }

    pub fn last_reserved(&self, set_index: usize) -> Result<Option<IpAddr>> {
        self.store.last_reserved(set_index)
    }

    /// Reserve `ip` for the attachment. `Ok(false)` if the address is already reserved by anyone.
    pub fn reserve(&mut self, ip: IpAddr, cid: &str, ifname: &str) -> Result<bool> {
        let name = reference::reservation_file(ip);
        let content = reference::reservation_content(cid, ifname);
        let store = self.store;
        let linked = store.write_via_temp(&content, |tmp, file| {
            // Fails with EEXIST on any existing name, a link included, and never follows one.
            let fd = store.handle.as_fd();
            match nix::unistd::linkat(fd, tmp, fd, name.as_str(), AtFlags::empty()) {
                Ok(()) => Ok(Some(file.metadata().map_or(0, |m| m.ino()))),
                Err(Errno::EEXIST) => Ok(None),
                Err(e) => Err(Error::io(format!("reserve {}", store.path(&name).display()), &io_error(e))),
            }
        })?;
        let Some(ino) = linked else { return Ok(false) };
        let owner = Owner::parse(&content);
        self.reservations.insert_written(ip, ino, name, owner);
        self.index_stale = true;
        Ok(true)
    }

    /// Record the round-robin cursor of a set, overwritten in place (its length then set): the
    /// reference writes it in place too, and reads it, as we do, only under the lock. A write a crash
    /// cut short leaves at worst another address or an unparsable one, and the round robin merely
    /// starts from there or from the range's beginning: a cursor never hands out an address, the
    /// reservation files decide. A temporary file renamed over it cost three directory changes per
    /// ADD, ~20 us on this machine's ext4 (renaming over an existing file also makes ext4's
    /// auto_da_alloc start writing the new one out; truncating to zero would too, so the length is
    /// set after the write). A link or anything but a regular file in its place is an error naming it.
    pub fn set_last_reserved(&self, set_index: usize, ip: IpAddr) -> Result<()> {
        let target = reference::cursor_file(set_index);
        let store = self.store;
        let content = ip.to_string();
        let what = || store.path(&target).display().to_string();
        let mut file = store
            .open_file(&target, OFlag::O_WRONLY | OFlag::O_CREAT)
            .map_err(|e| store.open_error("write round-robin cursor", &target, &e))?;
        let meta = file.metadata().map_err(|e| Error::io(format!("write {}", what()), &e))?;
        if !meta.is_file() {
            return Err(Error::new(
                code::IO,
                format!("round-robin cursor {} is not a regular file; remove it", what()),
            ));
        }
        file.write_all(content.as_bytes())
            .and_then(|()| if meta.len() > content.len() as u64 { file.set_len(content.len() as u64) } else { Ok(()) })
            .map_err(|e| Error::io(format!("write {}", what()), &e))
    }

    /// On the first allocation in a boot (the store records another boot, or none): release every
    /// reservation whose file last changed before `boot` started, then record `boot`. Returns what was
    /// released. Costs nothing on disk when the store already records `boot`.
    pub fn release_earlier_boots(&mut self, boot: &Boot) -> Result<Vec<IpAddr>> {
        let marker = boot.marker();
        if self.boot_markers.contains(&marker) {
            return Ok(Vec::new());
        }
        let store = self.store;
        let earlier: Vec<IpAddr> = self
            .reservations
            .files
            .keys()
            .copied()
            .filter(|ip| {
                let name =
                    self.reservations.file_name(*ip).map_or_else(|| reference::reservation_file(*ip), str::to_string);
                store.changed_before(&name, boot.started)
            })
            .collect();
        for ip in &earlier {
            self.release(*ip)?;
        }
        // Recorded only once every earlier reservation is gone: a crash in between repeats the release.
        store
            .open_file(&marker, OFlag::O_WRONLY | OFlag::O_CREAT)
            .map_err(|e| store.open_error("record the boot in", &marker, &e))?;
        for old in self.boot_markers.drain(..) {
            let _ = store.unlink(&old);
        }
        self.boot_markers.push(marker);
        self.index_stale = true;
        Ok(earlier)
    }

    /// Remove a reservation; one that is already gone is success.
    pub fn release(&mut self, ip: IpAddr) -> Result<()> {
        let recorded = self.reservations.file_name(ip);
        let name = recorded.map_or_else(|| reference::reservation_file(ip), str::to_string);
        let removed = match self.store.unlink(&name) {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(Error::io(format!("release {}", self.store.path(&name).display()), &e)),
        };
        let known = self.reservations.forget(ip);
        self.index_stale |= removed || known;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests {
    use super::reference::reserved_address;
    use super::*;
    pub(crate) use cni_tests::TempDir;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn reserve_writes_reference_format_and_refuses_duplicates() {
        let t = TempDir::new("reserve");
        let store = Store::create(&t.0, "net1").unwrap();
        let mut l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "cid1", "eth0").unwrap());
        assert!(!l.reserve(ip("10.0.0.2"), "cid2", "eth0").unwrap());
        assert!(l.reserve(ip("fd00::2"), "cid1", "eth0").unwrap());
        l.set_last_reserved(0, ip("10.0.0.2")).unwrap();
        l.set_last_reserved(1, ip("fd00::2")).unwrap();
        assert_eq!(l.last_reserved(1).unwrap(), Some(ip("fd00::2")));
        drop(l);
        let dir = t.0.join("net1");
        assert_eq!(fs::read(dir.join("10.0.0.2")).unwrap(), b"cid1\r\neth0");
        assert_eq!(fs::read(dir.join("fd00::2")).unwrap(), b"cid1\r\neth0");
        assert_eq!(fs::read(dir.join("last_reserved_ip.0")).unwrap(), b"10.0.0.2");
        assert_eq!(
            names_in(&dir),
            [".cni-rs-index", "10.0.0.2", "fd00::2", "last_reserved_ip.0", "last_reserved_ip.1", "lock"]
        );
    }

    #[test]
    fn held_by_and_old_format() {
        let t = TempDir::new("held");
        let store = Store::create(&t.0, "n").unwrap();
        let dir = store.dir().to_path_buf();
        fs::write(dir.join("10.0.0.2"), "a\r\neth0").unwrap();
        fs::write(dir.join("10.0.0.3"), "a\r\neth1").unwrap();
        fs::write(dir.join("10.0.0.4"), "old\n").unwrap();
        fs::write(dir.join("last_reserved_ip.0"), "10.0.0.4").unwrap();
        fs::write(dir.join("not-an-ip"), "a\r\neth0").unwrap();
        let mut res = store.scan().unwrap();
        assert_eq!(res.len(), 3);
        assert_eq!(res.held_by(&store, "a", "eth0"), vec![ip("10.0.0.2")]);
        assert_eq!(res.held_by(&store, "old", "eth0"), vec![ip("10.0.0.4")]);
        assert_eq!(res.held_by(&store, "nobody", "eth0"), Vec::<IpAddr>::new());
        assert_eq!(res.owner(ip("10.0.0.4")), Some(Owner::Legacy { container_id: "old".into() }));
    }

    #[test]
    fn the_cursor_is_rewritten_in_place_to_its_new_length() {
        let t = TempDir::new("cursor");
        let store = Store::create(&t.0, "n").unwrap();
        let l = store.lock().unwrap();
        let cursor = store.dir().join("last_reserved_ip.0");
        l.set_last_reserved(0, ip("10.0.0.100")).unwrap();
        let first = inode(&cursor);
        for addr in ["10.0.0.9", "fd00::1234", "10.0.0.10"] {
            l.set_last_reserved(0, ip(addr)).unwrap();
            assert_eq!(fs::read_to_string(&cursor).unwrap(), addr);
            assert_eq!(l.last_reserved(0).unwrap(), Some(ip(addr)));
        }
        assert_eq!(inode(&cursor), first, "the cursor was replaced, not rewritten");
    }

    #[test]
    fn release_is_idempotent() {
        let t = TempDir::new("release");
        let store = Store::create(&t.0, "n").unwrap();
        let mut l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "a", "eth0").unwrap());
        l.release(ip("10.0.0.2")).unwrap();
        l.release(ip("10.0.0.2")).unwrap();
        assert!(l.reservations().is_empty());
        drop(l);
        assert!(store.scan().unwrap().is_empty());
        assert!(store.lock().unwrap().reservations().is_empty());
    }

    #[test]
    fn leftover_temp_file_is_not_a_reservation_and_is_cleaned() {
        let t = TempDir::new("crash");
        let store = Store::create(&t.0, "n").unwrap();
        // What a crash between writing and linking leaves behind.
        let (tmp, mut f) = store.temp_file().unwrap();
        f.write_all(b"a\r\neth0").unwrap();
        drop(f);
        assert!(store.scan().unwrap().is_empty());
        let tmp = store.dir().join(tmp);
        assert!(tmp.exists(), "an unlocked scan must not remove a temporary file: its writer may be running");
        assert!(tmp.file_name().unwrap().to_str().unwrap().parse::<IpAddr>().is_err());
        let l = store.lock().unwrap();
        assert!(l.reservations().is_empty());
        assert!(!tmp.exists());
    }

    fn boot(n: u8, started: std::time::SystemTime) -> Boot {
        Boot { id: format!("00000000-0000-4000-8000-0000000000{n:02x}"), started }
    }

    #[test]
    fn the_first_allocation_in_a_boot_releases_what_earlier_boots_reserved() {
        let t = TempDir::new("boot");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let later = boot(1, std::time::SystemTime::now());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut l = store.lock().unwrap();
        // Made in this boot, before its first allocation (the reference's, say): kept.
        assert!(l.reserve(ip("10.0.0.9"), "new", "eth0").unwrap());
        let mut released = l.release_earlier_boots(&later).unwrap();
        released.sort();
        assert_eq!(released, [ip("10.0.0.2"), ip("10.0.0.3"), ip("fd00::2")]);
        assert_eq!(l.reservations().owners(), [(ip("10.0.0.9"), attachment("new", "eth0"))]);
        // Recorded: the next allocation of this boot releases nothing, whatever the files' age.
        assert!(l.reserve(ip("10.0.0.2"), "c", "eth0").unwrap());
        assert!(l
            .release_earlier_boots(&boot(1, std::time::SystemTime::now() + std::time::Duration::from_secs(9)))
            .unwrap()
            .is_empty());
        drop(l);
        let marker = later.marker();
        assert_eq!(names_in(&dir), [marker.as_str(), INDEX_FILE, "10.0.0.2", "10.0.0.9", "lock"]);
        // The scan cache agrees with the directory, and the marker is no reservation.
        let scan = store.scan().unwrap();
        assert!(scan.files.values().all(|r| r.is_from_index()));
        assert_eq!(scan.len(), 2);
        // Another boot: the marker is replaced, never doubled.
        let next = boot(2, std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1));
        let mut l = store.lock().unwrap();
        assert!(l.release_earlier_boots(&next).unwrap().is_empty(), "nothing predates a boot that started in 1970");
        drop(l);
        assert_eq!(names_in(&dir), [next.marker().as_str(), INDEX_FILE, "10.0.0.2", "10.0.0.9", "lock"]);
    }

    #[test]
    fn a_link_with_a_boot_marker_name_is_never_followed() {
        for dangling in [false, true] {
            let t = TempDir::new("boot-link");
            let (file, nowhere) = outside(&t);
            let target = if dangling { &nowhere } else { &file };
            let store = Store::create(&t.0, "n").unwrap();
            let now = std::time::SystemTime::now();
            // Another boot's marker that is a link: removed as a name, its target untouched.
            std::os::unix::fs::symlink(target, store.dir().join(boot(4, now).marker())).unwrap();
            store.lock().unwrap().release_earlier_boots(&boot(5, now)).unwrap();
            assert_eq!(names_in(store.dir()), [boot(5, now).marker().as_str(), INDEX_FILE, "lock"]);
            assert!(fs::symlink_metadata(store.dir().join(boot(5, now).marker())).unwrap().is_file());
            // This boot's marker name, planted as a link: the boot counts as recorded, nothing is opened.
            std::os::unix::fs::symlink(target, store.dir().join(boot(6, now).marker())).unwrap();
            store.lock().unwrap().release_earlier_boots(&boot(6, now)).unwrap();
            assert_untouched(&file, &nowhere);
        }
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        names
    }

    fn attachment(cid: &str, ifname: &str) -> Owner {
        Owner::Attachment { container_id: cid.into(), ifname: ifname.into() }
    }

    fn inode(path: &Path) -> u64 {
        fs::metadata(path).unwrap().ino()
    }

    /// A store holding a/eth0 at .2 (and fd00::2), b/eth0 at .3, with its index written.
    fn indexed_store(t: &TempDir) -> Store {
        let store = Store::create(&t.0, "n").unwrap();
        let mut l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "a", "eth0").unwrap());
        assert!(l.reserve(ip("fd00::2"), "a", "eth0").unwrap());
        assert!(l.reserve(ip("10.0.0.3"), "b", "eth0").unwrap());
        drop(l);
        assert!(store.dir().join(INDEX_FILE).is_file());
        store
    }

    /// Replace a file's content keeping its inode, as if the file had been removed and re-created by someone
    /// else and the file system had handed out the same inode number again.
    pub(crate) fn rewrite_in_place(path: &Path, content: &str) {
        let before = inode(path);
        fs::write(path, content).unwrap();
        assert_eq!(inode(path), before);
    }

    /// What a coarse clock can let happen: the directory changed, but the index's stamp still matches.
    fn restamp_index(store: &Store, as_recorded: &Reservations) {
        store.write_index(as_recorded);
    }

    #[test]
    fn index_is_reused_without_rereading_files() {
        let t = TempDir::new("reuse");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        let index = dir.join(INDEX_FILE);
        let written = fs::read_to_string(&index).unwrap();
        rewrite_in_place(&dir.join("10.0.0.3"), "intruder\r\neth0");

        // The scan took b's ownership from the index: the file (now saying "intruder") was not read.
        let res = store.scan().unwrap();
        assert_eq!(res.len(), 3);
        assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("b", "eth0")));
        assert!(res.files.values().all(|r| r.is_from_index()), "{res:?}");

        // Nothing changed under the lock: the index is not rewritten.
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        File::options().write(true).open(&index).unwrap().set_modified(old).unwrap();
        let mut l = store.lock().unwrap();
        assert_eq!(l.reservations().owner(ip("10.0.0.3")), Some(attachment("b", "eth0")));
        assert_eq!(l.held_by("a", "eth0"), [ip("10.0.0.2"), ip("fd00::2")]);
        drop(l);
        assert_eq!(fs::metadata(&index).unwrap().modified().unwrap(), old);
        assert_eq!(fs::read_to_string(&index).unwrap(), written);
    }

    #[test]
    fn a_claim_from_the_index_is_confirmed_before_acting_on_it() {
        let t = TempDir::new("confirm");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        rewrite_in_place(&dir.join("10.0.0.3"), "intruder\r\neth0");

        let mut l = store.lock().unwrap();
        assert_eq!(l.reservations().owner(ip("10.0.0.3")), Some(attachment("b", "eth0")));
        // What DEL of b/eth0 does: the file says otherwise, so it holds nothing and nothing is released.
        let held = l.held_by("b", "eth0");
        assert!(held.is_empty(), "{held:?}");
        for ip in held {
            l.release(ip).unwrap();
        }
        assert_eq!(l.reservations().owner(ip("10.0.0.3")), Some(attachment("intruder", "eth0")));
        // What GC does for an owner it would release.
        assert_eq!(l.confirmed_owner(ip("10.0.0.2")), Some(attachment("a", "eth0")));
        drop(l);
        assert_eq!(fs::read(dir.join("10.0.0.3")).unwrap(), b"intruder\r\neth0");
        // The corrected owner went into the index.
        let res = store.scan().unwrap();
        assert!(res.files.get(&ip("10.0.0.3")).unwrap().is_from_index());
        assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("intruder", "eth0")));
    }

    #[test]
    fn a_stale_exact_claim_does_not_hide_old_format_files() {
        let t = TempDir::new("legacy");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        fs::write(dir.join("10.0.0.9"), "b").unwrap();
        drop(store.lock().unwrap());
        rewrite_in_place(&dir.join("10.0.0.3"), "intruder\r\neth0");
        let mut l = store.lock().unwrap();
        assert_eq!(l.held_by("b", "eth0"), [ip("10.0.0.9")]);
    }

    #[test]
    fn files_of_a_foreign_writer_are_picked_up_and_removed_files_disappear() {
        let t = TempDir::new("foreign");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        // What the reference plugin does: create the file in place, remove files outright.
        fs::write(dir.join("10.0.0.9"), "foreign\r\neth0").unwrap();
        fs::remove_file(dir.join("10.0.0.3")).unwrap();
        let res = store.scan().unwrap();
        assert_eq!(res.owner(ip("10.0.0.9")), Some(attachment("foreign", "eth0")));
        assert!(!res.is_taken(ip("10.0.0.3")));
        assert_eq!(res.len(), 3);
        // The first locked scan repairs the index; the next one trusts it.
        drop(store.lock().unwrap());
        let res = store.scan().unwrap();
        assert!(res.files.values().all(|r| r.is_from_index()), "{res:?}");
        assert_eq!(res.owner(ip("10.0.0.9")), Some(attachment("foreign", "eth0")));
        assert!(!res.is_taken(ip("10.0.0.3")));
    }

    #[test]
    fn with_a_matching_stamp_new_and_replaced_files_are_still_read() {
        let t = TempDir::new("coarse");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        let as_recorded = store.scan().unwrap();
        fs::write(dir.join("10.0.0.9"), "foreign\r\neth0").unwrap();
        fs::remove_file(dir.join("fd00::2")).unwrap();
        // Replaced by a new inode (created before the old one is gone, so the number cannot be reused).
        let old_ino = inode(&dir.join("10.0.0.3"));
        fs::write(dir.join("new"), "c\r\neth0").unwrap();
        fs::rename(dir.join("new"), dir.join("10.0.0.3")).unwrap();
        assert_ne!(inode(&dir.join("10.0.0.3")), old_ino);
        restamp_index(&store, &as_recorded);

        let res = store.scan().unwrap();
        assert_eq!(res.len(), 3);
        assert!(res.files.get(&ip("10.0.0.2")).unwrap().is_from_index());
        assert_eq!(res.owner(ip("10.0.0.9")), Some(attachment("foreign", "eth0")));
        assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("c", "eth0")));
        assert!(!res.files.get(&ip("10.0.0.3")).unwrap().is_from_index());
        assert!(!res.is_taken(ip("fd00::2")));
        // The locked scan records all of it, and forgets the removed file.
        drop(store.lock().unwrap());
        let index = fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
        assert!(index.contains(" 10.0.0.9 ") && !index.contains("fd00::2"), "{index}");
        assert!(store.scan().unwrap().files.values().all(|r| r.is_from_index()));
    }

    #[test]
    fn with_a_matching_stamp_a_removed_file_is_forgotten() {
        let t = TempDir::new("coarse-rm");
        let store = indexed_store(&t);
        let as_recorded = store.scan().unwrap();
        fs::remove_file(store.dir().join("10.0.0.3")).unwrap();
        restamp_index(&store, &as_recorded);
        let l = store.lock().unwrap();
        assert!(!l.reservations().is_taken(ip("10.0.0.3")));
        drop(l);
        let index = fs::read_to_string(store.dir().join(INDEX_FILE)).unwrap();
        assert!(!index.contains("10.0.0.3"), "{index}");
    }

    #[test]
    fn a_torn_corrupt_or_foreign_index_means_reading_every_file() {
        let t = TempDir::new("torn");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        let index = dir.join(INDEX_FILE);
        let good = fs::read_to_string(&index).unwrap();
        // The index now records a wrong owner for .3: only reading the file shows "intruder".
        rewrite_in_place(&dir.join("10.0.0.3"), "intruder\r\neth0");
        assert_eq!(store.scan().unwrap().owner(ip("10.0.0.3")), Some(attachment("b", "eth0")));
        let half = &good[..good.len() / 2];
        let v2 = good.replacen("v1", "v2", 1);
        for bad in [half, "", "garbage", "cni-rs host-local scan cache v1\nend 0 0\n", &v2] {
            rewrite_in_place(&index, bad);
            let res = store.scan().unwrap();
            assert_eq!(res.len(), 3, "{bad:?}");
            assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("intruder", "eth0")), "{bad:?}");
            assert!(res.files.values().all(|r| !r.is_from_index()), "{bad:?}");
        }
        // A locked scan writes a good one again.
        drop(store.lock().unwrap());
        assert!(store.scan().unwrap().files.values().all(|r| r.is_from_index()));
        fs::remove_file(&index).unwrap();
        assert_eq!(store.scan().unwrap().owner(ip("10.0.0.3")), Some(attachment("intruder", "eth0")));
    }

    #[test]
    fn the_index_is_never_a_reservation() {
        let t = TempDir::new("hidden");
        let store = indexed_store(&t);
        let dir = store.dir().to_path_buf();
        let res = store.scan().unwrap();
        assert_eq!(
            res.owners().into_iter().map(|(ip, _)| ip).collect::<Vec<_>>(),
            [ip("10.0.0.2"), ip("10.0.0.3"), ip("fd00::2")]
        );
        // The reference's DEL removes every file whose trimmed content is "<cid>\r\n<ifname>" or "<cid>".
        let content = fs::read_to_string(dir.join(INDEX_FILE)).unwrap();
        for key in ["a\r\neth0", "b\r\neth0", "a", "b"] {
            assert_ne!(content.trim(), key);
        }
        assert!(!content.contains('\r'));
        // Nor does releasing every address touch it.
        let mut l = store.lock().unwrap();
        for ip in [ip("10.0.0.2"), ip("10.0.0.3"), ip("fd00::2")] {
            l.release(ip).unwrap();
        }
        drop(l);
        assert_eq!(names_in(&dir), [".cni-rs-index", "lock"]);
        assert!(store.scan().unwrap().is_empty());
    }

    #[test]
    fn status_probe_leaves_the_directory_and_its_index_alone() {
        let t = TempDir::new("probe");
        let store = indexed_store(&t);
        let before = fs::metadata(store.dir()).unwrap();
        store.probe_writable().unwrap();
        assert_eq!(DirStamp::of(&fs::metadata(store.dir()).unwrap()), DirStamp::of(&before));
        assert!(store.scan().unwrap().files.values().all(|r| r.is_from_index()));
    }

    /// A file outside the store and a path outside that does not exist, for links to point at.
    fn outside(t: &TempDir) -> (PathBuf, PathBuf) {
        let file = t.0.join("outside");
        fs::write(&file, "precious").unwrap();
        (file, t.0.join("created-through-a-link"))
    }

    fn assert_untouched(file: &Path, dangling: &Path) {
        assert_eq!(fs::read_to_string(file).unwrap(), "precious");
        assert!(fs::symlink_metadata(dangling).is_err(), "{} was created through a link", dangling.display());
    }

    #[test]
    fn a_link_at_the_lock_the_index_or_the_cursor_is_an_error_naming_it() {
        for name in [LOCK_FILE, INDEX_FILE, "last_reserved_ip.0"] {
            for dangling in [false, true] {
                let t = TempDir::new("link");
                let (file, nowhere) = outside(&t);
                let store = indexed_store(&t);
                let path = store.dir().join(name);
                let _ = fs::remove_file(&path);
                std::os::unix::fs::symlink(if dangling { &nowhere } else { &file }, &path).unwrap();
                let what = format!("{name} dangling={dangling}");
                let refused = |e: Error| {
                    assert_eq!(e.code, code::IO, "{what}: {e}");
                    assert!(e.msg.contains(&path.display().to_string()) && e.msg.contains("symbolic link"), "{e}");
                };
                match name {
                    LOCK_FILE => {
                        refused(store.lock().err().unwrap());
                        refused(store.probe_writable().unwrap_err());
                    }
                    INDEX_FILE => {
                        refused(store.lock().err().unwrap());
                        refused(store.scan().unwrap_err());
                    }
                    _ => {
                        refused(store.last_reserved(0).unwrap_err());
                        // Written in place, the cursor is never written through the link.
                        let l = store.lock().unwrap();
                        refused(l.set_last_reserved(0, ip("10.0.0.3")).unwrap_err());
                        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_symlink(), "{what}");
                    }
                }
                assert_untouched(&file, &nowhere);
            }
        }
    }

    #[test]
    fn a_link_with_a_reservation_or_temporary_name_is_never_followed() {
        for dangling in [false, true] {
            let t = TempDir::new("link-res");
            let (file, nowhere) = outside(&t);
            let store = indexed_store(&t);
            let target = if dangling { &nowhere } else { &file };
            // The next free address, and a name a crashed writer would have left.
            std::os::unix::fs::symlink(target, store.dir().join("10.0.0.4")).unwrap();
            let tmp = store.dir().join(format!("{TEMP_PREFIX}1.2.3"));
            std::os::unix::fs::symlink(target, &tmp).unwrap();
            let mut l = store.lock().unwrap();
            assert!(fs::symlink_metadata(&tmp).is_err(), "a leftover temporary name is unlinked");
            assert!(!l.reservations().is_taken(ip("10.0.0.4")), "a link is not a reservation");
            assert!(!l.reserve(ip("10.0.0.4"), "c", "eth0").unwrap(), "link(2) never publishes over a link");
            assert!(l.reserve(ip("10.0.0.5"), "c", "eth0").unwrap());
            assert!(l.held_by("c", "eth0") == [ip("10.0.0.5")]);
            l.release(ip("10.0.0.4")).unwrap();
            drop(l);
            assert!(fs::symlink_metadata(store.dir().join("10.0.0.4")).is_err());
            assert_untouched(&file, &nowhere);
        }
    }

    #[test]
    fn a_link_at_the_network_directory_is_refused() {
        let t = TempDir::new("link-dir");
        let real = t.0.join("elsewhere");
        fs::create_dir(&real).unwrap();
        let data = t.0.join("data");
        fs::create_dir(&data).unwrap();
        std::os::unix::fs::symlink(&real, data.join("n")).unwrap();
        for e in [Store::create(&data, "n").unwrap_err(), Store::existing(&data, "n").unwrap_err()] {
            assert_eq!(e.code, code::IO);
            assert!(e.msg.contains("symbolic link") && e.msg.contains(&data.join("n").display().to_string()), "{e}");
        }
        assert_eq!(fs::read_dir(&real).unwrap().count(), 0);
        // A dataDir that is itself a link is the operator's choice and is followed.
        let linked_data = t.0.join("linked-data");
        std::os::unix::fs::symlink(&real, &linked_data).unwrap();
        let store = Store::create(&linked_data, "n").unwrap();
        assert!(store.lock().unwrap().reserve(ip("10.0.0.2"), "a", "eth0").unwrap());
        assert!(real.join("n/10.0.0.2").is_file());
    }

    /// Swapping the network directory for a link once the store is open (someone who can write `dataDir`
    /// racing a plugin) changes nothing: every file is reached through the open directory.
    #[test]
    fn a_network_directory_swapped_for_a_link_after_opening_is_not_followed() {
        let t = TempDir::new("swap");
        let outside = t.0.join("outside");
        fs::create_dir(&outside).unwrap();
        let store = Store::create(&t.0, "n").unwrap();
        fs::rename(t.0.join("n"), t.0.join("moved")).unwrap();
        std::os::unix::fs::symlink(&outside, t.0.join("n")).unwrap();
        let mut l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "a", "eth0").unwrap());
        l.set_last_reserved(0, ip("10.0.0.2")).unwrap();
        assert_eq!(l.held_by("a", "eth0"), [ip("10.0.0.2")]);
        drop(l);
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        assert_eq!(fs::read(t.0.join("moved/10.0.0.2")).unwrap(), b"a\r\neth0");
        assert_eq!(store.scan().unwrap().owner(ip("10.0.0.2")), Some(attachment("a", "eth0")));
        store.lock().unwrap().release(ip("10.0.0.2")).unwrap();
        assert!(!t.0.join("moved/10.0.0.2").exists());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn missing_store_and_bad_names() {
        let t = TempDir::new("missing");
        assert!(Store::existing(&t.0.join("nope"), "n").unwrap().is_none());
        assert_eq!(Store::create(Path::new("relative/dir"), "n").unwrap_err().code, code::INVALID_CONFIG);
        for bad in ["", ".", "..", "a/b"] {
            assert_eq!(Store::create(&t.0, bad).unwrap_err().code, code::INVALID_CONFIG, "{bad}");
        }
        let file = t.0.join("file");
        fs::write(&file, "").unwrap();
        assert_eq!(Store::create(&file, "n").unwrap_err().code, code::IO);
    }

    /// The names of the files an index records, in its order.
    fn indexed_names(store: &Store) -> Vec<String> {
        let text = fs::read_to_string(store.dir().join(INDEX_FILE)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        lines[1..lines.len() - 1].iter().map(|l| l.split(' ').nth(1).unwrap().to_string()).collect()
    }

    #[test]
    fn the_index_lists_files_in_address_order_and_is_reused() {
        let t = TempDir::new("order");
        let store = Store::create(&t.0, "n").unwrap();
        let addresses = ["fd00::2", "10.0.0.9", "::1", "10.0.0.2", "255.255.255.255", "0.0.0.0", "ffff::1", "10.0.0.5"];
        let mut l = store.lock().unwrap();
        for a in addresses {
            assert!(l.reserve(ip(a), "a", "eth0").unwrap());
        }
        drop(l);
        let mut want: Vec<IpAddr> = addresses.iter().map(|a| ip(a)).collect();
        want.sort();
        let as_names = |ips: &[IpAddr]| ips.iter().map(IpAddr::to_string).collect::<Vec<_>>();
        assert_eq!(indexed_names(&store), as_names(&want));
        assert!(store.scan().unwrap().files.values().all(|r| r.is_from_index()), "the index was not reused");

        let mut l = store.lock().unwrap();
        l.release(ip("10.0.0.5")).unwrap();
        assert!(l.reserve(ip("10.0.0.3"), "b", "eth0").unwrap());
        assert!(!l.reserve(ip("::1"), "b", "eth0").unwrap());
        drop(l);
        want.retain(|a| *a != ip("10.0.0.5"));
        want.push(ip("10.0.0.3"));
        want.sort();
        assert_eq!(indexed_names(&store), as_names(&want));
        let res = store.scan().unwrap();
        assert!(res.files.values().all(|r| r.is_from_index()), "the index was not reused");
        assert_eq!(res.owners().into_iter().map(|(a, _)| a).collect::<Vec<_>>(), want);
        assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("b", "eth0")));
        assert_eq!(res.owner(ip("::1")), Some(attachment("a", "eth0")));
    }

    #[test]
    fn reservation_names_are_addresses_as_the_reference_parses_them() {
        for i in 0..=300u32 {
            let name = format!("10.{i}.0.{}", 300 - i);
            let valid = i <= 255 && 300 - i <= 255;
            assert_eq!(reserved_address(&name).is_some(), valid, "{name:?}");
        }
        for (name, want) in [
            ("0.0.0.0", Some("0.0.0.0")),
            ("255.255.255.255", Some("255.255.255.255")),
            ("10.200.1.1", Some("10.200.1.1")),
            ("::ffff:1.2.3.4", Some("1.2.3.4")),
            ("fd00::1", Some("fd00::1")),
        ] {
            assert_eq!(reserved_address(name), want.map(ip), "{name:?}");
        }
        for name in [
            "1.2.3",
            "1.2.3.4.5",
            "01.2.3.4",
            "1.2.3.04",
            "1..3.4",
            ".1.2.3",
            "1.2.3.",
            "1.2.3.4 ",
            "+1.2.3.4",
            "1.2.3.-4",
            "1.2.3.1000",
            "256.0.0.1",
            "a.b.c.d",
            "",
            "1.2.3.4a",
            "lock",
            "last_reserved_ip.0",
            ".cni-rs-index",
            ".host-local-tmp.1.2.3",
            "\u{661}.2.3.4",
        ] {
            assert_eq!(reserved_address(name), None, "{name:?}");
        }
    }

    #[test]
    fn reservation_names_are_canonical() {
        assert_eq!(reserved_address("::ffff:10.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(reserved_address("lock"), None);
        assert_eq!(reserved_address("last_reserved_ip.0"), None);
        assert_eq!(ip("2001:db8:0:0:1:0:0:1").to_string(), "2001:db8::1:0:0:1");
    }
}
