//! Port mappings and masquerade without per-pod chains: what an attachment needs is a few
//! elements of shared hash sets and maps, and nothing of a pod is ever a chain, a rule or a jump.
//!
//! ```text
//! table inet cni_rs_portmap {
//!   map dnat4  { type inet_proto . inet_service : ipv4_addr . inet_service; flags timeout; }  any host address
//!   map hdnat4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; ... } one host address
//!   map own4 / hown4 { ... : ipv6_addr }   who holds the host port: the attachment's 128-bit tag
//!   set hp4-<len> / hhp4-<len> { ipv4_addr . [ipv4_addr .] inet_proto . inet_service }
//!                                          hairpin: the pod's subnet (masked to <len> bits) . host port
//!   set sp4 / hsp4                         IPv4 localhost may reach these host ports (snat)
//!   set all4 / hall4 (and 6)               masqAll: every source
//!   set owners { ipv6_addr . inet_service } tag . chunk, the comment listing what the attachment holds
//!   chain hairpin { ip saddr & <mask> . meta l4proto . th dport @hp4-<len> meta mark set meta mark | 0x2000
//!                   ip saddr & <mask> . ip daddr . meta l4proto . th dport @hhp4-<len> meta mark set ... }
//!   chain dispatch { ...the verdict maps of pods with conditions..., jump hairpin, the sp/all marks,
//!                    dnat ip to ip daddr . meta l4proto . th dport map @hdnat4,
//!                    meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4, (and 6) }
//!   chain postrouting { ..., meta mark & 0x2000 == 0x2000 masquerade }
//!   chain input { ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ... drop }  route_localnet's guard
//! }
//! table inet cni_rs_masq {
//!   map pods4 { type ipv4_addr : ipv6_addr; flags timeout; }     pod address -> the attachment's tag
//!   set local4-<len> { type ipv4_addr . ipv4_addr; ... }         pod address . its subnet
//!   set owners { ipv6_addr . inet_service }
//!   chain local { ip saddr . ip daddr & <mask> @local4-<len> accept }
//!   chain postrouting { ..., jump local, ip saddr @pods4 ip daddr != 224.0.0.0/4 masquerade, (and 6) }
//! }
//! ```
//!
//! Why: a transaction that adds a jump or a NAT rule makes the kernel validate the whole table,
//! and every link event walks every chain, both growing with the pods; elements of hash sets cost
//! the same at 10 pods and at 3000 (tests/bench/nft-layout-probe.sh). And DEL deletes nothing:
//! any deletion in nf_tables is freed after an RCU grace period, and closing the netlink socket
//! waits for it (~10 ms here). DEL gives each element an expiry of 1 ms instead (an element update,
//! newer kernels, see docs/nftables-flat-layout.md): it stops matching at once and the set's garbage collector frees it
//! later, on nobody's clock. On a kernel that ignores the expiry, DEL sees the owner record still
//! there without one and deletes the elements instead.
//!
//! Hairpin and localhost traffic is masqueraded the way the reference portmap does it: marked
//! with 0x2000 (its default `markMasqBit` 13) in `dispatch` when it goes to a mapped port, and
//! masqueraded in postrouting because of the mark. A set per subnet length (created with its rule
//! by the first pod with that length: the only rules ever added after setup) lets one hash lookup
//! test "source in the pod's subnet" (hairpin) or "destination in the pod's subnet" (masquerade).
//!
//! Ownership: the first element of each item (`own` for a host port, `pods` for an address) holds
//! the tag of the attachment. A host port another attachment holds fails ADD (a conflict); an
//! address belongs to the newest ADD, which takes it over. DEL and GC re-add the element with the
//! expiry, which fails with EEXIST when it has become another attachment's, and then leave that
//! item alone. DEL needs only the container id: the owner record (one GETSETELEM) says what the
//! attachment holds. Port mappings with `conditionsV4`/`conditionsV6` (free nft syntax) keep the
//! chain layout, and so do attachments added by an earlier version until their DEL.

use super::super::nfnl::{self, Batch, Elem, ElemData, ElemInfo, Family, Field, KeyPart, SetData, SetSpec};
use super::super::{check_failed, sha512_hex, Masquerade, PortMap, Protocol};
use super::{conflict, del_pod, list_chain, network_hash, to_batch, Key, Table, MASQ, PORTMAP};
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// The mark that asks postrouting to masquerade (the reference's default, bit 13).
pub(crate) const MARK: u32 = 0x2000;
/// How soon DEL's elements expire.
const EXPIRE_MS: u64 = 1;
const OWNERS: &str = "owners";
const F: Family = Family::Inet;
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
    fn on_demand(set: &str) -> Option<(bool, u8)>;
    /// Creates the sets of a subnet length with their rules (`create set`: EEXIST when another
    /// ADD made them, rules included, in the same transaction).
    fn make_on_demand(b: &mut Batch, v6: bool, len: u8);
}

fn fam(v6: bool) -> char {
    if v6 {
        '6'
    } else {
        '4'
    }
}

/// The netmask of a subnet length, as bytes.
fn mask(v6: bool, len: u8) -> Vec<u8> {
    let zero = if v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
    match IpNetwork::new(zero, len) {
        Ok(IpNetwork::V4(n)) => n.mask().octets().to_vec(),
        Ok(IpNetwork::V6(n)) => n.mask().octets().to_vec(),
        Err(_) => vec![0; if v6 { 16 } else { 4 }],
    }
}

/// `hp4-16` -> (false, 16) for a set named `<prefix><4|6>-<len>`.
fn parse_on_demand(set: &str, prefixes: &[&str]) -> Option<(bool, u8)> {
    let rest = prefixes.iter().find_map(|p| set.strip_prefix(p))?;
    let (fam, len) = rest.split_once('-')?;
    let v6 = match fam {
        "4" => false,
        "6" => true,
        _ => return None,
    };
    let len: u8 = len.parse().ok()?;
    (len <= if v6 { 128 } else { 32 }).then_some((v6, len))
}

fn create_plain_set(b: &mut Batch, t: &Table, name: &str, key: &[nfnl::KeyType]) {
    b.add_set(F, t.name, name, SetSpec { key, data: SetData::None, timeout: true }, true);
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
}

impl Mapping {
    fn v6(&self) -> bool {
        self.pod.is_ipv6()
    }

    /// The host port it maps, as the chain layout names it (conflicts, the old verdict maps).
    fn key(&self) -> Key {
        match self.host {
            Some(ip) => Key::HostPort { ip, proto: self.proto, port: self.hport },
            None => Key::AnyPort { v6: self.v6(), proto: self.proto, port: self.hport },
        }
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

    /// `pod,cport,proto,hport,host|-,n|a|<len>`.
    fn text(&self) -> String {
        let host = self.host.map(|h| h.to_string()).unwrap_or_else(|| "-".into());
        let mode = match self.mode {
            Mode::Plain => "n".to_string(),
            Mode::All => "a".to_string(),
            Mode::Hairpin(len) => len.to_string(),
        };
        format!("{},{},{},{},{host},{mode}", self.pod, self.cport, self.proto, self.hport)
    }

    fn parse(s: &str) -> Option<Mapping> {
        let parts: Vec<&str> = s.split(',').collect();
        let [pod, cport, proto, hport, host, mode] = parts.as_slice() else { return None };
        let pod: IpAddr = pod.parse().ok()?;
        let host = match *host {
            "-" => None,
            h => Some(h.parse::<IpAddr>().ok().filter(|h| h.is_ipv6() == pod.is_ipv6())?),
        };
        let max = if pod.is_ipv6() { 128 } else { 32 };
        let mode = match *mode {
            "n" => Mode::Plain,
            "a" => Mode::All,
            len => Mode::Hairpin(len.parse().ok().filter(|l| *l <= max)?),
        };
        let (cport, hport) = (cport.parse().ok()?, hport.parse().ok()?);
        Some(Mapping { pod, cport, proto: Protocol::parse(proto)?, hport, host, mode })
    }

    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)> {
        let (h, f) = (self.h(), fam(self.v6()));
        let key = self.host_key();
        let to = ElemData::Value(vec![KeyPart::Addr(self.pod), KeyPart::Port(self.cport)]);
        let mut out = vec![
            (format!("{h}own{f}"), Elem::new(key.clone(), ElemData::Value(vec![KeyPart::Addr(IpAddr::V6(tag))]))),
            (format!("{h}dnat{f}"), Elem::new(key.clone(), to)),
        ];
        match self.mode {
            Mode::Plain => {}
            Mode::All => out.push((format!("{h}all{f}"), Elem::new(key, ElemData::None))),
            Mode::Hairpin(len) => {
                let subnet = IpNetwork::new(self.pod, len).map(|n| n.network()).unwrap_or(self.pod);
                let mut hk = vec![KeyPart::Addr(subnet)];
                hk.extend(key.iter().cloned());
                out.push((format!("{h}hp{f}-{len}"), Elem::new(hk, ElemData::None)));
                if !self.v6() {
                    out.push((format!("{h}sp4"), Elem::new(key, ElemData::None)));
                }
            }
        }
        out
    }

    fn on_demand(set: &str) -> Option<(bool, u8)> {
        parse_on_demand(set, &["hhp", "hp"])
    }

    fn make_on_demand(b: &mut Batch, v6: bool, len: u8) {
        use nfnl::KeyType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
        let f = fam(v6);
        let (addr, saddr, daddr) =
            if v6 { (A6, Field::Ip6Saddr, Field::Ip6Daddr) } else { (A4, Field::IpSaddr, Field::IpDaddr) };
        let m = mask(v6, len);
        let (any, bound) = (format!("hp{f}-{len}"), format!("hhp{f}-{len}"));
        create_plain_set(b, &PORTMAP, &any, &[addr, P, S]);
        create_plain_set(b, &PORTMAP, &bound, &[addr, addr, P, S]);
        let rule =
            |key: Vec<(Field, Option<Vec<u8>>)>, set: &str| nfnl::Rule::new(F).in_set(&key, set).mark_or(MARK).build();
        let any_key = vec![(saddr, Some(m.clone())), (Field::L4proto, None), (Field::ThDport, None)];
        let bound_key = vec![(saddr, Some(m)), (daddr, None), (Field::L4proto, None), (Field::ThDport, None)];
        b.add_rule_with_comment(F, PORTMAP.name, "hairpin", rule(any_key, &any), None);
        b.add_rule_with_comment(F, PORTMAP.name, "hairpin", rule(bound_key, &bound), None);
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
        let (ip, len, f) = (self.0.ip(), self.0.prefix(), fam(self.0.is_ipv6()));
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

    fn on_demand(set: &str) -> Option<(bool, u8)> {
        parse_on_demand(set, &["local"])
    }

    fn make_on_demand(b: &mut Batch, v6: bool, len: u8) {
        let (addr, saddr, daddr) = if v6 {
            (nfnl::KeyType::Ipv6Addr, Field::Ip6Saddr, Field::Ip6Daddr)
        } else {
            (nfnl::KeyType::Ipv4Addr, Field::IpSaddr, Field::IpDaddr)
        };
        let set = format!("local{}-{len}", fam(v6));
        create_plain_set(b, &MASQ, &set, &[addr, addr]);
        let key = vec![(saddr, None), (daddr, Some(mask(v6, len)))];
        let rule = nfnl::Rule::new(F).in_set(&key, &set).verdict(nfnl::Verdict::Accept).build();
        b.add_rule_with_comment(F, MASQ.name, "local", rule, None);
    }
}

/// The port mappings of a pod, one per (address, host port): the first mapping of a host port
/// wins, as the first rule did in the chain layout.
fn mappings(p: &PortMap) -> Vec<Mapping> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for addr in p.targets() {
        let v6 = addr.is_ipv6();
        for m in p.mappings.iter().filter(|m| m.applies_to(v6)) {
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
            };
            if seen.insert(e.key()) {
                out.push(e);
            }
        }
    }
    out
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

fn get<I: Item>(set: &str, key: &[KeyPart]) -> Result<Option<ElemInfo>> {
    Ok(nfnl::get_elements(F, I::TABLE.name, set, Some(key))?.into_iter().next())
}

/// The attachment's owner record, None when it has none (or an unreadable one).
fn read_record<I: Item>(tag: Ipv6Addr) -> Result<Option<Record<I>>> {
    let Some(first) = get::<I>(OWNERS, &owner_key(tag, 0))? else { return Ok(None) };
    let Some(c0) = first.comment else { return Ok(None) };
    let Some((net8, n, mut items)) = parse_comment::<I>(&c0) else { return Ok(None) };
    let mut comments = vec![c0];
    for chunk in 1..n {
        let Some(c) = get::<I>(OWNERS, &owner_key(tag, chunk))?.and_then(|e| e.comment) else { return Ok(None) };
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
    msgs: &mut Vec<Msg>,
    drop_missing: bool,
    what: &str,
    mut on_exists: impl FnMut(&mut Vec<Msg>, usize) -> Result<bool>,
) -> Result<()> {
    let t = I::TABLE;
    let mut setup = false;
    let mut wanted: BTreeSet<(bool, u8)> = BTreeSet::new();
    let mut made: BTreeSet<(bool, u8)> = BTreeSet::new();
    for _ in 0..msgs.len() + 6 {
        if msgs.is_empty() {
            return Ok(());
        }
        let mut b = Batch::new();
        if setup {
            if let Some((s, _)) = to_batch(t, &t.setup()) {
                b.extend(s);
            }
        }
        let mut made_by: Vec<Option<(bool, u8)>> = vec![None; b.len()];
        for &(v6, len) in wanted.difference(&made) {
            let before = b.len();
            I::make_on_demand(&mut b, v6, len);
            made_by.extend(std::iter::repeat_n(Some((v6, len)), b.len() - before));
        }
        let offset = b.len();
        for m in msgs.iter() {
            match m.op {
                Op::Add => b.add_elems(F, t.name, &m.set, std::slice::from_ref(&m.elem), false),
                Op::Delete => b.delete_elements(F, t.name, &m.set, std::slice::from_ref(&m.elem.key)),
            }
        }
        let failures = b.send_each()?;
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
            return Err(Error::network(format!("{what}: {}", e.msg)));
        }
    }
    Err(Error::network(format!("{what}: nft kept failing on table {}", t.t())))
}

/// Whether `tag` owns `item` now (its first element names it).
fn owns<I: Item>(item: &I, tag: Ipv6Addr) -> Result<bool> {
    Ok(owner_element(item, tag)?.is_some_and(|i| names(&i, tag)))
}

/// The item's first element (the one naming its owner) as the kernel has it, if it is there.
fn owner_element<I: Item>(item: &I, tag: Ipv6Addr) -> Result<Option<ElemInfo>> {
    let Some((set, elem)) = item.elems(tag).into_iter().next() else { return Ok(None) };
    get::<I>(&set, &elem.key)
}

/// Whether an owner element's data is `tag`.
fn names(info: &ElemInfo, tag: Ipv6Addr) -> bool {
    info.data.as_deref() == Some(&nfnl::key_bytes(&[KeyPart::Addr(IpAddr::V6(tag))])[..])
}

/// Writes an attachment's items and owner record, replacing what it had. An item's first
/// element held by another attachment goes to `taken` (after waiting out one that is expiring):
/// Err fails the ADD, Ok takes the element over.
fn put<I: Item>(network: &str, tag: Ipv6Addr, items: &[I], what: &str, taken: impl Fn(&I) -> Result<()>) -> Result<()> {
    let mut old = read_record::<I>(tag)?;
    if let Some(ms) = old.as_ref().and_then(|r| r.expiring) {
        wait_expiry(ms);
        old = None;
    }
    let mut msgs = Vec::new();
    if let Some(old) = &old {
        // A repeated ADD: what is no longer wanted goes, and the record is rewritten.
        let gone = old.items.iter().filter(|e| !items.contains(e));
        msgs.extend(deletions(tag, gone, old.comments.len())?);
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
    send::<I>(&mut msgs, false, what, |msgs, i| {
        let m = msgs[i].clone();
        let Some(item) = m.item.and_then(|n| items.get(n)) else { return Ok(false) };
        let info = match get::<I>(&m.set, &m.elem.key)? {
            // Gone since (it was expiring).
            None => return Ok(true),
            Some(info) => info,
        };
        if let Some(ms) = info.expires_ms {
            // Another attachment's, being deleted right now.
            wait_expiry(ms);
            return Ok(true);
        }
        let first = item.elems(tag).first().map(|(s, e)| (s.clone(), e.key.clone()));
        if first == Some((m.set.clone(), m.elem.key.clone())) {
            taken(item)?;
        }
        // Ours to take: the other attachment's element goes, in the same transaction.
        msgs.insert(i, Msg { op: Op::Delete, ..m });
        Ok(true)
    })
}

/// Gives the elements of these attachments an expiry of 1 ms: each item the attachment still
/// owns, and its owner record. On a kernel that ignores element updates, deletes them.
fn expire<I: Item>(records: &[(Ipv6Addr, Record<I>)], what: &str) -> Result<()> {
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
    send::<I>(&mut msgs, true, what, |msgs, i| {
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
        if get::<I>(OWNERS, &owner_key(*tag, 0))?.is_some_and(|e| e.expires_ms.is_none()) {
            return delete(records, what);
        }
    }
    Ok(())
}

/// Deletes the elements of these attachments (a kernel without element updates).
fn delete<I: Item>(records: &[(Ipv6Addr, Record<I>)], what: &str) -> Result<()> {
    let mut msgs = Vec::new();
    for (tag, r) in records {
        msgs.extend(deletions(*tag, r.items.iter(), r.comments.len())?);
    }
    send::<I>(&mut msgs, true, what, |_, _| Ok(false))
}

/// Messages deleting the elements of `items` that `tag` still owns, and `chunks` chunks of its
/// owner record.
fn deletions<'a, I: Item + 'a>(tag: Ipv6Addr, items: impl Iterator<Item = &'a I>, chunks: usize) -> Result<Vec<Msg>> {
    let mut msgs = Vec::new();
    for e in items {
        if owns(e, tag)? {
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

/// Removes what this layout holds of an attachment; false when it holds nothing.
fn forget<I: Item>(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<bool> {
    let tag = tag(network, container_id, ifname);
    match read_record::<I>(tag)? {
        Some(r) if r.expiring.is_some() => Ok(true),
        Some(r) => expire(&[(tag, r)], what).map(|()| true),
        None => Ok(false),
    }
}

/// Removes an attachment's items, whichever layout added them; none is success.
fn del<I: Item>(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    if !forget::<I>(network, container_id, ifname, what)? {
        del_pod(I::TABLE, &I::TABLE.base(network, container_id, ifname), what)?;
    }
    Ok(())
}

/// The attachment's record lists exactly `want`, and every element is there with the data it
/// should have.
fn check<I: Item>(network: &str, container_id: &str, ifname: &str, want: &[I], what: &str) -> Result<()> {
    let tag = tag(network, container_id, ifname);
    let t = I::TABLE.t();
    let record = match read_record::<I>(tag)? {
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
            match (get::<I>(&set, &elem.key)?, &elem.data) {
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

/// Expires the records (and items) of every attachment of `network` not in `keep`: one dump of
/// the owner records, one batch.
fn gc<I: Item>(network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    let net8 = network_hash(network);
    let kept: BTreeSet<Ipv6Addr> = keep.iter().map(|a| tag(network, &a.container_id, &a.ifname)).collect();
    let mut by_tag: BTreeMap<Ipv6Addr, BTreeMap<u16, (String, Option<u64>)>> = BTreeMap::new();
    for e in nfnl::get_elements(F, I::TABLE.name, OWNERS, None)? {
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
    if stale.is_empty() {
        return Ok(());
    }
    expire(&stale, what)
}

/// Forwards the pod's mapped ports (replacing what the attachment had).
pub(super) fn add_portmap(p: &PortMap, what: &str) -> Result<()> {
    let items = mappings(p);
    if items.is_empty() {
        return del_portmap(&p.network, &p.container_id, &p.ifname, what);
    }
    // The chain layout's remains of this attachment (an earlier version, or conditions).
    let base = PORTMAP.base(&p.network, &p.container_id, &p.ifname);
    if list_chain(&PORTMAP, &format!("{base}-dnat"))?.is_some() {
        del_pod(&PORTMAP, &base, what)?;
    }
    // A port held in the chain layout (a pod with conditions, or from an earlier version).
    for e in &items {
        let k = e.key();
        if !nfnl::get_elements(F, PORTMAP.name, &k.map(), Some(&k.parts()))?.is_empty() {
            return Err(conflict(what, &[k]));
        }
    }
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    put(&p.network, tag, &items, what, |e: &Mapping| Err(conflict(what, &[e.key()])))
}

pub(super) fn del_portmap(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    del::<Mapping>(network, container_id, ifname, what)
}

/// Removes what this layout holds of an attachment (before an ADD in the chain layout).
pub(super) fn forget_portmap(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    forget::<Mapping>(network, container_id, ifname, what).map(|_| ())
}

/// A host port of `p` that another attachment holds in this layout (for an ADD in the chain layout).
pub(super) fn held(p: &PortMap) -> Result<Option<Key>> {
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    for e in mappings(p) {
        // One read: held (not expiring) by an attachment other than this one.
        if owner_element(&e, tag)?.is_some_and(|i| i.expires_ms.is_none() && !names(&i, tag)) {
            return Ok(Some(e.key()));
        }
    }
    Ok(None)
}

pub(super) fn check_portmap(p: &PortMap, what: &str) -> Result<()> {
    check(&p.network, &p.container_id, &p.ifname, &mappings(p), what)
}

pub(super) fn gc_portmap(network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    gc::<Mapping>(network, keep, what)
}

/// Masquerades the pod's traffic to outside its subnets; its addresses are its own from now on.
pub(super) fn add_masquerade(m: &Masquerade, what: &str) -> Result<()> {
    let items = addresses(m);
    if items.is_empty() {
        return del_masquerade(&m.network, &m.container_id, &m.ifname, what);
    }
    let base = MASQ.base(&m.network, &m.container_id, &m.ifname);
    if list_chain(&MASQ, &base)?.is_some() {
        del_pod(&MASQ, &base, what)?;
    }
    let tag = tag(&m.network, &m.container_id, &m.ifname);
    put(&m.network, tag, &items, what, |_: &Address| Ok(()))
}

pub(super) fn del_masquerade(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    del::<Address>(network, container_id, ifname, what)
}

pub(super) fn check_masquerade(m: &Masquerade, what: &str) -> Result<()> {
    check(&m.network, &m.container_id, &m.ifname, &addresses(m), what)
}

pub(super) fn gc_masquerade(network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    gc::<Address>(network, keep, what)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::firewall::PortMapping;

    /// The chain layout tests' pod (8080/tcp, 5353/udp on 192.168.1.1, IPv4 and IPv6) without its
    /// conditions, with a second mapping of 8080/tcp, which must lose to the first.
    fn pm(snat: bool, masq_all: bool) -> PortMap {
        let mut p = super::super::tests::pm();
        p.conditions_v4.clear();
        let dup = PortMapping { host_port: 8080, container_port: 81, protocol: Protocol::Tcp, host_ip: None };
        p.mappings.insert(1, dup);
        p.snat = snat;
        p.masq_all = masq_all;
        p
    }

    #[test]
    fn mappings_keep_the_first_mapping_of_a_port_and_round_trip() {
        let e = mappings(&pm(true, false));
        let texts: Vec<String> = e.iter().map(Mapping::text).collect();
        assert_eq!(
            texts,
            vec!["10.22.0.5,80,tcp,8080,-,16", "10.22.0.5,53,udp,5353,192.168.1.1,16", "fd00:22::5,80,tcp,8080,-,64"]
        );
        for x in &e {
            assert_eq!(Mapping::parse(&x.text()).as_ref(), Some(x));
        }
        assert_eq!(mappings(&pm(false, true))[0].text(), "10.22.0.5,80,tcp,8080,-,n");
        assert_eq!(mappings(&pm(true, true))[0].text(), "10.22.0.5,80,tcp,8080,-,a");
        for bad in [
            "",
            "10.22.0.5,80,tcp,8080,-",
            "10.22.0.5,80,tcp,8080,fd00::1,16",
            "10.22.0.5,80,tcp,8080,-,33",
            "x,80,tcp,1,-,n",
        ] {
            assert_eq!(Mapping::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn elements_of_an_entry() {
        let t = tag("net1", "c1", "eth0");
        let e = mappings(&pm(true, false));
        let sets = |e: &Mapping| e.elems(t).into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(sets(&e[0]), vec!["own4", "dnat4", "hp4-16", "sp4"]);
        assert_eq!(sets(&e[1]), vec!["hown4", "hdnat4", "hhp4-16", "hsp4"]);
        assert_eq!(sets(&e[2]), vec!["own6", "dnat6", "hp6-64"]);
        let hp = &e[0].elems(t)[2].1;
        assert_eq!(hp.key[0], KeyPart::Addr("10.22.0.0".parse().unwrap()));
        assert_eq!(sets(&mappings(&pm(true, true))[1]), vec!["hown4", "hdnat4", "hall4"]);
        assert_eq!(sets(&mappings(&pm(false, false))[2]), vec!["own6", "dnat6"]);
        assert_eq!(Mapping::on_demand("hhp6-64"), Some((true, 64)));
        assert_eq!(Mapping::on_demand("hp4-16"), Some((false, 16)));
        assert_eq!(Mapping::on_demand("hsp4"), None);
        assert_ne!(tag("net1", "c1", "eth0"), tag("net1", "c1", "eth1"));
    }

    #[test]
    fn records_split_into_comments_that_fit() {
        let mut p = pm(true, false);
        p.mappings = (1..=40)
            .map(|i| PortMapping { host_port: 10000 + i, container_port: i, protocol: Protocol::Sctp, host_ip: None })
            .collect();
        let e = mappings(&p);
        assert_eq!(e.len(), 80);
        let comments = record_comments("abcdef01", &e);
        assert!(comments.len() > 1);
        let mut back = Vec::new();
        for c in &comments {
            assert!(c.len() <= 253, "{} bytes: {c}", c.len());
            let (net8, n, entries) = parse_comment::<Mapping>(c).unwrap();
            assert_eq!((net8.as_str(), n as usize), ("abcdef01", comments.len()));
            back.extend(entries);
        }
        assert_eq!(back, e);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod privileged {
    use super::super::tests::in_netns;
    use super::super::{add_pod, masq_pod, portmap_pod};
    use super::*;
    use crate::firewall::PortMapping;

    /// Privileged tests need root and nft: without them they fail (`cni_tests::require_root`),
    /// never pass silently. Always true when it returns.
    fn root() -> bool {
        cni_tests::require_root();
        cni_tests::require_tools(&["nft"]);
        true
    }

    fn pm(id: &str, port: u16) -> PortMap {
        let mut p = super::super::tests::pm();
        p.conditions_v4.clear();
        p.container_id = id.into();
        p.mappings = vec![PortMapping { host_port: port, container_port: 80, protocol: Protocol::Tcp, host_ip: None }];
        p
    }

    fn count(set: &str) -> usize {
        nfnl::get_elements(F, PORTMAP.name, set, None).unwrap().iter().filter(|e| e.expires_ms.is_none()).count()
    }

    fn pod_chains(p: &PortMap) -> bool {
        let base = PORTMAP.base(&p.network, &p.container_id, &p.ifname);
        list_chain(&PORTMAP, &format!("{base}-dnat")).unwrap().is_some()
    }

    /// A pod the chain layout added (an earlier version) is removed by DEL, and moved to this
    /// layout by a repeated ADD.
    #[test]
    fn pods_of_the_chain_layout_are_deleted_and_moved() {
        if !root() {
            return;
        }
        in_netns(|| {
            // The table as the chain layout's setup left it: no sets, no hairpin chain.
            let earlier = "add table inet cni_rs_portmap
add map inet cni_rs_portmap hostports4 { type ipv4_addr . inet_proto . inet_service : verdict; }
add map inet cni_rs_portmap hostports6 { type ipv6_addr . inet_proto . inet_service : verdict; }
add map inet cni_rs_portmap anyports4 { type inet_proto . inet_service : verdict; }
add map inet cni_rs_portmap anyports6 { type inet_proto . inet_service : verdict; }
add map inet cni_rs_portmap snat4 { type ipv4_addr : verdict; }
add map inet cni_rs_portmap snat6 { type ipv6_addr : verdict; }
add chain inet cni_rs_portmap dispatch
add chain inet cni_rs_portmap prerouting { type nat hook prerouting priority -100; policy accept; }
add chain inet cni_rs_portmap output { type nat hook output priority -100; policy accept; }
add chain inet cni_rs_portmap postrouting { type nat hook postrouting priority 100; policy accept; }
add rule inet cni_rs_portmap dispatch ip daddr . meta l4proto . th dport vmap @hostports4
add rule inet cni_rs_portmap dispatch ip6 daddr . meta l4proto . th dport vmap @hostports6
add rule inet cni_rs_portmap dispatch meta nfproto ipv4 meta l4proto . th dport vmap @anyports4
add rule inet cni_rs_portmap dispatch meta nfproto ipv6 meta l4proto . th dport vmap @anyports6
add rule inet cni_rs_portmap prerouting fib daddr type local jump dispatch
add rule inet cni_rs_portmap output fib daddr type local jump dispatch
add rule inet cni_rs_portmap postrouting ct status dnat ip daddr vmap @snat4
add rule inet cni_rs_portmap postrouting ct status dnat ip6 daddr vmap @snat6
";
            let out = crate::firewall::exec::run("nft", &["-f", "-"], Some(earlier)).unwrap();
            assert!(out.success, "{}", out.stderr);
            let (a, b) = (pm("a", 8080), pm("b", 8081));
            add_pod(&portmap_pod(&a), "add a").unwrap();
            add_pod(&portmap_pod(&b), "add b").unwrap();
            assert!(pod_chains(&a) && pod_chains(&b));
            // Its port is taken for this layout too.
            let err = add_portmap(&pm("c", 8080), "add c").unwrap_err();
            assert!(err.msg.contains("8080/tcp"), "{err}");
            del_portmap("net1", "a", "eth0", "del a").unwrap();
            assert!(!pod_chains(&a));
            add_portmap(&b, "add b again").unwrap();
            assert!(!pod_chains(&b));
            check_portmap(&b, "check b").unwrap();
            assert_eq!((count("dnat4"), count("dnat6"), count("owners")), (1, 1, 1));
            let dispatch = list_chain(&PORTMAP, "dispatch").unwrap().unwrap();
            assert_eq!(dispatch.comments.len(), 15, "setup refilled the shared chain");
        });
    }

    /// The removal for kernels that ignore an element's new expiry deletes the same elements.
    #[test]
    fn delete_removes_what_expire_would() {
        if !root() {
            return;
        }
        in_netns(|| {
            let (a, b) = (pm("a", 8080), pm("b", 8081));
            add_portmap(&a, "add a").unwrap();
            add_portmap(&b, "add b").unwrap();
            let tag_a = tag("net1", "a", "eth0");
            let record = read_record::<Mapping>(tag_a).unwrap().unwrap();
            assert_eq!(record.items, mappings(&a));
            assert_eq!(record.expiring, None);
            delete(&[(tag_a, record)], "delete a").unwrap();
            assert!(read_record::<Mapping>(tag_a).unwrap().is_none());
            for (set, n) in
                [("dnat4", 1), ("dnat6", 1), ("own4", 1), ("hp4-16", 1), ("hp6-64", 1), ("sp4", 1), ("owners", 1)]
            {
                assert_eq!(count(set), n, "{set}");
            }
            check_portmap(&b, "check b").unwrap();
            // And a port taken over meanwhile by another attachment is left to it.
            let c = pm("c", 8081);
            let record = read_record::<Mapping>(tag("net1", "b", "eth0")).unwrap().unwrap();
            del_portmap("net1", "b", "eth0", "del b").unwrap();
            add_portmap(&c, "add c").unwrap();
            delete(&[(tag("net1", "b", "eth0"), record)], "delete b late").unwrap();
            check_portmap(&c, "check c").unwrap();
        });
    }

    /// Many mappings take several owner records; DEL finds them all from the container id.
    #[test]
    fn a_record_in_several_chunks() {
        if !root() {
            return;
        }
        in_netns(|| {
            let mut p = pm("many", 1);
            p.mappings = (1..=30)
                .map(|i| PortMapping {
                    host_port: 20000 + i,
                    container_port: i,
                    protocol: Protocol::Udp,
                    host_ip: None,
                })
                .collect();
            add_portmap(&p, "add").unwrap();
            assert!(count("owners") > 1);
            check_portmap(&p, "check").unwrap();
            assert_eq!(count("dnat4"), 30);
            del_portmap("net1", "many", "eth0", "del").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((count("dnat4"), count("dnat6"), count("owners")), (0, 0, 0));
        });
    }

    fn masq(id: &str, addrs: &[&str]) -> Masquerade {
        Masquerade {
            network: "net1".into(),
            container_id: id.into(),
            ifname: "eth0".into(),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn masq_count(set: &str) -> usize {
        nfnl::get_elements(F, MASQ.name, set, None).unwrap().iter().filter(|e| e.expires_ms.is_none()).count()
    }

    /// Masquerade: an address belongs to the newest ADD; a stale attachment's DEL leaves it to
    /// the new one; a pod of the chain layout is removed by DEL and moved by a repeated ADD.
    #[test]
    fn masquerade_addresses_move_to_the_newest_add() {
        if !root() {
            return;
        }
        in_netns(|| {
            let stale = masq("stale", &["10.22.0.5/16", "fd00:22::5/64"]);
            let fresh = masq("fresh", &["10.22.0.5/16"]);
            add_masquerade(&stale, "add stale").unwrap();
            check_masquerade(&stale, "check stale").unwrap();
            add_masquerade(&fresh, "add fresh").unwrap();
            check_masquerade(&fresh, "check fresh").unwrap();
            assert_eq!(check_masquerade(&stale, "check stale").unwrap_err().code, 103);
            del_masquerade("net1", "stale", "eth0", "del stale").unwrap();
            check_masquerade(&fresh, "check fresh").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((masq_count("pods4"), masq_count("pods6"), masq_count("local4-16")), (1, 0, 1));
            // Two addresses of a family, different subnets: each its own.
            let two = masq("two", &["10.30.0.5/24", "10.31.0.5/20"]);
            add_masquerade(&two, "add two").unwrap();
            check_masquerade(&two, "check two").unwrap();
            assert_eq!((masq_count("local4-24"), masq_count("local4-20")), (1, 1));
            // The chain layout.
            let old = masq("old", &["10.40.0.5/16"]);
            add_pod(&masq_pod(&old), "add old").unwrap();
            let base = MASQ.base("net1", "old", "eth0");
            assert!(list_chain(&MASQ, &base).unwrap().is_some());
            add_masquerade(&old, "add old again").unwrap();
            assert!(list_chain(&MASQ, &base).unwrap().is_none());
            check_masquerade(&old, "check old").unwrap();
            add_pod(&masq_pod(&masq("older", &["10.41.0.5/16"])), "add older").unwrap();
            del_masquerade("net1", "older", "eth0", "del older").unwrap();
            assert!(list_chain(&MASQ, &MASQ.base("net1", "older", "eth0")).unwrap().is_none());
            gc_masquerade("net1", &[], "gc").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((masq_count("pods4"), masq_count("pods6"), masq_count("owners")), (0, 0, 0));
        });
    }
}
