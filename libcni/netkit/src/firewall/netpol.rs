//! Kubernetes NetworkPolicy as nf_tables state: the table the node agent keeps, built and changed
//! over netlink in one transaction each time (no `nft` process).
//!
//! The agent compiles the cluster's policies into a [`Ruleset`] (which rules exist; it changes
//! when a policy does) and [`Elements`] (which addresses are in which set; they change when a pod
//! or a label does). [`replace`] swaps the whole table atomically: packets see the old table or
//! the new one, never an empty one, so a restarted agent keeps enforcing the previous state until
//! it has the new one. [`update`] adds and deletes set elements only: what a pod ADD or DEL costs,
//! whatever the number of policies.
//!
//! ```text
//! table inet cni-rs-netpol {
//!   set in-iso4 { type ipv4_addr; }          # this node's pods isolated for ingress
//!   set eg-iso4 { type ipv4_addr; }          # ... for egress        (in-iso6, eg-iso6 alike)
//!   set s4-<hash> { type ipv4_addr; }        # pods a selector picks (protected pods, peers)
//!   set n4-<hash> { type ipv4_addr . inet_proto . inet_service; }   # named port, resolved per pod
//!   chain forward {
//!     type filter hook forward priority filter; policy accept;
//!     ct state established,related accept   # replies of allowed connections
//!     meta l4proto ipv6-icmp icmpv6 type >= 133 icmpv6 type <= 137 accept   # neighbour discovery
//!     ip saddr @eg-iso4 jump egress           ip6 saddr @eg-iso6 jump egress
//!     ip daddr @in-iso4 jump ingress          ip6 daddr @in-iso6 jump ingress
//!   }
//!   chain egress {                            # source is a pod of this node isolated for egress
//!     ip saddr @s4-SEL ip daddr @s4-PEER tcp dport 80 return        comment "ns/policy egress 0"
//!     ip saddr @s4-SEL ip daddr 10.0.0.0/8 ip daddr != 10.1.0.0/16 return
//!     ip saddr @s4-SEL ip daddr . meta l4proto . th dport @n4-NAMED return
//!     counter drop
//!   }
//!   chain ingress {                           # destination is a pod of this node isolated for ingress
//!     ip daddr @s4-SEL ip saddr @s4-PEER meta l4proto tcp th dport >= 8000 th dport <= 9000 accept
//!     counter drop
//!   }
//! }
//! ```
//! A connection passes when its source's egress allows it (`return` goes on to the ingress
//! check) and its destination's ingress allows it; a pod no policy isolates is not in an `*-iso`
//! set and is not checked in that direction. Everything per pod is an element of a hash set.

use super::nfnl::{
    chain_packets, BaseChain, Batch, ChainType, CmpOp, Elem, ElemData, Expr, Field, Hook, KeyPart, KeyType,
    PayloadBase, Reg, Rule as NfRule, SetData, SetSpec, TableFamily, Verdict, CT_ESTABLISHED, CT_RELATED,
};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// This node's pods isolated for ingress / egress, IPv4 then IPv6.
pub const INGRESS_ISOLATED: [&str; 2] = ["in-iso4", "in-iso6"];
pub const EGRESS_ISOLATED: [&str; 2] = ["eg-iso4", "eg-iso6"];

/// The protocols a policy port names.
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const SCTP: u8 = 132;

/// What a set's elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetKind {
    /// Addresses of a family (`ipv4_addr` / `ipv6_addr`).
    Addr(Family),
    /// Address . protocol . port (`ipv4_addr . inet_proto . inet_service`): named ports.
    AddrPort(Family),
}

/// One element of a set of [`SetKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Element {
    Addr(IpAddr),
    AddrPort(IpAddr, u8, u16),
}

impl Element {
    fn key(&self) -> Vec<KeyPart> {
        match *self {
            Element::Addr(a) => vec![KeyPart::Addr(a)],
            Element::AddrPort(a, proto, port) => vec![KeyPart::Addr(a), KeyPart::Proto(proto), KeyPart::Port(port)],
        }
    }
    fn fits(&self, kind: SetKind) -> bool {
        match (*self, kind) {
            (Element::Addr(a), SetKind::Addr(family)) | (Element::AddrPort(a, _, _), SetKind::AddrPort(family)) => {
                Family::of(&a) == family
            }
            _ => false,
        }
    }
}

/// The other end of a connection a rule allows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    Any,
    /// An address in this set ([`SetKind::Addr`]).
    Set(String),
    /// An address in `net` and in none of `except`.
    Block {
        net: IpNetwork,
        except: Vec<IpNetwork>,
    },
}

/// The destination ports a rule allows.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ports {
    Any,
    /// Every port of a protocol.
    Protocol(u8),
    /// `first..=last` of a protocol.
    Range {
        proto: u8,
        first: u16,
        last: u16,
    },
    /// The destination address, protocol and port in this set ([`SetKind::AddrPort`]).
    Named(String),
}

/// One rule of the ingress or egress chain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rule {
    /// The family of the addresses it matches.
    pub family: Family,
    /// The protected pods (destination on ingress, source on egress): a [`SetKind::Addr`] set.
    pub selected: String,
    pub peer: Peer,
    pub ports: Ports,
    /// Which policy rule this is (`namespace/name ingress 0`), cut to what nft keeps.
    pub comment: String,
}

/// The table's structure: its sets and rules. Any change to it is a [`replace`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Every set the rules use, with what it holds (the `*-iso` sets are always there).
    pub sets: BTreeMap<String, SetKind>,
    pub ingress: Vec<Rule>,
    pub egress: Vec<Rule>,
}

/// The elements of each set, by set name.
pub type Elements = BTreeMap<String, BTreeSet<Element>>;

/// A [`Ruleset`] with the sets every table has.
pub fn empty_ruleset() -> Ruleset {
    let mut sets = BTreeMap::new();
    for (i, family) in [(0, Family::V4), (1, Family::V6)] {
        sets.insert(INGRESS_ISOLATED[i].to_string(), SetKind::Addr(family));
        sets.insert(EGRESS_ISOLATED[i].to_string(), SetKind::Addr(family));
    }
    Ruleset { sets, ingress: Vec::new(), egress: Vec::new() }
}

/// Replaces table `inet <table>` with exactly `rules` and `elements`, in one transaction.
pub fn replace(table: &str, rules: &Ruleset, elements: &Elements) -> Result<()> {
    let f = TableFamily::Inet;
    let mut b = Batch::new();
    b.add_table(f, table);
    b.delete_table(f, table);
    b.add_table(f, table);
    for (name, kind) in &rules.sets {
        b.add_set(f, table, name, spec(*kind), false);
        let elems: Vec<Elem> = elements
            .get(name)
            .into_iter()
            .flatten()
            .filter(|e| e.fits(*kind))
            .map(|e| Elem::new(e.key(), ElemData::None))
            .collect();
        if !elems.is_empty() {
            b.add_elems(f, table, name, &elems, false);
        }
    }
    let forward = BaseChain { hook: Hook::Forward, priority: 0, kind: ChainType::Filter, policy_accept: true };
    b.add_chain(f, table, "forward", Some(forward), None);
    b.add_chain(f, table, "ingress", None, None);
    b.add_chain(f, table, "egress", None, None);
    let add = |b: &mut Batch, chain: &str, rule: NfRule, comment: Option<&str>| {
        b.add_rule_with_comment(f, table, chain, rule, comment);
    };
    add(&mut b, "forward", NfRule::new(f).ct_state_any(CT_ESTABLISHED | CT_RELATED).verdict(Verdict::Accept), None);
    add(&mut b, "forward", neighbour_discovery(), Some("neighbour discovery"));
    for (i, family) in [(0, Family::V4), (1, Family::V6)] {
        let jump = |src: bool, set: &str, chain: &str| {
            NfRule::new(f).in_set(&[(Field::addr(src, family), None)], set).verdict(Verdict::Jump(chain.into()))
        };
        add(&mut b, "forward", jump(true, EGRESS_ISOLATED[i], "egress"), None);
    }
    for (i, family) in [(0, Family::V4), (1, Family::V6)] {
        let rule = NfRule::new(f).in_set(&[(Field::addr(false, family), None)], INGRESS_ISOLATED[i]);
        add(&mut b, "forward", rule.verdict(Verdict::Jump("ingress".into())), None);
    }
    for (chain, list, ingress) in [("ingress", &rules.ingress, true), ("egress", &rules.egress, false)] {
        for r in list {
            add(&mut b, chain, encode(r, ingress), Some(cut(&r.comment)));
        }
        let drop = NfRule::new(f).expr(Expr::Counter).verdict(Verdict::Drop);
        add(&mut b, chain, drop, Some(if ingress { "no policy allows it in" } else { "no policy allows it out" }));
    }
    b.send().map_err(|e| e.context(format_args!("NetworkPolicy table inet {table}")))
}

/// Deletes `delete` and adds `add` (by set), in one transaction. A deleted element must be there
/// (ENOENT otherwise, and nothing is applied): the caller deletes only what it added.
pub fn update(table: &str, delete: &Elements, add: &Elements) -> Result<()> {
    let f = TableFamily::Inet;
    let mut b = Batch::new();
    for (set, elems) in delete.iter().filter(|(_, e)| !e.is_empty()) {
        let keys: Vec<Vec<KeyPart>> = elems.iter().map(Element::key).collect();
        b.delete_elements(f, table, set, &keys);
    }
    for (set, elems) in add.iter().filter(|(_, e)| !e.is_empty()) {
        let elems: Vec<Elem> = elems.iter().map(|e| Elem::new(e.key(), ElemData::None)).collect();
        b.add_elems(f, table, set, &elems, false);
    }
    b.send().map_err(|e| e.context(format_args!("NetworkPolicy table inet {table}")))
}

/// The packets the table has dropped since it was made: (ingress, egress); zeros without it.
pub fn dropped(table: &str) -> Result<(u64, u64)> {
    let count = |chain| chain_packets(TableFamily::Inet, table, chain).map(Option::unwrap_or_default);
    Ok((count("ingress")?, count("egress")?))
}

/// Deletes table `inet <table>` if it exists.
pub fn remove(table: &str) -> Result<()> {
    let mut b = Batch::new();
    b.add_table(TableFamily::Inet, table);
    b.delete_table(TableFamily::Inet, table);
    b.send().map_err(|e| e.context(format_args!("remove NetworkPolicy table inet {table}")))
}

fn spec(kind: SetKind) -> SetSpec<'static> {
    let key: &'static [KeyType] = match kind {
        SetKind::Addr(Family::V4) => &[KeyType::Ipv4Addr],
        SetKind::Addr(Family::V6) => &[KeyType::Ipv6Addr],
        SetKind::AddrPort(Family::V4) => &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService],
        SetKind::AddrPort(Family::V6) => &[KeyType::Ipv6Addr, KeyType::InetProto, KeyType::InetService],
    };
    SetSpec { key, data: SetData::None, timeout: false }
}

/// `meta l4proto ipv6-icmp icmpv6 type >= 133 icmpv6 type <= 137 accept`: router and neighbour
/// solicitations, advertisements and redirects. Bridged between two pods they cross this hook
/// too, and without them no IPv6 packet, allowed or not, reaches a pod on the same bridge.
fn neighbour_discovery() -> NfRule {
    let mut r = NfRule::new(TableFamily::Inet);
    r.cmp(Field::L4proto, CmpOp::Eq, vec![58]);
    let icmp_type = Expr::Payload { base: PayloadBase::Transport, offset: 0, len: 1, dreg: Reg::R1 };
    r.expr(icmp_type.clone())
        .expr(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Gte, data: vec![133] })
        .expr(icmp_type)
        .expr(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Lte, data: vec![137] })
        .verdict(Verdict::Accept)
}

/// A policy rule in nf_tables: the protected pod, the peer, the ports, then `accept` (ingress)
/// or `return` (egress, so the destination's ingress is checked next).
fn encode(r: &Rule, ingress: bool) -> NfRule {
    // Ingress protects the destination and names the source as peer; egress the other way.
    let (own_is_src, peer_is_src) = (!ingress, ingress);
    let mut rule = NfRule::new(TableFamily::Inet)
        .meta_nfproto(r.family)
        .in_set(&[(Field::addr(own_is_src, r.family), None)], &r.selected);
    match &r.peer {
        Peer::Any => {}
        Peer::Set(set) => rule = rule.in_set(&[(Field::addr(peer_is_src, r.family), None)], set),
        Peer::Block { net, except } => {
            rule = rule.addr_prefix(peer_is_src, *net, CmpOp::Eq);
            for e in except {
                rule = rule.addr_prefix(peer_is_src, *e, CmpOp::Neq);
            }
        }
    }
    match &r.ports {
        Ports::Any => {}
        Ports::Protocol(p) => rule.cmp(Field::L4proto, CmpOp::Eq, vec![*p]),
        Ports::Range { proto, first, last } => {
            rule.cmp(Field::L4proto, CmpOp::Eq, vec![*proto]);
            if first == last {
                rule.cmp(Field::ThDport, CmpOp::Eq, first.to_be_bytes().to_vec());
            } else {
                rule.cmp(Field::ThDport, CmpOp::Gte, first.to_be_bytes().to_vec());
                rule.cmp(Field::ThDport, CmpOp::Lte, last.to_be_bytes().to_vec());
            }
        }
        Ports::Named(set) => {
            let key = [(Field::addr(false, r.family), None), (Field::L4proto, None), (Field::ThDport, None)];
            rule = rule.in_set(&key, set);
        }
    }
    rule.verdict(if ingress { Verdict::Accept } else { Verdict::Return })
}

/// A comment nft can hold (at most 253 bytes, cut at a character boundary).
fn cut(s: &str) -> &str {
    let mut end = s.len().min(253);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
