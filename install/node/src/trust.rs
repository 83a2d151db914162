//! What the agent believes of the datastore. Anyone who can write one record (a key under the etcd
//! prefix, an annotation on a Node) must not be able to take another node's pod range, pull traffic
//! to an address of their choosing, or make the agent fail its health check. So a record is used
//! only when:
//! - its key and content agree (etcd: the key is `block_key` of its first block, and its pod CIDRs
//!   are exactly block `i` of every family for one `i`; Kubernetes: at most one CIDR per family,
//!   each inside `--cluster-cidr` with no host bits);
//! - it claims nothing an older record (or this node) holds: overlapping claims go to the older
//!   holder (etcd `create_revision`, a Node's `creationTimestamp`, then the key);
//! - its node addresses are unicast addresses of another host (see [`check_node_ip`]);
//! - for VXLAN, its VTEP MAC is a unicast MAC no older node (nor this one) uses;
//! - for WireGuard, its public key is a valid Curve25519 key with a port, that no older record
//!   (nor this node) uses, and the first its node name carries: one key per node, one node per
//!   key. The key is bound to the record's own block key because it is part of the record's value,
//!   which is believed only at the key its pod CIDRs give.
//!
//! Everything here is pure; the reconcile loop logs each finding once and counts it in /metrics.

use crate::etcd::{block_key, blocks, NodeRecord};
use crate::net::{format_mac, parse_mac};
use crate::options::{Datastore, Options};
use crate::wgkey;
use ipnetwork::IpNetwork;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A record as read from the datastore. `age` orders claims (smaller is older): etcd's
/// `create_revision`, or a Node's `creationTimestamp` in Unix seconds (`i64::MAX` when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub record: NodeRecord,
    pub age: i64,
}

/// Why a record (or its VTEP MAC) is not used; the label of `cni_rs_node_records_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reason {
    /// etcd: the key is not the block key of the record's own first block.
    KeyMismatch,
    /// The pod CIDRs are not a block (or a set of blocks) of `--cluster-cidr`.
    NotABlock,
    /// A node address that is not a unicast address of another host.
    BadNodeIp,
    /// A node address that is one of this node's own addresses.
    OwnAddress,
    /// A VTEP MAC that is not a unicast MAC.
    BadVtepMac,
    /// A VTEP MAC an older node (or this one) already uses.
    DuplicateVtepMac,
    /// A WireGuard public key that is not a usable Curve25519 key, or has no port.
    BadWireguardKey,
    /// A WireGuard public key an older record (or this node) already uses, or a second key for one node.
    DuplicateWireguardKey,
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::KeyMismatch,
        Reason::NotABlock,
        Reason::BadNodeIp,
        Reason::OwnAddress,
        Reason::BadVtepMac,
        Reason::DuplicateVtepMac,
        Reason::BadWireguardKey,
        Reason::DuplicateWireguardKey,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Reason::KeyMismatch => "key_mismatch",
            Reason::NotABlock => "not_a_block",
            Reason::BadNodeIp => "bad_node_ip",
            Reason::OwnAddress => "own_address",
            Reason::BadVtepMac => "bad_vtep_mac",
            Reason::DuplicateVtepMac => "duplicate_vtep_mac",
            Reason::BadWireguardKey => "bad_wireguard_key",
            Reason::DuplicateWireguardKey => "duplicate_wireguard_key",
        }
    }
}

/// Something wrong with one record: a rejection, or a lost conflict (`reason` `None`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    pub key: String,
    pub reason: Option<Reason>,
    pub message: String,
}

pub fn overlaps(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

pub fn any_overlap(a: &[IpNetwork], b: &[IpNetwork]) -> bool {
    a.iter().any(|x| b.iter().any(|y| overlaps(x, y)))
}

fn list(cidrs: &[IpNetwork]) -> String {
    cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(",")
}

/// The index `i` for which `cidrs` is exactly `blocks(options, i)`.
pub fn block_index(options: &Options, cidrs: &[IpNetwork]) -> Option<u128> {
    let first = cidrs.first()?;
    let (net, size) = options.cluster.first()?;
    if first.prefix() != *size || first.is_ipv4() != net.is_ipv4() || !net.contains(first.network()) {
        return None;
    }
    let offset = match (first.network(), net.network()) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            u128::from(u32::from(a).checked_sub(u32::from(b))?) >> (32 - u32::from(*size))
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => u128::from(a).checked_sub(u128::from(b))? >> (128 - u32::from(*size)),
        _ => return None,
    };
    (blocks(options, offset)?.as_slice() == cidrs).then_some(offset)
}

/// Whether the record's key and content agree, as the datastore in use defines it.
pub fn check_claim(options: &Options, key: &str, record: &NodeRecord) -> Result<(), (Reason, String)> {
    let cidrs = list(&record.pod_cidrs);
    match options.datastore {
        Datastore::Etcd => {
            if block_index(options, &record.pod_cidrs).is_none() {
                return Err((
                    Reason::NotABlock,
                    format!("claims {cidrs}, which is not one block of each --cluster-cidr range"),
                ));
            }
            let want = block_key(options, &record.pod_cidrs[0]);
            if key != want {
                return Err((Reason::KeyMismatch, format!("claims {cidrs}, whose key is {want}, not {key}")));
            }
        }
        Datastore::Kubernetes => {
            let fits = |cidr: &IpNetwork| {
                cidr.network() == cidr.ip()
                    && options.cluster.iter().any(|(net, _)| {
                        net.is_ipv4() == cidr.is_ipv4() && cidr.prefix() >= net.prefix() && net.contains(cidr.network())
                    })
            };
            let v4 = record.pod_cidrs.iter().filter(|c| c.is_ipv4()).count();
            if !record.pod_cidrs.iter().all(fits) || v4 > 1 || record.pod_cidrs.len() - v4 > 1 {
                return Err((
                    Reason::NotABlock,
                    format!("claims podCIDRs {cidrs}, which are not one block per family of --cluster-cidr"),
                ));
            }
        }
    }
    Ok(())
}

/// The first and last address of `cidr`, and whether it is IPv4.
fn span(cidr: &IpNetwork) -> (bool, u128, u128) {
    let (start, host_bits) = match cidr.network() {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32 - u32::from(cidr.prefix())),
        IpAddr::V6(a) => (u128::from(a), 128 - u32::from(cidr.prefix())),
    };
    let last = if host_bits >= 128 { u128::MAX } else { start | ((1u128 << host_bits) - 1) };
    (cidr.is_ipv4(), start, last)
}

/// Disjoint address ranges by (family, first address), each with its last address and holder:
/// whether a block overlaps one held is one lookup, so screening n records costs n log n.
#[derive(Default)]
struct Ranges(BTreeMap<(bool, u128), (u128, usize)>);

impl Ranges {
    fn holder(&self, cidrs: &[IpNetwork]) -> Option<usize> {
        cidrs.iter().find_map(|cidr| {
            let (v4, first, last) = span(cidr);
            let ((family, _), (end, holder)) = self.0.range(..=(v4, last)).next_back()?;
            (*family == v4 && *end >= first).then_some(*holder)
        })
    }

    fn hold(&mut self, cidrs: &[IpNetwork], holder: usize) {
        for cidr in cidrs {
            let (v4, first, last) = span(cidr);
            self.0.insert((v4, first), (last, holder));
        }
    }
}

/// Of the claims that passed [`check_claim`], those believed: oldest first, each one that overlaps
/// neither `own` nor an older believed claim. The others come back as conflict findings naming
/// both holders.
pub fn resolve<'a>(
    own: Option<(&str, &NodeRecord)>,
    claims: Vec<(&'a str, &'a Claim)>,
) -> (Vec<(&'a str, &'a Claim)>, Vec<Finding>) {
    const OWN: usize = usize::MAX;
    let mut sorted = claims;
    sorted.sort_by(|a, b| (a.1.age, a.0).cmp(&(b.1.age, b.0)));
    let mut ranges = Ranges::default();
    if let Some((_, mine)) = own {
        ranges.hold(&mine.pod_cidrs, OWN);
    }
    let mut kept: Vec<(&'a str, &'a Claim)> = Vec::new();
    let mut findings = Vec::new();
    for (key, claim) in sorted {
        let record = &claim.record;
        let holder = ranges.holder(&record.pod_cidrs).map(|i| match (kept.get(i), own) {
            (Some((k, older)), _) => {
                format!("the older holder node {} ({k}, {})", older.record.node, list(&older.record.pod_cidrs))
            }
            (None, Some((own_key, mine))) => format!("this node {} ({own_key}, {})", mine.node, list(&mine.pod_cidrs)),
            (None, None) => "another holder".to_string(),
        });
        match holder {
            Some(holder) => findings.push(Finding {
                key: key.to_string(),
                reason: None,
                message: format!(
                    "node {} ({key}) claims {}, which {holder} holds; ignored",
                    record.node,
                    list(&record.pod_cidrs)
                ),
            }),
            None => {
                ranges.hold(&record.pod_cidrs, kept.len());
                kept.push((key, claim));
            }
        }
    }
    (kept, findings)
}

/// What this node is, for telling its addresses and MAC from another node's.
#[derive(Debug, Clone, Default)]
pub struct Me {
    /// Every address on this node (not only `--node-ip`).
    pub addresses: BTreeSet<IpAddr>,
    /// The subnets of this node's `--node-ip` addresses: their network and broadcast addresses
    /// are not hosts.
    pub subnets: Vec<IpNetwork>,
    pub vtep_mac: Option<[u8; 6]>,
    pub wireguard_key: Option<[u8; 32]>,
}

/// A node address must be a unicast address of another host. Link-local addresses are refused
/// too: they do not reach past one link, an IPv6 one needs an interface the record cannot name (a
/// route via it is a netlink error), and 169.254.169.254 is where clouds serve instance
/// credentials, a place no pod range should be routed to.
pub fn check_node_ip(ip: IpAddr, me: &Me) -> Result<(), (Reason, String)> {
    let bad = |why: &str| Err((Reason::BadNodeIp, format!("{ip} is {why}")));
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_unspecified() || v4.octets()[0] == 0 {
                return bad("unspecified");
            }
            if v4.is_loopback() {
                return bad("a loopback address");
            }
            if v4.is_multicast() || v4.octets()[0] >= 240 {
                return bad("a multicast, broadcast or reserved address");
            }
            if v4.is_link_local() {
                return bad("link-local");
            }
        }
        IpAddr::V6(v6) => {
            if v6.is_unspecified() {
                return bad("unspecified");
            }
            if v6.is_loopback() {
                return bad("a loopback address");
            }
            if v6.is_multicast() {
                return bad("a multicast address");
            }
            if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                return bad("link-local");
            }
            if v6.to_ipv4_mapped().is_some() {
                return bad("an IPv4-mapped address");
            }
        }
    }
    // A /31 or /32 (/127, /128) has no network or broadcast address. IPv6 has no broadcast;
    // its network address is the subnet-router anycast address, which is not one node.
    for subnet in &me.subnets {
        let special = match subnet {
            IpNetwork::V4(v4) => v4.prefix() <= 30 && (ip == subnet.broadcast() || ip == IpAddr::V4(v4.network())),
            IpNetwork::V6(v6) => v6.prefix() <= 126 && ip == IpAddr::V6(v6.network()),
        };
        if special {
            return bad(&format!("the network or broadcast address of this node's subnet {subnet}"));
        }
    }
    if me.addresses.contains(&ip) {
        return Err((Reason::OwnAddress, format!("{ip} is an address of this node")));
    }
    Ok(())
}

/// A VTEP MAC must be a unicast MAC: the all-zero MAC is the VXLAN device's default destination
/// (it would receive every frame with no other entry), a multicast one is not a station.
pub fn check_mac(text: &str) -> Result<[u8; 6], (Reason, String)> {
    let mac = parse_mac(text).ok_or((Reason::BadVtepMac, format!("VTEP MAC {text:?} is not a MAC address")))?;
    if mac == [0; 6] {
        return Err((Reason::BadVtepMac, format!("VTEP MAC {text} is all zero")));
    }
    if mac[0] & 1 == 1 {
        return Err((Reason::BadVtepMac, format!("VTEP MAC {text} is a multicast or broadcast address")));
    }
    Ok(mac)
}

/// A WireGuard public key must decode to 32 bytes and be a point of large order: with a
/// low-order point (the all-zero key among them) every shared secret is one of a few known values,
/// so the kernel could never complete a handshake, and a key nobody holds the secret of would sit
/// in the device as a peer. A port must come with it (0 is not one).
pub fn check_wireguard_key(text: &str, port: Option<u16>) -> Result<[u8; 32], (Reason, String)> {
    let key = wgkey::decode(text)
        .ok_or((Reason::BadWireguardKey, format!("WireGuard key {text:?} is not base64 of 32 bytes")))?;
    let probe = x25519_dalek::StaticSecret::from([0x5a; 32]);
    if !probe.diffie_hellman(&x25519_dalek::PublicKey::from(key)).was_contributory() {
        return Err((Reason::BadWireguardKey, format!("WireGuard key {text} is a low-order point, not a public key")));
    }
    match port {
        Some(port) if port != 0 => Ok(key),
        _ => Err((Reason::BadWireguardKey, format!("WireGuard key {text} comes with no UDP port (1-65535)"))),
    }
}

/// A record the agent may route to: its usable VTEP MAC and WireGuard key and port (`None` when it
/// has none or it was refused).
#[derive(Debug, Clone)]
pub struct Peer<'a> {
    pub record: &'a NodeRecord,
    pub mac: Option<[u8; 6]>,
    pub wireguard: Option<([u8; 32], u16)>,
}

/// The peers the agent routes to, and what it refused of the others.
pub fn screen<'a>(
    options: &Options,
    own: (&str, &NodeRecord),
    me: &Me,
    claims: &'a BTreeMap<String, Claim>,
) -> (Vec<Peer<'a>>, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut reject = |key: &str, node: &str, (reason, why): (Reason, String)| {
        findings.push(Finding {
            key: key.to_string(),
            reason: Some(reason),
            message: format!("node {node} ({key}): {why}; ignored"),
        });
    };
    let mut valid = Vec::new();
    for (key, claim) in claims {
        let record = &claim.record;
        if let Err(e) = check_claim(options, key, record) {
            reject(key, &record.node, e);
            continue;
        }
        if let Some(e) = record.node_ips.iter().find_map(|ip| check_node_ip(*ip, me).err()) {
            reject(key, &record.node, e);
            continue;
        }
        valid.push((key.as_str(), claim));
    }
    let (kept, conflicts) = resolve(Some(own), valid);
    // MACs go to the older holder too; this node's own MAC is never given away.
    let mut macs: BTreeMap<[u8; 6], String> = BTreeMap::new();
    if let Some(mac) = me.vtep_mac {
        macs.insert(mac, format!("this node {}", own.1.node));
    }
    // Keys too go to the older holder; a node name keeps the key of its oldest record.
    let mut wireguard_keys: BTreeMap<[u8; 32], String> = BTreeMap::new();
    if let Some(mine) = me.wireguard_key {
        wireguard_keys.insert(mine, format!("this node {}", own.1.node));
    }
    let mut keyed_nodes: BTreeMap<&str, String> = BTreeMap::new();
    keyed_nodes.insert(own.1.node.as_str(), format!("this node's record ({})", own.0));
    let mut peers = Vec::new();
    for (key, claim) in kept {
        let record = &claim.record;
        let mut mac = None;
        if let Some(text) = &record.vtep_mac {
            match check_mac(text) {
                Ok(parsed) => match macs.get(&parsed) {
                    Some(holder) => reject(
                        key,
                        &record.node,
                        (Reason::DuplicateVtepMac, format!("VTEP MAC {} is used by {holder}", format_mac(&parsed))),
                    ),
                    None => {
                        macs.insert(parsed, format!("node {} ({key})", record.node));
                        mac = Some(parsed);
                    }
                },
                Err(e) => reject(key, &record.node, e),
            }
        }
        let mut wireguard = None;
        if let Some(text) = &record.wireguard_key {
            match check_wireguard_key(text, record.wireguard_port) {
                Ok(parsed) => {
                    if let Some(holder) = wireguard_keys.get(&parsed) {
                        reject(
                            key,
                            &record.node,
                            (Reason::DuplicateWireguardKey, format!("WireGuard key {text} is used by {holder}")),
                        );
                    } else if let Some(holder) = keyed_nodes.get(record.node.as_str()) {
                        reject(
                            key,
                            &record.node,
                            (
                                Reason::DuplicateWireguardKey,
                                format!("node {} already has a WireGuard key in {holder}", record.node),
                            ),
                        );
                    } else {
                        wireguard_keys.insert(parsed, format!("node {} ({key})", record.node));
                        keyed_nodes.insert(record.node.as_str(), format!("the older record {key}"));
                        wireguard = record.wireguard_port.map(|port| (parsed, port));
                    }
                }
                Err(e) => reject(key, &record.node, e),
            }
        }
        peers.push(Peer { record, mac, wireguard });
    }
    findings.extend(conflicts);
    (peers, findings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(datastore: &str) -> Options {
        let args = [
            "--node-name",
            "n1",
            "--datastore",
            datastore,
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--cluster-cidr",
            "10.244.0.0/16,fd00:10:244::/56",
            "--node-cidr-size",
            "24,64",
            "--node-ip",
            "10.95.0.11",
        ];
        Options::parse(args.iter().map(|s| s.to_string()), None).unwrap().unwrap()
    }

    fn record(node: &str, ips: &[&str], cidrs: &[&str], mac: Option<&str>) -> NodeRecord {
        NodeRecord {
            node: node.into(),
            node_ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            pod_cidrs: cidrs.iter().map(|s| s.parse().unwrap()).collect(),
            vtep_mac: mac.map(String::from),
            wireguard_key: None,
            wireguard_port: None,
        }
    }

    fn claim(node: &str, ip: &str, cidrs: &[&str], age: i64) -> Claim {
        Claim { record: record(node, &[ip], cidrs, None), age }
    }

    #[test]
    fn etcd_key_and_content_must_agree() {
        let o = options("etcd");
        let good = record("a", &["10.95.0.12"], &["10.244.5.0/24", "fd00:10:244:5::/64"], None);
        assert_eq!(block_index(&o, &good.pod_cidrs), Some(5));
        assert_eq!(check_claim(&o, "/cni-rs/subnets/10.244.5.0-24", &good), Ok(()));
        for key in ["/cni-rs/subnets/10.244.6.0-24", "/cni-rs/subnets/x", "/cni-rs/subnets/10.244.5.0-24/"] {
            assert_eq!(check_claim(&o, key, &good).unwrap_err().0, Reason::KeyMismatch, "{key}");
        }
        for cidrs in [
            &["10.244.5.0/24", "fd00:10:244:6::/64"][..], // two indexes
            &["10.244.5.0/24"],                           // one family missing
            &["fd00:10:244:5::/64", "10.244.5.0/24"],     // families swapped
            &["10.244.4.0/23", "fd00:10:244:4::/63"],     // wrong size
            &["10.244.5.1/24", "fd00:10:244:5::/64"],     // host bits
            &["192.168.5.0/24", "fd00:99:5::/64"],        // outside the range
            &["0.0.0.0/0", "::/0"],
            &["10.244.5.0/24", "fd00:10:244:5::/64", "10.244.6.0/24"],
            &[],
        ] {
            let r = record("a", &["10.95.0.12"], cidrs, None);
            let key = r.pod_cidrs.first().map(|c| block_key(&o, c)).unwrap_or_default();
            assert_eq!(check_claim(&o, &key, &r).unwrap_err().0, Reason::NotABlock, "{cidrs:?}");
        }
    }

    #[test]
    fn kubernetes_pod_cidrs_are_one_block_per_family_inside_the_cluster_range() {
        let o = options("kubernetes");
        let ok = record("a", &[], &["10.244.5.0/24", "fd00:10:244:5::/64"], None);
        assert_eq!(check_claim(&o, "a", &ok), Ok(()));
        assert_eq!(check_claim(&o, "a", &record("a", &[], &["10.244.8.0/22"], None)), Ok(()));
        for cidrs in [&["10.244.5.0/24", "10.244.6.0/24"][..], &["10.0.0.0/8"], &["10.244.5.1/24"], &["::/0"]] {
            assert_eq!(check_claim(&o, "a", &record("a", &[], cidrs, None)).unwrap_err().0, Reason::NotABlock);
        }
    }

    #[test]
    fn the_older_holder_wins_an_overlap_and_this_node_always_keeps_its_block() {
        let older = claim("old", "10.95.0.12", &["10.244.4.0/24"], 10);
        let newer = claim("new", "10.95.0.13", &["10.244.4.0/23"], 20);
        let apart = claim("apart", "10.95.0.14", &["10.244.9.0/24"], 30);
        let mine = record("n1", &["10.95.0.11"], &["10.244.9.0/25"], None);
        // Given newest first: the order of the input does not matter.
        let (kept, found) = resolve(None, vec![("k-new", &newer), ("k-apart", &apart), ("k-old", &older)]);
        assert_eq!(kept.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["k-old", "k-apart"]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].key, "k-new");
        assert_eq!(found[0].reason, None);
        assert!(found[0].message.contains("node new") && found[0].message.contains("node old"), "{found:?}");
        let (kept, found) = resolve(Some(("mine", &mine)), vec![("k-apart", &apart), ("k-old", &older)]);
        assert_eq!(kept.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["k-old"]);
        assert!(found[0].message.contains("this node n1"), "{found:?}");
        // Across families nothing overlaps (::af4:400 is 10.244.4.0 as a number); a wide block overlaps every block inside it.
        let v6 = claim("v6", "10.95.0.16", &["::af4:400/120"], 1);
        let wide = claim("wide", "10.95.0.17", &["10.0.0.0/8"], 40);
        let (kept, found) = resolve(None, vec![("k-v6", &v6), ("k-wide", &wide), ("k-old", &older)]);
        assert_eq!(kept.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["k-v6", "k-old"]);
        assert_eq!(found[0].key, "k-wide");
        // Same age: the key decides, so every node decides alike.
        let twin = claim("twin", "10.95.0.15", &["10.244.4.0/24"], 10);
        let (kept, _) = resolve(None, vec![("k-b", &older), ("k-a", &twin)]);
        assert_eq!(kept[0].0, "k-a");
    }

    #[test]
    fn node_ips_must_be_unicast_addresses_of_another_host() {
        let me = Me {
            addresses: ["10.95.0.11", "192.168.50.1", "fd00:95::11"].iter().map(|s| s.parse().unwrap()).collect(),
            subnets: vec!["10.95.0.0/24".parse().unwrap(), "fd00:95::/64".parse().unwrap()],
            vtep_mac: None,
            wireguard_key: None,
        };
        for ok in ["10.95.0.12", "10.96.0.13", "fd00:95::12", "2001:db8::1"] {
            assert_eq!(check_node_ip(ok.parse().unwrap(), &me), Ok(()), "{ok}");
        }
        for bad in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "224.0.0.1",
            "239.1.1.1",
            "255.255.255.255",
            "240.0.0.1",
            "10.95.0.255",
            "10.95.0.0",
            "fd00:95::",
            "169.254.169.254",
            "::",
            "::1",
            "ff02::1",
            "fe80::1",
            "::ffff:10.95.0.12",
        ] {
            assert_eq!(check_node_ip(bad.parse().unwrap(), &me).unwrap_err().0, Reason::BadNodeIp, "{bad}");
        }
        for own in ["10.95.0.11", "192.168.50.1", "fd00:95::11"] {
            assert_eq!(check_node_ip(own.parse().unwrap(), &me).unwrap_err().0, Reason::OwnAddress, "{own}");
        }
    }

    #[test]
    fn vtep_macs_must_be_unicast() {
        assert_eq!(check_mac("02:00:00:00:00:13"), Ok([2, 0, 0, 0, 0, 0x13]));
        for bad in ["00:00:00:00:00:00", "01:00:5e:00:00:01", "ff:ff:ff:ff:ff:ff", "33:33:00:00:00:01", "zz", ""] {
            assert_eq!(check_mac(bad).unwrap_err().0, Reason::BadVtepMac, "{bad}");
        }
    }

    #[test]
    fn screen_keeps_only_usable_peers_and_gives_a_mac_to_its_older_holder() {
        let o = options("etcd");
        let me = Me {
            addresses: ["10.95.0.11".parse().unwrap()].into(),
            subnets: vec!["10.95.0.0/24".parse().unwrap()],
            vtep_mac: Some([2, 0, 0, 0, 0, 0x11]),
            wireguard_key: None,
        };
        let mine = record("n1", &["10.95.0.11"], &["10.244.0.0/24", "fd00:10:244::/64"], None);
        let block = |i: u8| [format!("10.244.{i}.0/24"), format!("fd00:10:244:{i:x}::/64")];
        let mut claims = BTreeMap::new();
        let mut put = |i: u8, node: &str, ip: &str, mac: &str, age: i64| {
            let b = block(i);
            let r = record(node, &[ip], &[b[0].as_str(), b[1].as_str()], Some(mac));
            claims.insert(format!("/cni-rs/subnets/10.244.{i}.0-24"), Claim { record: r, age });
        };
        put(1, "older", "10.95.0.12", "02:00:00:00:00:12", 5);
        put(2, "copycat", "10.95.0.13", "02:00:00:00:00:12", 9);
        put(3, "mine-mac", "10.95.0.14", "02:00:00:00:00:11", 9);
        put(4, "zero", "10.95.0.15", "00:00:00:00:00:00", 9);
        put(5, "bcast", "10.95.0.255", "02:00:00:00:00:16", 9);
        put(6, "self", "10.95.0.11", "02:00:00:00:00:17", 9);
        let wrong = claims.get("/cni-rs/subnets/10.244.1.0-24").unwrap().clone();
        claims.insert("/cni-rs/subnets/10.244.7.0-24".into(), wrong);
        let overwrite =
            Claim { record: record("thief", &["10.95.0.19"], &block(0).each_ref().map(|s| s.as_str()), None), age: 1 };
        claims.insert("/cni-rs/subnets/10.244.0.0-24".into(), overwrite);

        let (peers, findings) = screen(&o, ("/cni-rs/subnets/10.244.0.0-24", &mine), &me, &claims);
        let used: Vec<(&str, Option<[u8; 6]>)> = peers.iter().map(|p| (p.record.node.as_str(), p.mac)).collect();
        assert_eq!(
            used,
            [("older", Some([2, 0, 0, 0, 0, 0x12])), ("copycat", None), ("mine-mac", None), ("zero", None)],
            "{findings:#?}"
        );
        let reasons: BTreeSet<(String, Option<Reason>)> =
            findings.iter().map(|f| (f.key.rsplit('/').next().unwrap().to_string(), f.reason)).collect();
        let want: BTreeSet<(String, Option<Reason>)> = [
            ("10.244.0.0-24", None),
            ("10.244.2.0-24", Some(Reason::DuplicateVtepMac)),
            ("10.244.3.0-24", Some(Reason::DuplicateVtepMac)),
            ("10.244.4.0-24", Some(Reason::BadVtepMac)),
            ("10.244.5.0-24", Some(Reason::BadNodeIp)),
            ("10.244.6.0-24", Some(Reason::OwnAddress)),
            ("10.244.7.0-24", Some(Reason::KeyMismatch)),
        ]
        .into_iter()
        .map(|(k, r)| (k.to_string(), r))
        .collect();
        assert_eq!(reasons, want, "{findings:#?}");
    }

    #[test]
    fn wireguard_keys_must_be_usable_and_go_to_their_older_holder_one_per_node() {
        let o = options("etcd");
        let key = |seed: u8| crate::wgkey::KeyPair::from_private([seed; 32]).public_base64();
        assert_eq!(check_wireguard_key(&key(1), Some(51820)).map(|_| ()), Ok(()));
        let me = Me {
            addresses: ["10.95.0.11".parse().unwrap()].into(),
            subnets: vec!["10.95.0.0/24".parse().unwrap()],
            vtep_mac: None,
            wireguard_key: crate::wgkey::decode(&key(100)),
        };
        let mine = record("n1", &["10.95.0.11"], &["10.244.0.0/24", "fd00:10:244::/64"], None);
        let mut claims = BTreeMap::new();
        let mut put = |i: u8, node: &str, wg: Option<(String, Option<u16>)>, age: i64| {
            let b = [format!("10.244.{i}.0/24"), format!("fd00:10:244:{i:x}::/64")];
            let mut r = record(node, &[&format!("10.95.0.{}", 20 + i)], &[b[0].as_str(), b[1].as_str()], None);
            (r.wireguard_key, r.wireguard_port) = wg.map_or((None, None), |(k, p)| (Some(k), p));
            claims.insert(format!("/cni-rs/subnets/10.244.{i}.0-24"), Claim { record: r, age });
        };
        let zero = crate::wgkey::encode(&[0; 32]);
        let mut order4 = [0u8; 32];
        order4[0] = 1;
        put(1, "older", Some((key(1), Some(51820))), 5);
        put(2, "copycat", Some((key(1), Some(51820))), 9);
        put(3, "mine-key", Some((key(100), Some(51820))), 9);
        put(4, "zero", Some((zero, Some(51820))), 9);
        put(5, "order4", Some((crate::wgkey::encode(&order4), Some(51820))), 9);
        put(6, "noport", Some((key(6), None)), 9);
        put(7, "port0", Some((key(7), Some(0))), 9);
        put(8, "short", Some(("AAAA".into(), Some(51820))), 9);
        put(9, "older", Some((key(9), Some(51821))), 8);
        put(10, "n1", Some((key(10), Some(51820))), 9);
        put(11, "keyless", None, 9);
        put(12, "other", Some((key(12), Some(4500))), 9);

        let (peers, findings) = screen(&o, ("/cni-rs/subnets/10.244.0.0-24", &mine), &me, &claims);
        assert_eq!(peers.len(), 12, "a refused key does not refuse the pod CIDRs: {findings:#?}");
        let keyed: Vec<(&str, [u8; 32], u16)> =
            peers.iter().filter_map(|p| p.wireguard.map(|(k, port)| (p.record.node.as_str(), k, port))).collect();
        let decoded = |seed| crate::wgkey::decode(&key(seed)).unwrap();
        assert_eq!(keyed, [("older", decoded(1), 51820), ("other", decoded(12), 4500)], "{findings:#?}");
        let reasons: BTreeSet<(String, Option<Reason>)> =
            findings.iter().map(|f| (f.key.rsplit('/').next().unwrap().to_string(), f.reason)).collect();
        let want: BTreeSet<(String, Option<Reason>)> = [
            ("10.244.2.0-24", Reason::DuplicateWireguardKey),
            ("10.244.3.0-24", Reason::DuplicateWireguardKey),
            ("10.244.4.0-24", Reason::BadWireguardKey),
            ("10.244.5.0-24", Reason::BadWireguardKey),
            ("10.244.6.0-24", Reason::BadWireguardKey),
            ("10.244.7.0-24", Reason::BadWireguardKey),
            ("10.244.8.0-24", Reason::BadWireguardKey),
            ("10.244.9.0-24", Reason::DuplicateWireguardKey),
            ("10.244.10.0-24", Reason::DuplicateWireguardKey),
        ]
        .into_iter()
        .map(|(k, r)| (k.to_string(), Some(r)))
        .collect();
        assert_eq!(reasons, want, "{findings:#?}");
        let second = findings.iter().find(|f| f.key.ends_with("10.244.9.0-24")).unwrap();
        assert!(second.message.contains("node older already has a WireGuard key"), "{second:?}");
    }
}
