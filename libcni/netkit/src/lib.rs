//! Kernel plumbing for the plugins: network namespace handles and guards, rtnetlink (links, bridges,
//! veths, addresses, routes, bridge VLANs), sysctls, and the steps interface plugins share ([`iface`]).
//!
//! Every failure is a [`libcni::Error`] whose message names the object and ends with the OS error
//! text, e.g. `create veth veth1a2b3c4d (peer eth0): File exists (os error 17)`, and which carries
//! that OS error number as data ([`libcni::Error::errno`], set by [`libcni::Error::os`] and
//! [`libcni::Error::io`]). Callers that must tell "already there" or "not there" apart (DEL is
//! idempotent) use [`errno`], [`is_exists`] and [`is_not_found`]; `Error::context` keeps the number.

pub mod fake;
mod family;
pub mod firewall;
pub mod iface;
mod mac;
pub mod netlink;
pub mod netns;
mod nlsock;
pub mod saved;
pub mod sysctl;
pub mod tuntap;

pub use family::Family;
pub use mac::{format_mac, parse_mac, parse_unicast_mac, BadMac, Mac};
pub use netlink::{Address, BridgeVlan, Link, Netlink, RouteSpec};
pub use netns::{container_netns, container_netns_for_del, NetNs, NsGuard};

use libcni::Error;

/// The OS error number an error of ours was made from, if any (kept as data, never read back
/// from the message).
pub fn errno(err: &Error) -> Option<i32> {
    err.errno
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

/// A valid Linux interface name ([`libcni::skel::validate_ifname`]'s rules).
pub fn valid_ifname(name: &str) -> bool {
    libcni::skel::validate_ifname(name).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use libcni::code;

    #[test]
    fn errno_is_data_and_survives_context() {
        let e = Error::os(libc::EEXIST, "create veth v1");
        assert_eq!(e.msg, "create veth v1: File exists (os error 17)");
        assert_eq!(errno(&e), Some(17));
        assert!(is_exists(&e));
        assert!(!is_not_found(&e));
        let e = e.context("bridge ADD");
        assert!(is_exists(&e));
        assert!(is_not_found(&Error::os(libc::ENODEV, "delete link v1")));
        // The number is the error's, not whatever a message happens to end with.
        let e = Error::os(libc::ENOENT, "open netns /x").context("DEL (os error 17)");
        assert!(is_not_found(&e) && !is_exists(&e));
        let e = Error::io("stat /x", &std::io::Error::from_raw_os_error(libc::ENOENT));
        assert!(is_not_found(&e));
        assert_eq!(errno(&Error::new(code::NETWORK, "something else")), None);
    }

    #[test]
    fn errno_is_never_read_from_the_text() {
        let e = Error::new(code::NETWORK, "nft add table: File exists (os error 17)");
        assert_eq!(errno(&e), None);
        assert!(!is_exists(&e));
    }

    #[test]
    fn errors_finish_keeps_the_first_errors_code_and_errno() {
        let mut errs = libcni::Errors::new();
        errs.push(Error::os(libc::EPERM, "delete link v1").context("DEL"));
        errs.push(Error::io("read /x", &std::io::Error::from_raw_os_error(libc::ENOENT)));
        let e = errs.finish().unwrap_err();
        assert_eq!(e.code, code::NETWORK);
        assert_eq!(errno(&e), Some(libc::EPERM), "{e}");
        assert!(!is_not_found(&e), "{e}");
        assert!(e.msg.ends_with("read /x: No such file or directory (os error 2)"), "{e}");
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
        // A control character: the kernel's dev_valid_name takes it, but `ip` and every log line
        // would show a name that is not what was asked; CNI_IFNAME refuses it too, so config keys do.
        assert!(!valid_ifname("eth\u{7}0"));
        assert!(!valid_ifname("eth\u{1b}[0m"));
    }
}
