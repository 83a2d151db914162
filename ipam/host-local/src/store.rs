//! The on-disk store, byte-compatible with the reference host-local: `<dataDir>/<network>/<ip>` holding
//! `<containerID>\r\n<ifname>` (or just `<containerID>` in the old format), `last_reserved_ip.<set>`,
//! and an flock on `<dataDir>/<network>/lock` around every change.
//!
//! A reservation is written to a temporary file first and then hard-linked to its final name: link(2)
//! fails with EEXIST atomically, so an address is never handed out twice and a crash never leaves a
//! half-written reservation. Temporary names start with '.', so neither we nor the reference (which
//! parses every name in the directory as an IP) ever mistake one for a reservation.
//!
//! Every verb needs the owner of every reservation (a repeated ADD returns what the attachment holds, DEL
//! releases it). Reading a thousand files per call would dominate ADD on a busy node, so a scan cache
//! (`index`) remembers the owner of each file by name and inode; an owner taken from it is confirmed by
//! reading its file before anything is returned or released on its word.
//!
//! Nothing in the network directory is followed if it is a symbolic link: whoever can plant one there (a pod
//! with the directory mounted, a careless script) must not make a root plugin write, create, lock or read a
//! file elsewhere. `<dataDir>/<network>` is opened once with `O_NOFOLLOW` (a link there is an error naming it;
//! `dataDir` itself is taken as configured, links and all: the operator wrote it) and every file is reached
//! through that descriptor (openat, linkat, renameat, unlinkat), so swapping the directory afterwards changes
//! nothing. Files are opened with `O_NOFOLLOW` (a link where `lock`, the scan cache or
//! `last_reserved_ip.<n>` should be is an I/O error naming it), created with `O_EXCL` (temporary files), or
//! published with link(2)/rename(2), which act on the name itself. A link with a reservation's name is not a
//! reservation: the listing skips it and link(2) refuses to publish over it.
//!
//! A read-only store (a file system remounted read-only after an I/O error) is still read: the lock is taken
//! through a read-only descriptor, or not at all when the lock file does not exist (nothing can change the
//! directory then), so DEL and GC succeed when there is nothing to release and name what they could not.

mod index;

use index::{DirStamp, INDEX_FILE};
use libcni::{code, Error, Result};
use nix::dir::{Dir, Type as FileType};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, Flock, FlockArg, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
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

/// What the reference writes between the container ID and the interface name.
pub const LINE_BREAK: &str = "\r\n";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";
const LOCK_FILE: &str = "lock";
const TEMP_PREFIX: &str = ".host-local-tmp.";

/// Who holds a reservation, as written in its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Attachment {
        container_id: String,
        ifname: String,
    },
    /// Written by old versions of the reference: the container ID only.
    Legacy {
        container_id: String,
    },
}

impl Owner {
    /// Parse a reservation file as the reference compares it (surrounding whitespace trimmed).
    pub fn parse(content: &str) -> Owner {
        let content = content.trim();
        match content.split_once(LINE_BREAK) {
            Some((cid, ifname)) => Owner::Attachment { container_id: cid.to_string(), ifname: ifname.to_string() },
            None => Owner::Legacy { container_id: content.to_string() },
        }
    }

    pub fn container_id(&self) -> &str {
        match self {
            Owner::Attachment { container_id, .. } | Owner::Legacy { container_id } => container_id,
        }
    }
}

/// One reservation file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reservation {
    /// Its inode number; 0 when unknown (never a valid inode, so never matches the index).
    ino: u64,
    record: Record,
    /// Found by the directory listing (a recorded file that is not was removed behind the index's back).
    listed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Record {
    /// Known from the scan cache (the file was not read): a line of `Reservations::index_text`.
    Indexed(index::Line),
    /// Read from the file during this process (boxed: a thousand of these are moved around per scan).
    Read(Box<ReadFile>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ReadFile {
    name: String,
    owner: Owner,
}

impl Record {
    fn read(name: String, owner: Owner) -> Record {
        Record::Read(Box::new(ReadFile { name, owner }))
    }
}

impl Reservation {
    fn is_from_index(&self) -> bool {
        matches!(self.record, Record::Indexed(_))
    }
}

/// Every reservation of a network at one moment.
#[derive(Debug, Clone, Default)]
pub struct Reservations {
    /// The scan cache as loaded. Owners taken from it stay there, encoded: comparing an encoded owner is
    /// all most verbs need, and an unchanged line is copied as it is into the next index.
    index_text: String,
    files: Files,
}

/// Reservations by address: a vector kept sorted, half the memory of a hash map and no hashing. Scans
/// build it in one go (the index is written in this order) and later changes are few.
#[derive(Debug, Clone, Default)]
struct Files(Vec<(IpAddr, Reservation)>);

impl Files {
    /// A binary search written out: with the release profile's size optimisation, the library's calls a
    /// closure and `IpAddr::cmp` at every step, which showed up in profiles of a thousand-entry scan.
    fn position(&self, ip: IpAddr) -> Result<usize, usize> {
        // The same order as `IpAddr`'s: every IPv4 address first, each family by value.
        let key = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => (false, u128::from(v4.to_bits())),
            IpAddr::V6(v6) => (true, v6.to_bits()),
        };
        let wanted = key(ip);
        let (mut low, mut high) = (0, self.0.len());
        while low < high {
            let mid = low + (high - low) / 2;
            let Some((at, _)) = self.0.get(mid) else { break };
            match key(*at).cmp(&wanted) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(low)
    }

    fn get(&self, ip: IpAddr) -> Option<&Reservation> {
        self.position(ip).ok().and_then(|i| self.0.get(i)).map(|(_, r)| r)
    }

    fn get_mut(&mut self, ip: IpAddr) -> Option<&mut Reservation> {
        self.position(ip).ok().and_then(|i| self.0.get_mut(i)).map(|(_, r)| r)
    }

    fn contains_key(&self, ip: IpAddr) -> bool {
        self.position(ip).is_ok()
    }

    /// Add or replace.
    fn insert(&mut self, ip: IpAddr, r: Reservation) {
        match self.position(ip) {
            Ok(i) => {
                if let Some(slot) = self.0.get_mut(i) {
                    slot.1 = r;
                }
            }
            Err(i) => self.0.insert(i, (ip, r)),
        }
    }

    fn remove(&mut self, ip: IpAddr) -> Option<Reservation> {
        self.position(ip).ok().map(|i| self.0.remove(i).1)
    }

    /// Add many at once (a scan's fresh reads; all of them when there is no index). The later of two
    /// entries for one address wins, as with `insert`.
    fn extend(&mut self, more: Vec<(IpAddr, Reservation)>) {
        if more.is_empty() {
            return;
        }
        self.0.extend(more);
        // Stable, and fast on a sorted run followed by a short one.
        self.0.sort_by_key(|(ip, _)| *ip);
        let mut deduped: Vec<(IpAddr, Reservation)> = Vec::with_capacity(self.0.len());
        for (ip, r) in self.0.drain(..) {
            match deduped.last_mut() {
                Some(last) if last.0 == ip => last.1 = r,
                _ => deduped.push((ip, r)),
            }
        }
        self.0 = deduped;
    }

    fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Reservation)> {
        self.0.iter().map(|(ip, r)| (ip, r))
    }

    fn values(&self) -> impl Iterator<Item = &Reservation> {
        self.0.iter().map(|(_, r)| r)
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Reservations {
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.files.contains_key(ip)
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The owner as recorded: it may come from the scan cache, so confirm it before acting on it.
    pub fn owner(&self, ip: IpAddr) -> Option<Owner> {
        self.files.get(ip).and_then(|r| self.owner_of(r))
    }

    /// Every address and its owner as recorded (see [`Reservations::owner`]), by address.
    pub fn owners(&self) -> Vec<(IpAddr, Owner)> {
        self.files.iter().filter_map(|(ip, r)| Some((*ip, self.owner_of(r)?))).collect()
    }

    fn owner_of(&self, r: &Reservation) -> Option<Owner> {
        match &r.record {
            // None only for a line we did not write (the checksum makes that unlikely): an unknown owner, on
            // whose word nothing is released and which a confirmation replaces.
            Record::Indexed(line) => index::decode_owner(&self.index_text, line),
            Record::Read(file) => Some(file.owner.clone()),
        }
    }

    fn name_of<'r>(&'r self, r: &'r Reservation) -> Option<&'r str> {
        match &r.record {
            Record::Indexed(line) => index::name(&self.index_text, line),
            Record::Read(file) => Some(&file.name),
        }
    }

    /// The addresses an attachment holds, confirmed: its own files, or, when it has none, old-format files of
    /// its container (the reference's rule for DEL).
    pub fn held_by(&mut self, store: &Store, cid: &str, ifname: &str) -> Vec<IpAddr> {
        self.confirmed_held_by(store, cid, ifname).0
    }

    fn held_by_as_recorded(&self, cid: &str, ifname: &str) -> Vec<IpAddr> {
        let exact = Owner::Attachment { container_id: cid.to_string(), ifname: ifname.to_string() };
        let legacy = Owner::Legacy { container_id: cid.to_string() };
        let owned_by = |wanted: &Owner| -> Vec<IpAddr> {
            let encoded = index::encode_owner(wanted);
            let is_wanted = |r: &Reservation| match &r.record {
                Record::Indexed(line) => index::owner_field(&self.index_text, line) == Some(encoded.as_str()),
                Record::Read(file) => file.owner == *wanted,
            };
            self.files.iter().filter(|(_, r)| is_wanted(r)).map(|(ip, _)| *ip).collect()
        };
        let held = owned_by(&exact);
        if !held.is_empty() {
            return held;
        }
        owned_by(&legacy)
    }

    /// [`Reservations::held_by`], and whether confirming changed the view.
    fn confirmed_held_by(&mut self, store: &Store, cid: &str, ifname: &str) -> (Vec<IpAddr>, bool) {
        let mut changed_any = false;
        loop {
            let held = self.held_by_as_recorded(cid, ifname);
            let mut changed = false;
            for ip in &held {
                changed |= self.confirm(store, *ip);
            }
            // A claim that did not hold can hide others (old-format files count only when no exact one does).
            if !changed {
                return (held, changed_any);
            }
            changed_any = true;
        }
    }

    /// Re-read the file behind `ip` if its owner came from the scan cache (a file removed and re-created
    /// behind our back may have got the same inode number). Returns whether the view changed.
    fn confirm(&mut self, store: &Store, ip: IpAddr) -> bool {
        let Some(r) = self.files.get(ip) else { return false };
        if !r.is_from_index() {
            return false;
        }
        let recorded = (r.ino, self.owner_of(r));
        let name = self.name_of(r).map(str::to_string);
        let read = name.as_ref().map(|name| (name, store.read_reservation(name)));
        match read {
            Some((name, Ok((ino, owner)))) => {
                let changed = recorded != (ino, Some(owner.clone()));
                self.files.insert(ip, Reservation { ino, record: Record::read(name.clone(), owner), listed: true });
                changed
            }
            // Vanished or unreadable: a scan skips such files, so does the view.
            _ => {
                self.files.remove(ip);
                true
            }
        }
    }
}

/// The files the scan cache records, if it is whole and current; none of them listed yet.
fn recorded_files(text: &str, now: &DirStamp) -> Option<Files> {
    // No line is shorter than 16 bytes.
    let mut files = Vec::with_capacity(text.len() / 16);
    index::parse(text, now, |name, ino, line| {
        let ip = reservation_name(name)?;
        // Written in address order: anything else is not an index we wrote.
        if files.last().is_some_and(|(last, _)| *last >= ip) {
            return None;
        }
        files.push((ip, Reservation { ino, record: Record::Indexed(line), listed: false }));
        Some(())
    })?;
    Some(Files(files))
}

/// The parsed name of a directory entry, if it is a reservation file.
fn reservation_name(name: &str) -> Option<IpAddr> {
    if let Some(ip) = plain_ipv4(name) {
        return Some(IpAddr::V4(ip));
    }
    name.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// The common case of [`reservation_name`], several times faster than the general parser (a scan parses
/// every name): four decimal octets without leading zeros. Anything else is left to the general parser.
fn plain_ipv4(name: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let (mut index, mut value, mut digits) = (0usize, 0u16, 0u8);
    for &b in name.as_bytes().iter().chain(std::iter::once(&b'.')) {
        match b {
            // No leading zero, at most three digits.
            b'0'..=b'9' if digits < 3 && !(digits == 1 && value == 0) => {
                value = value * 10 + u16::from(b - b'0');
                digits += 1;
            }
            b'.' if digits > 0 => {
                *octets.get_mut(index)? = u8::try_from(value).ok()?;
                (index, value, digits) = (index + 1, 0, 0);
            }
            _ => return None,
        }
    }
    (index == 4).then_some(Ipv4Addr::from(octets))
}

/// Defensive re-check of a network name before it becomes a path component (skel validated it already).
fn check_network_name(network: &str) -> Result<()> {
    if network.is_empty() || network == "." || network == ".." || network.contains(['/', '\0']) {
        return Err(Error::config(format!("network name {network:?} cannot be used as a directory name")));
    }
    Ok(())
}

/// What one listing of the network directory found.
struct Listing {
    reservations: Reservations,
    /// The scan cache was missing, unusable or out of date.
    index_stale: bool,
    /// Names of temporary files (ours), which outlive the lock only when a plugin crashed.
    temp_files: Vec<String>,
}

/// The directory of one network's reservations, held open: every file is reached through this descriptor
/// (openat, linkat, renameat, unlinkat), so what `<dataDir>/<network>` names later (renamed, replaced by a
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
        check_network_name(network)?;
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
        let listing = self.list()?;
        let mut removed_any = false;
        for tmp in &listing.temp_files {
            // A temporary name is never parsed as an address, so one that cannot be removed is harmless.
            removed_any |= self.unlink(tmp).is_ok();
        }
        Ok(Locked {
            store: self,
            reservations: listing.reservations,
            index_stale: (listing.index_stale || removed_any) && !read_only,
            _flock: flock,
        })
    }

    /// Every reservation, without the lock (CHECK, STATUS): owners may come from the scan cache, which is
    /// never written here. Unreadable or vanished files are skipped, as the reference does.
    pub fn scan(&self) -> Result<Reservations> {
        Ok(self.list()?.reservations)
    }

    /// One directory listing: each reservation whose name and inode the scan cache knows keeps the recorded
    /// owner; only new or replaced files are read.
    fn list(&self) -> Result<Listing> {
        let stamp = self.handle.metadata().ok().map(|m| DirStamp::of(&m));
        let index_text = match stamp {
            Some(_) => self.read_index()?,
            None => String::new(),
        };
        let recorded = stamp.and_then(|now| recorded_files(&index_text, &now));
        let mut index_stale = recorded.is_none();
        let index_text = if index_stale { String::new() } else { index_text };
        let mut files = recorded.unwrap_or_default();
        // nix's iterator copies each name once; std's DirEntry::file_name copies it a second time.
        let mut dir = Dir::openat(
            self.handle.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(format!("read {}", self.dir.display()), &io_error(e)))?;
        let mut temp_files = Vec::new();
        let mut fresh = Vec::new();
        for entry in dir.iter().flatten() {
            let Ok(name) = entry.file_name().to_str() else { continue };
            if name.starts_with(TEMP_PREFIX) {
                temp_files.push(name.to_string());
                continue;
            }
            let Some(ip) = reservation_name(name) else { continue };
            let is_file = match entry.file_type() {
                Some(kind) => kind == FileType::File,
                // Some file systems do not say in the listing.
                None => self.kind_of(name) == Some(SFlag::S_IFREG),
            };
            if !is_file {
                continue;
            }
            let ino = entry.ino();
            if let Some(r) = files.get_mut(ip) {
                if let Record::Indexed(line) = &r.record {
                    if !r.listed && r.ino == ino && index::name(&index_text, line) == Some(name) {
                        r.listed = true;
                        continue;
                    }
                }
            }
            index_stale = true;
            if let Ok((ino, owner)) = self.read_reservation(name) {
                fresh.push((ip, Reservation { ino, record: Record::read(name.to_string(), owner), listed: true }));
            }
        }
        let recorded = files.len();
        // Recorded files that are gone, or that were replaced and read again.
        files.0.retain(|(_, r)| r.listed);
        index_stale |= files.len() != recorded;
        files.extend(fresh);
        Ok(Listing { reservations: Reservations { index_text, files }, index_stale, temp_files })
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
            let text = &reservations.index_text;
            let entries = reservations.files.values().filter_map(|r| match &r.record {
                Record::Indexed(line) => index::line(text, line).map(index::Entry::Recorded),
                Record::Read(file) => Some(index::Entry::Fresh { name: &file.name, ino: r.ino, owner: &file.owner }),
            });
            let rendered = index::render(&stamp, reservations.files.len(), entries);
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
        let name = format!("{LAST_RESERVED_PREFIX}{set_index}");
        let Some(file) = self.open_existing("round-robin cursor", &name)? else { return Ok(None) };
        // An address is at most 45 bytes; a larger file is not ours and is read no further.
        let mut content = String::new();
        if file.take(64).read_to_string(&mut content).is_err() {
            return Ok(None);
        }
        Ok(content.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical()))
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
    /// Nothing is synced to disk, as the reference does not: publishing by link(2) or rename(2) keeps
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

/// The store with its lock held and its reservations read; only here can reservations change.
pub struct Locked<'a> {
    store: &'a Store,
    /// The directory as this process has left it so far.
    reservations: Reservations,
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
        let name = ip.to_string();
        let content = format!("{}{LINE_BREAK}{ifname}", cid.trim());
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
        self.reservations.files.insert(ip, Reservation { ino, record: Record::read(name, owner), listed: true });
        self.index_stale = true;
        Ok(true)
    }

    /// Record the round-robin cursor of a set. Replaced atomically, so it is never half-written.
    pub fn set_last_reserved(&self, set_index: usize, ip: IpAddr) -> Result<()> {
        let target = format!("{LAST_RESERVED_PREFIX}{set_index}");
        let store = self.store;
        store.write_via_temp(&ip.to_string(), |tmp, _| {
            // Removed first: renaming over an existing file makes ext4 (auto_da_alloc) start writing
            // the new one out before rename returns (~0.5 ms per ADD here). Without the file for a
            // moment (under the lock, which the reference takes to read it too) the round robin
            // merely starts from the range's beginning.
            let _ = store.unlink(&target);
            let fd = store.handle.as_fd();
            nix::fcntl::renameat(fd, tmp, fd, target.as_str())
                .map_err(|e| Error::io(format!("write {}", store.path(&target).display()), &io_error(e)))
        })
    }

    /// Remove a reservation; one that is already gone is success.
    pub fn release(&mut self, ip: IpAddr) -> Result<()> {
        let recorded = self.reservations.files.get(ip).and_then(|r| self.reservations.name_of(r));
        let name = recorded.map_or_else(|| ip.to_string(), str::to_string);
        let removed = match self.store.unlink(&name) {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(Error::io(format!("release {}", self.store.path(&name).display()), &e)),
        };
        let known = self.reservations.files.remove(ip).is_some();
        self.index_stale |= removed || known;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod tests {
    use super::*;

    /// A directory under the system temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);
    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "host-local-unit-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

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
        assert!(res.files.get(ip("10.0.0.3")).unwrap().is_from_index());
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
        assert!(res.files.get(ip("10.0.0.2")).unwrap().is_from_index());
        assert_eq!(res.owner(ip("10.0.0.9")), Some(attachment("foreign", "eth0")));
        assert_eq!(res.owner(ip("10.0.0.3")), Some(attachment("c", "eth0")));
        assert!(!res.files.get(ip("10.0.0.3")).unwrap().is_from_index());
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
                        // Replacing the cursor replaces the link itself, never its target.
                        let l = store.lock().unwrap();
                        l.set_last_reserved(0, ip("10.0.0.3")).unwrap();
                        assert!(fs::symlink_metadata(&path).unwrap().is_file(), "{what}");
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

    #[test]
    fn files_stay_sorted_and_unique() {
        let entry = |ino| Reservation { ino, record: Record::read("x".into(), Owner::parse("a")), listed: true };
        let mut files = Files::default();
        let addresses = ["fd00::2", "10.0.0.9", "::1", "10.0.0.2", "255.255.255.255", "0.0.0.0", "ffff::1", "10.0.0.5"];
        for (n, a) in addresses.iter().enumerate() {
            files.insert(ip(a), entry(n as u64));
        }
        files.extend(vec![(ip("10.0.0.3"), entry(20)), (ip("10.0.0.9"), entry(21)), (ip("fd00::1"), entry(22))]);
        files.insert(ip("::1"), entry(23));
        assert_eq!(files.remove(ip("10.0.0.5")).map(|r| r.ino), Some(7));
        assert!(files.remove(ip("10.0.0.5")).is_none());
        let mut want: Vec<IpAddr> = addresses.iter().map(|a| ip(a)).chain([ip("10.0.0.3"), ip("fd00::1")]).collect();
        want.sort();
        want.retain(|a| *a != ip("10.0.0.5"));
        assert_eq!(files.iter().map(|(a, _)| *a).collect::<Vec<_>>(), want);
        for a in &want {
            assert!(files.contains_key(*a), "{a}");
        }
        assert_eq!(files.get(ip("10.0.0.9")).map(|r| r.ino), Some(21));
        assert_eq!(files.get(ip("::1")).map(|r| r.ino), Some(23));
        assert!(!files.contains_key(ip("10.0.0.4")) && !files.contains_key(ip("::2")));
    }

    #[test]
    fn the_fast_ipv4_path_agrees_with_the_general_parser() {
        let mut names: Vec<String> = (0..=300u32).map(|i| format!("10.{i}.0.{}", 300 - i)).collect();
        names.extend(
            [
                "0.0.0.0",
                "255.255.255.255",
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
                "::ffff:1.2.3.4",
                "fd00::1",
                "lock",
                "last_reserved_ip.0",
                "\u{661}.2.3.4",
            ]
            .map(str::to_string),
        );
        for name in &names {
            let general = name.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
            assert_eq!(reservation_name(name), general, "{name:?}");
            if let Some(fast) = plain_ipv4(name) {
                assert_eq!(Some(IpAddr::V4(fast)), general, "{name:?}");
            }
        }
        assert!(plain_ipv4("10.200.1.1").is_some());
    }

    #[test]
    fn reservation_names_are_canonical() {
        assert_eq!(reservation_name("::ffff:10.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(reservation_name("lock"), None);
        assert_eq!(reservation_name("last_reserved_ip.0"), None);
        assert_eq!(ip("2001:db8:0:0:1:0:0:1").to_string(), "2001:db8::1:0:0:1");
    }
}
