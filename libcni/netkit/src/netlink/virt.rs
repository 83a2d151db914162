//! Virtual links made for a pod: dummy, VLAN and VRF devices, and the kind-specific data the kernel
//! reports about them (a VLAN's id, a VRF's table).

use super::{Netlink, RequestFailure};
use crate::netns::NetNs;
use libcni::Result;
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{InfoData, InfoKind, InfoVlan, InfoVrf, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::RouteNetlinkMessage;
use std::os::fd::AsRawFd;

/// The kind of virtual link [`Netlink::create_link`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewLink {
    Dummy,
    /// An 802.1Q sub-interface of link `parent` (an index in the namespace the request is sent in).
    Vlan {
        parent: u32,
        id: u16,
    },
    /// A VRF device bound to routing table `table`.
    Vrf {
        table: u32,
    },
}

impl NewLink {
    fn kind_name(&self) -> &'static str {
        match self {
            NewLink::Dummy => "dummy",
            NewLink::Vlan { .. } => "vlan",
            NewLink::Vrf { .. } => "vrf",
        }
    }

    /// The kernel module a kernel without this link kind lacks.
    fn module(&self) -> &'static str {
        match self {
            NewLink::Dummy => "dummy",
            NewLink::Vlan { .. } => "8021q",
            NewLink::Vrf { .. } => "vrf",
        }
    }

    fn info(&self) -> Vec<LinkInfo> {
        match *self {
            NewLink::Dummy => vec![LinkInfo::Kind(InfoKind::Dummy)],
            NewLink::Vlan { id, .. } => {
                vec![LinkInfo::Kind(InfoKind::Vlan), LinkInfo::Data(InfoData::Vlan(vec![InfoVlan::Id(id)]))]
            }
            NewLink::Vrf { table } => {
                vec![LinkInfo::Kind(InfoKind::Vrf), LinkInfo::Data(InfoData::Vrf(vec![InfoVrf::TableId(table)]))]
            }
        }
    }
}

impl Netlink {
    /// Creates link `name` of `kind`, down, with `mtu` if given; in `ns` when given (IFLA_NET_NS_FD:
    /// the link never appears here), else in this connection's namespace. A kernel without the
    /// link kind answers EOPNOTSUPP; the error then names the module it lacks.
    ///
    /// The kernel looks `name` up in the namespace the request is sent in before creating anything
    /// (an existing link of that name turns the request into a change, refused by NLM_F_EXCL): a
    /// link created from the host for a pod needs a name free on the host too
    /// ([`crate::iface::inpod::create_renamed`]).
    pub fn create_link(&self, name: &str, kind: NewLink, mtu: Option<u32>, ns: Option<&NetNs>) -> Result<()> {
        super::link::check_ifname(kind.kind_name(), name)?;
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        if let NewLink::Vlan { parent, .. } = kind {
            msg.attributes.push(LinkAttribute::Link(parent));
        }
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(ns) = ns {
            msg.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(kind.info()));
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL).map_err(|f| {
            let unsupported = f.errno() == Some(libc::EOPNOTSUPP);
            let e = f.into_error(format_args!("create {} link {name}", kind.kind_name()));
            if unsupported {
                e.with_details(format!(
                    "the kernel has no {} links: load the {} module",
                    kind.kind_name(),
                    kind.module()
                ))
            } else {
                e
            }
        })
    }

    fn info_data(&self, index: u32) -> Result<Vec<InfoData>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        let answer = match self.get_one(RouteNetlinkMessage::GetLink(msg)) {
            Ok(Some(RouteNetlinkMessage::NewLink(m))) => m,
            Ok(_) | Err(RequestFailure::Errno(libc::ENODEV, _)) => return Ok(Vec::new()),
            Err(f) => return Err(f.into_error(format_args!("get link index {index}"))),
        };
        let mut out = Vec::new();
        for attr in answer.attributes {
            if let LinkAttribute::LinkInfo(infos) = attr {
                out.extend(infos.into_iter().filter_map(|i| match i {
                    LinkInfo::Data(d) => Some(d),
                    _ => None,
                }));
            }
        }
        Ok(out)
    }

    /// The VLAN id of link `index`; `None` if it is not a VLAN (or is gone).
    pub fn vlan_id(&self, index: u32) -> Result<Option<u16>> {
        Ok(self.info_data(index)?.iter().find_map(|d| match d {
            InfoData::Vlan(v) => v.iter().find_map(|a| match a {
                InfoVlan::Id(id) => Some(*id),
                _ => None,
            }),
            _ => None,
        }))
    }

    /// The routing table of VRF `index`; `None` if it is not a VRF (or is gone).
    pub fn vrf_table(&self, index: u32) -> Result<Option<u32>> {
        Ok(self.info_data(index)?.iter().find_map(|d| match d {
            InfoData::Vrf(v) => v.iter().find_map(|a| match a {
                InfoVrf::TableId(t) => Some(*t),
                _ => None,
            }),
            _ => None,
        }))
    }
}
