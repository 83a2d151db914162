//! The masquerade plan over iptables-save text, the encoding against what iptables-nft 1.8.9
//! writes on this node, and ADD, CHECK, DEL and GC in process against iptables' own view and
//! commands (the reference's).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use crate::firewall::iptables::forward::tests::{iptables, shell_words};
use crate::firewall::iptables::NatTable;
use crate::firewall::nfnl::tests::in_netns;

fn masq(cid: &str) -> Masquerade {
    Masquerade {
        network: "net".into(),
        container_id: cid.into(),
        ifname: "eth0".into(),
        addresses: vec!["10.1.0.5/16".parse().unwrap(), "fd00::5/64".parse().unwrap()],
    }
}

fn lines(ops: &[Op]) -> Vec<String> {
    ops.iter().map(Op::line).collect()
}

/// The reference's lines for container `cid` (iptables-save's form, without `-A `), per family.
fn reference_lines(cid: &str, ipv: Family) -> Vec<String> {
    let ch = chain_name("net", cid, "");
    let c = format!("-m comment --comment \"name: \\\"net\\\" id: \\\"{cid}\\\"\"");
    let (subnet, multicast, pod) =
        ipv.pick(("10.1.0.0/16", "224.0.0.0/4", "10.1.0.5/32"), ("fd00::/64", "ff00::/8", "fd00::5/128"));
    vec![
        format!("{ch} -d {subnet} {c} -j ACCEPT"),
        format!("{ch} ! -d {multicast} {c} -j MASQUERADE"),
        format!("POSTROUTING -s {pod} {c} -j {ch}"),
    ]
}

#[test]
fn the_plan_writes_the_reference_layout_and_replaces_what_the_container_had() {
    let ch = chain_name("net", "c", "");
    let empty = NatTable::parse("*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n", "nat");
    let mut want = vec![format!("-N {ch}")];
    want.extend(reference_lines("c", Family::V4).iter().map(|l| format!("-A {l}")));
    assert_eq!(lines(&add_ops(&empty, &masq("c"), Family::V4)), want);
    let v6 = lines(&add_ops(&empty, &masq("c"), Family::V6));
    assert_eq!(v6[1..], reference_lines("c", Family::V6).iter().map(|l| format!("-A {l}")).collect::<Vec<_>>());

    // What the reference (or an earlier ADD) left: flushed, its jump removed, then written anew.
    let mut save = format!("*nat\n:POSTROUTING ACCEPT [0:0]\n:{ch} - [0:0]\n");
    for l in reference_lines("c", Family::V4) {
        save.push_str(&format!("-A {}\n", l.replace("10.1.0.5/32", "10.1.0.9/32")));
    }
    save.push_str("-A POSTROUTING -s 10.9.0.0/16 -j MASQUERADE\nCOMMIT\n");
    let t = NatTable::parse(&save, "nat");
    let again = lines(&add_ops(&t, &masq("c"), Family::V4));
    assert_eq!(again[..2], [format!("-F {ch}"), format!("-D * -j {ch}")]);
    assert_eq!(again.len(), 5);
    assert_eq!(lines(&del_ops(&t, &ch)), [format!("-D * -j {ch}"), format!("-X {ch}")]);
    assert!(del_ops(&t, &chain_name("net", "other", "")).is_empty());
    // Nothing of another container's or anyone else's goes.
    let keep = [Attachment { container_id: "c".into(), ifname: "eth0".into() }];
    assert!(stale(&t, "net", &keep).is_empty());
    assert_eq!(stale(&t, "net", &[]).into_iter().collect::<Vec<_>>(), [ch]);
    assert!(stale(&t, "other", &[]).is_empty());
}

/// The node's iptables commands: iptables-legacy's or the default (iptables-nft here).
#[derive(Clone, Copy)]
struct Node {
    legacy: bool,
}

impl Node {
    fn tool(self, ipv: Family, suffix: &str) -> String {
        format!("{}{}{suffix}", ipv.pick("iptables", "ip6tables"), if self.legacy { "-legacy" } else { "" })
    }

    /// iptables-save's nat rules of a family, without the `-A `, sorted.
    fn saved(self, ipv: Family) -> Vec<String> {
        let tool = self.tool(ipv, "-save");
        let out = crate::firewall::exec::run(&tool, &["-t", "nat"], None).unwrap();
        assert!(out.success, "{tool}: {}", out.stderr);
        sorted(out.stdout.lines().filter_map(|l| l.strip_prefix("-A ")).map(String::from).collect())
    }

    fn iptables(self, ipv: Family, line: &str) {
        let mut args = vec!["-t".to_string(), "nat".to_string()];
        args.extend(shell_words(line));
        iptables(&self.tool(ipv, ""), &args.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// Whether the family's nat table, read as ADD reads it, holds `r` as we encode it.
    fn holds(self, ipv: Family, r: &XRule) -> bool {
        if self.legacy {
            return xtables::Table::read(ipv, "nat").unwrap().has(r);
        }
        Listed::read(&nfnl::Conn::new(), ipv, "nat", &[POSTROUTING, &r.chain]).unwrap().has(r)
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Every rule iptables writes for the reference, read back from the kernel, equals our encoding
/// of it; an ADD in process is what iptables-save shows as the reference's lines, found by
/// `iptables -C` and removed by the reference's `-D`, `-F`, `-X`; CHECK, DEL and GC in process
/// find and remove what iptables wrote, and leave other rules alone.
fn the_reference_rules_in_process(node: Node) {
    crate::firewall::iptables::tests::LEGACY.set(node.legacy);
    let m = masq("c");
    let ch = chain_name("net", "c", "");
    for ipv in [Family::V4, Family::V6] {
        node.iptables(ipv, &format!("-N {ch}"));
        for l in reference_lines("c", ipv) {
            node.iptables(ipv, &format!("-A {l}"));
        }
        let (own, entries) = rules(&m, ipv);
        for r in own.iter().chain(&entries) {
            assert!(node.holds(ipv, r), "{ipv:?}: -A {} {} not found as we encode it", r.chain, r.text());
        }
    }
    check(&m).unwrap();
    del("net", "c").unwrap();
    for ipv in [Family::V4, Family::V6] {
        assert_eq!(node.saved(ipv), Vec::<String>::new(), "{ipv:?}: our DEL left rules of the reference's");
    }
    assert_eq!(check(&m).unwrap_err().code, code::CHECK_FAILED);
    del("net", "c").unwrap();

    // Ours, twice (ADD replaces), as iptables shows them; the reference's DEL removes them.
    add(&m).unwrap();
    add(&m).unwrap();
    check(&m).unwrap();
    for ipv in [Family::V4, Family::V6] {
        assert_eq!(node.saved(ipv), sorted(reference_lines("c", ipv)), "{ipv:?}");
        for l in reference_lines("c", ipv) {
            node.iptables(ipv, &format!("-C {l}"));
        }
        let entry = reference_lines("c", ipv).pop().unwrap();
        for l in [format!("-D {entry}"), format!("-F {ch}"), format!("-X {ch}")] {
            node.iptables(ipv, &l);
        }
        assert_eq!(node.saved(ipv), Vec::<String>::new(), "{ipv:?}");
    }

    // GC removes the network's containers not kept, and nothing else.
    node.iptables(Family::V4, "-A POSTROUTING -s 10.9.0.0/16 -j MASQUERADE");
    for cid in ["a", "b"] {
        add(&masq(cid)).unwrap();
    }
    gc("net", &[Attachment { container_id: "b".into(), ifname: "eth0".into() }]).unwrap();
    let mut left = reference_lines("b", Family::V4);
    left.push("POSTROUTING -s 10.9.0.0/16 -j MASQUERADE".into());
    assert_eq!(node.saved(Family::V4), sorted(left));
    assert_eq!(node.saved(Family::V6), sorted(reference_lines("b", Family::V6)));
    check(&masq("b")).unwrap();
}

/// On this node's iptables-nft (iptables 1.8.9): over nf_tables netlink.
#[test]
fn the_reference_rules_in_process_on_iptables_nft() {
    cni_tests::require_root();
    cni_tests::require_tools(&["iptables", "ip6tables"]);
    assert!(super::super::nft_based(), "this test needs the node's iptables to be iptables-nft");
    in_netns(|| the_reference_rules_in_process(Node { legacy: false }));
}

/// With iptables-legacy: through the legacy nat tables' socket options.
#[test]
fn the_reference_rules_in_process_on_iptables_legacy() {
    cni_tests::require_root();
    cni_tests::require_tools(&["iptables-legacy", "ip6tables-legacy"]);
    in_netns(|| the_reference_rules_in_process(Node { legacy: true }));
}
