//! The netlink batch writer against `nft` itself: every rule shape the backend uses is built once
//! from nft text and once from a [`Batch`], and the kernel's view of both (`nft -j list table`
//! and the expressions of `nft --debug=netlink list table`) must be identical. Privileged tests
//! run on a thread of their own in a fresh network namespace, so they touch nothing of the host's
//! ruleset and whatever they leave goes with the namespace (they also delete their tables).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::super::exec;
use super::*;
use serde_json::Value;
use std::hash::{BuildHasher, Hasher};

/// Each message of a batch: its type (without the subsystem), flags and attributes, for tests
/// that compare them with messages captured from other tools.
pub(crate) fn messages(b: &Batch) -> Vec<(u16, u16, Vec<u8>)> {
    b.msgs.iter().map(|m| (m.ty, m.flags, m.attrs.clone())).collect()
}

/// Privileged tests need root and nft: without them they fail (`cni_tests::require_root`), never
/// pass silently.
pub(crate) fn require_root_and_nft() {
    cni_tests::require_root();
    cni_tests::require_tools(&["nft"]);
}

/// Runs `f` on a thread of its own in a fresh network namespace (nft, run from that thread,
/// inherits it).
pub(crate) fn in_netns(f: impl FnOnce() + Send + 'static) {
    let r = std::thread::spawn(move || {
        // SAFETY: unshare(2) changes only this thread's network namespace.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "unshare(CLONE_NEWNET): {}", std::io::Error::last_os_error());
        f();
    })
    .join();
    if let Err(panic) = r {
        std::panic::resume_unwind(panic);
    }
}

pub(crate) fn suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("{:08x}", h.finish() as u32)
}

/// A fresh inet table name for one test, and the guard that deletes the table.
pub(crate) fn inet_table() -> (TableFamily, String, Cleanup) {
    let t = format!("cnirs_nl_{}", suffix());
    (TableFamily::Inet, t.clone(), Cleanup(vec![(TableFamily::Inet, t)]))
}

pub(crate) fn nft(args: &[&str], stdin: Option<&str>) -> String {
    let out = exec::run("nft", args, stdin).unwrap();
    assert!(out.success, "nft {args:?} failed: {}\n{}", out.stderr, stdin.unwrap_or_default());
    format!("{}{}", out.stdout, out.stderr)
}

pub(crate) fn table_exists(family: TableFamily, table: &str) -> bool {
    exec::run("nft", &["list", "table", family.name(), table], None).unwrap().success
}

/// Deletes the tables when dropped, test failure or not.
pub(crate) struct Cleanup(pub(crate) Vec<(TableFamily, String)>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (family, table) in &self.0 {
            let _ = exec::run("nft", &["delete", "table", family.name(), table], None);
        }
    }
}

pub(crate) fn normalize_json(v: &mut Value, table: &str) {
    match v {
        Value::Object(map) => {
            map.remove("handle");
            for (key, value) in map.iter_mut() {
                normalize_json(value, table);
                if key == "elem" {
                    if let Value::Array(elems) = value {
                        // A hash set lists in the order of its hash seed, which differs per set.
                        elems.sort_by_key(|e| e.to_string());
                    }
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|i| normalize_json(i, table)),
        Value::String(s) if s == table => *s = "T".into(),
        _ => {}
    }
}

/// The table as nft lists it: JSON without handles, and the kernel's expressions, with the
/// table's name replaced by `T` and set elements in a fixed order.
pub(crate) fn listing(family: TableFamily, table: &str) -> (Value, String) {
    let json = nft(&["-j", "list", "table", family.name(), table], None);
    let mut v: Value = serde_json::from_str(&json).unwrap();
    if let Some(items) = v.get_mut("nftables").and_then(Value::as_array_mut) {
        items.retain(|i| i.get("metainfo").is_none());
    }
    normalize_json(&mut v, table);
    let debug = nft(&["--debug=netlink", "list", "table", family.name(), table], None);
    // Runs of element lines (one set's elements) are sorted: see normalize_json.
    (v, sort_element_runs(&debug.replace(table, "T")))
}

/// `nft --debug=netlink` output with each run of set-element lines sorted: the kernel lists a
/// set's elements in hash order, which differs between two tables holding the same elements.
pub(crate) fn sort_element_runs(debug: &str) -> String {
    let mut lines: Vec<&str> = Vec::new();
    let mut run: Vec<&str> = Vec::new();
    for l in debug.lines() {
        if l.starts_with("\telement ") {
            run.push(l);
            continue;
        }
        run.sort();
        lines.append(&mut run);
        lines.push(l);
    }
    run.sort();
    lines.append(&mut run);
    lines.join("\n")
}

/// Builds `text` (nft syntax, `{T}` for the table) with nft and `build` with a batch, and checks
/// that the kernel holds the same for both.
pub(crate) fn same_as_nft(family: TableFamily, text: &str, build: impl FnOnce(&mut Batch, &str)) {
    let sfx = suffix();
    let (t_nft, t_nl) = (format!("cnirs_nft_{sfx}"), format!("cnirs_nl_{sfx}"));
    let _cleanup = Cleanup(vec![(family, t_nft.clone()), (family, t_nl.clone())]);
    nft(&["-f", "-"], Some(&text.replace("{T}", &t_nft)));
    let mut b = Batch::new();
    build(&mut b, &t_nl);
    b.send().unwrap_or_else(|e| panic!("{e:?}"));
    let (json_nft, debug_nft) = listing(family, &t_nft);
    let (json_nl, debug_nl) = listing(family, &t_nl);
    assert_eq!(debug_nl, debug_nft, "expressions differ (left: netlink, right: nft)");
    assert_eq!(json_nl, json_nft, "listings differ (left: netlink, right: nft)");
    assert!(debug_nl.contains("[ "), "no expressions listed: {debug_nl}");
}

pub(crate) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(crate) fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

pub(crate) fn jump(c: &str) -> Verdict {
    Verdict::Jump(c.into())
}

pub(crate) fn nat(hook: Hook, priority: i32) -> Option<BaseChain> {
    Some(BaseChain { hook, priority, kind: ChainType::Nat, policy_accept: true })
}

/// `add map ... { type <key> : verdict; }`.
pub(crate) fn add_map(b: &mut Batch, f: TableFamily, t: &str, name: &str, key: &[KeyType]) {
    b.add_set(f, t, name, SetSpec { key, data: SetData::Verdict, timeout: false }, false);
}

/// `add element` (or `create` when `excl`) of verdict-map elements.
pub(crate) fn add_elements(
    b: &mut Batch,
    f: TableFamily,
    t: &str,
    map: &str,
    elems: &[(Vec<KeyPart>, Verdict)],
    excl: bool,
) {
    let elems: Vec<Elem> = elems.iter().map(|(k, v)| Elem::new(k.clone(), ElemData::Verdict(v.clone()))).collect();
    b.add_elems(f, t, map, &elems, excl);
}

pub(crate) fn add_rule(b: &mut Batch, f: TableFamily, t: &str, chain: &str, rule: Rule) {
    b.add_rule_with_comment(f, t, chain, rule, None);
}

pub(crate) const FLAT: &str = r#"
add table inet {T}
add chain inet {T} post { type nat hook postrouting priority 100; policy accept; }
add chain inet {T} hairpin
add chain inet {T} dispatch
add map inet {T} dnat4 { type inet_proto . inet_service : ipv4_addr . inet_service; flags timeout; }
add map inet {T} hdnat4 { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; flags timeout; }
add map inet {T} dnat6 { type inet_proto . inet_service : ipv6_addr . inet_service; flags timeout; }
add map inet {T} own4 { type inet_proto . inet_service : ipv6_addr; flags timeout; }
add set inet {T} hp4-16 { type ipv4_addr . inet_proto . inet_service; flags timeout; }
add set inet {T} hhp4-16 { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags timeout; }
add set inet {T} hp6-64 { type ipv6_addr . inet_proto . inet_service; flags timeout; }
add set inet {T} sp4 { type inet_proto . inet_service; flags timeout; }
add set inet {T} owners { type ipv6_addr . inet_service; flags timeout; }
add map inet {T} gate4 { type inet_proto . inet_service : verdict; }
add map inet {T} hgate6 { type ipv6_addr . inet_proto . inet_service : verdict; }
add chain inet {T} pm-1
add element inet {T} gate4 { tcp . 9090 : jump pm-1 }
add element inet {T} dnat4 { tcp . 8080 : 10.22.0.5 . 80, udp . 53 : 10.22.0.6 . 5353 }
add element inet {T} hdnat4 { 192.168.1.1 . tcp . 8443 : 10.22.0.5 . 443 }
add element inet {T} dnat6 { tcp . 8080 : fd00:22::5 . 80 }
add element inet {T} own4 { tcp . 8080 : 1234:5678::9, udp . 53 : ::1 }
add element inet {T} hp4-16 { 10.22.0.0 . tcp . 8080 }
add element inet {T} hhp4-16 { 10.22.0.0 . 192.168.1.1 . tcp . 8443 }
add element inet {T} sp4 { tcp . 8080 }
add element inet {T} owners { 1234:5678::9 . 0 comment "n=1;a=10.22.0.5,80,tcp,8080,-,16", ::1 . 0 comment "x" }
add rule inet {T} hairpin ip saddr & 255.255.0.0 . meta l4proto . th dport @hp4-16 meta mark set meta mark | 0x2000
add rule inet {T} hairpin ip saddr & 255.255.0.0 . ip daddr . meta l4proto . th dport @hhp4-16 meta mark set meta mark | 0x2000
add rule inet {T} hairpin ip6 saddr & ffff:ffff:ffff:ffff:: . meta l4proto . th dport @hp6-64 meta mark set meta mark | 0x2000
add rule inet {T} dispatch jump hairpin
add rule inet {T} dispatch ip saddr 127.0.0.1 meta l4proto . th dport @sp4 meta mark set meta mark | 0x2000
add rule inet {T} dispatch ip6 daddr . meta l4proto . th dport vmap @hgate6
add rule inet {T} dispatch meta nfproto ipv4 meta l4proto . th dport vmap @gate4
add rule inet {T} dispatch dnat ip to ip daddr . meta l4proto . th dport map @hdnat4
add rule inet {T} dispatch meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4
add rule inet {T} dispatch meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @dnat6
add rule inet {T} post ct status dnat meta mark & 0x2000 == 0x2000 masquerade
"#;

pub(crate) fn build_flat(b: &mut Batch, t: &str) {
    use KeyPart::{Addr, Port, Proto};
    use KeyType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
    let f = TableFamily::Inet;
    b.add_table(f, t);
    b.add_chain(f, t, "post", nat(Hook::Postrouting, 100), None);
    b.add_chain(f, t, "hairpin", None, None);
    b.add_chain(f, t, "dispatch", None, None);
    let map = |key, data| SetSpec { key, data: SetData::Value(data), timeout: true };
    let set = |key| SetSpec { key, data: SetData::None, timeout: true };
    b.add_set(f, t, "dnat4", map(&[P, S], &[A4, S]), false);
    b.add_set(f, t, "hdnat4", map(&[A4, P, S], &[A4, S]), false);
    b.add_set(f, t, "dnat6", map(&[P, S], &[A6, S]), false);
    b.add_set(f, t, "own4", map(&[P, S], &[A6]), false);
    b.add_set(f, t, "hp4-16", set(&[A4, P, S]), true);
    b.add_set(f, t, "hhp4-16", set(&[A4, A4, P, S]), false);
    b.add_set(f, t, "hp6-64", set(&[A6, P, S]), false);
    b.add_set(f, t, "sp4", set(&[P, S]), false);
    b.add_set(f, t, "owners", set(&[A6, S]), false);
    add_map(b, f, t, "gate4", &[P, S]);
    add_map(b, f, t, "hgate6", &[A6, P, S]);
    b.add_chain(f, t, "pm-1", None, None);
    add_elements(b, f, t, "gate4", &[(vec![Proto(TCP), Port(9090)], jump("pm-1"))], false);
    let val = |k: Vec<KeyPart>, d: Vec<KeyPart>| Elem::new(k, ElemData::Value(d));
    let el = |k: Vec<KeyPart>| Elem::new(k, ElemData::None);
    let (pod4, host) = (ip("10.22.0.5"), ip("192.168.1.1"));
    b.add_elems(
        f,
        t,
        "dnat4",
        &[
            val(vec![Proto(TCP), Port(8080)], vec![Addr(pod4), Port(80)]),
            val(vec![Proto(UDP), Port(53)], vec![Addr(ip("10.22.0.6")), Port(5353)]),
        ],
        false,
    );
    b.add_elems(f, t, "hdnat4", &[val(vec![Addr(host), Proto(TCP), Port(8443)], vec![Addr(pod4), Port(443)])], true);
    b.add_elems(f, t, "dnat6", &[val(vec![Proto(TCP), Port(8080)], vec![Addr(ip("fd00:22::5")), Port(80)])], false);
    let tag = ip("1234:5678::9");
    b.add_elems(
        f,
        t,
        "own4",
        &[val(vec![Proto(TCP), Port(8080)], vec![Addr(tag)]), val(vec![Proto(UDP), Port(53)], vec![Addr(ip("::1"))])],
        false,
    );
    let subnet = ip("10.22.0.0");
    b.add_elems(f, t, "hp4-16", &[el(vec![Addr(subnet), Proto(TCP), Port(8080)])], false);
    b.add_elems(f, t, "hhp4-16", &[el(vec![Addr(subnet), Addr(host), Proto(TCP), Port(8443)])], false);
    b.add_elems(f, t, "sp4", &[el(vec![Proto(TCP), Port(8080)])], false);
    let mut owner = el(vec![Addr(tag), Port(0)]);
    owner.comment = Some("n=1;a=10.22.0.5,80,tcp,8080,-,16".into());
    let mut other = el(vec![Addr(ip("::1")), Port(0)]);
    other.comment = Some("x".into());
    b.add_elems(f, t, "owners", &[owner, other], false);
    let r = || Rule::new(f);
    let m4 = Some(vec![255, 255, 0, 0]);
    let m6 = Some([[0xff; 8], [0; 8]].concat());
    let (sa4, da4, sa6, pr, dp) = (Field::IpSaddr, Field::IpDaddr, Field::Ip6Saddr, Field::L4proto, Field::ThDport);
    add_rule(b, f, t, "hairpin", r().in_set(&[(sa4, m4.clone()), (pr, None), (dp, None)], "hp4-16").mark_or(0x2000));
    add_rule(
        b,
        f,
        t,
        "hairpin",
        r().in_set(&[(sa4, m4), (da4, None), (pr, None), (dp, None)], "hhp4-16").mark_or(0x2000),
    );
    add_rule(b, f, t, "hairpin", r().in_set(&[(sa6, m6), (pr, None), (dp, None)], "hp6-64").mark_or(0x2000));
    add_rule(b, f, t, "dispatch", r().verdict(jump("hairpin")));
    add_rule(b, f, t, "dispatch", r().saddr(ip("127.0.0.1")).in_set(&[(pr, None), (dp, None)], "sp4").mark_or(0x2000));
    add_rule(b, f, t, "dispatch", r().vmap(&[Field::Ip6Daddr, pr, dp], "hgate6"));
    add_rule(b, f, t, "dispatch", r().meta_nfproto(Family::V4).vmap(&[pr, dp], "gate4"));
    add_rule(b, f, t, "dispatch", r().dnat_map(&[da4, pr, dp], "hdnat4", Family::V4));
    add_rule(b, f, t, "dispatch", r().meta_nfproto(Family::V4).dnat_map(&[pr, dp], "dnat4", Family::V4));
    add_rule(b, f, t, "dispatch", r().meta_nfproto(Family::V6).dnat_map(&[pr, dp], "dnat6", Family::V6));
    add_rule(b, f, t, "post", r().ct_status_dnat().mark_has(0x2000).masquerade());
}

/// The MAC spoof check: a bridge port's owner map, its allowed MAC, and the rule that drops
/// every other source MAC on an owned port.
pub(crate) const MACSPOOF: &str = r#"
add table bridge {T}
add chain bridge {T} prerouting { type filter hook prerouting priority -300; policy accept; }
add map bridge {T} port_owner { type ifname : ipv6_addr; flags timeout; }
add set bridge {T} macs { type ifname . ether_addr; flags timeout; }
add element bridge {T} port_owner { "veth1234abcd" : 1234:5678::9 }
add element bridge {T} macs { "veth1234abcd" . 0a:58:0a:00:00:02 }
add rule bridge {T} prerouting iifname @port_owner iifname . ether saddr != @macs drop
"#;

#[test]
fn macspoof_shapes_match_nft() {
    require_root_and_nft();
    in_netns(|| {
        same_as_nft(TableFamily::Bridge, MACSPOOF, |b, t| {
            let f = TableFamily::Bridge;
            b.add_table(f, t);
            let base =
                BaseChain { hook: Hook::Prerouting, priority: -300, kind: ChainType::Filter, policy_accept: true };
            b.add_chain(f, t, "prerouting", Some(base), None);
            let port = KeyPart::Ifname("veth1234abcd".into());
            let owner = SetSpec { key: &[KeyType::Ifname], data: SetData::Value(&[KeyType::Ipv6Addr]), timeout: true };
            b.add_set(f, t, "port_owner", owner, false);
            let macs = SetSpec { key: &[KeyType::Ifname, KeyType::EtherAddr], data: SetData::None, timeout: true };
            b.add_set(f, t, "macs", macs, false);
            let tag = Elem::new(vec![port.clone()], ElemData::Value(vec![KeyPart::Addr(ip("1234:5678::9"))]));
            b.add_elems(f, t, "port_owner", &[tag], false);
            let mac = Elem::new(vec![port, KeyPart::Mac([0x0a, 0x58, 0x0a, 0, 0, 2])], ElemData::None);
            b.add_elems(f, t, "macs", &[mac], false);
            let rule = Rule::new(f)
                .in_set(&[(Field::Iifname, None)], "port_owner")
                .not_in_set(&[Field::Iifname, Field::EtherSaddr], "macs")
                .verdict(Verdict::Drop);
            add_rule(b, f, t, "prerouting", rule);
        })
    });
}

#[test]
fn flat_shapes_match_nft() {
    require_root_and_nft();
    in_netns(|| same_as_nft(TableFamily::Inet, FLAT, build_flat));
}

/// The drop of packets that reach the node's loopback from elsewhere (`route_localnet`), as the
/// portmap table's input chain holds it.
#[test]
fn localnet_drop_matches_nft() {
    require_root_and_nft();
    const TEXT: &str = "
add table inet {T}
add chain inet {T} input { type filter hook input priority 0; policy accept; }
add rule inet {T} input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state invalid,untracked drop
add rule inet {T} input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state ! established,related ct status ! dnat drop
add rule inet {T} input ct status dnat accept
";
    in_netns(|| {
        same_as_nft(TableFamily::Inet, TEXT, |b, t| {
            let f = TableFamily::Inet;
            let lo = net("127.0.0.0/8");
            b.add_table(f, t);
            let base = BaseChain { hook: Hook::Input, priority: 0, kind: ChainType::Filter, policy_accept: true };
            b.add_chain(f, t, "input", Some(base), None);
            let r = || Rule::new(f).daddr_in(lo).saddr_not_in(lo);
            add_rule(b, f, t, "input", r().ct_state_any(CT_INVALID | CT_UNTRACKED).verdict(Verdict::Drop));
            let new = r().ct_state_none(CT_ESTABLISHED | CT_RELATED).ct_status_not_dnat();
            add_rule(b, f, t, "input", new.verdict(Verdict::Drop));
            add_rule(b, f, t, "input", Rule::new(f).ct_status_dnat().verdict(Verdict::Accept));
        })
    });
}
