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
use std::time::{Duration, Instant};

/// Privileged tests need root and nft: without them they fail (`cni_tests::require_root`), never
/// pass silently. Always true when it returns.
fn privileged() -> bool {
    cni_tests::require_root();
    cni_tests::require_tools(&["nft"]);
    true
}

/// Runs `f` on a thread of its own in a fresh network namespace (nft, run from that thread,
/// inherits it).
fn in_netns(f: impl FnOnce() + Send + 'static) {
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

fn suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("{:08x}", h.finish() as u32)
}

fn nft(args: &[&str], stdin: Option<&str>) -> String {
    let out = exec::run("nft", args, stdin).unwrap();
    assert!(out.success, "nft {args:?} failed: {}\n{}", out.stderr, stdin.unwrap_or_default());
    format!("{}{}", out.stdout, out.stderr)
}

fn table_exists(family: Family, table: &str) -> bool {
    exec::run("nft", &["list", "table", family.name(), table], None).unwrap().success
}

/// Deletes the tables when dropped, test failure or not.
struct Cleanup(Vec<(Family, String)>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for (family, table) in &self.0 {
            let _ = exec::run("nft", &["delete", "table", family.name(), table], None);
        }
    }
}

fn normalize_json(v: &mut Value, table: &str) {
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
fn listing(family: Family, table: &str) -> (Value, String) {
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
fn same_as_nft(family: Family, text: &str, build: impl FnOnce(&mut Batch, &str)) {
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

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn jump(c: &str) -> Verdict {
    Verdict::Jump(c.into())
}

fn nat(hook: Hook, priority: i32) -> Option<BaseChain> {
    Some(BaseChain { hook, priority, kind: ChainType::Nat, policy_accept: true })
}

const PORTMAP: &str = r#"
add table inet {T}
add chain inet {T} pre { type nat hook prerouting priority -100; policy accept; }
add chain inet {T} out { type nat hook output priority -100; policy accept; }
add chain inet {T} post { type nat hook postrouting priority 100; policy accept; }
add chain inet {T} dispatch
add chain inet {T} pm-dnat { comment "cni-rs portmap net=n id=c if=eth0"; }
add chain inet {T} pm-snat
add map inet {T} hostports4 { type ipv4_addr . inet_proto . inet_service : verdict; }
add map inet {T} hostports6 { type ipv6_addr . inet_proto . inet_service : verdict; }
add map inet {T} hostports { type inet_proto . inet_service : verdict; }
add map inet {T} snat4 { type ipv4_addr : verdict; }
add map inet {T} snat6 { type ipv6_addr : verdict; }
add element inet {T} hostports4 { 192.168.1.1 . udp . 5353 : jump pm-dnat }
add element inet {T} hostports6 { fd00::1 . tcp . 8443 : goto pm-dnat }
add element inet {T} hostports { tcp . 8080 : jump pm-dnat, sctp . 9 : return }
create element inet {T} snat4 { 10.22.0.5 : jump pm-snat }
add element inet {T} snat6 { fd00:22::5 : jump pm-snat }
add rule inet {T} pre fib daddr type local jump dispatch
add rule inet {T} out fib daddr type local jump dispatch
add rule inet {T} dispatch ip daddr . meta l4proto . th dport vmap @hostports4
add rule inet {T} dispatch ip6 daddr . meta l4proto . th dport vmap @hostports6
add rule inet {T} dispatch meta l4proto . th dport vmap @hostports
add rule inet {T} post ct status dnat ip daddr vmap @snat4
add rule inet {T} post ct status dnat ip6 daddr vmap @snat6
add rule inet {T} pm-dnat meta nfproto ipv4 tcp dport 8080 dnat ip to 10.22.0.5:80
add rule inet {T} pm-dnat ip daddr 192.168.1.1 udp dport 5353 dnat ip to 10.22.0.5:53
add rule inet {T} pm-dnat tcp dport 8080 dnat ip6 to [fd00:22::5]:80
add rule inet {T} pm-dnat meta nfproto ipv6 ip6 daddr fd00::1 tcp dport 8443 dnat ip6 to [fd00:22::5]:443
add rule inet {T} pm-snat ct status dnat ip daddr 10.22.0.5 ip saddr 10.22.0.0/16 meta l4proto tcp ct original proto-dst 8080 masquerade
add rule inet {T} pm-snat ct status dnat ip daddr 10.22.0.5 ip saddr 127.0.0.1 meta l4proto tcp ct original proto-dst 8080 masquerade
add rule inet {T} pm-snat ct status dnat ip daddr 10.22.0.5 ip saddr 10.22.0.0/16 meta l4proto udp ct original proto-dst 5353 ct original ip daddr 192.168.1.1 masquerade
add rule inet {T} pm-snat ct status dnat ip6 daddr fd00:22::5 ip6 saddr fd00:22::/64 meta l4proto tcp ct original proto-dst 8443 ct original ip6 daddr fd00::1 masquerade
"#;

fn build_portmap(b: &mut Batch, t: &str) {
    let f = Family::Inet;
    b.add_table(f, t);
    b.add_chain(f, t, "pre", nat(Hook::Prerouting, -100), None);
    b.add_chain(f, t, "out", nat(Hook::Output, -100), None);
    b.add_chain(f, t, "post", nat(Hook::Postrouting, 100), None);
    b.add_chain(f, t, "dispatch", None, None);
    b.add_chain(f, t, "pm-dnat", None, Some("cni-rs portmap net=n id=c if=eth0"));
    b.add_chain(f, t, "pm-snat", None, None);
    let (a4, a6, proto, port) = (KeyType::Ipv4Addr, KeyType::Ipv6Addr, KeyType::InetProto, KeyType::InetService);
    b.add_map(f, t, "hostports4", &[a4, proto, port]);
    b.add_map(f, t, "hostports6", &[a6, proto, port]);
    b.add_map(f, t, "hostports", &[proto, port]);
    b.add_map(f, t, "snat4", &[a4]);
    b.add_map(f, t, "snat6", &[a6]);
    use KeyPart::{Addr, Port, Proto};
    b.add_elements(f, t, "hostports4", &[(vec![Addr(ip("192.168.1.1")), Proto(UDP), Port(5353)], jump("pm-dnat"))]);
    let goto = Verdict::Goto("pm-dnat".into());
    b.add_elements(f, t, "hostports6", &[(vec![Addr(ip("fd00::1")), Proto(TCP), Port(8443)], goto)]);
    let any = [(vec![Proto(TCP), Port(8080)], jump("pm-dnat")), (vec![Proto(SCTP), Port(9)], Verdict::Return)];
    b.add_elements(f, t, "hostports", &any);
    b.create_elements(f, t, "snat4", &[(vec![Addr(ip("10.22.0.5"))], jump("pm-snat"))]);
    b.add_elements(f, t, "snat6", &[(vec![Addr(ip("fd00:22::5"))], jump("pm-snat"))]);
    let r = || Rule::new(f);
    b.add_rule(f, t, "pre", r().fib_daddr_local().verdict(jump("dispatch")));
    b.add_rule(f, t, "out", r().fib_daddr_local().verdict(jump("dispatch")));
    b.add_rule(f, t, "dispatch", r().vmap(&[Field::IpDaddr, Field::L4proto, Field::ThDport], "hostports4"));
    b.add_rule(f, t, "dispatch", r().vmap(&[Field::Ip6Daddr, Field::L4proto, Field::ThDport], "hostports6"));
    b.add_rule(f, t, "dispatch", r().vmap(&[Field::L4proto, Field::ThDport], "hostports"));
    b.add_rule(f, t, "post", r().ct_status_dnat().vmap(&[Field::IpDaddr], "snat4"));
    b.add_rule(f, t, "post", r().ct_status_dnat().vmap(&[Field::Ip6Daddr], "snat6"));
    let pod4 = ip("10.22.0.5");
    let pod6 = ip("fd00:22::5");
    b.add_rule(f, t, "pm-dnat", r().meta_nfproto(false).dport(TCP, 8080).dnat(pod4, 80));
    b.add_rule(f, t, "pm-dnat", r().daddr(ip("192.168.1.1")).dport(UDP, 5353).dnat(pod4, 53));
    b.add_rule(f, t, "pm-dnat", r().dport(TCP, 8080).dnat(pod6, 80));
    b.add_rule(f, t, "pm-dnat", r().meta_nfproto(true).daddr(ip("fd00::1")).dport(TCP, 8443).dnat(pod6, 443));
    let hairpin = |r: Rule| r.ct_status_dnat().daddr(pod4);
    b.add_rule(
        f,
        t,
        "pm-snat",
        hairpin(r()).saddr_in(net("10.22.0.0/16")).ct_original_proto_dst(TCP, 8080).masquerade(),
    );
    b.add_rule(f, t, "pm-snat", hairpin(r()).saddr(ip("127.0.0.1")).ct_original_proto_dst(TCP, 8080).masquerade());
    b.add_rule(
        f,
        t,
        "pm-snat",
        hairpin(r())
            .saddr_in(net("10.22.0.5/16"))
            .ct_original_proto_dst(UDP, 5353)
            .ct_original_daddr(ip("192.168.1.1"))
            .masquerade(),
    );
    b.add_rule(
        f,
        t,
        "pm-snat",
        r().ct_status_dnat()
            .daddr(pod6)
            .saddr_in(net("fd00:22::/64"))
            .ct_original_proto_dst(TCP, 8443)
            .ct_original_daddr(ip("fd00::1"))
            .masquerade(),
    );
}

#[test]
fn portmap_shapes_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| same_as_nft(Family::Inet, PORTMAP, build_portmap));
}

const MASQ: &str = r#"
add table inet {T}
add chain inet {T} postrouting { type nat hook postrouting priority 100; policy accept; }
add chain inet {T} mq-x { comment "cni-rs masquerade net=n id=c if=eth0"; }
add map inet {T} masq4 { type ipv4_addr : verdict; }
add map inet {T} masq6 { type ipv6_addr : verdict; }
add element inet {T} masq4 { 10.22.0.5 : jump mq-x, 10.22.0.6 : goto mq-x, 10.22.0.7 : accept, 10.22.0.8 : drop }
add element inet {T} masq6 { fd00::5 : jump mq-x }
add rule inet {T} postrouting ip saddr vmap @masq4
add rule inet {T} postrouting ip6 saddr vmap @masq6
add rule inet {T} mq-x ip saddr 10.22.0.5 ip daddr != 10.22.0.0/16 ip daddr != 224.0.0.0/4 masquerade
add rule inet {T} mq-x ip saddr 10.22.0.5 ip daddr != 10.22.0.0/20 ip daddr != 224.0.0.0/4 masquerade
add rule inet {T} mq-x ip saddr 10.22.0.5 ip daddr != 10.22.0.0/24 masquerade
add rule inet {T} mq-x ip6 saddr fd00::5 ip6 daddr != fd00::/64 ip6 daddr != ff00::/8 masquerade
add rule inet {T} mq-x ip6 saddr fd00::5 ip6 daddr != fd00::/60 masquerade
add rule inet {T} mq-x return
"#;

fn build_masq(b: &mut Batch, t: &str) {
    let f = Family::Inet;
    b.add_table(f, t);
    b.add_chain(f, t, "postrouting", nat(Hook::Postrouting, 100), None);
    b.add_chain(f, t, "mq-x", None, Some("cni-rs masquerade net=n id=c if=eth0"));
    b.add_map(f, t, "masq4", &[KeyType::Ipv4Addr]);
    b.add_map(f, t, "masq6", &[KeyType::Ipv6Addr]);
    let k = |s: &str| vec![KeyPart::Addr(ip(s))];
    b.add_elements(
        f,
        t,
        "masq4",
        &[
            (k("10.22.0.5"), jump("mq-x")),
            (k("10.22.0.6"), Verdict::Goto("mq-x".into())),
            (k("10.22.0.7"), Verdict::Accept),
            (k("10.22.0.8"), Verdict::Drop),
        ],
    );
    b.add_elements(f, t, "masq6", &[(k("fd00::5"), jump("mq-x"))]);
    b.add_rule(f, t, "postrouting", Rule::new(f).vmap(&[Field::IpSaddr], "masq4"));
    b.add_rule(f, t, "postrouting", Rule::new(f).vmap(&[Field::Ip6Saddr], "masq6"));
    let pod4 = || Rule::new(f).saddr(ip("10.22.0.5"));
    let multicast4 = net("224.0.0.0/4");
    b.add_rule(f, t, "mq-x", pod4().daddr_not_in(net("10.22.0.5/16")).daddr_not_in(multicast4).masquerade());
    b.add_rule(f, t, "mq-x", pod4().daddr_not_in(net("10.22.0.0/20")).daddr_not_in(multicast4).masquerade());
    b.add_rule(f, t, "mq-x", pod4().daddr_not_in(net("10.22.0.0/24")).masquerade());
    let pod6 = || Rule::new(f).saddr(ip("fd00::5"));
    b.add_rule(f, t, "mq-x", pod6().daddr_not_in(net("fd00::/64")).daddr_not_in(net("ff00::/8")).masquerade());
    b.add_rule(f, t, "mq-x", pod6().daddr_not_in(net("fd00::/60")).masquerade());
    b.add_rule(f, t, "mq-x", Rule::new(f).verdict(Verdict::Return));
}

#[test]
fn masquerade_shapes_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| same_as_nft(Family::Inet, MASQ, build_masq));
}

const MACSPOOF: &str = r#"
add table bridge {T}
add chain bridge {T} prerouting { type filter hook prerouting priority -300; policy accept; comment "cni-rs macspoofchk"; }
add chain bridge {T} ms-x
add map bridge {T} ports { type ifname : verdict; }
add element bridge {T} ports { "veth1234abcd" : jump ms-x, "veth0" : drop }
add rule bridge {T} prerouting iifname vmap @ports
add rule bridge {T} ms-x ether saddr != 0a:58:0a:00:00:02 drop
add rule bridge {T} ms-x iifname "veth1234abcd" ether saddr != 0a:58:0a:00:00:02 drop
add rule bridge {T} ms-x ip saddr 10.0.0.1 accept
add rule bridge {T} ms-x ip6 saddr fd00::/8 accept
"#;

fn build_macspoof(b: &mut Batch, t: &str) {
    let f = Family::Bridge;
    b.add_table(f, t);
    let base = BaseChain { hook: Hook::Prerouting, priority: -300, kind: ChainType::Filter, policy_accept: true };
    b.add_chain(f, t, "prerouting", Some(base), Some("cni-rs macspoofchk"));
    b.add_chain(f, t, "ms-x", None, None);
    b.add_map(f, t, "ports", &[KeyType::Ifname]);
    let port = |n: &str| vec![KeyPart::Ifname(n.into())];
    b.add_elements(f, t, "ports", &[(port("veth1234abcd"), jump("ms-x")), (port("veth0"), Verdict::Drop)]);
    b.add_rule(f, t, "prerouting", Rule::new(f).vmap(&[Field::Iifname], "ports"));
    let mac = crate::parse_mac("0a:58:0a:00:00:02").unwrap();
    b.add_rule(f, t, "ms-x", Rule::new(f).ether_saddr_neq(mac).verdict(Verdict::Drop));
    b.add_rule(f, t, "ms-x", Rule::new(f).iifname("veth1234abcd").ether_saddr_neq(mac).verdict(Verdict::Drop));
    b.add_rule(f, t, "ms-x", Rule::new(f).saddr(ip("10.0.0.1")).verdict(Verdict::Accept));
    b.add_rule(f, t, "ms-x", Rule::new(f).saddr_in(net("fd00::/8")).verdict(Verdict::Accept));
}

#[test]
fn bridge_shapes_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| same_as_nft(Family::Bridge, MACSPOOF, build_macspoof));
}

#[test]
fn ip_and_ip6_tables_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let text = r#"
add table ip {T}
add chain ip {T} input { type filter hook input priority 0; policy accept; }
add map ip {T} ports { type ipv4_addr . inet_service : verdict; }
add rule ip {T} input ip saddr 10.0.0.0/8 tcp dport 22 accept
add rule ip {T} input ip daddr . th dport vmap @ports
"#;
        same_as_nft(Family::Ip, text, |b, t| {
            let f = Family::Ip;
            b.add_table(f, t);
            let base = BaseChain { hook: Hook::Input, priority: 0, kind: ChainType::Filter, policy_accept: true };
            b.add_chain(f, t, "input", Some(base), None);
            b.add_map(f, t, "ports", &[KeyType::Ipv4Addr, KeyType::InetService]);
            b.add_rule(f, t, "input", Rule::new(f).saddr_in(net("10.0.0.0/8")).dport(TCP, 22).verdict(Verdict::Accept));
            b.add_rule(f, t, "input", Rule::new(f).vmap(&[Field::IpDaddr, Field::ThDport], "ports"));
        });
        let text = r#"
add table ip6 {T}
add chain ip6 {T} forward_c { type filter hook forward priority 10; policy drop; }
add rule ip6 {T} forward_c ip6 saddr fd00::/8 udp dport 53 accept
"#;
        same_as_nft(Family::Ip6, text, |b, t| {
            let f = Family::Ip6;
            b.add_table(f, t);
            let base = BaseChain { hook: Hook::Forward, priority: 10, kind: ChainType::Filter, policy_accept: false };
            b.add_chain(f, t, "forward_c", Some(base), None);
            b.add_rule(
                f,
                t,
                "forward_c",
                Rule::new(f).saddr_in(net("fd00::/8")).dport(UDP, 53).verdict(Verdict::Accept),
            );
        });
    });
}

const SHARED: &str = r#"
add table inet {T}
add map inet {T} anyports4 { type inet_proto . inet_service : verdict; }
add map inet {T} anyports6 { type inet_proto . inet_service : verdict; }
add map inet {T} hostports6 { type ipv6_addr . inet_proto . inet_service : verdict; }
add chain inet {T} dispatch
add chain inet {T} prerouting { type nat hook prerouting priority -100; policy accept; }
flush chain inet {T} dispatch
add rule inet {T} dispatch meta nfproto ipv4 meta l4proto . th dport vmap @anyports4
add rule inet {T} dispatch meta nfproto ipv6 meta l4proto . th dport vmap @anyports6
add rule inet {T} dispatch ip6 daddr . meta l4proto . th dport vmap @hostports6
add rule inet {T} prerouting fib daddr type local jump dispatch
create chain inet {T} pm-1-dnat { comment "cni-rs portmap net=n id=c if=eth0"; }
create chain inet {T} pm-1-post
add rule inet {T} pm-1-dnat meta nfproto ipv4 tcp dport 8080 dnat ip to 10.22.0.5:80 comment "anyports4=tcp . 8080;snat4=10.22.0.5"
add rule inet {T} pm-1-dnat meta nfproto ipv6 ip6 daddr fd00::1 udp dport 53 dnat ip6 to [fd00:22::5]:5353 comment "hostports6=fd00::1 . udp . 53"
add element inet {T} anyports4 { tcp . 8080 : jump pm-1-dnat }
add element inet {T} hostports6 { fd00::1 . udp . 53 : jump pm-1-dnat }
"#;

fn build_shared(b: &mut Batch, t: &str) {
    let f = Family::Inet;
    let (proto, port) = (KeyType::InetProto, KeyType::InetService);
    b.add_table(f, t);
    b.add_map(f, t, "anyports4", &[proto, port]);
    b.add_map(f, t, "anyports6", &[proto, port]);
    b.add_map(f, t, "hostports6", &[KeyType::Ipv6Addr, proto, port]);
    b.add_chain(f, t, "dispatch", None, None);
    b.add_chain(f, t, "prerouting", nat(Hook::Prerouting, -100), None);
    b.flush_chain(f, t, "dispatch");
    let r = || Rule::new(f);
    b.add_rule(f, t, "dispatch", r().meta_nfproto(false).vmap(&[Field::L4proto, Field::ThDport], "anyports4"));
    b.add_rule(f, t, "dispatch", r().meta_nfproto(true).vmap(&[Field::L4proto, Field::ThDport], "anyports6"));
    b.add_rule(f, t, "dispatch", r().vmap(&[Field::Ip6Daddr, Field::L4proto, Field::ThDport], "hostports6"));
    b.add_rule(f, t, "prerouting", r().fib_daddr_local().verdict(jump("dispatch")));
    b.create_chain(f, t, "pm-1-dnat", None, Some("cni-rs portmap net=n id=c if=eth0"));
    b.create_chain(f, t, "pm-1-post", None, None);
    let dnat4 = r().meta_nfproto(false).dport(TCP, 8080).dnat(ip("10.22.0.5"), 80);
    b.add_rule_with_comment(f, t, "pm-1-dnat", dnat4, Some("anyports4=tcp . 8080;snat4=10.22.0.5"));
    let dnat6 = r().meta_nfproto(true).daddr(ip("fd00::1")).dport(UDP, 53).dnat(ip("fd00:22::5"), 5353);
    b.add_rule_with_comment(f, t, "pm-1-dnat", dnat6, Some("hostports6=fd00::1 . udp . 53"));
    use KeyPart::{Addr, Port, Proto};
    b.add_elements(f, t, "anyports4", &[(vec![Proto(TCP), Port(8080)], jump("pm-1-dnat"))]);
    b.add_elements(f, t, "hostports6", &[(vec![Addr(ip("fd00::1")), Proto(UDP), Port(53)], jump("pm-1-dnat"))]);
}

/// The shapes of the shared-chain layout: explicit `meta nfproto` before a concatenation,
/// `create chain`, rule comments.
#[test]
fn shared_chain_shapes_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| same_as_nft(Family::Inet, SHARED, build_shared));
    in_netns(|| {
        // create chain: EEXIST the second time; a comment too long for the kernel fails the batch.
        let f = Family::Inet;
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(f, t.clone())]);
        let mut b = Batch::new();
        build_shared(&mut b, &t);
        b.send().unwrap();
        let mut again = Batch::new();
        again.create_chain(f, &t, "pm-1-post", None, None);
        let e = again.send().unwrap_err();
        assert!(crate::is_exists(&e), "{e:?}");
        assert_eq!(e.msg, format!("nft create chain inet {t} pm-1-post: File exists (os error 17)"));
        let mut long = Batch::new();
        long.add_rule_with_comment(f, &t, "pm-1-post", Rule::new(f).masquerade(), Some(&"x".repeat(300)));
        let e = long.send().unwrap_err();
        assert!(e.msg.contains("comment of 300 bytes"), "{e:?}");
    });
}

#[test]
fn flush_and_delete_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        // The state after removing things must be the same too: a flushed chain, a deleted chain,
        // deleted elements.
        let text = format!(
            "{MASQ}\nflush chain inet {{T}} mq-x\nadd chain inet {{T}} gone\ndelete chain inet {{T}} gone\n\
             delete element inet {{T}} masq4 {{ 10.22.0.6, 10.22.0.7 }}\n"
        );
        same_as_nft(Family::Inet, &text, |b, t| {
            build_masq(b, t);
            b.flush_chain(Family::Inet, t, "mq-x");
            b.add_chain(Family::Inet, t, "gone", None, None);
            b.delete_chain(Family::Inet, t, "gone");
            let keys = [vec![KeyPart::Addr(ip("10.22.0.6"))], vec![KeyPart::Addr(ip("10.22.0.7"))]];
            b.delete_elements(Family::Inet, t, "masq4", &keys);
        });
    });
}

#[test]
fn a_failed_batch_applies_nothing() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(Family::Inet, t.clone())]);
        let mut b = Batch::new();
        build_masq(&mut b, &t);
        b.add_rule(Family::Inet, &t, "no-such-chain", Rule::new(Family::Inet).masquerade());
        b.add_chain(Family::Inet, &t, "after", None, None);
        let e = b.send().unwrap_err();
        assert_eq!(e.code, libcni::code::NETWORK);
        assert_eq!(
            e.msg,
            format!("nft add rule inet {t} no-such-chain: No such file or directory (os error 2)"),
            "{e:?}"
        );
        assert!(crate::is_not_found(&e));
        assert!(!table_exists(Family::Inet, &t), "a failed batch left its table behind");
        // send_each tells which message failed: the rule after the masquerade batch.
        let failures = b.send_each().unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!((failures[0].index, failures[0].errno), (b.len() - 2, libc::ENOENT));
        assert_eq!(failures[0].error.msg, e.msg);
        assert!(!table_exists(Family::Inet, &t));

        // The same batch without the bad rule applies whole.
        let mut b = Batch::new();
        build_masq(&mut b, &t);
        b.send().unwrap();
        assert!(table_exists(Family::Inet, &t));
    });
}

#[test]
fn errors_name_the_object_and_keep_the_errno() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let f = Family::Inet;
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(f, t.clone())]);
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_chain(f, &t, "c", None, None);
        b.add_map(f, &t, "m", &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService]);
        let key = vec![KeyPart::Addr(ip("10.0.0.1")), KeyPart::Proto(TCP), KeyPart::Port(80)];
        b.create_elements(f, &t, "m", &[(key.clone(), jump("c"))]);
        b.send().unwrap();

        // add: the same element again is fine; create: EEXIST.
        let mut again = Batch::new();
        again.add_elements(f, &t, "m", &[(key.clone(), jump("c"))]);
        again.send().unwrap();
        let mut create = Batch::new();
        create.create_elements(f, &t, "m", &[(key.clone(), jump("c"))]);
        let e = create.send().unwrap_err();
        assert!(crate::is_exists(&e), "{e:?}");
        assert_eq!(
            e.msg,
            format!("nft create element inet {t} m {{ 10.0.0.1 . tcp . 80 }}: File exists (os error 17)")
        );

        // Deleting what is not there: ENOENT, naming the chain.
        let mut del = Batch::new();
        del.delete_chain(f, &t, "missing");
        let e = del.send().unwrap_err();
        assert_eq!(crate::errno(&e), Some(libc::ENOENT), "{e:?}");
        assert_eq!(e.msg, format!("nft delete chain inet {t} missing: No such file or directory (os error 2)"));
        let mut del = Batch::new();
        del.delete_elements(f, &t, "m", &[vec![KeyPart::Addr(ip("10.0.0.2")), KeyPart::Proto(TCP), KeyPart::Port(80)]]);
        assert!(crate::is_not_found(&del.send().unwrap_err()));

        // destroy (Linux 6.3+): absent is success, present is removed.
        let mut destroy = Batch::new();
        destroy.destroy_chain(f, &t, "missing");
        destroy.destroy_elements(f, &t, "m", std::slice::from_ref(&key));
        destroy.destroy_elements(f, &t, "m", &[key]);
        match destroy.send() {
            Ok(()) => {
                let listed = nft(&["list", "map", "inet", &t, "m"], None);
                assert!(!listed.contains("10.0.0.1"), "{listed}");
            }
            Err(e) if matches!(crate::errno(&e), Some(libc::EOPNOTSUPP | libc::EINVAL)) => {
                eprintln!("NOTE: no destroy messages on this kernel: {e}");
            }
            Err(e) => panic!("{e:?}"),
        }

        // A chain in use cannot be deleted: the kernel says EBUSY, the message names it.
        let mut b = Batch::new();
        b.add_chain(f, &t, "user", None, None);
        b.add_rule(f, &t, "user", Rule::new(f).verdict(jump("c")));
        b.send().unwrap();
        let mut del = Batch::new();
        del.delete_chain(f, &t, "c");
        let e = del.send().unwrap_err();
        assert_eq!(crate::errno(&e), Some(libc::EBUSY), "{e:?}");
        assert!(e.msg.starts_with(&format!("nft delete chain inet {t} c")), "{e:?}");
    });
}

#[test]
fn a_large_batch_loses_no_acks() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let f = Family::Inet;
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(f, t.clone())]);
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_map(f, &t, "m", &[KeyType::Ipv4Addr]);
        let mut elems = Vec::new();
        for i in 0..1500u32 {
            let chain = format!("c{i}");
            b.add_chain(f, &t, &chain, None, None);
            b.add_rule(f, &t, &chain, Rule::new(f).saddr(IpAddr::V4(i.into())).masquerade());
            elems.push((vec![KeyPart::Addr(IpAddr::V4((0x0a00_0000 + i).into()))], jump(&chain)));
        }
        b.add_elements(f, &t, "m", &elems);
        assert!(b.len() > 3000);
        b.send().unwrap();
        let listed = nft(&["list", "map", "inet", &t, "m"], None);
        assert_eq!(listed.matches("jump c").count(), 1500);
    });
}

/// Pod `i`'s chains, host port and address.
fn pod(i: u32) -> (String, u16, IpAddr) {
    (format!("pm-{i}"), 10000 + i as u16, IpAddr::V4([10, 23, (i / 250) as u8, (i % 250 + 2) as u8].into()))
}

/// A typical ADD (portmap, one mapping, snat): the pod's chains created empty (or emptied), filled,
/// and their map elements added; 10 messages.
fn typical_add(b: &mut Batch, t: &str, i: u32) {
    let f = Family::Inet;
    let (base, port, addr) = pod(i);
    let (dnat, snat) = (format!("{base}-dnat"), format!("{base}-snat"));
    b.add_table(f, t);
    b.add_chain(f, t, &dnat, None, Some("cni-rs portmap net=n id=c if=eth0"));
    b.add_chain(f, t, &snat, None, None);
    b.flush_chain(f, t, &dnat);
    b.flush_chain(f, t, &snat);
    b.add_rule(f, t, &dnat, Rule::new(f).meta_nfproto(false).dport(TCP, port).dnat(addr, 80));
    let hairpin = || Rule::new(f).ct_status_dnat().daddr(addr);
    b.add_rule(f, t, &snat, hairpin().saddr_in(net("10.22.0.0/16")).ct_original_proto_dst(TCP, port).masquerade());
    b.add_rule(f, t, &snat, hairpin().saddr(ip("127.0.0.1")).ct_original_proto_dst(TCP, port).masquerade());
    use KeyPart::{Addr, Port, Proto};
    b.add_elements(f, t, "hostports", &[(vec![Proto(TCP), Port(port)], jump(&dnat))]);
    b.add_elements(f, t, "snat4", &[(vec![Addr(addr)], jump(&snat))]);
}

fn typical_add_text(t: &str, i: u32) -> String {
    let (base, port, addr) = pod(i);
    format!(
        r#"add table inet {t}
add chain inet {t} {base}-dnat {{ comment "cni-rs portmap net=n id=c if=eth0"; }}
add chain inet {t} {base}-snat
flush chain inet {t} {base}-dnat
flush chain inet {t} {base}-snat
add rule inet {t} {base}-dnat meta nfproto ipv4 tcp dport {port} dnat ip to {addr}:80
add rule inet {t} {base}-snat ct status dnat ip daddr {addr} ip saddr 10.22.0.0/16 meta l4proto tcp ct original proto-dst {port} masquerade
add rule inet {t} {base}-snat ct status dnat ip daddr {addr} ip saddr 127.0.0.1 meta l4proto tcp ct original proto-dst {port} masquerade
add element inet {t} hostports {{ tcp . {port} : jump {base}-dnat }}
add element inet {t} snat4 {{ {addr} : jump {base}-snat }}
"#
    )
}

/// The matching DEL: the elements by key, the chains emptied and deleted; 6 messages.
fn typical_del(b: &mut Batch, t: &str, i: u32) {
    let f = Family::Inet;
    let (base, port, addr) = pod(i);
    b.delete_elements(f, t, "hostports", &[vec![KeyPart::Proto(TCP), KeyPart::Port(port)]]);
    b.delete_elements(f, t, "snat4", &[vec![KeyPart::Addr(addr)]]);
    for suffix in ["dnat", "snat"] {
        b.flush_chain(f, t, &format!("{base}-{suffix}"));
    }
    for suffix in ["dnat", "snat"] {
        b.delete_chain(f, t, &format!("{base}-{suffix}"));
    }
}

fn typical_del_text(t: &str, i: u32) -> String {
    let (base, port, addr) = pod(i);
    format!(
        "delete element inet {t} hostports {{ tcp . {port} }}\ndelete element inet {t} snat4 {{ {addr} }}\n\
         flush chain inet {t} {base}-dnat\nflush chain inet {t} {base}-snat\n\
         delete chain inet {t} {base}-dnat\ndelete chain inet {t} {base}-snat\n"
    )
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Times a typical ADD batch and its DEL through netlink and through `nft -f -`, a new pod each
/// time, on tables holding the shared chains and maps (printed; `--nocapture` shows it). Both
/// ways must leave the same tables.
#[test]
fn typical_batch_timing() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let sfx = suffix();
        let (t_nft, t_nl) = (format!("cnirs_nft_{sfx}"), format!("cnirs_nl_{sfx}"));
        let _cleanup = Cleanup(vec![(Family::Inet, t_nft.clone()), (Family::Inet, t_nl.clone())]);
        for t in [&t_nft, &t_nl] {
            let mut b = Batch::new();
            build_portmap(&mut b, t);
            b.send().unwrap();
        }
        const RUNS: u32 = 40;
        let (mut add_nft, mut add_nl, mut del_nft, mut del_nl, mut encode) = (vec![], vec![], vec![], vec![], vec![]);
        let mut msgs = (0, 0);
        for i in 0..RUNS {
            let text = typical_add_text(&t_nft, i);
            let start = Instant::now();
            nft(&["-f", "-"], Some(&text));
            add_nft.push(start.elapsed());
            let start = Instant::now();
            let mut b = Batch::new();
            typical_add(&mut b, &t_nl, i);
            let bytes = b.encode(1).unwrap();
            encode.push(start.elapsed());
            assert!(!bytes.is_empty());
            b.send().unwrap();
            add_nl.push(start.elapsed());
            msgs.0 = b.len();
        }
        let (json_nft, debug_nft) = listing(Family::Inet, &t_nft);
        let (json_nl, debug_nl) = listing(Family::Inet, &t_nl);
        assert_eq!(debug_nl, debug_nft);
        assert_eq!(json_nl, json_nft);
        for i in 0..RUNS {
            let text = typical_del_text(&t_nft, i);
            let start = Instant::now();
            nft(&["-f", "-"], Some(&text));
            del_nft.push(start.elapsed());
            let start = Instant::now();
            let mut b = Batch::new();
            typical_del(&mut b, &t_nl, i);
            b.send().unwrap();
            del_nl.push(start.elapsed());
            msgs.1 = b.len();
        }
        let (json_nft, debug_nft) = listing(Family::Inet, &t_nft);
        let (json_nl, debug_nl) = listing(Family::Inet, &t_nl);
        assert_eq!(debug_nl, debug_nft);
        assert_eq!(json_nl, json_nft);
        let (a_nft, a_nl, d_nft, d_nl) = (median(add_nft), median(add_nl), median(del_nft), median(del_nl));
        eprintln!(
            "median of {RUNS}, a new pod each: ADD ({} messages) nft -f - {:.2} ms, netlink {:.3} ms ({:.0}x; \
             building and encoding {:.1} us); DEL ({} messages) nft -f - {:.2} ms, netlink {:.2} ms",
            msgs.0,
            ms(a_nft),
            ms(a_nl),
            a_nft.as_secs_f64() / a_nl.as_secs_f64(),
            median(encode).as_secs_f64() * 1e6,
            msgs.1,
            ms(d_nft),
            ms(d_nl),
        );
    });
}

#[test]
fn encoding_matches_nft_bytes() {
    // `nft --debug=mnl add table inet zz_probe`: the NEWTABLE message after the batch begin.
    let mut b = Batch::new();
    b.add_table(Family::Inet, "zz_probe");
    let bytes = b.encode(0).unwrap();
    let begin = &bytes[..20];
    assert_eq!(begin[..4], 20u32.to_ne_bytes());
    assert_eq!(begin[4..6], 0x10u16.to_ne_bytes());
    assert_eq!(begin[16..20], [0, 0, 0, 10]);
    let msg = &bytes[20..64];
    assert_eq!(msg[..4], 44u32.to_ne_bytes());
    assert_eq!(msg[4..6], 0x0a00u16.to_ne_bytes());
    assert_eq!(
        msg[16..],
        [
            1, 0, 0, 0, // nfgenmsg: NFPROTO_INET
            13, 0, 1, 0, b'z', b'z', b'_', b'p', b'r', b'o', b'b', b'e', 0, 0, 0, 0, // NFTA_TABLE_NAME
            8, 0, 2, 0, 0, 0, 0, 0, // NFTA_TABLE_FLAGS 0
        ]
    );
    assert_eq!(bytes.len(), 20 + 44 + 20);

    // `add rule ... fib daddr type local jump xdnat`: the expressions nft sent, attribute by attribute.
    let mut a = Attrs::default();
    for e in Rule::new(Family::Inet).fib_daddr_local().verdict(jump("xdnat")).build() {
        e.put(&mut a);
    }
    let mut want: Vec<u8> = Vec::new();
    let attr = |ty: u16, len: u16, out: &mut Vec<u8>| {
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&ty.to_ne_bytes());
    };
    // fib: name, data { FLAGS 2, RESULT 3, DREG 1 }
    attr(0x8001, 40, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(b"fib\0");
    attr(0x8002, 28, &mut want);
    for (ty, v) in [(3u16, 2u32), (2, 3), (1, 1)] {
        attr(ty, 8, &mut want);
        want.extend_from_slice(&v.to_be_bytes());
    }
    // cmp: name, data { SREG 1, OP eq, DATA { VALUE 02 00 00 00 } }
    attr(0x8001, 44, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(b"cmp\0");
    attr(0x8002, 32, &mut want);
    for (ty, v) in [(1u16, 1u32), (2, 0)] {
        attr(ty, 8, &mut want);
        want.extend_from_slice(&v.to_be_bytes());
    }
    attr(0x8003, 12, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&2u32.to_ne_bytes());
    // immediate: name, data { DREG 0, DATA { VERDICT { CODE -3, CHAIN "xdnat" } } }
    attr(0x8001, 60, &mut want);
    attr(1, 14, &mut want);
    want.extend_from_slice(b"immediate\0\0\0");
    attr(0x8002, 40, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&0u32.to_be_bytes());
    attr(0x8002, 28, &mut want);
    attr(0x8002, 24, &mut want);
    attr(1, 8, &mut want);
    want.extend_from_slice(&(-3i32).to_be_bytes());
    attr(2, 10, &mut want);
    want.extend_from_slice(b"xdnat\0\0\0");
    assert_eq!(a.buf, want);
}

#[test]
fn registers_and_keys() {
    assert_eq!(Reg::slot(0), Reg(1));
    assert_eq!(Reg::slot(1), Reg(9));
    assert_eq!(Reg::slot(4), Reg(2));
    assert_eq!(Reg::slot(5), Reg(13));
    let key = [KeyPart::Addr(ip("10.0.0.1")), KeyPart::Proto(TCP), KeyPart::Port(8080)];
    assert_eq!(key_bytes(&key), [10, 0, 0, 1, 6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
    assert_eq!(key_bytes(&[KeyPart::Port(80)]), [0, 80]);
    assert_eq!(key_text(&key), "10.0.0.1 . tcp . 8080");
    // ip6 daddr . meta l4proto . th dport: registers 1, 2 and 13 (slots 0, 4, 5).
    let exprs = Rule::new(Family::Ip6).vmap(&[Field::Ip6Daddr, Field::L4proto, Field::ThDport], "m").build();
    let regs: Vec<Reg> = exprs
        .iter()
        .filter_map(|e| match e {
            Expr::Payload { dreg, .. } | Expr::Meta { dreg, .. } => Some(*dreg),
            _ => None,
        })
        .collect();
    assert_eq!(regs, [Reg(1), Reg(2), Reg(13)]);
}

#[test]
fn an_empty_batch_sends_nothing() {
    assert!(Batch::new().send().is_ok());
}

/// list_chain reads what nft lists: each rule's comment (or none), base chain or not, and None
/// for an absent chain or table.
#[test]
fn list_chain_reads_rule_comments() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        let f = Family::Inet;
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(f, t.clone())]);
        assert_eq!(list_chain(f, &t, "c").unwrap(), None);
        let text = r#"
add table inet {T}
add chain inet {T} base { type nat hook postrouting priority 100; policy accept; }
add chain inet {T} c { comment "cni-rs masquerade"; }
add chain inet {T} empty
add rule inet {T} c ip saddr 10.0.0.1 masquerade comment "masq4=10.0.0.1"
add rule inet {T} c ip saddr 10.0.0.2 masquerade
add rule inet {T} c meta nfproto ipv4 tcp dport 8080 dnat ip to 10.0.0.3:80 comment "anyports4=tcp . 8080;snat4=10.0.0.3"
add rule inet {T} base ip saddr 10.0.0.1 masquerade comment "x"
"#;
        nft(&["-f", "-"], Some(&text.replace("{T}", &t)));
        let c = list_chain(f, &t, "c").unwrap().unwrap();
        assert!(!c.base);
        assert_eq!(
            c.comments,
            vec![Some("masq4=10.0.0.1".to_string()), None, Some("anyports4=tcp . 8080;snat4=10.0.0.3".to_string())]
        );
        assert_eq!(list_chain(f, &t, "empty").unwrap(), Some(ChainListing { base: false, comments: vec![] }));
        let base = list_chain(f, &t, "base").unwrap().unwrap();
        assert!(base.base);
        assert_eq!(base.comments, vec![Some("x".to_string())]);
        assert_eq!(list_chain(f, &t, "nosuch").unwrap(), None);
        assert_eq!(list_chain(Family::Bridge, &t, "c").unwrap(), None);
        // A comment written by a batch reads back the same; many rules take several messages.
        let mut b = Batch::new();
        for i in 0..300u32 {
            let rule = Rule::new(f).saddr(IpAddr::V4(i.into())).masquerade();
            b.add_rule_with_comment(f, &t, "empty", rule, Some(&format!("masq4={}", std::net::Ipv4Addr::from(i))));
        }
        b.send().unwrap();
        let many = list_chain(f, &t, "empty").unwrap().unwrap();
        assert_eq!(many.comments.len(), 300);
        assert_eq!(many.comments[299].as_deref(), Some("masq4=0.0.1.43"));
    });
}

const FLAT: &str = r#"
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
add rule inet {T} dispatch dnat ip to ip daddr . meta l4proto . th dport map @hdnat4
add rule inet {T} dispatch meta nfproto ipv4 dnat ip to meta l4proto . th dport map @dnat4
add rule inet {T} dispatch meta nfproto ipv6 dnat ip6 to meta l4proto . th dport map @dnat6
add rule inet {T} post meta mark & 0x2000 == 0x2000 masquerade
"#;

fn build_flat(b: &mut Batch, t: &str) {
    use KeyPart::{Addr, Port, Proto};
    use KeyType::{InetProto as P, InetService as S, Ipv4Addr as A4, Ipv6Addr as A6};
    let f = Family::Inet;
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
    b.add_rule(f, t, "hairpin", r().in_set(&[(sa4, m4.clone()), (pr, None), (dp, None)], "hp4-16").mark_or(0x2000));
    b.add_rule(
        f,
        t,
        "hairpin",
        r().in_set(&[(sa4, m4), (da4, None), (pr, None), (dp, None)], "hhp4-16").mark_or(0x2000),
    );
    b.add_rule(f, t, "hairpin", r().in_set(&[(sa6, m6), (pr, None), (dp, None)], "hp6-64").mark_or(0x2000));
    b.add_rule(f, t, "dispatch", r().verdict(jump("hairpin")));
    b.add_rule(f, t, "dispatch", r().saddr(ip("127.0.0.1")).in_set(&[(pr, None), (dp, None)], "sp4").mark_or(0x2000));
    b.add_rule(f, t, "dispatch", r().dnat_map(&[da4, pr, dp], "hdnat4", false));
    b.add_rule(f, t, "dispatch", r().meta_nfproto(false).dnat_map(&[pr, dp], "dnat4", false));
    b.add_rule(f, t, "dispatch", r().meta_nfproto(true).dnat_map(&[pr, dp], "dnat6", true));
    b.add_rule(f, t, "post", r().mark_has(0x2000).masquerade());
}

#[test]
fn flat_shapes_match_nft() {
    if !privileged() {
        return;
    }
    in_netns(|| same_as_nft(Family::Inet, FLAT, build_flat));
}

/// The drop of packets that reach the node's loopback from elsewhere (`route_localnet`), as the
/// portmap table's input chain holds it.
#[test]
fn localnet_drop_matches_nft() {
    if !privileged() {
        return;
    }
    const TEXT: &str = "
add table inet {T}
add chain inet {T} input { type filter hook input priority 0; policy accept; }
add rule inet {T} input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state invalid,untracked drop
add rule inet {T} input ip daddr 127.0.0.0/8 ip saddr != 127.0.0.0/8 ct state ! established,related ct status ! dnat drop
add rule inet {T} input ct status dnat accept
";
    in_netns(|| {
        same_as_nft(Family::Inet, TEXT, |b, t| {
            let f = Family::Inet;
            let lo = net("127.0.0.0/8");
            b.add_table(f, t);
            let base = BaseChain { hook: Hook::Input, priority: 0, kind: ChainType::Filter, policy_accept: true };
            b.add_chain(f, t, "input", Some(base), None);
            let r = || Rule::new(f).daddr_in(lo).saddr_not_in(lo);
            b.add_rule(f, t, "input", r().ct_state_any(CT_INVALID | CT_UNTRACKED).verdict(Verdict::Drop));
            let new = r().ct_state_none(CT_ESTABLISHED | CT_RELATED).ct_status_not_dnat();
            b.add_rule(f, t, "input", new.verdict(Verdict::Drop));
            b.add_rule(f, t, "input", Rule::new(f).ct_status_dnat().verdict(Verdict::Accept));
        })
    });
}

/// get_elements reads one element (data, comment, expiry) or dumps them all; nothing there is
/// empty; an expiry given to an existing element makes it go away by itself.
#[test]
fn get_elements_reads_data_comments_and_expiry() {
    if !privileged() {
        return;
    }
    in_netns(|| {
        use KeyPart::{Addr, Port, Proto};
        let f = Family::Inet;
        let t = format!("cnirs_nl_{}", suffix());
        let _cleanup = Cleanup(vec![(f, t.clone())]);
        let key = vec![Proto(TCP), Port(8080)];
        assert_eq!(get_elements(f, &t, "dnat4", Some(&key)).unwrap(), vec![]);
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_set(
            f,
            &t,
            "dnat4",
            SetSpec {
                key: &[KeyType::InetProto, KeyType::InetService],
                data: SetData::Value(&[KeyType::Ipv4Addr, KeyType::InetService]),
                timeout: true,
            },
            false,
        );
        let mut e = Elem::new(key.clone(), ElemData::Value(vec![Addr(ip("10.0.0.5")), Port(80)]));
        e.comment = Some("owner".into());
        let many: Vec<Elem> = (1..=300u16)
            .map(|p| Elem::new(vec![Proto(UDP), Port(p)], ElemData::Value(vec![Addr(ip("10.0.0.6")), Port(p)])))
            .collect();
        b.add_elems(f, &t, "dnat4", &[e.clone()], false);
        b.add_elems(f, &t, "dnat4", &many, false);
        b.send().unwrap();
        let got = get_elements(f, &t, "dnat4", Some(&key)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].key, vec![6, 0, 0, 0, 0x1f, 0x90, 0, 0]);
        assert_eq!(got[0].data, Some(vec![10, 0, 0, 5, 0, 80, 0, 0]));
        assert_eq!(got[0].comment.as_deref(), Some("owner"));
        assert_eq!(got[0].expires_ms, None);
        assert_eq!(get_elements(f, &t, "dnat4", None).unwrap().len(), 301);
        assert_eq!(get_elements(f, &t, "dnat4", Some(&[Proto(TCP), Port(1)])).unwrap(), vec![]);
        assert_eq!(get_elements(f, &t, "nosuch", Some(&key)).unwrap(), vec![]);
        // Re-adding it with an expiry (same data) makes it expire: gone without a delete.
        e.expires_ms = Some(50);
        let mut b = Batch::new();
        b.add_elems(f, &t, "dnat4", &[e.clone()], false);
        b.send().unwrap();
        let soon = get_elements(f, &t, "dnat4", Some(&key)).unwrap();
        assert!(soon.is_empty() || soon[0].expires_ms.is_some_and(|ms| ms <= 50), "{soon:?}");
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(get_elements(f, &t, "dnat4", Some(&key)).unwrap(), vec![]);
        // Other data for the same key is a clash.
        let mut b = Batch::new();
        b.add_elems(
            f,
            &t,
            "dnat4",
            &[Elem::new(vec![Proto(UDP), Port(1)], ElemData::Value(vec![Addr(ip("10.0.0.7")), Port(1)]))],
            false,
        );
        let err = b.send().unwrap_err();
        assert_eq!(crate::errno(&err), Some(libc::EEXIST), "{err:?}");
    });
}
