//! Whether an address belongs to a network the node is on, for a plugin that puts a gateway or a
//! route on a host interface (bridge, ptp). An address on a host interface makes the node answer
//! ARP for it (IPv4, on every link) and take every packet sent to it as its own; a host route to a
//! pod address sends the node's packets for that address to the pod. So a gateway or a pod address
//! taken from a slice of the node's LAN would take over the LAN router's or another host's traffic
//! (DESIGN rule 11): the plugin asks here first and refuses such an address.
//!
//! The answer is the route the kernel itself picks for the address (policy rules, then the longest
//! prefix: `ip route get <addr> fibmatch`): the address is the node's ([`Reach::Local`], on the
//! link the route names, the first to have taken it) or the node reaches it directly through a link
//! ([`Reach::OnLink`]: a route with no gateway, a default route excepted, which would make every
//! address one). Which links are the plugin's own is the plugin's to say. One lookup per address:
//! the cost does not grow with the pods on the node, where dumping every address and route would
//! (three of each per ptp pod).

use crate::netlink::Netlink;
use ipnetwork::IpNetwork;
use libcni::Result;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;

/// How the node reaches an address that belongs to one of its networks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reach {
    /// The address is the node's, held by link `oif`.
    Local { oif: u32 },
    /// The node reaches it directly through link `oif`, on the network `dst`.
    OnLink { dst: IpNetwork, oif: u32 },
}

impl Reach {
    /// The link the answer names.
    pub fn oif(&self) -> u32 {
        match self {
            Reach::Local { oif, .. } | Reach::OnLink { oif, .. } => *oif,
        }
    }
}

/// Lookups in the calling thread's network namespace (the host's).
pub struct HostNets {
    nl: Netlink,
    names: RefCell<HashMap<u32, String>>,
}

impl HostNets {
    pub fn open() -> Result<HostNets> {
        Ok(HostNets { nl: Netlink::open()?, names: RefCell::default() })
    }

    /// How the node reaches `addr` when it is on one of the node's networks; `None` when the
    /// node reaches it through a gateway, by a default route alone, or not at all.
    pub fn reach(&self, addr: IpAddr) -> Result<Option<Reach>> {
        let Some(m) = self.nl.fib_match(addr)? else { return Ok(None) };
        let Some(oif) = m.oif else { return Ok(None) };
        Ok(match (m.local, m.gw) {
            (true, _) => Some(Reach::Local { oif }),
            (false, None) if m.dst.prefix() > 0 => Some(Reach::OnLink { dst: m.dst, oif }),
            _ => None,
        })
    }

    /// The name of link `index`, for messages and for a plugin to tell its own links; `index N`
    /// when the link is gone.
    pub fn link_name(&self, index: u32) -> String {
        if let Some(name) = self.names.borrow().get(&index) {
            return name.clone();
        }
        let name = index_to_name(index).unwrap_or_else(|| format!("index {index}"));
        self.names.borrow_mut().insert(index, name.clone());
        name
    }

    /// A reach in words, for messages: `an address of the node (on lan0)` or `on
    /// 192.168.77.0/24, a network of the node on lan0`.
    pub fn describe(&self, reach: &Reach) -> String {
        match reach {
            Reach::Local { oif, .. } => format!("an address of the node (on {})", self.link_name(*oif)),
            Reach::OnLink { dst, oif } => format!("on {dst}, a network of the node on {}", self.link_name(*oif)),
        }
    }
}

/// The kernel's name for link `index` in the calling thread's namespace (SIOCGIFNAME).
fn index_to_name(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname requires; it writes a NUL-terminated
    // name there on success and returns NULL on failure.
    let out = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if out.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}
