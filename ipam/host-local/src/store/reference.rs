//! The reference host-local's on-disk format, which ours reads and writes byte for byte. In
//! `<dataDir>/<network>`:
//! - `<ip>`: one file per reserved address, named by the address, holding `<containerID>\r\n<ifname>`
//!   (or just `<containerID>`, as old versions of the reference wrote it);
//! - `last_reserved_ip.<set>`: the address a range set last handed out (the round-robin cursor);
//! - `lock`: the file both plugins flock around every change.
//!
//! The reference parses every name in the directory as an address and skips what does not parse, so any
//! other file of ours (the scan cache, temporary files) is named so that it never parses.

use libcni::{Error, Result};
use std::net::IpAddr;

/// What the reference writes between the container ID and the interface name.
pub const LINE_BREAK: &str = "\r\n";
/// The lock file of a network directory.
pub(super) const LOCK_FILE: &str = "lock";
const LAST_RESERVED_PREFIX: &str = "last_reserved_ip.";

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

/// The content of the reservation file of an attachment, as the reference writes it.
pub(super) fn reservation_content(container_id: &str, ifname: &str) -> String {
    format!("{}{LINE_BREAK}{ifname}", container_id.trim())
}

/// The name of the reservation file of `ip` (Go's `net.IP.String()` and ours agree on every address).
pub(super) fn reservation_file(ip: IpAddr) -> String {
    ip.to_string()
}

/// The address a directory entry reserves, if its name is an address (an IPv4-mapped IPv6 address is
/// the IPv4 address, as Go's `net.ParseIP` makes it). Leading zeros in an IPv4 octet are refused by
/// both parsers.
pub(super) fn reserved_address(name: &str) -> Option<IpAddr> {
    name.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// The round-robin cursor file of a range set.
pub(super) fn cursor_file(set_index: usize) -> String {
    format!("{LAST_RESERVED_PREFIX}{set_index}")
}

/// The address in a cursor file, if it parses.
pub(super) fn parse_cursor(content: &str) -> Option<IpAddr> {
    content.trim().parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Defensive re-check of a network name before it becomes a path component (skel validated it already).
pub(super) fn check_network_name(network: &str) -> Result<()> {
    if network.is_empty() || network == "." || network == ".." || network.contains(['/', '\0']) {
        return Err(Error::config(format!("network name {network:?} cannot be used as a directory name")));
    }
    Ok(())
}
