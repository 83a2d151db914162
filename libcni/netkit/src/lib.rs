//! Kernel plumbing for the plugins: network namespace handles and guards, rtnetlink (links, bridges,
//! veths, addresses, routes, bridge VLANs) and sysctls.
//!
//! Every failure is a [`libcni::Error`] whose message names the object and ends with the OS error
//! text, e.g. `create veth veth1a2b3c4d (peer eth0): File exists (os error 17)`. Callers that must
//! tell "already there" or "not there" apart (DEL is idempotent) use [`errno`], [`is_exists`] and
//! [`is_not_found`], which read that suffix; `Error::context` keeps it intact.

pub mod firewall;
pub mod netlink;
pub mod netns;
pub mod sysctl;

pub use netlink::{format_mac, parse_mac, Address, BridgeVlan, IpFamily, Link, Netlink, RouteSpec};
pub use netns::{container_netns, container_netns_for_del, NetNs, NsGuard};

use libcni::Error;

/// The OS error number an error of ours was made from, if any.
pub fn errno(err: &Error) -> Option<i32> {
    let rest = err.msg.strip_suffix(')')?;
    let start = rest.rfind("(os error ")?;
    rest[start + "(os error ".len()..].parse().ok()
}

/// The object already exists (EEXIST): a link, an address, a route.
pub fn is_exists(err: &Error) -> bool {
    errno(err) == Some(libc::EEXIST)
}

/// The object is not there: a netns path (ENOENT), a link (ENODEV), a route (ESRCH), an address
/// (EADDRNOTAVAIL), a sysctl file (ENOENT).
pub fn is_not_found(err: &Error) -> bool {
    matches!(errno(err), Some(libc::ENOENT | libc::ENODEV | libc::ESRCH | libc::ENXIO | libc::EADDRNOTAVAIL))
}

/// A valid Linux interface name: 1..=15 bytes, not `.`/`..`, no `/`, `:` or whitespace.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name.chars().any(|c| c == '/' || c == ':' || c.is_whitespace() || c == '\0')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use libcni::code;

    #[test]
    fn errno_is_read_from_the_message_suffix() {
        let e = Error::new(code::NETWORK, "create veth v1: File exists (os error 17)");
        assert_eq!(errno(&e), Some(17));
        assert!(is_exists(&e));
        assert!(!is_not_found(&e));
        let e = e.context("bridge ADD");
        assert!(is_exists(&e));
        let e = Error::new(code::NETWORK, "delete link v1: No such device (os error 19)");
        assert!(is_not_found(&e));
        assert_eq!(errno(&Error::new(code::NETWORK, "something else")), None);
        assert_eq!(errno(&Error::new(code::NETWORK, "x (os error abc)")), None);
    }

    #[test]
    fn interface_names() {
        assert!(valid_ifname("eth0"));
        assert!(valid_ifname("br0.100"));
        assert!(valid_ifname("123456789012345"));
        assert!(!valid_ifname("1234567890123456"));
        assert!(!valid_ifname(""));
        assert!(!valid_ifname(".."));
        assert!(!valid_ifname("a/b"));
        assert!(!valid_ifname("a b"));
    }
}
