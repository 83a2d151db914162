//! Persistent tap devices, made as `ip tuntap add mode tap` makes them: `/dev/net/tun` opened in the
//! target namespace, TUNSETIFF, the owner and group, TUNSETPERSIST. Netlink cannot create one (a
//! tun device's kind has no `newlink`).

use crate::netns::NetNs;
use libcni::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;

/// How [`create_tap`] makes the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TapOptions {
    /// IFF_MULTI_QUEUE: a reader (a VM's vhost) may attach several queues.
    pub multi_queue: bool,
    /// IFF_VNET_HDR: frames carry a virtio-net header, as the reference's netlink path sets.
    pub vnet_hdr: bool,
    /// The uid allowed to attach without CAP_NET_ADMIN (TUNSETOWNER); None: root only.
    pub owner: Option<u32>,
    /// The gid allowed to attach (TUNSETGROUP).
    pub group: Option<u32>,
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags (a short) in the union.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _rest: [u8; 22],
}

/// The IFF_* flags of a tap with these options.
pub fn tap_flags(opts: &TapOptions) -> libc::c_short {
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
    if opts.vnet_hdr {
        flags |= libc::IFF_VNET_HDR;
    }
    if opts.multi_queue {
        flags |= libc::IFF_MULTI_QUEUE;
    }
    flags as libc::c_short
}

/// Opens `/dev/net/tun` and attaches it to tap `name` (created if missing) with `flags`: the
/// device lives in the namespace the calling thread is in when the file is opened. The tap stays
/// while the file is open, or for good once made persistent.
pub fn open_tap(name: &str, flags: libc::c_short) -> Result<File> {
    if !crate::valid_ifname(name) {
        return Err(Error::config(format!("tap {name:?}: invalid interface name (1-15 bytes, no '/', ':' or spaces)")));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(|e| Error::io("open /dev/net/tun (the kernel needs tun/tap support)", &e))?;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags, _rest: [0; 22] };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`; `req` is one (same size and layout for
    // the name and flags it uses) and outlives the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(Error::io(format_args!("create tap {name}"), &std::io::Error::last_os_error()));
    }
    Ok(file)
}

fn set(file: &File, request: libc::Ioctl, value: libc::c_ulong, what: std::fmt::Arguments) -> Result<()> {
    // SAFETY: the TUNSET* requests used here take an integer argument by value.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), request, value) };
    if rc < 0 {
        return Err(Error::io(what, &std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Creates the persistent tap `name` in `ns`, down. On failure nothing is left: the device exists
/// only while our file is open until TUNSETPERSIST, the last step.
pub fn create_tap(ns: &NetNs, name: &str, opts: &TapOptions) -> Result<()> {
    let guard = ns.enter()?;
    let file = open_tap(name, tap_flags(opts));
    guard.leave()?;
    let file = file?;
    if let Some(uid) = opts.owner {
        set(&file, libc::TUNSETOWNER, uid.into(), format_args!("set owner {uid} on tap {name}"))?;
    }
    if let Some(gid) = opts.group {
        set(&file, libc::TUNSETGROUP, gid.into(), format_args!("set group {gid} on tap {name}"))?;
    }
    set(&file, libc::TUNSETPERSIST, 1, format_args!("make tap {name} persistent"))
}
