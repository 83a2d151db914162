//! Interface addresses.

use super::{address_family, BatchOp, Netlink, RequestFailure};
use crate::Family;
use ipnetwork::{IpNetwork, Ipv4Network};
use libcni::{Error, Result};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// An address with what the kernel says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub net: IpNetwork,
    pub index: u32,
    /// RT_SCOPE_*: 0 universe, 253 link, 254 host.
    pub scope: u8,
    /// IFA_F_* flags.
    pub flags: u32,
}

impl Address {
    /// IPv6 duplicate address detection has not finished yet.
    pub fn tentative(&self) -> bool {
        self.flags & libc::IFA_F_TENTATIVE != 0
    }

    /// IPv6 duplicate address detection found another host with this address.
    pub fn dad_failed(&self) -> bool {
        self.flags & libc::IFA_F_DADFAILED != 0
    }

    fn from_message(msg: &AddressMessage) -> Option<Address> {
        let mut local = None;
        let mut address = None;
        let mut flags = u32::from(msg.header.flags.bits());
        for attr in &msg.attributes {
            match attr {
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Address(ip) => address = Some(*ip),
                AddressAttribute::Flags(f) => flags = f.bits(),
                _ => {}
            }
        }
        let ip = local.or(address)?;
        let net = IpNetwork::new(ip, msg.header.prefix_len).ok()?;
        Some(Address { net, index: msg.header.index, scope: msg.header.scope.into(), flags })
    }
}

/// An address as the kernel listed it, to give back to its link once it lost it (a link that
/// leaves its namespace loses every address).
#[derive(Debug, Clone)]
pub struct RawAddress {
    msg: AddressMessage,
}

/// The IFA_F_* flags a request may set (the others are the kernel's to report).
const SETTABLE_FLAGS: u32 = libc::IFA_F_NODAD
    | libc::IFA_F_OPTIMISTIC
    | libc::IFA_F_HOMEADDRESS
    | libc::IFA_F_MANAGETEMPADDR
    | libc::IFA_F_NOPREFIXROUTE
    | libc::IFA_F_MCAUTOJOIN;

impl RawAddress {
    pub fn details(&self) -> Option<Address> {
        Address::from_message(&self.msg)
    }

    /// Set by hand or by the kernel for the link itself (an IPv6 link-local), not learnt with a
    /// lifetime (SLAAC, a temporary address), which the kernel makes again by itself.
    pub fn permanent(&self) -> bool {
        self.details().is_some_and(|a| a.flags & libc::IFA_F_PERMANENT != 0)
    }

    /// The request that adds it to link `index` as listed: prefix, scope, peer, broadcast, label,
    /// metric, protocol and the flags a request may set; without lifetimes.
    fn add_message(&self, index: u32) -> AddressMessage {
        let mut msg = self.msg.clone();
        msg.header.index = index;
        let flags = self.details().map_or(0, |a| a.flags) & SETTABLE_FLAGS;
        msg.header.flags = AddressHeaderFlags::from_bits_truncate((flags & 0xff) as u8);
        msg.attributes.retain(|a| {
            matches!(
                a,
                AddressAttribute::Address(_)
                    | AddressAttribute::Local(_)
                    | AddressAttribute::Label(_)
                    | AddressAttribute::Broadcast(_)
                    | AddressAttribute::RoutePriority(_)
                    | AddressAttribute::Protocol(_)
            )
        });
        msg.attributes.push(AddressAttribute::Flags(AddressFlags::from_bits_retain(flags)));
        msg
    }
}

impl std::fmt::Display for RawAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.details() {
            Some(a) => write!(f, "{}", a.net),
            None => f.write_str("?"),
        }
    }
}

fn address_message(index: u32, net: IpNetwork) -> AddressMessage {
    let mut msg = AddressMessage::default();
    msg.header.index = index;
    msg.header.prefix_len = net.prefix();
    msg.header.family = match net {
        IpNetwork::V4(_) => AddressFamily::Inet,
        IpNetwork::V6(_) => AddressFamily::Inet6,
    };
    msg.attributes.push(AddressAttribute::Local(net.ip()));
    msg.attributes.push(AddressAttribute::Address(net.ip()));
    msg
}

impl Netlink {
    /// The addresses of a link (both families), as `ip/prefix`.
    pub fn addresses(&self, index: u32) -> Result<Vec<IpNetwork>> {
        Ok(self.address_details(index, None)?.into_iter().map(|a| a.net).collect())
    }

    /// The addresses of a link with scope and flags, of `family` (`None`: both); `index` 0 lists
    /// every link's.
    pub fn address_details(&self, index: u32, family: impl Into<Option<Family>>) -> Result<Vec<Address>> {
        let mut req = AddressMessage::default();
        req.header.family = address_family(family.into());
        req.header.index = index;
        let msgs = self
            .dump(RouteNetlinkMessage::GetAddress(req))
            .map_err(|f| f.into_error(format_args!("list addresses of index {index}")))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) => Address::from_message(a),
                _ => None,
            })
            .filter(|a| index == 0 || a.index == index)
            .collect())
    }

    /// The addresses of link `index` as the kernel lists them (both families), for
    /// [`Netlink::restore_address`].
    pub fn raw_addresses(&self, index: u32) -> Result<Vec<RawAddress>> {
        let mut req = AddressMessage::default();
        req.header.index = index;
        let msgs = self
            .dump(RouteNetlinkMessage::GetAddress(req))
            .map_err(|f| f.into_error(format_args!("list addresses of index {index}")))?;
        Ok(msgs
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(msg) if msg.header.index == index => Some(RawAddress { msg }),
                _ => None,
            })
            .collect())
    }

    /// Adds `addr`, as [`Netlink::raw_addresses`] listed it, to link `index`. One already there
    /// fails with EEXIST ([`crate::is_exists`]); the caller decides.
    pub fn restore_address(&self, index: u32, addr: &RawAddress) -> Result<()> {
        self.ack(RouteNetlinkMessage::NewAddress(addr.add_message(index)), NLM_F_CREATE | NLM_F_EXCL)
            .map_err(|f| f.into_error(format_args!("restore address {addr} on {}", self.describe(index))))
    }

    /// Adds an address (`ip addr add`). IPv4 gets the subnet's broadcast address as the
    /// reference plugins set it. `nodad` skips IPv6 duplicate address detection. An address that
    /// is already there fails with EEXIST ([`crate::is_exists`]); the caller decides.
    pub fn add_address(&self, index: u32, net: IpNetwork, nodad: bool) -> Result<()> {
        self.run(Netlink::add_address_op(index, net, nodad))
    }

    /// [`Netlink::add_address`] as a request of a [`Netlink::batch`].
    pub fn add_address_op(index: u32, net: IpNetwork, nodad: bool) -> BatchOp {
        let mut msg = address_message(index, net);
        msg.header.scope = match net.ip() {
            IpAddr::V4(ip) if ip.is_loopback() => AddressScope::Host,
            _ => AddressScope::Universe,
        };
        if let IpNetwork::V4(v4) = net {
            if v4.prefix() < 31 {
                if let Ok(n) = Ipv4Network::new(v4.network(), v4.prefix()) {
                    msg.attributes.push(AddressAttribute::Broadcast(n.broadcast()));
                }
            }
        }
        if nodad && net.is_ipv6() {
            msg.header.flags |= AddressHeaderFlags::Nodad;
            msg.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        BatchOp::new(RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | NLM_F_EXCL, move |nl| {
            format!("add address {net} to {}", nl.describe(index))
        })
    }

    /// Removes an address; `Ok(false)` if it was not there.
    pub fn del_address(&self, index: u32, net: IpNetwork) -> Result<bool> {
        match self.ack(RouteNetlinkMessage::DelAddress(address_message(index, net)), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::EADDRNOTAVAIL | libc::ENODEV, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete address {net} from {}", self.describe(index)))),
        }
    }

    /// Waits until no IPv6 address of the link is tentative; fails if DAD found a duplicate or
    /// after `timeout`.
    pub fn wait_dad(&self, index: u32, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let addrs = self.address_details(index, Family::V6)?;
            if let Some(a) = addrs.iter().find(|a| a.dad_failed()) {
                return Err(Error::network(format!(
                    "address {} on {}: duplicate address detected",
                    a.net,
                    self.describe(index)
                )));
            }
            if !addrs.iter().any(Address::tentative) {
                return Ok(());
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::network(format!(
                    "addresses on {} still tentative after {} ms",
                    self.describe(index),
                    elapsed.as_millis()
                )));
            }
            std::thread::sleep(pause.min(timeout - elapsed));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use netlink_packet_route::address::CacheInfo;

    /// A listed address given back: its label and the flags a request may set, not the kernel's
    /// own flags (secondary, tentative, permanent) nor its lifetimes.
    #[test]
    fn an_address_given_back_carries_only_what_a_request_may_set() {
        let mut msg = address_message(3, "10.1.0.8/24".parse().unwrap());
        msg.header.flags = AddressHeaderFlags::Secondary | AddressHeaderFlags::Permanent;
        let listed = libc::IFA_F_SECONDARY | libc::IFA_F_PERMANENT | libc::IFA_F_NOPREFIXROUTE | libc::IFA_F_TENTATIVE;
        msg.attributes.push(AddressAttribute::Flags(AddressFlags::from_bits_retain(listed)));
        msg.attributes.push(AddressAttribute::Label("hd0:x".into()));
        msg.attributes.push(AddressAttribute::CacheInfo(CacheInfo::default()));
        let raw = RawAddress { msg };
        assert!(raw.permanent());
        let back = raw.add_message(9);
        assert_eq!(back.header.index, 9);
        assert!(back.header.flags.is_empty());
        assert!(back.attributes.contains(&AddressAttribute::Label("hd0:x".into())));
        assert!(back.attributes.contains(&AddressAttribute::Flags(AddressFlags::Noprefixroute)));
        assert!(!back.attributes.iter().any(|a| matches!(a, AddressAttribute::CacheInfo(_))));
    }
}
