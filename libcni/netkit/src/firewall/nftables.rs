//! The nftables backend: three tables of ours, each with a fixed set of chains, sets and maps made
//! over netlink by the first ADD that finds them missing. What an attachment holds is elements of
//! those sets and maps ([`flat`]); no verb runs `nft`, except that an ADD of port mappings with
//! `conditionsV4`/`conditionsV6` (free nft syntax, which only nft compiles) has nft fill that
//! attachment's chain.
//!
//! ```text
//! table inet cni_rs_portmap {
//!   map dnat4  { type inet_proto . inet_service : ipv4_addr . inet_service; flags timeout; }
//!                                        proto . host port -> pod address . container port
//!   map hdnat4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; ... }
//!                                        the same for a mapping bound to one host address
//!   map own4 / hown4 { ... : ipv6_addr } who holds the host port: the attachment's 128-bit tag
//!   set hp4-<len> / hhp4-<len> { ipv4_addr . [ipv4_addr .] inet_proto . inet_service }
//!                                        hairpin: the pod's subnet (masked to <len> bits) . host port
//!   set sp4 / hsp4                       IPv4 localhost may reach these host ports (snat)
//!   set all4 / hall4 (and 6)             masqAll: every source
//!   map gate4 / hgate4 (and 6) { ... : verdict }
//!                                        host port -> jump pm-<id16>, for mappings with conditions
//!   set owners { ipv6_addr . inet_service } tag . chunk, the comment listing what the attachment holds
//!   chain hairpin { ip saddr & <mask> . meta l4proto . th dport @hp4-<len> meta mark set meta mark | 0x2000
//!                   ip saddr & <mask> . ip daddr . meta l4proto . th dport @hhp4-<len> meta mark set ... }
//!   chain dispatch { jump hairpin; the sp/all marks;
//!                    ip daddr . meta l4proto . th dport vmap @hgate4; meta l4proto . th dport vmap @gate4;
//!                    dnat ip to ip daddr . meta l4proto . th dport map @hdnat4;
//!                    meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4; (and 6) }
//!   chain prerouting { type nat hook prerouting priority dstnat; fib daddr type local jump dispatch }
//!   chain output { type nat hook output priority -100; fib daddr type local jump dispatch }
//!   chain postrouting { type nat hook postrouting priority srcnat; ct status dnat meta mark & 0x2000 == 0x2000 masquerade }
//!   chain input { type filter hook input priority filter; ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ... drop }
//!   chain pm-<id16> { meta nfproto ipv4 <conditionsV4> [ip daddr H] tcp dport 8080 dnat ip to 10.22.0.5:80 }
//!                                        one per attachment with conditions, reached through its gate elements
//! }
//! table inet cni_rs_masq {
//!   map pods4 { type ipv4_addr : ipv6_addr; flags timeout; }   pod address -> the attachment's tag
//!   set local4-<len> { type ipv4_addr . ipv4_addr; ... }       pod address . its subnet
//!   set owners { ipv6_addr . inet_service }
//!   chain local { ip saddr . ip daddr & <mask> @local4-<len> accept }
//!   chain postrouting { type nat hook postrouting priority srcnat; jump local;
//!                       ip saddr @pods4 ip daddr != 224.0.0.0/4 masquerade; (and 6) }
//! }
//! table bridge cni_rs_macspoof {
//!   map port_owner { type ifname : ipv6_addr; flags timeout; } bridge port -> the attachment's tag
//!   set macs { type ifname . ether_addr; flags timeout; }      bridge port . the pod's MAC
//!   set owners { ipv6_addr . inet_service }
//!   chain prerouting { type filter hook prerouting priority -300;
//!                      iifname @port_owner iifname . ether saddr != @macs drop }
//! }
//! ```
//!
//! The base chains are shared and fixed: the kernel allows 1024 hooks per hook point and copies
//! the hook array on every registration, and every new connection would walk a chain per pod. A
//! lookup is one hash probe however many pods there are. `<id16>` is the first 64 bits of the
//! attachment's tag (sha512 of network, container id and ifname). A pod chain whose conditions
//! do not match returns to `dispatch`, which goes on to the dnat maps: a mapping of another
//! attachment on the same port (any host address) still applies.

use super::nfnl::{
    self, unmasked as key, BaseChain, Batch, ChainType, Conn, Field, Hook, KeyType, SetData, SetSpec, TableFamily,
    Verdict,
};
use super::{check_failed, BackendKind, Firewall, Masquerade, PortMap};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{code, Error, Result};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod flat;

pub use flat::{add_macspoof, check_macspoof, del_macspoof, gc_macspoof};

pub(crate) const PORTMAP_TABLE: &str = "cni_rs_portmap";
pub(crate) const MASQ_TABLE: &str = "cni_rs_masq";
pub(crate) const MACSPOOF_TABLE: &str = "cni_rs_macspoof";

/// One of our tables: what its setup creates.
#[derive(Debug)]
pub(crate) struct Table {
    pub(crate) fam: TableFamily,
    pub(crate) name: &'static str,
    sets: &'static [(&'static str, SetSpec<'static>)],
    /// Created in this order (a chain before the chains that jump to it).
    chains: &'static [(&'static str, Option<BaseChain>)],
    /// The rules setup puts into its chains, each of those chains flushed first. Chains not named
    /// here keep their rules (those made with the sets of a subnet length, see [`flat`]).
    rules: fn() -> Vec<(&'static str, nfnl::Rule)>,
}

impl Table {
    /// `inet cni_rs_portmap`: how messages name the table.
    fn full_name(&self) -> String {
        format!("{} {}", self.fam.name(), self.name)
    }

    /// Creates the table, its sets and chains (what exists alike is left as it is), and refills
    /// the chains it fills. Adds nothing of any attachment.
    fn setup(&self, b: &mut Batch) {
        b.add_table(self.fam, self.name);
        for (name, spec) in self.sets {
            b.add_set(self.fam, self.name, name, *spec, false);
        }
        for (name, base) in self.chains {
            b.add_chain(self.fam, self.name, name, *base, None);
        }
        let rules = (self.rules)();
        let mut flushed: Vec<&str> = Vec::new();
        for (chain, _) in &rules {
            if !flushed.contains(chain) {
                b.flush_chain(self.fam, self.name, chain);
                flushed.push(chain);
            }
        }
        for (chain, rule) in rules {
            b.add_rule_with_comment(self.fam, self.name, chain, rule, None);
        }
    }
}

const V4: KeyType = KeyType::Ipv4Addr;
const V6: KeyType = KeyType::Ipv6Addr;
const PROTO: KeyType = KeyType::InetProto;
const PORT: KeyType = KeyType::InetService;

const fn map(key: &'static [KeyType], data: &'static [KeyType]) -> SetSpec<'static> {
    SetSpec { key, data: SetData::Value(data), timeout: true }
}

const fn set(key: &'static [KeyType]) -> SetSpec<'static> {
    SetSpec { key, data: SetData::None, timeout: true }
}

const fn vmap(key: &'static [KeyType]) -> SetSpec<'static> {
    SetSpec { key, data: SetData::Verdict, timeout: false }
}

const fn base(hook: Hook, priority: i32, kind: ChainType) -> Option<BaseChain> {
    Some(BaseChain { hook, priority, kind, policy_accept: true })
}

const OWNERS: (&str, SetSpec<'static>) = ("owners", set(&[V6, PORT]));

fn inet() -> nfnl::Rule {
    nfnl::Rule::new(TableFamily::Inet)
}

const ADDR_PROTO_PORT4: &[Field] = &[Field::IpDaddr, Field::L4proto, Field::ThDport];
const ADDR_PROTO_PORT6: &[Field] = &[Field::Ip6Daddr, Field::L4proto, Field::ThDport];
const PROTO_PORT: &[Field] = &[Field::L4proto, Field::ThDport];

pub(crate) static PORTMAP: Table = Table {
    fam: TableFamily::Inet,
    name: PORTMAP_TABLE,
    sets: &[
        ("dnat4", map(&[PROTO, PORT], &[V4, PORT])),
        ("dnat6", map(&[PROTO, PORT], &[V6, PORT])),
        ("hdnat4", map(&[V4, PROTO, PORT], &[V4, PORT])),
        ("hdnat6", map(&[V6, PROTO, PORT], &[V6, PORT])),
        ("own4", map(&[PROTO, PORT], &[V6])),
        ("own6", map(&[PROTO, PORT], &[V6])),
        ("hown4", map(&[V4, PROTO, PORT], &[V6])),
        ("hown6", map(&[V6, PROTO, PORT], &[V6])),
        ("sp4", set(&[PROTO, PORT])),
        ("hsp4", set(&[V4, PROTO, PORT])),
        ("all4", set(&[PROTO, PORT])),
        ("all6", set(&[PROTO, PORT])),
        ("hall4", set(&[V4, PROTO, PORT])),
        ("hall6", set(&[V6, PROTO, PORT])),
        ("gate4", vmap(&[PROTO, PORT])),
        ("gate6", vmap(&[PROTO, PORT])),
        ("hgate4", vmap(&[V4, PROTO, PORT])),
        ("hgate6", vmap(&[V6, PROTO, PORT])),
        OWNERS,
    ],
    chains: &[
        ("hairpin", None),
        ("dispatch", None),
        ("prerouting", base(Hook::Prerouting, -100, ChainType::Nat)),
        ("output", base(Hook::Output, -100, ChainType::Nat)),
        (LOCALNET_CHAIN, base(Hook::Input, 0, ChainType::Filter)),
        ("postrouting", base(Hook::Postrouting, 100, ChainType::Nat)),
    ],
    rules: portmap_rules,
};

fn portmap_rules() -> Vec<(&'static str, nfnl::Rule)> {
    let localhost = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mark = |r: nfnl::Rule| ("dispatch", r.mark_or(flat::MARK));
    let dispatch = |r: nfnl::Rule| ("dispatch", r);
    let jump_dispatch = || inet().fib_daddr_local().verdict(Verdict::Jump("dispatch".into()));
    let mut rules = vec![
        dispatch(inet().verdict(Verdict::Jump("hairpin".into()))),
        mark(inet().saddr(localhost).in_set(&key(ADDR_PROTO_PORT4), "hsp4")),
        mark(inet().saddr(localhost).in_set(&key(PROTO_PORT), "sp4")),
        mark(inet().in_set(&key(ADDR_PROTO_PORT4), "hall4")),
        mark(inet().in_set(&key(ADDR_PROTO_PORT6), "hall6")),
        mark(inet().meta_nfproto(Family::V4).in_set(&key(PROTO_PORT), "all4")),
        mark(inet().meta_nfproto(Family::V6).in_set(&key(PROTO_PORT), "all6")),
        dispatch(inet().vmap(ADDR_PROTO_PORT4, "hgate4")),
        dispatch(inet().vmap(ADDR_PROTO_PORT6, "hgate6")),
        dispatch(inet().meta_nfproto(Family::V4).vmap(PROTO_PORT, "gate4")),
        dispatch(inet().meta_nfproto(Family::V6).vmap(PROTO_PORT, "gate6")),
        dispatch(inet().dnat_map(ADDR_PROTO_PORT4, "hdnat4", Family::V4)),
        dispatch(inet().dnat_map(ADDR_PROTO_PORT6, "hdnat6", Family::V6)),
        dispatch(inet().meta_nfproto(Family::V4).dnat_map(PROTO_PORT, "dnat4", Family::V4)),
        dispatch(inet().meta_nfproto(Family::V6).dnat_map(PROTO_PORT, "dnat6", Family::V6)),
        ("prerouting", jump_dispatch()),
        ("output", jump_dispatch()),
        // Only connections a mapping DNATed, never other traffic a mark reached.
        ("postrouting", inet().ct_status_dnat().mark_has(flat::MARK).masquerade()),
    ];
    rules.extend(localnet_rules().into_iter().map(|r| (LOCALNET_CHAIN, r)));
    rules
}

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
fn localnet_rules() -> Vec<nfnl::Rule> {
    let Ok(loopback) = IpNetwork::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 0)), 8) else { return Vec::new() };
    let from_elsewhere = || inet().daddr_in(loopback).saddr_not_in(loopback);
    vec![
        from_elsewhere().ct_state_any(nfnl::CT_INVALID | nfnl::CT_UNTRACKED).verdict(Verdict::Drop),
        from_elsewhere()
            .ct_state_none(nfnl::CT_ESTABLISHED | nfnl::CT_RELATED)
            .ct_status_not_dnat()
            .verdict(Verdict::Drop),
    ]
}

/// Whether the drop of packets to 127.0.0.0/8 from elsewhere is in place (its base chain with
/// its two rules): one listing of a two-rule chain.
fn localnet_present(nl: &Conn) -> Result<bool> {
    let listed = nl.list_chain(PORTMAP.fam, PORTMAP.name, LOCALNET_CHAIN)?;
    Ok(listed.is_some_and(|c| c.base && c.comments.len() == 2))
}

/// Makes sure the portmap table drops packets that reach the node's loopback from elsewhere
/// before portmap turns `route_localnet` on: when the chain is missing or changed, the table's
/// setup is sent again (which refills the fixed chains and adds nothing of any attachment).
fn ensure_localnet_drop(nl: &Conn, what: &str) -> Result<()> {
    if localnet_present(nl)? {
        return Ok(());
    }
    let mut b = Batch::new();
    PORTMAP.setup(&mut b);
    let table = PORTMAP.full_name();
    nl.send(&b).map_err(|e| {
        e.context(format_args!("{what}: add the drop of packets to 127.0.0.0/8 from elsewhere to table {table}"))
    })
}

pub(crate) static MASQ: Table = Table {
    fam: TableFamily::Inet,
    name: MASQ_TABLE,
    sets: &[("pods4", map(&[V4], &[V6])), ("pods6", map(&[V6], &[V6])), OWNERS],
    chains: &[("local", None), ("postrouting", base(Hook::Postrouting, 100, ChainType::Nat))],
    rules: masq_rules,
};

fn masq_rules() -> Vec<(&'static str, nfnl::Rule)> {
    let multicast4 = IpNetwork::new(IpAddr::V4(Ipv4Addr::new(224, 0, 0, 0)), 4);
    let multicast6 = IpNetwork::new(IpAddr::V6(Ipv6Addr::new(0xff00, 0, 0, 0, 0, 0, 0, 0)), 8);
    let mut rules = vec![("postrouting", inet().verdict(Verdict::Jump("local".into())))];
    for (field, set, multicast) in [(Field::IpSaddr, "pods4", multicast4), (Field::Ip6Saddr, "pods6", multicast6)] {
        if let Ok(mc) = multicast {
            rules.push(("postrouting", inet().in_set(&key(&[field]), set).daddr_not_in(mc).masquerade()));
        }
    }
    rules
}

/// MAC spoof check (bridge `macspoofchk`): frames from a pod's bridge port must carry the pod's
/// MAC. nftables only, as in the reference.
pub(crate) static MACSPOOF: Table = Table {
    fam: TableFamily::Bridge,
    name: MACSPOOF_TABLE,
    sets: &[
        ("port_owner", map(&[KeyType::Ifname], &[V6])),
        ("macs", set(&[KeyType::Ifname, KeyType::EtherAddr])),
        OWNERS,
    ],
    chains: &[("prerouting", base(Hook::Prerouting, -300, ChainType::Filter))],
    rules: macspoof_rules,
};

fn macspoof_rules() -> Vec<(&'static str, nfnl::Rule)> {
    let rule = nfnl::Rule::new(TableFamily::Bridge)
        .in_set(&key(&[Field::Iifname]), "port_owner")
        .not_in_set(&[Field::Iifname, Field::EtherSaddr], "macs")
        .verdict(Verdict::Drop);
    vec![("prerouting", rule)]
}

/// The nftables backend (stateless; every verb talks netlink).
#[derive(Debug, Clone, Copy, Default)]
pub struct NftablesBackend;

/// The kernel has nf_tables: `/sys/module/nf_tables` exists only when it is a module, and a
/// built-in one is asked directly (one netlink round trip).
pub(crate) fn usable() -> bool {
    std::path::Path::new("/sys/module/nf_tables").exists() || nfnl::generation().is_ok()
}

impl Firewall for NftablesBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Nftables
    }

    fn add_masquerade(&self, m: &Masquerade) -> Result<()> {
        flat::add_masquerade(&Conn::new(), m, &format!("add masquerade for container {}", m.container_id))
    }

    fn del_masquerade(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        flat::del_masquerade(
            &Conn::new(),
            network,
            container_id,
            ifname,
            &format!("delete masquerade of container {container_id}"),
        )
    }

    fn check_masquerade(&self, m: &Masquerade) -> Result<()> {
        flat::check_masquerade(&Conn::new(), m, &format!("masquerade of container {}", m.container_id))
    }

    fn gc_masquerade(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        flat::gc_masquerade(&Conn::new(), network, keep, &format!("garbage-collect masquerade of network {network}"))
    }

    fn add_portmap(&self, p: &PortMap) -> Result<()> {
        let (nl, what) = (Conn::new(), format!("add port mappings for container {}", p.container_id));
        if p.localnet() {
            ensure_localnet_drop(&nl, &what)?;
        }
        flat::add_portmap(&nl, p, &what)
    }

    fn del_portmap(&self, network: &str, container_id: &str, ifname: &str) -> Result<()> {
        flat::del_portmap(
            &Conn::new(),
            network,
            container_id,
            ifname,
            &format!("delete port mappings of container {container_id}"),
        )
    }

    fn check_portmap(&self, p: &PortMap) -> Result<()> {
        let (nl, what) = (Conn::new(), format!("port mappings of container {}", p.container_id));
        if p.localnet() && !localnet_present(&nl)? {
            return Err(check_failed(format!(
                "{what}: chain {LOCALNET_CHAIN} of table {} (the drop of packets to 127.0.0.0/8 from elsewhere) is missing or changed",
                PORTMAP.full_name()
            )));
        }
        flat::check_portmap(&nl, p, &what)
    }

    fn gc_portmap(&self, network: &str, keep: &[Attachment]) -> Result<()> {
        flat::gc_portmap(&Conn::new(), network, keep, &format!("garbage-collect port mappings of network {network}"))
    }

    fn status(&self) -> Result<()> {
        if nfnl::generation().is_ok() {
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
mod tests;
