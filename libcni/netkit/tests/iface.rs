#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, unique, Netns};
use libcni::code;
use libcni::types::{CniResult, Interface, IpConfig, Route};
use libcni::Request;
use netkit::iface::{check, configure, inpod, naming, result, veth, Pod};

/// A pod namespace and an ADD of `eth0` into it (a unique container id), for [`Pod::open_for_add`].
fn pod() -> (Netns, Request) {
    require_root();
    let tns = Netns::new("cnk-");
    let mut req = cni_tests::add_request(&serde_json::json!({"cniVersion": "1.0.0", "name": "net", "type": "t"}), "");
    req.netns = Some(tns.path.clone().into());
    req.container_id = unique("cnk-iface-");
    (tns, req)
}

/// A veth into a pod namespace, configured from a result, then CHECKed against it: every
/// difference CHECK must see is one the kernel really has.
#[test]
fn configure_then_check_the_pod_interface() {
    let (tns, req) = pod();
    let p = Pod::open_for_add(&req).unwrap();
    let (host_name, _) = veth::create(&p, Some(1400), None).unwrap();
    assert_eq!(host_name, naming::host_veth_name(&req.container_id, "eth0", 0));
    let e = Pod::open_for_add(&req).err().unwrap();
    assert!(e.msg.contains("interface eth0 already exists in"), "{e}");
    let (ns, cont, host) = (&p.ns, &p.nl, p.host().unwrap());

    let mut r = CniResult {
        ips: vec![IpConfig { address: "198.51.100.7/24".parse().unwrap(), gateway: None, interface: None }],
        ..Default::default()
    };
    result::set_gateways(&mut r, 0, true, true);
    let link = cont.link("eth0").unwrap().unwrap();
    configure::apply(&p, link.index, &r, false).unwrap();
    let addrs = tns.ip(&["-4", "addr", "show", "eth0"]);
    assert!(addrs.contains("198.51.100.7/24"), "{addrs}");
    let routes = tns.ip(&["-4", "route"]);
    assert!(routes.contains("default via 198.51.100.1 dev eth0"), "{routes}");
    // Configuring again keeps the routes already there (an address already there is the caller's to avoid).
    let again = CniResult { ips: Vec::new(), ..r.clone() };
    configure::apply(&p, link.index, &again, false).unwrap();

    r.interfaces = vec![Interface {
        name: "eth0".into(),
        mac: link.mac_string(),
        sandbox: Some(tns.path.clone()),
        ..Default::default()
    }];
    let (checked, idx) = check::pod(ns, "eth0", &r, true).unwrap();
    assert_eq!((checked.index, idx), (link.index, Some(0)));

    let mut missing_route = r.clone();
    missing_route.routes.push(Route {
        dst: "192.0.2.0/24".parse().unwrap(),
        gw: None,
        mtu: None,
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    });
    let e = check::pod(ns, "eth0", &missing_route, true).unwrap_err();
    assert_eq!(e.code, code::CHECK_FAILED, "{e}");
    assert!(e.msg.starts_with("route to 192.0.2.0/24 is missing in"), "{e}");

    let mut other_mac = r.clone();
    other_mac.interfaces[0].mac = Some("0a:58:00:00:00:01".into());
    let e = check::pod(ns, "eth0", &other_mac, true).unwrap_err();
    assert!(e.msg.contains("eth0 has MAC"), "{e}");

    tns.ip(&["addr", "del", "198.51.100.7/24", "dev", "eth0"]);
    let e = check::pod(ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, "eth0 does not hold 198.51.100.7/24");
    tns.ip(&["link", "set", "eth0", "down"]);
    let e = check::pod(ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, "eth0 is down");

    tns.ip(&["link", "del", "eth0"]);
    let e = check::pod(ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, format!("interface eth0 is missing in {}", tns.path));
    assert!(host.link(&host_name).unwrap().is_none(), "deleting the pod end removes the pair");
}

/// A veth pair on the host, both ends up: a master for macvlans; the guard deletes it.
fn master() -> (String, cni_tests::LinkGuard) {
    let name = unique("cnkm");
    let peer = unique("cnkp");
    cni_tests::sh("ip", &["link", "add", &name, "type", "veth", "peer", "name", &peer]);
    let guard = cni_tests::LinkGuard(name.clone());
    cni_tests::sh("ip", &["link", "set", &peer, "up"]);
    cni_tests::sh("ip", &["link", "set", &name, "up"]);
    (name, guard)
}

/// `inpod::create` where the kernel refuses the final name for a host link's sake (what a kernel
/// before 6.14 does when the host has a link so named; played here by the closure): the link is
/// made under a temporary name and renamed, and the pod ends up with `ifname` alone. Where the
/// pod has the name, the refusal is `Pod::open_for_add`'s and nothing is made.
#[test]
fn create_in_pod_falls_back_to_a_rename_and_refuses_a_taken_name() {
    require_root();
    let (master_name, _guard) = master();
    let (tns, req) = pod();
    let p = Pod::open(&req).unwrap();
    let (ns, cont, host) = (&p.ns, &p.nl, p.host().unwrap());
    let master = host.link(&master_name).unwrap().unwrap();
    let sub = netkit::netlink::SubLink::Macvlan { mode: netkit::netlink::MacvlanMode::Bridge, bc_queue_len: None };
    let tried = std::cell::RefCell::new(Vec::new());
    let create = |name: &str| {
        tried.borrow_mut().push(name.to_string());
        if name == "eth0" {
            return Err(libcni::Error::os(libc::EEXIST, "create macvlan eth0"));
        }
        host.create_sublink(name, master.index, &sub, ns, None, None)
    };
    let link = inpod::create(host, &p, create).unwrap();
    assert_eq!(link.name, "eth0");
    assert_eq!(cont.link("eth0").unwrap().unwrap().index, link.index);
    let tried = tried.borrow().clone();
    assert_eq!(tried.len(), 2, "{tried:?}");
    assert!(tried[1].starts_with("tmp"), "{tried:?}");
    assert!(cont.link(&tried[1]).unwrap().is_none() && host.link(&tried[1]).unwrap().is_none());
    let assigned = tns.sh("cat", &["/sys/class/net/eth0/name_assign_type"]);
    assert_eq!(assigned.trim(), "4", "renamed");

    // The name is taken now: the kernel's EEXIST is reported as `Pod::open_for_add`'s error.
    let again = |name: &str| host.create_sublink(name, master.index, &sub, ns, None, None);
    let e = inpod::create(host, &p, again).unwrap_err();
    assert!(e.msg.contains("interface eth0 already exists in"), "{e}");
    let links = tns.ip(&["-o", "link", "show"]);
    assert_eq!(links.lines().count(), 2, "lo and eth0 only: {links}");
}

/// `configure` sends its requests in batches: a result with more routes than one batch holds gets
/// every one, and a failed request is reported with the object it names.
#[test]
fn configure_adds_many_routes_and_names_the_one_that_fails() {
    let (tns, req) = pod();
    let p = Pod::open_for_add(&req).unwrap();
    veth::create(&p, None, None).unwrap();
    let link = p.nl.link("eth0").unwrap().unwrap();
    let route = |dst: String, gw: Option<&str>| Route {
        dst: dst.parse().unwrap(),
        gw: gw.map(|g| g.parse().unwrap()),
        mtu: None,
        advmss: None,
        priority: None,
        table: None,
        scope: None,
    };
    let mut r = CniResult {
        ips: vec![IpConfig { address: "198.51.100.7/24".parse().unwrap(), gateway: None, interface: None }],
        routes: (0..150).map(|i| route(format!("10.{}.{}.0/24", 100 + i / 100, i % 100), None)).collect(),
        ..Default::default()
    };
    result::set_gateways(&mut r, 0, true, true);
    configure::apply(&p, link.index, &r, false).unwrap();
    let routes = tns.ip(&["-4", "route"]);
    assert_eq!(routes.lines().filter(|l| l.contains(" via 198.51.100.1 dev eth0")).count(), 151, "{routes}");

    // A gateway outside every subnet of the link: that route fails, named, and the ones around it
    // are still made (the kernel handles each request of a batch).
    let bad = CniResult {
        ips: Vec::new(),
        routes: vec![
            route("192.0.2.0/24".into(), Some("198.51.100.1")),
            route("203.0.113.0/24".into(), Some("192.0.2.99")),
            route("198.18.0.0/24".into(), Some("198.51.100.1")),
        ],
        ..Default::default()
    };
    let e = configure::apply(&p, link.index, &bad, false).unwrap_err();
    assert!(e.msg.starts_with(&format!("add route 203.0.113.0/24 in {}", tns.path)), "{e}");
    assert_eq!(netkit::errno(&e), Some(libc::ENETUNREACH), "{e}");
    let routes = tns.ip(&["-4", "route"]);
    assert!(routes.contains("192.0.2.0/24 via 198.51.100.1") && routes.contains("198.18.0.0/24 via"), "{routes}");
    tns.ip(&["link", "del", "eth0"]);
}
