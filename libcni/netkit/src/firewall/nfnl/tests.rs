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
use std::time::Duration;

/// Each message of a batch: its type (without the subsystem), flags and attributes, for tests
/// that compare them with messages captured from other tools.
pub(crate) fn messages(b: &Batch) -> Vec<(u16, u16, Vec<u8>)> {
    b.msgs.iter().map(|m| (m.ty, m.flags, m.attrs.clone())).collect()
}

/// Privileged tests need root and nft: without them they fail (`cni_tests::require_root`), never
/// pass silently.
fn require_root_and_nft() {
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

fn suffix() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    format!("{:08x}", h.finish() as u32)
}

/// A fresh inet table name for one test, and the guard that deletes the table.
fn inet_table() -> (Family, String, Cleanup) {
    let t = format!("cnirs_nl_{}", suffix());
    (Family::Inet, t.clone(), Cleanup(vec![(Family::Inet, t)]))
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

/// `add map ... { type <key> : verdict; }`.
fn add_map(b: &mut Batch, f: Family, t: &str, name: &str, key: &[KeyType]) {
    b.add_set(f, t, name, SetSpec { key, data: SetData::Verdict, timeout: false }, false);
}

/// `add element` (or `create` when `excl`) of verdict-map elements.
fn add_elements(b: &mut Batch, f: Family, t: &str, map: &str, elems: &[(Vec<KeyPart>, Verdict)], excl: bool) {
    let elems: Vec<Elem> = elems.iter().map(|(k, v)| Elem::new(k.clone(), ElemData::Verdict(v.clone()))).collect();
    b.add_elems(f, t, map, &elems, excl);
}

fn add_rule(b: &mut Batch, f: Family, t: &str, chain: &str, rule: Rule) {
    b.add_rule_with_comment(f, t, chain, rule, None);
}

#[test]
fn flush_and_delete_match_nft() {
    require_root_and_nft();
    in_netns(|| {
        // The state after removing things must be the same too: a flushed chain, a deleted chain,
        // deleted elements.
        let text = format!(
            "{FLAT}\nflush chain inet {{T}} hairpin\nadd chain inet {{T}} gone\ndelete chain inet {{T}} gone\n\
             delete element inet {{T}} dnat4 {{ tcp . 8080, udp . 53 }}\n"
        );
        same_as_nft(Family::Inet, &text, |b, t| {
            build_flat(b, t);
            b.flush_chain(Family::Inet, t, "hairpin");
            b.add_chain(Family::Inet, t, "gone", None, None);
            b.delete_chain(Family::Inet, t, "gone");
            let keys = [vec![KeyPart::Proto(TCP), KeyPart::Port(8080)], vec![KeyPart::Proto(UDP), KeyPart::Port(53)]];
            b.delete_elements(Family::Inet, t, "dnat4", &keys);
        });
    });
}

#[test]
fn a_failed_batch_applies_nothing() {
    require_root_and_nft();
    in_netns(|| {
        let (_, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        build_flat(&mut b, &t);
        add_rule(&mut b, Family::Inet, &t, "no-such-chain", Rule::new(Family::Inet).masquerade());
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
        // send_each tells which message failed: the rule after the table's batch.
        let failures = b.send_each().unwrap();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!((failures[0].index, failures[0].errno), (b.len() - 2, libc::ENOENT));
        assert_eq!(failures[0].error.msg, e.msg);
        assert!(!table_exists(Family::Inet, &t));

        // The same batch without the bad rule applies whole.
        let mut b = Batch::new();
        build_flat(&mut b, &t);
        b.send().unwrap();
        assert!(table_exists(Family::Inet, &t));
    });
}

#[test]
fn errors_name_the_object_and_keep_the_errno() {
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        b.add_table(f, &t);
        b.add_chain(f, &t, "c", None, None);
        add_map(&mut b, f, &t, "m", &[KeyType::Ipv4Addr, KeyType::InetProto, KeyType::InetService]);
        let key = vec![KeyPart::Addr(ip("10.0.0.1")), KeyPart::Proto(TCP), KeyPart::Port(80)];
        add_elements(&mut b, f, &t, "m", &[(key.clone(), jump("c"))], true);
        b.send().unwrap();

        // add: the same element again is fine; create: EEXIST.
        let mut again = Batch::new();
        add_elements(&mut again, f, &t, "m", &[(key.clone(), jump("c"))], false);
        again.send().unwrap();
        let mut create = Batch::new();
        add_elements(&mut create, f, &t, "m", &[(key.clone(), jump("c"))], true);
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

        // A chain in use cannot be deleted: the kernel says EBUSY, the message names it.
        let mut b = Batch::new();
        b.add_chain(f, &t, "user", None, None);
        add_rule(&mut b, f, &t, "user", Rule::new(f).verdict(jump("c")));
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
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
        let mut b = Batch::new();
        b.add_table(f, &t);
        add_map(&mut b, f, &t, "m", &[KeyType::Ipv4Addr]);
        let mut elems = Vec::new();
        for i in 0..1500u32 {
            let chain = format!("c{i}");
            b.add_chain(f, &t, &chain, None, None);
            add_rule(&mut b, f, &t, &chain, Rule::new(f).saddr(IpAddr::V4(i.into())).masquerade());
            elems.push((vec![KeyPart::Addr(IpAddr::V4((0x0a00_0000 + i).into()))], jump(&chain)));
        }
        add_elements(&mut b, f, &t, "m", &elems, false);
        assert!(b.len() > 3000);
        b.send().unwrap();
        let listed = nft(&["list", "map", "inet", &t, "m"], None);
        assert_eq!(listed.matches("jump c").count(), 1500);
    });
}

/// A kernel's refusal keeps its errno as data (not only as the "(os error N)" of its text),
/// through `context` too: read from an NLMSG_ERROR fed through a socket pair, no root needed.
#[test]
fn a_refusal_keeps_its_errno_as_data() {
    let (ours, kernel) = std::os::unix::net::UnixDatagram::pair().unwrap();
    let nl = Exchange::from_fd(std::os::fd::OwnedFd::from(ours));
    let mut answer = Vec::new();
    nlmsg(&mut answer, NLMSG_ERROR, 0, 1, (-libc::EEXIST).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    kernel.send(&answer).unwrap();
    let e = get_on(&nl, Family::Inet, NFT_MSG_NEWTABLE, false, &Attrs::default(), "add table inet t").unwrap_err();
    assert_eq!(e.msg, "nft add table inet t: File exists (os error 17)");
    assert_eq!(e.errno, Some(libc::EEXIST));
    assert!(crate::is_exists(&e.context("ADD")));
    // A message of a batch the kernel refused, as `send` reports it.
    let mut b = Batch::new();
    b.add_table(Family::Inet, "t");
    let e = b.failed(Some(0), libc::ENOENT, Some("no such table".into()));
    assert_eq!(e.msg, "nft add table inet t (no such table): No such file or directory (os error 2)");
    assert!(crate::is_not_found(&e) && !crate::is_exists(&e), "{e:?}");
}

/// A GET reads the answer with its own sequence number and port: a stale refusal (another
/// sequence number) and one to another port are skipped. No root: a socket pair plays the kernel.
#[test]
fn a_get_skips_answers_that_are_not_its_own() {
    let (ours, kernel) = std::os::unix::net::UnixDatagram::pair().unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let nl = Exchange::from_fd(std::os::fd::OwnedFd::from(ours));
    let mut answers = Vec::new();
    nlmsg(&mut answers, NLMSG_ERROR, 0, 7, (-libc::ENOENT).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    nlmsg(&mut answers, NLMSG_ERROR, 0, 1, (-libc::EPERM).to_ne_bytes(), &[0; NLMSG_HDRLEN]);
    answers[16 + 20 + 12..16 + 20 + 16].copy_from_slice(&99u32.to_ne_bytes());
    let mut gen = Attrs::default();
    gen.u32(1, 42);
    nlmsg(&mut answers, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN, 0, 1, [0; 4], &gen.buf);
    kernel.send(&answers).unwrap();
    let got = get_on(&nl, Family::Inet, NFT_MSG_GETGEN, false, &Attrs::default(), "get generation").unwrap();
    let got = got.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, NFT_MSG_NEWGEN);
    assert_eq!(got[0].1, gen.buf);
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
    for e in Rule::new(Family::Inet).fib_daddr_local().verdict(jump("xdnat")).exprs {
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
    let exprs = Rule::new(Family::Ip6).vmap(&[Field::Ip6Daddr, Field::L4proto, Field::ThDport], "m").exprs;
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
    require_root_and_nft();
    in_netns(|| {
        let (f, t, _cleanup) = inet_table();
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
        assert_eq!(
            list_chain(f, &t, "empty").unwrap(),
            Some(ChainListing { base: false, comments: vec![], rules: vec![] })
        );
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
    add_rule(b, f, t, "dispatch", r().meta_nfproto(false).vmap(&[pr, dp], "gate4"));
    add_rule(b, f, t, "dispatch", r().dnat_map(&[da4, pr, dp], "hdnat4", false));
    add_rule(b, f, t, "dispatch", r().meta_nfproto(false).dnat_map(&[pr, dp], "dnat4", false));
    add_rule(b, f, t, "dispatch", r().meta_nfproto(true).dnat_map(&[pr, dp], "dnat6", true));
    add_rule(b, f, t, "post", r().ct_status_dnat().mark_has(0x2000).masquerade());
}

/// The MAC spoof check: a bridge port's owner map, its allowed MAC, and the rule that drops
/// every other source MAC on an owned port.
const MACSPOOF: &str = r#"
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
        same_as_nft(Family::Bridge, MACSPOOF, |b, t| {
            let f = Family::Bridge;
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
    in_netns(|| same_as_nft(Family::Inet, FLAT, build_flat));
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
        same_as_nft(Family::Inet, TEXT, |b, t| {
            let f = Family::Inet;
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

/// get_elements reads one element (data, comment, expiry) or dumps them all; nothing there is
/// empty; an expiry given to an existing element makes it go away by itself.
#[test]
fn get_elements_reads_data_comments_and_expiry() {
    require_root_and_nft();
    in_netns(|| {
        use KeyPart::{Addr, Port, Proto};
        let (f, t, _cleanup) = inet_table();
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
