//! The on-disk store, byte-compatible with the reference host-local: `<dataDir>/<network>/<ip>` holding
//! `<containerID>\r\n<ifname>` (or just `<containerID>` in the old format), `last_reserved_ip.<set>`,
//! and an flock on `<dataDir>/<network>/lock` around every change.
//!
//! A reservation is written to a temporary file first and then hard-linked to its final name: link(2)
//! fails with EEXIST atomically, so an address is never handed out twice and a crash never leaves a
//! half-written reservation. Temporary names start with '.', so neither we nor the reference (which
//! parses every name in the directory as an IP) ever mistake one for a reservation.

use libcni::{code, Error, Result};
use nix::fcntl::{Flock, FlockArg};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

    fn is_exactly(&self, cid: &str, ifname: &str) -> bool {
        matches!(self, Owner::Attachment { container_id, ifname: i } if container_id == cid && i == ifname)
    }

    fn is_legacy_of(&self, cid: &str) -> bool {
        matches!(self, Owner::Legacy { container_id } if container_id == cid)
    }
}

/// Every reservation of a network at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reservations {
    pub by_ip: BTreeMap<IpAddr, Owner>,
}

impl Reservations {
    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.by_ip.contains_key(&ip)
    }

    /// The addresses an attachment holds: its own files, or, when it has none, old-format files of its
    /// container (the reference's rule for DEL).
    pub fn held_by(&self, cid: &str, ifname: &str) -> Vec<IpAddr> {
        let exact: Vec<IpAddr> =
            self.by_ip.iter().filter(|(_, o)| o.is_exactly(cid, ifname)).map(|(ip, _)| *ip).collect();
        if !exact.is_empty() {
            return exact;
        }
        self.by_ip.iter().filter(|(_, o)| o.is_legacy_of(cid)).map(|(ip, _)| *ip).collect()
    }
}

/// The parsed name of a directory entry, if it is a reservation file.
fn reservation_name(name: &str) -> Option<IpAddr> {
    name.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Defensive re-check of a network name before it becomes a path component (skel validated it already).
fn check_network_name(network: &str) -> Result<()> {
    if network.is_empty() || network == "." || network == ".." || network.contains(['/', '\0']) {
        return Err(Error::config(format!("network name {network:?} cannot be used as a directory name")));
    }
    Ok(())
}

/// The directory of one network's reservations.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
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
        Ok(Store { dir })
    }

    /// Open the store only if it exists (DEL, GC, CHECK): a missing directory holds no reservation.
    pub fn existing(data_dir: &Path, network: &str) -> Result<Option<Store>> {
        let dir = Self::path_for(data_dir, network)?;
        match fs::metadata(&dir) {
            Ok(m) if m.is_dir() => Ok(Some(Store { dir })),
            Ok(_) => Err(Error::new(code::IO, format!("data directory {} is not a directory", dir.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("data directory {}", dir.display()), &e)),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Take the network's lock (shared with the reference plugin), blocking until it is free.
    pub fn lock(&self) -> Result<Locked<'_>> {
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(|e| Error::io(format!("open lock {}", path.display()), &e))?;
        let flock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| {
            Error::io(format!("lock {}", path.display()), &std::io::Error::from_raw_os_error(errno as i32))
        })?;
        Ok(Locked { store: self, _flock: flock })
    }

    /// Read every reservation. Unreadable or vanished files are skipped, as the reference does.
    pub fn scan(&self) -> Result<Reservations> {
        let entries = fs::read_dir(&self.dir).map_err(|e| Error::io(format!("read {}", self.dir.display()), &e))?;
        let mut by_ip = BTreeMap::new();
        for entry in entries.flatten() {
            let Some(ip) = entry.file_name().to_str().and_then(reservation_name) else { continue };
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Ok(bytes) = fs::read(entry.path()) {
                by_ip.insert(ip, Owner::parse(&String::from_utf8_lossy(&bytes)));
            }
        }
        Ok(Reservations { by_ip })
    }

    /// The address last handed out from a set, if recorded and parsable.
    pub fn last_reserved(&self, set_index: usize) -> Option<IpAddr> {
        let content = fs::read_to_string(self.dir.join(format!("{LAST_RESERVED_PREFIX}{set_index}"))).ok()?;
        content.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
    }

    /// Fails unless a file can be created in the network directory (STATUS).
    pub fn probe_writable(&self) -> Result<()> {
        let (path, _file) = self.temp_file()?;
        fs::remove_file(&path).map_err(|e| Error::io(format!("remove {}", path.display()), &e))
    }

    /// A fresh file whose name can never parse as an address, created exclusively.
    fn temp_file(&self) -> Result<(PathBuf, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        loop {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = self.dir.join(format!("{TEMP_PREFIX}{}.{nanos}.{n}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).mode(0o644).open(&path) {
                Ok(f) => return Ok((path, f)),
                Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io(format!("create temporary file in {}", self.dir.display()), &e)),
            }
        }
    }

    /// Write `content` to a temporary file and hand it to `publish`; the temporary name is always removed.
    fn write_via_temp<T>(&self, content: &str, publish: impl FnOnce(&Path) -> Result<T>) -> Result<T> {
        let (tmp, mut file) = self.temp_file()?;
        let written = file
            .write_all(content.as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| Error::io(format!("write {}", tmp.display()), &e));
        drop(file);
        let result = written.and_then(|()| publish(&tmp));
        // The temporary name is harmless if it lingers (never parsed as an address), so a failure here is ignored.
        let _ = fs::remove_file(&tmp);
        result
    }
}

/// The store with its lock held; only here can reservations change.
pub struct Locked<'a> {
    store: &'a Store,
    _flock: Flock<File>,
}

impl Locked<'_> {
    pub fn store(&self) -> &Store {
        self.store
    }

    pub fn scan(&self) -> Result<Reservations> {
        self.store.scan()
    }

    pub fn last_reserved(&self, set_index: usize) -> Option<IpAddr> {
        self.store.last_reserved(set_index)
    }

    /// Reserve `ip` for the attachment. `Ok(false)` if the address is already reserved by anyone.
    pub fn reserve(&self, ip: IpAddr, cid: &str, ifname: &str) -> Result<bool> {
        let target = self.store.dir.join(ip.to_string());
        let content = format!("{}{LINE_BREAK}{ifname}", cid.trim());
        self.store.write_via_temp(&content, |tmp| match fs::hard_link(tmp, &target) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::io(format!("reserve {}", target.display()), &e)),
        })
    }

    /// Record the round-robin cursor of a set (replaced atomically, so it is never half-written either).
    pub fn set_last_reserved(&self, set_index: usize, ip: IpAddr) -> Result<()> {
        let target = self.store.dir.join(format!("{LAST_RESERVED_PREFIX}{set_index}"));
        self.store.write_via_temp(&ip.to_string(), |tmp| {
            fs::rename(tmp, &target).map_err(|e| Error::io(format!("write {}", target.display()), &e))
        })
    }

    /// Remove a reservation; one that is already gone is success.
    pub fn release(&self, ip: IpAddr) -> Result<()> {
        let path = self.store.dir.join(ip.to_string());
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("release {}", path.display()), &e)),
        }
    }

    /// Remove temporary files left by a crash. Safe under the lock: ours exist only while it is held.
    pub fn remove_stale_temp_files(&self) -> Result<usize> {
        let entries =
            fs::read_dir(&self.store.dir).map_err(|e| Error::io(format!("read {}", self.store.dir.display()), &e))?;
        let mut removed = 0;
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX))
                && fs::remove_file(entry.path()).is_ok()
            {
                removed += 1;
            }
        }
        Ok(removed)
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
        let l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "cid1", "eth0").unwrap());
        assert!(!l.reserve(ip("10.0.0.2"), "cid2", "eth0").unwrap());
        assert!(l.reserve(ip("fd00::2"), "cid1", "eth0").unwrap());
        l.set_last_reserved(0, ip("10.0.0.2")).unwrap();
        l.set_last_reserved(1, ip("fd00::2")).unwrap();
        let dir = t.0.join("net1");
        assert_eq!(fs::read(dir.join("10.0.0.2")).unwrap(), b"cid1\r\neth0");
        assert_eq!(fs::read(dir.join("fd00::2")).unwrap(), b"cid1\r\neth0");
        assert_eq!(fs::read(dir.join("last_reserved_ip.0")).unwrap(), b"10.0.0.2");
        assert!(dir.join("lock").exists());
        assert_eq!(l.last_reserved(1), Some(ip("fd00::2")));
        let mut names: Vec<String> =
            fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["10.0.0.2", "fd00::2", "last_reserved_ip.0", "last_reserved_ip.1", "lock"]);
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
        let res = store.scan().unwrap();
        assert_eq!(res.by_ip.len(), 3);
        assert_eq!(res.held_by("a", "eth0"), vec![ip("10.0.0.2")]);
        assert_eq!(res.held_by("old", "eth0"), vec![ip("10.0.0.4")]);
        assert_eq!(res.held_by("nobody", "eth0"), Vec::<IpAddr>::new());
        assert_eq!(res.by_ip[&ip("10.0.0.4")], Owner::Legacy { container_id: "old".into() });
    }

    #[test]
    fn release_is_idempotent() {
        let t = TempDir::new("release");
        let store = Store::create(&t.0, "n").unwrap();
        let l = store.lock().unwrap();
        assert!(l.reserve(ip("10.0.0.2"), "a", "eth0").unwrap());
        l.release(ip("10.0.0.2")).unwrap();
        l.release(ip("10.0.0.2")).unwrap();
        assert!(store.scan().unwrap().by_ip.is_empty());
    }

    #[test]
    fn leftover_temp_file_is_not_a_reservation_and_is_cleaned() {
        let t = TempDir::new("crash");
        let store = Store::create(&t.0, "n").unwrap();
        // What a crash between writing and linking leaves behind.
        let (tmp, mut f) = store.temp_file().unwrap();
        f.write_all(b"a\r\neth0").unwrap();
        drop(f);
        assert!(store.scan().unwrap().by_ip.is_empty());
        assert!(tmp.file_name().unwrap().to_str().unwrap().parse::<IpAddr>().is_err());
        let l = store.lock().unwrap();
        assert_eq!(l.remove_stale_temp_files().unwrap(), 1);
        assert!(!tmp.exists());
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
    fn reservation_names_are_canonical() {
        assert_eq!(reservation_name("::ffff:10.0.0.1"), Some(ip("10.0.0.1")));
        assert_eq!(reservation_name("lock"), None);
        assert_eq!(reservation_name("last_reserved_ip.0"), None);
        assert_eq!(ip("2001:db8:0:0:1:0:0:1").to_string(), "2001:db8::1:0:0:1");
    }
}
