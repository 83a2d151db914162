//! The WireGuard device: created over rtnetlink (link kind `wireguard`), configured over the
//! kernel's `wireguard` generic netlink family (private key, port, one peer per other node). No
//! `wg` or `ip` process. Peers change one request each (set or remove); the full reconcile dumps
//! the device and repairs what differs. The device and its peers stay when the agent exits.

use crate::net::{errno, Changes};
use anyhow::{anyhow, Result};
use futures::{StreamExt, TryStreamExt};
use genetlink::GenetlinkHandle;
use ipnetwork::IpNetwork;
use netkit::Family;
use netlink_packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_generic::GenlMessage;
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo};
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute, WireguardCmd,
    WireguardMessage, WireguardPeer, WireguardPeerAttribute, WireguardPeerFlags,
};
use rtnetlink::{Handle, LinkUnspec, LinkWireguard};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// Outer IPv4 (20) or IPv6 (40) header, UDP (8), WireGuard's data header (16) and tag (16).
pub const OVERHEAD_V4: u32 = 60;
pub const OVERHEAD_V6: u32 = 80;

/// One peer as the agent wants it: the other node's key, its endpoint, its pod CIDRs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    pub key: [u8; 32],
    /// The node's name, for logs and metrics.
    pub node: String,
    pub endpoint: SocketAddr,
    /// Sorted.
    pub allowed: Vec<IpNetwork>,
}

/// What the device reports of a peer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerState {
    pub endpoint: Option<SocketAddr>,
    pub allowed: Vec<IpNetwork>,
    pub keepalive: u16,
    /// Unix seconds of the last handshake; 0 for none.
    pub last_handshake: i64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

/// The link `name` if it exists: its index, whether it is a WireGuard device, its MTU.
async fn link(handle: &Handle, name: &str) -> Result<Option<(u32, bool, u32)>> {
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(msg)) => {
            let mut wireguard = false;
            let mut mtu = 0;
            for attr in &msg.attributes {
                match attr {
                    LinkAttribute::Mtu(m) => mtu = *m,
                    LinkAttribute::LinkInfo(infos) => {
                        wireguard = infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Wireguard)))
                    }
                    _ => {}
                }
            }
            Ok(Some((msg.header.index, wireguard, mtu)))
        }
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(anyhow!("get link {name}: {e}")),
    }
}

/// Creates (or keeps) the WireGuard device `name` with MTU `mtu`, up; returns its index. A device
/// kept from an earlier run keeps its peers, so traffic flows while the agent restarts.
pub async fn ensure_device(handle: &Handle, name: &str, mtu: u32) -> Result<u32> {
    if link(handle, name).await?.is_none() {
        let msg = LinkWireguard::new(name).mtu(mtu).build();
        match handle.link().add(msg).execute().await {
            Ok(()) => eprintln!("created WireGuard device {name} (mtu {mtu})"),
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => {
                return Err(anyhow!(
                    "create WireGuard device {name}: {e} (this kernel has no wireguard module; load it, or use \
                     --backend host-gw or vxlan)"
                ))
            }
            Err(e) => return Err(anyhow!("create WireGuard device {name}: {e}{}", crate::net::permission_hint(&e))),
        }
    }
    let (index, wireguard, current_mtu) =
        link(handle, name).await?.ok_or_else(|| anyhow!("WireGuard device {name} vanished after creation"))?;
    if !wireguard {
        return Err(anyhow!(
            "link {name} exists and is not a WireGuard device; delete it or give --wireguard-dev another name"
        ));
    }
    let mut set = LinkUnspec::new_with_index(index).up();
    if current_mtu != mtu {
        set = set.mtu(mtu);
    }
    handle.link().set(set.build()).execute().await.map_err(|e| anyhow!("set {name} up (mtu {mtu}): {e}"))?;
    Ok(index)
}

pub fn connect() -> Result<GenetlinkHandle> {
    let (connection, handle, _) =
        genetlink::new_connection().map_err(|e| anyhow!("open a generic netlink socket: {e}"))?;
    tokio::spawn(connection);
    Ok(handle)
}

fn message(
    cmd: WireguardCmd,
    attributes: Vec<WireguardAttribute>,
    flags: u16,
) -> NetlinkMessage<GenlMessage<WireguardMessage>> {
    let mut msg = NetlinkMessage::from(GenlMessage::from_payload(WireguardMessage { cmd, attributes }));
    msg.header.flags = flags;
    msg.finalize();
    msg
}

/// Sends one request and reads its answers; an error answer is the request's error.
async fn exchange(
    handle: &mut GenetlinkHandle,
    what: &str,
    msg: NetlinkMessage<GenlMessage<WireguardMessage>>,
) -> Result<Vec<WireguardMessage>> {
    let mut answers = handle.request(msg).await.map_err(|e| anyhow!("{what}: {e}"))?;
    let mut out = Vec::new();
    while let Some(answer) = answers.next().await {
        let answer = answer.map_err(|e| anyhow!("{what}: decode the answer: {e}"))?;
        match answer.payload {
            NetlinkPayload::InnerMessage(genl) => out.push(genl.payload),
            NetlinkPayload::Error(err) => {
                if let Some(code) = err.code {
                    return Err(anyhow!("{what}: {}", std::io::Error::from_raw_os_error(code.get().saturating_abs())));
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Sets the private key and port. Peers are left as they are (no replace-peers flag).
pub async fn configure(
    handle: &mut GenetlinkHandle,
    index: u32,
    name: &str,
    private: [u8; 32],
    port: u16,
) -> Result<()> {
    let attributes = vec![
        WireguardAttribute::IfIndex(index),
        WireguardAttribute::PrivateKey(private),
        WireguardAttribute::ListenPort(port),
    ];
    let msg = message(WireguardCmd::SetDevice, attributes, NLM_F_REQUEST | NLM_F_ACK);
    exchange(handle, &format!("set the private key and port {port} of {name}"), msg).await.map(|_| ())
}

fn network(attrs: &[WireguardAllowedIpAttr]) -> Option<IpNetwork> {
    let mut ip = None;
    let mut cidr = None;
    for attr in attrs {
        match attr {
            WireguardAllowedIpAttr::IpAddr(a) => ip = Some(*a),
            WireguardAllowedIpAttr::Cidr(c) => cidr = Some(*c),
            _ => {}
        }
    }
    IpNetwork::new(ip?, cidr?).ok()
}

/// This device's own public key, port and peers (the kernel splits a large device over several
/// messages, a peer's allowed IPs among them).
pub async fn dump(
    handle: &mut GenetlinkHandle,
    index: u32,
    name: &str,
) -> Result<(Option<[u8; 32]>, u16, BTreeMap<[u8; 32], PeerState>)> {
    let msg = message(WireguardCmd::GetDevice, vec![WireguardAttribute::IfIndex(index)], NLM_F_REQUEST | NLM_F_DUMP);
    let mut public = None;
    let mut port = 0;
    let mut peers: BTreeMap<[u8; 32], PeerState> = BTreeMap::new();
    for part in exchange(handle, &format!("read WireGuard device {name}"), msg).await? {
        for attr in part.attributes {
            match attr {
                WireguardAttribute::PublicKey(k) => public = Some(k),
                WireguardAttribute::ListenPort(p) => port = p,
                WireguardAttribute::Peers(list) => {
                    for peer in list {
                        let Some(key) = peer.iter().find_map(|a| match a {
                            WireguardPeerAttribute::PublicKey(k) => Some(*k),
                            _ => None,
                        }) else {
                            continue;
                        };
                        let state = peers.entry(key).or_default();
                        for a in peer.0 {
                            match a {
                                WireguardPeerAttribute::Endpoint(e) => state.endpoint = Some(e),
                                WireguardPeerAttribute::PersistentKeepalive(k) => state.keepalive = k,
                                WireguardPeerAttribute::LastHandshake(t) => state.last_handshake = t.seconds,
                                WireguardPeerAttribute::RxBytes(b) => state.rx_bytes = b,
                                WireguardPeerAttribute::TxBytes(b) => state.tx_bytes = b,
                                WireguardPeerAttribute::AllowedIps(ips) => {
                                    state.allowed.extend(ips.iter().filter_map(|ip| network(&ip.0)))
                                }
                                _ => {}
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    for state in peers.values_mut() {
        state.allowed.sort();
    }
    Ok((public, port, peers))
}

fn allowed_ip(net: &IpNetwork) -> WireguardAllowedIp {
    let family = if net.is_ipv4() { WireguardAddressFamily::Ipv4 } else { WireguardAddressFamily::Ipv6 };
    WireguardAllowedIp(vec![
        WireguardAllowedIpAttr::Family(family),
        WireguardAllowedIpAttr::IpAddr(net.network()),
        WireguardAllowedIpAttr::Cidr(net.prefix()),
    ])
}

async fn set_peers(handle: &mut GenetlinkHandle, index: u32, what: &str, peers: Vec<WireguardPeer>) -> Result<()> {
    let attributes = vec![WireguardAttribute::IfIndex(index), WireguardAttribute::Peers(peers)];
    exchange(handle, what, message(WireguardCmd::SetDevice, attributes, NLM_F_REQUEST | NLM_F_ACK)).await.map(|_| ())
}

/// Adds `peer` or makes an existing one exactly `peer` (its allowed IPs replaced, not merged).
pub async fn set_peer(handle: &mut GenetlinkHandle, index: u32, peer: &Peer, keepalive: u16) -> Result<()> {
    let attrs = vec![
        WireguardPeerAttribute::PublicKey(peer.key),
        WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
        WireguardPeerAttribute::Endpoint(peer.endpoint),
        WireguardPeerAttribute::PersistentKeepalive(keepalive),
        WireguardPeerAttribute::AllowedIps(peer.allowed.iter().map(allowed_ip).collect()),
    ];
    let what = format!("set WireGuard peer {} ({})", crate::wgkey::encode(&peer.key), peer.endpoint);
    set_peers(handle, index, &what, vec![WireguardPeer(attrs)]).await
}

pub async fn remove_peer(handle: &mut GenetlinkHandle, index: u32, key: &[u8; 32]) -> Result<()> {
    let attrs =
        vec![WireguardPeerAttribute::PublicKey(*key), WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe)];
    let what = format!("remove WireGuard peer {}", crate::wgkey::encode(key));
    set_peers(handle, index, &what, vec![WireguardPeer(attrs)]).await
}

fn matches(have: &PeerState, want: &Peer, keepalive: u16) -> bool {
    have.endpoint == Some(want.endpoint) && have.allowed == want.allowed && have.keepalive == keepalive
}

/// Makes the device's peers exactly `want`: from `previous` (what the last sync left) when given,
/// else from a dump of the device. One request per peer that changes.
pub async fn sync_peers(
    handle: &mut GenetlinkHandle,
    index: u32,
    name: &str,
    want: &[Peer],
    previous: Option<&[Peer]>,
    keepalive: u16,
) -> Changes {
    let mut changes = Changes::default();
    let have: BTreeMap<[u8; 32], PeerState> = match previous {
        Some(list) => list
            .iter()
            .map(|p| {
                let state = PeerState {
                    endpoint: Some(p.endpoint),
                    allowed: p.allowed.clone(),
                    keepalive,
                    ..PeerState::default()
                };
                (p.key, state)
            })
            .collect(),
        None => match dump(handle, index, name).await {
            Ok((_, _, peers)) => peers,
            Err(e) => {
                eprintln!("error: {e}");
                changes.errors += 1;
                return changes;
            }
        },
    };
    let wanted: BTreeMap<[u8; 32], &Peer> = want.iter().map(|p| (p.key, p)).collect();
    for key in have.keys().filter(|k| !wanted.contains_key(*k)) {
        match remove_peer(handle, index, key).await {
            Ok(()) => changes.removed += 1,
            Err(e) => {
                eprintln!("error: {e}");
                changes.errors += 1;
            }
        }
    }
    for (key, peer) in &wanted {
        if have.get(key).is_some_and(|state| matches(state, peer, keepalive)) {
            continue;
        }
        match set_peer(handle, index, peer, keepalive).await {
            Ok(()) => changes.added += 1,
            Err(e) => {
                eprintln!("error: {e}");
                changes.errors += 1;
            }
        }
    }
    changes
}

/// The endpoint of a node for this node's underlay family.
pub fn endpoint(node_ips: &[IpAddr], family: Family, port: u16) -> Option<SocketAddr> {
    node_ips.iter().find(|ip| Family::of(ip) == family).map(|ip| SocketAddr::new(*ip, port))
}
