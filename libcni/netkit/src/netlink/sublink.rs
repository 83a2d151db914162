//! Links made on a master link (a parent): macvlan and ipvlan. Created directly in another
//! namespace (IFLA_NET_NS_FD) so the new link never lives where its master does, and read back
//! with their kind and mode for CHECK.

use super::Netlink;
use crate::netns::NetNs;
use libcni::Result;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    InfoData, InfoIpVlan, InfoKind, InfoMacVlan, IpVlanMode, LinkAttribute, LinkInfo, LinkMessage, MacVlanMode,
};
use netlink_packet_route::RouteNetlinkMessage;
use std::os::fd::AsRawFd;

/// A macvlan's mode (`ip link add ... type macvlan mode M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacvlanMode {
    Bridge,
    Private,
    Vepa,
    Passthru,
}

/// An ipvlan's mode (`ip link add ... type ipvlan mode M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpvlanMode {
    L2,
    L3,
    L3s,
}

impl MacvlanMode {
    pub const NAMES: &'static str = "bridge, private, vepa or passthru";

    /// The mode a configuration names, spelled as the reference accepts it (lower case).
    pub fn parse(s: &str) -> Option<MacvlanMode> {
        Some(match s {
            "bridge" => MacvlanMode::Bridge,
            "private" => MacvlanMode::Private,
            "vepa" => MacvlanMode::Vepa,
            "passthru" => MacvlanMode::Passthru,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            MacvlanMode::Bridge => "bridge",
            MacvlanMode::Private => "private",
            MacvlanMode::Vepa => "vepa",
            MacvlanMode::Passthru => "passthru",
        }
    }

    fn to_netlink(self) -> MacVlanMode {
        match self {
            MacvlanMode::Bridge => MacVlanMode::Bridge,
            MacvlanMode::Private => MacVlanMode::Private,
            MacvlanMode::Vepa => MacVlanMode::Vepa,
            MacvlanMode::Passthru => MacVlanMode::Passthrough,
        }
    }

    fn from_netlink(m: MacVlanMode) -> Option<MacvlanMode> {
        Some(match m {
            MacVlanMode::Bridge => MacvlanMode::Bridge,
            MacVlanMode::Private => MacvlanMode::Private,
            MacVlanMode::Vepa => MacvlanMode::Vepa,
            MacVlanMode::Passthrough => MacvlanMode::Passthru,
            _ => return None,
        })
    }
}

impl IpvlanMode {
    pub const NAMES: &'static str = "l2, l3 or l3s";

    pub fn parse(s: &str) -> Option<IpvlanMode> {
        Some(match s {
            "l2" => IpvlanMode::L2,
            "l3" => IpvlanMode::L3,
            "l3s" => IpvlanMode::L3s,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            IpvlanMode::L2 => "l2",
            IpvlanMode::L3 => "l3",
            IpvlanMode::L3s => "l3s",
        }
    }

    fn to_netlink(self) -> IpVlanMode {
        match self {
            IpvlanMode::L2 => IpVlanMode::L2,
            IpvlanMode::L3 => IpVlanMode::L3,
            IpvlanMode::L3s => IpVlanMode::L3S,
        }
    }

    fn from_netlink(m: IpVlanMode) -> Option<IpvlanMode> {
        Some(match m {
            IpVlanMode::L2 => IpvlanMode::L2,
            IpVlanMode::L3 => IpvlanMode::L3,
            IpVlanMode::L3S => IpvlanMode::L3s,
            _ => return None,
        })
    }
}

/// What kind of link to make on a master, with the kind's own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubLink {
    /// `bc_queue_len`: the broadcast/multicast queue length (IFLA_MACVLAN_BC_QUEUE_LEN); `None`
    /// leaves the kernel's default.
    Macvlan {
        mode: MacvlanMode,
        bc_queue_len: Option<u32>,
    },
    Ipvlan {
        mode: IpvlanMode,
    },
}

impl SubLink {
    /// The kind as the kernel and `ip` name it.
    pub fn kind(&self) -> &'static str {
        match self {
            SubLink::Macvlan { .. } => "macvlan",
            SubLink::Ipvlan { .. } => "ipvlan",
        }
    }

    /// The mode's name (`bridge`, `l2`, ...).
    pub fn mode_name(&self) -> &'static str {
        match self {
            SubLink::Macvlan { mode, .. } => mode.name(),
            SubLink::Ipvlan { mode } => mode.name(),
        }
    }

    fn info(&self) -> Vec<LinkInfo> {
        match self {
            SubLink::Macvlan { mode, bc_queue_len } => {
                let mut data = vec![InfoMacVlan::Mode(mode.to_netlink())];
                data.extend(bc_queue_len.map(InfoMacVlan::BcQueueLen));
                vec![LinkInfo::Kind(InfoKind::MacVlan), LinkInfo::Data(InfoData::MacVlan(data))]
            }
            SubLink::Ipvlan { mode } => vec![
                LinkInfo::Kind(InfoKind::IpVlan),
                LinkInfo::Data(InfoData::IpVlan(vec![InfoIpVlan::Mode(mode.to_netlink())])),
            ],
        }
    }

    /// The kind and mode a link message reports; `None` for other kinds. A macvlan's
    /// `bc_queue_len` is reported as the kernel holds it.
    fn from_message(msg: &LinkMessage) -> Option<SubLink> {
        let infos = msg.attributes.iter().find_map(|a| match a {
            LinkAttribute::LinkInfo(infos) => Some(infos),
            _ => None,
        })?;
        infos.iter().find_map(|info| match info {
            LinkInfo::Data(InfoData::MacVlan(data)) => {
                let mode = data.iter().find_map(|d| match d {
                    InfoMacVlan::Mode(m) => MacvlanMode::from_netlink(*m),
                    _ => None,
                })?;
                let bc_queue_len = data.iter().find_map(|d| match d {
                    InfoMacVlan::BcQueueLen(n) => Some(*n),
                    _ => None,
                });
                Some(SubLink::Macvlan { mode, bc_queue_len })
            }
            LinkInfo::Data(InfoData::IpVlan(data)) => data.iter().find_map(|d| match d {
                InfoIpVlan::Mode(m) => IpvlanMode::from_netlink(*m).map(|mode| SubLink::Ipvlan { mode }),
                _ => None,
            }),
            _ => None,
        })
    }
}

impl Netlink {
    /// Creates `sub` named `name` on the link `master` (an index in this connection's namespace),
    /// directly in `ns`, down. `mtu` and `mac` apply when given, else the kernel's defaults (the
    /// master's MTU, a random MAC; an ipvlan takes its master's MAC).
    pub fn create_sublink(
        &self,
        name: &str,
        master: u32,
        sub: &SubLink,
        ns: &NetNs,
        mtu: Option<u32>,
        mac: Option<crate::Mac>,
    ) -> Result<()> {
        super::link::check_ifname(sub.kind(), name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Link(master));
        msg.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = mac {
            msg.attributes.push(LinkAttribute::Address(mac.octets().to_vec()));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(sub.info()));
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL).map_err(|f| {
            f.into_error(format_args!(
                "create {} {name} ({} mode) on {} into {}",
                sub.kind(),
                sub.mode_name(),
                self.describe(master),
                ns.path().display()
            ))
        })
    }

    /// The kind and mode of link `index` when it is a macvlan or an ipvlan; `None` for another
    /// kind or no such link.
    pub fn sublink(&self, index: u32) -> Result<Option<SubLink>> {
        let mut req = LinkMessage::default();
        req.header.index = index;
        match self.get_one(RouteNetlinkMessage::GetLink(req)) {
            Ok(Some(RouteNetlinkMessage::NewLink(m))) => Ok(SubLink::from_message(&m)),
            Ok(_) | Err(super::RequestFailure::Errno(libc::ENODEV, _)) => Ok(None),
            Err(f) => Err(f.into_error(format_args!("get link index {index}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_names_round_trip() {
        for m in [MacvlanMode::Bridge, MacvlanMode::Private, MacvlanMode::Vepa, MacvlanMode::Passthru] {
            assert_eq!(MacvlanMode::parse(m.name()), Some(m));
            assert_eq!(MacvlanMode::from_netlink(m.to_netlink()), Some(m));
        }
        for m in [IpvlanMode::L2, IpvlanMode::L3, IpvlanMode::L3s] {
            assert_eq!(IpvlanMode::parse(m.name()), Some(m));
            assert_eq!(IpvlanMode::from_netlink(m.to_netlink()), Some(m));
        }
        // The reference's spelling only: lower case, no aliases.
        for bad in ["Bridge", "passthrough", "source", ""] {
            assert_eq!(MacvlanMode::parse(bad), None, "{bad}");
        }
        assert_eq!(IpvlanMode::parse("L2"), None);
    }
}
