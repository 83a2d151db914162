//! The NetworkPolicy table lists exactly like the nft text of the module's drawing, and element
//! updates change only the sets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;
use crate::firewall::nfnl::tests::{in_netns, listing, nft, require_root_and_nft, suffix, Cleanup};

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}
fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn sample() -> (Ruleset, Elements) {
    let mut rules = empty_ruleset();
    rules.sets.insert("s4-sel".into(), SetKind::Addr(Family::V4));
    rules.sets.insert("s4-peer".into(), SetKind::Addr(Family::V4));
    rules.sets.insert("s6-sel".into(), SetKind::Addr(Family::V6));
    rules.sets.insert("n4-http".into(), SetKind::AddrPort(Family::V4));
    let rule = |family: Family, selected: &str, peer: Peer, ports: Ports, comment: &str| Rule {
        family,
        selected: selected.into(),
        peer,
        ports,
        comment: comment.into(),
    };
    rules.egress = vec![
        rule(
            Family::V4,
            "s4-sel",
            Peer::Set("s4-peer".into()),
            Ports::Range { proto: TCP, first: 80, last: 80 },
            "x/p egress 0",
        ),
        rule(
            Family::V4,
            "s4-sel",
            Peer::Block { net: net("10.0.0.0/8"), except: vec![net("10.1.0.0/16"), net("10.2.3.0/25")] },
            Ports::Any,
            "x/p egress 1",
        ),
        rule(Family::V4, "s4-sel", Peer::Any, Ports::Named("n4-http".into()), "x/p egress 2"),
    ];
    rules.ingress = vec![
        rule(
            Family::V4,
            "s4-sel",
            Peer::Set("s4-peer".into()),
            Ports::Range { proto: UDP, first: 8000, last: 9000 },
            "x/q ingress 0",
        ),
        rule(
            Family::V6,
            "s6-sel",
            Peer::Block { net: net("fd00::/64"), except: vec![] },
            Ports::Protocol(SCTP),
            "x/q ingress 1",
        ),
    ];
    let mut elements = Elements::new();
    elements.insert("s4-sel".into(), [Element::Addr(ip("10.244.1.5"))].into());
    elements.insert("s4-peer".into(), [Element::Addr(ip("10.244.2.7")), Element::Addr(ip("10.244.1.6"))].into());
    elements.insert("in-iso4".into(), [Element::Addr(ip("10.244.1.5"))].into());
    elements.insert("eg-iso6".into(), [Element::Addr(ip("fd00:10:244:1::5"))].into());
    elements.insert("n4-http".into(), [Element::AddrPort(ip("10.244.2.7"), TCP, 8080)].into());
    (rules, elements)
}

const SAMPLE_NFT: &str = r#"table inet {T} {
  set eg-iso4 { type ipv4_addr; }
  set eg-iso6 { type ipv6_addr; elements = { fd00:10:244:1::5 } }
  set in-iso4 { type ipv4_addr; elements = { 10.244.1.5 } }
  set in-iso6 { type ipv6_addr; }
  set n4-http { type ipv4_addr . inet_proto . inet_service; elements = { 10.244.2.7 . tcp . 8080 } }
  set s4-peer { type ipv4_addr; elements = { 10.244.1.6, 10.244.2.7 } }
  set s4-sel { type ipv4_addr; elements = { 10.244.1.5 } }
  set s6-sel { type ipv6_addr; }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related accept
    meta l4proto ipv6-icmp icmpv6 type >= 133 icmpv6 type <= 137 accept comment "neighbour discovery"
    ip saddr @eg-iso4 jump egress
    ip6 saddr @eg-iso6 jump egress
    ip daddr @in-iso4 jump ingress
    ip6 daddr @in-iso6 jump ingress
  }
  chain ingress {
    ip daddr @s4-sel ip saddr @s4-peer meta l4proto udp th dport >= 8000 th dport <= 9000 accept comment "x/q ingress 0"
    ip6 daddr @s6-sel ip6 saddr fd00::/64 meta l4proto sctp accept comment "x/q ingress 1"
    counter drop comment "no policy allows it in"
  }
  chain egress {
    ip saddr @s4-sel ip daddr @s4-peer meta l4proto tcp th dport 80 return comment "x/p egress 0"
    ip saddr @s4-sel ip daddr 10.0.0.0/8 ip daddr != 10.1.0.0/16 ip daddr != 10.2.3.0/25 return comment "x/p egress 1"
    ip saddr @s4-sel ip daddr . meta l4proto . th dport @n4-http return comment "x/p egress 2"
    counter drop comment "no policy allows it out"
  }
}
"#;

#[test]
fn the_table_lists_as_drawn() {
    require_root_and_nft();
    in_netns(|| {
        let sfx = suffix();
        let (t_nft, t_nl) = (format!("cnirs_nft_{sfx}"), format!("cnirs_nl_{sfx}"));
        let _cleanup = Cleanup(vec![(TableFamily::Inet, t_nft.clone()), (TableFamily::Inet, t_nl.clone())]);
        nft(&["-f", "-"], Some(&SAMPLE_NFT.replace("{T}", &t_nft)));
        let (rules, elements) = sample();
        replace(&t_nl, &rules, &elements).unwrap();
        // Chains in the same order in both: nft lists them in creation order.
        let (_, debug_nft) = listing(TableFamily::Inet, &t_nft);
        let (_, debug_nl) = listing(TableFamily::Inet, &t_nl);
        let text = |t: &str| nft(&["list", "table", "inet", t], None).replace(t, "T");
        assert_eq!(text(&t_nl), text(&t_nft));
        assert_eq!(debug_nl, debug_nft, "expressions differ (left: netlink, right: nft)");
    });
}

#[test]
fn replace_swaps_the_table_and_update_touches_only_elements() {
    require_root_and_nft();
    in_netns(|| {
        let t = format!("cnirs_np_{}", suffix());
        let _cleanup = Cleanup(vec![(TableFamily::Inet, t.clone())]);
        let (rules, mut elements) = sample();
        replace(&t, &rules, &elements).unwrap();
        // Replacing with a ruleset that lost a rule and a set leaves no trace of them.
        let mut smaller = rules.clone();
        smaller.ingress.truncate(1);
        smaller.sets.remove("s6-sel");
        replace(&t, &smaller, &elements).unwrap();
        let listed = nft(&["list", "table", "inet", &t], None);
        assert!(!listed.contains("s6-sel") && !listed.contains("x/q ingress 1"), "{listed}");
        assert!(listed.contains("x/q ingress 0"), "{listed}");
        // An update moves elements only.
        let del: Elements = [("s4-peer".to_string(), [Element::Addr(ip("10.244.1.6"))].into())].into();
        let add: Elements = [("s4-peer".to_string(), [Element::Addr(ip("10.244.3.9"))].into())].into();
        update(&t, &del, &add).unwrap();
        let set = nft(&["list", "set", "inet", &t, "s4-peer"], None);
        assert!(set.contains("10.244.2.7") && set.contains("10.244.3.9") && !set.contains("10.244.1.6"), "{set}");
        // Deleting an element that is not there fails and applies nothing.
        let del: Elements = [("s4-peer".to_string(), [Element::Addr(ip("10.244.9.9"))].into())].into();
        let add: Elements = [("s4-sel".to_string(), [Element::Addr(ip("10.244.1.77"))].into())].into();
        assert!(update(&t, &del, &add).is_err());
        assert!(!nft(&["list", "set", "inet", &t, "s4-sel"], None).contains("10.244.1.77"));
        assert_eq!(dropped(&t).unwrap(), (0, 0));
        elements.clear();
        remove(&t).unwrap();
        assert_eq!(dropped(&t).unwrap(), (0, 0), "no table, nothing dropped");
        remove(&t).unwrap();
        assert!(!crate::firewall::nfnl::tests::table_exists(TableFamily::Inet, &t));
    });
}
