//! Links: lookup, bridges, veth pairs, link attributes, bridge ports and bridge VLANs.

use super::{BatchOp, Netlink, RequestFailure};
use crate::netns::NetNs;
use crate::Mac;
use libcni::{Error, Result};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL};
use netlink_packet_route::link::{
    AfSpecBridge, AfSpecInet, AfSpecUnspec, BridgeFlag, BridgeVlanInfo, BridgeVlanInfoFlags, InetDevConf, InfoBridge,
    InfoBridgePort, InfoData, InfoKind, InfoPortData, InfoPortKind, InfoVeth, LinkAttribute, LinkExtentMask, LinkFlags,
    LinkInfo, LinkMessage, State,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What the kernel reports about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// IFLA_INFO_KIND: `"bridge"`, `"veth"`, `"macvlan"`, ...; `None` for physical devices and `lo`.
    pub kind: Option<String>,
    pub mac: Option<Mac>,
    /// IFLA_PERM_ADDRESS: the MAC the hardware came with, which no one can change (a NIC, a VF
    /// with one assigned); `None` for a virtual device (veth, macvlan) or a kernel that does not
    /// report it.
    pub perm_mac: Option<Mac>,
    pub mtu: u32,
    /// Index of the master (bridge) this link is a port of.
    pub master: Option<u32>,
    /// Administratively up (IFF_UP).
    pub up: bool,
    /// Operationally up (IF_OPER_UP).
    pub oper_up: bool,
    /// Operational state as `ip` prints it, lower case: `up`, `down`, `lowerlayerdown`, `unknown`...
    pub oper_state: String,
    pub promisc: bool,
    /// IFLA_LINK: for a veth, the peer's index (in the peer's namespace, so it may equal `index`;
    /// `None` once the peer is gone); for a macvlan, its parent.
    pub link_index: Option<u32>,
    /// IFLA_LINK_NETNSID: the namespace `link_index` lives in, as seen from this one.
    pub link_netnsid: Option<i32>,
    /// For bridges: whether VLAN filtering is on.
    pub vlan_filtering: Option<bool>,
    /// IFLA_IFALIAS (`ip link set X alias A`); host-device keeps a moved device's host name there.
    pub alias: Option<String>,
}

impl Link {
    /// The MAC as `aa:bb:cc:dd:ee:ff`.
    pub fn mac_string(&self) -> Option<String> {
        self.mac.map(|m| m.to_string())
    }

    pub fn is_bridge(&self) -> bool {
        self.kind.as_deref() == Some("bridge")
    }

    fn from_message(msg: &LinkMessage) -> Link {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            kind: None,
            mac: None,
            perm_mac: None,
            mtu: 0,
            master: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            oper_up: false,
            oper_state: "unknown".to_string(),
            promisc: msg.header.flags.contains(LinkFlags::Promisc),
            link_index: None,
            link_netnsid: None,
            vlan_filtering: None,
            alias: None,
        };
        let mut saw_link = false;
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(n) => link.name = n.clone(),
                LinkAttribute::Address(a) => link.mac = Mac::from_slice(a),
                LinkAttribute::PermAddress(a) => {
                    link.perm_mac = Mac::from_slice(a).filter(|m| m.octets() != [0; 6]);
                }
                LinkAttribute::Mtu(m) => link.mtu = *m,
                LinkAttribute::Controller(m) if *m != 0 => link.master = Some(*m),
                LinkAttribute::Link(l) => {
                    saw_link = true;
                    link.link_index = Some(*l).filter(|l| *l != 0);
                }
                LinkAttribute::LinkNetNsId(id) => link.link_netnsid = Some(*id),
                LinkAttribute::IfAlias(a) if !a.is_empty() => link.alias = Some(a.clone()),
                LinkAttribute::OperState(s) => {
                    link.oper_up = *s == State::Up;
                    link.oper_state = match s {
                        State::Other(v) => format!("state{v}"),
                        s => format!("{s:?}").to_lowercase(),
                    };
                }
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(k) => link.kind = Some(k.to_string()),
                            LinkInfo::Data(InfoData::Bridge(opts)) => {
                                for o in opts {
                                    if let InfoBridge::VlanFiltering(v) = o {
                                        link.vlan_filtering = Some(*v);
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        // The kernel omits IFLA_LINK when it equals the link's own index, which for a veth means
        // the peer (in another namespace) has the same index.
        if !saw_link && link.kind.as_deref() == Some("veth") {
            link.link_index = Some(link.index);
        }
        link
    }
}

/// One VLAN of a bridge port (or of the bridge itself), as `bridge vlan show` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeVlan {
    pub vid: u16,
    pub pvid: bool,
    pub untagged: bool,
}

pub(super) fn check_ifname(what: &str, name: &str) -> Result<()> {
    if crate::valid_ifname(name) {
        Ok(())
    } else {
        Err(Error::config(format!("{what} {name:?}: invalid interface name (1-15 bytes, no '/', ':' or spaces)")))
    }
}

fn vlan_filtering_hint(e: Error) -> Error {
    e.with_details("VLAN filtering needs a kernel built with CONFIG_BRIDGE_VLAN_FILTERING")
}

fn by_index(index: u32) -> LinkMessage {
    let mut msg = LinkMessage::default();
    msg.header.index = index;
    msg
}

impl Netlink {
    /// The link called `name`, or `None`.
    pub fn link(&self, name: &str) -> Result<Option<Link>> {
        if !crate::valid_ifname(name) {
            return Ok(None);
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.get_link(msg, || format!("get link {name}"))
    }

    /// The link with index `index`, or `None`.
    pub fn link_by_index(&self, index: u32) -> Result<Option<Link>> {
        self.get_link(by_index(index), || format!("get link index {index}"))
    }

    fn get_link(&self, msg: LinkMessage, what: impl Fn() -> String) -> Result<Option<Link>> {
        match self.get_one(RouteNetlinkMessage::GetLink(msg)) {
            Ok(Some(RouteNetlinkMessage::NewLink(m))) => Ok(Some(Link::from_message(&m))),
            Ok(_) => Ok(None),
            Err(RequestFailure::Errno(libc::ENODEV, _)) => Ok(None),
            Err(f) => Err(f.into_error(what())),
        }
    }

    /// Every link of the namespace.
    pub fn links(&self) -> Result<Vec<Link>> {
        let msgs =
            self.dump(RouteNetlinkMessage::GetLink(LinkMessage::default())).map_err(|f| f.into_error("list links"))?;
        Ok(msgs
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(Link::from_message(l)),
                _ => None,
            })
            .collect())
    }

    /// The bridge `name`, created if missing, and up. A link of another kind with that name is an
    /// error. `mtu` applies only when the bridge is created; `vlan_filtering` and `promisc` are
    /// turned on (never off: other networks may share the bridge). Safe against another process
    /// creating the same bridge at the same time.
    pub fn ensure_bridge(&self, name: &str, mtu: Option<u32>, vlan_filtering: bool, promisc: bool) -> Result<Link> {
        self.ensure_bridge_with(name, mtu, vlan_filtering, promisc, &|_| {}).map(|(br, _)| br)
    }

    /// [`Netlink::ensure_bridge`], calling `before_up` with the bridge while it is down: after
    /// creating it (created down for this), or when it is found down. What the kernel sets up when
    /// the bridge comes up (its IPv6 link-local address, and that address's DAD) then follows
    /// settings `before_up` made. Also says whether this call created the bridge (a failed ADD
    /// removes only a bridge it created).
    pub fn ensure_bridge_with(
        &self,
        name: &str,
        mtu: Option<u32>,
        vlan_filtering: bool,
        promisc: bool,
        before_up: &dyn Fn(&Link),
    ) -> Result<(Link, bool)> {
        check_ifname("bridge", name)?;
        let mut created = false;
        let existing = match self.link(name)? {
            Some(l) => l,
            None => {
                let mut msg = LinkMessage::default();
                msg.attributes.push(LinkAttribute::IfName(name.to_string()));
                if let Some(mtu) = mtu {
                    msg.attributes.push(LinkAttribute::Mtu(mtu));
                }
                let mut info = vec![LinkInfo::Kind(InfoKind::Bridge)];
                if vlan_filtering {
                    info.push(LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(true)])));
                }
                msg.attributes.push(LinkAttribute::LinkInfo(info));
                match self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL) {
                    Ok(()) => created = true,
                    // EEXIST: someone else created it between our lookup and our request.
                    Err(RequestFailure::Errno(libc::EEXIST, _)) => {}
                    Err(f) => {
                        let unsupported = vlan_filtering && f.errno() == Some(libc::EOPNOTSUPP);
                        let e = f.into_error(format_args!("create bridge {name}"));
                        return Err(if unsupported { vlan_filtering_hint(e) } else { e });
                    }
                }
                self.link(name)?
                    .ok_or_else(|| Error::network(format!("create bridge {name}: it vanished right after creation")))?
            }
        };
        if !existing.is_bridge() {
            return Err(Error::network(format!(
                "bridge {name}: a link with that name already exists and is not a bridge (it is {})",
                existing.kind.as_deref().unwrap_or("a device without a kind")
            )));
        }
        let index = existing.index;
        match self.settle_bridge(name, existing, vlan_filtering, promisc, before_up) {
            Ok(br) => Ok((br, created)),
            Err(e) => {
                if created {
                    let _ = self.delete_link(index);
                }
                Err(e)
            }
        }
    }

    /// [`Netlink::ensure_bridge_with`]'s settings on the bridge `existing`: VLAN filtering and
    /// promiscuous mode on when asked, and up; the bridge as it is then.
    fn settle_bridge(
        &self,
        name: &str,
        existing: Link,
        vlan_filtering: bool,
        promisc: bool,
        before_up: &dyn Fn(&Link),
    ) -> Result<Link> {
        let mut changed = false;
        if vlan_filtering && existing.vlan_filtering != Some(true) {
            self.set_vlan_filtering(existing.index, true)?;
            changed = true;
        }
        if promisc && !existing.promisc {
            self.set_promisc(existing.index, true)?;
            changed = true;
        }
        if !existing.up {
            before_up(&existing);
            self.set_up(existing.index)?;
            changed = true;
        }
        if !changed {
            return Ok(existing);
        }
        self.link_by_index(existing.index)?
            .ok_or_else(|| Error::network(format!("bridge {name}: it vanished while being set up")))
    }

    /// Creates a veth pair in one request: `host_name` here, `peer_name` directly in `peer_ns`
    /// (IFLA_NET_NS_FD on the peer), so the peer never appears in this namespace. Both ends are
    /// left down. Returns the host end.
    pub fn create_veth(
        &self,
        host_name: &str,
        peer_name: &str,
        peer_ns: &NetNs,
        mtu: Option<u32>,
        peer_mac: Option<Mac>,
    ) -> Result<Link> {
        check_ifname("veth", host_name)?;
        check_ifname("veth peer", peer_name)?;
        let mut peer = LinkMessage::default();
        peer.attributes.push(LinkAttribute::IfName(peer_name.to_string()));
        peer.attributes.push(LinkAttribute::NetNsFd(peer_ns.as_raw_fd()));
        if let Some(mtu) = mtu {
            peer.attributes.push(LinkAttribute::Mtu(mtu));
        }
        if let Some(mac) = peer_mac {
            peer.attributes.push(LinkAttribute::Address(mac.octets().to_vec()));
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(host_name.to_string()));
        if let Some(mtu) = mtu {
            msg.attributes.push(LinkAttribute::Mtu(mtu));
        }
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        let what = || format!("create veth {host_name} (peer {peer_name} in {})", peer_ns.path().display());
        self.ack(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL).map_err(|f| f.into_error(what()))?;
        self.link(host_name)?.ok_or_else(|| Error::network(format!("{}: host end vanished after creation", what())))
    }

    /// Applies a change to an existing link (RTM_NEWLINK without NLM_F_CREATE).
    fn change(&self, msg: LinkMessage, op: &str) -> Result<()> {
        let index = msg.header.index;
        self.ack(RouteNetlinkMessage::NewLink(msg), 0)
            .map_err(|f| f.into_error(format_args!("{op} {}", self.describe(index))))
    }

    fn set_flag(&self, index: u32, flag: LinkFlags, on: bool, op: &str) -> Result<()> {
        let mut msg = by_index(index);
        if on {
            msg.header.flags |= flag;
        }
        msg.header.change_mask |= flag;
        self.change(msg, op)
    }

    pub fn set_up(&self, index: u32) -> Result<()> {
        self.run(Netlink::set_up_op(index))
    }

    /// [`Netlink::set_up`] as a request of a [`Netlink::batch`].
    pub fn set_up_op(index: u32) -> BatchOp {
        let mut msg = by_index(index);
        msg.header.flags |= LinkFlags::Up;
        msg.header.change_mask |= LinkFlags::Up;
        BatchOp::new(RouteNetlinkMessage::NewLink(msg), 0, move |nl| format!("set up link {}", nl.describe(index)))
    }

    pub fn set_down(&self, index: u32) -> Result<()> {
        self.set_flag(index, LinkFlags::Up, false, "set down link")
    }

    pub fn set_promisc(&self, index: u32, on: bool) -> Result<()> {
        self.set_flag(index, LinkFlags::Promisc, on, "set promisc on link")
    }

    /// Sets `arp_notify` on a link (as `net/ipv4/conf/<link>/arp_notify = 1`) with RTM_SETLINK
    /// (IFLA_AF_SPEC / AF_INET / IFLA_INET_CONF). Writing the sysctl file instead costs a path
    /// lookup through /proc/sys, where the `eth0` directories of every namespace on the node share
    /// one dentry hash chain: ~1 ms per write with 1000 pods.
    pub fn set_arp_notify(&self, index: u32) -> Result<()> {
        self.run(Netlink::set_arp_notify_op(index))
    }

    /// [`Netlink::set_arp_notify`] as a request of a [`Netlink::batch`].
    pub fn set_arp_notify_op(index: u32) -> BatchOp {
        let mut msg = by_index(index);
        let mut conf = InetDevConf::default();
        conf.arp_notify = 1;
        msg.attributes
            .push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)])]));
        BatchOp::new(RouteNetlinkMessage::NewLink(msg), 0, move |nl| {
            format!("set arp_notify on link {}", nl.describe(index))
        })
    }

    /// Makes `index` a port of `master_index` (`ip link set X master B`). A bridge holds at most
    /// 1023 ports (the kernel's port numbers are 10 bits, 0 unused): one more fails with EXFULL,
    /// whose text musl does not have, so the message says it.
    pub fn set_master(&self, index: u32, master_index: u32) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::Controller(master_index));
        self.change(msg, &format!("set master index {master_index} on link")).map_err(|e| {
            if e.errno != Some(libc::EXFULL) {
                return e;
            }
            let msg = format!(
                "make link {} a port of {}: it has 1023 ports, the most a bridge can have; attach further pods to another bridge",
                self.describe(index),
                self.describe(master_index)
            );
            libcni::Error::new(e.code, msg).with_errno(libc::EXFULL)
        })
    }

    /// Detaches `index` from its master (`ip link set X nomaster`).
    pub fn set_nomaster(&self, index: u32) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::Controller(0));
        self.change(msg, "set nomaster on link")
    }

    pub fn set_mtu(&self, index: u32, mtu: u32) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.change(msg, &format!("set mtu {mtu} on link"))
    }

    pub fn set_mac(&self, index: u32, mac: Mac) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::Address(mac.octets().to_vec()));
        self.change(msg, &format!("set mac {mac} on link"))
    }

    /// Renames a link (it must be down).
    pub fn set_name(&self, index: u32, name: &str) -> Result<()> {
        check_ifname("rename link to", name)?;
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.change(msg, &format!("set name {name} on link"))
    }

    /// Moves a link into another namespace.
    pub fn set_netns(&self, index: u32, ns: &NetNs) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        self.change(msg, &format!("set netns {} on link", ns.path().display()))
    }

    /// Deletes a link; `Ok(false)` if there was none (idempotent DEL).
    pub fn delete_link(&self, index: u32) -> Result<bool> {
        match self.ack(RouteNetlinkMessage::DelLink(by_index(index)), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ENODEV, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete link index {index}"))),
        }
    }

    /// Deletes the link called `name`; `Ok(false)` if there was none.
    pub fn delete_link_by_name(&self, name: &str) -> Result<bool> {
        if !crate::valid_ifname(name) {
            return Ok(false);
        }
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.ack(RouteNetlinkMessage::DelLink(msg), 0) {
            Ok(()) => Ok(true),
            Err(RequestFailure::Errno(libc::ENODEV, _)) => Ok(false),
            Err(f) => Err(f.into_error(format_args!("delete link {name}"))),
        }
    }

    /// Sets bridge port flags on a port (IFLA_INFO_SLAVE_DATA, like
    /// `ip link set X type bridge_slave hairpin on isolated on`). `None` leaves a flag alone.
    pub fn set_port_flags(&self, index: u32, hairpin: Option<bool>, isolated: Option<bool>) -> Result<()> {
        let mut data = Vec::new();
        if let Some(h) = hairpin {
            data.push(InfoBridgePort::HairpinMode(h));
        }
        if let Some(i) = isolated {
            data.push(InfoBridgePort::Isolated(i));
        }
        if data.is_empty() {
            return Ok(());
        }
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::PortKind(InfoPortKind::Bridge),
            LinkInfo::PortData(InfoPortData::BridgePort(data)),
        ]));
        self.change(msg, "set bridge port flags on link")
    }

    /// Reads a port's hairpin and isolated flags: `None` if the link is not a bridge port.
    pub fn port_flags(&self, index: u32) -> Result<Option<(bool, bool)>> {
        let what = || format!("get bridge port flags of index {index}");
        let msg = match self.get_one(RouteNetlinkMessage::GetLink(by_index(index))) {
            Ok(Some(RouteNetlinkMessage::NewLink(m))) => m,
            Ok(_) => return Ok(None),
            Err(f) => return Err(f.into_error(what())),
        };
        for attr in &msg.attributes {
            if let LinkAttribute::LinkInfo(infos) = attr {
                for info in infos {
                    if let LinkInfo::PortData(InfoPortData::BridgePort(data)) = info {
                        let (mut hairpin, mut isolated) = (false, false);
                        for d in data {
                            match d {
                                InfoBridgePort::HairpinMode(v) => hairpin = *v,
                                InfoBridgePort::Isolated(v) => isolated = *v,
                                _ => {}
                            }
                        }
                        return Ok(Some((hairpin, isolated)));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Turns VLAN filtering of a bridge on or off.
    pub fn set_vlan_filtering(&self, bridge_index: u32, on: bool) -> Result<()> {
        let mut msg = by_index(bridge_index);
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Bridge),
            LinkInfo::Data(InfoData::Bridge(vec![InfoBridge::VlanFiltering(on)])),
        ]));
        self.change(msg, &format!("set vlan_filtering {} on bridge", u8::from(on))).map_err(|e| {
            if on && crate::errno(&e) == Some(libc::EOPNOTSUPP) {
                vlan_filtering_hint(e)
            } else {
                e
            }
        })
    }

    fn bridge_vlan_message(index: u32, vids: &[(u16, BridgeVlanInfoFlags)], self_: bool) -> LinkMessage {
        let mut msg = by_index(index);
        msg.header.interface_family = AddressFamily::Bridge;
        let mut spec = Vec::new();
        if self_ {
            spec.push(AfSpecBridge::Flags(BridgeFlag::LowerDev));
        }
        for (vid, flags) in vids {
            spec.push(AfSpecBridge::VlanInfo(BridgeVlanInfo { vid: *vid, flags: *flags }));
        }
        msg.attributes.push(LinkAttribute::AfSpecBridge(spec));
        msg
    }

    fn vlan_flags(pvid: bool, untagged: bool) -> BridgeVlanInfoFlags {
        let mut flags = BridgeVlanInfoFlags::empty();
        if pvid {
            flags |= BridgeVlanInfoFlags::Pvid;
        }
        if untagged {
            flags |= BridgeVlanInfoFlags::Untagged;
        }
        flags
    }

    /// `bridge vlan add dev <port> vid <vid> [pvid] [untagged] [self]`. `self_` targets the
    /// bridge device itself rather than a port.
    pub fn bridge_vlan_add(&self, port_index: u32, vid: u16, pvid: bool, untagged: bool, self_: bool) -> Result<()> {
        let msg = Self::bridge_vlan_message(port_index, &[(vid, Self::vlan_flags(pvid, untagged))], self_);
        self.ack(RouteNetlinkMessage::SetLink(msg), 0)
            .map_err(|f| f.into_error(format_args!("add vlan {vid} to bridge port {}", self.describe(port_index))))
    }

    /// `bridge vlan add dev <port> vid <min>-<max> [untagged]` (a trunk range).
    pub fn bridge_vlan_add_range(&self, port_index: u32, min_vid: u16, max_vid: u16, untagged: bool) -> Result<()> {
        if min_vid == max_vid {
            return self.bridge_vlan_add(port_index, min_vid, false, untagged, false);
        }
        let flags = Self::vlan_flags(false, untagged);
        let msg = Self::bridge_vlan_message(
            port_index,
            &[(min_vid, flags | BridgeVlanInfoFlags::RangeBegin), (max_vid, flags | BridgeVlanInfoFlags::RangeEnd)],
            false,
        );
        self.ack(RouteNetlinkMessage::SetLink(msg), 0).map_err(|f| {
            f.into_error(format_args!("add vlans {min_vid}-{max_vid} to bridge port {}", self.describe(port_index)))
        })
    }

    /// `bridge vlan del dev <port> vid <vid> [self]`; `Ok(false)` if the port did not have it
    /// (or the port is gone).
    pub fn bridge_vlan_del(&self, port_index: u32, vid: u16, self_: bool) -> Result<bool> {
        let msg = Self::bridge_vlan_message(port_index, &[(vid, BridgeVlanInfoFlags::empty())], self_);
        match self.ack(RouteNetlinkMessage::DelLink(msg), 0) {
            Ok(()) => Ok(true),
            Err(f) if matches!(f.errno(), Some(libc::ENOENT | libc::ENODEV)) => Ok(false),
            Err(f) => {
                Err(f.into_error(format_args!("delete vlan {vid} from bridge port {}", self.describe(port_index))))
            }
        }
    }

    /// The VLANs of a bridge port or bridge (`bridge vlan show dev X`), ranges expanded.
    pub fn bridge_vlans(&self, index: u32) -> Result<Vec<BridgeVlan>> {
        let mut req = LinkMessage::default();
        req.header.interface_family = AddressFamily::Bridge;
        req.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::Brvlan]));
        let msgs = self
            .dump(RouteNetlinkMessage::GetLink(req))
            .map_err(|f| f.into_error(format_args!("list bridge vlans of index {index}")))?;
        let mut out = Vec::new();
        for m in msgs {
            let RouteNetlinkMessage::NewLink(l) = m else { continue };
            if l.header.index != index {
                continue;
            }
            let mut range_start: Option<u16> = None;
            for attr in &l.attributes {
                let LinkAttribute::AfSpecBridge(spec) = attr else { continue };
                for s in spec {
                    let AfSpecBridge::VlanInfo(v) = s else { continue };
                    let entry = |vid| BridgeVlan {
                        vid,
                        pvid: v.flags.contains(BridgeVlanInfoFlags::Pvid),
                        untagged: v.flags.contains(BridgeVlanInfoFlags::Untagged),
                    };
                    if v.flags.contains(BridgeVlanInfoFlags::RangeBegin) {
                        range_start = Some(v.vid);
                    } else if v.flags.contains(BridgeVlanInfoFlags::RangeEnd) {
                        let start = range_start.take().unwrap_or(v.vid);
                        out.extend((start..=v.vid).map(entry));
                    } else {
                        out.push(entry(v.vid));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Polls until the link is operationally up; fails after `timeout` naming its state. The
    /// first checks come quickly since a fresh veth usually comes up within a few milliseconds.
    pub fn wait_oper_up(&self, index: u32, timeout: Duration) -> Result<Link> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(2);
        loop {
            let link = self
                .link_by_index(index)?
                .ok_or_else(|| Error::network(format!("wait for link index {index}: it is gone")))?;
            if link.oper_up {
                return Ok(link);
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                return Err(Error::network(format!(
                    "link {} is not operationally up after {} ms (state {})",
                    link.name,
                    elapsed.as_millis(),
                    link.oper_state
                )));
            }
            std::thread::sleep(pause.min(timeout - elapsed));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}

/// Moving a whole device between namespaces (host-device).
impl Netlink {
    /// Sets a link's alias (IFLA_IFALIAS).
    pub fn set_alias(&self, index: u32, alias: &str) -> Result<()> {
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::IfAlias(alias.to_string()));
        self.change(msg, &format!("set alias {alias:?} on link"))
    }

    /// Moves a link into `ns` under the name `name` there, in one request (IFLA_NET_NS_FD with
    /// IFLA_IFNAME: the kernel moves the link, which takes it down, then renames it). The link
    /// must not be up, and `name` must be free in `ns`: else the kernel may have moved the link
    /// under its old name before failing the rename.
    pub fn set_netns_named(&self, index: u32, ns: &NetNs, name: &str) -> Result<()> {
        check_ifname("move link as", name)?;
        let mut msg = by_index(index);
        msg.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        self.change(msg, &format!("set netns {} on link", ns.path().display()))
    }

    /// The link whose MAC is `mac`, if one is here.
    pub fn link_by_mac(&self, mac: Mac) -> Result<Option<Link>> {
        Ok(self.links()?.into_iter().find(|l| l.mac == Some(mac)))
    }
}
