//! Rules and their expressions: registers, the kernel's expressions as nft 1.0 writes them, the
//! [`Rule`] builder, and the messages that add and delete rules.
use super::*;

/// An nf_tables register as nft writes it: the 16-byte NFT_REG_1..4 where the 32-bit slot is
/// their start, NFT_REG32_nn otherwise (the kernel reads both as the same storage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reg(pub(super) u32);

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
    /// `>=` / `<=`: the kernel compares the register's bytes with memcmp, so big-endian data
    /// (ports, addresses) compares as numbers.
    Gte,
    Lte,
}

impl CmpOp {
    /// NFT_CMP_EQ, _NEQ, _LTE, _GTE.
    fn code(self) -> u32 {
        match self {
            CmpOp::Eq => 0,
            CmpOp::Neq => 1,
            CmpOp::Lte => 3,
            CmpOp::Gte => 5,
        }
    }
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
    Nat { dnat: bool, family: Family, addr: Reg, proto: Option<Reg> },
    /// `masq`.
    Masq,
    /// `counter` (starting from zero packets and bytes).
    Counter,
    /// An xtables match (iptables-nft's compat expression): its name, revision and struct.
    Match { name: &'static str, rev: u32, info: Vec<u8> },
    /// An xtables target (iptables-nft's compat expression for `-j MASQUERADE` and the like):
    /// its name, revision and struct (padded to XT_ALIGN, as iptables-nft sends it).
    Target { name: &'static str, rev: u32, info: Vec<u8> },
}

impl Expr {
    pub(super) fn name(&self) -> &'static str {
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
            Expr::Target { .. } => "target",
        }
    }

    /// The expression's attributes, in the order nft (libnftnl) writes them.
    pub(super) fn put(&self, a: &mut Attrs) {
        a.nested(NFTA_LIST_ELEM, |a| {
            a.str(NFTA_EXPR_NAME, self.name());
            a.nested(NFTA_EXPR_DATA, |a| self.put_data(a));
        });
    }

    pub(super) fn put_data(&self, a: &mut Attrs) {
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
                a.u32(2, op.code()); // NFTA_CMP_OP
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
            Expr::Nat { dnat, family, addr, proto } => {
                a.u32(1, u32::from(*dnat)); // NFTA_NAT_TYPE: NFT_NAT_SNAT 0, NFT_NAT_DNAT 1
                a.u32(2, u32::from(family.pick(NFPROTO_IPV4, NFPROTO_IPV6))); // NFTA_NAT_FAMILY
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
            Expr::Target { name, rev, info } => {
                a.str(1, name); // NFTA_TARGET_NAME
                a.u32(2, *rev); // NFTA_TARGET_REV
                a.bytes(3, info); // NFTA_TARGET_INFO
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
    pub(super) fn len(self) -> u32 {
        match self {
            Field::IpSaddr | Field::IpDaddr => 4,
            Field::Ip6Saddr | Field::Ip6Daddr | Field::Iifname => 16,
            Field::L4proto => 1,
            Field::ThDport => 2,
            Field::EtherSaddr => 6,
        }
    }
    /// The network protocol the field belongs to, if any (a dependency in inet/bridge tables).
    pub(super) fn nfproto(self) -> Option<u8> {
        match self {
            Field::IpSaddr | Field::IpDaddr => Some(NFPROTO_IPV4),
            Field::Ip6Saddr | Field::Ip6Daddr => Some(NFPROTO_IPV6),
            _ => None,
        }
    }
    /// Loads the first `len` bytes of the field.
    pub(super) fn load_len(self, len: u32, dreg: Reg) -> Expr {
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
    pub(super) fn load(self, dreg: Reg) -> Expr {
        self.load_len(self.len(), dreg)
    }
    /// `ip saddr` (`src`) or `ip daddr` of `family` (`ip6` for IPv6).
    pub(crate) fn addr(src: bool, family: Family) -> Field {
        match (src, family) {
            (true, Family::V4) => Field::IpSaddr,
            (false, Family::V4) => Field::IpDaddr,
            (true, Family::V6) => Field::Ip6Saddr,
            (false, Family::V6) => Field::Ip6Daddr,
        }
    }
}

/// Builds a rule's expressions the way nft compiles the equivalent text: one match after the
/// other in register 1, with nft's implicit dependencies (`ip daddr` in an inet table first
/// matches `meta nfproto ipv4`, in a bridge table `meta protocol ip`; `tcp dport` first matches
/// `meta l4proto tcp`), each added once per rule. For example
///
/// ```text
/// Rule::new(Inet).saddr_in(net).daddr_not_in(exempt).masquerade()
///     == ip saddr NET ip daddr != EXEMPT masquerade
/// Rule::new(Inet).vmap(&[Field::IpDaddr, Field::L4proto, Field::ThDport], "hostports4")
///     == ip daddr . meta l4proto . th dport vmap @hostports4
/// ```
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    family: TableFamily,
    pub(super) exprs: Vec<Expr>,
    /// The network protocol already matched (an nfproto number), if any.
    l3: Option<u8>,
}

impl Rule {
    /// An empty rule for a table of `family`.
    pub(crate) fn new(family: TableFamily) -> Rule {
        Rule { family, exprs: Vec::new(), l3: None }
    }

    pub(crate) fn cmp(&mut self, field: Field, op: CmpOp, data: Vec<u8>) {
        self.exprs.push(field.load_len(data.len() as u32, Reg::R1));
        self.exprs.push(Expr::Cmp { sreg: Reg::R1, op, data });
    }

    /// The dependency of a field of a network protocol (`ip saddr`: `meta nfproto ipv4`), once.
    pub(super) fn need_l3(&mut self, field: Field) {
        let Some(nfproto) = field.nfproto().filter(|p| self.l3 != Some(*p)) else { return };
        match self.family {
            TableFamily::Inet => {
                self.exprs.push(Expr::Meta { key: MetaKey::Nfproto, dreg: Reg::R1 });
                self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: vec![nfproto] });
            }
            TableFamily::Bridge => {
                let ethertype: u16 = if nfproto == NFPROTO_IPV6 { 0x86dd } else { 0x0800 };
                self.exprs.push(Expr::Meta { key: MetaKey::Protocol, dreg: Reg::R1 });
                self.exprs.push(Expr::Cmp { sreg: Reg::R1, op: CmpOp::Eq, data: ethertype.to_be_bytes().to_vec() });
            }
            TableFamily::Ip | TableFamily::Ip6 => {}
        }
        self.l3 = Some(nfproto);
    }

    /// `meta nfproto ipv4` / `meta nfproto ipv6`.
    pub(crate) fn meta_nfproto(mut self, family: Family) -> Rule {
        self.need_l3(Field::addr(true, family));
        self
    }

    pub(super) fn addr_cmp(mut self, src: bool, addr: IpAddr, op: CmpOp) -> Rule {
        let field = Field::addr(src, Family::of(&addr));
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
    pub(crate) fn addr_prefix(mut self, src: bool, net: IpNetwork, op: CmpOp) -> Rule {
        let field = Field::addr(src, Family::of_net(&net));
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
    pub(super) fn ct_bits(mut self, key: CtKey, bits: u32, op: CmpOp) -> Rule {
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

    /// `dnat ip to a . b . c map @map` (`ip6` for IPv6): the map's data is the address and port
    /// to translate to (address from register 1, port right after it); no element, no match.
    pub(crate) fn dnat_map(mut self, key: &[Field], map: &str, family: Family) -> Rule {
        self.concat(&unmasked(key));
        self.exprs.push(Expr::Lookup { set: map.to_string(), sreg: Reg::R1, dreg: Some(Reg::R1), invert: false });
        let port = family.pick(Reg::slot(1), Reg::R2);
        self.exprs.push(Expr::Nat { dnat: true, family, addr: Reg::R1, proto: Some(port) });
        self
    }

    /// Loads the fields concatenated from register 1 on, each in whole 32-bit registers (a single
    /// field takes a whole 16-byte register, as nft allocates it), masked where a mask is given.
    pub(super) fn concat(&mut self, key: &[(Field, Option<Vec<u8>>)]) {
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

impl Batch {
    /// `add rule <family> <table> <chain> ... comment "text"`. A comment the kernel cannot hold
    /// (over 253 bytes) fails the batch rather than being cut: a rule's comment may carry data.
    pub(crate) fn add_rule_with_comment(
        &mut self,
        family: TableFamily,
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
    pub(crate) fn add_xt_rule(&mut self, (family, table, chain): (TableFamily, &str, &str), rule: &Rule, append: bool) {
        self.rule_msg((family, table, chain), rule, append, |a| {
            a.nested(NFTA_RULE_COMPAT, |a| {
                a.u32(1, 0); // NFTA_RULE_COMPAT_PROTO
                a.u32(2, 0); // NFTA_RULE_COMPAT_FLAGS
            })
        });
    }

    /// NFT_MSG_NEWRULE: appended, or first in the chain.
    pub(super) fn rule_msg(
        &mut self,
        at: (TableFamily, &str, &str),
        rule: &Rule,
        append: bool,
        tail: impl FnOnce(&mut Attrs),
    ) {
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
    pub(crate) fn delete_rule(&mut self, (family, table, chain): (TableFamily, &str, &str), handle: u64) {
        let what = format!("delete rule {} {table} {chain} handle {handle}", family.name());
        self.push(NFT_MSG_DELRULE, 0, family, what, |a| {
            a.str(NFTA_RULE_TABLE, table);
            a.str(NFTA_RULE_CHAIN, chain);
            a.bytes(NFTA_RULE_HANDLE, &handle.to_be_bytes());
        });
    }
}

#[cfg(test)]
mod tests;
