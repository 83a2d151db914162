//! What an attachment holds in the nftables tables (drawn in [`super`]): elements of shared
//! hash sets and maps, and for port mappings with conditions one chain of its own.
//!
//! Why elements: a transaction that adds a jump or a NAT rule makes the kernel validate the
//! whole table, and every link event walks every chain, both growing with the pods; elements of
//! hash sets cost the same at 10 pods and at 3000 (tests/bench/nft-layout-probe.sh). And DEL
//! deletes nothing: any deletion in nf_tables is freed after an RCU grace period, and closing the
//! netlink socket waits for it (~10 ms here). DEL gives each element an expiry of 1 ms instead (an
//! element update, newer kernels, see docs/nftables-flat-layout.md): it stops matching at once and
//! the set's garbage collector frees it later, on nobody's clock. On a kernel that ignores the
//! expiry, DEL sees the owner record still there without one and deletes the elements instead.
//!
//! Hairpin and localhost traffic is masqueraded the way the reference portmap does it: marked
//! with 0x2000 (its default `markMasqBit` 13) in `dispatch` when it goes to a mapped port, and
//! masqueraded in postrouting because of the mark. A set per subnet length (created with its rule
//! by the first pod with that length: the only rules ever added after setup) lets one hash lookup
//! test "source in the pod's subnet" (hairpin) or "destination in the pod's subnet" (masquerade).
//!
//! Ownership: the first element of each item (`own` for a host port, `pods` for an address,
//! `port_owner` for a bridge port) holds the tag of the attachment. A host port another attachment
//! holds fails ADD (a conflict); an address or bridge port belongs to the newest ADD, which takes
//! it over. DEL and GC re-add the element with the expiry, which fails with EEXIST when it has
//! become another attachment's, and then leave that item alone. DEL needs only the container id:
//! the owner record (one GETSETELEM) says what the attachment holds.
//!
//! Conditions (`conditionsV4`/`V6`, free nft syntax) are the one thing elements cannot hold: such
//! a mapping is an item like any other (its host port in `own`, its marks), but instead of a
//! `dnat` element it has a `gate` element that jumps to the attachment's chain `pm-<id16>`, whose
//! rules (compiled by `nft`) match the conditions and DNAT. Its DEL deletes the elements, and then
//! the chain (a chain that elements jump to cannot be deleted).

use super::super::nfnl::{self, Batch, Conn, Elem, ElemData, ElemInfo, Field, KeyPart, SetData, SetSpec, Verdict};
use super::super::{check_failed, exec, host_port_text, sha512_hex, Masquerade, PortMap, Protocol};
use super::{Table, MACSPOOF, MASQ, PORTMAP};
use crate::Family;
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The mark that asks postrouting to masquerade (the reference's default, bit 13).
pub(crate) const MARK: u32 = 0x2000;
/// How soon DEL's elements expire.
const EXPIRE_MS: u64 = 1;
const OWNERS: &str = "owners";
/// A comment holds at most 253 bytes; the header `net=<8>;n=<3>;` takes 18.
const COMMENT_ROOM: usize = 253 - 18;

/// One thing an attachment holds in a table of this layout, and the elements that make it.
trait Item: Clone + Eq + Ord + std::fmt::Debug + Sized {
    const TABLE: &'static Table;
    /// How the owner record writes it (no `;`).
    fn text(&self) -> String;
    fn parse(s: &str) -> Option<Self>;
    /// Its elements, the one naming the owner (data: the tag) first.
    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)>;
    /// The family and subnet length of a set made on demand, from its name.
    fn on_demand(set: &str) -> Option<(Family, u8)>;
    /// Creates the sets of a family and subnet length with their rules (`create set`: EEXIST when
    /// another ADD made them, rules included, in the same transaction).
    fn make_on_demand(b: &mut Batch, family: Family, len: u8);
    /// Whether it leads to the attachment's own chain (a mapping with conditions).
    fn chained(&self) -> bool {
        false
    }
}

/// `4` or `6`: the family in a set's name.
fn fam(family: Family) -> char {
    family.pick('4', '6')
}

/// The netmask of a subnet length in `family`, as bytes.
fn mask(family: Family, len: u8) -> Vec<u8> {
    let unspecified = family.default_dst().ip();
    IpNetwork::new(unspecified, len).map_or_else(|_| vec![0; family.pick(4, 16)], |n| nfnl::ip_bytes(n.mask()))
}

/// `hp4-16` -> (V4, 16) for a set named `<prefix><4|6>-<len>`.
fn parse_on_demand(set: &str, prefixes: &[&str]) -> Option<(Family, u8)> {
    let rest = prefixes.iter().find_map(|p| set.strip_prefix(p))?;
    let (fam, len) = rest.split_once('-')?;
    let family = match fam {
        "4" => Family::V4,
        "6" => Family::V6,
        _ => return None,
    };
    let len: u8 = len.parse().ok()?;
    (len <= family.bits()).then_some((family, len))
}

fn create_plain_set(b: &mut Batch, t: &Table, name: &str, key: &[nfnl::KeyType]) {
    b.add_set(t.fam, t.name, name, SetSpec { key, data: SetData::None, timeout: true }, true);
}

/// The first 8 hex digits of sha512(network): which network an owner record belongs to.
fn network_hash(network: &str) -> String {
    sha512_hex(network)[..8].to_string()
}

/// `pm-<id16>`: the chain of an attachment's mappings with conditions.
fn chain_name(tag: Ipv6Addr) -> String {
    format!("pm-{:016x}", u128::from(tag) >> 64)
}

/// What masquerades a mapping's forwarded connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Mode {
    /// Nothing (`snat: false`).
    Plain,
    /// Every source (`masqAll`).
    All,
    /// Sources in the pod's subnet of this prefix length, and IPv4 localhost.
    Hairpin(u8),
}

/// One port mapping to one pod address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Mapping {
    pod: IpAddr,
    cport: u16,
    proto: Protocol,
    hport: u16,
    host: Option<IpAddr>,
    mode: Mode,
    /// It has conditions: a gate element leads to the attachment's chain, which DNATs.
    gated: bool,
}

impl Mapping {
    fn family(&self) -> Family {
        Family::of(&self.pod)
    }

    /// The host port it maps, as a conflict names it.
    fn describe(&self) -> String {
        host_port_text(self.host, self.proto.name(), self.hport, self.family())
    }

    fn host_key(&self) -> Vec<KeyPart> {
        let mut k: Vec<KeyPart> = self.host.map(KeyPart::Addr).into_iter().collect();
        k.push(KeyPart::Proto(nfnl::proto_number(self.proto)));
        k.push(KeyPart::Port(self.hport));
        k
    }

    /// `h` for a mapping bound to a host address: the prefix of its sets' names.
    fn h(&self) -> &'static str {
        if self.host.is_some() {
            "h"
        } else {
            ""
        }
    }
}

impl Item for Mapping {
    const TABLE: &'static Table = &PORTMAP;

    /// `pod,cport,proto,hport,host|-,n|a|<len>`, and `,c` with conditions (the record names the
    /// item; the conditions themselves are in the chain).
    fn text(&self) -> String {
        let host = self.host.map(|h| h.to_string()).unwrap_or_else(|| "-".into());
        let mode = match self.mode {
            Mode::Plain => "n".to_string(),
            Mode::All => "a".to_string(),
            Mode::Hairpin(len) => len.to_string(),
        };
        let c = if self.gated { ",c" } else { "" };
        format!("{},{},{},{},{host},{mode}{c}", self.pod, self.cport, self.proto, self.hport)
    }

    fn parse(s: &str) -> Option<Mapping> {
        let parts: Vec<&str> = s.split(',').collect();
        let (gated, parts) = match parts.as_slice() {
            [rest @ .., "c"] => (true, rest),
            all => (false, all),
        };
        let [pod, cport, proto, hport, host, mode] = parts else { return None };
        let pod: IpAddr = pod.parse().ok()?;
        let family = Family::of(&pod);
        let host = match *host {
            "-" => None,
            h => Some(h.parse::<IpAddr>().ok().filter(|h| Family::of(h) == family)?),
        };
        let mode = match *mode {
            "n" => Mode::Plain,
            "a" => Mode::All,
            len => Mode::Hairpin(len.parse().ok().filter(|l| *l <= family.bits())?),
        };
        let (cport, hport) = (cport.parse().ok()?, hport.parse().ok()?);
        Some(Mapping { pod, cport, proto: Protocol::parse(proto)?, hport, host, mode, gated })
    }

    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)> {
        let (h, f) = (self.h(), fam(self.family()));
        let key = self.host_key();
        let to = match self.gated {
            true => (format!("{h}gate{f}"), ElemData::Verdict(Verdict::Jump(chain_name(tag)))),
            false => (format!("{h}dnat{f}"), ElemData::Value(vec![KeyPart::Addr(self.pod), KeyPart::Port(self.cport)])),
        };
        let mut out = vec![
            (format!("{h}own{f}"), Elem::new(key.clone(), ElemData::Value(vec![KeyPart::Addr(IpAddr::V6(tag))]))),
            (to.0, Elem::new(key.clone(), to.1)),
        ];
        match self.mode {
            Mode::Plain => {}
            Mode::All => out.push((format!("{h}all{f}"), Elem::new(key, ElemData::None))),
            Mode::Hairpin(len) => {
                let subnet = IpNetwork::new(self.pod, len).map(|n| n.network()).unwrap_or(self.pod);
                let mut hk = vec![KeyPart::Addr(subnet)];
                hk.extend(key.iter().cloned());
                out.push((format!("{h}hp{f}-{len}"), Elem::new(hk, ElemData::None)));
                if self.family() == Family::V4 {
                    out.push((format!("{h}sp4"), Elem::new(key, ElemData::None)));
                }
            }
        }
        out
    }

    fn on_demand(set: &str) -> Option<(Family, u8)> {
        parse_on_demand(set, &["hhp", "hp"])
    }

    fn make_on_demand(b: &mut Batch, family: Family, len: u8) {
        use nfnl::KeyType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
        let f = fam(family);
        let (addr, saddr, daddr) = (family.pick(A4, A6), Field::addr(true, family), Field::addr(false, family));
        let m = mask(family, len);
        let (any, bound) = (format!("hp{f}-{len}"), format!("hhp{f}-{len}"));
        create_plain_set(b, &PORTMAP, &any, &[addr, P, S]);
        create_plain_set(b, &PORTMAP, &bound, &[addr, addr, P, S]);
        let rule = |key: Vec<(Field, Option<Vec<u8>>)>, set: &str| {
            nfnl::Rule::new(PORTMAP.fam).in_set(&key, set).mark_or(MARK)
        };
        let any_key = vec![(saddr, Some(m.clone())), (Field::L4proto, None), (Field::ThDport, None)];
        let bound_key = vec![(saddr, Some(m)), (daddr, None), (Field::L4proto, None), (Field::ThDport, None)];
        b.add_rule_with_comment(PORTMAP.fam, PORTMAP.name, "hairpin", rule(any_key, &any), None);
        b.add_rule_with_comment(PORTMAP.fam, PORTMAP.name, "hairpin", rule(bound_key, &bound), None);
    }

    fn chained(&self) -> bool {
        self.gated
    }
}

/// One address of a pod to masquerade, with its subnet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Address(IpNetwork);

impl Item for Address {
    const TABLE: &'static Table = &MASQ;

    fn text(&self) -> String {
        format!("{}/{}", self.0.ip(), self.0.prefix())
    }

    fn parse(s: &str) -> Option<Address> {
        s.parse().ok().map(Address)
    }

    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)> {
        let (ip, len, f) = (self.0.ip(), self.0.prefix(), fam(Family::of_net(&self.0)));
        vec![
            (
                format!("pods{f}"),
                Elem::new(vec![KeyPart::Addr(ip)], ElemData::Value(vec![KeyPart::Addr(IpAddr::V6(tag))])),
            ),
            (
                format!("local{f}-{len}"),
                Elem::new(vec![KeyPart::Addr(ip), KeyPart::Addr(self.0.network())], ElemData::None),
            ),
        ]
    }

    fn on_demand(set: &str) -> Option<(Family, u8)> {
        parse_on_demand(set, &["local"])
    }

    fn make_on_demand(b: &mut Batch, family: Family, len: u8) {
        let addr = family.pick(nfnl::KeyType::Ipv4Addr, nfnl::KeyType::Ipv6Addr);
        let (saddr, daddr) = (Field::addr(true, family), Field::addr(false, family));
        let set = format!("local{}-{len}", fam(family));
        create_plain_set(b, &MASQ, &set, &[addr, addr]);
        let key = vec![(saddr, None), (daddr, Some(mask(family, len)))];
        let rule = nfnl::Rule::new(MASQ.fam).in_set(&key, &set).verdict(Verdict::Accept);
        b.add_rule_with_comment(MASQ.fam, MASQ.name, "local", rule, None);
    }
}

/// A pod's bridge port and the one MAC its frames may carry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Port {
    name: String,
    mac: [u8; 6],
}

impl Port {
    fn new(name: &str, mac: &str) -> Option<Port> {
        // An interface name, and nothing an owner record uses as a separator.
        let usable = !name.is_empty()
            && name.len() <= 15
            && name.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '\\' | ';' | ','));
        Some(Port { name: usable.then(|| name.to_string())?, mac: crate::parse_mac(mac)? })
    }
}

impl Item for Port {
    const TABLE: &'static Table = &MACSPOOF;

    fn text(&self) -> String {
        format!("{},{}", self.name, crate::format_mac(&self.mac))
    }

    fn parse(s: &str) -> Option<Port> {
        let (name, mac) = s.split_once(',')?;
        Port::new(name, mac)
    }

    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)> {
        let port = KeyPart::Ifname(self.name.clone());
        vec![
            ("port_owner".into(), Elem::new(vec![port.clone()], ElemData::Value(vec![KeyPart::Addr(IpAddr::V6(tag))]))),
            ("macs".into(), Elem::new(vec![port, KeyPart::Mac(self.mac)], ElemData::None)),
        ]
    }

    fn on_demand(_: &str) -> Option<(Family, u8)> {
        None
    }

    fn make_on_demand(_: &mut Batch, _: Family, _: u8) {}
}

/// The port mappings of a pod, one per (address, host port): the first mapping of a host port
/// wins.
fn mappings(p: &PortMap) -> Vec<Mapping> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for addr in p.targets() {
        let family = Family::of_net(&addr);
        for m in p.mappings.iter().filter(|m| m.applies_to(family)) {
            let mode = match (p.snat, p.masq_all) {
                (false, _) => Mode::Plain,
                (true, true) => Mode::All,
                (true, false) => Mode::Hairpin(addr.prefix()),
            };
            let e = Mapping {
                pod: addr.ip(),
                cport: m.container_port,
                proto: m.protocol,
                hport: m.host_port,
                host: m.bound_ip(),
                mode,
                gated: !conditions(p, family).is_empty(),
            };
            if seen.insert((e.host, family, e.proto, e.hport)) {
                out.push(e);
            }
        }
    }
    out
}

/// The pod's conditions for a family, as one piece of nft text ("" when it has none).
fn conditions(p: &PortMap, family: Family) -> String {
    let c = family.pick(&p.conditions_v4, &p.conditions_v6);
    c.iter().map(|c| c.trim()).filter(|c| !c.is_empty()).collect::<Vec<_>>().join(" ")
}

/// The addresses of a pod to masquerade, each once.
fn addresses(m: &Masquerade) -> Vec<Address> {
    let mut seen = BTreeSet::new();
    m.addresses.iter().filter(|a| seen.insert(a.ip())).map(|a| Address(*a)).collect()
}

/// The attachment's tag: 128 bits of sha512(network, container id, ifname).
fn tag(network: &str, container_id: &str, ifname: &str) -> Ipv6Addr {
    let hex = sha512_hex(&format!("{network}\0{container_id}\0{ifname}"));
    let bits = u128::from_str_radix(&hex[..32], 16).unwrap_or_default();
    Ipv6Addr::from(bits)
}

fn owner_key(tag: Ipv6Addr, chunk: u16) -> Vec<KeyPart> {
    vec![KeyPart::Addr(IpAddr::V6(tag)), KeyPart::Port(chunk)]
}

/// The owner record's comments: `net=<net8>;n=<chunks>;<item>;<item>...`, each within the
/// 253 bytes a comment holds.
fn record_comments<I: Item>(net8: &str, items: &[I]) -> Vec<String> {
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    let mut room = COMMENT_ROOM;
    for e in items {
        let text = e.text();
        let need = text.len() + 1;
        if need > room {
            groups.push(Vec::new());
            room = COMMENT_ROOM;
        }
        room = room.saturating_sub(need);
        if let Some(g) = groups.last_mut() {
            g.push(text);
        }
    }
    let n = groups.len();
    groups.into_iter().map(|g| format!("net={net8};n={n};{}", g.join(";"))).collect()
}

/// What an attachment holds, read back from its owner record.
#[derive(Debug, Clone)]
struct Record<I> {
    net8: String,
    /// The comment of each chunk, in order.
    comments: Vec<String>,
    items: Vec<I>,
    /// Milliseconds until it expires (a DEL of it has just run).
    expiring: Option<u64>,
}

/// `net=<net8>;n=<count>;` and the items of one chunk's comment.
fn parse_comment<I: Item>(c: &str) -> Option<(String, u16, Vec<I>)> {
    let mut parts = c.split(';');
    let net8 = parts.next()?.strip_prefix("net=")?.to_string();
    let n: u16 = parts.next()?.strip_prefix("n=")?.parse().ok()?;
    let items = parts.filter(|s| !s.is_empty()).map(I::parse).collect::<Option<Vec<_>>>()?;
    Some((net8, n, items))
}

fn get<I: Item>(nl: &Conn, set: &str, key: &[KeyPart]) -> Result<Option<ElemInfo>> {
    Ok(nl.get_elements(I::TABLE.fam, I::TABLE.name, set, Some(key))?.into_iter().next())
}

/// The attachment's owner record, None when it has none (or an unreadable one).
fn read_record<I: Item>(nl: &Conn, tag: Ipv6Addr) -> Result<Option<Record<I>>> {
    let Some(first) = get::<I>(nl, OWNERS, &owner_key(tag, 0))? else { return Ok(None) };
    let Some(c0) = first.comment else { return Ok(None) };
    let Some((net8, n, mut items)) = parse_comment::<I>(&c0) else { return Ok(None) };
    let mut comments = vec![c0];
    for chunk in 1..n {
        let Some(c) = get::<I>(nl, OWNERS, &owner_key(tag, chunk))?.and_then(|e| e.comment) else { return Ok(None) };
        let Some((_, _, more)) = parse_comment::<I>(&c) else { return Ok(None) };
        items.extend(more);
        comments.push(c);
    }
    Ok(Some(Record { net8, comments, items, expiring: first.expires_ms }))
}

/// Waits out the expiry of an element DEL just gave one (1 ms, counted in jiffies).
fn wait_expiry(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms.min(1000) + 2));
}

/// What one message of an element batch does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Delete,
}

#[derive(Debug, Clone)]
struct Msg {
    /// The item it belongs to (its first message names the owner), None for the owner record.
    item: Option<usize>,
    set: String,
    elem: Elem,
    op: Op,
}

/// Sends element messages, with the table's setup and the on-demand sets they need made on the
/// way. `on_exists` decides about a message that failed with EEXIST: Ok(true) to send again (it
/// may have changed `msgs`), Ok(false) to fail. A message whose element or set is missing
/// (ENOENT) is dropped when it deletes or `drop_missing` (a removal), and makes the sets otherwise.
fn send<I: Item>(
    nl: &Conn,
    msgs: &mut Vec<Msg>,
    drop_missing: bool,
    what: &str,
    mut on_exists: impl FnMut(&mut Vec<Msg>, usize) -> Result<bool>,
) -> Result<()> {
    let t = I::TABLE;
    let mut setup = false;
    let mut wanted: BTreeSet<(Family, u8)> = BTreeSet::new();
    let mut made: BTreeSet<(Family, u8)> = BTreeSet::new();
    for _ in 0..msgs.len() + 6 {
        if msgs.is_empty() {
            return Ok(());
        }
        let mut b = Batch::new();
        if setup {
            t.setup(&mut b);
        }
        let mut made_by: Vec<Option<(Family, u8)>> = vec![None; b.len()];
        for &(family, len) in wanted.difference(&made) {
            let before = b.len();
            I::make_on_demand(&mut b, family, len);
            made_by.extend(std::iter::repeat_n(Some((family, len)), b.len() - before));
        }
        let offset = b.len();
        for m in msgs.iter() {
            match m.op {
                Op::Add => b.add_elems(t.fam, t.name, &m.set, std::slice::from_ref(&m.elem), false),
                Op::Delete => b.delete_elements(t.fam, t.name, &m.set, std::slice::from_ref(&m.elem.key)),
            }
        }
        let failures = nl.send_each(&b)?;
        if failures.is_empty() {
            return Ok(());
        }
        let mut changed = false;
        let mut drop = BTreeSet::new();
        let mut first_error = None;
        for f in &failures {
            if f.index < offset {
                match made_by.get(f.index).copied().flatten() {
                    // Another ADD made them: go on without.
                    Some(sets) if f.errno == libc::EEXIST => changed |= made.insert(sets),
                    _ => {
                        first_error.get_or_insert_with(|| f.error.clone());
                    }
                }
                continue;
            }
            let i = f.index - offset;
            let Some(m) = msgs.get(i) else { continue };
            match f.errno {
                libc::ENOENT if drop_missing || m.op == Op::Delete => changed |= drop.insert(i),
                libc::ENOENT => match I::on_demand(&m.set) {
                    Some(sets) if !wanted.contains(&sets) => changed |= wanted.insert(sets),
                    _ => changed |= !std::mem::replace(&mut setup, true),
                },
                libc::EEXIST => {
                    let before = msgs.len();
                    if on_exists(msgs, i)? {
                        changed = true;
                        if msgs.len() != before {
                            // The batch was reshaped: indexes of later failures no longer hold.
                            drop.clear();
                            break;
                        }
                    } else {
                        first_error.get_or_insert_with(|| f.error.clone());
                    }
                }
                _ => {
                    first_error.get_or_insert_with(|| f.error.clone());
                }
            }
        }
        for i in drop.into_iter().rev() {
            msgs.remove(i);
        }
        if !changed {
            let e = first_error.unwrap_or_else(|| failures[0].error.clone());
            return Err(e.context(what));
        }
    }
    Err(Error::network(format!("{what}: nf_tables kept refusing the batch for table {}", t.full_name())))
}

/// Whether `tag` owns `item` now (its first element names it).
fn owns<I: Item>(nl: &Conn, item: &I, tag: Ipv6Addr) -> Result<bool> {
    Ok(owner_element(nl, item, tag)?.is_some_and(|i| names(&i, tag)))
}

/// The item's first element (the one naming its owner) as the kernel has it, if it is there.
fn owner_element<I: Item>(nl: &Conn, item: &I, tag: Ipv6Addr) -> Result<Option<ElemInfo>> {
    let Some((set, elem)) = item.elems(tag).into_iter().next() else { return Ok(None) };
    get::<I>(nl, &set, &elem.key)
}

/// Whether an owner element's data is `tag`.
fn names(info: &ElemInfo, tag: Ipv6Addr) -> bool {
    info.data.as_deref() == Some(&nfnl::key_bytes(&[KeyPart::Addr(IpAddr::V6(tag))])[..])
}

/// Writes an attachment's items and owner record, replacing what it had. An item's first
/// element held by another attachment goes to `taken` (after waiting out one that is expiring):
/// Err fails the ADD, Ok takes the item over. True when the record it replaced had items with a
/// chain of their own.
fn put<I: Item>(
    nl: &Conn,
    network: &str,
    tag: Ipv6Addr,
    items: &[I],
    what: &str,
    taken: impl Fn(&I) -> Result<()>,
) -> Result<bool> {
    let mut old = read_record::<I>(nl, tag)?;
    if let Some(ms) = old.as_ref().and_then(|r| r.expiring) {
        wait_expiry(ms);
        old = None;
    }
    let had_chain = old.as_ref().is_some_and(|r| r.items.iter().any(I::chained));
    let mut msgs = Vec::new();
    if let Some(old) = &old {
        // A repeated ADD: what is no longer wanted goes, and the record is rewritten.
        let gone = old.items.iter().filter(|e| !items.contains(e));
        msgs.extend(deletions(nl, tag, gone, old.comments.len())?);
    }
    for (i, e) in items.iter().enumerate() {
        for (set, elem) in e.elems(tag) {
            msgs.push(Msg { item: Some(i), set, elem, op: Op::Add });
        }
    }
    for (chunk, c) in record_comments(&network_hash(network), items).into_iter().enumerate() {
        let mut elem = Elem::new(owner_key(tag, chunk as u16), ElemData::None);
        elem.comment = Some(c);
        msgs.push(Msg { item: None, set: OWNERS.into(), elem, op: Op::Add });
    }
    send::<I>(nl, &mut msgs, false, what, |msgs, i| {
        let m = msgs[i].clone();
        let Some(item) = m.item.and_then(|n| items.get(n)) else { return Ok(false) };
        let info = match get::<I>(nl, &m.set, &m.elem.key)? {
            // Gone since (it was expiring).
            None => return Ok(true),
            Some(info) => info,
        };
        if let Some(ms) = info.expires_ms {
            // Another attachment's, being deleted right now.
            wait_expiry(ms);
            return Ok(true);
        }
        let first = |e: &I, tag| e.elems(tag).first().map(|(s, e)| (s.clone(), e.key.clone()));
        if first(item, tag) == Some((m.set.clone(), m.elem.key.clone())) {
            taken(item)?;
            // The other attachment's other elements of the item go too (a bridge port's old MAC).
            let other = info.data.as_deref().and_then(|d| <[u8; 16]>::try_from(d).ok()).map(Ipv6Addr::from);
            if let Some((other, r)) = other.and_then(|o| read_record::<I>(nl, o).ok().flatten().map(|r| (o, r))) {
                let mine = item.elems(tag);
                for old in r.items.iter().filter(|o| first(o, other) == first(item, tag)) {
                    for (set, elem) in old.elems(other).into_iter().skip(1) {
                        if !mine.iter().any(|(s, e)| *s == set && e.key == elem.key) {
                            msgs.push(Msg { item: None, set, elem, op: Op::Delete });
                        }
                    }
                }
            }
        }
        // Ours to take: the other attachment's element goes, in the same transaction.
        msgs.insert(i, Msg { op: Op::Delete, ..m });
        Ok(true)
    })?;
    Ok(had_chain)
}

/// Gives the elements of these attachments an expiry of 1 ms: each item the attachment still
/// owns, and its owner record. On a kernel that ignores element updates, deletes them.
fn expire<I: Item>(nl: &Conn, records: &[(Ipv6Addr, Record<I>)], what: &str) -> Result<()> {
    let mut msgs = Vec::new();
    let mut n = 0;
    for (tag, r) in records {
        for e in &r.items {
            for (set, mut elem) in e.elems(*tag) {
                elem.expires_ms = Some(EXPIRE_MS);
                msgs.push(Msg { item: Some(n), set, elem, op: Op::Add });
            }
            n += 1;
        }
        for (chunk, c) in r.comments.iter().enumerate() {
            let mut elem = Elem::new(owner_key(*tag, chunk as u16), ElemData::None);
            elem.expires_ms = Some(EXPIRE_MS);
            elem.comment = Some(c.clone());
            msgs.push(Msg { item: None, set: OWNERS.into(), elem, op: Op::Add });
        }
    }
    send::<I>(nl, &mut msgs, true, what, |msgs, i| {
        match msgs[i].item {
            // The item (or a stale element of it) is another attachment's now: leave it be.
            Some(item) => msgs.retain(|m| m.item != Some(item)),
            None => {
                msgs.remove(i);
            }
        }
        Ok(true)
    })?;
    for (tag, _) in records {
        if get::<I>(nl, OWNERS, &owner_key(*tag, 0))?.is_some_and(|e| e.expires_ms.is_none()) {
            return delete(nl, records, what);
        }
    }
    Ok(())
}

/// Deletes the elements of these attachments (a kernel without element updates).
fn delete<I: Item>(nl: &Conn, records: &[(Ipv6Addr, Record<I>)], what: &str) -> Result<()> {
    let mut msgs = Vec::new();
    for (tag, r) in records {
        msgs.extend(deletions(nl, *tag, r.items.iter(), r.comments.len())?);
    }
    send::<I>(nl, &mut msgs, true, what, |_, _| Ok(false))
}

/// Messages deleting the elements of `items` that `tag` still owns, and `chunks` chunks of its
/// owner record.
fn deletions<'a, I: Item + 'a>(
    nl: &Conn,
    tag: Ipv6Addr,
    items: impl Iterator<Item = &'a I>,
    chunks: usize,
) -> Result<Vec<Msg>> {
    let mut msgs = Vec::new();
    for e in items {
        if owns(nl, e, tag)? {
            for (set, elem) in e.elems(tag) {
                msgs.push(Msg { item: None, set, elem, op: Op::Delete });
            }
        }
    }
    for chunk in 0..chunks as u16 {
        let elem = Elem::new(owner_key(tag, chunk), ElemData::None);
        msgs.push(Msg { item: None, set: OWNERS.into(), elem, op: Op::Delete });
    }
    Ok(msgs)
}

/// Removes these attachments' items: expired, or, for attachments with a chain of their own,
/// deleted and then the chain (a chain that elements lead to cannot be deleted).
fn remove<I: Item>(nl: &Conn, records: Vec<(Ipv6Addr, Record<I>)>, what: &str) -> Result<()> {
    let (chained, plain): (Vec<_>, Vec<_>) = records.into_iter().partition(|(_, r)| r.items.iter().any(I::chained));
    if !plain.is_empty() {
        expire(nl, &plain, what)?;
    }
    if !chained.is_empty() {
        delete(nl, &chained, what)?;
        for (tag, _) in &chained {
            drop_chain(nl, *tag, what)?;
        }
    }
    Ok(())
}

/// Removes an attachment's items; false when it has no record (nothing, or a DEL under way).
fn del<I: Item>(nl: &Conn, network: &str, container_id: &str, ifname: &str, what: &str) -> Result<bool> {
    let tag = tag(network, container_id, ifname);
    match read_record::<I>(nl, tag)? {
        Some(r) if r.expiring.is_none() => remove(nl, vec![(tag, r)], what).map(|()| true),
        _ => Ok(false),
    }
}

/// Deletes an attachment's chain (mappings with conditions); absent is success.
fn drop_chain(nl: &Conn, tag: Ipv6Addr, what: &str) -> Result<()> {
    let (mut b, chain) = (Batch::new(), chain_name(tag));
    b.flush_chain(PORTMAP.fam, PORTMAP.name, &chain);
    b.delete_chain(PORTMAP.fam, PORTMAP.name, &chain);
    match nl.send(&b) {
        Err(e) if !crate::is_not_found(&e) => Err(e.context(what)),
        _ => Ok(()),
    }
}

/// Writes the attachment's chain: per mapping with conditions, a rule that matches them and
/// DNATs, compiled by nft (conditions are nft text). The rules are replaced in one transaction.
fn fill_chain(p: &PortMap, tag: Ipv6Addr, gated: &[&Mapping], what: &str) -> Result<()> {
    let (t, chain) = (PORTMAP.full_name(), chain_name(tag));
    let mut text = format!("add table {t}\nadd chain {t} {chain}\nflush chain {t} {chain}\n");
    for m in gated {
        let (ip, nfproto) = m.family().pick(("ip", "ipv4"), ("ip6", "ipv6"));
        let _ = write!(text, "add rule {t} {chain} meta nfproto {nfproto} {}", conditions(p, m.family()));
        if let Some(h) = m.host {
            let _ = write!(text, " {ip} daddr {h}");
        }
        // `10.0.0.5:80`, `[fd00::5]:80`.
        let to = SocketAddr::new(m.pod, m.cport);
        let _ = writeln!(text, " {} dport {} dnat {ip} to {to}", m.proto, m.hport);
    }
    exec::run_ok("nft", &["-f", "-"], Some(&text), &format!("{what}: write chain {chain} of table {t}")).map(|_| ())
}

fn conflict(what: &str, m: &Mapping) -> Error {
    Error::network(format!("{what}: {} already mapped by another container", m.describe()))
}

/// The attachment's record lists exactly `want`, and every element is there with the data it
/// should have.
fn check<I: Item>(nl: &Conn, network: &str, container_id: &str, ifname: &str, want: &[I], what: &str) -> Result<()> {
    let tag = tag(network, container_id, ifname);
    let t = I::TABLE.full_name();
    let record = match read_record::<I>(nl, tag)? {
        Some(r) if r.expiring.is_none() => r,
        _ => return Err(check_failed(format!("{what}: no record of it in table {t}"))),
    };
    let (a, b): (BTreeSet<&I>, BTreeSet<&I>) = (record.items.iter().collect(), want.iter().collect());
    if a != b {
        return Err(check_failed(format!("{what}: table {t} records other items than the configuration's")));
    }
    for e in want {
        for (set, elem) in e.elems(tag) {
            let key = format!("of {}", e.text());
            match (get::<I>(nl, &set, &elem.key)?, &elem.data) {
                (None, _) => return Err(check_failed(format!("{what}: {set} element {key} missing from table {t}"))),
                (Some(i), _) if i.expires_ms.is_some() => {
                    return Err(check_failed(format!("{what}: {set} element {key} of table {t} is expiring")))
                }
                (Some(i), ElemData::Value(d)) if i.data.as_deref() != Some(&nfnl::key_bytes(d)[..]) => {
                    return Err(check_failed(format!(
                        "{what}: {set} element {key} of table {t} belongs to another container or leads elsewhere"
                    )))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Removes the items of every attachment of `network` not in `keep`: one dump of the owner
/// records, one batch.
fn gc<I: Item>(nl: &Conn, network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    let net8 = network_hash(network);
    let kept: BTreeSet<Ipv6Addr> = keep.iter().map(|a| tag(network, &a.container_id, &a.ifname)).collect();
    let mut by_tag: BTreeMap<Ipv6Addr, BTreeMap<u16, (String, Option<u64>)>> = BTreeMap::new();
    for e in nl.get_elements(I::TABLE.fam, I::TABLE.name, OWNERS, None)? {
        let (Some(addr), Some(port)) = (e.key.get(..16), e.key.get(16..18)) else { continue };
        let Ok(bytes) = <[u8; 16]>::try_from(addr) else { continue };
        let (tag, chunk) = (Ipv6Addr::from(bytes), u16::from_be_bytes([port[0], port[1]]));
        if let Some(c) = e.comment {
            by_tag.entry(tag).or_default().insert(chunk, (c, e.expires_ms));
        }
    }
    let mut stale = Vec::new();
    for (tag, chunks) in by_tag {
        if kept.contains(&tag) || chunks.values().any(|(_, exp)| exp.is_some()) {
            continue;
        }
        let mut record = Record { net8: String::new(), comments: Vec::new(), items: Vec::new(), expiring: None };
        for (c, _) in chunks.values() {
            let Some((n8, _, items)) = parse_comment::<I>(c) else { continue };
            record.net8 = n8;
            record.items.extend(items);
            record.comments.push(c.clone());
        }
        if record.net8 == net8 {
            stale.push((tag, record));
        }
    }
    remove(nl, stale, what)
}

/// Forwards the pod's mapped ports (replacing what the attachment had).
pub(super) fn add_portmap(nl: &Conn, p: &PortMap, what: &str) -> Result<()> {
    let items = mappings(p);
    if items.is_empty() {
        return del_portmap(nl, &p.network, &p.container_id, &p.ifname, what);
    }
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    let gated: Vec<&Mapping> = items.iter().filter(|m| m.gated).collect();
    // A port another attachment holds fails the ADD before the chain that would DNAT it is
    // written (put checks every port again, in the transaction).
    for e in &gated {
        if owner_element(nl, *e, tag)?.is_some_and(|i| i.expires_ms.is_none() && !names(&i, tag)) {
            return Err(conflict(what, e));
        }
    }
    if !gated.is_empty() {
        fill_chain(p, tag, &gated, what)?;
    }
    match put(nl, &p.network, tag, &items, what, |e: &Mapping| Err(conflict(what, e))) {
        Ok(had_chain) if had_chain && gated.is_empty() => drop_chain(nl, tag, what),
        Ok(_) => Ok(()),
        Err(e) => {
            if !gated.is_empty() && read_record::<Mapping>(nl, tag)?.is_none() {
                let _ = drop_chain(nl, tag, what);
            }
            Err(e)
        }
    }
}

/// Removes an attachment's port mappings; with no record, the chain an interrupted ADD may have
/// written.
pub(super) fn del_portmap(nl: &Conn, network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    if !del::<Mapping>(nl, network, container_id, ifname, what)? {
        drop_chain(nl, tag(network, container_id, ifname), what)?;
    }
    Ok(())
}

pub(super) fn check_portmap(nl: &Conn, p: &PortMap, what: &str) -> Result<()> {
    let items = mappings(p);
    check(nl, &p.network, &p.container_id, &p.ifname, &items, what)?;
    let gated = items.iter().filter(|m| m.gated).count();
    if gated > 0 {
        let chain = chain_name(tag(&p.network, &p.container_id, &p.ifname));
        let listed = nl.list_chain(PORTMAP.fam, PORTMAP.name, &chain)?;
        if listed.is_none_or(|c| c.comments.len() != gated) {
            return Err(check_failed(format!(
                "{what}: chain {chain} of table {} is missing or does not hold {gated} rules",
                PORTMAP.full_name()
            )));
        }
    }
    Ok(())
}

pub(super) fn gc_portmap(nl: &Conn, network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    gc::<Mapping>(nl, network, keep, what)
}

/// Masquerades the pod's traffic to outside its subnets; its addresses are its own from now on.
pub(super) fn add_masquerade(nl: &Conn, m: &Masquerade, what: &str) -> Result<()> {
    let items = addresses(m);
    if items.is_empty() {
        return del_masquerade(nl, &m.network, &m.container_id, &m.ifname, what);
    }
    let tag = tag(&m.network, &m.container_id, &m.ifname);
    put(nl, &m.network, tag, &items, what, |_: &Address| Ok(())).map(|_| ())
}

pub(super) fn del_masquerade(nl: &Conn, network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    del::<Address>(nl, network, container_id, ifname, what).map(|_| ())
}

pub(super) fn check_masquerade(nl: &Conn, m: &Masquerade, what: &str) -> Result<()> {
    check(nl, &m.network, &m.container_id, &m.ifname, &addresses(m), what)
}

pub(super) fn gc_masquerade(nl: &Conn, network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    gc::<Address>(nl, network, keep, what)
}

/// Drops frames entering the bridge from `port` (the pod's host veth) unless their source MAC is
/// `mac`; the port is this attachment's from now on.
pub fn add_macspoof(network: &str, container_id: &str, ifname: &str, port: &str, mac: &str) -> Result<()> {
    let what = &format!("add MAC spoof check for container {container_id}");
    let Some(item) = Port::new(port, mac) else {
        return Err(Error::config(format!(
            "{what}: bridge port {port:?} with MAC {mac:?}: not a usable interface name and MAC address"
        )));
    };
    put(&Conn::new(), network, tag(network, container_id, ifname), &[item], what, |_: &Port| Ok(())).map(|_| ())
}

/// Removes the spoof check of an attachment; absent is success.
pub fn del_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let what = format!("delete MAC spoof check of container {container_id}");
    del::<Port>(&Conn::new(), network, container_id, ifname, &what).map(|_| ())
}

/// Removes the spoof checks of every attachment of `network` that is not in `keep`.
pub fn gc_macspoof(network: &str, keep: &[Attachment]) -> Result<()> {
    gc::<Port>(&Conn::new(), network, keep, &format!("garbage-collect MAC spoof checks of network {network}"))
}

/// The spoof check of an attachment is in place: its record names its port and MAC (CHECK is
/// given neither), and the elements are there, its own.
pub fn check_macspoof(network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let what = &format!("MAC spoof check of container {container_id}");
    let nl = &Conn::new();
    let items = read_record::<Port>(nl, tag(network, container_id, ifname))?.map(|r| r.items).unwrap_or_default();
    if items.is_empty() {
        return Err(check_failed(format!("{what}: no record of it in table {}", MACSPOOF.full_name())));
    }
    check(nl, network, container_id, ifname, &items, what)
}

#[cfg(test)]
pub(super) mod tests;
