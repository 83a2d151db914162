//! The routes to other nodes' pod CIDRs, and the VXLAN device with its FDB and neighbour entries,
//! reconciled over rtnetlink: entries that are right are left alone, missing ones added, wrong
//! ones replaced and stale ones removed. The agent's routes carry their own protocol number
//! ([`RTPROT_CNI_RS`]), so a reconcile only ever removes routes it made; the FDB and neighbour
//! entries live on the agent's own VXLAN device.

use anyhow::{anyhow, Result};
use futures::{StreamExt, TryStreamExt};
use ipnetwork::IpNetwork;
use netkit::Family;
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
// One MAC grammar for the plugins and the agent (Go's net.ParseMAC).
pub use netkit::{format_mac, parse_mac};

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

/// What to add to a netlink error that is EPERM: every change the agent makes to links, routes,
/// neighbours and nftables needs CAP_NET_ADMIN, the one capability its container is given.
pub fn permission_hint(err: &rtnetlink::Error) -> &'static str {
    if errno(err) == Some(libc::EPERM) {
        " (the agent needs CAP_NET_ADMIN: capabilities.add [NET_ADMIN] in install/daemonset.yaml)"
    } else {
        ""
    }
}

/// A route the agent wants: `dst via gw` (or straight out of `oif` without one: WireGuard), on
/// `oif` (any when `None`), `onlink` for VXLAN.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Route {
    pub dst: IpNetwork,
    pub gw: Option<IpAddr>,
    pub oif: Option<u32>,
    pub onlink: bool,
}

impl fmt::Display for Route {
    /// As netkit prints a route (`dst via gw dev index N`), and VXLAN's `onlink`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = netkit::RouteSpec { gw: self.gw, oif: self.oif, ..netkit::RouteSpec::new(self.dst) };
        write!(f, "{spec}{}", if self.onlink { " onlink" } else { "" })
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

/// The link that holds a node address, its MTU, and the subnet of that address.
#[derive(Debug, Clone, Copy)]
pub struct Underlay {
    pub index: u32,
    pub mtu: u32,
    pub subnet: IpNetwork,
}

/// The link that holds `ip`.
pub async fn link_of_address(handle: &Handle, ip: IpAddr) -> Result<Option<Underlay>> {
    let mut addrs = handle.address().get().execute();
    let mut found = None;
    while let Some(msg) = addrs.try_next().await.map_err(|e| anyhow!("list addresses: {e}"))? {
        let has = msg.attributes.iter().any(|a| matches!(a, AddressAttribute::Address(x) if *x == ip));
        if has {
            found = Some((msg.header.index, msg.header.prefix_len));
        }
    }
    let Some((index, prefix)) = found else { return Ok(None) };
    let subnet = IpNetwork::new(ip, prefix).map_err(|e| anyhow!("address {ip}/{prefix}: {e}"))?;
    let subnet = IpNetwork::new(subnet.network(), prefix).map_err(|e| anyhow!("address {ip}/{prefix}: {e}"))?;
    let mut links = handle.link().get().match_index(index).execute();
    while let Some(msg) = links.try_next().await.map_err(|e| anyhow!("get link {index}: {e}"))? {
        for attr in &msg.attributes {
            if let LinkAttribute::Mtu(mtu) = attr {
                return Ok(Some(Underlay { index, mtu: *mtu, subnet }));
            }
        }
    }
    Ok(Some(Underlay { index, mtu: 1500, subnet }))
}

/// A counter bumped whenever an address is added to or removed from this network namespace, so
/// the set of this node's addresses is listed again only when it changed (a sync caused by the
/// datastore then sends no more netlink requests than its routes need).
pub fn watch_addresses() -> Result<tokio::sync::watch::Receiver<u64>> {
    use rtnetlink::MulticastGroup;
    let (connection, handle, mut events) =
        rtnetlink::new_multicast_connection(&[MulticastGroup::Ipv4Ifaddr, MulticastGroup::Ipv6Ifaddr])
            .map_err(|e| anyhow!("subscribe to address changes over netlink: {e}"))?;
    tokio::spawn(connection);
    let (tx, rx) = tokio::sync::watch::channel(0u64);
    tokio::spawn(async move {
        // The handle lives as long as the subscription: the connection ends with its last handle.
        let _handle = handle;
        while events.next().await.is_some() {
            tx.send_modify(|n| *n += 1);
        }
    });
    Ok(rx)
}

/// Every address on every interface of this network namespace.
pub async fn local_addresses(handle: &Handle) -> Result<std::collections::BTreeSet<IpAddr>> {
    let mut addrs = handle.address().get().execute();
    let mut all = std::collections::BTreeSet::new();
    while let Some(msg) = addrs.try_next().await.map_err(|e| anyhow!("list addresses: {e}"))? {
        for attr in &msg.attributes {
            if let AddressAttribute::Address(ip) | AddressAttribute::Local(ip) = attr {
                all.insert(*ip);
            }
        }
    }
    Ok(all)
}

/// The first global address of `family` on the interface of that family's default route in the
/// main table.
pub async fn default_route_address(handle: &Handle, family: Family) -> Result<Option<IpAddr>> {
    let filter = match family {
        Family::V4 => RouteMessageBuilder::<Ipv4Addr>::new().build(),
        Family::V6 => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    };
    let mut routes = handle.route().get(filter).execute();
    let mut oif = None;
    while let Some(msg) = routes.try_next().await.map_err(|e| anyhow!("list routes: {e}"))? {
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
    while let Some(msg) = addrs.try_next().await.map_err(|e| anyhow!("list addresses of link {oif}: {e}"))? {
        if msg.header.scope != netlink_packet_route::address::AddressScope::Universe || found.is_some() {
            continue;
        }
        found = msg.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) if Family::of(ip) == family => Some(*ip),
            _ => None,
        });
    }
    Ok(found)
}

/// Link index and MAC of `name` if it exists, and whether it is a VXLAN device.
async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<(u32, Option<[u8; 6]>, bool, u32)>> {
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
        Err(e) => Err(anyhow!("get link {name}: {e}")),
    }
}

/// Creates (or keeps) the VXLAN device `name`: VNI 1, UDP 8472, local `local` on link `dev`, no
/// learning (the agent programs every entry), MTU `mtu`, up. Returns its index and MAC.
pub async fn ensure_vxlan(handle: &Handle, name: &str, local: Ipv4Addr, dev: u32, mtu: u32) -> Result<(u32, [u8; 6])> {
    if let Some((index, _, vxlan, _)) = link_by_name(handle, name).await? {
        if !vxlan {
            return Err(anyhow!(
                "link {name} exists and is not a VXLAN device; delete it or give --vxlan-dev another name"
            ));
        }
        // A device from an earlier run may have another local address or parent: recreate it
        // then, since those cannot be changed in place.
        if !vxlan_matches(handle, index, local, dev).await? {
            eprintln!("recreating {name}: its VNI, port, local address or parent link differ");
            handle.link().del(index).execute().await.map_err(|e| anyhow!("delete link {name}: {e}"))?;
        }
    }
    if link_by_name(handle, name).await?.is_none() {
        let msg = LinkVxlan::new(name, VNI).port(VXLAN_PORT).local(local).dev(dev).learning(false).mtu(mtu).build();
        match handle.link().add(msg).execute().await {
            Ok(()) => eprintln!("created VXLAN device {name} (VNI {VNI}, port {VXLAN_PORT}, local {local}, mtu {mtu})"),
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(anyhow!("create VXLAN device {name}: {e}{}", permission_hint(&e))),
        }
    }
    let (index, mac, _, current_mtu) =
        link_by_name(handle, name).await?.ok_or_else(|| anyhow!("VXLAN device {name} vanished after creation"))?;
    let mac = mac.ok_or_else(|| anyhow!("VXLAN device {name} has no MAC address"))?;
    let mut set = LinkUnspec::new_with_index(index).up();
    if current_mtu != mtu {
        set = set.mtu(mtu);
    }
    handle.link().set(set.build()).execute().await.map_err(|e| anyhow!("set {name} up (mtu {mtu}): {e}"))?;
    Ok((index, mac))
}

async fn vxlan_matches(handle: &Handle, index: u32, local: Ipv4Addr, dev: u32) -> Result<bool> {
    use netlink_packet_route::link::InfoVxlan;
    let mut links = handle.link().get().match_index(index).execute();
    let Some(msg) = links.try_next().await.map_err(|e| anyhow!("get link {index}: {e}"))? else {
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
pub async fn ensure_only_v4_address(handle: &Handle, index: u32, addr: Ipv4Addr) -> Result<()> {
    let mut present = false;
    let mut addrs = handle.address().get().set_link_index_filter(index).execute();
    let mut stale = Vec::new();
    while let Some(msg) = addrs.try_next().await.map_err(|e| anyhow!("list addresses of link {index}: {e}"))? {
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
        handle.address().del(msg).execute().await.map_err(|e| anyhow!("remove old VTEP address: {e}"))?;
    }
    if !present {
        match handle.address().add(index, IpAddr::V4(addr), 32).execute().await {
            Ok(()) => {}
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) => return Err(anyhow!("add VTEP address {addr}/32: {e}")),
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
        gw,
        oif,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
    })
}

/// The agent's routes in the main table, both families, with the messages to delete them.
pub async fn own_routes(handle: &Handle) -> Result<Vec<(Route, RouteMessage)>> {
    let mut out = Vec::new();
    for family in [IpAddr::V4(Ipv4Addr::UNSPECIFIED), IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)] {
        let filter = match family {
            IpAddr::V4(_) => RouteMessageBuilder::<Ipv4Addr>::new().build(),
            IpAddr::V6(_) => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let mut routes = handle.route().get(filter).execute();
        while let Some(msg) = routes.try_next().await.map_err(|e| anyhow!("list routes: {e}"))? {
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

/// The message that adds `route` to the main table with the agent's protocol; as a delete it
/// removes exactly that route (the kernel matches destination, gateway, device and protocol).
fn route_message(route: &Route) -> Result<RouteMessage> {
    let mut builder = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(route.dst.network(), route.dst.prefix())
        .map_err(|e| anyhow!("route {route}: {e}"))?;
    if let Some(gw) = route.gw {
        builder = builder.gateway(gw).map_err(|e| anyhow!("route {route}: {e}"))?;
    }
    let mut builder = builder.protocol(RouteProtocol::from(RTPROT_CNI_RS));
    if let Some(oif) = route.oif {
        builder = builder.output_interface(oif);
    }
    if route.onlink {
        builder = builder.onlink();
    }
    Ok(builder.build())
}

/// Makes the agent's routes exactly `want`: lists them (one dump per family), then removes the
/// stale and adds the missing ones.
pub async fn reconcile_routes(handle: &Handle, want: &[Route]) -> Changes {
    let have = match own_routes(handle).await {
        Ok(have) => have,
        Err(e) => {
            eprintln!("error: {e}");
            return Changes { errors: 1, ..Changes::default() };
        }
    };
    let stale = have.iter().filter(|(route, _)| !want.iter().any(|w| satisfies(route, w)));
    let removals = stale.map(|(route, msg)| (route.clone(), Ok(msg.clone()))).collect();
    let missing = want.iter().filter(|route| !have.iter().any(|(h, _)| satisfies(h, route)));
    apply_routes(handle, removals, missing.cloned().collect()).await
}

/// Takes the agent's routes from `before` (what it last programmed) to `after` without listing
/// them: a route that went is deleted, a new or changed one is added (replacing the old one of
/// that destination). One request per route that differs, whatever the number of routes.
pub async fn apply_route_delta(handle: &Handle, before: &[Route], after: &[Route]) -> Changes {
    let (gone, new) = route_delta(before, after);
    let removals = gone.into_iter().map(|route| (route.clone(), route_message(route))).collect();
    apply_routes(handle, removals, new.into_iter().cloned().collect()).await
}

/// (routes to delete, routes to add) from `before` to `after`. A destination that stays with
/// another gateway is only added: the add replaces the old route, so it is never without one.
fn route_delta<'a>(before: &'a [Route], after: &'a [Route]) -> (Vec<&'a Route>, Vec<&'a Route>) {
    let gone = before.iter().filter(|b| !after.iter().any(|a| a.dst == b.dst)).collect();
    let new = after.iter().filter(|a| !before.contains(a)).collect();
    (gone, new)
}

/// Sends the removals, then the additions, each set together on the one socket (up to
/// IN_FLIGHT unanswered), so a first sync of a thousand routes does not wait for a thousand
/// round trips. A route already gone counts as removed by someone else, not as an error.
async fn apply_routes(handle: &Handle, removals: Vec<(Route, Result<RouteMessage>)>, additions: Vec<Route>) -> Changes {
    let mut changes = Changes::default();
    let mut deletes = Vec::new();
    for (route, msg) in removals {
        match msg {
            Ok(msg) => deletes.push((route, msg)),
            Err(e) => {
                eprintln!("error: remove {e}");
                changes.errors += 1;
            }
        }
    }
    let removed = futures::stream::iter(deletes.into_iter().map(|(route, msg)| {
        let request = handle.route().del(msg).execute();
        async move { (route, request.await) }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for (route, result) in removed {
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
    for route in additions {
        match route_message(&route) {
            Ok(msg) => messages.push((route, msg)),
            Err(e) => {
                eprintln!("error: {e}");
                changes.errors += 1;
            }
        }
    }
    let added = futures::stream::iter(messages.into_iter().map(|(route, msg)| {
        let request = handle.route().add(msg).replace().execute();
        async move { (route, request.await) }
    }))
    .buffer_unordered(IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for (route, result) in added {
        match result {
            Ok(()) => {
                eprintln!("added route {route}");
                changes.added += 1;
            }
            Err(e) => {
                eprintln!("error: add route {route}: {e}{}", permission_hint(&e));
                changes.errors += 1;
            }
        }
    }
    changes
}

/// The request that adds the permanent neighbour entry `vtep -> mac` on link `index`.
fn neighbour_request(handle: &Handle, index: u32, vtep: &Vtep) -> rtnetlink::NeighbourAddRequest {
    handle.neighbours().add(index, vtep.vtep).link_layer_address(&vtep.mac).state(NeighbourState::Permanent)
}

/// The request that adds the permanent FDB entry `mac -> dst` on VXLAN link `index`.
fn fdb_request(handle: &Handle, index: u32, mac: &[u8; 6], dst: Ipv4Addr) -> rtnetlink::NeighbourAddRequest {
    handle
        .neighbours()
        .add_bridge(index, mac)
        .destination(IpAddr::V4(dst))
        .flags(NeighbourFlags::Own)
        .state(NeighbourState::Permanent)
}

/// One FDB entry per remote node (its MAC), whichever of its families' VTEPs comes first.
fn fdb_entries(vteps: &[Vtep]) -> BTreeMap<[u8; 6], Ipv4Addr> {
    let mut fdb = BTreeMap::new();
    for v in vteps {
        fdb.entry(v.mac).or_insert(v.dst);
    }
    fdb
}

/// As [`apply_route_delta`], for the neighbour and FDB entries on VXLAN link `index`.
pub async fn apply_vtep_delta(handle: &Handle, index: u32, before: &[Vtep], after: &[Vtep]) -> Changes {
    let mut changes = Changes::default();
    let delta = vtep_delta(before, after);
    let gone_or_absent = |e: &rtnetlink::Error| matches!(errno(e), Some(libc::ENOENT) | Some(libc::ESRCH));
    for old in delta.neighbours_gone {
        let mut request = neighbour_request(handle, index, old);
        match handle.neighbours().del(request.message_mut().clone()).execute().await {
            Ok(()) => {
                eprintln!("removed neighbour {} on link {index}", old.vtep);
                changes.removed += 1;
            }
            Err(e) if gone_or_absent(&e) => {}
            Err(e) => {
                eprintln!("error: remove neighbour {} on link {index}: {e}", old.vtep);
                changes.errors += 1;
            }
        }
    }
    for (mac, dst) in &delta.fdb_gone {
        let mut request = fdb_request(handle, index, mac, *dst);
        match handle.neighbours().del(request.message_mut().clone()).execute().await {
            Ok(()) => {
                eprintln!("removed FDB entry {} on link {index}", format_mac(mac));
                changes.removed += 1;
            }
            Err(e) if gone_or_absent(&e) => {}
            Err(e) => {
                eprintln!("error: remove FDB entry {} on link {index}: {e}", format_mac(mac));
                changes.errors += 1;
            }
        }
    }
    for new in delta.neighbours_new {
        add_neighbour(handle, index, new, &mut changes).await;
    }
    for (mac, dst) in &delta.fdb_new {
        add_fdb(handle, index, mac, *dst, &mut changes).await;
    }
    changes
}

/// What [`apply_vtep_delta`] sends: neighbour entries whose address went, FDB entries whose MAC
/// went, and the new or changed ones of each (added with replace).
#[derive(Debug, PartialEq)]
struct VtepDelta<'a> {
    neighbours_gone: Vec<&'a Vtep>,
    fdb_gone: Vec<([u8; 6], Ipv4Addr)>,
    neighbours_new: Vec<&'a Vtep>,
    fdb_new: Vec<([u8; 6], Ipv4Addr)>,
}

fn vtep_delta<'a>(before: &'a [Vtep], after: &'a [Vtep]) -> VtepDelta<'a> {
    let (fdb_before, fdb_after) = (fdb_entries(before), fdb_entries(after));
    VtepDelta {
        neighbours_gone: before.iter().filter(|b| !after.iter().any(|a| a.vtep == b.vtep)).collect(),
        fdb_gone: fdb_before.iter().filter(|(mac, _)| !fdb_after.contains_key(*mac)).map(|(m, d)| (*m, *d)).collect(),
        neighbours_new: after.iter().filter(|a| !before.iter().any(|b| b.vtep == a.vtep && b.mac == a.mac)).collect(),
        fdb_new: fdb_after
            .iter()
            .filter(|(mac, dst)| fdb_before.get(*mac) != Some(*dst))
            .map(|(m, d)| (*m, *d))
            .collect(),
    }
}

async fn add_neighbour(handle: &Handle, index: u32, vtep: &Vtep, changes: &mut Changes) {
    match neighbour_request(handle, index, vtep).replace().execute().await {
        Ok(()) => {
            eprintln!("added neighbour {} lladdr {} on link {index}", vtep.vtep, format_mac(&vtep.mac));
            changes.added += 1;
        }
        Err(e) => {
            eprintln!("error: add neighbour {}: {e}", vtep.vtep);
            changes.errors += 1;
        }
    }
}

async fn add_fdb(handle: &Handle, index: u32, mac: &[u8; 6], dst: Ipv4Addr, changes: &mut Changes) {
    match fdb_request(handle, index, mac, dst).replace().execute().await {
        Ok(()) => {
            eprintln!("added FDB entry {} dst {dst} on link {index}", format_mac(mac));
            changes.added += 1;
        }
        Err(e) => {
            eprintln!("error: add FDB entry {} dst {dst}: {e}", format_mac(mac));
            changes.errors += 1;
        }
    }
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
    for w in want {
        let good =
            neigh.get(&w.vtep).is_some_and(|(mac, msg)| *mac == w.mac && msg.header.state == NeighbourState::Permanent);
        if !good {
            add_neighbour(handle, index, w, &mut changes).await;
        }
    }
    for (mac, dst) in fdb_entries(want) {
        if fdb.get(&mac).is_some_and(|(have, _)| *have == Some(dst)) {
            continue;
        }
        add_fdb(handle, index, &mac, dst, &mut changes).await;
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, gw: &str) -> Route {
        Route { dst: dst.parse().unwrap(), gw: Some(gw.parse().unwrap()), oif: None, onlink: false }
    }

    #[test]
    fn a_route_delta_touches_only_what_changed() {
        let before = [route("10.244.1.0/24", "10.95.0.11"), route("10.244.2.0/24", "10.95.0.12")];
        // Node 2 moved, node 3 joined, node 1 is unchanged.
        let after = [
            route("10.244.1.0/24", "10.95.0.11"),
            route("10.244.2.0/24", "10.95.0.22"),
            route("10.244.3.0/24", "10.95.0.13"),
        ];
        let (gone, new) = route_delta(&before, &after);
        assert!(gone.is_empty(), "a moved node's route is replaced, not deleted: {gone:?}");
        assert_eq!(new, [&after[1], &after[2]]);
        // Node 1 left.
        let (gone, new) = route_delta(&after, &after[1..]);
        assert_eq!((gone, new), (vec![&after[0]], vec![]));
        assert_eq!(route_delta(&after, &after), (vec![], vec![]));
    }

    #[test]
    fn a_vtep_delta_keeps_one_fdb_entry_per_node() {
        let mac1 = [2, 0, 0, 0, 0, 1];
        let mac2 = [2, 0, 0, 0, 0, 2];
        let dst1: Ipv4Addr = "10.97.0.11".parse().unwrap();
        let dst2: Ipv4Addr = "10.97.0.12".parse().unwrap();
        let v = |vtep: &str, mac, dst| Vtep { vtep: vtep.parse().unwrap(), mac, dst };
        let node1 = [v("10.244.1.0", mac1, dst1), v("fd00:10:244:1::", mac1, dst1)];
        let both = [node1[0].clone(), node1[1].clone(), v("10.244.2.0", mac2, dst2)];

        // Node 2 joins: its neighbour and its FDB entry, nothing of node 1's.
        let join = vtep_delta(&node1, &both);
        assert_eq!(join.neighbours_new, [&both[2]]);
        assert_eq!(join.fdb_new, [(mac2, dst2)]);
        assert!(join.neighbours_gone.is_empty() && join.fdb_gone.is_empty(), "{join:?}");

        // Node 1 leaves: both its neighbours, its one FDB entry.
        let leave = vtep_delta(&both, &both[2..]);
        assert_eq!(leave.neighbours_gone, [&both[0], &both[1]]);
        assert_eq!(leave.fdb_gone, [(mac1, dst1)]);
        assert!(leave.neighbours_new.is_empty() && leave.fdb_new.is_empty(), "{leave:?}");

        // Node 2 moves to another underlay address: only its FDB entry is rewritten.
        let moved = [both[0].clone(), both[1].clone(), v("10.244.2.0", mac2, dst1)];
        let change = vtep_delta(&both, &moved);
        assert_eq!(change.fdb_new, [(mac2, dst1)]);
        assert!(change.neighbours_new.is_empty() && change.neighbours_gone.is_empty() && change.fdb_gone.is_empty());
    }
}
