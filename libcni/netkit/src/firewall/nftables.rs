//! The nftables backend: our own tables with a constant set of base chains. Port mappings and
//! masquerade are elements of shared hash sets and maps ([`flat`]: no chain, rule or jump per pod,
//! and DEL gives elements an expiry rather than deleting them). What is left here is the earlier
//! layout, a regular chain per container reached through verdict maps, which still serves the MAC
//! spoof check, port mappings with `conditionsV4`/`conditionsV6` (free nft syntax needs a rule of its
//! own), and the removal of pods an earlier version set up.
//!
//! The kernel allows 1024 hooks per hook point and copies the hook array on every registration, so
//! a base chain per container stops ADD at a few hundred pods and makes it slower with every pod;
//! every new connection would also walk one chain per pod. Here the base chains are shared and fixed
//! (four in the portmap table, one each in the others); a container owns elements (and, in the
//! chain layout, regular chains and the map elements that lead to them), so a lookup is one hash
//! probe however many pods there are.
//!
//! The chain layout:
//!
//! ```text
//! table inet cni_rs_portmap {
//!   map hostports4 { type ipv4_addr . inet_proto . inet_service : verdict }  # hostIP-bound mappings
//!   map hostports6 { type ipv6_addr . inet_proto . inet_service : verdict }
//!   map anyports4  { type inet_proto . inet_service : verdict }              # any host address
//!   map anyports6  { type inet_proto . inet_service : verdict }
//!   map snat4 { type ipv4_addr : verdict }  map snat6 { type ipv6_addr : verdict }  # pod IP -> its -post
//!   chain dispatch { ip daddr . meta l4proto . th dport vmap @hostports4
//!                    ip6 daddr . meta l4proto . th dport vmap @hostports6
//!                    meta nfproto ipv4 meta l4proto . th dport vmap @anyports4
//!                    meta nfproto ipv6 meta l4proto . th dport vmap @anyports6
//!                    ...then the flat layout's marks and dnat maps }
//!   chain prerouting  { type nat hook prerouting priority dstnat; fib daddr type local jump dispatch }
//!   chain output      { type nat hook output priority -100;       fib daddr type local jump dispatch }
//!   chain postrouting { type nat hook postrouting priority srcnat;
//!                       ct status dnat ip daddr vmap @snat4; ct status dnat ip6 daddr vmap @snat6; ... }
//!   chain input { type filter hook input priority filter;  ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8
//!                 ... drop }                                 (route_localnet: see LOCALNET_RULES)
//!   chain pm-<net8>-<id16>-dnat { meta nfproto ipv4 <conditionsV4> [ip daddr H] tcp dport 8080
//!                                   dnat ip to 10.22.0.5:80 comment "anyports4=tcp . 8080;snat4=10.22.0.5" }
//!   chain pm-<net8>-<id16>-post { ct status dnat ip daddr 10.22.0.5 ip saddr 10.22.0.0/16
//!                                   meta l4proto tcp ct original proto-dst 8080 masquerade
//!                                 (the same from 127.0.0.1: IPv4 localhost) }               (snat only)
//! }
//! table inet cni_rs_masq {
//!   map masq4 { type ipv4_addr : verdict }  map masq6 { type ipv6_addr : verdict }
//!   chain postrouting { type nat hook postrouting priority srcnat; ip saddr vmap @masq4; ip6 saddr vmap @masq6; ... }
//!   chain mq-<net8>-<id16> { ip saddr 10.22.0.5 ip daddr != 10.22.0.0/16 ip daddr != 224.0.0.0/4
//!                              masquerade comment "masq4=10.22.0.5" }     (only pods of earlier versions)
//! }
//! table bridge cni_rs_macspoof {
//!   map ports { type ifname : verdict }
//!   chain prerouting { type filter hook prerouting priority -300; iifname vmap @ports }
//!   chain ms-<net8>-<id16> { iifname "veth…" ether saddr != 0a:58:… drop comment "ports=veth…" }
//! }
//! ```
//! `<net8>` hashes the network name (so GC can tell a network's chains apart) and `<id16>` hashes
//! (network, container id, ifname). A map falls through when its key is absent, and so does a pod
//! chain whose conditions do not match: the dispatch goes on to the next map, so a hostIP-bound
//! mapping wins over an any-address one on the same port, as the more specific.
//!
//! Each rule of a container's first chain names, in its comment, the map elements that lead to the
//! container's chains. That is what lets DEL work from the container id alone (no IPs, no mappings):
//! it lists that one chain over netlink (a rule dump of that chain, small whatever the pod count;
//! absent means nothing to do), then one batch deletes the elements and flushes and deletes the
//! chains. Element deletion is by key only, so each one is written
//! `add element K : jump <ours>; delete element K`: the add is a no-op when the element is ours,
//! recreates it when a parallel DEL got there first, and fails when another container owns the key,
//! in which case that element is left out and the batch rerun. The kernel answers every message of
//! a batch, so a failure is traced to its element by the message's index ([`nfnl::Batch::send_each`]).
//!
//! Batches are sent in process over netlink ([`nfnl`]), built from the same plan as their nft text
//! and listing exactly like it, so pods added either way are handled alike. Only a pod with
//! `conditionsV4`/`conditionsV6` (free nft syntax) has its batches run by `nft -f -`, whose error
//! line numbers play the part of the message indexes. CHECK (its element probe) and GC (a listing
//! of the whole table) of this layout still run `nft`.
//!
//! ADD is one batch of additions only (`create chain`, rules, `add element`) — a transaction that
//! deletes nothing skips the kernel's wait for an RCU grace period (about 10 ms here). `create chain`
//! fails when the container's chain already exists: a repeated ADD then lists the chain and replaces
//! the old rules and elements in one batch. Ports are exclusive: a host port (per protocol, family
//! and host address) that another container holds fails ADD, naming the port, and adds nothing,
//! whichever layout holds it. Bridge ports belong to the newest ADD: a stale container's element
//! for a reused port is replaced. The maps, sets and shared chains are created (and the shared
//! chains refilled) by the first ADD that finds something missing. Tables of the earliest layout
//! (one base chain per container) are cleaned up by DEL and GC like ours.

use super::exec::{self, one_line, run};
use super::nfnl::{
    self, BaseChain, Batch, ChainType, Family, Field, Hook, KeyPart, KeyType, SetData, SetSpec, Verdict,
};
use super::{check_failed, sha512_hex, BackendKind, Firewall, Masquerade, PortMap, Protocol};
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

mod flat;

pub(crate) const PORTMAP_TABLE: &str = "cni_rs_portmap";
pub(crate) const MASQ_TABLE: &str = "cni_rs_masq";
pub(crate) const MACSPOOF_TABLE: &str = "cni_rs_macspoof";

/// A chain every container shares: created (and refilled) only when the table's setup is missing.
#[derive(Debug)]
struct SharedChain {
    name: &'static str,
    /// The base chain's hook, priority and policy; None for a regular chain.
    spec: Option<&'static str>,
    /// The same for netlink.
    base: Option<BaseChain>,
    /// Each rule as nft text and as the netlink rule that lists the same.
    rules: &'static [SharedRule],
}

/// A shared chain's rule: nft text, and the netlink rule that lists the same.
type SharedRule = (&'static str, fn() -> nfnl::Rule);

const fn base_chain(hook: Hook, priority: i32, kind: ChainType) -> Option<BaseChain> {
    Some(BaseChain { hook, priority, kind, policy_accept: true })
}

fn inet() -> nfnl::Rule {
    nfnl::Rule::new(Family::Inet)
}

const ADDR_PROTO_PORT4: &[Field] = &[Field::IpDaddr, Field::L4proto, Field::ThDport];
const ADDR_PROTO_PORT6: &[Field] = &[Field::Ip6Daddr, Field::L4proto, Field::ThDport];
const PROTO_PORT: &[Field] = &[Field::L4proto, Field::ThDport];

/// One of our tables: its shared maps and chains, and how a container's chains are named.
#[derive(Debug)]
pub(crate) struct Table {
    family: &'static str,
    fam: Family,
    name: &'static str,
    /// `pm`, `mq`, `ms`: the first part of a container's chain names.
    prefix: &'static str,
    /// A container's chains: `<prefix>-<net8>-<id16><suffix>`. The first one's rule comments name
    /// the container's map elements.
    suffixes: &'static [&'static str],
    /// Chains of the earlier layout that DEL of a container created by it removes too.
    legacy_suffixes: &'static [&'static str],
    /// Name, type in nft syntax, key type for netlink.
    maps: &'static [(&'static str, &'static str, &'static [KeyType])],
    /// Sets and maps whose elements can expire: name, `set`/`map` and type in nft syntax, types.
    sets: &'static [(&'static str, &'static str, &'static str, SetSpec<'static>)],
    shared: &'static [SharedChain],
    /// Regular chains created with the table but never flushed by its setup (their rules are
    /// added one at a time, see [`flat`]).
    kept_chains: &'static [&'static str],
}

const V4: KeyType = KeyType::Ipv4Addr;
const V6: KeyType = KeyType::Ipv6Addr;
const PROTO: KeyType = KeyType::InetProto;
const PORT: KeyType = KeyType::InetService;

fn jump_dispatch() -> nfnl::Rule {
    inet().fib_daddr_local().verdict(Verdict::Jump("dispatch".into()))
}

const fn value_map(key: &'static [KeyType], data: &'static [KeyType]) -> SetSpec<'static> {
    SetSpec { key, data: SetData::Value(data), timeout: true }
}

const fn plain_set(key: &'static [KeyType]) -> SetSpec<'static> {
    SetSpec { key, data: SetData::None, timeout: true }
}

fn mark(r: nfnl::Rule) -> nfnl::Rule {
    r.mark_or(flat::MARK)
}

fn fields(key: &[Field]) -> Vec<(Field, Option<Vec<u8>>)> {
    key.iter().map(|f| (*f, None)).collect()
}

const LOCALHOST: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

pub(crate) static PORTMAP: Table = Table {
    family: "inet",
    fam: Family::Inet,
    name: PORTMAP_TABLE,
    prefix: "pm",
    suffixes: &["-dnat", "-post"],
    legacy_suffixes: &["-pre", "-out"],
    maps: &[
        ("hostports4", "ipv4_addr . inet_proto . inet_service : verdict", &[V4, PROTO, PORT]),
        ("hostports6", "ipv6_addr . inet_proto . inet_service : verdict", &[V6, PROTO, PORT]),
        ("anyports4", "inet_proto . inet_service : verdict", &[PROTO, PORT]),
        ("anyports6", "inet_proto . inet_service : verdict", &[PROTO, PORT]),
        ("snat4", "ipv4_addr : verdict", &[V4]),
        ("snat6", "ipv6_addr : verdict", &[V6]),
    ],
    sets: &[
        (
            "dnat4",
            "map",
            "inet_proto . inet_service : ipv4_addr . inet_service",
            value_map(&[PROTO, PORT], &[V4, PORT]),
        ),
        (
            "dnat6",
            "map",
            "inet_proto . inet_service : ipv6_addr . inet_service",
            value_map(&[PROTO, PORT], &[V6, PORT]),
        ),
        (
            "hdnat4",
            "map",
            "ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service",
            value_map(&[V4, PROTO, PORT], &[V4, PORT]),
        ),
        (
            "hdnat6",
            "map",
            "ipv6_addr . inet_proto . inet_service : ipv6_addr . inet_service",
            value_map(&[V6, PROTO, PORT], &[V6, PORT]),
        ),
        ("own4", "map", "inet_proto . inet_service : ipv6_addr", value_map(&[PROTO, PORT], &[V6])),
        ("own6", "map", "inet_proto . inet_service : ipv6_addr", value_map(&[PROTO, PORT], &[V6])),
        ("hown4", "map", "ipv4_addr . inet_proto . inet_service : ipv6_addr", value_map(&[V4, PROTO, PORT], &[V6])),
        ("hown6", "map", "ipv6_addr . inet_proto . inet_service : ipv6_addr", value_map(&[V6, PROTO, PORT], &[V6])),
        ("sp4", "set", "inet_proto . inet_service", plain_set(&[PROTO, PORT])),
        ("hsp4", "set", "ipv4_addr . inet_proto . inet_service", plain_set(&[V4, PROTO, PORT])),
        ("all4", "set", "inet_proto . inet_service", plain_set(&[PROTO, PORT])),
        ("all6", "set", "inet_proto . inet_service", plain_set(&[PROTO, PORT])),
        ("hall4", "set", "ipv4_addr . inet_proto . inet_service", plain_set(&[V4, PROTO, PORT])),
        ("hall6", "set", "ipv6_addr . inet_proto . inet_service", plain_set(&[V6, PROTO, PORT])),
        ("owners", "set", "ipv6_addr . inet_service", plain_set(&[V6, PORT])),
    ],
    shared: &[
        SharedChain {
            name: "dispatch",
            spec: None,
            base: None,
            rules: &[
                ("ip daddr . meta l4proto . th dport vmap @hostports4", || inet().vmap(ADDR_PROTO_PORT4, "hostports4")),
                ("ip6 daddr . meta l4proto . th dport vmap @hostports6", || {
                    inet().vmap(ADDR_PROTO_PORT6, "hostports6")
                }),
                ("meta nfproto ipv4 meta l4proto . th dport vmap @anyports4", || {
                    inet().meta_nfproto(false).vmap(PROTO_PORT, "anyports4")
                }),
                ("meta nfproto ipv6 meta l4proto . th dport vmap @anyports6", || {
                    inet().meta_nfproto(true).vmap(PROTO_PORT, "anyports6")
                }),
                ("jump hairpin", || inet().verdict(Verdict::Jump("hairpin".into()))),
                (
                    "ip saddr 127.0.0.1 ip daddr . meta l4proto . th dport @hsp4 meta mark set meta mark | 0x2000",
                    || mark(inet().saddr(LOCALHOST).in_set(&fields(ADDR_PROTO_PORT4), "hsp4")),
                ),
                ("ip saddr 127.0.0.1 meta l4proto . th dport @sp4 meta mark set meta mark | 0x2000", || {
                    mark(inet().saddr(LOCALHOST).in_set(&fields(PROTO_PORT), "sp4"))
                }),
                ("ip daddr . meta l4proto . th dport @hall4 meta mark set meta mark | 0x2000", || {
                    mark(inet().in_set(&fields(ADDR_PROTO_PORT4), "hall4"))
                }),
                ("ip6 daddr . meta l4proto . th dport @hall6 meta mark set meta mark | 0x2000", || {
                    mark(inet().in_set(&fields(ADDR_PROTO_PORT6), "hall6"))
                }),
                ("meta nfproto ipv4 meta l4proto . th dport @all4 meta mark set meta mark | 0x2000", || {
                    mark(inet().meta_nfproto(false).in_set(&fields(PROTO_PORT), "all4"))
                }),
                ("meta nfproto ipv6 meta l4proto . th dport @all6 meta mark set meta mark | 0x2000", || {
                    mark(inet().meta_nfproto(true).in_set(&fields(PROTO_PORT), "all6"))
                }),
                ("dnat ip to ip daddr . meta l4proto . th dport map @hdnat4", || {
                    inet().dnat_map(ADDR_PROTO_PORT4, "hdnat4", false)
                }),
                ("dnat ip6 to ip6 daddr . meta l4proto . th dport map @hdnat6", || {
                    inet().dnat_map(ADDR_PROTO_PORT6, "hdnat6", true)
                }),
                ("meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4", || {
                    inet().meta_nfproto(false).dnat_map(PROTO_PORT, "dnat4", false)
                }),
                ("meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @dnat6", || {
                    inet().meta_nfproto(true).dnat_map(PROTO_PORT, "dnat6", true)
                }),
            ],
        },
        SharedChain {
            name: "prerouting",
            spec: Some("type nat hook prerouting priority -100; policy accept;"),
            base: base_chain(Hook::Prerouting, -100, ChainType::Nat),
            rules: &[("fib daddr type local jump dispatch", jump_dispatch)],
        },
        SharedChain {
            name: "output",
            spec: Some("type nat hook output priority -100; policy accept;"),
            base: base_chain(Hook::Output, -100, ChainType::Nat),
            rules: &[("fib daddr type local jump dispatch", jump_dispatch)],
        },
        SharedChain {
            name: LOCALNET_CHAIN,
            spec: Some("type filter hook input priority 0; policy accept;"),
            base: base_chain(Hook::Input, 0, ChainType::Filter),
            rules: LOCALNET_RULES,
        },
        SharedChain {
            name: "postrouting",
            spec: Some("type nat hook postrouting priority 100; policy accept;"),
            base: base_chain(Hook::Postrouting, 100, ChainType::Nat),
            rules: &[
                ("ct status dnat ip daddr vmap @snat4", || inet().ct_status_dnat().vmap(&[Field::IpDaddr], "snat4")),
                ("ct status dnat ip6 daddr vmap @snat6", || inet().ct_status_dnat().vmap(&[Field::Ip6Daddr], "snat6")),
                ("meta mark & 0x2000 == 0x2000 masquerade", || inet().mark_has(flat::MARK).masquerade()),
            ],
        },
    ],
    kept_chains: &["hairpin"],
};

/// The chain that keeps pods away from the node's 127.0.0.1-only services.
const LOCALNET_CHAIN: &str = "input";

/// kube-proxy's drop for `route_localnet` (CVE-2020-8558): portmap turns `route_localnet` on for
/// the bridge so that `127.0.0.1:hostPort` works from the node, and that also lets a pod that
/// routes 127.0.0.0/8 through its gateway reach whatever listens on the node's loopback. A packet
/// to 127.0.0.0/8 from a non-loopback source that reaches input without being DNATed is dropped,
/// as kube-proxy's `-d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate
/// RELATED,ESTABLISHED,DNAT -j DROP` does: the first rule for packets conntrack does not track
/// (whose `ct status` matches nothing), the second for new connections. `127.0.0.1:hostPort` from
/// the node is DNATed in output and its replies are established, so it keeps working.
const LOCALNET_RULES: &[SharedRule] = &[
    ("ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state invalid,untracked drop", || {
        inet()
            .daddr_in(LOOPBACK4)
            .saddr_not_in(LOOPBACK4)
            .ct_state_any(nfnl::CT_INVALID | nfnl::CT_UNTRACKED)
            .verdict(Verdict::Drop)
    }),
    ("ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state ! established,related ct status ! dnat drop", || {
        inet()
            .daddr_in(LOOPBACK4)
            .saddr_not_in(LOOPBACK4)
            .ct_state_none(nfnl::CT_ESTABLISHED | nfnl::CT_RELATED)
            .ct_status_not_dnat()
            .verdict(Verdict::Drop)
    }),
];

const LOOPBACK4: IpNetwork =
    IpNetwork::V4(match ipnetwork::Ipv4Network::new_checked(std::net::Ipv4Addr::new(127, 0, 0, 0), 8) {
        Some(n) => n,
        None => panic!("127.0.0.0/8"),
    });

/// Whether the listed chain is the drop's (a base chain with its rules).
fn localnet_present(c: &ChainInfo) -> bool {
    c.hook && c.comments.len() == LOCALNET_RULES.len()
}

/// Makes sure the portmap table drops packets that reach the node's loopback from elsewhere
/// ([`LOCALNET_RULES`]) before portmap turns `route_localnet` on: a table set up by an earlier
/// version lacks the chain, and then its setup is sent again (which refills the shared chains
/// and adds nothing of any pod). One listing of a two-rule chain when it is there.
fn ensure_localnet_drop(what: &str) -> Result<()> {
    if list_chain(&PORTMAP, LOCALNET_CHAIN)?.as_ref().is_some_and(localnet_present) {
        return Ok(());
    }
    match run_plan(&PORTMAP, &mut PORTMAP.setup())? {
        Outcome::Done => Ok(()),
        Outcome::Conflict(_) => Err(Error::network(format!("{what}: setting up table {} failed", PORTMAP.t()))),
        Outcome::Failed(f) => Err(Error::network(format!(
            "{what}: add the drop of packets to 127.0.0.0/8 from elsewhere to table {}: {}",
            PORTMAP.t(),
            f.message
        ))),
    }
}

pub(crate) static MASQ: Table = Table {
    family: "inet",
    fam: Family::Inet,
    name: MASQ_TABLE,
    prefix: "mq",
    suffixes: &[""],
    legacy_suffixes: &[],
    maps: &[("masq4", "ipv4_addr : verdict", &[V4]), ("masq6", "ipv6_addr : verdict", &[V6])],
    sets: &[
        ("pods4", "map", "ipv4_addr : ipv6_addr", value_map(&[V4], &[V6])),
        ("pods6", "map", "ipv6_addr : ipv6_addr", value_map(&[V6], &[V6])),
        ("owners", "set", "ipv6_addr . inet_service", plain_set(&[V6, PORT])),
    ],
    kept_chains: &["local"],
    shared: &[SharedChain {
        name: "postrouting",
        spec: Some("type nat hook postrouting priority 100; policy accept;"),
        base: base_chain(Hook::Postrouting, 100, ChainType::Nat),
        rules: &[
            ("ip saddr vmap @masq4", || inet().vmap(&[Field::IpSaddr], "masq4")),
            ("ip6 saddr vmap @masq6", || inet().vmap(&[Field::Ip6Saddr], "masq6")),
            ("jump local", || inet().verdict(Verdict::Jump("local".into()))),
            ("ip saddr @pods4 ip daddr != 224.0.0.0/4 masquerade", || {
                inet().in_set(&fields(&[Field::IpSaddr]), "pods4").daddr_not_in(MULTICAST4).masquerade()
            }),
            ("ip6 saddr @pods6 ip6 daddr != ff00::/8 masquerade", || {
                inet().in_set(&fields(&[Field::Ip6Saddr]), "pods6").daddr_not_in(MULTICAST6).masquerade()
            }),
        ],
    }],
};

const MULTICAST4: IpNetwork =
    IpNetwork::V4(match ipnetwork::Ipv4Network::new_checked(std::net::Ipv4Addr::new(224, 0, 0, 0), 4) {
        Some(n) => n,
        None => panic!("224.0.0.0/4"),
    });
const MULTICAST6: IpNetwork =
    IpNetwork::V6(match ipnetwork::Ipv6Network::new_checked(std::net::Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0), 8) {
        Some(n) => n,
        None => panic!("ff00::/8"),
    });

/// MAC spoof check (bridge `macspoofchk`): frames from the pod's host port must carry the pod's MAC.
/// nftables only, as in the reference.
pub(crate) static MACSPOOF: Table = Table {
    family: "bridge",
    fam: Family::Bridge,
    name: MACSPOOF_TABLE,
    prefix: "ms",
    suffixes: &[""],
    legacy_suffixes: &[],
    maps: &[("ports", "ifname : verdict", &[KeyType::Ifname])],
    sets: &[],
    kept_chains: &[],
    shared: &[SharedChain {
        name: "prerouting",
        spec: Some("type filter hook prerouting priority -300; policy accept;"),
        base: base_chain(Hook::Prerouting, -300, ChainType::Filter),
        rules: &[("iifname vmap @ports", || nfnl::Rule::new(Family::Bridge).vmap(&[Field::Iifname], "ports"))],
    }],
};

impl Table {
    /// `inet cni_rs_portmap`: how commands name the table.
    fn t(&self) -> String {
        format!("{} {}", self.family, self.name)
    }

    /// `<prefix>-<net8>-<id16>`: the common part of a container's chain names.
    fn base(&self, network: &str, container_id: &str, ifname: &str) -> String {
        let id = sha512_hex(&format!("{network}\0{container_id}\0{ifname}"));
        format!("{}-{}-{}", self.prefix, network_hash(network), &id[..16])
    }

    fn chains(&self, base: &str) -> Vec<String> {
        self.suffixes.iter().map(|s| format!("{base}{s}")).collect()
    }

    /// Steps creating the maps and shared chains, or refilling the shared chains if they exist.
    fn setup(&self) -> Vec<Step> {
        let t = self.t();
        let mut out = vec![Step::Line(format!("add table {t}"), Some(Nl::Table))];
        for (name, ty, key) in self.maps {
            out.push(Step::Line(format!("add map {t} {name} {{ type {ty}; }}"), Some(Nl::Map(name, key))));
        }
        for (name, kind, ty, spec) in self.sets {
            let text = format!("add {kind} {t} {name} {{ type {ty}; flags timeout; }}");
            out.push(Step::Line(text, Some(Nl::Set(name, *spec))));
        }
        for name in self.kept_chains {
            out.push(add_chain_step(self, name));
        }
        for c in self.shared {
            let text = match c.spec {
                Some(spec) => format!("add chain {t} {} {{ {spec} }}", c.name),
                None => format!("add chain {t} {}", c.name),
            };
            let nl = Nl::Chain { name: c.name.to_string(), base: c.base, comment: None };
            out.push(Step::Line(text, Some(nl)));
            out.push(flush_step(self, c.name));
            for (text, rule) in c.rules {
                let nl = Nl::Rule { chain: c.name.to_string(), exprs: rule().build(), comment: None };
                out.push(Step::Line(format!("add rule {t} {} {text}", c.name), Some(nl)));
            }
        }
        out
    }
}

fn network_hash(network: &str) -> String {
    sha512_hex(network)[..8].to_string()
}

/// The key of a map element that leads to a container's chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Key {
    /// `hostports4`/`hostports6`: a mapping bound to one host address.
    HostPort { ip: IpAddr, proto: Protocol, port: u16 },
    /// `anyports4`/`anyports6`: a mapping on every host address of a family.
    AnyPort { v6: bool, proto: Protocol, port: u16 },
    /// `snat4`/`snat6`: connections DNATed to this pod address (the portmap -post chain).
    Snat(IpAddr),
    /// `masq4`/`masq6`: traffic from this pod address.
    Masq(IpAddr),
    /// `ports`: frames entering the bridge from this port.
    BridgePort(String),
}

fn fam(ip: &IpAddr) -> char {
    if ip.is_ipv6() {
        '6'
    } else {
        '4'
    }
}

/// A bridge port name we can put in a command and a comment: an interface name without quotes,
/// backslashes or `;`.
fn valid_port_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 15 && s.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\' | ';'))
}

impl Key {
    fn map(&self) -> String {
        match self {
            Key::HostPort { ip, .. } => format!("hostports{}", fam(ip)),
            Key::AnyPort { v6, .. } => format!("anyports{}", if *v6 { '6' } else { '4' }),
            Key::Snat(ip) => format!("snat{}", fam(ip)),
            Key::Masq(ip) => format!("masq{}", fam(ip)),
            Key::BridgePort(_) => "ports".to_string(),
        }
    }

    /// The key as a comment holds it.
    fn text(&self) -> String {
        match self {
            Key::HostPort { ip, proto, port } => format!("{ip} . {proto} . {port}"),
            Key::AnyPort { proto, port, .. } => format!("{proto} . {port}"),
            Key::Snat(ip) | Key::Masq(ip) => ip.to_string(),
            Key::BridgePort(name) => name.clone(),
        }
    }

    /// The key in nft syntax.
    fn literal(&self) -> String {
        match self {
            Key::BridgePort(name) => format!("\"{name}\""),
            other => other.text(),
        }
    }

    /// The key for netlink, field by field.
    fn parts(&self) -> Vec<KeyPart> {
        match self {
            Key::HostPort { ip, proto, port } => {
                vec![KeyPart::Addr(*ip), KeyPart::Proto(nfnl::proto_number(*proto)), KeyPart::Port(*port)]
            }
            Key::AnyPort { proto, port, .. } => vec![KeyPart::Proto(nfnl::proto_number(*proto)), KeyPart::Port(*port)],
            Key::Snat(ip) | Key::Masq(ip) => vec![KeyPart::Addr(*ip)],
            Key::BridgePort(name) => vec![KeyPart::Ifname(name.clone())],
        }
    }

    /// Which of the container's chains (index into the table's suffixes) the element jumps to.
    fn chain_index(&self) -> usize {
        match self {
            Key::Snat(_) => 1,
            _ => 0,
        }
    }

    /// A key another container holds is a conflict (host ports), not something to take over.
    fn exclusive(&self) -> bool {
        matches!(self, Key::HostPort { .. } | Key::AnyPort { .. })
    }

    /// Parses `map=text` as written by [`Key::comment`]; None for anything else.
    fn parse(entry: &str) -> Option<Key> {
        let (map, text) = entry.split_once('=')?;
        let parts: Vec<&str> = text.split(" . ").collect();
        let ip = |s: &str, v6: bool| s.parse::<IpAddr>().ok().filter(|ip| ip.is_ipv6() == v6);
        let key = match (map, parts.as_slice()) {
            ("hostports4" | "hostports6", [ipt, proto, port]) => Key::HostPort {
                ip: ip(ipt, map.ends_with('6'))?,
                proto: Protocol::parse(proto)?,
                port: port.parse().ok()?,
            },
            ("anyports4" | "anyports6", [proto, port]) => {
                Key::AnyPort { v6: map.ends_with('6'), proto: Protocol::parse(proto)?, port: port.parse().ok()? }
            }
            ("snat4" | "snat6", [ipt]) => Key::Snat(ip(ipt, map.ends_with('6'))?),
            ("masq4" | "masq6", [ipt]) => Key::Masq(ip(ipt, map.ends_with('6'))?),
            ("ports", [name]) if valid_port_name(name) => Key::BridgePort((*name).to_string()),
            _ => return None,
        };
        // Only what we would have written ourselves (canonical spelling, a map of this kind).
        (key.text() == text).then_some(key)
    }

    /// Where the key is named in a port conflict.
    fn describe(&self) -> String {
        match self {
            Key::HostPort { ip, proto, port } => format!("host port {port}/{proto} on {ip}"),
            Key::AnyPort { v6, proto, port } => {
                format!("host port {port}/{proto} (any {} host address)", if *v6 { "IPv6" } else { "IPv4" })
            }
            other => format!("{} element {}", other.map(), other.text()),
        }
    }
}

/// `map=key;map=key`: the comment of a rule reached through those elements.
fn keys_comment(keys: &[Key]) -> String {
    keys.iter().map(|k| format!("{}={}", k.map(), k.text())).collect::<Vec<_>>().join(";")
}

fn keys_of_comment(comment: &str) -> Option<Vec<Key>> {
    comment.split(';').map(Key::parse).collect()
}

/// One rule of a container's chain.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    /// Index into the table's suffixes.
    chain: usize,
    text: String,
    /// The same rule for netlink; None when it holds text only nft can compile (conditions).
    nl: Option<nfnl::Rule>,
    /// The elements that lead here (written into the rule's comment).
    keys: Vec<Key>,
}

/// Everything of one container in one table.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    table: &'static Table,
    base: String,
    note: String,
    rules: Vec<Rule>,
}

impl Pod {
    fn new(table: &'static Table, kind: &str, network: &str, container_id: &str, ifname: &str) -> Pod {
        Pod {
            table,
            base: table.base(network, container_id, ifname),
            note: comment(kind, network, container_id, ifname),
            rules: Vec::new(),
        }
    }

    /// Every element key, once, in order.
    fn keys(&self) -> Vec<Key> {
        let mut seen = BTreeSet::new();
        self.rules.iter().flat_map(|r| r.keys.iter()).filter(|k| seen.insert((*k).clone())).cloned().collect()
    }

    fn rule_count(&self, chain: usize) -> usize {
        self.rules.iter().filter(|r| r.chain == chain).count()
    }
}

/// A chain comment for humans; nft strings cannot hold quotes, so those are replaced.
fn comment(kind: &str, network: &str, container_id: &str, ifname: &str) -> String {
    let text = format!("cni-rs {kind} net={network} id={container_id} if={ifname}");
    let mut clean: String =
        text.chars().map(|c| if c == '"' || c == '\\' || c.is_control() { '_' } else { c }).collect();
    // NFT_USERDATA_MAXLEN is 256 bytes; stay well inside it.
    if clean.len() > 200 {
        let mut cut = 200;
        while !clean.is_char_boundary(cut) {
            cut -= 1;
        }
        clean.truncate(cut);
    }
    clean
}

/// `10.22.0.0/16` for `10.22.0.5/16`.
fn subnet(a: &IpNetwork) -> String {
    format!("{}/{}", a.network(), a.prefix())
}

fn family_words(addr: &IpNetwork) -> (&'static str, &'static str) {
    if addr.is_ipv6() {
        ("ip6", "ipv6")
    } else {
        ("ip", "ipv4")
    }
}

/// A container's port mappings: a -dnat rule per (address, mapping), reached through the mapping's
/// port element, and with snat a -post rule per mapping, reached through the pod address's element.
pub(crate) fn portmap_pod(p: &PortMap) -> Pod {
    let mut pod = Pod::new(&PORTMAP, "portmap", &p.network, &p.container_id, &p.ifname);
    for addr in p.targets() {
        let v6 = addr.is_ipv6();
        let (ipx, nfproto) = family_words(&addr);
        let conditions = if v6 { &p.conditions_v6 } else { &p.conditions_v4 };
        let mut entry = format!("meta nfproto {nfproto}");
        let mut free_text = false;
        for c in conditions.iter().filter(|c| !c.trim().is_empty()) {
            entry.push(' ');
            entry.push_str(c.trim());
            free_text = true;
        }
        // Conditions are nft syntax we do not compile: those rules go through nft.
        let compiled = |r: nfnl::Rule| (!free_text).then_some(r);
        let pod_ip = addr.ip();
        let proto_of = |m: &super::PortMapping| nfnl::proto_number(m.protocol);
        for m in p.mappings.iter().filter(|m| m.applies_to(v6)) {
            let mut r = entry.clone();
            let mut nl = inet().meta_nfproto(v6);
            let port_key = match m.bound_ip() {
                Some(h) => {
                    let _ = write!(r, " {ipx} daddr {h}");
                    nl = nl.daddr(h);
                    Key::HostPort { ip: h, proto: m.protocol, port: m.host_port }
                }
                None => Key::AnyPort { v6, proto: m.protocol, port: m.host_port },
            };
            let to =
                if v6 { format!("[{pod_ip}]:{}", m.container_port) } else { format!("{pod_ip}:{}", m.container_port) };
            let _ = write!(r, " {} dport {} dnat {ipx} to {to}", m.protocol, m.host_port);
            let nl = nl.dport(proto_of(m), m.host_port).dnat(pod_ip, m.container_port);
            let mut keys = vec![port_key];
            if p.snat {
                keys.push(Key::Snat(pod_ip));
            }
            pod.rules.push(Rule { chain: 0, text: r, nl: compiled(nl), keys });
            if p.snat {
                // Hairpin (a pod of the subnet reaching the mapped port) and IPv4 localhost need
                // masquerading, or the reply would bypass the DNAT. Only connections this
                // mapping DNATed are matched, never other traffic to the pod.
                // One rule per source rather than an anonymous set `{ subnet, 127.0.0.1 }`: nft
                // fetches the elements of every set in the ruleset, one request per set, before
                // any element command, so a set per pod would make every ADD and DEL O(pods).
                let localhost = IpNetwork::from(IpAddr::from([127, 0, 0, 1]));
                let sources: Vec<Option<IpNetwork>> = match (p.masq_all, v6) {
                    (true, _) => vec![None],
                    (false, true) => vec![Some(addr)],
                    (false, false) => vec![Some(addr), Some(localhost)],
                };
                for source in sources {
                    let mut r = format!("ct status dnat {ipx} daddr {pod_ip}");
                    let mut nl = inet().ct_status_dnat().daddr(pod_ip);
                    if let Some(source) = source {
                        if source == localhost {
                            let _ = write!(r, " {ipx} saddr 127.0.0.1");
                            nl = nl.saddr(source.ip());
                        } else {
                            let _ = write!(r, " {ipx} saddr {}", subnet(&source));
                            nl = nl.saddr_in(source);
                        }
                    }
                    let _ = write!(r, " meta l4proto {} ct original proto-dst {}", m.protocol, m.host_port);
                    nl = nl.ct_original_proto_dst(proto_of(m), m.host_port);
                    if let Some(h) = m.bound_ip() {
                        let _ = write!(r, " ct original {ipx} daddr {h}");
                        nl = nl.ct_original_daddr(h);
                    }
                    r.push_str(" masquerade");
                    // A /0 subnet is spelled differently by nft; leave that to nft.
                    let nl = (addr.prefix() > 0).then(|| nl.masquerade());
                    pod.rules.push(Rule { chain: 1, text: r, nl: nl.and_then(compiled), keys: Vec::new() });
                }
            }
        }
    }
    pod
}

/// A pod's masquerade in the chain layout (written by earlier versions; the tests make such pods).
#[cfg(test)]
pub(crate) fn masq_pod(m: &Masquerade) -> Pod {
    let mut pod = Pod::new(&MASQ, "masquerade", &m.network, &m.container_id, &m.ifname);
    for a in &m.addresses {
        let (ipx, _) = family_words(a);
        let multicast = if a.is_ipv6() { "ff00::/8" } else { "224.0.0.0/4" };
        // The source match stays: with two addresses of a family, each rule must see only its own.
        let text = format!("{ipx} saddr {} {ipx} daddr != {} {ipx} daddr != {multicast} masquerade", a.ip(), subnet(a));
        let multicast: Option<IpNetwork> = multicast.parse().ok();
        let nl = match multicast {
            // A /0 subnet is spelled differently by nft; leave that to nft.
            Some(mc) if a.prefix() > 0 => Some(inet().saddr(a.ip()).daddr_not_in(*a).daddr_not_in(mc).masquerade()),
            _ => None,
        };
        pod.rules.push(Rule { chain: 0, text, nl, keys: vec![Key::Masq(a.ip())] });
    }
    pod
}

fn nft_string(s: &str) -> String {
    s.chars().filter(|c| !matches!(c, '"' | '\\') && !c.is_control()).collect()
}

pub(crate) fn macspoof_pod(network: &str, container_id: &str, ifname: &str, port: &str, mac: &str) -> Result<Pod> {
    if !valid_port_name(port) {
        return Err(Error::config(format!("MAC spoof check: {port:?} is not a usable interface name")));
    }
    let mut pod = Pod::new(&MACSPOOF, "macspoofchk", network, container_id, ifname);
    let text = format!("iifname \"{port}\" ether saddr != {} drop", nft_string(mac));
    let nl = crate::parse_mac(mac)
        .map(|m| nfnl::Rule::new(Family::Bridge).iifname(port).ether_saddr_neq(m).verdict(Verdict::Drop));
    pod.rules.push(Rule { chain: 0, text, nl, keys: vec![Key::BridgePort(port.to_string())] });
    Ok(pod)
}

/// Whether the pod's mappings carry conditions (free nft syntax, so rules of their own).
fn has_conditions(p: &PortMap) -> bool {
    p.conditions_v4.iter().chain(&p.conditions_v6).any(|c| !c.trim().is_empty())
}

/// The nftables backend (stateless; ADD and DEL talk netlink, CHECK and GC run `nft`).
#[derive(Debug, Clone, Copy, Default)]
pub struct NftablesBackend;

/// `nft` is installed and the kernel has nf_tables.
pub(crate) fn usable() -> bool {
    if exec::find("nft").is_none() {
        return false;
    }
    // /sys/module/nf_tables exists only when nf_tables is a module; a built-in one is asked
    // directly (one netlink round trip, where running `nft list tables` costs a process, ~6 ms).
    std::path::Path::new("/sys/module/nf_tables").exists()
        || kernel_has_nf_tables()
        || run("nft", &["list", "tables"], None).map(|o| o.success).unwrap_or(false)
}

/// Whether the kernel answers an nf_tables request: NFT_MSG_GETGEN on a netfilter netlink socket.
/// False when it cannot tell (no socket, an error, no answer within a second).
fn kernel_has_nf_tables() -> bool {
    const NETLINK_NETFILTER: libc::c_int = 12;
    const NFNL_SUBSYS_NFTABLES: u16 = 10;
    const NFT_MSG_NEWGEN: u16 = 15;
    const NFT_MSG_GETGEN: u16 = 16;
    // SAFETY: plain socket(2); the fd is owned (and closed) by `sock` below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_NETFILTER) };
    if fd < 0 {
        return false;
    }
    // SAFETY: fd is a fresh socket we own.
    let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
    let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: a valid timeval of the size given.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    // nlmsghdr (16 bytes) + nfgenmsg (family AF_UNSPEC, version 0, res_id 0).
    let mut req = [0u8; 20];
    req[0..4].copy_from_slice(&20u32.to_ne_bytes());
    req[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    req[6..8].copy_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: all-zero is a valid sockaddr_nl; the family is set below (port 0: the kernel).
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: req and kernel are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            fd,
            req.as_ptr().cast(),
            req.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent != req.len() as isize {
        return false;
    }
    let mut buf = [0u8; 8192];
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 16 {
        return false;
    }
    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
    ty == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN
}

/// What an element line of a batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// `add element K : jump C`: a no-op when the element is ours, EEXIST when another's.
    Ensure,
    /// `add element K : jump C; delete element K`: removes our element whether or not it is there.
    Remove,
    /// `delete element K; add element K : jump C`: takes over another container's element.
    Replace,
}

/// A step of a batch for netlink (what its nft text says).
#[derive(Debug, Clone)]
enum Nl {
    Table,
    Map(&'static str, &'static [KeyType]),
    Set(&'static str, SetSpec<'static>),
    Chain { name: String, base: Option<BaseChain>, comment: Option<String> },
    Flush(String),
    Delete(String),
    Rule { chain: String, exprs: Vec<nfnl::Expr>, comment: Option<String> },
}

/// A step of a batch: nft text, and the same for netlink unless it can only be nft text.
#[derive(Debug, Clone)]
enum Step {
    Line(String, Option<Nl>),
    /// `create chain`: fails with EEXIST when the container's chain exists (a repeated ADD).
    Create(String, Option<Nl>),
    Elem {
        key: Key,
        chain: String,
        op: Op,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrKind {
    Exists,
    Missing,
    Other,
}

/// Renders a batch; the second value gives, per line, its step and which of the step's lines it is.
fn render(t: &Table, steps: &[Step]) -> (String, Vec<(usize, usize)>) {
    let tn = t.t();
    let mut out = String::new();
    let mut owner = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let lines: Vec<String> = match step {
            Step::Line(l, _) | Step::Create(l, _) => vec![l.clone()],
            Step::Elem { key, chain, op } => {
                let (map, k) = (key.map(), key.literal());
                let add = format!("add element {tn} {map} {{ {k} : jump {chain} }}");
                let del = format!("delete element {tn} {map} {{ {k} }}");
                match op {
                    Op::Ensure => vec![add],
                    Op::Remove => vec![add, del],
                    Op::Replace => vec![del, add],
                }
            }
        };
        for (part, l) in lines.into_iter().enumerate() {
            out.push_str(&l);
            out.push('\n');
            owner.push((i, part));
        }
    }
    (out, owner)
}

/// The batch for netlink, and per message its step and which of the step's messages it is; None
/// when a step is nft text only.
fn to_batch(t: &Table, steps: &[Step]) -> Option<(Batch, Vec<(usize, usize)>)> {
    let (f, tn) = (t.fam, t.name);
    let mut b = Batch::new();
    let mut owner = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let before = b.len();
        match step {
            Step::Line(_, nl) | Step::Create(_, nl) => match nl.as_ref()? {
                Nl::Table => b.add_table(f, tn),
                Nl::Map(name, key) => b.add_map(f, tn, name, key),
                Nl::Set(name, spec) => b.add_set(f, tn, name, *spec, false),
                Nl::Chain { name, base, comment } if matches!(step, Step::Create(..)) => {
                    b.create_chain(f, tn, name, *base, comment.as_deref())
                }
                Nl::Chain { name, base, comment } => b.add_chain(f, tn, name, *base, comment.as_deref()),
                Nl::Flush(c) => b.flush_chain(f, tn, c),
                Nl::Delete(c) => b.delete_chain(f, tn, c),
                Nl::Rule { chain, exprs, comment } => {
                    b.add_rule_with_comment(f, tn, chain, exprs.clone(), comment.as_deref())
                }
            },
            Step::Elem { key, chain, op } => {
                let (map, parts) = (key.map(), key.parts());
                let elem = [(parts.clone(), Verdict::Jump(chain.clone()))];
                let add = |b: &mut Batch| b.add_elements(f, tn, &map, &elem);
                let del = |b: &mut Batch| b.delete_elements(f, tn, &map, std::slice::from_ref(&parts));
                match op {
                    Op::Ensure => add(&mut b),
                    Op::Remove => {
                        add(&mut b);
                        del(&mut b)
                    }
                    Op::Replace => {
                        del(&mut b);
                        add(&mut b)
                    }
                }
            }
        }
        owner.extend((0..b.len() - before).map(|part| (i, part)));
    }
    Some((b, owner))
}

fn flush_step(t: &Table, chain: &str) -> Step {
    Step::Line(format!("flush chain {} {chain}", t.t()), Some(Nl::Flush(chain.to_string())))
}

/// The errors nft reported for lines of a batch read from stdin: (1-based line, kind).
fn parse_errors(stderr: &str) -> Vec<(usize, ErrKind)> {
    stderr
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("/dev/stdin:")?;
            let (line, msg) = rest.split_once(':')?;
            let kind = if msg.contains("File exists") {
                ErrKind::Exists
            } else if msg.contains("No such file or directory") {
                ErrKind::Missing
            } else {
                ErrKind::Other
            };
            Some((line.parse().ok()?, kind))
        })
        .collect()
}

/// A batch that failed for a reason the element rules could not absorb.
struct Failure {
    /// (step, kind) of each reported error.
    errors: Vec<(usize, ErrKind)>,
    message: String,
}

impl Failure {
    fn any(&self, kind: ErrKind) -> bool {
        self.errors.iter().any(|(_, k)| *k == kind)
    }
}

enum Outcome {
    Done,
    /// Host ports another container holds.
    Conflict(Vec<Key>),
    Failed(Failure),
}

/// Runs the batch; when elements are what failed, adjusts them and reruns: an element to remove that
/// another container owns is left alone, one to add that another container owns is a conflict
/// (ports) or taken over (addresses, bridge ports), one to take over that is gone is simply added.
fn run_plan(t: &Table, steps: &mut Vec<Step>) -> Result<Outcome> {
    let rounds = steps.len() + 2;
    for _ in 0..rounds {
        let (errors, message) = match to_batch(t, steps) {
            Some((batch, owner)) => {
                let failures = batch.send_each()?;
                if failures.is_empty() {
                    return Ok(Outcome::Done);
                }
                let kind = |errno| match errno {
                    libc::EEXIST => ErrKind::Exists,
                    libc::ENOENT => ErrKind::Missing,
                    _ => ErrKind::Other,
                };
                let errors: Vec<(usize, usize, ErrKind)> = failures
                    .iter()
                    .filter_map(|f| owner.get(f.index).map(|&(step, part)| (step, part, kind(f.errno))))
                    .collect();
                let message = failures.iter().map(|f| f.error.msg.as_str()).collect::<Vec<_>>().join(" | ");
                (errors, message)
            }
            // nft text (conditions): nft names the failing lines.
            None => {
                let (text, owner) = render(t, steps);
                let out = run("nft", &["-f", "-"], Some(&text))?;
                if out.success {
                    return Ok(Outcome::Done);
                }
                let errors: Vec<(usize, usize, ErrKind)> = parse_errors(&out.stderr)
                    .into_iter()
                    .filter_map(|(line, kind)| owner.get(line.checked_sub(1)?).map(|&(step, part)| (step, part, kind)))
                    .collect();
                (errors, format!("nft failed: {}", one_line(&out.stderr)))
            }
        };
        let mut conflicts = Vec::new();
        let mut drop = BTreeSet::new();
        let mut changed = false;
        for &(i, part, kind) in &errors {
            let Some(Step::Elem { key, op, .. }) = steps.get_mut(i) else { continue };
            match (*op, part, kind) {
                (Op::Remove, _, ErrKind::Exists | ErrKind::Missing) => {
                    // Another container's element, or no such map (so no such element).
                    changed |= drop.insert(i);
                }
                (Op::Ensure, 0, ErrKind::Exists) if key.exclusive() => conflicts.push(key.clone()),
                (Op::Ensure, 0, ErrKind::Exists) => {
                    *op = Op::Replace;
                    changed = true;
                }
                (Op::Replace, 0, ErrKind::Missing) => {
                    *op = Op::Ensure;
                    changed = true;
                }
                _ => {}
            }
        }
        if !conflicts.is_empty() {
            return Ok(Outcome::Conflict(conflicts));
        }
        if !changed {
            let errors = errors.iter().map(|&(i, _, k)| (i, k)).collect();
            return Ok(Outcome::Failed(Failure { errors, message }));
        }
        for i in drop.into_iter().rev() {
            steps.remove(i);
        }
    }
    Err(Error::network(format!("nft batch on table {} kept failing", t.t())))
}

/// What a listing tells about one chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChainInfo {
    /// A base chain: the earlier layout, for a container chain.
    hook: bool,
    /// Each rule's comment.
    comments: Vec<Option<String>>,
}

impl ChainInfo {
    /// The element keys named by the rule comments; false when a rule has none (the earlier layout).
    fn keys(&self) -> (Vec<Key>, bool) {
        let mut keys = BTreeSet::new();
        let mut all = true;
        for c in &self.comments {
            match c.as_deref().and_then(keys_of_comment) {
                Some(ks) => keys.extend(ks),
                None => all = false,
            }
        }
        (keys.into_iter().collect(), all)
    }

    fn legacy(&self) -> bool {
        self.hook || !self.keys().1
    }
}

/// Chain name → what it holds, from `nft -j list ...` output.
pub(crate) fn parse_listing(json: &str) -> std::result::Result<BTreeMap<String, ChainInfo>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let items = v.get("nftables").and_then(Value::as_array).ok_or("no \"nftables\" array")?;
    let mut chains: BTreeMap<String, ChainInfo> = BTreeMap::new();
    for item in items {
        if let Some(c) = item.get("chain") {
            if let Some(name) = c.get("name").and_then(Value::as_str) {
                chains.entry(name.to_string()).or_default().hook |= c.get("hook").is_some();
            }
        }
        if let Some(r) = item.get("rule") {
            if let Some(name) = r.get("chain").and_then(Value::as_str) {
                let comment = r.get("comment").and_then(Value::as_str).map(str::to_string);
                chains.entry(name.to_string()).or_default().comments.push(comment);
            }
        }
    }
    Ok(chains)
}

/// `nft -j list <what>`: None when it (or its table) does not exist.
fn list(t: &Table, what: &str, name: &str) -> Result<Option<BTreeMap<String, ChainInfo>>> {
    let mut args = vec!["-j", "list", what, t.family, t.name];
    if !name.is_empty() {
        args.push(name);
    }
    let out = run("nft", &args, None)?;
    if !out.success {
        if out.stderr.contains("No such file or directory") {
            return Ok(None);
        }
        return Err(Error::network(format!("list {what} {} {name}: nft failed: {}", t.t(), one_line(&out.stderr))));
    }
    parse_listing(&out.stdout)
        .map(Some)
        .map_err(|e| Error::network(format!("list {what} {} {name}: unreadable nft JSON: {e}", t.t())))
}

/// One chain of ours, listed alone over netlink (the cost does not grow with the number of pods).
fn list_chain(t: &Table, chain: &str) -> Result<Option<ChainInfo>> {
    Ok(nfnl::list_chain(t.fam, t.name, chain)?.map(|l| ChainInfo { hook: l.base, comments: l.comments }))
}

/// The batch of a first ADD: additions only.
fn fast_plan(pod: &Pod) -> Vec<Step> {
    let t = pod.table;
    let tn = t.t();
    let chains = t.chains(&pod.base);
    let mut steps = Vec::new();
    let text_only = pod.rules.iter().any(|r| r.nl.is_none());
    for (i, c) in chains.iter().enumerate() {
        let spec = if i == 0 { format!(" {{ comment \"{}\"; }}", pod.note) } else { String::new() };
        let comment = (i == 0).then(|| pod.note.clone());
        let nl = (!text_only).then(|| Nl::Chain { name: c.clone(), base: None, comment });
        steps.push(Step::Create(format!("create chain {tn} {c}{spec}"), nl));
    }
    push_rules_and_elements(pod, &chains, &mut steps);
    steps
}

fn push_rules_and_elements(pod: &Pod, chains: &[String], steps: &mut Vec<Step>) {
    let tn = pod.table.t();
    for r in &pod.rules {
        let Some(chain) = chains.get(r.chain) else { continue };
        let mut line = format!("add rule {tn} {chain} {}", r.text);
        let comment = (!r.keys.is_empty()).then(|| keys_comment(&r.keys));
        if let Some(c) = &comment {
            let _ = write!(line, " comment \"{c}\"");
        }
        let nl = r.nl.clone().map(|rule| Nl::Rule { chain: chain.clone(), exprs: rule.build(), comment });
        steps.push(Step::Line(line, nl));
    }
    for key in pod.keys() {
        if let Some(chain) = chains.get(key.chain_index()) {
            steps.push(Step::Elem { key, chain: chain.clone(), op: Op::Ensure });
        }
    }
}

/// The batch of a repeated ADD: the old elements that are not wanted any more go, the chains are
/// emptied and refilled, the wanted elements added (those already there are left as they are).
fn replace_plan(pod: &Pod, old: &[Key]) -> Vec<Step> {
    let t = pod.table;
    let chains = t.chains(&pod.base);
    let wanted: BTreeSet<Key> = pod.keys().into_iter().collect();
    let mut steps: Vec<Step> = chains.iter().map(|c| add_chain_step(t, c)).collect();
    for key in old.iter().filter(|k| !wanted.contains(k)) {
        if let Some(chain) = chains.get(key.chain_index()) {
            steps.push(Step::Elem { key: key.clone(), chain: chain.clone(), op: Op::Remove });
        }
    }
    steps.extend(chains.iter().map(|c| flush_step(t, c)));
    push_rules_and_elements(pod, &chains, &mut steps);
    steps
}

/// A container to remove: its chain base, the chains to remove and the element keys its rules name.
struct Doomed {
    base: String,
    chains: Vec<String>,
    keys: Vec<Key>,
}

/// One batch removing the containers' elements and chains. Every chain is created if missing and
/// every element re-added before it is deleted, so the batch succeeds whether or not a parallel
/// DEL got there first.
fn removal_plan(t: &Table, doomed: &[Doomed]) -> Vec<Step> {
    let tn = t.t();
    let mut steps = vec![Step::Line(format!("add table {tn}"), Some(Nl::Table))];
    for d in doomed {
        steps.extend(d.chains.iter().map(|c| add_chain_step(t, c)));
    }
    for d in doomed {
        for key in &d.keys {
            let chain = format!("{}{}", d.base, t.suffixes.get(key.chain_index()).copied().unwrap_or(""));
            steps.push(Step::Elem { key: key.clone(), chain, op: Op::Remove });
        }
    }
    for d in doomed {
        steps.extend(d.chains.iter().map(|c| flush_step(t, c)));
    }
    for d in doomed {
        steps
            .extend(d.chains.iter().map(|c| Step::Line(format!("delete chain {tn} {c}"), Some(Nl::Delete(c.clone())))));
    }
    steps
}

/// `add chain` of a regular chain: a no-op when it exists.
fn add_chain_step(t: &Table, chain: &str) -> Step {
    Step::Line(
        format!("add chain {} {chain}", t.t()),
        Some(Nl::Chain { name: chain.to_string(), base: None, comment: None }),
    )
}

/// What to remove of a container whose first chain lists as `first`.
fn doomed_from(t: &Table, base: &str, first: &ChainInfo) -> Doomed {
    let mut chains = t.chains(base);
    if first.legacy() {
        chains.extend(t.legacy_suffixes.iter().map(|s| format!("{base}{s}")));
    }
    Doomed { base: base.to_string(), chains, keys: first.keys().0 }
}

fn add_pod(pod: &Pod, what: &str) -> Result<()> {
    let t = pod.table;
    if pod.rules.is_empty() {
        return del_pod(t, &pod.base, what);
    }
    let first = t.chains(&pod.base).into_iter().next().unwrap_or_default();
    let mut setup = false;
    let mut steps = fast_plan(pod);
    for _ in 0..4 {
        let failure = match run_plan(t, &mut steps)? {
            Outcome::Done => return Ok(()),
            Outcome::Conflict(keys) => return Err(conflict(what, &keys)),
            Outcome::Failed(f) => f,
        };
        let exists_on_create =
            failure.errors.iter().any(|&(i, k)| k == ErrKind::Exists && matches!(steps.get(i), Some(Step::Create(..))));
        if failure.any(ErrKind::Missing) && !setup {
            // The maps or shared chains are missing (first ADD on this node, or a flushed ruleset).
            setup = true;
        } else if exists_on_create {
            // A repeated ADD: replace what the container had, found in its first chain.
            match list_chain(t, &first)? {
                Some(info) if info.legacy() => {
                    del_pod(t, &pod.base, what)?;
                    steps = fast_plan(pod);
                }
                Some(info) => steps = replace_plan(pod, &info.keys().0),
                None => steps = fast_plan(pod),
            }
        } else {
            return Err(Error::network(format!("{what}: {}", failure.message)));
        }
        if setup {
            let mut with_setup: Vec<Step> = t.setup();
            with_setup.extend(steps.into_iter().filter(|s| !matches!(s, Step::Line(_, Some(Nl::Table)))));
            steps = with_setup;
        }
    }
    Err(Error::network(format!("{what}: nft kept failing on table {}", t.t())))
}

fn conflict(what: &str, keys: &[Key]) -> Error {
    let names: Vec<String> = keys.iter().map(Key::describe).collect();
    Error::network(format!("{what}: {} already mapped by another container", names.join(", ")))
}

/// Removes a container's chains and elements; what is not there is success.
fn del_pod(t: &Table, base: &str, what: &str) -> Result<()> {
    let first = t.chains(base).into_iter().next().unwrap_or_default();
    let mut last = String::new();
    for _ in 0..3 {
        let Some(info) = list_chain(t, &first)? else { return Ok(()) };
        let mut steps = removal_plan(t, &[doomed_from(t, base, &info)]);
        match run_plan(t, &mut steps)? {
            Outcome::Done => return Ok(()),
            Outcome::Conflict(_) => {}
            // Listed again: the chain may be gone now (a parallel DEL), or its rules changed.
            Outcome::Failed(f) => last = f.message,
        }
    }
    Err(Error::network(format!("{what}: {last}")))
}

/// The container's chains hold the expected number of rules and its elements lead to them.
fn check_pod(pod: &Pod, what: &str) -> Result<()> {
    let t = pod.table;
    let chains = t.chains(&pod.base);
    for (i, chain) in chains.iter().enumerate() {
        let expected = pod.rule_count(i);
        match list_chain(t, chain)? {
            None => return Err(check_failed(format!("{what}: chain {chain} missing from table {}", t.t()))),
            Some(info) if info.comments.len() != expected => {
                return Err(check_failed(format!(
                    "{what}: chain {chain} in table {} has {} rules, expected {expected}",
                    t.t(),
                    info.comments.len()
                )))
            }
            Some(_) => {}
        }
    }
    check_elements(t, &chains, &pod.keys(), what)
}

/// Each key's element exists and jumps to our chain. Asked in one `nft --check` batch, which the
/// kernel validates and then discards: per key `create element` (fails: it exists) and then
/// `add element` with our verdict (fails: it leads elsewhere).
fn check_elements(t: &Table, chains: &[String], keys: &[Key], what: &str) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let tn = t.t();
    let mut batch = String::new();
    for key in keys {
        let chain = chains.get(key.chain_index()).map(String::as_str).unwrap_or("");
        let (map, k) = (key.map(), key.literal());
        let _ = writeln!(batch, "create element {tn} {map} {{ {k} : jump {chain} }}");
        let _ = writeln!(batch, "add element {tn} {map} {{ {k} : jump {chain} }}");
    }
    let out = run("nft", &["-c", "-f", "-"], Some(&batch))?;
    let errors = parse_errors(&out.stderr);
    if !out.success && errors.is_empty() {
        return Err(Error::network(format!("{what}: nft --check failed: {}", one_line(&out.stderr))));
    }
    for (i, key) in keys.iter().enumerate() {
        let on = |line: usize| errors.iter().find(|(l, _)| *l == line).map(|(_, k)| *k);
        let (create, add) = (on(2 * i + 1), on(2 * i + 2));
        match (create, add) {
            (Some(ErrKind::Exists), None) => {}
            (Some(ErrKind::Exists), Some(ErrKind::Exists)) => {
                return Err(check_failed(format!(
                    "{what}: {} element {} of table {tn} leads to another container's chain",
                    key.map(),
                    key.text()
                )))
            }
            (None | Some(ErrKind::Missing), _) => {
                return Err(check_failed(format!(
                    "{what}: {} element {} missing from table {tn}",
                    key.map(),
                    key.text()
                )))
            }
            _ => return Err(Error::network(format!("{what}: nft --check failed: {}", one_line(&out.stderr)))),
        }
    }
    Ok(())
}

/// Removes the chains and elements of every container of `network` not in `keep`: one listing of
/// the table, one batch.
fn gc(t: &Table, network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    let kept: HashSet<String> = keep.iter().map(|a| t.base(network, &a.container_id, &a.ifname)).collect();
    let ours = format!("{}-{}-", t.prefix, network_hash(network));
    let mut last = String::new();
    for _ in 0..2 {
        let Some(listing) = list(t, "table", "")? else { return Ok(()) };
        let mut stale: BTreeMap<String, Doomed> = BTreeMap::new();
        for (chain, info) in &listing {
            let Some(rest) = chain.strip_prefix(&ours) else { continue };
            let base = format!("{ours}{}", rest.get(..16).unwrap_or(rest));
            if kept.contains(&base) {
                continue;
            }
            let d = stale.entry(base.clone()).or_insert_with(|| Doomed { chains: t.chains(&base), base, keys: vec![] });
            if !d.chains.contains(chain) {
                d.chains.push(chain.clone());
            }
            d.keys.extend(info.keys().0);
        }
        if stale.is_empty() {
            return Ok(());
        }
        let doomed: Vec<Doomed> = stale.into_values().collect();
        match run_plan(t, &mut removal_plan(t, &doomed))? {
            Outcome::Done => return Ok(()),
            Outcome::Conflict(_) => {}
            Outcome::Failed(f) => last = f.message,
        }
    }
    Err(Error::network(format!("{what}: {last}")))
}

/// Drop frames entering the bridge from `port` (the pod's host veth) unless their source MAC is `mac`.
pub fn add_macspoof(network: &str, container_id: &str, ifname: &str, port: &str, mac: &str) -> Result<()> {
    let pod = macspoof_pod(network, container_id, ifname, port, mac)?;
    add_pod(&pod, &format!("add MAC spoof check for container {container_id}"))
}

/// Remove the spoof check of an attachment; absent is success.
pub fn del_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let base = MACSPOOF.base(network, container_id, ifname);
    del_pod(&MACSPOOF, &base, &format!("delete MAC spoof check of container {container_id}"))
}

/// Remove the spoof checks of every attachment of `network` that is not in `keep`.
pub fn gc_macspoof(network: &str, keep: &[Attachment]) -> Result<()> {
    gc(&MACSPOOF, network, keep, &format!("garbage-collect MAC spoof checks of network {network}"))
}

/// The spoof check of an attachment exists with its rule, and its bridge port leads to it.
pub fn check_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let chain = MACSPOOF.base(network, container_id, ifname);
    let what = format!("MAC spoof check of container {container_id}");
    let info = list_chain(&MACSPOOF, &chain)?;
    let keys = match &info {
        Some(info) if info.comments.len() == 1 && !info.legacy() => info.keys().0,
        _ => return Err(check_failed(format!("{what}: chain {chain} missing or changed"))),
    };
    check_elements(&MACSPOOF, &[chain], &keys, &what)
}

impl Firewall for NftablesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nftables
    }

    fn add_masquerade(&self, m: &Masquerade) -> Result<()> {
        flat::add_masquerade(m, &format!("add masquerade for container {}", m.container_id))
    }

    fn del_masquerade(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        flat::del_masquerade(network, container_id, ifname, &format!("delete masquerade of container {container_id}"))
    }

    fn check_masquerade(&self, m: &Masquerade) -> Result<()> {
        flat::check_masquerade(m, &format!("masquerade of container {}", m.container_id))
    }

    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        let what = format!("garbage-collect masquerade of network {network}");
        gc(&MASQ, network, keep, &what)?;
        flat::gc_masquerade(network, keep, &what)
    }

    fn add_portmap(&self, p: &PortMap) -> Result<()> {
        let what = format!("add port mappings for container {}", p.container_id);
        if p.localnet() {
            ensure_localnet_drop(&what)?;
        }
        if !has_conditions(p) {
            return flat::add_portmap(p, &what);
        }
        // Conditions are nft text of a rule of the pod's own: the chain layout.
        if let Some(k) = flat::held(p)? {
            return Err(conflict(&what, &[k]));
        }
        flat::forget_portmap(&p.network, &p.container_id, &p.ifname, &what)?;
        add_pod(&portmap_pod(p), &what)
    }

    fn del_portmap(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        flat::del_portmap(network, container_id, ifname, &format!("delete port mappings of container {container_id}"))
    }

    fn check_portmap(&self, p: &PortMap) -> Result<()> {
        let what = format!("port mappings of container {}", p.container_id);
        if p.localnet() && !list_chain(&PORTMAP, LOCALNET_CHAIN)?.as_ref().is_some_and(localnet_present) {
            return Err(check_failed(format!(
                "{what}: chain {LOCALNET_CHAIN} of table {} (the drop of packets to 127.0.0.0/8 from elsewhere) is missing or changed",
                PORTMAP.t()
            )));
        }
        if has_conditions(p) {
            check_pod(&portmap_pod(p), &what)
        } else {
            flat::check_portmap(p, &what)
        }
    }

    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        let what = format!("garbage-collect port mappings of network {network}");
        gc(&PORTMAP, network, keep, &what)?;
        flat::gc_portmap(network, keep, &what)
    }

    fn status(&self) -> Result<()> {
        // CHECK and GC (and conditions) still run nft; everything else is netlink.
        if exec::find("nft").is_none() {
            return Err(Error::new(code::NOT_AVAILABLE, "nftables is not usable here: nft not found"));
        }
        if kernel_has_nf_tables() {
            Ok(())
        } else {
            Err(Error::new(
                code::NOT_AVAILABLE,
                "nftables is not usable here: the kernel does not answer nf_tables requests",
            ))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::PortMapping;
    use super::*;

    pub(super) fn pm() -> PortMap {
        PortMap {
            network: "net1".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            mappings: vec![
                PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: Some("192.168.1.1".parse().unwrap()),
                },
            ],
            ipv4: Some("10.22.0.5/16".parse().unwrap()),
            ipv6: Some("fd00:22::5/64".parse().unwrap()),
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: vec!["ip saddr != 10.0.0.0/8".into()],
            conditions_v6: vec![],
        }
    }

    fn text(steps: &[Step]) -> String {
        render(&PORTMAP, steps).0
    }

    #[test]
    fn names_are_stable_and_scoped_by_network() {
        let a = PORTMAP.base("net1", "c1", "eth0");
        assert_eq!(a.len(), "pm-".len() + 8 + 1 + 16);
        assert_eq!(a, PORTMAP.base("net1", "c1", "eth0"));
        assert_ne!(a, PORTMAP.base("net1", "c1", "eth1"));
        assert_ne!(a[3..11], PORTMAP.base("net2", "c1", "eth0")[3..11]);
        assert!(MASQ.base("n", "c", "eth0").starts_with("mq-"));
        assert!(MACSPOOF.base("n", "c", "eth0").starts_with("ms-"));
    }

    #[test]
    fn setup_has_a_constant_set_of_base_chains() {
        let s = render(&PORTMAP, &PORTMAP.setup()).0;
        assert_eq!(s.matches(" hook ").count(), 4, "{s}");
        assert!(s.contains(
            "add rule inet cni_rs_portmap input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state ! established,related ct status ! dnat drop"
        ));
        assert!(s.contains("add rule inet cni_rs_portmap prerouting fib daddr type local jump dispatch"));
        assert!(s.contains("add rule inet cni_rs_portmap dispatch ip daddr . meta l4proto . th dport vmap @hostports4"));
        // The dispatch chain is created before the base chains that jump to it.
        assert!(s.find("add chain inet cni_rs_portmap dispatch").unwrap() < s.find("prerouting").unwrap());
        assert_eq!(render(&MASQ, &MASQ.setup()).0.matches(" hook ").count(), 1);
        let ms = render(&MACSPOOF, &MACSPOOF.setup()).0;
        assert!(ms.contains("add map bridge cni_rs_macspoof ports { type ifname : verdict; }"), "{ms}");
        assert!(ms.contains("add rule bridge cni_rs_macspoof prerouting iifname vmap @ports"), "{ms}");
    }

    #[test]
    fn portmap_add_batch() {
        let pod = portmap_pod(&pm());
        let b = text(&fast_plan(&pod));
        let base = PORTMAP.base("net1", "c1", "eth0");
        let t = "inet cni_rs_portmap";
        // The first ADD adds only: a deletion costs an RCU grace period. No base chain of its own.
        assert!(!b.contains("delete") && !b.contains("flush") && !b.contains("hook"), "{b}");
        assert!(b.starts_with(&format!("create chain {t} {base}-dnat {{ comment \"cni-rs portmap net=net1 id=c1 if=eth0\"; }}\ncreate chain {t} {base}-post\n")), "{b}");
        assert!(b.contains(&format!(
            "add rule {t} {base}-dnat meta nfproto ipv4 ip saddr != 10.0.0.0/8 tcp dport 8080 dnat ip to 10.22.0.5:80 comment \"anyports4=tcp . 8080;snat4=10.22.0.5\"\n"
        )), "{b}");
        assert!(b.contains(&format!(
            "add rule {t} {base}-dnat meta nfproto ipv4 ip saddr != 10.0.0.0/8 ip daddr 192.168.1.1 udp dport 5353 dnat ip to 10.22.0.5:53 comment \"hostports4=192.168.1.1 . udp . 5353;snat4=10.22.0.5\"\n"
        )), "{b}");
        assert!(b.contains(&format!(
            "add rule {t} {base}-dnat meta nfproto ipv6 tcp dport 8080 dnat ip6 to [fd00:22::5]:80 comment \"anyports6=tcp . 8080;snat6=fd00:22::5\"\n"
        )), "{b}");
        // The UDP mapping is bound to an IPv4 host address: no IPv6 rule for it.
        assert!(!b.contains("dnat ip6 to [fd00:22::5]:53"));
        for source in ["10.22.0.0/16", "127.0.0.1"] {
            assert!(b.contains(&format!(
                "ct status dnat ip daddr 10.22.0.5 ip saddr {source} meta l4proto udp ct original proto-dst 5353 ct original ip daddr 192.168.1.1 masquerade"
            )), "{b}");
        }
        // No anonymous sets: nft would fetch each one's elements before every element command.
        assert!(!b.contains("saddr {"), "{b}");
        assert!(b.contains("ct status dnat ip6 daddr fd00:22::5 ip6 saddr fd00:22::/64 meta l4proto tcp"));
        for e in [
            format!("add element {t} anyports4 {{ tcp . 8080 : jump {base}-dnat }}"),
            format!("add element {t} hostports4 {{ 192.168.1.1 . udp . 5353 : jump {base}-dnat }}"),
            format!("add element {t} anyports6 {{ tcp . 8080 : jump {base}-dnat }}"),
            format!("add element {t} snat4 {{ 10.22.0.5 : jump {base}-post }}"),
            format!("add element {t} snat6 {{ fd00:22::5 : jump {base}-post }}"),
        ] {
            assert_eq!(b.matches(&e).count(), 1, "{e} in\n{b}");
        }
        assert_eq!(pod.rule_count(0), 3);
        assert_eq!(pod.rule_count(1), 5);
        assert_eq!(pod.keys().len(), 5);
        // Elements come after the rules of the chains they lead to.
        assert!(b.rfind("add rule").unwrap() < b.find("add element").unwrap());

        let no_snat = portmap_pod(&PortMap { snat: false, ..pm() });
        assert_eq!(no_snat.rule_count(1), 0);
        assert!(!text(&fast_plan(&no_snat)).contains("snat4"));
        let all = portmap_pod(&PortMap { masq_all: true, ..pm() });
        assert_eq!(all.rule_count(1), 3);
        assert!(!text(&fast_plan(&all)).contains("saddr 127.0.0.1"));
    }

    #[test]
    fn repeated_add_replaces_the_old_elements() {
        let pod = portmap_pod(&pm());
        let base = PORTMAP.base("net1", "c1", "eth0");
        let old = vec![
            Key::AnyPort { v6: false, proto: Protocol::Tcp, port: 8080 },
            Key::AnyPort { v6: false, proto: Protocol::Tcp, port: 9999 },
        ];
        let b = text(&replace_plan(&pod, &old));
        assert!(b.contains(&format!(
            "add element inet cni_rs_portmap anyports4 {{ tcp . 9999 : jump {base}-dnat }}\ndelete element inet cni_rs_portmap anyports4 {{ tcp . 9999 }}\n"
        )), "{b}");
        // Still wanted: neither deleted nor added twice.
        assert!(!b.contains("delete element inet cni_rs_portmap anyports4 { tcp . 8080 }"), "{b}");
        assert_eq!(b.matches("anyports4 { tcp . 8080 :").count(), 1, "{b}");
        assert!(b.find("flush chain").unwrap() < b.find("add rule").unwrap());
        assert!(!b.contains("create"), "{b}");
    }

    #[test]
    fn delete_batch_removes_elements_then_chains() {
        let base = PORTMAP.base("net1", "c1", "eth0");
        let pod = portmap_pod(&pm());
        let comments = pod.rules.iter().filter(|r| r.chain == 0).map(|r| Some(keys_comment(&r.keys))).collect();
        let info = ChainInfo { hook: false, comments };
        assert!(!info.legacy());
        let d = doomed_from(&PORTMAP, &base, &info);
        assert_eq!(d.keys.len(), 5);
        assert_eq!(d.chains, vec![format!("{base}-dnat"), format!("{base}-post")]);
        let b = text(&removal_plan(&PORTMAP, &[d]));
        assert!(b.starts_with("add table inet cni_rs_portmap\n"), "{b}");
        assert!(b.contains(&format!(
            "add element inet cni_rs_portmap snat6 {{ fd00:22::5 : jump {base}-post }}\ndelete element inet cni_rs_portmap snat6 {{ fd00:22::5 }}\n"
        )), "{b}");
        let last_elem = b.rfind("delete element").unwrap();
        assert!(last_elem < b.find("flush chain").unwrap());
        assert!(b.rfind("flush chain").unwrap() < b.find("delete chain").unwrap());
        assert!(b.ends_with(&format!("delete chain inet cni_rs_portmap {base}-post\n")), "{b}");

        // A chain of the earlier layout (no key comments): its base chains go too.
        let legacy = ChainInfo { hook: false, comments: vec![None] };
        let d = doomed_from(&PORTMAP, &base, &legacy);
        assert!(d.keys.is_empty());
        assert_eq!(d.chains.len(), 4);
        let legacy_masq = ChainInfo { hook: true, comments: vec![None] };
        assert!(legacy_masq.legacy());
    }

    #[test]
    fn keys_round_trip_through_comments() {
        let keys = vec![
            Key::HostPort { ip: "fd00::1".parse().unwrap(), proto: Protocol::Sctp, port: 65535 },
            Key::AnyPort { v6: true, proto: Protocol::Udp, port: 1 },
            Key::Snat("10.0.0.1".parse().unwrap()),
            Key::Masq("fd00::5".parse().unwrap()),
            Key::BridgePort("veth0a1b2c3d".into()),
        ];
        let c = keys_comment(&keys);
        assert!(c.len() < 256);
        assert_eq!(keys_of_comment(&c).unwrap(), keys);
        assert_eq!(Key::BridgePort("veth1".into()).literal(), "\"veth1\"");
        for bad in [
            "hostports4=fd00::1 . tcp . 1",
            "anyports4=tcp . 70000",
            "snat4=10.0.0.01",
            "masq4=10.0.0.1; add table x",
            "ports=a\"b",
            "nosuchmap=1",
            "cni-rs portmap net=x",
        ] {
            assert!(keys_of_comment(bad).is_none(), "{bad}");
        }
        assert!(Key::AnyPort { v6: false, proto: Protocol::Tcp, port: 1 }.exclusive());
        assert!(!Key::Masq("10.0.0.1".parse().unwrap()).exclusive());
    }

    #[test]
    fn masquerade_batch() {
        let m = Masquerade {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth\"0".into(),
            addresses: vec!["10.1.2.3/24".parse().unwrap(), "fd00::3/64".parse().unwrap()],
        };
        let pod = masq_pod(&m);
        let chain = MASQ.base("n", "c", "eth\"0");
        let b = render(&MASQ, &fast_plan(&pod)).0;
        assert!(b.contains(&format!("add rule inet cni_rs_masq {chain} ip saddr 10.1.2.3 ip daddr != 10.1.2.0/24 ip daddr != 224.0.0.0/4 masquerade comment \"masq4=10.1.2.3\"")), "{b}");
        assert!(b.contains("ip6 saddr fd00::3 ip6 daddr != fd00::/64 ip6 daddr != ff00::/8 masquerade"));
        assert!(b.contains(&format!("add element inet cni_rs_masq masq6 {{ fd00::3 : jump {chain} }}")), "{b}");
        assert!(b.contains("if=eth_0"));
        assert!(!b.contains("delete") && !b.contains("hook"), "{b}");
    }

    #[test]
    fn macspoof_batch() {
        let pod = macspoof_pod("n", "c", "eth0", "veth1234abcd", "0a:58:0a:00:00:02").unwrap();
        let chain = MACSPOOF.base("n", "c", "eth0");
        let b = render(&MACSPOOF, &fast_plan(&pod)).0;
        assert!(
            b.contains("iifname \"veth1234abcd\" ether saddr != 0a:58:0a:00:00:02 drop comment \"ports=veth1234abcd\""),
            "{b}"
        );
        assert!(b.contains(&format!("add element bridge cni_rs_macspoof ports {{ \"veth1234abcd\" : jump {chain} }}")));
        assert!(!b.contains("delete") && !b.contains("hook"), "{b}");
        assert!(macspoof_pod("n", "c", "eth0", "veth\"x", "0a:58:0a:00:00:02").is_err());
    }

    #[test]
    fn nft_errors_name_their_line() {
        let stderr = "/dev/stdin:3:34-43: Error: Could not process rule: File exists\n\
                      add element inet t ports4 { tcp . 8080 : jump c }\n\
                                                  ^^^^^^^^^^\n\
                      /dev/stdin:2:25-29: Error: No such file or directory; did you mean map 'x'?\n\
                      /dev/stdin:7:1-5: Error: Could not process rule: Device or resource busy\n";
        assert_eq!(parse_errors(stderr), vec![(3, ErrKind::Exists), (2, ErrKind::Missing), (7, ErrKind::Other)]);
    }

    #[test]
    fn netlink_probe_agrees_with_nft() {
        // Only where nft itself can list (root, nf_tables present) is the answer known.
        let nft_lists = exec::find("nft").is_some() && run("nft", &["list", "tables"], None).is_ok_and(|o| o.success);
        if nft_lists {
            assert!(kernel_has_nf_tables());
        }
    }

    /// Runs `f` on a thread of its own in a fresh network namespace (nft run from it inherits it).
    pub(super) fn in_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        std::thread::spawn(move || {
            // SAFETY: unshare(2) changes only this thread's network namespace.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    }

    fn nft_ok(args: &[&str], stdin: Option<&str>) -> String {
        let out = run("nft", args, stdin).unwrap();
        assert!(out.success, "nft {args:?}: {}\n{}", out.stderr, stdin.unwrap_or_default());
        out.stdout
    }

    /// A table as nft lists it (JSON without handles, and the kernel's expressions), with set
    /// elements in a fixed order (a hash set lists in the order of its seed).
    fn table_listing(t: &Table) -> (Value, String) {
        fn normalize(v: &mut Value) {
            match v {
                Value::Object(m) => {
                    m.remove("handle");
                    for (k, v) in m.iter_mut() {
                        normalize(v);
                        if let (true, Value::Array(a)) = (k == "elem", v) {
                            a.sort_by_key(|e| e.to_string());
                        }
                    }
                }
                Value::Array(a) => a.iter_mut().for_each(normalize),
                _ => {}
            }
        }
        let mut v: Value = serde_json::from_str(&nft_ok(&["-j", "list", "table", t.family, t.name], None)).unwrap();
        if let Some(items) = v.get_mut("nftables").and_then(Value::as_array_mut) {
            items.retain(|i| i.get("metainfo").is_none());
        }
        normalize(&mut v);
        let debug = nft_ok(&["--debug=netlink", "list", "table", t.family, t.name], None);
        (v, super::super::nfnl::tests::sort_element_runs(&debug))
    }

    fn pods() -> Vec<Pod> {
        let plain = PortMap { conditions_v4: vec![], ..pm() };
        let bound6 = PortMapping {
            host_port: 8443,
            container_port: 443,
            protocol: Protocol::Sctp,
            host_ip: Some("fd00::1".parse().unwrap()),
        };
        let all = PortMap { container_id: "c2".into(), masq_all: true, mappings: vec![bound6], ..plain.clone() };
        let masq = Masquerade {
            network: "n".into(),
            container_id: "c".into(),
            ifname: "eth0".into(),
            addresses: vec!["10.1.2.3/20".parse().unwrap(), "fd00::3/64".parse().unwrap()],
        };
        vec![
            portmap_pod(&plain),
            portmap_pod(&all),
            masq_pod(&masq),
            macspoof_pod("n", "c", "eth0", "veth1234abcd", "0a:58:0a:00:00:02").unwrap(),
        ]
    }

    /// A table set up before the drop of packets to 127.0.0.0/8 existed gets it from the next ADD
    /// that has portmap turn route_localnet on (snat, IPv4); an ADD without snat leaves it as it is.
    #[test]
    fn add_puts_the_localnet_drop_into_an_older_table() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || exec::find("nft").is_none() {
            eprintln!("SKIP: needs root and nft");
            return;
        }
        in_netns(|| {
            let rules = || list_chain(&PORTMAP, LOCALNET_CHAIN).unwrap().map(|c| (c.hook, c.comments.len()));
            let plain = PortMap { conditions_v4: vec![], snat: false, ..pm() };
            NftablesBackend.add_portmap(&plain).unwrap();
            assert_eq!(rules(), Some((true, 2)), "a new table has the drop");
            nft_ok(&["delete", "chain", "inet", PORTMAP_TABLE, LOCALNET_CHAIN], None);
            let port = |host_port| vec![PortMapping { host_port, ..plain.mappings[0] }];
            let other = PortMap { container_id: "c2".into(), mappings: port(9090), ..plain.clone() };
            NftablesBackend.add_portmap(&other).unwrap();
            assert_eq!(rules(), None);
            let snat = PortMap { container_id: "c3".into(), mappings: port(9091), snat: true, ..plain.clone() };
            NftablesBackend.add_portmap(&snat).unwrap();
            assert_eq!(rules(), Some((true, 2)));
            NftablesBackend.check_portmap(&plain).unwrap();
            NftablesBackend.check_portmap(&snat).unwrap();
            // CHECK of an attachment that relies on the drop finds it missing.
            nft_ok(&["delete", "chain", "inet", PORTMAP_TABLE, LOCALNET_CHAIN], None);
            NftablesBackend.check_portmap(&plain).unwrap();
            let err = NftablesBackend.check_portmap(&snat).unwrap_err();
            assert_eq!(err.code, code::CHECK_FAILED, "{err}");
            assert!(err.msg.contains("127.0.0.0/8"), "{err}");
        });
    }

    /// What netlink creates lists exactly like what the nft text creates, and either can be added
    /// to what the other made (mixed old and new state).
    #[test]
    fn netlink_batches_list_like_nft_text() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || exec::find("nft").is_none() {
            eprintln!("SKIP: needs root and nft");
            return;
        }
        for (i, pod) in pods().into_iter().enumerate() {
            let t = pod.table;
            let mut steps = t.setup();
            steps.extend(fast_plan(&pod));
            let text = render(t, &steps).0;
            assert!(to_batch(t, &steps).is_some(), "pod {i}: not all netlink");
            let by_nft = {
                let text = text.clone();
                in_netns(move || {
                    nft_ok(&["-f", "-"], Some(&text));
                    table_listing(t)
                })
            };
            let by_netlink = {
                let steps = steps.clone();
                let pod = pod.clone();
                in_netns(move || {
                    to_batch(t, &steps).unwrap().0.send().unwrap();
                    let listing = table_listing(t);
                    // The other way round: nft text on netlink's state (setup again, a DEL).
                    let del = removal_plan(
                        t,
                        &[doomed_from(t, &pod.base, &list_chain(t, &t.chains(&pod.base)[0]).unwrap().unwrap())],
                    );
                    let mut again = t.setup();
                    again.extend(del);
                    nft_ok(&["-f", "-"], Some(&render(t, &again).0));
                    assert!(list_chain(t, &t.chains(&pod.base)[0]).unwrap().is_none());
                    listing
                })
            };
            assert_eq!(by_netlink.1, by_nft.1, "pod {i}: expressions differ (left: netlink, right: nft)\n{text}");
            assert_eq!(by_netlink.0, by_nft.0, "pod {i}: listings differ (left: netlink, right: nft)");
            // nft's state, then netlink: setup again, list the pod's chain, remove it.
            in_netns(move || {
                nft_ok(&["-f", "-"], Some(&text));
                let first = t.chains(&pod.base)[0].clone();
                let info = list_chain(t, &first).unwrap().unwrap();
                assert_eq!(info.keys(), (pod.keys().into_iter().collect::<BTreeSet<_>>().into_iter().collect(), true));
                let mut again = t.setup();
                again.extend(removal_plan(t, &[doomed_from(t, &pod.base, &info)]));
                to_batch(t, &again).unwrap().0.send().unwrap();
                assert!(list_chain(t, &first).unwrap().is_none());
            });
        }
    }

    #[test]
    fn conditions_are_nft_text() {
        // pm() has conditionsV4: its rules, and so its batches, go through nft.
        let pod = portmap_pod(&pm());
        assert!(pod.rules.iter().any(|r| r.nl.is_none()));
        assert!(to_batch(&PORTMAP, &fast_plan(&pod)).is_none());
        assert!(to_batch(&PORTMAP, &fast_plan(&portmap_pod(&PortMap { conditions_v4: vec![], ..pm() }))).is_some());
    }

    #[test]
    fn listing() {
        let json = r#"{"nftables":[{"metainfo":{}},{"table":{"name":"t"}},{"chain":{"name":"a"}},
            {"chain":{"name":"b","type":"nat","hook":"postrouting"}},
            {"rule":{"chain":"a","comment":"masq4=10.0.0.1","expr":[]}},{"rule":{"chain":"a","expr":[]}}]}"#;
        let m = parse_listing(json).unwrap();
        assert_eq!(m["a"].comments, vec![Some("masq4=10.0.0.1".to_string()), None]);
        assert!(!m["a"].hook && m["b"].hook);
        assert!(m["b"].comments.is_empty());
        assert_eq!(m["a"].keys(), (vec![Key::Masq("10.0.0.1".parse().unwrap())], false));
    }
}
