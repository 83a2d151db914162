//! The routes to other nodes' pod CIDRs, and the VXLAN device with its FDB and neighbour entries,
//! reconciled over rtnetlink: entries that are right are left alone, missing ones added, wrong
//! ones replaced and stale ones removed. The agent's routes carry their own protocol number
//! ([`RTPROT_CNI_RS`]), so a reconcile only ever removes routes it made; the FDB and neighbour
//! entries live on the agent's own VXLAN device.

use futures::{StreamExt, TryStreamExt};
use ipnetwork::IpNetwork;
use netlink_packet_route::address::AddressAttribute;
use netlink_packet_route::link::{InfoData, InfoKind, LinkAttribute, LinkInfo};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol};
use netlink_packet_route::AddressFamily;
use rtnetlink::{Handle, LinkUnspec, LinkVxlan, RouteMessageBuilder};
use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// RTM_PROTOCOL of every route the agent adds (`ip route show proto 210`).
pub const RTPROT_CNI_RS: u8 = 210;
/// VXLAN network identifier and UDP port (the IANA port Linux and flannel use is 4789; 8472 is
/// the Linux default that flannel's vxlan backend uses too).
pub const VNI: u32 = 1;
pub const VXLAN_PORT: u16 = 8472;
/// VXLAN over IPv4 adds 50 bytes (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14).
pub const VXLAN_OVERHEAD: u32 = 50;
/// Route requests sent before waiting for their answers.
const IN_FLIGHT: usize = 128;

pub fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => msg.code.map(|c| c.get().saturating_abs()),
        _ => None,
    }
}

/// A route the agent wants: `dst via gw`, on `oif` (any when `None`), `onlink` for VXLAN.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: IpAddr,
    pub oif: Option<u32>,
    pub onlink: bool,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.dst, self.gw)?;
        if let Some(oif) = self.oif {
            write!(f, " dev index {oif}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        Ok(())
    }
}

/// A remote VTEP: neighbour `vtep -> mac` and FDB `mac -> dst` on the VXLAN device. `vtep` is
/// the gateway address of the routes to that node (the network address of its block, IPv4 or
/// IPv6: the IPv4 underlay carries both).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Vtep {
    pub vtep: IpAddr,
    pub mac: [u8; 6],
    pub dst: Ipv4Addr,
}

/// What one reconcile changed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Changes {
    pub added: usize,
    pub removed: usize,
    pub errors: usize,
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in &mut mac {
        *byte = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The link that holds a node address, its MTU, and the subnet of that address.
#[derive(Debug, Clone, Copy)]
pub struct Underlay {
    pub index: u32,
    pub mtu: u32,
    pub subnet: IpNetwork,
}

/// The link that holds `ip`.
pub async fn link_of_address(handle: &Handle, ip: IpAddr) -> Result<Option<Underlay>, String> {
    let mut addrs = handle.address().get().execute();
    let mut found = None;
    while let Some(msg) = addrs.try_next().await.map_err(|e| format!("list addresses: {e}"))? {
        let has = msg.attributes.iter().any(|a| matches!(a, AddressAttribute::Address(x) if *x == ip));
        if has {
            found = Some((msg.header.index, msg.header.prefix_len));
        }
    }
    let Some((index, prefix)) = found else { return Ok(None) };
    let subnet = IpNetwork::new(ip, prefix).map_err(|e| format!("address {ip}/{prefix}: {e}"))?;
    let subnet = IpNetwork::new(subnet.network(), prefix).map_err(|e| format!("address {ip}/{prefix}: {e}"))?;
    let mut links = handle.link().get().match_index(index).execute();
    while let Some(msg) = links.try_next().await.map_err(|e| format!("get link {index}: {e}"))? {
        for attr in &msg.attributes {
            if let LinkAttribute::Mtu(mtu) = attr {
                return Ok(Some(Underlay { index, mtu: *mtu, subnet }));
            }
        }
    }
    Ok(Some(Underlay { index, mtu: 1500, subnet }))
}

/// The first global address of `family` (IPv4 when `v4`) on the interface of that family's
/// default route in the main table.
pub async fn default_route_address(handle: &Handle, v4: bool) -> Result<Option<IpAddr>, String> {
    let filter = if v4 {
        RouteMessageBuilder::<Ipv4Addr>::new().build()
    } else {
        RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
    };
    let mut routes = handle.route().get(filter).execute();
    let mut oif = None;
    while let Some(msg) = routes.try_next().await.map_err(|e| format!("list routes: {e}"))? {
        if msg.header.destination_prefix_length != 0 || msg.header.table != 254 || oif.is_some() {
            continue;
        }
        oif = msg.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        });
    }
    let Some(oif) = oif else { return Ok(None) };
    let mut addrs = handle.address().get().set_link_index_filter(oif).execute();
    let mut found = None;
    while let Some(msg) = addrs.try_next().await.map_err(|e| format!("list addresses of link {oif}: {e}"))? {
        if msg.header.scope != netlink_packet_route::address::AddressScope::Universe || found.is_some() {
            continue;
        }
        found = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) if ip.is_ipv4() == v4 => Some(*ip),
            _ => None,
        });
    }
    Ok(found)
}

/// Link index and MAC of `name` if it exists, and whether it is a VXLAN device.
async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<(u32, Option<[u8; 6]>, bool, u32)>, String> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => {
            let mut mac = None;
            let mut vxlan = false;
            let mut mtu = 0;
            for attr in &msg.attributes {
                match attr {
                    LinkAttribute::Address(a) if a.len() == 6 => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
                    LinkAttribute::Mtu(m) => mtu = *m,
                    LinkAttribute::LinkInfo(infos) => {
                        vxlan = infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Vxlan)))
                            && infos.iter().any(|i| matches!(i, LinkInfo::Data(InfoData::Vxlan(_))));
                    }
                    _ => {}
                }
            }
            Ok(Some((msg.header.index, mac, vxlan, mtu)))
        }
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(format!("get link {name}: {e}")),
    }
}

/// Creates (or keeps) the VXLAN device `name`: VNI 1, UDP 8472, local `local` on link `dev`, no
/// learning (the agent programs every entry), MTU `mtu`, up. Returns its index and MAC.
pub async fn ensure_vxlan(
    handle: &Handle,
    name: &str,
    local: Ipv4Addr,
    dev: u32,
    mtu: u32,
) -> Result<(u32, [u8; 6]), String> {
    if let Some((index, _, vxlan, _)) = link_by_name(handle, name).await? {
        if !vxlan {
            return Err(format!(
                "link {name} exists and is not a VXLAN device; delete it or give --vxlan-dev another name"
            ));
        }
        // A device from an earlier run may have another local address or parent: recreate it
        // then, since those cannot be changed in place.
        if !vxlan_matches(handle, index, local, dev).await? {
            eprintln!("recreating {name}: its VNI, port, local address or parent link differ");
            handle.link().del(index).execute().await.map_err(|e| format!("delete link {name}: {e}"))?;
        }
    }
    if link_by_name(handle, name).await?.is_none() {
        let msg = LinkVxlan::new(name, VNI).port(VXLAN_PORT).local(local).dev(dev).learning(false).mtu(mtu).build();
        match handle.link().add(msg).execute().await {
            Ok(()) => eprintln!("created VXLAN device {name} (VNI {VNI}, port {VXLAN_PORT}, local {local}, mtu {mtu})"),
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(format!("create VXLAN device {name}: {e}")),
        }
    }
    let (index, mac, _, current_mtu) =
        link_by_name(handle, name).await?.ok_or_else(|| format!("VXLAN device {name} vanished after creation"))?;
    let mac = mac.ok_or_else(|| format!("VXLAN device {name} has no MAC address"))?;
    let mut set = LinkUnspec::new_with_index(index).up();
    if current_mtu != mtu {
        set = set.mtu(mtu);
    }
    handle.link().set(set.build()).execute().await.map_err(|e| format!("set {name} up (mtu {mtu}): {e}"))?;
    Ok((index, mac))
}

async fn vxlan_matches(handle: &Handle, index: u32, local: Ipv4Addr, dev: u32) -> Result<bool, String> {
    use netlink_packet_route::link::InfoVxlan;
    let mut links = handle.link().get().match_index(index).execute();
    let Some(msg) = links.try_next().await.map_err(|e| format!("get link {index}: {e}"))? else {
        return Ok(false);
    };
    let mut ok = (false, false, false, false);
    for attr in &msg.attributes {
        if let LinkAttribute::LinkInfo(infos) = attr {
            for info in infos {
                if let LinkInfo::Data(InfoData::Vxlan(data)) = info {
                    for d in data {
                        match d {
                            InfoVxlan::Id(id) => ok.0 = *id == VNI,
                            InfoVxlan::Port(p) => ok.1 = *p == VXLAN_PORT,
                            InfoVxlan::Local(l) => ok.2 = *l == local,
                            InfoVxlan::Link(l) => ok.3 = *l == dev,
                            _ => {}
                        }
                    }
                }
            }
        }
    }
    Ok(ok == (true, true, true, true))
}

/// Gives link `index` exactly the IPv4 address `addr/32` (the node's VTEP address).
pub async fn ensure_only_v4_address(handle: &Handle, index: u32, addr: Ipv4Addr) -> Result<(), String> {
    let mut present = false;
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    let mut stale = Vec::new();
    while let Some(msg) = addrs.try_next().await.map_err(|e| format!("list addresses of link {index}: {e}"))? {
        if msg.header.family != AddressFamily::Inet {
            continue;
        }
        let ip = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
            _ => None,
        });
        if ip == Some(addr) && msg.header.prefix_len == 32 {
            present = true;
        } else {
            stale.push(msg);
        }
    }
    for msg in stale {
        handle.address().del(msg).execute().await.map_err(|e| format!("remove old VTEP address: {e}"))?;
    }
    if !present {
        match handle.address().add(index, IpAddr::V4(addr), 32).execute().await {
            Ok(()) => {}
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(format!("add VTEP address {addr}/32: {e}")),
        }
    }
    Ok(())
}

fn route_of(msg: &RouteMessage) -> Option<Route> {
    let ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let mut dst = None;
    let mut gw = None;
    let mut oif = None;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = ip(a),
            RouteAttribute::Gateway(a) => gw = ip(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            _ => {}
        }
    }
    Some(Route {
        dst: IpNetwork::new(dst?, msg.header.destination_prefix_length).ok()?,
        gw: gw?,
        oif,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
    })
}

/// The agent's routes in the main table, both families, with the messages to delete them.
pub async fn own_routes(handle: &Handle) -> Result<Vec<(Route, RouteMessage)>, String> {
    let mut out = Vec::new();
    for family in [IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)] {
        let filter = match family {
            IpAddr::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpAddr::V6(_) => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let mut routes = handle.route().get(filter).execute();
        while let Some(msg) = routes.try_next().await.map_err(|e| format!("list routes: {e}"))? {
            if u8::from(msg.header.protocol) != RTPROT_CNI_RS || msg.header.table != 254 {
                continue;
            }
            if let Some(route) = route_of(&msg) {
                out.push((route, msg));
            }
        }
    }
    Ok(out)
}

fn satisfies(have: &Route, want: &Route) -> bool {
    have.dst == want.dst
        && have.gw == want.gw
        && have.onlink == want.onlink
        && (want.oif.is_none() || have.oif == want.oif)
}

/// Makes the agent's routes exactly `want`.
pub async fn reconcile_routes(handle: &Handle, want: &[Route]) -> Changes {
    let mut changes = Changes::default();
    let have = match own_routes(handle).await {
        Ok(have) => have,
        Err(e) => {
            eprintln!("error: {e}");
            changes.errors += 1;
            return changes;
        }
    };
    // The requests go out together on the one socket (up to IN_FLIGHT unanswered), so a first
    // sync of a thousand routes does not wait for a thousand round trips.
    let stale = have.iter().filter(|(route, _)| !want.iter().any(|w| satisfies(route, w)));
    let removals = futures::stream::iter(stale.map(|(route, msg)| {
        let request = handle.route().del(msg.clone()).execute();
        async move { (route, request.await) }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for (route, result) in removals {
        match result {
            Ok(()) => {
                eprintln!("removed route {route}");
                changes.removed += 1;
            }
            Err(e) if errno(&e) == Some(libc::ESRCH) => {}
            Err(e) => {
                eprintln!("error: remove route {route}: {e}");
                changes.errors += 1;
            }
        }
    }
    let mut messages = Vec::new();
    for route in want.iter().filter(|route| !have.iter().any(|(h, _)| satisfies(h, route))) {
        let built = RouteMessageBuilder::<IpAddr>::new()
            .destination_prefix(route.dst.network(), route.dst.prefix())
            .and_then(|b| b.gateway(route.gw));
        let mut builder = match built {
            Ok(b) => b.protocol(RouteProtocol::from(RTPROT_CNI_RS)),
            Err(e) => {
                eprintln!("error: route {route}: {e}");
                changes.errors += 1;
                continue;
            }
        };
        if let Some(oif) = route.oif {
            builder = builder.output_interface(oif);
        }
        if route.onlink {
            builder = builder.onlink();
        }
        messages.push((route, builder.build()));
    }
    let additions = futures::stream::iter(messages.into_iter().map(|(route, msg)| {
        let request = handle.route().add(msg).replace().execute();
        async move { (route, request.await) }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for (route, result) in additions {
        match result {
            Ok(()) => {
                eprintln!("added route {route}");
                changes.added += 1;
            }
            Err(e) => {
                eprintln!("error: add route {route}: {e}");
                changes.errors += 1;
            }
        }
    }
    changes
}

/// Makes the permanent neighbour (IPv4, IPv6) and FDB (bridge) entries on VXLAN device `index`
/// exactly `want`; entries the kernel made (neighbour discovery) are left to the kernel.
pub async fn reconcile_vteps(handle: &Handle, index: u32, want: &[Vtep]) -> Changes {
    let mut changes = Changes::default();
    let mut neigh: BTreeMap<IpAddr, ([u8; 6], NeighbourMessage)> = BTreeMap::new();
    let mut fdb: BTreeMap<[u8; 6], (Option<Ipv4Addr>, NeighbourMessage)> = BTreeMap::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6, AddressFamily::Bridge] {
        let mut list = handle.neighbours().get().set_address_family(family).execute();
        loop {
            let msg = match list.try_next().await {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("error: list neighbours of link {index}: {e}");
                    changes.errors += 1;
                    return changes;
                }
            };
            if msg.header.ifindex != index {
                continue;
            }
            let mut lladdr = None;
            let mut dst = None;
            for attr in &msg.attributes {
                match attr {
                    NeighbourAttribute::LinkLayerAddress(a) => lladdr = <[u8; 6]>::try_from(a.as_slice()).ok(),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => dst = Some(IpAddr::V4(*ip)),
                    NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => dst = Some(IpAddr::V6(*ip)),
                    _ => {}
                }
            }
            match (family, lladdr, dst) {
                (AddressFamily::Bridge, Some(mac), dst) => {
                    let dst = match dst {
                        Some(IpAddr::V4(ip)) => Some(ip),
                        _ => None,
                    };
                    fdb.insert(mac, (dst, msg));
                }
                // An incomplete or failed entry (no MAC) left by traffic before the agent added
                // its own counts as wrong, so it is replaced.
                (_, lladdr, Some(ip)) => {
                    neigh.insert(ip, (lladdr.unwrap_or([0; 6]), msg));
                }
                _ => {}
            }
        }
    }
    for (ip, (mac, msg)) in &neigh {
        let permanent = msg.header.state == NeighbourState::Permanent;
        if want.iter().any(|w| w.vtep == *ip && w.mac == *mac) && permanent {
            continue;
        }
        if permanent
            && !want.iter().any(|w| w.vtep == *ip)
            && handle.neighbours().del(msg.clone()).execute().await.is_ok()
        {
            eprintln!("removed neighbour {ip} on link {index}");
            changes.removed += 1;
        }
    }
    for (mac, (dst, msg)) in &fdb {
        if mac == &[0u8; 6] || want.iter().any(|w| w.mac == *mac && Some(w.dst) == *dst) {
            continue;
        }
        if !want.iter().any(|w| w.mac == *mac) && handle.neighbours().del(msg.clone()).execute().await.is_ok() {
            eprintln!("removed FDB entry {} on link {index}", format_mac(mac));
            changes.removed += 1;
        }
    }
    let mut fdb_done = std::collections::BTreeSet::new();
    for w in want {
        let good =
            neigh.get(&w.vtep).is_some_and(|(mac, msg)| *mac == w.mac && msg.header.state == NeighbourState::Permanent);
        if !good {
            let req = handle
                .neighbours()
                .add(index, w.vtep)
                .link_layer_address(&w.mac)
                .state(NeighbourState::Permanent)
                .replace();
            match req.execute().await {
                Ok(()) => {
                    eprintln!("added neighbour {} lladdr {} on link {index}", w.vtep, format_mac(&w.mac));
                    changes.added += 1;
                }
                Err(e) => {
                    eprintln!("error: add neighbour {}: {e}", w.vtep);
                    changes.errors += 1;
                }
            }
        }
        // One FDB entry per node, whichever of its families' VTEPs asks first.
        if fdb.get(&w.mac).is_some_and(|(dst, _)| *dst == Some(w.dst)) || !fdb_done.insert(w.mac) {
            continue;
        }
        let req = handle
            .neighbours()
            .add_bridge(index, &w.mac)
            .destination(IpAddr::V4(w.dst))
            .flags(NeighbourFlags::Own)
            .state(NeighbourState::Permanent)
            .replace();
        match req.execute().await {
            Ok(()) => {
                eprintln!("added FDB entry {} dst {} on link {index}", format_mac(&w.mac), w.dst);
                changes.added += 1;
            }
            Err(e) => {
                eprintln!("error: add FDB entry {} dst {}: {e}", format_mac(&w.mac), w.dst);
                changes.errors += 1;
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_round_trip() {
        let mac = [0x0a, 0xbc, 0, 1, 2, 0xff];
        assert_eq!(format_mac(&mac), "0a:bc:00:01:02:ff");
        assert_eq!(parse_mac("0a:bc:00:01:02:ff"), Some(mac));
        assert_eq!(parse_mac("0a:bc:00:01:02"), None);
        assert_eq!(parse_mac("0a:bc:00:01:02:ff:00"), None);
    }
}
