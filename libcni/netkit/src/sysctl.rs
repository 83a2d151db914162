//! Network sysctls under `/proc/sys/net`.
//!
//! Which namespace a `/proc/sys/net/...` file belongs to is decided when it is opened, by the
//! network namespace of the *opening thread* (not of the process, and not of whoever mounted
//! `/proc`). So to write a sysctl inside a container, hold a [`crate::NsGuard`] around [`set`]
//! on the same thread (or use [`set_in`]); a file opened before entering keeps pointing at the old
//! namespace. The tests in `tests/sysctl.rs` check this.

use crate::netns::NetNs;
use crate::Family;
use libcni::{code, Error, Result};
use std::io::{self, Write};
use std::path::PathBuf;

const ROOT: &str = "/proc/sys";

/// `/proc/sys/<rel>` after checking that `rel` is a plain relative path under `net/`.
fn full_path(rel: &str) -> Result<PathBuf> {
    let rel = rel.trim_start_matches('/');
    let rel = rel.strip_prefix("proc/sys/").unwrap_or(rel);
    let mut parts = rel.split('/');
    let ok = parts.next() == Some("net")
        && rel.split('/').all(|p| !p.is_empty() && p != "." && p != ".." && !p.contains('\0'));
    if !ok {
        return Err(Error::config(format!(
            "sysctl {rel:?}: only plain paths under net/ are allowed (like net/ipv4/ip_forward)"
        )));
    }
    Ok(PathBuf::from(ROOT).join(rel))
}

/// Writes a sysctl (`rel` like `net/ipv4/ip_forward`) in the calling thread's namespace.
pub fn set(rel: &str, value: &str) -> Result<()> {
    let path = full_path(rel)?;
    let write = || -> io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
        f.write_all(value.as_bytes())
    };
    write().map_err(|e| Error { code: code::NETWORK, ..Error::io(format_args!("set sysctl {rel} to {value:?}"), &e) })
}

/// Reads a sysctl, trimmed, in the calling thread's namespace.
pub fn get(rel: &str) -> Result<String> {
    let path = full_path(rel)?;
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| Error { code: code::NETWORK, ..Error::io(format_args!("read sysctl {rel}"), &e) })
}

/// Writes a sysctl only if it differs (saves a write, and works on a read-only value that
/// already has the wanted setting).
pub fn ensure(rel: &str, value: &str) -> Result<()> {
    if get(rel)? == value {
        return Ok(());
    }
    set(rel, value)
}

/// Writes a sysctl inside `ns`, entering it on this thread only for the write.
pub fn set_in(ns: &NetNs, rel: &str, value: &str) -> Result<()> {
    ns.run(|| set(rel, value))?
}

/// Reads a sysctl inside `ns`.
pub fn get_in(ns: &NetNs, rel: &str) -> Result<String> {
    ns.run(|| get(rel))?
}

/// `net/<family>/conf/<ifname>/<key>`; `ifname` may also be `all` or `default`.
pub fn if_path(ifname: &str, family: Family, key: &str) -> Result<String> {
    if !crate::valid_ifname(ifname) {
        return Err(Error::new(code::INVALID_CONFIG, format!("sysctl for interface {ifname:?}: invalid name")));
    }
    if key.is_empty() || key.contains('/') || key == "." || key == ".." {
        return Err(Error::config(format!("sysctl key {key:?} for {ifname}: invalid key")));
    }
    Ok(format!("net/{}/conf/{ifname}/{key}", family.sysctl_dir()))
}

/// Writes a per-interface sysctl, e.g. `set_if("eth0", Family::V6, "accept_dad", "0")`.
pub fn set_if(ifname: &str, family: Family, key: &str, value: &str) -> Result<()> {
    set(&if_path(ifname, family, key)?, value)
}

/// Reads a per-interface sysctl.
pub fn get_if(ifname: &str, family: Family, key: &str) -> Result<String> {
    get(&if_path(ifname, family, key)?)
}

/// Whether IPv6 is unavailable in the calling thread's namespace: no IPv6 support in the kernel,
/// or `net.ipv6.conf.all.disable_ipv6=1`.
pub fn ipv6_disabled() -> bool {
    match get("net/ipv6/conf/all/disable_ipv6") {
        Ok(v) => v == "1",
        Err(_) => true,
    }
}

/// Turns on forwarding for a family (`net.ipv4.ip_forward` / `net.ipv6.conf.all.forwarding`),
/// writing only if it is off.
pub fn enable_forwarding(family: Family) -> Result<()> {
    match family {
        Family::V4 => ensure("net/ipv4/ip_forward", "1"),
        Family::V6 => ensure("net/ipv6/conf/all/forwarding", "1"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_confined_to_net() {
        assert_eq!(full_path("net/ipv4/ip_forward").unwrap(), PathBuf::from("/proc/sys/net/ipv4/ip_forward"));
        assert_eq!(
            full_path("/proc/sys/net/ipv4/conf/br0.100/rp_filter").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/br0.100/rp_filter")
        );
        for bad in ["kernel/hostname", "net/../kernel/hostname", "net//x", "net/./x", ""] {
            let e = full_path(bad).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG, "{bad}");
        }
        assert!(full_path("net/ipv4").is_ok());
        assert!(if_path("../x", Family::V4, "rp_filter").is_err());
        assert!(if_path("eth0", Family::V4, "../../x").is_err());
        assert_eq!(if_path("eth0", Family::V6, "accept_dad").unwrap(), "net/ipv6/conf/eth0/accept_dad");
    }
}
