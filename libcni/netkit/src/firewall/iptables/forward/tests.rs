//! The plan over iptables-save text, and the encoding of every rule shape against the messages
//! iptables-nft 1.8.9 sent (iptables-nft-1.8.9.txt, captured on Debian 12 with strace).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::iptables::transport::changed;
use crate::firewall::iptables::NatTable;
use crate::firewall::nfnl::TableFamily;
use std::collections::BTreeMap;

/// iptables-save text as a table to plan over.
impl View for NatTable {
    fn has_chain(&self, chain: &str) -> bool {
        self.chains.contains(chain)
    }
    fn has(&self, r: &XRule) -> bool {
        self.rules.contains(&format!("-A {} {}", r.chain, r.text()))
    }
    fn rules_of(&self, chain: Option<&str>) -> Vec<(String, Option<String>, Option<String>)> {
        let verdicts = ["ACCEPT", "DROP", "RETURN", "MASQUERADE", "DNAT", "MARK"];
        self.rules
            .iter()
            .filter_map(|r| {
                let name = r.strip_prefix("-A ")?.split_whitespace().next()?;
                let target = r.rsplit_once(" -j ").map(|(_, t)| t.split_whitespace().next().unwrap_or_default());
                let jump = target.filter(|t| !verdicts.contains(t)).map(String::from);
                let comment = crate::firewall::iptables::saved_comment(r).map(|(c, _)| c);
                chain.is_none_or(|c| c == name).then(|| (name.to_string(), comment, jump))
            })
            .collect()
    }
}

impl Op {
    /// The op as an iptables command line (after `iptables`).
    pub(crate) fn line(&self) -> String {
        match self {
            Op::Chain(c) => format!("-N {c}"),
            Op::Insert(r) => format!("-I {} 1 {}", r.chain, r.text()),
            Op::Append(r) => format!("-A {} {}", r.chain, r.text()),
            Op::Delete(r) => format!("-D {} {}", r.chain, r.text()),
            Op::Flush(c) => format!("-F {c}"),
            Op::DropChain(c) => format!("-X {c}"),
            Op::Unjump(c) => format!("-D * -j {c}"),
        }
    }
}

fn rules(ips: &[&str], iso: Option<(&str, bool)>) -> ForwardRules {
    ForwardRules {
        admin_chain: DEFAULT_ADMIN_CHAIN.to_string(),
        addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
        isolation: iso.map(|(b, i)| Isolation { bridge: b.to_string(), isolated: i }),
    }
}

fn lines(ops: Vec<Op>) -> Vec<String> {
    ops.iter().map(Op::line).collect()
}

#[test]
fn empty_table_gets_the_reference_layout() {
    let t = NatTable::parse("*filter\n:INPUT ACCEPT [0:0]\n:FORWARD DROP [0:0]\nCOMMIT\n", "filter");
    let added = lines(add_ops(&t, &rules(&["10.1.0.2", "fd00::2"], Some(("br0", false))), Family::V4));
    assert_eq!(
        added,
        vec![
            "-N CNI-FORWARD",
            "-N CNI-ADMIN",
            "-I FORWARD 1 -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD",
            "-I CNI-FORWARD 1 -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN",
            "-A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-A CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT",
            "-N CNI-ISOLATION-STAGE-1",
            "-N CNI-ISOLATION-STAGE-2",
            "-I FORWARD 1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-1",
            "-I CNI-ISOLATION-STAGE-1 1 -i br0 ! -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2",
            "-I CNI-ISOLATION-STAGE-2 1 -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j DROP",
            "-A CNI-ISOLATION-STAGE-1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j RETURN",
            "-A CNI-ISOLATION-STAGE-2 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j RETURN",
        ]
    );
    let v6 = lines(add_ops(&t, &rules(&["10.1.0.2", "fd00::2"], None), Family::V6));
    assert!(v6.contains(&"-A CNI-FORWARD -s fd00::2/128 -j ACCEPT".to_string()), "{v6:?}");
    assert!(add_ops(&t, &rules(&["10.1.0.2"], None), Family::V6).is_empty());
}

#[test]
fn present_rules_are_not_added_again_whatever_their_upstream_comment() {
    let save = "*filter\n:FORWARD DROP [0:0]\n:CNI-FORWARD - [0:0]\n:CNI-ADMIN - [0:0]\n\
        :CNI-ISOLATION-STAGE-1 - [0:0]\n:CNI-ISOLATION-STAGE-2 - [0:0]\n\
        -A FORWARD -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j CNI-ISOLATION-STAGE-1\n\
        -A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD\n\
        -A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN\n\
        -A CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n\
        -A CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT\n\
        -A CNI-ISOLATION-STAGE-1 -i br0 ! -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2\n\
        -A CNI-ISOLATION-STAGE-1 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j RETURN\n\
        -A CNI-ISOLATION-STAGE-2 -o br0 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j DROP\n\
        -A CNI-ISOLATION-STAGE-2 -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge|isolated)\" -j RETURN\nCOMMIT\n";
    let t = NatTable::parse(save, "filter");
    assert!(add_ops(&t, &rules(&["10.1.0.2"], Some(("br0", false))), Family::V4).is_empty());
    assert!(check_table(&t, &rules(&["10.1.0.2"], None), Family::V4).is_ok());
    let err = check_table(&t, &rules(&["10.1.0.3"], None), Family::V4).unwrap_err();
    assert_eq!(err.code, libcni::code::CHECK_FAILED);
    assert!(err.msg.contains("-d 10.1.0.3/32 -m conntrack"), "{}", err.msg);
    // A second bridge gets its own stage rules, first in each chain.
    let other = lines(add_ops(&t, &rules(&["10.2.0.2"], Some(("br1", false))), Family::V4));
    assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-1 1 -i br1 ! -o br1 ")), "{other:?}");
    assert!(other.iter().any(|l| l.starts_with("-I CNI-ISOLATION-STAGE-2 1 -o br1 ")), "{other:?}");
    assert!(!other.iter().any(|l| l.contains("RETURN") || l.starts_with("-I FORWARD")), "{other:?}");
    assert_eq!(
        lines(del_ops(&t, &["10.1.0.2".parse().unwrap(), "10.9.9.9".parse().unwrap()], Family::V4)),
        vec![
            "-D CNI-FORWARD -d 10.1.0.2/32 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            "-D CNI-FORWARD -s 10.1.0.2/32 -j ACCEPT"
        ]
    );
}

/// A netlink message: its nf_tables type, flags and attributes.
type Message = (u16, u16, Vec<u8>);

/// The messages iptables-nft 1.8.9 sent for each rule shape (iptables-nft-1.8.9.txt).
fn captured() -> BTreeMap<String, Message> {
    let hex = |h: &str| (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect();
    let num = |s: &str| u16::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    include_str!("iptables-nft-1.8.9.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), (num(f[1]) & 0xff, num(f[2]), hex(f[3])))
        })
        .collect()
}

/// The NEWRULE and base NEWCHAIN messages of an ADD into empty tables, named by shape.
fn ours(family: TableFamily, r: &ForwardRules, ipv: Family, names: &[&str]) -> Vec<(String, Message)> {
    let empty = Listed { family, table: "filter", generation: 0, chains: BTreeMap::new() };
    let msgs = nfnl::tests::messages(&empty.batch(&add_ops(&empty, r, ipv)));
    // NFT_MSG_NEWCHAIN with a hook (the base chain) and NFT_MSG_NEWRULE, as iptables sends them.
    let wanted = msgs.into_iter().filter(|(ty, _, a)| *ty == 6 || (*ty == 3 && a.len() > 40));
    names.iter().zip(wanted).map(|(n, (ty, flags, a))| (n.to_string(), (ty, flags | 1, a))).collect()
}

#[test]
fn rules_encode_byte_for_byte_as_iptables_nft_1_8_9_writes_them() {
    let cap = captured();
    let same = rules(&["10.1.0.2", "fd00::2"], Some(("cni-br0", false)));
    let mut got = ours(
        TableFamily::Ip,
        &same,
        Family::V4,
        &[
            "forward_base",
            "forward_jump",
            "admin_jump",
            "v4_related",
            "v4_source",
            "stage1_jump",
            "stage1_bridge",
            "stage2_bridge",
            "",
            "stage_return",
        ],
    );
    got.extend(ours(TableFamily::Ip6, &same, Family::V6, &["", "", "", "v6_related", "v6_source"]));
    let isolated = rules(&["10.1.0.2"], Some(("cni-br0", true)));
    got.extend(ours(TableFamily::Ip, &isolated, Family::V4, &["", "", "", "", "", "", "", "stage1_isolated"]));
    let got: BTreeMap<_, _> = got.into_iter().filter(|(n, _)| !n.is_empty()).collect();
    assert_eq!(got.len(), cap.len());
    for (name, want) in &cap {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let mine = &got[name];
        assert_eq!((mine.0, mine.1, hex(&mine.2)), (want.0, want.1, hex(&want.2)), "{name}");
    }
}

/// Runs iptables (nft-based on this node) in the current network namespace.
pub(crate) fn iptables(tool: &str, args: &[&str]) {
    let out = super::super::super::exec::run(tool, args, None).unwrap();
    assert!(out.success, "{tool} {args:?}: {}", out.stderr);
}

/// Every rule shape as iptables-nft writes it on this machine, listed back over netlink, equals
/// our encoding of it (so `-C`/`-D` by either side find the other's rules), in a fresh netns.
#[test]
fn iptables_nft_on_this_node_writes_what_we_encode() {
    cni_tests::require_root();
    cni_tests::require_tools(&["iptables", "ip6tables"]);
    assert!(super::super::nft_based(), "this test needs the node's iptables to be iptables-nft");
    nfnl::tests::in_netns(|| {
        let same = rules(&["10.1.0.2", "fd00::2"], Some(("cni-br0", false)));
        let isolated = rules(&["10.1.0.2"], Some(("cni-br0", true)));
        let empty = Listed { family: TableFamily::Ip, table: "filter", generation: 0, chains: BTreeMap::new() };
        let mut ops = add_ops(&empty, &same, Family::V4);
        let more: Vec<Op> = add_ops(&empty, &isolated, Family::V4).into_iter().filter(|o| !ops.contains(o)).collect();
        ops.extend(more);
        let empty6 = Listed { family: TableFamily::Ip6, ..empty };
        for (tool, ops) in [("iptables", ops), ("ip6tables", add_ops(&empty6, &same, Family::V6))] {
            for op in &ops {
                let line = op.line();
                if line != "-N FORWARD" {
                    let args = shell_words(&line);
                    iptables(tool, &args.iter().map(String::as_str).collect::<Vec<_>>());
                }
            }
            let ipv = if tool == "iptables" { Family::V4 } else { Family::V6 };
            let listed = Listed::read(&Conn::new(), ipv, "filter", &chains("CNI-ADMIN")).unwrap();
            for op in &ops {
                if let Op::Insert(r) | Op::Append(r) = op {
                    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                    let there: Vec<String> = listed.chains[&r.chain].rules.iter().map(|(_, e)| hex(e)).collect();
                    assert!(
                        listed.has(r),
                        "{tool}: {} not found as we encode it:\n{}\nin {there:#?}",
                        op.line(),
                        hex(&r.nft(listed.family).encoded())
                    );
                }
            }
        }
    });
}

/// An iptables-restore line split as a shell would (double quotes, with `\"` and `\\` in them).
pub(crate) fn shell_words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => cur.extend(chars.next()),
            '"' => quoted = !quoted,
            ' ' if !quoted => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out.retain(|w| !w.is_empty());
    out
}

/// What the legacy fixtures hold besides the firewall's rules: a FORWARD policy of DROP, a user
/// chain with an unknown target and match, a rule without target, a goto, and counters.
const OTHER_RULES: &[&str] = &[
    "-P FORWARD DROP",
    "-N OTHER",
    "-A OTHER -c 7 700 -s 192.0.2.1/32 -p tcp -m tcp --dport 80 -j LOG --log-prefix x",
    "-A OTHER -d 192.0.2.2/32",
    "-A OTHER -i eth+ -g CNI-ADMIN",
    "-A INPUT -c 3 300 -j OTHER",
];

/// The firewall's rule shapes for a family, as iptables command lines: same-bridge on `cni-br0`
/// with an IPv4 and an IPv6 pod, and isolated for IPv4.
fn shapes(ipv: Family) -> Vec<Op> {
    let same = rules(&["10.1.0.2", "fd00::2"], Some(("cni-br0", false)));
    let isolated = rules(&["10.1.0.2"], Some(("cni-br0", true)));
    let empty = NatTable::parse("*filter\n:FORWARD ACCEPT [0:0]\nCOMMIT\n", "filter");
    let mut ops = add_ops(&empty, &same, ipv);
    if ipv == Family::V4 {
        let more: Vec<Op> = add_ops(&empty, &isolated, ipv).into_iter().filter(|o| !ops.contains(o)).collect();
        ops.extend(more);
    }
    ops
}

/// Writes the fixture's rules with iptables-legacy into the current network namespace.
fn legacy_fixture_rules(ipv: Family) {
    let tool = ipv.pick("iptables-legacy", "ip6tables-legacy");
    let other = OTHER_RULES.iter().map(|l| l.replace("192.0.2.1/32", ipv.pick("192.0.2.1/32", "2001:db8::1/128")));
    let other = other.map(|l| l.replace("192.0.2.2/32", ipv.pick("192.0.2.2/32", "2001:db8::2/128")));
    let mut lines: Vec<String> = shapes(ipv).iter().map(Op::line).collect();
    lines.extend(other);
    for line in lines {
        let args = shell_words(&line);
        iptables(tool, &args.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// The filter table's `SO_GET_INFO` fields and blob in the fixture format (see xtables/tests.rs).
fn fixture_text(family: Family) -> String {
    let (info, blob) = xtables::tests::raw(family, "filter");
    let mut s = format!("info {}\n", xtables::tests::info_line(&info));
    for chunk in blob.chunks(64) {
        s.push_str(&chunk.iter().map(|b| format!("{b:02x}")).collect::<String>());
        s.push('\n');
    }
    s
}

/// Prints the legacy fixtures (xtables/filter-v4.txt, filter-v6.txt): run on a node with
/// iptables-legacy 1.8.9, `cargo test -p netkit legacy_fixture_dump -- --ignored --nocapture`.
#[test]
#[ignore]
fn legacy_fixture_dump() {
    cni_tests::require_root();
    nfnl::tests::in_netns(|| {
        for ipv in [Family::V4, Family::V6] {
            legacy_fixture_rules(ipv);
            println!("{}", fixture_text(ipv));
        }
    });
}

/// Our encoding of every rule shape, applied to the fixture's table without the firewall's
/// chains and rules, gives back the kernel's table byte for byte as iptables-legacy wrote it
/// (each rule's bytes, chain order, insert positions, hook entries, jump offsets).
#[test]
fn rules_encode_byte_for_byte_as_iptables_legacy_1_8_9_writes_them() {
    for ipv in [Family::V4, Family::V6] {
        let family = ipv;
        let written = xtables::tests::table(family);
        let mut base = written.clone();
        base.chains.retain(|c| !c.name.starts_with("CNI-"));
        base.chain_mut("FORWARD").unwrap().rules.clear();
        for op in shapes(ipv) {
            if let Op::Insert(r) | Op::Append(r) = &op {
                assert!(written.has(r), "{ipv:?}: {} not found as we encode it", op.line());
            }
        }
        let ours = changed(&base, &shapes(ipv)).unwrap();
        let (mine, _) = ours.serialize().unwrap();
        let (theirs, _) = written.serialize().unwrap();
        assert!(mine == theirs, "{ipv:?}: our table differs from iptables-legacy's");
        assert!(changed(&written, &del_ops(&written, &["10.1.0.2".parse().unwrap(), "fd00::2".parse().unwrap()], ipv))
            .unwrap()
            .chain("CNI-FORWARD")
            .unwrap()
            .rules
            .iter()
            .all(|r| r.target != xtables::Target::Verdict(xtables::ACCEPT)));
    }
}

/// iptables-legacy on this node writes the fixtures' tables (so the byte-for-byte tests hold on
/// it); a replace through the codec keeps every rule's and policy's counters, and a replace of a
/// table read before someone else changed it is refused with EAGAIN (what makes us read again).
#[test]
fn iptables_legacy_on_this_node_writes_the_fixtures_and_replace_keeps_counters() {
    cni_tests::require_root();
    cni_tests::require_tools(&["iptables-legacy", "ip6tables-legacy"]);
    nfnl::tests::in_netns(|| {
        for ipv in [Family::V4, Family::V6] {
            let family = ipv;
            let tool = ipv.pick("iptables-legacy", "ip6tables-legacy");
            legacy_fixture_rules(ipv);
            let here = xtables::Table::read(family, "filter").unwrap();
            let fixture = xtables::tests::table(family);
            assert!(
                here.serialize().unwrap().0 == fixture.serialize().unwrap().0,
                "{ipv:?}: {tool} wrote another table"
            );

            let mut t = here.clone();
            t.add_chain("NEW");
            t.chain_mut("FORWARD").unwrap().rules.remove(0);
            t.replace().unwrap();
            let back = xtables::Table::read(family, "filter").unwrap();
            assert!(back.chain("NEW").is_some_and(|c| c.rules.is_empty()), "{ipv:?}");
            let counters = |t: &xtables::Table, chain: &str| -> Vec<xtables::Counters> {
                t.chain(chain).unwrap().rules.iter().map(|r| r.counters).collect()
            };
            assert_eq!(counters(&back, "OTHER"), counters(&here, "OTHER"), "{ipv:?}");
            assert_eq!(counters(&back, "INPUT")[0], xtables::Counters { packets: 3, bytes: 300 }, "{ipv:?}");
            assert_eq!(back.chain("FORWARD").unwrap().rules.len(), here.chain("FORWARD").unwrap().rules.len() - 1);

            iptables(tool, &["-A", "NEW", "-j", "RETURN"]);
            let err = t.replace().unwrap_err();
            assert_eq!(err.errno, Some(libc::EAGAIN), "{ipv:?}: a stale replace: {}", err.msg);
        }
    });
}
