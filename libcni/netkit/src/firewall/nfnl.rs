//! nf_tables over netlink, in process: a [`Batch`] of typed messages sent as one transaction.
//!
//! Running `nft -f -` costs a process, libnftables and a ruleset cache fill (~3.5-5 ms) per
//! operation; this is one `sendmsg` of a netfilter batch (`NFNL_MSG_BATCH_BEGIN`, the messages,
//! `NFNL_MSG_BATCH_END`) on a `NETLINK_NETFILTER` socket and reading the kernel's answers. Every
//! message asks for an ack (`NLM_F_ACK`); the kernel applies all of them or none, and an error
//! names the message that failed in nft syntax, e.g.
//! `nft add set inet cni_rs_portmap own4 { ... }: File exists (os error 17)`, and carries the
//! OS error number as data ([`Error::os`]) for [`crate::is_exists`] and [`crate::is_not_found`].
//!
//! Messages and expressions are encoded the way nft 1.0 encodes them (the same attributes, the
//! same registers, the same dependencies), so a rule added here lists exactly like the one nft
//! adds from the text in the docs of [`Rule`]; the tests check that against `nft` for every rule
//! shape the backend uses. Objects are referred to by name (sets and chains added earlier in the
//! same batch are found by name too).

use crate::nlsock::{Answer as Ends, Exchange, Failure as NlFailure, Header, NLMSG_HDRLEN};
use ipnetwork::IpNetwork;
use libcni::{Error, Result};
use nix::sys::socket::SockProtocol;
use std::net::IpAddr;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
#[cfg(test)]
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;

// enum nf_tables_msg_types
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_GETCHAIN: u16 = 4;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_GETSETELEM: u16 = 13;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_POLICY: u16 = 5;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
/// NFTA_RULE_COMPAT { PROTO, FLAGS }: what iptables-nft adds to every rule (zeros without `-p`).
const NFTA_RULE_COMPAT: u16 = 5;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_USERDATA: u16 = 13;
/// NFTNL_UDATA_SET_KEYBYTEORDER / _DATABYTEORDER: how nft prints the keys and data of a set.
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const NFT_SET_MAP: u32 = 0x8;
const NFT_SET_TIMEOUT: u32 = 0x10;
const NFT_DATA_VERDICT: u32 = 0xffff_ff00;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_TIMEOUT: u16 = 4;
const NFTA_SET_ELEM_EXPIRATION: u16 = 5;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
/// NFTNL_UDATA_CHAIN_COMMENT / NFTNL_UDATA_RULE_COMMENT: the TLV nft keeps a comment in.
const UDATA_COMMENT: u8 = 0;
/// NFT_USERDATA_MAXLEN is 256 bytes for the whole user data (2 bytes of TLV header, a NUL).
const COMMENT_MAX: usize = 253;

const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
/// RTN_LOCAL, the route type `fib ... type local` compares with (host byte order, 4 bytes).
const RTN_LOCAL: u32 = 2;
/// IPS_DST_NAT: the conntrack status bit of `ct status dnat` (host byte order, 4 bytes).
const IPS_DST_NAT: u32 = 1 << 5;

/// `ct state` bits (NF_CT_STATE_*_BIT, host byte order): what [`Rule::ct_state_any`] and
/// [`Rule::ct_state_none`] test. A packet conntrack does not track is `untracked`, one it
/// could not make sense of `invalid`.
pub(crate) const CT_INVALID: u32 = 1;
pub(crate) const CT_ESTABLISHED: u32 = 1 << 1;
pub(crate) const CT_RELATED: u32 = 1 << 2;
pub(crate) const CT_UNTRACKED: u32 = 1 << 6;

/// Protocol numbers for [`Rule::dport`] and map keys.
pub(crate) const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;
pub(crate) const SCTP: u8 = 132;

/// The protocol number of a mapping's protocol.
pub(crate) fn proto_number(p: super::Protocol) -> u8 {
    match p {
        super::Protocol::Tcp => TCP,
        super::Protocol::Udp => UDP,
        super::Protocol::Sctp => SCTP,
    }
}

/// An nf_tables table family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Inet,
    Ip,
    Ip6,
    Bridge,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ip => NFPROTO_IPV4,
            Family::Ip6 => NFPROTO_IPV6,
            Family::Bridge => 7,
        }
    }
    /// The family as nft spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Family::Inet => "inet",
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Bridge => "bridge",
        }
    }
}

/// A netfilter hook a base chain attaches to (the value is its number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    Prerouting = 0,
    Input = 1,
    Forward = 2,
    Output = 3,
    Postrouting = 4,
}

/// A base chain's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainType {
    Filter,
    Nat,
}

impl ChainType {
    fn name(self) -> &'static str {
        match self {
            ChainType::Filter => "filter",
            ChainType::Nat => "nat",
        }
    }
}

/// What makes a chain a base chain: `{ type <kind> hook <hook> priority <priority>; policy <..>; }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub hook: Hook,
    pub priority: i32,
    pub kind: ChainType,
    /// `policy accept` when true, `policy drop` when false.
    pub policy_accept: bool,
}

/// The verdict of a rule or of a verdict-map element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Accept,
    Drop,
    Jump(String),
    Return,
}

impl Verdict {
    fn code(&self) -> i32 {
        match self {
            Verdict::Drop => 0,
            Verdict::Accept => 1,
            Verdict::Jump(_) => -3,
            Verdict::Return => -5,
        }
    }
    fn chain(&self) -> Option<&str> {
        match self {
            Verdict::Jump(c) => Some(c),
            _ => None,
        }
    }
    /// NFTA_DATA_VERDICT { CODE, CHAIN } inside an nft_data attribute.
    fn put(&self, a: &mut Attrs) {
        a.nested(NFTA_DATA_VERDICT, |a| {
            a.u32(NFTA_VERDICT_CODE, self.code() as u32);
            if let Some(chain) = self.chain() {
                a.str(NFTA_VERDICT_CHAIN, chain);
            }
        });
    }
}

/// The type of one field of a map key (nft's datatype, whose number nft stores in the set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyType {
    Ipv4Addr,
    Ipv6Addr,
    InetProto,
    InetService,
    Ifname,
    EtherAddr,
}

impl KeyType {
    fn name(self) -> &'static str {
        match self {
            KeyType::Ipv4Addr => "ipv4_addr",
            KeyType::Ipv6Addr => "ipv6_addr",
            KeyType::InetProto => "inet_proto",
            KeyType::InetService => "inet_service",
            KeyType::Ifname => "ifname",
            KeyType::EtherAddr => "ether_addr",
        }
    }
    /// nft's byte order of the type: host (1) for strings, big endian (2) for the rest.
    fn byteorder(self) -> u32 {
        match self {
            KeyType::Ifname => 1,
            _ => 2,
        }
    }
    /// nft's datatype number (TYPE_IPADDR, ...) and the field's length in bytes.
    fn id_len(self) -> (u32, u32) {
        match self {
            KeyType::Ipv4Addr => (7, 4),
            KeyType::Ipv6Addr => (8, 16),
            KeyType::InetProto => (12, 1),
            KeyType::InetService => (13, 2),
            KeyType::Ifname => (41, 16),
            KeyType::EtherAddr => (9, 6),
        }
    }
}

/// One field of a map element's key, in the order of the map's [`KeyType`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyPart {
    Addr(IpAddr),
    Proto(u8),
    Port(u16),
    Ifname(String),
    Mac([u8; 6]),
}

impl KeyPart {
    fn bytes(&self) -> Vec<u8> {
        match self {
            KeyPart::Addr(a) => ip_bytes(*a),
            KeyPart::Proto(p) => vec![*p],
            KeyPart::Port(p) => p.to_be_bytes().to_vec(),
            KeyPart::Ifname(n) => ifname_bytes(n).to_vec(),
            KeyPart::Mac(m) => m.to_vec(),
        }
    }
    fn text(&self) -> String {
        match self {
            KeyPart::Addr(a) => a.to_string(),
            KeyPart::Proto(p) => proto_name(*p),
            KeyPart::Port(p) => p.to_string(),
            KeyPart::Ifname(n) => format!("\"{n}\""),
            KeyPart::Mac(m) => crate::format_mac(m),
        }
    }
}

fn proto_name(p: u8) -> String {
    match p {
        TCP => "tcp".into(),
        UDP => "udp".into(),
        SCTP => "sctp".into(),
        other => other.to_string(),
    }
}

/// An interface name as the kernel compares it: IFNAMSIZ bytes, NUL padded.
fn ifname_bytes(name: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(name.as_bytes()) {
        *o = *b;
    }
    out
}

/// A key's bytes: the fields back to back, each padded to 32 bits when there are several (a
/// concatenation occupies whole registers).
pub(crate) fn key_bytes(key: &[KeyPart]) -> Vec<u8> {
    if key.len() == 1 {
        return key[0].bytes();
    }
    let mut out = Vec::new();
    for part in key {
        out.extend(part.bytes());
        out.resize(out.len().next_multiple_of(4), 0);
    }
    out
}

fn key_text(key: &[KeyPart]) -> String {
    key.iter().map(KeyPart::text).collect::<Vec<_>>().join(" . ")
}

/// An nf_tables register as nft writes it: the 16-byte NFT_REG_1..4 where the 32-bit slot is
/// their start, NFT_REG32_nn otherwise (the kernel reads both as the same storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reg(u32);

impl Reg {
    /// The verdict register.
    pub(crate) const VERDICT: Reg = Reg(0);
    /// NFT_REG_1 (32-bit slots 0-3).
    pub(crate) const R1: Reg = Reg::slot(0);
    /// NFT_REG_2 (32-bit slots 4-7).
    pub(crate) const R2: Reg = Reg::slot(4);

    /// The register starting at 32-bit slot `n` (0..16).
    pub(crate) const fn slot(n: u32) -> Reg {
        if n & 3 == 0 {
            Reg(1 + n / 4)
        } else {
            Reg(8 + n)
        }
    }
}

/// `meta` keys (the value is NFT_META_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetaKey {
    /// The ethertype (`meta protocol`).
    Protocol = 1,
    /// The packet mark (`meta mark`).
    Mark = 3,
    Iifname = 6,
    Oifname = 7,
    Nfproto = 15,
    L4proto = 16,
}

/// Where a payload load starts (the value is NFT_PAYLOAD_*_HEADER).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PayloadBase {
    Link = 0,
    Network = 1,
    Transport = 2,
}

/// `ct` keys (the value is NFT_CT_*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CtKey {
    State = 0,
    Status = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Neq,
}

/// One kernel expression, as nf_tables takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    /// `meta load <key> => reg`.
    Meta { key: MetaKey, dreg: Reg },
    /// `payload load <len>b @ <base> header + <offset> => reg`.
    Payload { base: PayloadBase, offset: u32, len: u32, dreg: Reg },
    /// `cmp <op> reg <data>` (the rule stops here when it does not hold).
    Cmp { sreg: Reg, op: CmpOp, data: Vec<u8> },
    /// `bitwise reg = (reg & mask) ^ xor`, over `mask.len()` bytes.
    Bitwise { sreg: Reg, dreg: Reg, mask: Vec<u8>, xor: Vec<u8> },
    /// `ct load <key> => reg`.
    Ct { key: CtKey, dreg: Reg },
    /// `fib daddr type => reg` (the route type of the destination address).
    FibDaddrType { dreg: Reg },
    /// `lookup reg set <set> [dreg reg]`: a set, or a map whose data lands in `dreg` (the verdict
    /// register for a verdict map); `invert` (`!= @set`) matches keys that are not in the set.
    Lookup { set: String, sreg: Reg, dreg: Option<Reg>, invert: bool },
    /// `meta set <key> with reg`.
    MetaSet { key: MetaKey, sreg: Reg },
    /// `immediate reg 0 <verdict>`.
    Verdict(Verdict),
    /// `nat dnat|snat ip|ip6 addr_min reg [proto_min reg]`.
    Nat { dnat: bool, v6: bool, addr: Reg, proto: Option<Reg> },
    /// `masq`.
    Masq,
    /// `counter` (starting from zero packets and bytes).
    Counter,
    /// An xtables match (iptables-nft's compat expression): its name, revision and struct.
    Match { name: &'static str, rev: u32, info: Vec<u8> },
}

impl Expr {
    fn name(&self) -> &'static str {
        match self {
            Expr::Meta { .. } | Expr::MetaSet { .. } => "meta",
            Expr::Payload { .. } => "payload",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Ct { .. } => "ct",
            Expr::FibDaddrType { .. } => "fib",
            Expr::Lookup { .. } => "lookup",
            Expr::Verdict(_) => "immediate",
            Expr::Nat { .. } => "nat",
            Expr::Masq => "masq",
            Expr::Counter => "counter",
            Expr::Match { .. } => "match",
        }
    }

    /// The expression's attributes, in the order nft (libnftnl) writes them.
    fn put(&self, a: &mut Attrs) {
        a.nested(NFTA_LIST_ELEM, |a| {
            a.str(NFTA_EXPR_NAME, self.name());
            a.nested(NFTA_EXPR_DATA, |a| self.put_data(a));
        });
    }

    fn put_data(&self, a: &mut Attrs) {
        match self {
            Expr::Meta { key, dreg } => {
                a.u32(2, *key as u32); // NFTA_META_KEY
                a.u32(1, dreg.0); // NFTA_META_DREG
            }
            Expr::Payload { base, offset, len, dreg } => {
                a.u32(1, dreg.0); // NFTA_PAYLOAD_DREG
                a.u32(2, *base as u32); // NFTA_PAYLOAD_BASE
                a.u32(3, *offset); // NFTA_PAYLOAD_OFFSET
                a.u32(4, *len); // NFTA_PAYLOAD_LEN
            }
            Expr::Cmp { sreg, op, data } => {
                a.u32(1, sreg.0); // NFTA_CMP_SREG
                a.u32(2, if *op == CmpOp::Eq { 0 } else { 1 }); // NFTA_CMP_OP
                a.nested(3, |a| a.bytes(NFTA_DATA_VALUE, data)); // NFTA_CMP_DATA
            }
            Expr::Bitwise { sreg, dreg, mask, xor } => {
                a.u32(1, sreg.0); // NFTA_BITWISE_SREG
                a.u32(2, dreg.0); // NFTA_BITWISE_DREG
                a.u32(3, mask.len() as u32); // NFTA_BITWISE_LEN
                a.nested(4, |a| a.bytes(NFTA_DATA_VALUE, mask)); // NFTA_BITWISE_MASK
                a.nested(5, |a| a.bytes(NFTA_DATA_VALUE, xor)); // NFTA_BITWISE_XOR
            }
            Expr::Ct { key, dreg } => {
                a.u32(2, *key as u32); // NFTA_CT_KEY
                a.u32(1, dreg.0); // NFTA_CT_DREG
            }
            Expr::FibDaddrType { dreg } => {
                a.u32(3, 1 << 1); // NFTA_FIB_FLAGS: NFTA_FIB_F_DADDR
                a.u32(2, 3); // NFTA_FIB_RESULT: NFT_FIB_RESULT_ADDRTYPE
                a.u32(1, dreg.0); // NFTA_FIB_DREG
            }
            Expr::MetaSet { key, sreg } => {
                a.u32(2, *key as u32); // NFTA_META_KEY
                a.u32(3, sreg.0); // NFTA_META_SREG
            }
            Expr::Lookup { set, sreg, dreg, invert } => {
                a.u32(2, sreg.0); // NFTA_LOOKUP_SREG
                if let Some(d) = dreg {
                    a.u32(3, d.0); // NFTA_LOOKUP_DREG
                }
                a.str(1, set); // NFTA_LOOKUP_SET
                if *invert {
                    a.u32(5, 1); // NFTA_LOOKUP_FLAGS: NFT_LOOKUP_F_INV
                }
            }
            Expr::Verdict(v) => {
                a.u32(1, Reg::VERDICT.0);
                a.nested(2, |a| v.put(a));
            }
            Expr::Nat { dnat, v6, addr, proto } => {
                a.u32(1, u32::from(*dnat)); // NFTA_NAT_TYPE: NFT_NAT_SNAT 0, NFT_NAT_DNAT 1
                a.u32(2, u32::from(if *v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 })); // NFTA_NAT_FAMILY
                a.u32(3, addr.0); // NFTA_NAT_REG_ADDR_MIN
                if let Some(p) = proto {
                    a.u32(5, p.0); // NFTA_NAT_REG_PROTO_MIN
                    a.u32(7, 1 << 1); // NFTA_NAT_FLAGS: NF_NAT_RANGE_PROTO_SPECIFIED
                }
            }
            Expr::Masq => {}
            Expr::Counter => {
                a.bytes(1, &[0; 8]); // NFTA_COUNTER_BYTES
                a.bytes(2, &[0; 8]); // NFTA_COUNTER_PACKETS
            }
            Expr::Match { name, rev, info } => {
                a.str(1, name); // NFTA_MATCH_NAME
                a.u32(2, *rev); // NFTA_MATCH_REV
                a.bytes(3, info); // NFTA_MATCH_INFO
            }
        }
    }
}

/// A field a rule matches on or looks a map up with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// `ip saddr` / `ip daddr` / `ip6 saddr` / `ip6 daddr`.
    IpSaddr,
    IpDaddr,
    Ip6Saddr,
    Ip6Daddr,
    /// `meta l4proto`.
    L4proto,
    /// `th dport` (2 bytes at offset 2 of the transport header: TCP, UDP and SCTP alike).
    ThDport,
    /// `iifname`.
    Iifname,
    /// `ether saddr`.
    EtherSaddr,
}

impl Field {
    fn len(self) -> u32 {
        match self {
            Field::IpSaddr | Field::IpDaddr => 4,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Iifname => 16,
            Field::L4proto => 1,
            Field::ThDport => 2,
            Field::EtherSaddr => 6,
        }
    }
    /// The network protocol the field belongs to, if any (a dependency in inet/bridge tables).
    fn nfproto(self) -> Option<u8> {
        match self {
            Field::IpSaddr | Field::IpDaddr => Some(NFPROTO_IPV4),
            Field::Ip6Saddr | Field::Ip6Daddr => Some(NFPROTO_IPV6),
            _ => None,
        }
    }
    /// Loads the first `len` bytes of the field.
    fn load_len(self, len: u32, dreg: Reg) -> Expr {
        let net = |offset| Expr::Payload { base: PayloadBase::Network, offset, len, dreg };
        match self {
            Field::IpSaddr => net(12),
            Field::IpDaddr => net(16),
            Field::Ip6Saddr => net(8),
            Field::Ip6Daddr => net(24),
            Field::L4proto => Expr::Meta { key: MetaKey::L4proto, dreg },
            Field::ThDport => Expr::Payload { base: PayloadBase::Transport, offset: 2, len, dreg },
            Field::Iifname => Expr::Meta { key: MetaKey::Iifname, dreg },
            Field::EtherSaddr => Expr::Payload { base: PayloadBase::Link, offset: 6, len, dreg },
        }
    }
    fn load(self, dreg: Reg) -> Expr {
        self.load_len(self.len(), dreg)
    }
    /// `ip saddr` (`src`) or `ip daddr`, `ip6` when `v6`.
    pub(crate) fn addr(src: bool, v6: bool) -> Field {
        match (src, v6) {
            (true, false) => Field::IpSaddr,
            (false, false) => Field::IpDaddr,
            (true, true) => Field::Ip6Saddr,
            (false, true) => Field::Ip6Daddr,
        }
    }
}

/// Builds a rule's expressions the way nft compiles the equivalent text: one match after the
/// other in register 1, with nft's implicit dependencies (`ip daddr` in an inet table first
/// matches `meta nfproto ipv4`, in a bridge table `meta protocol ip`; `tcp dport` first matches
/// `meta l4proto tcp`), each added once per rule. For example
///
/// ```text
/// Rule::new(Inet).daddr(h).dport(UDP, 5353).dnat(pod, 53)
///     == ip daddr H udp dport 5353 dnat ip to POD:53
/// Rule::new(Inet).vmap(&[Field::IpDaddr, Field::L4proto, Field::ThDport], "hostports4")
///     == ip daddr . meta l4proto . th dport vmap @hostports4
/// ```
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    family: Family,
    exprs: Vec<Expr>,
    /// The network protocol already matched (an nfproto number), if any.
    l3: Option<u8>,
}

impl Rule {
    /// An empty rule for a table of `family`.
    pub(crate) fn new(family: Family) -> Rule {
        Rule { family, exprs: Vec::new(), l3: None }
    }

    fn cmp(&mut self, field: Field, op: CmpOp, data: Vec<u8>) {
        self.exprs.push(field.load_len(data.len() as u32, Reg::R1));
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op, data });
    }

    /// The dependency of a field of a network protocol (`ip saddr`: `meta nfproto ipv4`), once.
    fn need_l3(&mut self, field: Field) {
        let Some(nfproto) = field.nfproto().filter(|p| self.l3 != Some(*p)) else { return };
        match self.family {
            Family::Inet => {
                self.exprs.push(Expr::Meta { key: MetaKey::Nfproto, dreg: Reg::R1 });
                self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: vec![nfproto] });
            }
            Family::Bridge => {
                let ethertype: u16 = if nfproto == NFPROTO_IPV6 { 0x86dd } else { 0x0800 };
                self.exprs.push(Expr::Meta { key: MetaKey::Protocol, dreg: Reg::R1 });
                self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: ethertype.to_be_bytes().to_vec() });
            }
            Family::Ip | Family::Ip6 => {}
        }
        self.l3 = Some(nfproto);
    }

    /// `meta nfproto ipv4` / `meta nfproto ipv6`.
    pub(crate) fn meta_nfproto(mut self, v6: bool) -> Rule {
        self.need_l3(Field::addr(true, v6));
        self
    }

    fn addr_cmp(mut self, src: bool, addr: IpAddr, op: CmpOp) -> Rule {
        let field = Field::addr(src, addr.is_ipv6());
        self.need_l3(field);
        self.cmp(field, op, ip_bytes(addr));
        self
    }

    /// `ip saddr A` / `ip6 saddr A`.
    pub(crate) fn saddr(self, addr: IpAddr) -> Rule {
        self.addr_cmp(true, addr, CmpOp::Eq)
    }
    /// A prefix match as nft compiles it: a whole-byte prefix loads and compares only those
    /// bytes, any other length masks the whole address first.
    fn addr_prefix(mut self, src: bool, net: IpNetwork, op: CmpOp) -> Rule {
        let field = Field::addr(src, net.is_ipv6());
        self.need_l3(field);
        let addr = ip_bytes(net.network());
        let bits = usize::from(net.prefix());
        if bits > 0 && bits & 7 == 0 {
            self.cmp(field, op, addr[..bits / 8].to_vec());
        } else {
            let mask = ip_bytes(net.mask());
            self.exprs.push(field.load(Reg::R1));
            self.exprs.push(Expr::Bitwise { sreg: Reg::R1, dreg: Reg::R1, xor: vec![0; mask.len()], mask });
            self.exprs.push(Expr::Cmp { sreg: Reg::R1, op, data: addr });
        }
        self
    }

    /// `ip saddr != 127.0.0.0/8`.
    pub(crate) fn saddr_not_in(self, net: IpNetwork) -> Rule {
        self.addr_prefix(true, net, CmpOp::Neq)
    }
    /// `ip saddr 10.244.1.0/24`.
    pub(crate) fn saddr_in(self, net: IpNetwork) -> Rule {
        self.addr_prefix(true, net, CmpOp::Eq)
    }
    /// `ip daddr 127.0.0.0/8`.
    pub(crate) fn daddr_in(self, net: IpNetwork) -> Rule {
        self.addr_prefix(false, net, CmpOp::Eq)
    }
    /// `ip daddr != 10.22.0.0/16`.
    pub(crate) fn daddr_not_in(self, net: IpNetwork) -> Rule {
        self.addr_prefix(false, net, CmpOp::Neq)
    }

    /// `ct status dnat`: the connection was destination-NATed.
    pub(crate) fn ct_status_dnat(self) -> Rule {
        self.ct_bits(CtKey::Status, IPS_DST_NAT, CmpOp::Neq)
    }

    /// `ct state & bits != 0`, which nft writes `ct state invalid,untracked` (any of the bits).
    pub(crate) fn ct_state_any(self, bits: u32) -> Rule {
        self.ct_bits(CtKey::State, bits, CmpOp::Neq)
    }

    /// `ct state & bits == 0`, which nft writes `ct state ! established,related` (none of them).
    pub(crate) fn ct_state_none(self, bits: u32) -> Rule {
        self.ct_bits(CtKey::State, bits, CmpOp::Eq)
    }

    /// `ct status ! dnat`: the connection was not destination-NATed. A packet without a
    /// conntrack entry matches neither this nor `ct status dnat`.
    pub(crate) fn ct_status_not_dnat(self) -> Rule {
        self.ct_bits(CtKey::Status, IPS_DST_NAT, CmpOp::Eq)
    }

    /// `ct <key> & bits` compared with zero.
    fn ct_bits(mut self, key: CtKey, bits: u32, op: CmpOp) -> Rule {
        self.exprs.push(Expr::Ct { key, dreg: Reg::R1 });
        let (mask, xor) = (bits.to_ne_bytes().to_vec(), vec![0; 4]);
        self.exprs.push(Expr::Bitwise { sreg: Reg::R1, dreg: Reg::R1, mask, xor });
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op, data: vec![0; 4] });
        self
    }

    /// `fib daddr type local`: the destination is an address of this host.
    pub(crate) fn fib_daddr_local(mut self) -> Rule {
        self.exprs.push(Expr::FibDaddrType { dreg: Reg::R1 });
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: RTN_LOCAL.to_ne_bytes().to_vec() });
        self
    }

    /// `a . b . c vmap @map`: the fields concatenated from register 1 on, each in whole 32-bit
    /// registers, then the lookup (its verdict is the rule's).
    pub(crate) fn vmap(mut self, key: &[Field], map: &str) -> Rule {
        self.concat(&unmasked(key));
        self.exprs.push(Expr::Lookup { set: map.to_string(), sreg: Reg::R1, dreg: Some(Reg::VERDICT), invert: false });
        self
    }

    /// `a [& mask] . b . c @set`: the rule goes on only when the key is in the set.
    pub(crate) fn in_set(mut self, key: &[(Field, Option<Vec<u8>>)], set: &str) -> Rule {
        self.concat(key);
        self.exprs.push(Expr::Lookup { set: set.to_string(), sreg: Reg::R1, dreg: None, invert: false });
        self
    }

    /// `a . b != @set`: the rule goes on only when the key is not in the set.
    pub(crate) fn not_in_set(mut self, key: &[Field], set: &str) -> Rule {
        self.concat(&unmasked(key));
        self.exprs.push(Expr::Lookup { set: set.to_string(), sreg: Reg::R1, dreg: None, invert: true });
        self
    }

    /// `dnat ip to a . b . c map @map` (`ip6` when `v6`): the map's data is the address and port
    /// to translate to (address from register 1, port right after it); no element, no match.
    pub(crate) fn dnat_map(mut self, key: &[Field], map: &str, v6: bool) -> Rule {
        self.concat(&unmasked(key));
        self.exprs.push(Expr::Lookup { set: map.to_string(), sreg: Reg::R1, dreg: Some(Reg::R1), invert: false });
        let port = if v6 { Reg::R2 } else { Reg::slot(1) };
        self.exprs.push(Expr::Nat { dnat: true, v6, addr: Reg::R1, proto: Some(port) });
        self
    }

    /// Loads the fields concatenated from register 1 on, each in whole 32-bit registers (a single
    /// field takes a whole 16-byte register, as nft allocates it), masked where a mask is given.
    fn concat(&mut self, key: &[(Field, Option<Vec<u8>>)]) {
        for (f, _) in key {
            self.need_l3(*f);
        }
        let mut slot = 0;
        for (f, mask) in key {
            let reg = if key.len() == 1 { Reg::R1 } else { Reg::slot(slot) };
            self.exprs.push(f.load(reg));
            if let Some(mask) = mask {
                let xor = vec![0; mask.len()];
                self.exprs.push(Expr::Bitwise { sreg: reg, dreg: reg, mask: mask.clone(), xor });
            }
            slot += f.len().div_ceil(4);
        }
    }

    /// `meta mark set meta mark | bit`.
    pub(crate) fn mark_or(mut self, bit: u32) -> Rule {
        self.exprs.push(Expr::Meta { key: MetaKey::Mark, dreg: Reg::R1 });
        let (mask, xor) = ((!bit).to_ne_bytes().to_vec(), bit.to_ne_bytes().to_vec());
        self.exprs.push(Expr::Bitwise { sreg: Reg::R1, dreg: Reg::R1, mask, xor });
        self.exprs.push(Expr::MetaSet { key: MetaKey::Mark, sreg: Reg::R1 });
        self
    }

    /// `meta mark & bit == bit`.
    pub(crate) fn mark_has(mut self, bit: u32) -> Rule {
        self.exprs.push(Expr::Meta { key: MetaKey::Mark, dreg: Reg::R1 });
        let (mask, xor) = (bit.to_ne_bytes().to_vec(), vec![0; 4]);
        self.exprs.push(Expr::Bitwise { sreg: Reg::R1, dreg: Reg::R1, mask, xor });
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: bit.to_ne_bytes().to_vec() });
        self
    }

    /// The rule's verdict: `accept`, `drop`, `return`, `jump C`, `goto C`.
    pub(crate) fn verdict(mut self, v: Verdict) -> Rule {
        self.exprs.push(Expr::Verdict(v));
        self
    }

    /// `masquerade`.
    pub(crate) fn masquerade(mut self) -> Rule {
        self.exprs.push(Expr::Masq);
        self
    }

    /// `ip daddr A` / `ip6 daddr A`.
    pub(crate) fn daddr(self, addr: IpAddr) -> Rule {
        self.addr_cmp(false, addr, CmpOp::Eq)
    }

    /// `iifname` (`oifname` when `out`) compared with the name and its NUL, as iptables-nft
    /// compiles `-i`/`-o` without a wildcard.
    pub(crate) fn ifname(mut self, out: bool, name: &str, op: CmpOp) -> Rule {
        let key = if out { MetaKey::Oifname } else { MetaKey::Iifname };
        self.exprs.push(Expr::Meta { key, dreg: Reg::R1 });
        let data = name.bytes().chain([0]).collect();
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op, data });
        self
    }

    /// Appends an expression as it is.
    pub(crate) fn expr(mut self, e: Expr) -> Rule {
        self.exprs.push(e);
        self
    }

    /// The NFTA_RULE_EXPRESSIONS payload, as [`ChainListing::rules`] holds a listed rule's.
    pub(crate) fn encoded(&self) -> Vec<u8> {
        let mut a = Attrs::default();
        self.exprs.iter().for_each(|e| e.put(&mut a));
        unflag(&a.buf)
    }
}

/// A lookup key of these fields, none of them masked.
pub(crate) fn unmasked(fields: &[Field]) -> Vec<(Field, Option<Vec<u8>>)> {
    fields.iter().map(|f| (*f, None)).collect()
}

pub(crate) fn ip_bytes(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Netlink attributes being written (nested ones get their length when closed).
#[derive(Default)]
struct Attrs {
    buf: Vec<u8>,
    /// An attribute came out longer than its 16-bit length field can say.
    too_long: bool,
    /// Something the message cannot carry, reported by [`Batch::send`].
    invalid: Option<String>,
}

impl Attrs {
    fn header(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        at
    }
    fn close(&mut self, at: usize) {
        let len = self.buf.len() - at;
        match u16::try_from(len) {
            Ok(l) => self.buf[at..at + 2].copy_from_slice(&l.to_ne_bytes()),
            Err(_) => self.too_long = true,
        }
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }
    fn bytes(&mut self, ty: u16, data: &[u8]) {
        let at = self.header(ty);
        self.buf.extend_from_slice(data);
        self.close(at);
    }
    fn u32(&mut self, ty: u16, v: u32) {
        self.bytes(ty, &v.to_be_bytes());
    }
    fn str(&mut self, ty: u16, s: &str) {
        let at = self.header(ty);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.close(at);
    }
    fn nested(&mut self, ty: u16, f: impl FnOnce(&mut Attrs)) {
        let at = self.header(ty | NLA_F_NESTED);
        f(self);
        self.close(at);
    }
}

/// One message of a batch.
#[derive(Debug, Clone)]
struct Msg {
    ty: u16,
    flags: u16,
    family: Family,
    attrs: Vec<u8>,
    too_long: bool,
    invalid: Option<String>,
    /// The operation in nft syntax, for errors.
    what: String,
}

/// A message of a batch the kernel refused.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The message's index in the batch.
    pub index: usize,
    pub errno: i32,
    /// What [`Batch::send`] would return for it alone.
    pub error: Error,
}

/// What a set holds besides its keys.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SetData<'a> {
    /// A plain set.
    None,
    /// A verdict map.
    Verdict,
    /// A map to values of these types.
    Value(&'a [KeyType]),
}

/// A set's types, and whether its elements can be given an expiry (`flags timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SetSpec<'a> {
    pub key: &'a [KeyType],
    pub data: SetData<'a>,
    pub timeout: bool,
}

/// The data of an element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ElemData {
    None,
    Verdict(Verdict),
    Value(Vec<KeyPart>),
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Elem {
    pub key: Vec<KeyPart>,
    pub data: ElemData,
    /// `timeout T expires T` (milliseconds): the element goes away by itself after that.
    pub expires_ms: Option<u64>,
    pub comment: Option<String>,
}

impl Elem {
    pub(crate) fn new(key: Vec<KeyPart>, data: ElemData) -> Elem {
        Elem { key, data, expires_ms: None, comment: None }
    }
}

/// An element as the kernel lists it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ElemInfo {
    /// The key's bytes (fields padded to 32 bits in a concatenation).
    pub key: Vec<u8>,
    /// The data's bytes, for a map of values.
    pub data: Option<Vec<u8>>,
    /// Milliseconds until it expires, when it has an expiry.
    pub expires_ms: Option<u64>,
    pub comment: Option<String>,
}

/// The most elements one message carries (each is ~50-60 bytes; an attribute holds 64 KiB).
const ELEMENTS_PER_MSG: usize = 256;

/// nf_tables changes applied together by [`Batch::send`]: all of them or none.
#[derive(Debug, Clone, Default)]
pub(crate) struct Batch {
    msgs: Vec<Msg>,
    /// The kernel refuses the batch with ERESTART ([`GENERATION_CHANGED`]) when the ruleset is
    /// no longer at this generation ([`generation`]): what was read is still what it changes.
    pub genid: Option<u32>,
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch::default()
    }

    /// The number of messages.
    pub(crate) fn len(&self) -> usize {
        self.msgs.len()
    }

    fn push(&mut self, ty: u16, flags: u16, family: Family, what: String, f: impl FnOnce(&mut Attrs)) {
        let mut a = Attrs::default();
        f(&mut a);
        self.msgs.push(Msg { ty, flags, family, attrs: a.buf, too_long: a.too_long, invalid: a.invalid, what });
    }

    /// `add table <family> <name>` (no error if it exists).
    pub(crate) fn add_table(&mut self, family: Family, name: &str) {
        self.push(NFT_MSG_NEWTABLE, NLM_F_CREATE, family, format!("add table {} {name}", family.name()), |a| {
            a.str(NFTA_TABLE_NAME, name);
            a.u32(NFTA_TABLE_FLAGS, 0);
        });
    }

    /// `add chain <family> <table> <name> { [type .. hook .. priority ..; policy ..;] [comment ".."] }`
    /// (no error if it exists with the same hook). A comment longer than nft allows is cut.
    pub(crate) fn add_chain(
        &mut self,
        family: Family,
        table: &str,
        name: &str,
        base: Option<BaseChain>,
        comment: Option<&str>,
    ) {
        let what = format!("add chain {} {table} {name}", family.name());
        self.push(NFT_MSG_NEWCHAIN, NLM_F_CREATE, family, what, |a| {
            a.str(NFTA_CHAIN_TABLE, table);
            a.str(NFTA_CHAIN_NAME, name);
            if let Some(b) = base {
                a.nested(NFTA_CHAIN_HOOK, |a| {
                    a.u32(NFTA_HOOK_HOOKNUM, b.hook as u32);
                    a.u32(NFTA_HOOK_PRIORITY, b.priority as u32);
                });
                a.u32(NFTA_CHAIN_POLICY, u32::from(b.policy_accept)); // NF_ACCEPT 1, NF_DROP 0
                a.str(NFTA_CHAIN_TYPE, b.kind.name());
            }
            if let Some(c) = comment {
                let mut cut = c.len().min(COMMENT_MAX);
                while !c.is_char_boundary(cut) {
                    cut -= 1;
                }
                a.bytes(NFTA_CHAIN_USERDATA, &comment_udata(&c[..cut]));
            }
        });
    }

    fn chain_msg(&mut self, ty: u16, verb: &str, family: Family, table: &str, chain: &str) {
        let what = format!("{verb} chain {} {table} {chain}", family.name());
        // DELRULE takes the chain as NFTA_RULE_CHAIN, DELCHAIN as NFTA_CHAIN_NAME.
        let chain_attr = if ty == NFT_MSG_DELRULE { NFTA_RULE_CHAIN } else { NFTA_CHAIN_NAME };
        self.push(ty, 0, family, what, |a| {
            a.str(NFTA_CHAIN_TABLE, table);
            a.str(chain_attr, chain);
        });
    }

    /// `flush chain <family> <table> <chain>`: delete all its rules (ENOENT if no such chain).
    pub(crate) fn flush_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.chain_msg(NFT_MSG_DELRULE, "flush", family, table, chain);
    }

    /// `delete chain <family> <table> <chain>` (ENOENT if absent, EBUSY if not empty or in use).
    pub(crate) fn delete_chain(&mut self, family: Family, table: &str, chain: &str) {
        self.chain_msg(NFT_MSG_DELCHAIN, "delete", family, table, chain);
    }

    /// `add set|map <family> <table> <name> { type <key> [: <data>]; [flags timeout;] }` (no
    /// error if it exists alike); `create` (EEXIST if it exists) when `excl`.
    pub(crate) fn add_set(&mut self, family: Family, table: &str, name: &str, spec: SetSpec<'_>, excl: bool) {
        let names = |types: &[KeyType]| types.iter().map(|k| k.name()).collect::<Vec<_>>().join(" . ");
        let fold = |types: &[KeyType]| types.iter().fold(0u32, |acc, k| (acc << 6) | k.id_len().0);
        let len = |types: &[KeyType]| -> u32 {
            match types {
                [one] => one.id_len().1,
                _ => types.iter().map(|k| k.id_len().1.next_multiple_of(4)).sum(),
            }
        };
        let order = |types: &[KeyType]| if let [one] = types { one.byteorder() } else { 0 };
        let (kind, data_text) = match spec.data {
            SetData::None => ("set", String::new()),
            SetData::Verdict => ("map", " : verdict".to_string()),
            SetData::Value(d) => ("map", format!(" : {}", names(d))),
        };
        let flags_text = if spec.timeout { "; flags timeout" } else { "" };
        let verb = if excl { "create" } else { "add" };
        let what = format!(
            "{verb} {kind} {} {table} {name} {{ type {}{data_text}{flags_text} }}",
            family.name(),
            names(spec.key)
        );
        let mut flags = if spec.timeout { NFT_SET_TIMEOUT } else { 0 };
        if !matches!(spec.data, SetData::None) {
            flags |= NFT_SET_MAP;
        }
        let set_id = self.msgs.len() as u32 + 1;
        let msg_flags = if excl { NLM_F_CREATE | NLM_F_EXCL } else { NLM_F_CREATE };
        self.push(NFT_MSG_NEWSET, msg_flags, family, what, |a| {
            a.str(NFTA_SET_TABLE, table);
            a.str(NFTA_SET_NAME, name);
            a.u32(NFTA_SET_FLAGS, flags);
            a.u32(NFTA_SET_KEY_TYPE, fold(spec.key));
            a.u32(NFTA_SET_KEY_LEN, len(spec.key));
            match spec.data {
                SetData::None => {}
                SetData::Verdict => {
                    a.u32(NFTA_SET_DATA_TYPE, NFT_DATA_VERDICT);
                    a.u32(NFTA_SET_DATA_LEN, 0);
                }
                SetData::Value(d) => {
                    a.u32(NFTA_SET_DATA_TYPE, fold(d));
                    a.u32(NFTA_SET_DATA_LEN, len(d));
                }
            }
            // Required by the kernel; unique within the transaction.
            a.u32(NFTA_SET_ID, set_id);
            // nft reads a key's byte order from here (an ifname key prints as "" without it); a
            // concatenation has none of its own (0), nor has a verdict.
            let mut udata = vec![UDATA_SET_KEYBYTEORDER, 4];
            udata.extend_from_slice(&order(spec.key).to_ne_bytes());
            match spec.data {
                SetData::None => {}
                SetData::Verdict => {
                    udata.extend_from_slice(&[UDATA_SET_DATABYTEORDER, 4]);
                    udata.extend_from_slice(&0u32.to_ne_bytes());
                }
                SetData::Value(d) => {
                    udata.extend_from_slice(&[UDATA_SET_DATABYTEORDER, 4]);
                    udata.extend_from_slice(&order(d).to_ne_bytes());
                }
            }
            a.bytes(NFTA_SET_USERDATA, &udata);
        });
    }

    fn elements(
        &mut self,
        ty: u16,
        flags: u16,
        verb: &str,
        (family, table, map): (Family, &str, &str),
        elems: &[Elem],
    ) {
        for chunk in elems.chunks(ELEMENTS_PER_MSG) {
            let mut keys: Vec<String> = chunk.iter().take(4).map(|e| key_text(&e.key)).collect();
            if chunk.len() > 4 {
                keys.push(format!("... ({} elements)", chunk.len()));
            }
            let what = format!("{verb} element {} {table} {map} {{ {} }}", family.name(), keys.join(", "));
            self.push(ty, flags, family, what, |a| {
                a.str(NFTA_SET_ELEM_LIST_TABLE, table);
                a.str(NFTA_SET_ELEM_LIST_SET, map);
                a.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |a| {
                    for e in chunk {
                        a.nested(NFTA_LIST_ELEM, |a| {
                            a.nested(NFTA_SET_ELEM_KEY, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(&e.key)));
                            match &e.data {
                                ElemData::None => {}
                                ElemData::Verdict(v) => a.nested(NFTA_SET_ELEM_DATA, |a| v.put(a)),
                                ElemData::Value(parts) => {
                                    a.nested(NFTA_SET_ELEM_DATA, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(parts)))
                                }
                            }
                            if let Some(ms) = e.expires_ms {
                                a.bytes(NFTA_SET_ELEM_TIMEOUT, &ms.to_be_bytes());
                                a.bytes(NFTA_SET_ELEM_EXPIRATION, &ms.to_be_bytes());
                            }
                            if let Some(c) = &e.comment {
                                if c.len() > COMMENT_MAX {
                                    a.invalid =
                                        Some(format!("element comment of {} bytes (at most {COMMENT_MAX})", c.len()));
                                }
                                a.bytes(NFTA_SET_ELEM_USERDATA, &comment_udata(c));
                            }
                        });
                    }
                });
            });
        }
    }

    /// `add element <family> <table> <set> { key [timeout T expires T] [: data] [comment ".."], ... }`:
    /// an element that exists with the same data is no error (and, with `expires_ms`, is given that
    /// expiry, on kernels with element timeout updates); one with other data is EEXIST. `create` (EEXIST if any key
    /// is there) when `excl`.
    pub(crate) fn add_elems(&mut self, family: Family, table: &str, set: &str, elems: &[Elem], excl: bool) {
        let (verb, flags) = if excl { ("create", NLM_F_CREATE | NLM_F_EXCL) } else { ("add", NLM_F_CREATE) };
        self.elements(NFT_MSG_NEWSETELEM, flags, verb, (family, table, set), elems);
    }

    /// `delete element <family> <table> <map> { key, ... }` (ENOENT if a key is absent).
    pub(crate) fn delete_elements(&mut self, family: Family, table: &str, map: &str, keys: &[Vec<KeyPart>]) {
        let elems: Vec<Elem> = keys.iter().map(|k| Elem::new(k.clone(), ElemData::None)).collect();
        self.elements(NFT_MSG_DELSETELEM, 0, "delete", (family, table, map), &elems);
    }

    /// `add rule <family> <table> <chain> ... comment "text"`. A comment the kernel cannot hold
    /// (over 253 bytes) fails the batch rather than being cut: a rule's comment may carry data.
    pub(crate) fn add_rule_with_comment(
        &mut self,
        family: Family,
        table: &str,
        chain: &str,
        rule: Rule,
        comment: Option<&str>,
    ) {
        self.rule_msg((family, table, chain), &rule, true, |a| {
            if let Some(c) = comment {
                if c.len() > COMMENT_MAX {
                    a.invalid = Some(format!("comment of {} bytes (at most {COMMENT_MAX})", c.len()));
                }
                a.bytes(NFTA_RULE_USERDATA, &comment_udata(c));
            }
        });
    }

    /// A rule as iptables-nft adds it (`-A`, or `-I <chain> 1` when not `append`): with the
    /// NFTA_RULE_COMPAT it writes (no protocol, no flags).
    pub(crate) fn add_xt_rule(&mut self, (family, table, chain): (Family, &str, &str), rule: &Rule, append: bool) {
        self.rule_msg((family, table, chain), rule, append, |a| {
            a.nested(NFTA_RULE_COMPAT, |a| {
                a.u32(1, 0); // NFTA_RULE_COMPAT_PROTO
                a.u32(2, 0); // NFTA_RULE_COMPAT_FLAGS
            })
        });
    }

    /// NFT_MSG_NEWRULE: appended, or first in the chain.
    fn rule_msg(&mut self, at: (Family, &str, &str), rule: &Rule, append: bool, tail: impl FnOnce(&mut Attrs)) {
        let (family, table, chain) = at;
        let verb = if append { "add" } else { "insert" };
        let flags = if append { NLM_F_CREATE | NLM_F_APPEND } else { NLM_F_CREATE };
        self.push(NFT_MSG_NEWRULE, flags, family, format!("{verb} rule {} {table} {chain}", family.name()), |a| {
            a.str(NFTA_RULE_TABLE, table);
            a.str(NFTA_RULE_CHAIN, chain);
            a.nested(NFTA_RULE_EXPRESSIONS, |a| rule.exprs.iter().for_each(|e| e.put(a)));
            tail(a);
        });
    }

    /// `delete rule <family> <table> <chain> handle <handle>` (ENOENT if it is gone).
    pub(crate) fn delete_rule(&mut self, (family, table, chain): (Family, &str, &str), handle: u64) {
        let what = format!("delete rule {} {table} {chain} handle {handle}", family.name());
        self.push(NFT_MSG_DELRULE, 0, family, what, |a| {
            a.str(NFTA_RULE_TABLE, table);
            a.str(NFTA_RULE_CHAIN, chain);
            a.bytes(NFTA_RULE_HANDLE, &handle.to_be_bytes());
        });
    }

    /// The batch as sent: BATCH_BEGIN (sequence `seq`), the messages (`seq + 1 + i`), BATCH_END.
    fn encode(&self, seq: u32) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let res_id = NFNL_SUBSYS_NFTABLES.to_be_bytes();
        let mut begin = Attrs::default();
        if let Some(g) = self.genid {
            begin.u32(1, g); // NFNL_BATCH_GENID
        }
        nlmsg(&mut out, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, [0, 0, res_id[0], res_id[1]], &begin.buf);
        for (i, m) in self.msgs.iter().enumerate() {
            if m.too_long || m.attrs.len() > u32::MAX as usize / 2 {
                return Err(Error::network(format!("nft {}: message too long for netlink", m.what)));
            }
            if let Some(why) = &m.invalid {
                return Err(Error::network(format!("nft {}: {why}", m.what)));
            }
            let ty = (NFNL_SUBSYS_NFTABLES << 8) | m.ty;
            let flags = NLM_F_REQUEST | NLM_F_ACK | m.flags;
            nlmsg(&mut out, ty, flags, seq.wrapping_add(1 + i as u32), [m.family.nfproto(), 0, 0, 0], &m.attrs);
        }
        let end = seq.wrapping_add(1 + self.msgs.len() as u32);
        nlmsg(&mut out, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, [0, 0, res_id[0], res_id[1]], &[]);
        Ok(out)
    }

    /// Sends the batch as one transaction and reads every answer. Ok when the kernel applied it
    /// all; otherwise nothing was applied and the error (code 100) names the first message that
    /// failed, ending with its OS error (`... : File exists (os error 17)`). An empty batch sends
    /// nothing.
    pub(crate) fn send(&self) -> Result<()> {
        let failures = self.send_each()?;
        match failures.first() {
            None => Ok(()),
            Some(first) => {
                let err = first.error.clone();
                if failures.len() > 1 {
                    let others: Vec<&str> = failures[1..].iter().map(|f| f.error.msg.as_str()).collect();
                    return Err(err.with_details(format!("also failed (nothing was applied): {}", others.join("; "))));
                }
                Err(err)
            }
        }
    }

    /// Like [`Batch::send`], but tells every message that failed (index in the batch, as
    /// [`Batch::len`] counted before adding it), first message first, so a caller can drop those
    /// and send the rest again. Ok(empty): applied. Ok(failures): nothing was applied. Err: the
    /// batch could not be sent or answered, or the commit itself failed.
    pub(crate) fn send_each(&self) -> Result<Vec<Failure>> {
        if self.msgs.is_empty() {
            return Ok(Vec::new());
        }
        let nl = open()?;
        // BATCH_BEGIN, the messages, BATCH_END.
        let first = nl.next_seqs(self.msgs.len() as u32 + 2);
        let buf = self.encode(first)?;
        nl.make_room(self.msgs.len(), buf.len());
        self.read_answers(&nl, &buf, first)
    }

    fn read_answers(&self, nl: &Exchange, batch: &[u8], first: u32) -> Result<Vec<Failure>> {
        let n = self.msgs.len();
        let mut answered = vec![false; n];
        let mut pending = n;
        // (message index, errno, kernel's message) of every failure, in the kernel's order.
        let mut failures: Vec<(usize, i32, Option<String>)> = Vec::new();
        let mut commit = None;
        nl.acks(batch, first, n as u32 + 2, |offset, outcome| {
            let refusal = match outcome {
                Err(NlFailure::Errno(errno, text)) => Some((errno, text)),
                _ => None,
            };
            let Some(idx) = (offset as usize).checked_sub(1).filter(|i| *i < n) else {
                // The batch's begin or end: the commit failed.
                commit = refusal;
                return commit.is_some();
            };
            if let Some(done) = answered.get_mut(idx).filter(|done| !**done) {
                *done = true;
                pending -= 1;
            }
            if let Some((errno, text)) = refusal {
                failures.push((idx, errno, text));
            }
            pending == 0
        })
        .map_err(|f| f.into_error(format_args!("nft transaction of {n} messages ({}, ...)", self.msgs[0].what)))?;
        if let Some((errno, text)) = commit {
            return Err(self.failed(None, errno, text));
        }
        failures.sort_by_key(|f| f.0);
        Ok(failures
            .into_iter()
            .map(|(index, errno, text)| Failure { index, errno, error: self.failed(Some(index), errno, text) })
            .collect())
    }

    fn failed(&self, idx: Option<usize>, errno: i32, text: Option<String>) -> Error {
        match idx {
            Some(i) => refused(&self.msgs[i].what, errno, text),
            None => {
                let what = format!("commit of {} messages ({}, ...)", self.msgs.len(), self.msgs[0].what);
                refused(&what, errno, text)
            }
        }
    }
}

/// One chain as the kernel lists it: whether it is a base chain, and each rule's comment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChainListing {
    pub base: bool,
    pub comments: Vec<Option<String>>,
    /// Each rule's handle and expressions ([`Rule::encoded`]'s form, counters at zero).
    pub rules: Vec<(u64, Vec<u8>)>,
}

/// Lists one chain: NFT_MSG_GETCHAIN (is it there, does it have a hook), then a dump of its
/// rules (NFT_MSG_GETRULE with the table and chain), reading each rule's comment from its user
/// data as nft writes it. None when the chain or its table does not exist. Two round trips,
/// whatever else the table holds.
pub(crate) fn list_chain(family: Family, table: &str, chain: &str) -> Result<Option<ChainListing>> {
    let what = format!("list chain {} {table} {chain}", family.name());
    let mut attrs = Attrs::default();
    attrs.str(NFTA_CHAIN_TABLE, table);
    attrs.str(NFTA_CHAIN_NAME, chain);
    let answers = get(family, NFT_MSG_GETCHAIN, false, &attrs, &what)?.unwrap_or_default();
    let Some((_, chain_attrs)) = answers.iter().find(|(ty, _)| *ty == NFT_MSG_NEWCHAIN) else { return Ok(None) };
    let base = attr_iter(chain_attrs).any(|(t, _)| t == NFTA_CHAIN_HOOK);
    let mut attrs = Attrs::default();
    attrs.str(NFTA_RULE_TABLE, table);
    attrs.str(NFTA_RULE_CHAIN, chain);
    // None: gone since it was looked up (a parallel DEL).
    let Some(rules) = get(family, NFT_MSG_GETRULE, true, &attrs, &what)? else { return Ok(None) };
    let rules: Vec<&[u8]> = rules.iter().filter(|(ty, _)| *ty == NFT_MSG_NEWRULE).map(|(_, r)| &r[..]).collect();
    let attr = |rule: &[u8], ty: u16| attr_iter(rule).find(|(t, _)| *t == ty).map(|(_, v)| v.to_vec());
    let comments = rules.iter().map(|r| attr(r, NFTA_RULE_USERDATA).and_then(|v| udata_comment(&v))).collect();
    let rules = rules
        .iter()
        .map(|r| {
            let handle = attr(r, NFTA_RULE_HANDLE).and_then(|h| h.try_into().ok()).map_or(0, u64::from_be_bytes);
            let mut exprs = Attrs::default();
            for (_, e) in attr_iter(&attr(r, NFTA_RULE_EXPRESSIONS).unwrap_or_default()) {
                match attr(e, NFTA_EXPR_NAME) {
                    Some(name) if name == b"counter\0" => Expr::Counter.put(&mut exprs),
                    _ => exprs.bytes(NFTA_LIST_ELEM | NLA_F_NESTED, e),
                }
            }
            (handle, unflag(&exprs.buf))
        })
        .collect();
    Ok(Some(ChainListing { base, comments, rules }))
}

/// ERESTART: a batch with a [`Batch::genid`] was refused because the ruleset changed.
pub(crate) const GENERATION_CHANGED: i32 = 85;

/// The ruleset's generation (NFT_MSG_GETGEN), for [`Batch::genid`]; an error also when the
/// kernel does not answer nf_tables requests.
pub(crate) fn generation() -> Result<u32> {
    let answers = get(Family::Inet, NFT_MSG_GETGEN, false, &Attrs::default(), "get generation")?.unwrap_or_default();
    let id =
        answers.iter().filter(|(ty, _)| *ty == NFT_MSG_NEWGEN).flat_map(|(_, m)| attr_iter(m)).find(|(t, _)| *t == 1);
    match id.and_then(|(_, v)| <[u8; 4]>::try_from(v).ok()) {
        Some(v) => Ok(u32::from_be_bytes(v)),
        None => Err(Error::network("nft get generation: the kernel gave none")),
    }
}

/// The elements of a set as the kernel lists them: the one with `key` (NFT_MSG_GETSETELEM for
/// that key: one round trip, whatever the set holds), or all of them (a dump) when `key` is None.
/// Empty when there is no such element, set or table (the kernel answers ENOENT to all three).
pub(crate) fn get_elements(family: Family, table: &str, set: &str, key: Option<&[KeyPart]>) -> Result<Vec<ElemInfo>> {
    let what = match key {
        Some(k) => format!("get element {} {table} {set} {{ {} }}", family.name(), key_text(k)),
        None => format!("list set {} {table} {set}", family.name()),
    };
    let mut attrs = Attrs::default();
    attrs.str(NFTA_SET_ELEM_LIST_TABLE, table);
    attrs.str(NFTA_SET_ELEM_LIST_SET, set);
    if let Some(k) = key {
        attrs.nested(NFTA_SET_ELEM_LIST_ELEMENTS, |a| {
            a.nested(NFTA_LIST_ELEM, |a| a.nested(NFTA_SET_ELEM_KEY, |a| a.bytes(NFTA_DATA_VALUE, &key_bytes(k))))
        });
    }
    let answers = get(family, NFT_MSG_GETSETELEM, key.is_none(), &attrs, &what)?.unwrap_or_default();
    Ok(answers
        .iter()
        .filter(|(ty, _)| *ty == NFT_MSG_NEWSETELEM)
        .flat_map(|(_, msg)| attr_iter(msg).filter(|(t, _)| *t == NFTA_SET_ELEM_LIST_ELEMENTS))
        .flat_map(|(_, list)| attr_iter(list).map(|(_, elem)| elem_info(elem)))
        .collect())
}

/// One nf_tables message answering a request: its type and its attributes.
type Answer = (u16, Vec<u8>);

/// Sends one GET request (a dump when `dump`) and collects the nf_tables messages that answer it
/// (type, attributes). None when the kernel answers ENOENT (no such table, chain, set or element).
fn get(family: Family, ty: u16, dump: bool, attrs: &Attrs, what: &str) -> Result<Option<Vec<Answer>>> {
    get_on(&open()?, family, ty, dump, attrs, what)
}

fn get_on(
    nl: &Exchange,
    family: Family,
    ty: u16,
    dump: bool,
    attrs: &Attrs,
    what: &str,
) -> Result<Option<Vec<Answer>>> {
    let flags = if dump { NLM_F_REQUEST | NLM_F_DUMP } else { NLM_F_REQUEST };
    let encode = |seq| {
        let mut req = Vec::new();
        nlmsg(&mut req, (NFNL_SUBSYS_NFTABLES << 8) | ty, flags, seq, [family.nfproto(), 0, 0, 0], &attrs.buf);
        req
    };
    let collect = |out: &mut Vec<Answer>, h: &Header, msg: &[u8]| {
        if h.ty >> 8 == NFNL_SUBSYS_NFTABLES {
            out.push((h.ty & 0xff, msg.get(NLMSG_HDRLEN + 4..).unwrap_or_default().to_vec()));
        }
        Ok(())
    };
    let answers = if dump {
        nl.dump(encode, collect)
    } else {
        let seq = nl.next_seqs(1);
        let mut out = Vec::new();
        nl.request(&encode(seq), seq, Ends::One, |h, m| collect(&mut out, h, m)).map(|()| out)
    };
    match answers {
        Ok(answers) => Ok(Some(answers)),
        Err(NlFailure::Errno(libc::ENOENT, _)) => Ok(None),
        Err(f) => Err(f.into_error(format_args!("nft {what}"))),
    }
}

fn elem_info(elem: &[u8]) -> ElemInfo {
    let value = |v: &[u8]| attr_iter(v).find(|(t, _)| *t == NFTA_DATA_VALUE).map(|(_, b)| b.to_vec());
    let mut info = ElemInfo::default();
    for (t, v) in attr_iter(elem) {
        match t {
            NFTA_SET_ELEM_KEY => info.key = value(v).unwrap_or_default(),
            NFTA_SET_ELEM_DATA => info.data = value(v),
            NFTA_SET_ELEM_EXPIRATION if v.len() == 8 => {
                info.expires_ms = Some(u64::from_be_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]))
            }
            NFTA_SET_ELEM_USERDATA => info.comment = udata_comment(v),
            _ => {}
        }
    }
    info
}

/// The kernel's refusal of `what` (in nft syntax), with the OS error number as data and the
/// kernel's own text (extended ack) when it gave one.
fn refused(what: &str, errno: i32, text: Option<String>) -> Error {
    let kernel = text.map(|t| format!(" ({t})")).unwrap_or_default();
    Error::os(errno, format_args!("nft {what}{kernel}"))
}

/// The (type, value) of each netlink attribute in `b`.
fn attr_iter(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            return None;
        }
        let value = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((ty, value))
    })
}

/// Attributes with NLA_F_NESTED cleared in every nest that has it (the kernel lists the nests
/// inside an expression without it, whatever it was given).
fn unflag(mut b: &[u8]) -> Vec<u8> {
    let mut out = Attrs::default();
    while b.len() >= 4 {
        let (len, ty) = (usize::from(u16::from_ne_bytes([b[0], b[1]])), u16::from_ne_bytes([b[2], b[3]]));
        let Some(value) = b.get(4..len) else { break };
        match ty & NLA_F_NESTED {
            0 => out.bytes(ty, value),
            _ => out.bytes(ty & !NLA_F_NESTED, &unflag(value)),
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    out.buf
}

/// The comment TLV of a rule's user data (NFTNL_UDATA_RULE_COMMENT), without its NUL.
fn udata_comment(mut udata: &[u8]) -> Option<String> {
    while udata.len() >= 2 {
        let (ty, len) = (udata[0], usize::from(udata[1]));
        let value = udata.get(2..2 + len)?;
        if ty == UDATA_COMMENT {
            let text = value.split(|&c| c == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        udata = &udata[2 + len..];
    }
    None
}

/// A comment as nft stores it in a chain's or rule's user data: one TLV, NUL-terminated.
fn comment_udata(text: &str) -> Vec<u8> {
    let mut udata = vec![UDATA_COMMENT, (text.len() + 1).min(255) as u8];
    udata.extend_from_slice(text.as_bytes());
    udata.push(0);
    udata
}

/// Appends one netlink message with an nfgenmsg header.
fn nlmsg(out: &mut Vec<u8>, ty: u16, flags: u16, seq: u32, nfgen: [u8; 4], attrs: &[u8]) {
    let len = (NLMSG_HDRLEN + 4 + attrs.len()) as u32;
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&ty.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&nfgen);
    out.extend_from_slice(attrs);
}

/// A NETLINK_NETFILTER socket in the calling thread's network namespace.
fn open() -> Result<Exchange> {
    Exchange::open(SockProtocol::NetlinkNetFilter)
        .map_err(|e| Error::network(format!("open a netfilter netlink socket: {e}")))
}

#[cfg(test)]
pub(crate) mod tests;
