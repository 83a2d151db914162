//! Network namespace handles, and a guard that puts the calling thread into one and back.
//!
//! A [`NetNs`] holds an open file on the namespace (a bind mount under `/run/netns`, or
//! `/proc/<pid>/ns/net`), so the namespace stays alive and the handle keeps meaning the same
//! namespace even if the path is unmounted meanwhile.

use libcni::{code, Error, Request, Result};
use nix::sched::CloneFlags;
use nix::sys::stat::SFlag;
use nix::sys::statfs::{fstatfs, NSFS_MAGIC};
use std::fs::File;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `NS_GET_NSTYPE` from `<linux/nsfs.h>`: `_IO(0xb7, 0x3)`.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// Where this thread's own network namespace is visible. `/proc/self` would name the thread group
/// leader, which is wrong for a thread that has called setns.
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    file: File,
    path: PathBuf,
}

impl NetNs {
    /// Opens the network namespace at `path` (e.g. `CNI_NETNS`).
    ///
    /// A path that does not exist is an error with ENOENT (see [`crate::is_not_found`]); one that
    /// exists but is not a network namespace is an `INVALID_ENV` (4) error:
    /// `CNI_NETNS /x is not a network namespace (it is a regular file)`.
    ///
    /// Nothing but a namespace is ever opened: the path is first looked up without opening what
    /// it names (`O_PATH`: no device's open routine runs, no FIFO is waited on), must be on nsfs,
    /// and only then is that very inode opened, through `/proc/self/fd`.
    pub fn open(path: impl AsRef<Path>) -> Result<NetNs> {
        let path = path.as_ref();
        let probe = probe(path)?;
        check_on_nsfs(&probe, path)?;
        let file = reopen(&probe, path)?;
        check_is_netns(&file, path)?;
        Ok(NetNs { file, path: path.to_path_buf() })
    }

    /// Like [`NetNs::open`], but a path that does not exist is `Ok(None)`: for DEL, where a
    /// namespace that is already gone is success.
    pub fn open_if_exists(path: impl AsRef<Path>) -> Result<Option<NetNs>> {
        match NetNs::open(path) {
            Ok(ns) => Ok(Some(ns)),
            Err(e) if crate::errno(&e) == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// For DEL: `Ok(None)` when the namespace is gone. Gone is a path that does not exist, or an
    /// empty regular file: the mount point a runtime leaves in `/run/netns` when it unmounted the
    /// namespace (or crashed before mounting it). Nothing can be deleted through either, and the
    /// kernel removed the namespace's interfaces with it. Any other path that is not a network
    /// namespace is still an error (code 4).
    pub fn open_for_del(path: impl AsRef<Path>) -> Result<Option<NetNs>> {
        let path = path.as_ref();
        let probe = match probe(path) {
            Ok(probe) => probe,
            Err(e) if crate::errno(&e) == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        if is_unmounted_mount_point(&probe, path)? {
            return Ok(None);
        }
        check_on_nsfs(&probe, path)?;
        let file = reopen(&probe, path)?;
        check_is_netns(&file, path)?;
        Ok(Some(NetNs { file, path: path.to_path_buf() }))
    }

    /// The network namespace of the calling thread. Opened directly: `/proc/thread-self/ns/net`
    /// is the kernel's own link to a network namespace, not a path from the input, so of
    /// [`NetNs::open`]'s checks only the one that /proc is procfs (the file on nsfs) is kept.
    /// Every [`NetNs::enter`] opens it, so this halves the system calls of each.
    pub fn current() -> Result<NetNs> {
        let path = Path::new(THREAD_NETNS);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| open_error(path, &e))?;
        check_on_nsfs(&file, path)?;
        Ok(NetNs { file, path: path.to_path_buf() })
    }

    /// The path this handle was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// (device, inode) of the namespace: equal for two handles on the same namespace.
    pub fn id(&self) -> Result<(u64, u64)> {
        let meta =
            self.file.metadata().map_err(|e| Error::io(format_args!("stat netns {}", self.path.display()), &e))?;
        Ok((meta.dev(), meta.ino()))
    }

    /// Whether both handles name the same namespace.
    pub fn same_as(&self, other: &NetNs) -> Result<bool> {
        Ok(self.id()? == other.id()?)
    }

    /// Whether this is the calling thread's own network namespace (a runtime passing the
    /// plugin's own namespace as `CNI_NETNS` is a mistake worth catching).
    pub fn same_as_current(&self) -> Result<bool> {
        self.same_as(&NetNs::current()?)
    }

    /// An exclusive lock on the namespace itself (flock on its nsfs inode, which every path to
    /// the namespace shares), held until the returned value is dropped: serialises plugins that
    /// read the namespace's state and then change it on what they read (the first free routing
    /// table for a VRF or for sbr), without a file on disk. The reference's sbr takes the same
    /// lock. Waits for the holder to finish.
    pub fn lock(&self) -> Result<nix::fcntl::Flock<std::os::fd::OwnedFd>> {
        let what = || format!("lock netns {}", self.path.display());
        let fd = self.file.as_fd().try_clone_to_owned().map_err(|e| Error::io(what(), &e))?;
        nix::fcntl::Flock::lock(fd, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| Error::io(what(), &io::Error::from(e)))
    }

    /// Moves the calling thread into this namespace until the guard is dropped.
    ///
    /// Use it only around opening a netlink socket or writing a sysctl: sockets stay bound to
    /// the namespace they were created in, so after the guard is gone they still act there.
    /// setns affects only the calling thread: never hold a guard across an `.await` on a
    /// multi-thread runtime (the task could resume on another thread). netkit only runs
    /// current-thread runtimes, and enters namespaces outside any task.
    pub fn enter(&self) -> Result<NsGuard> {
        let original = NetNs::current()?;
        nix::sched::setns(self.file.as_fd(), CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::network(format!("enter netns {}: {}", self.path.display(), io::Error::from(e))))?;
        Ok(NsGuard { original, _not_send: PhantomData })
    }

    /// Runs `f` with the calling thread inside this namespace, then moves it back.
    pub fn run<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let guard = self.enter()?;
        let out = f();
        guard.leave()?;
        Ok(out)
    }
}

impl AsFd for NetNs {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

impl AsRawFd for NetNs {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }
}

/// Keeps the calling thread in another network namespace; dropping it moves the thread back to
/// the namespace it was in when the guard was made. Not `Send`: setns is per thread.
#[must_use = "the thread leaves the namespace as soon as the guard is dropped"]
#[derive(Debug)]
pub struct NsGuard {
    original: NetNs,
    _not_send: PhantomData<*const ()>,
}

impl NsGuard {
    /// Moves back to the original namespace, reporting a failure instead of aborting.
    pub fn leave(self) -> Result<()> {
        let result = self.restore();
        std::mem::forget(self);
        result
    }

    /// The namespace the thread returns to.
    pub fn original(&self) -> &NetNs {
        &self.original
    }

    fn restore(&self) -> Result<()> {
        nix::sched::setns(self.original.file.as_fd(), CloneFlags::CLONE_NEWNET).map_err(|e| {
            Error::network(format!("return to netns {}: {}", self.original.path.display(), io::Error::from(e)))
        })
    }
}

impl Drop for NsGuard {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            // Carrying on in the container's namespace would configure the wrong one; this
            // cannot happen with a namespace fd we hold open, so stop hard rather than guess.
            eprintln!("netkit: {e}; aborting");
            std::process::abort();
        }
    }
}

fn open_error(path: &Path, err: &io::Error) -> Error {
    // A String, not format_args!: a let-bound format_args! holding a temporary (`display()`)
    // builds only on recent rustc, and the crates keep to the workspace's rust-version.
    let what = format!("open netns {}", path.display());
    match err.raw_os_error() {
        // A path with a file where a directory should be is as absent as a missing one: both are
        // ENOENT, so is_not_found() recognises them.
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => {
            Error { code: code::INVALID_ENV, ..Error::io(what, &io::Error::from_raw_os_error(libc::ENOENT)) }
        }
        _ => Error::io(what, err),
    }
}

/// `path` looked up but not opened (`O_PATH`), symlinks followed as the reference follows them:
/// enough for fstat and fstatfs, and nothing of what it names runs. Not through std's
/// `OpenOptions::custom_flags`: on musl, whose `O_ACCMODE` includes `O_PATH`, std masks it off and
/// the path is opened for reading (a FIFO there then blocks the plugin).
fn probe(path: &Path) -> Result<File> {
    nix::fcntl::open(path, nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map(File::from)
        .map_err(|e| open_error(path, &io::Error::from(e)))
}

/// Opens the inode `probe` holds (checked to be on nsfs), not whatever `path` names by now.
fn reopen(probe: &File, path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", probe.as_raw_fd()))
        .map_err(|e| Error::io(format_args!("open netns {}", path.display()), &e))
}

/// An empty regular file outside nsfs: what is left of a namespace bind mount.
fn is_unmounted_mount_point(file: &File, path: &Path) -> Result<bool> {
    let fs = fstatfs(file.as_fd())
        .map_err(|e| Error::io(format_args!("statfs netns {}", path.display()), &io::Error::from(e)))?;
    if fs.filesystem_type() == NSFS_MAGIC {
        return Ok(false);
    }
    let meta = file.metadata().map_err(|e| Error::io(format_args!("stat netns {}", path.display()), &e))?;
    Ok(meta.file_type().is_file() && meta.len() == 0)
}

/// The namespace a plugin works in: CNI_NETNS for ADD and CHECK. It must exist and be a network
/// namespace, and must not be the plugin's own unless the runtime set `CNI_NETNS_OVERRIDE` (code 4):
/// configuring the node's namespace as if it were the pod's would take the node's interfaces.
pub fn container_netns(req: &Request) -> Result<NetNs> {
    let path = req.netns.as_deref().ok_or_else(|| Error::env("required env variables [CNI_NETNS] missing"))?;
    let ns = NetNs::open(path)?;
    refuse_own(req, &ns)?;
    Ok(ns)
}

/// CNI_NETNS for DEL: `None` when it is unset or the namespace is gone ([`NetNs::open_for_del`]).
/// The plugin's own namespace is refused as on ADD (code 4), so DEL deletes nothing in it.
pub fn container_netns_for_del(req: &Request) -> Result<Option<NetNs>> {
    let Some(path) = req.netns.as_deref() else { return Ok(None) };
    let Some(ns) = NetNs::open_for_del(path)? else { return Ok(None) };
    refuse_own(req, &ns)?;
    Ok(Some(ns))
}

fn refuse_own(req: &Request, ns: &NetNs) -> Result<()> {
    if !req.netns_override && ns.same_as_current()? {
        return Err(Error::env(format!(
            "CNI_NETNS {} is the plugin's own network namespace, not the container's: {} refused, nothing \
             changed in it (a runtime that means it sets CNI_NETNS_OVERRIDE=1)",
            ns.path().display(),
            req.command.as_str()
        )));
    }
    Ok(())
}

fn not_netns(path: &Path, what: &str) -> Error {
    Error::env(format!("CNI_NETNS {} is not a network namespace ({what})", path.display()))
}

/// A namespace file lives on nsfs; `/proc/<pid>/ns/net` resolves to it. Anything else (a procfs
/// file that is not such a link included) is refused, saying what it is.
fn check_on_nsfs(file: &File, path: &Path) -> Result<()> {
    let fs = fstatfs(file.as_fd())
        .map_err(|e| Error::io(format_args!("statfs netns {}", path.display()), &io::Error::from(e)))?;
    if fs.filesystem_type() != NSFS_MAGIC {
        let meta = file.metadata().map_err(|e| Error::io(format_args!("stat netns {}", path.display()), &e))?;
        let mode = SFlag::from_bits_truncate(meta.mode() & libc::S_IFMT);
        let kind = match mode {
            SFlag::S_IFREG => "it is a regular file",
            SFlag::S_IFDIR => "it is a directory",
            SFlag::S_IFCHR => "it is a character device",
            SFlag::S_IFBLK => "it is a block device",
            SFlag::S_IFIFO => "it is a pipe",
            SFlag::S_IFSOCK => "it is a socket",
            _ => "it is not on nsfs",
        };
        return Err(not_netns(path, kind));
    }
    Ok(())
}

/// The opened nsfs file is a network namespace, not one of another type.
fn check_is_netns(file: &File, path: &Path) -> Result<()> {
    // SAFETY: NS_GET_NSTYPE takes no argument and only reads the namespace behind a valid fd.
    let ns_type = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_NSTYPE as _) };
    if ns_type < 0 {
        return Err(not_netns(path, "it is not a namespace file"));
    }
    if ns_type != libc::CLONE_NEWNET {
        return Err(not_netns(path, &format!("it is a namespace of another type, {}", ns_type_name(ns_type))));
    }
    Ok(())
}

fn ns_type_name(t: libc::c_int) -> &'static str {
    match t {
        libc::CLONE_NEWNS => "mount",
        libc::CLONE_NEWUTS => "uts",
        libc::CLONE_NEWIPC => "ipc",
        libc::CLONE_NEWUSER => "user",
        libc::CLONE_NEWPID => "pid",
        libc::CLONE_NEWCGROUP => "cgroup",
        0x80 => "time",
        _ => "unknown",
    }
}
