#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, unique, Netns};
use libcni::code;
use libcni::types::{CniResult, Interface, IpConfig, Route};
use netkit::iface;
use netkit::{NetNs, Netlink};

/// A veth into a pod namespace, configured from a result, then CHECKed against it: every
/// difference CHECK must see is one the kernel really has.
#[test]
fn configure_then_check_the_pod_interface() {
    require_root();
    let tns = Netns::new("cnk-");
    let ns = NetNs::open(&tns.path).unwrap();
    let host = Netlink::open().unwrap();
    let cont = Netlink::open_in(&ns).unwrap();
    let id = unique("cnk-iface-");

    iface::ensure_absent(&cont, &ns, "eth0").unwrap();
    let (host_name, _) = iface::create_veth(&host, &id, "eth0", &ns, Some(1400), None).unwrap();
    assert_eq!(host_name, iface::host_veth_name(&id, "eth0", 0));
    let e = iface::ensure_absent(&cont, &ns, "eth0").unwrap_err();
    assert!(e.msg.contains("interface eth0 already exists in"), "{e}");

    let mut r = CniResult {
        ips: vec![IpConfig { address: "198.51.100.7/24".parse().unwrap(), gateway: None, interface: None }],
        ..Default::default()
    };
    iface::set_gateways(&mut r, 0, true, true);
    let link = cont.link("eth0").unwrap().unwrap();
    iface::configure(&cont, &ns, "eth0", link.index, &r, false).unwrap();
    let addrs = tns.ip(&["-4", "addr", "show", "eth0"]);
    assert!(addrs.contains("198.51.100.7/24"), "{addrs}");
    let routes = tns.ip(&["-4", "route"]);
    assert!(routes.contains("default via 198.51.100.1 dev eth0"), "{routes}");
    // Configuring again keeps the routes already there (an address already there is the caller's to avoid).
    let again = CniResult { ips: Vec::new(), ..r.clone() };
    iface::configure(&cont, &ns, "eth0", link.index, &again, false).unwrap();

    r.interfaces = vec![Interface {
        name: "eth0".into(),
        mac: link.mac_string(),
        sandbox: Some(tns.path.clone()),
        ..Default::default()
    }];
    let (checked, idx) = iface::check_pod(&ns, "eth0", &r, true).unwrap();
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
    let e = iface::check_pod(&ns, "eth0", &missing_route, true).unwrap_err();
    assert_eq!(e.code, code::CHECK_FAILED, "{e}");
    assert!(e.msg.starts_with("route to 192.0.2.0/24 is missing in"), "{e}");

    let mut other_mac = r.clone();
    other_mac.interfaces[0].mac = Some("0a:58:00:00:00:01".into());
    let e = iface::check_pod(&ns, "eth0", &other_mac, true).unwrap_err();
    assert!(e.msg.contains("eth0 has MAC"), "{e}");

    tns.ip(&["addr", "del", "198.51.100.7/24", "dev", "eth0"]);
    let e = iface::check_pod(&ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, "eth0 does not hold 198.51.100.7/24");
    tns.ip(&["link", "set", "eth0", "down"]);
    let e = iface::check_pod(&ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, "eth0 is down");

    tns.ip(&["link", "del", "eth0"]);
    let e = iface::check_pod(&ns, "eth0", &r, true).unwrap_err();
    assert_eq!(e.msg, format!("interface eth0 is missing in {}", tns.path));
    assert!(host.link(&host_name).unwrap().is_none(), "deleting the pod end removes the pair");
}
