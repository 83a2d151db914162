#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, unique, Netns};
use ipnetwork::IpNetwork;
use libcni::code;
use netkit::{Family, Mac, NetNs, Netlink, RouteSpec};
use std::time::Duration;

/// A "host" and a "container" namespace, so nothing touches the real host.
struct Pair {
    host: Netns,
    cont: Netns,
    host_ns: NetNs,
    cont_ns: NetNs,
}

impl Pair {
    fn new() -> Pair {
        let host = Netns::new("cnk-");
        let cont = Netns::new("cnk-");
        let host_ns = NetNs::open(&host.path).unwrap();
        let cont_ns = NetNs::open(&cont.path).unwrap();
        Pair { host, cont, host_ns, cont_ns }
    }
}

/// Whether this kernel has CONFIG_BRIDGE_VLAN_FILTERING; if not, checks that the failure says so.
fn vlan_filtering_supported(nl: &Netlink) -> bool {
    match nl.ensure_bridge("cnkprobe", None, true, false) {
        Ok(_) => {
            nl.delete_link_by_name("cnkprobe").unwrap();
            true
        }
        Err(e) => {
            assert_eq!(netkit::errno(&e), Some(libc::EOPNOTSUPP), "{e}");
            assert!(e.msg.starts_with("create bridge cnkprobe: "), "{e}");
            assert!(e.details.contains("CONFIG_BRIDGE_VLAN_FILTERING"), "{e:?}");
            eprintln!("NOTE: this kernel lacks CONFIG_BRIDGE_VLAN_FILTERING; VLAN tests check the error path only");
            false
        }
    }
}

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

#[test]
fn current_namespace_lists_loopback() {
    require_root();
    let nl = Netlink::open().unwrap();
    let lo = nl.link("lo").unwrap().unwrap();
    assert_eq!(lo.index, 1);
    assert!(nl.links().unwrap().iter().any(|l| l.name == "lo"));
    assert!(nl.link(&unique("cnk-none")).unwrap().is_none());
    assert!(nl.link_by_index(999_999).unwrap().is_none());
}

#[test]
fn bridge_is_created_reused_and_checked() {
    require_root();
    let p = Pair::new();
    let nl = Netlink::open_in(&p.host_ns).unwrap();
    let br = nl.ensure_bridge("cnkbr0", Some(1400), false, false).unwrap();
    assert_eq!(br.kind.as_deref(), Some("bridge"));
    assert!(br.up);
    assert_eq!(br.mtu, 1400);
    assert_eq!(br.vlan_filtering, Some(false));
    assert!(br.mac.is_some());
    let out = p.host.ip(&["-d", "link", "show", "cnkbr0"]);
    assert!(out.contains("mtu 1400") && out.contains("bridge"), "{out}");

    // Reuse: same index; promisc (and vlan_filtering) get turned on, mtu left alone.
    let vlans = vlan_filtering_supported(&nl);
    let again = nl.ensure_bridge("cnkbr0", Some(9000), vlans, true).unwrap();
    assert_eq!(again.index, br.index);
    assert_eq!(again.mtu, 1400);
    assert!(again.promisc);
    assert_eq!(again.vlan_filtering, Some(vlans));
    nl.set_down(br.index).unwrap();
    assert!(nl.ensure_bridge("cnkbr0", None, false, false).unwrap().up);

    // A link of another kind with that name is refused.
    nl.create_veth("cnkv0", "cnkv0p", &p.host_ns, None, None).unwrap();
    let e = nl.ensure_bridge("cnkv0", None, false, false).unwrap_err();
    assert_eq!(e.code, code::NETWORK);
    assert!(e.msg.contains("cnkv0") && e.msg.contains("not a bridge") && e.msg.contains("veth"), "{e}");

    // Invalid names are config errors.
    let e = nl.ensure_bridge("this-name-is-too-long", None, false, false).unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG, "{e}");
}

#[test]
fn bridges_created_in_parallel_race_safely() {
    require_root();
    let p = Pair::new();
    let path = p.host.path.clone();
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let ns = NetNs::open(&path).unwrap();
                let nl = Netlink::open_in(&ns).unwrap();
                nl.ensure_bridge("cnkrace", None, false, false).unwrap().index
            })
        })
        .collect();
    let indexes: Vec<u32> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(indexes.iter().all(|i| *i == indexes[0]), "{indexes:?}");
}

#[test]
fn veth_peer_is_created_directly_in_the_target_namespace() {
    require_root();
    let p = Pair::new();
    let nl = Netlink::open_in(&p.host_ns).unwrap();
    let mac = Mac([0x0a, 0x58, 0x0a, 0x01, 0x02, 0x03]);
    let host = nl.create_veth("cnkveth0", "eth0", &p.cont_ns, Some(1450), Some(mac)).unwrap();
    assert_eq!(host.kind.as_deref(), Some("veth"));
    assert_eq!(host.mtu, 1450);
    assert!(!host.up);
    assert!(host.link_netnsid.is_some(), "{host:?}");

    let out = p.cont.ip(&["link", "show", "eth0"]);
    assert!(out.contains("0a:58:0a:01:02:03") && out.contains("mtu 1450"), "{out}");
    // Never existed in the host namespace under the peer name.
    assert!(nl.link("eth0").unwrap().is_none());

    let nlc = Netlink::open_in(&p.cont_ns).unwrap();
    let peer = nlc.link("eth0").unwrap().unwrap();
    assert_eq!(peer.mac, Some(mac));
    assert_eq!(peer.mac_string().as_deref(), Some("0a:58:0a:01:02:03"));
    assert_eq!(host.link_index, Some(peer.index));
    assert_eq!(peer.link_index, Some(host.index));

    // The same names again: EEXIST, with the objects named.
    let e = nl.create_veth("cnkveth0", "eth1", &p.cont_ns, None, None).unwrap_err();
    assert!(netkit::is_exists(&e), "{e}");
    assert!(e.msg.starts_with("create veth cnkveth0 (peer eth1 in "), "{e}");
    let e = nl.create_veth("cnkveth1", "eth0", &p.cont_ns, None, None).unwrap_err();
    assert!(netkit::is_exists(&e), "{e}");
    assert!(nl.link("cnkveth1").unwrap().is_none(), "a failed create leaves nothing behind");

    // Attach to a bridge, bring both ends up, wait for carrier.
    let br = nl.ensure_bridge("cnkbr1", None, false, false).unwrap();
    nl.set_master(host.index, br.index).unwrap();
    nl.set_up(host.index).unwrap();
    let e = nl.wait_oper_up(host.index, Duration::from_millis(60)).unwrap_err();
    assert!(e.msg.starts_with("link cnkveth0 is not operationally up after "), "{e}");
    nlc.set_up(peer.index).unwrap();
    let up = nl.wait_oper_up(host.index, Duration::from_secs(3)).unwrap();
    assert!(up.oper_up && up.up);
    assert_eq!(up.master, Some(br.index));

    // Link attribute setters.
    nl.set_mtu(host.index, 1400).unwrap();
    let new_mac = Mac([0x0a, 0x58, 0, 0, 0, 9]);
    nl.set_mac(host.index, new_mac).unwrap();
    nl.set_promisc(host.index, true).unwrap();
    let l = nl.link_by_index(host.index).unwrap().unwrap();
    assert_eq!((l.mtu, l.mac, l.promisc), (1400, Some(new_mac), true));
    nl.set_down(host.index).unwrap();
    assert!(!nl.link_by_index(host.index).unwrap().unwrap().up);
    nl.set_nomaster(host.index).unwrap();
    assert_eq!(nl.link_by_index(host.index).unwrap().unwrap().master, None);

    // Delete is idempotent, and takes the peer with it.
    assert!(nl.delete_link_by_name("cnkveth0").unwrap());
    assert!(!nl.delete_link_by_name("cnkveth0").unwrap());
    assert!(!nl.delete_link(host.index).unwrap());
    assert!(nlc.link("eth0").unwrap().is_none());

    // Errors on a missing link name the object and are "not found".
    let e = nl.set_up(host.index).unwrap_err();
    assert!(netkit::is_not_found(&e), "{e}");
    assert!(e.msg.starts_with(&format!("set up link index {}: ", host.index)), "{e}");
}

#[test]
fn bridge_port_flags() {
    require_root();
    let p = Pair::new();
    let nl = Netlink::open_in(&p.host_ns).unwrap();
    let br = nl.ensure_bridge("cnkbr2", None, false, false).unwrap();
    let host = nl.create_veth("cnkport0", "eth0", &p.cont_ns, None, None).unwrap();
    assert_eq!(nl.port_flags(host.index).unwrap(), None);
    nl.set_master(host.index, br.index).unwrap();
    assert_eq!(nl.port_flags(host.index).unwrap(), Some((false, false)));

    nl.set_port_flags(host.index, Some(true), None).unwrap();
    let out = p.host.sh("bridge", &["-d", "link", "show", "dev", "cnkport0"]);
    assert!(out.contains("hairpin on") && out.contains("isolated off"), "{out}");
    nl.set_port_flags(host.index, None, Some(true)).unwrap();
    let out = p.host.sh("bridge", &["-d", "link", "show", "dev", "cnkport0"]);
    assert!(out.contains("hairpin on") && out.contains("isolated on"), "{out}");
    assert_eq!(nl.port_flags(host.index).unwrap(), Some((true, true)));
    nl.set_port_flags(host.index, Some(false), Some(false)).unwrap();
    assert_eq!(nl.port_flags(host.index).unwrap(), Some((false, false)));
    nl.set_port_flags(host.index, None, None).unwrap();
}

#[test]
fn bridge_vlans() {
    require_root();
    let p = Pair::new();
    let nl = Netlink::open_in(&p.host_ns).unwrap();
    if !vlan_filtering_supported(&nl) {
        let br = nl.ensure_bridge("cnkbr3", None, false, false).unwrap();
        let host = nl.create_veth("cnkvl0", "eth0", &p.cont_ns, None, None).unwrap();
        nl.set_master(host.index, br.index).unwrap();
        let e = nl.set_vlan_filtering(br.index, true).unwrap_err();
        assert!(e.msg.starts_with("set vlan_filtering 1 on bridge cnkbr3 (index"), "{e}");
        assert!(e.details.contains("CONFIG_BRIDGE_VLAN_FILTERING"), "{e:?}");
        let e = nl.bridge_vlan_add(host.index, 10, true, true, false).unwrap_err();
        assert!(e.msg.starts_with("add vlan 10 to bridge port cnkvl0 (index"), "{e}");
        assert!(nl.bridge_vlans(host.index).unwrap().is_empty());
        return;
    }
    let br = nl.ensure_bridge("cnkbr3", None, true, false).unwrap();
    assert_eq!(br.vlan_filtering, Some(true));
    let host = nl.create_veth("cnkvl0", "eth0", &p.cont_ns, None, None).unwrap();
    nl.set_master(host.index, br.index).unwrap();
    // The kernel gives a new port VLAN 1 pvid untagged.
    assert!(nl.bridge_vlans(host.index).unwrap().iter().any(|v| v.vid == 1 && v.pvid));

    nl.bridge_vlan_add(host.index, 10, true, true, false).unwrap();
    assert!(nl.bridge_vlan_del(host.index, 1, false).unwrap());
    nl.bridge_vlan_add_range(host.index, 100, 110, false).unwrap();
    nl.bridge_vlan_add(br.index, 10, false, false, true).unwrap();

    let vlans = nl.bridge_vlans(host.index).unwrap();
    assert!(vlans.contains(&netkit::BridgeVlan { vid: 10, pvid: true, untagged: true }), "{vlans:?}");
    assert!(!vlans.iter().any(|v| v.vid == 1), "{vlans:?}");
    assert_eq!(vlans.iter().filter(|v| (100..=110).contains(&v.vid) && !v.pvid && !v.untagged).count(), 11);
    assert!(nl.bridge_vlans(br.index).unwrap().iter().any(|v| v.vid == 10));

    let out = p.host.sh("bridge", &["vlan", "show", "dev", "cnkvl0"]);
    assert!(out.contains("10 PVID Egress Untagged"), "{out}");
    assert!(out.contains("100"), "{out}");

    // Deleting a VLAN the port does not have is not an error.
    nl.bridge_vlan_del(host.index, 1, false).unwrap();
    nl.set_vlan_filtering(br.index, false).unwrap();
    assert_eq!(nl.link_by_index(br.index).unwrap().unwrap().vlan_filtering, Some(false));
}

#[test]
fn addresses_and_routes() {
    require_root();
    let p = Pair::new();
    let nl = Netlink::open_in(&p.host_ns).unwrap();
    let nlc = Netlink::open_in(&p.cont_ns).unwrap();
    let host = nl.create_veth("cnkar0", "eth0", &p.cont_ns, None, None).unwrap();
    nl.set_up(host.index).unwrap();
    let eth0 = nlc.link("eth0").unwrap().unwrap();
    nlc.set_up(eth0.index).unwrap();

    // Addresses.
    nlc.add_address(eth0.index, net("10.9.0.2/24"), false).unwrap();
    nlc.add_address(eth0.index, net("fd00:9::2/64"), true).unwrap();
    let e = nlc.add_address(eth0.index, net("10.9.0.2/24"), false).unwrap_err();
    assert!(netkit::is_exists(&e), "{e}");
    assert!(e.msg.starts_with("add address 10.9.0.2/24 to eth0 (index"), "{e}");
    let addrs = nlc.addresses(eth0.index).unwrap();
    assert!(addrs.contains(&net("10.9.0.2/24")) && addrs.contains(&net("fd00:9::2/64")), "{addrs:?}");
    let v6 = nlc.address_details(eth0.index, Family::V6).unwrap();
    let a = v6.iter().find(|a| a.net == net("fd00:9::2/64")).unwrap();
    assert!(a.flags & libc::IFA_F_NODAD != 0 && !a.tentative(), "{a:?}");
    let out = p.cont.ip(&["-4", "addr", "show", "eth0"]);
    assert!(out.contains("inet 10.9.0.2/24 brd 10.9.0.255"), "{out}");
    nlc.wait_dad(eth0.index, Duration::from_secs(3)).unwrap();

    // Routes: default via a gateway, one with metrics, one in another table.
    nlc.add_route(&RouteSpec::default_via("10.9.0.1".parse().unwrap())).unwrap();
    let mut r = RouteSpec::new(net("10.20.0.0/16"));
    r.gw = Some("10.9.0.1".parse().unwrap());
    r.oif = Some(eth0.index);
    r.metric = Some(50);
    r.mtu = Some(1300);
    r.advmss = Some(1200);
    r.src = Some("10.9.0.2".parse().unwrap());
    nlc.add_route(&r).unwrap();
    let e = nlc.add_route(&r).unwrap_err();
    assert!(netkit::is_exists(&e), "{e}");
    nlc.replace_route(&r).unwrap();
    let mut t = RouteSpec::new(net("10.30.0.0/16"));
    t.oif = Some(eth0.index);
    t.table = Some(100);
    nlc.add_route(&t).unwrap();
    let mut v6 = RouteSpec::default_via("fd00:9::1".parse().unwrap());
    v6.oif = Some(eth0.index);
    nlc.add_route(&v6).unwrap();

    let out = p.cont.ip(&["route", "show"]);
    assert!(out.contains("default via 10.9.0.1 dev eth0"), "{out}");
    assert!(out.contains("10.20.0.0/16 via 10.9.0.1 dev eth0 src 10.9.0.2 metric 50 mtu 1300 advmss 1200"), "{out}");
    assert!(!out.contains("10.30.0.0"), "{out}");
    let out = p.cont.ip(&["route", "show", "table", "100"]);
    assert!(out.contains("10.30.0.0/16 dev eth0 scope link"), "{out}");
    let out = p.cont.ip(&["-6", "route", "show"]);
    assert!(out.contains("default via fd00:9::1 dev eth0"), "{out}");

    let v4 = nlc.routes(Family::V4, None).unwrap();
    let def = v4.iter().find(|x| x.dst.prefix() == 0).unwrap();
    assert_eq!(def.gw, Some("10.9.0.1".parse().unwrap()));
    assert_eq!(def.oif, Some(eth0.index));
    assert_eq!(def.table, Some(254));
    let got = v4.iter().find(|x| x.dst == net("10.20.0.0/16")).unwrap();
    assert_eq!((got.metric, got.mtu, got.advmss, got.src), (Some(50), Some(1300), Some(1200), r.src));
    assert!(!v4.iter().any(|x| x.dst == net("10.30.0.0/16")));
    let t100 = nlc.routes(Family::V4, Some(100)).unwrap();
    assert_eq!(t100.len(), 1);
    assert_eq!(t100[0].scope, Some(253));
    assert!(nlc.routes(Family::V6, None).unwrap().iter().any(|x| x.dst.prefix() == 0 && x.gw == v6.gw));
    assert!(nlc.has_route(&RouteSpec::default_via("10.9.0.1".parse().unwrap())).unwrap());
    assert!(!nlc.routes_of(eth0.index, None).unwrap().is_empty());

    // Deletes are idempotent.
    assert!(nlc.del_route(&r).unwrap());
    assert!(!nlc.del_route(&r).unwrap());
    assert!(nlc.del_route(&t).unwrap());
    assert!(!nlc.del_route(&t).unwrap());
    assert!(nlc.del_route(&RouteSpec::default_via("10.9.0.1".parse().unwrap())).unwrap());
    assert!(!nlc.has_route(&RouteSpec::default_via("10.9.0.1".parse().unwrap())).unwrap());
    assert!(nlc.del_address(eth0.index, net("10.9.0.2/24")).unwrap());
    assert!(!nlc.del_address(eth0.index, net("10.9.0.2/24")).unwrap());
    assert!(nlc.del_address(eth0.index, net("fd00:9::2/64")).unwrap());
    assert!(!nlc.addresses(eth0.index).unwrap().iter().any(|a| a.ip().is_ipv4()));
}

/// `output_link` answers as `ip route get` does: a policy rule that sends a prefix to another
/// table wins over the main table's route, and no route is `None`.
#[test]
fn output_link_honours_policy_rules() {
    require_root();
    let t = Netns::new("cnk-rg-");
    t.ip(&["link", "add", "via0", "type", "veth", "peer", "name", "via1"]);
    t.ip(&["link", "add", "alt0", "type", "veth", "peer", "name", "alt1"]);
    for link in ["via0", "via1", "alt0", "alt1"] {
        t.ip(&["link", "set", link, "up"]);
    }
    t.ip(&["route", "add", "10.77.0.0/16", "dev", "via0"]);
    t.ip(&["route", "add", "10.77.1.0/24", "dev", "alt0", "table", "100"]);
    t.ip(&["rule", "add", "to", "10.77.1.0/24", "lookup", "100", "pref", "100"]);
    let ns = NetNs::open(&t.path).unwrap();
    let nl = Netlink::open_in(&ns).unwrap();
    let index = |name: &str| nl.link(name).unwrap().unwrap().index;
    assert_eq!(nl.output_link("10.77.2.1".parse().unwrap()).unwrap(), Some(index("via0")), "main table");
    assert_eq!(nl.output_link("10.77.1.1".parse().unwrap()).unwrap(), Some(index("alt0")), "the rule's table");
    assert_eq!(nl.output_link("10.78.0.1".parse().unwrap()).unwrap(), None, "no route");
}
