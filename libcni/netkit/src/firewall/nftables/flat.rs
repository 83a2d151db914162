//! Port mappings without per-pod chains: every pod's mapping is a few elements of shared hash
//! sets and maps in `inet cni_rs_portmap`, and nothing of a pod is ever a chain, a rule or a jump.
//!
//! ```text
//! map dnat4  { type inet_proto . inet_service : ipv4_addr . inet_service; flags timeout; }   any host address
//! map hdnat4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; ... }  one host address
//! map own4 / hown4 { ... : ipv6_addr }   who holds the host port: the attachment's 128-bit tag
//! set hp4-<len> / hhp4-<len> { ipv4_addr . [ipv4_addr .] inet_proto . inet_service }
//!                                        hairpin: the pod's subnet (masked to <len> bits) . host port
//! set sp4 / hsp4                         IPv4 localhost may reach these host ports (snat)
//! set all4 / hall4 (and 6)               masqAll: every source
//! set owners { ipv6_addr . inet_service } tag . chunk, the comment listing what the attachment holds
//! chain hairpin { ip saddr & <mask> . meta l4proto . th dport @hp4-<len> meta mark set meta mark | 0x2000
//!                 ip saddr & <mask> . ip daddr . meta l4proto . th dport @hhp4-<len> meta mark set ... }
//! chain dispatch { ...the verdict maps of pods with conditions..., jump hairpin, the sp/all marks,
//!                  dnat ip to ip daddr . meta l4proto . th dport map @hdnat4,
//!                  meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4, (and 6) }
//! chain postrouting { ..., meta mark & 0x2000 == 0x2000 masquerade }
//! ```
//!
//! Why: a transaction that adds a jump or a NAT rule makes the kernel validate the whole table,
//! and every link event walks every chain, both growing with the pods; elements of hash sets cost
//! the same at 10 pods and at 3000 (tests/bench/nft-layout-probe.sh). And DEL deletes nothing:
//! any deletion in nf_tables is freed after an RCU grace period, and closing the netlink socket
//! waits for it (~10 ms here). DEL gives each element an expiry of 1 ms instead (an element update,
//! Linux 6.10 and later): it stops matching at once and the set's garbage collector frees it
//! later, on nobody's clock. On a kernel that ignores the expiry, DEL sees the owner record still
//! there without one and deletes the elements instead.
//!
//! Hairpin and localhost traffic is masqueraded the way the reference portmap does it: marked
//! with 0x2000 (its default `markMasqBit` 13) in `dispatch` when it goes to a mapped port, and
//! masqueraded in postrouting because of the mark. A hairpin set per subnet length (created with
//! its rule by the first pod with that length: the only rule ever added after setup) lets one
//! hash lookup test "source in the pod's subnet".
//!
//! Ownership: the `own` element of a host port holds the tag of the attachment that mapped it. ADD
//! adds it (EEXIST: another attachment holds the port, a conflict); DEL and GC re-add it with the
//! expiry, which fails with EEXIST when it has become another attachment's, and then leave that
//! port alone. DEL needs only the container id: the owner record (one GETSETELEM) says what the
//! attachment holds. Pods with `conditionsV4`/`conditionsV6` (free nft syntax) keep the chain
//! layout, and so do pods added by an earlier version until their DEL.

use super::super::nfnl::{self, Batch, Elem, ElemData, ElemInfo, Family, KeyPart};
use super::super::{check_failed, sha512_hex, PortMap, Protocol};
use super::{conflict, del_pod, list_chain, network_hash, to_batch, Key, PORTMAP, PORTMAP_TABLE};
use ipnetwork::IpNetwork;
use libcni::conf::Attachment;
use libcni::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

/// The mark that asks postrouting to masquerade (the reference's default, bit 13).
pub(crate) const MARK: u32 = 0x2000;
/// How soon DEL's elements expire.
const EXPIRE_MS: u64 = 1;
const OWNERS: &str = "owners";
const F: Family = Family::Inet;
/// A comment holds at most 253 bytes; the header `net=<8>;n=<3>;` takes 18.
const COMMENT_ROOM: usize = 253 - 18;

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

/// One mapping to one pod address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    pod: IpAddr,
    cport: u16,
    proto: Protocol,
    hport: u16,
    host: Option<IpAddr>,
    mode: Mode,
}

impl Entry {
    fn v6(&self) -> bool {
        self.pod.is_ipv6()
    }

    fn fam(&self) -> char {
        if self.v6() {
            '6'
        } else {
            '4'
        }
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

    /// `h` for a mapping bound to a host address, nothing otherwise: the prefix of its sets' names.
    fn h(&self) -> &'static str {
        if self.host.is_some() {
            "h"
        } else {
            ""
        }
    }

    fn own_set(&self) -> String {
        format!("{}own{}", self.h(), self.fam())
    }

    /// The elements that make the mapping, the owner's first.
    fn elems(&self, tag: Ipv6Addr) -> Vec<(String, Elem)> {
        let (h, f) = (self.h(), self.fam());
        let key = self.host_key();
        let value = |d: Vec<KeyPart>| ElemData::Value(d);
        let mut out = vec![
            (self.own_set(), Elem::new(key.clone(), value(vec![KeyPart::Addr(IpAddr::V6(tag))]))),
            (
                format!("{h}dnat{f}"),
                Elem::new(key.clone(), value(vec![KeyPart::Addr(self.pod), KeyPart::Port(self.cport)])),
            ),
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

    fn parse(s: &str) -> Option<Entry> {
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
        Some(Entry {
            pod,
            cport: cport.parse().ok()?,
            proto: Protocol::parse(proto)?,
            hport: hport.parse().ok()?,
            host,
            mode,
        })
    }
}

/// The mappings of a pod, one per (address, host port): the first mapping of a host port wins, as
/// the first rule did in the chain layout.
fn entries(p: &PortMap) -> Vec<Entry> {
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
            let e = Entry {
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

/// The attachment's tag: 128 bits of sha512(network, container id, ifname).
fn tag(network: &str, container_id: &str, ifname: &str) -> Ipv6Addr {
    let hex = sha512_hex(&format!("{network}\0{container_id}\0{ifname}"));
    let bits = u128::from_str_radix(&hex[..32], 16).unwrap_or_default();
    Ipv6Addr::from(bits)
}

fn owner_key(tag: Ipv6Addr, chunk: u16) -> Vec<KeyPart> {
    vec![KeyPart::Addr(IpAddr::V6(tag)), KeyPart::Port(chunk)]
}

/// The owner record's comments: `net=<net8>;n=<chunks>;<entry>;<entry>...`, each within the
/// 253 bytes a comment holds.
fn record_comments(net8: &str, entries: &[Entry]) -> Vec<String> {
    let mut groups: Vec<Vec<String>> = vec![Vec::new()];
    let mut room = COMMENT_ROOM;
    for e in entries {
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
#[derive(Debug, Clone, Default)]
struct Record {
    net8: String,
    /// The comment of each chunk, in order.
    comments: Vec<String>,
    entries: Vec<Entry>,
    /// Milliseconds until it expires (a DEL of it has just run).
    expiring: Option<u64>,
}

/// `net=<net8>;n=<count>;` and the entries of one chunk's comment.
fn parse_comment(c: &str) -> Option<(String, u16, Vec<Entry>)> {
    let mut parts = c.split(';');
    let net8 = parts.next()?.strip_prefix("net=")?.to_string();
    let n: u16 = parts.next()?.strip_prefix("n=")?.parse().ok()?;
    let entries = parts.filter(|s| !s.is_empty()).map(Entry::parse).collect::<Option<Vec<_>>>()?;
    Some((net8, n, entries))
}

fn get(set: &str, key: &[KeyPart]) -> Result<Option<ElemInfo>> {
    Ok(nfnl::get_elements(F, PORTMAP_TABLE, set, Some(key))?.into_iter().next())
}

/// The attachment's owner record, None when it has none (or an unreadable one).
fn read_record(tag: Ipv6Addr) -> Result<Option<Record>> {
    let Some(first) = get(OWNERS, &owner_key(tag, 0))? else { return Ok(None) };
    let Some((net8, n, mut entries)) = first.comment.as_deref().and_then(parse_comment) else { return Ok(None) };
    let mut comments = vec![first.comment.clone().unwrap_or_default()];
    for chunk in 1..n {
        let Some(c) = get(OWNERS, &owner_key(tag, chunk))?.and_then(|e| e.comment) else { return Ok(None) };
        let Some((_, _, more)) = parse_comment(&c) else { return Ok(None) };
        entries.extend(more);
        comments.push(c);
    }
    Ok(Some(Record { net8, comments, entries, expiring: first.expires_ms }))
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
    /// The entry it belongs to (its first message is the owner's), None for the owner record.
    entry: Option<usize>,
    set: String,
    elem: Elem,
    op: Op,
}

fn encode(msgs: &[Msg], b: &mut Batch) {
    for m in msgs {
        match m.op {
            Op::Add => b.add_elems(F, PORTMAP_TABLE, &m.set, std::slice::from_ref(&m.elem), false),
            Op::Delete => b.delete_elements(F, PORTMAP_TABLE, &m.set, std::slice::from_ref(&m.elem.key)),
        }
    }
}

/// A set of `name` was missing: the hairpin sets of a subnet length are made on demand.
fn hairpin_len(set: &str) -> Option<(bool, u8)> {
    let rest = set.strip_prefix("hhp").or_else(|| set.strip_prefix("hp"))?;
    let (fam, len) = rest.split_once('-')?;
    let v6 = match fam {
        "4" => false,
        "6" => true,
        _ => return None,
    };
    Some((v6, len.parse().ok()?))
}

/// `create set` of the two hairpin sets of a subnet length and their rules: the create is the
/// mutex (EEXIST: another ADD made them, rules included, in the same transaction).
fn hairpin_setup(b: &mut Batch, v6: bool, len: u8) {
    use super::super::nfnl::{Field, SetData, SetSpec};
    use nfnl::KeyType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
    let f = if v6 { '6' } else { '4' };
    let (addr, saddr, daddr) =
        if v6 { (A6, Field::Ip6Saddr, Field::Ip6Daddr) } else { (A4, Field::IpSaddr, Field::IpDaddr) };
    let mask: Vec<u8> =
        match IpNetwork::new(if v6 { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::from([0, 0, 0, 0]) }, len) {
            Ok(IpNetwork::V4(n)) => n.mask().octets().to_vec(),
            Ok(IpNetwork::V6(n)) => n.mask().octets().to_vec(),
            Err(_) => vec![0; if v6 { 16 } else { 4 }],
        };
    let any = format!("hp{f}-{len}");
    let bound = format!("hhp{f}-{len}");
    let (any_types, bound_types) = ([addr, P, S], [addr, addr, P, S]);
    b.add_set(F, PORTMAP_TABLE, &any, SetSpec { key: &any_types, data: SetData::None, timeout: true }, true);
    b.add_set(F, PORTMAP_TABLE, &bound, SetSpec { key: &bound_types, data: SetData::None, timeout: true }, true);
    let rule =
        |key: Vec<(Field, Option<Vec<u8>>)>, set: &str| nfnl::Rule::new(F).in_set(&key, set).mark_or(MARK).build();
    let any_key = vec![(saddr, Some(mask.clone())), (Field::L4proto, None), (Field::ThDport, None)];
    let bound_key = vec![(saddr, Some(mask)), (daddr, None), (Field::L4proto, None), (Field::ThDport, None)];
    b.add_rule_with_comment(F, PORTMAP_TABLE, "hairpin", rule(any_key, &any), None);
    b.add_rule_with_comment(F, PORTMAP_TABLE, "hairpin", rule(bound_key, &bound), None);
}

/// Sends element messages, with the table's setup and the hairpin sets they need made on the
/// way. `on_exists` decides about a message that failed with EEXIST: true to go on without it
/// (the caller may have changed `msgs`), or an error. Messages whose set is gone (ENOENT) are
/// dropped when `drop_missing` (a removal), and make the sets otherwise.
fn send(
    msgs: &mut Vec<Msg>,
    drop_missing: bool,
    what: &str,
    mut on_exists: impl FnMut(&mut Vec<Msg>, usize) -> Result<bool>,
) -> Result<()> {
    let mut setup = false;
    let mut hairpins: BTreeSet<(bool, u8)> = BTreeSet::new();
    let mut made: BTreeSet<(bool, u8)> = BTreeSet::new();
    for _ in 0..msgs.len() + 6 {
        if msgs.is_empty() {
            return Ok(());
        }
        let mut b = Batch::new();
        if setup {
            if let Some((s, _)) = to_batch(&PORTMAP, &PORTMAP.setup()) {
                b.extend(s);
            }
        }
        let mut prefix_owner: Vec<Option<(bool, u8)>> = vec![None; b.len()];
        for &(v6, len) in hairpins.difference(&made) {
            let before = b.len();
            hairpin_setup(&mut b, v6, len);
            prefix_owner.extend(std::iter::repeat_n(Some((v6, len)), b.len() - before));
        }
        let offset = b.len();
        encode(msgs, &mut b);
        let failures = b.send_each()?;
        if failures.is_empty() {
            return Ok(());
        }
        let mut changed = false;
        let mut drop = BTreeSet::new();
        let mut first_error = None;
        for f in &failures {
            if f.index < offset {
                match prefix_owner.get(f.index).copied().flatten() {
                    // Another ADD made them: go on without.
                    Some(hp) if f.errno == libc::EEXIST => changed |= made.insert(hp),
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
                libc::ENOENT => match hairpin_len(&m.set) {
                    Some(hp) if !hairpins.contains(&hp) => changed |= hairpins.insert(hp),
                    Some(_) => changed |= !std::mem::replace(&mut setup, true),
                    None => changed |= !std::mem::replace(&mut setup, true),
                },
                libc::EEXIST => {
                    let before = msgs.len();
                    if on_exists(msgs, i)? {
                        changed = true;
                        if msgs.len() != before {
                            // The caller reshaped the batch: send it again as it is now.
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
            if i < msgs.len() {
                msgs.remove(i);
            }
        }
        if !changed {
            let e = first_error.unwrap_or_else(|| failures[0].error.clone());
            return Err(Error::network(format!("{what}: {}", e.msg)));
        }
    }
    Err(Error::network(format!("{what}: nft kept failing on table inet {PORTMAP_TABLE}")))
}

/// Removes the messages of entry `entry` (another attachment holds its port now).
fn drop_entry(msgs: &mut Vec<Msg>, entry: usize) {
    msgs.retain(|m| m.entry != Some(entry));
}

/// Whether `tag` owns the host port of `e` now.
fn owns(e: &Entry, tag: Ipv6Addr) -> Result<bool> {
    let want = nfnl::key_bytes(&[KeyPart::Addr(IpAddr::V6(tag))]);
    Ok(get(&e.own_set(), &e.host_key())?.is_some_and(|i| i.data.as_deref() == Some(&want[..])))
}

/// Forwards the pod's mapped ports (replacing what the attachment had).
pub(super) fn add(p: &PortMap, what: &str) -> Result<()> {
    let entries = entries(p);
    if entries.is_empty() {
        return del(&p.network, &p.container_id, &p.ifname, what);
    }
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    // The chain layout's remains of this attachment (an earlier version, or conditions).
    let base = PORTMAP.base(&p.network, &p.container_id, &p.ifname);
    if list_chain(&PORTMAP, &format!("{base}-dnat"))?.is_some() {
        del_pod(&PORTMAP, &base, what)?;
    }
    let mut old = read_record(tag)?;
    if let Some(ms) = old.as_ref().and_then(|r| r.expiring) {
        wait_expiry(ms);
        old = None;
    }
    // A port held in the chain layout (a pod with conditions, or from an earlier version).
    for e in &entries {
        let k = e.key();
        if !nfnl::get_elements(F, PORTMAP_TABLE, &k.map(), Some(&k.parts()))?.is_empty() {
            return Err(conflict(what, &[k]));
        }
    }
    let mut msgs = Vec::new();
    if let Some(old) = &old {
        // A repeated ADD: what is no longer wanted goes, and the record is rewritten.
        for e in old.entries.iter().filter(|e| !entries.contains(e)) {
            if owns(e, tag)? {
                for (set, elem) in e.elems(tag) {
                    msgs.push(Msg { entry: None, set, elem, op: Op::Delete });
                }
            }
        }
        for chunk in 0..old.comments.len() as u16 {
            let elem = Elem::new(owner_key(tag, chunk), ElemData::None);
            msgs.push(Msg { entry: None, set: OWNERS.into(), elem, op: Op::Delete });
        }
    }
    for (i, e) in entries.iter().enumerate() {
        for (set, elem) in e.elems(tag) {
            msgs.push(Msg { entry: Some(i), set, elem, op: Op::Add });
        }
    }
    for (chunk, c) in record_comments(&network_hash(&p.network), &entries).into_iter().enumerate() {
        let mut elem = Elem::new(owner_key(tag, chunk as u16), ElemData::None);
        elem.comment = Some(c);
        msgs.push(Msg { entry: None, set: OWNERS.into(), elem, op: Op::Add });
    }
    send(&mut msgs, false, what, |msgs, i| {
        let m = msgs[i].clone();
        let Some(entry) = m.entry.and_then(|n| entries.get(n)) else { return Ok(false) };
        if m.set == entry.own_set() {
            // Another attachment's port; unless that one is being deleted right now.
            match get(&m.set, &m.elem.key)? {
                // Gone since (it was expiring).
                None => Ok(true),
                Some(ElemInfo { expires_ms: Some(ms), .. }) => {
                    wait_expiry(ms);
                    Ok(true)
                }
                Some(_) => Err(conflict(what, &[entry.key()])),
            }
        } else {
            // Our port, but a stale translation for it (another attachment's, expiring or left
            // behind): replace it.
            let Some(info) = get(&m.set, &m.elem.key)? else { return Ok(true) };
            if let Some(ms) = info.expires_ms {
                wait_expiry(ms);
                return Ok(true);
            }
            let del = Msg { op: Op::Delete, ..m };
            msgs.insert(i, del);
            Ok(true)
        }
    })
}

/// Gives the elements of these attachments an expiry of 1 ms: each host port the attachment
/// still owns, and its owner record. On a kernel that ignores element updates, deletes them.
fn expire(records: &[(Ipv6Addr, Record)], what: &str) -> Result<()> {
    let mut msgs = Vec::new();
    let mut n = 0;
    for (tag, r) in records {
        for e in &r.entries {
            for (set, mut elem) in e.elems(*tag) {
                elem.expires_ms = Some(EXPIRE_MS);
                msgs.push(Msg { entry: Some(n), set, elem, op: Op::Add });
            }
            n += 1;
        }
        for (chunk, c) in r.comments.iter().enumerate() {
            let mut elem = Elem::new(owner_key(*tag, chunk as u16), ElemData::None);
            elem.expires_ms = Some(EXPIRE_MS);
            elem.comment = Some(c.clone());
            msgs.push(Msg { entry: None, set: OWNERS.into(), elem, op: Op::Add });
        }
    }
    send(&mut msgs, true, what, |msgs, i| {
        match msgs[i].entry {
            // The port (or a stale element of it) is another attachment's now: leave the entry be.
            Some(entry) => drop_entry(msgs, entry),
            None => {
                msgs.remove(i);
            }
        }
        Ok(true)
    })?;
    for (tag, _) in records {
        if get(OWNERS, &owner_key(*tag, 0))?.is_some_and(|e| e.expires_ms.is_none()) {
            return delete(records, what);
        }
    }
    Ok(())
}

/// Deletes the elements of these attachments (a kernel without element updates).
fn delete(records: &[(Ipv6Addr, Record)], what: &str) -> Result<()> {
    let mut msgs = Vec::new();
    for (tag, r) in records {
        for e in &r.entries {
            if owns(e, *tag)? {
                for (set, elem) in e.elems(*tag) {
                    msgs.push(Msg { entry: None, set, elem, op: Op::Delete });
                }
            }
        }
        for chunk in 0..r.comments.len() as u16 {
            let elem = Elem::new(owner_key(*tag, chunk), ElemData::None);
            msgs.push(Msg { entry: None, set: OWNERS.into(), elem, op: Op::Delete });
        }
    }
    send(&mut msgs, true, what, |_, _| Ok(false))
}

/// Removes an attachment's mappings, whichever layout added them; none is success.
pub(super) fn del(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<()> {
    if !forget(network, container_id, ifname, what)? {
        del_pod(&PORTMAP, &PORTMAP.base(network, container_id, ifname), what)?;
    }
    Ok(())
}

/// Removes what this layout holds of an attachment; false when it holds nothing.
pub(super) fn forget(network: &str, container_id: &str, ifname: &str, what: &str) -> Result<bool> {
    let tag = tag(network, container_id, ifname);
    match read_record(tag)? {
        Some(r) if r.expiring.is_some() => Ok(true),
        Some(r) => expire(&[(tag, r)], what).map(|()| true),
        None => Ok(false),
    }
}

/// A host port of `p` that an attachment of this layout holds (for an ADD in the chain layout).
pub(super) fn held(p: &PortMap) -> Result<Option<Key>> {
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    for e in entries(p) {
        if get(&e.own_set(), &e.host_key())?.is_some_and(|i| i.expires_ms.is_none()) && !owns(&e, tag)? {
            return Ok(Some(e.key()));
        }
    }
    Ok(None)
}

/// The attachment's record lists exactly the mappings of `p`, and every element is there with
/// the data it should have.
pub(super) fn check(p: &PortMap, what: &str) -> Result<()> {
    let tag = tag(&p.network, &p.container_id, &p.ifname);
    let t = format!("inet {PORTMAP_TABLE}");
    let record = match read_record(tag)? {
        Some(r) if r.expiring.is_none() => r,
        _ => return Err(check_failed(format!("{what}: no record of its mappings in table {t}"))),
    };
    let want = entries(p);
    let (a, b): (BTreeSet<&Entry>, BTreeSet<&Entry>) = (record.entries.iter().collect(), want.iter().collect());
    if a != b {
        return Err(check_failed(format!("{what}: table {t} records other mappings than the configuration's")));
    }
    for e in &want {
        for (set, elem) in e.elems(tag) {
            let key = elem.key.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(" . ");
            match (get(&set, &elem.key)?, &elem.data) {
                (None, _) => return Err(check_failed(format!("{what}: {set} element {key} missing from table {t}"))),
                (Some(i), _) if i.expires_ms.is_some() => {
                    return Err(check_failed(format!("{what}: {set} element {key} of table {t} is expiring")))
                }
                (Some(i), ElemData::Value(d)) if i.data.as_deref() != Some(&nfnl::key_bytes(d)[..]) => {
                    return Err(check_failed(format!("{what}: {set} element {key} of table {t} leads elsewhere")))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Expires the records (and ports) of every attachment of `network` not in `keep`: one dump of
/// the owner records, one batch.
pub(super) fn gc(network: &str, keep: &[Attachment], what: &str) -> Result<()> {
    let net8 = network_hash(network);
    let kept: BTreeSet<Ipv6Addr> = keep.iter().map(|a| tag(network, &a.container_id, &a.ifname)).collect();
    let mut by_tag: BTreeMap<Ipv6Addr, BTreeMap<u16, (String, Option<u64>)>> = BTreeMap::new();
    for e in nfnl::get_elements(F, PORTMAP_TABLE, OWNERS, None)? {
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
        let mut record = Record::default();
        for (c, _) in chunks.values() {
            let Some((n8, _, entries)) = parse_comment(c) else { continue };
            record.net8 = n8;
            record.entries.extend(entries);
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::firewall::PortMapping;

    fn pm(snat: bool, masq_all: bool) -> PortMap {
        PortMap {
            network: "net1".into(),
            container_id: "c1".into(),
            ifname: "eth0".into(),
            mappings: vec![
                PortMapping { host_port: 8080, container_port: 80, protocol: Protocol::Tcp, host_ip: None },
                PortMapping { host_port: 8080, container_port: 81, protocol: Protocol::Tcp, host_ip: None },
                PortMapping {
                    host_port: 5353,
                    container_port: 53,
                    protocol: Protocol::Udp,
                    host_ip: Some("192.168.1.1".parse().unwrap()),
                },
            ],
            ipv4: Some("10.22.0.5/16".parse().unwrap()),
            ipv6: Some("fd00:22::5/64".parse().unwrap()),
            snat,
            masq_all,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: vec![],
            conditions_v6: vec![],
        }
    }

    #[test]
    fn entries_keep_the_first_mapping_of_a_port_and_round_trip() {
        let e = entries(&pm(true, false));
        let texts: Vec<String> = e.iter().map(Entry::text).collect();
        assert_eq!(
            texts,
            vec!["10.22.0.5,80,tcp,8080,-,16", "10.22.0.5,53,udp,5353,192.168.1.1,16", "fd00:22::5,80,tcp,8080,-,64"]
        );
        for x in &e {
            assert_eq!(Entry::parse(&x.text()).as_ref(), Some(x));
        }
        assert_eq!(entries(&pm(false, true))[0].text(), "10.22.0.5,80,tcp,8080,-,n");
        assert_eq!(entries(&pm(true, true))[0].text(), "10.22.0.5,80,tcp,8080,-,a");
        for bad in [
            "",
            "10.22.0.5,80,tcp,8080,-",
            "10.22.0.5,80,tcp,8080,fd00::1,16",
            "10.22.0.5,80,tcp,8080,-,33",
            "x,80,tcp,1,-,n",
        ] {
            assert_eq!(Entry::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn elements_of_an_entry() {
        let t = tag("net1", "c1", "eth0");
        let e = entries(&pm(true, false));
        let sets = |e: &Entry| e.elems(t).into_iter().map(|(s, _)| s).collect::<Vec<_>>();
        assert_eq!(sets(&e[0]), vec!["own4", "dnat4", "hp4-16", "sp4"]);
        assert_eq!(sets(&e[1]), vec!["hown4", "hdnat4", "hhp4-16", "hsp4"]);
        assert_eq!(sets(&e[2]), vec!["own6", "dnat6", "hp6-64"]);
        let hp = &e[0].elems(t)[2].1;
        assert_eq!(hp.key[0], KeyPart::Addr("10.22.0.0".parse().unwrap()));
        assert_eq!(sets(&entries(&pm(true, true))[1]), vec!["hown4", "hdnat4", "hall4"]);
        assert_eq!(sets(&entries(&pm(false, false))[2]), vec!["own6", "dnat6"]);
        assert_eq!(hairpin_len("hhp6-64"), Some((true, 64)));
        assert_eq!(hairpin_len("hp4-16"), Some((false, 16)));
        assert_eq!(hairpin_len("hsp4"), None);
        assert_ne!(tag("net1", "c1", "eth0"), tag("net1", "c1", "eth1"));
    }

    #[test]
    fn records_split_into_comments_that_fit() {
        let mut p = pm(true, false);
        p.mappings = (1..=40)
            .map(|i| PortMapping { host_port: 10000 + i, container_port: i, protocol: Protocol::Sctp, host_ip: None })
            .collect();
        let e = entries(&p);
        assert_eq!(e.len(), 80);
        let comments = record_comments("abcdef01", &e);
        assert!(comments.len() > 1);
        let mut back = Vec::new();
        for c in &comments {
            assert!(c.len() <= 253, "{} bytes: {c}", c.len());
            let (net8, n, entries) = parse_comment(c).unwrap();
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
    use super::super::{add_pod, portmap_pod};
    use super::*;
    use crate::firewall::PortMapping;

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let ok = unsafe { libc::geteuid() } == 0 && crate::firewall::exec::find("nft").is_some();
        if !ok {
            eprintln!("SKIP: needs root and nft");
        }
        ok
    }

    fn pm(id: &str, port: u16) -> PortMap {
        PortMap {
            network: "net1".into(),
            container_id: id.into(),
            ifname: "eth0".into(),
            mappings: vec![PortMapping { host_port: port, container_port: 80, protocol: Protocol::Tcp, host_ip: None }],
            ipv4: Some("10.22.0.5/16".parse().unwrap()),
            ipv6: Some("fd00:22::5/64".parse().unwrap()),
            snat: true,
            masq_all: false,
            mark_masq_bit: 13,
            external_set_mark_chain: None,
            conditions_v4: vec![],
            conditions_v6: vec![],
        }
    }

    fn count(set: &str) -> usize {
        nfnl::get_elements(F, PORTMAP_TABLE, set, None).unwrap().iter().filter(|e| e.expires_ms.is_none()).count()
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
            let (a, b) = (pm("a", 8080), pm("b", 8081));
            add_pod(&portmap_pod(&a), "add a").unwrap();
            add_pod(&portmap_pod(&b), "add b").unwrap();
            assert!(pod_chains(&a) && pod_chains(&b));
            // Its port is taken for this layout too.
            let err = add(&pm("c", 8080), "add c").unwrap_err();
            assert!(err.msg.contains("8080/tcp"), "{err}");
            del("net1", "a", "eth0", "del a").unwrap();
            assert!(!pod_chains(&a));
            add(&b, "add b again").unwrap();
            assert!(!pod_chains(&b));
            check(&b, "check b").unwrap();
            assert_eq!((count("dnat4"), count("dnat6"), count("owners")), (1, 1, 1));
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
            add(&a, "add a").unwrap();
            add(&b, "add b").unwrap();
            let tag_a = tag("net1", "a", "eth0");
            let record = read_record(tag_a).unwrap().unwrap();
            assert_eq!(record.entries, entries(&a));
            assert_eq!(record.expiring, None);
            delete(&[(tag_a, record)], "delete a").unwrap();
            assert!(read_record(tag_a).unwrap().is_none());
            for (set, n) in
                [("dnat4", 1), ("dnat6", 1), ("own4", 1), ("hp4-16", 1), ("hp6-64", 1), ("sp4", 1), ("owners", 1)]
            {
                assert_eq!(count(set), n, "{set}");
            }
            check(&b, "check b").unwrap();
            // And a port taken over meanwhile by another attachment is left to it.
            let c = pm("c", 8081);
            let record = read_record(tag("net1", "b", "eth0")).unwrap().unwrap();
            del("net1", "b", "eth0", "del b").unwrap();
            add(&c, "add c").unwrap();
            delete(&[(tag("net1", "b", "eth0"), record)], "delete b late").unwrap();
            check(&c, "check c").unwrap();
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
            add(&p, "add").unwrap();
            assert!(count("owners") > 1);
            check(&p, "check").unwrap();
            assert_eq!(count("dnat4"), 30);
            del("net1", "many", "eth0", "del").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!((count("dnat4"), count("dnat6"), count("owners")), (0, 0, 0));
        });
    }
}
