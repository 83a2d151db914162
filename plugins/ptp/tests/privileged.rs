#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! ptp through our libcni with real namespaces and real traffic: the reference's address and route
//! layout, pods reaching each other and the host over IPv4 and IPv6, every spec version, DEL twice
//! and with the namespace gone, a failed ADD leaving nothing, masquerade and mtu, and a node that
//! switches between the reference ptp (/usr/lib/cni) and ours. Privileged: makes its own
//! namespaces and removes them even when an assertion fails.

use cni_tests::{bin_dir, pings, reservations, run, sh, unique, Attachments, Netns, RemoteHost, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::version::{at_least, SUPPORTED};
use libcni::CniResult;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const REFERENCE: &str = "/usr/lib/cni";

struct Net {
    /// Declared first, so its cleanup DELs run before the data directory goes.
    attached: Attachments,
    list: NetworkConfigList,
    cni: CniConfig,
    data: TempDir,
    cache: TempDir,
}

/// A dual-stack ptp + host-local network on 10.202.<n>.0/<v4_prefix> and fd00:202:<n>::/64 with
/// default routes, `extra` merged into the ptp plugin's keys.
fn network(version: &str, n: u8, v4_prefix: u8, extra: Value) -> Net {
    let data = TempDir::new("cnpt-ipam");
    let cache = TempDir::new("cnpt-cache");
    let mut ptp = json!({
        "type": "ptp",
        "ipam": {
            "type": "host-local",
            "ranges": [[{ "subnet": format!("10.202.{n}.0/{v4_prefix}") }], [{ "subnet": format!("fd00:202:{n}::/64") }]],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            "dataDir": data.path()
        }
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        ptp[k] = v.clone();
    }
    let list = json!({ "cniVersion": version, "name": unique("ptpnet"), "plugins": [ptp] });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    Net { attached: Attachments::new(&cni, &list), list, cni, data, cache }
}

impl Net {
    /// The same network and cache, run with the plugins in `dir`.
    fn with_plugins(&self, dir: &Path) -> CniConfig {
        CniConfig::with_cache_dir(vec![dir.to_path_buf()], self.cache.path().to_path_buf())
    }

    fn add(&self, rt: &RuntimeConf) -> libcni::Result<CniResult> {
        self.attached.add(rt)
    }

    fn add_with(&self, cni: &CniConfig, rt: &RuntimeConf) -> libcni::Result<CniResult> {
        self.attached.add_with(cni, rt)
    }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf { container_id: unique("ctr"), netns: ns.path.clone(), ifname: "eth0".into(), ..Default::default() }
}

fn addr(r: &CniResult, v4: bool) -> String {
    r.ips.iter().find(|ip| ip.address.is_ipv4() == v4).map(|ip| ip.address.ip().to_string()).expect("address")
}

/// The host end's name: the result's (0.3.0 on), else the one ours derives from the attachment.
fn host_veth(r: &CniResult, rt: &RuntimeConf) -> String {
    r.interfaces
        .iter()
        .find(|i| i.sandbox.is_none())
        .map(|i| i.name.clone())
        .unwrap_or_else(|| netkit::iface::naming::host_veth_name(&rt.container_id, &rt.ifname, 0))
}

fn link_exists(name: &str) -> bool {
    run("ip", &["link", "show", name]).status.success()
}

/// The pod's routes and the host end's addresses and routes, with the pod's own addresses and
/// the host veth's name replaced by placeholders, for comparing two plugins' layouts.
/// `inet ADDR/LEN` of each line of `ip -o addr show`, link-local addresses left out. The address
/// itself is tested, not the line: a host veth's random name can contain "fe80".
fn addresses(listing: &str) -> impl Iterator<Item = String> + '_ {
    listing
        .lines()
        .map(|l| l.split_whitespace().skip(2).take(2).collect::<Vec<_>>())
        .filter(|f| f.get(1).is_some_and(|a| !a.starts_with("fe80:")))
        .map(|f| f.join(" "))
}

fn layout(pod: &Netns, r: &CniResult, rt: &RuntimeConf, n: u8) -> Vec<String> {
    let (a4, a6, veth) = (addr(r, true), addr(r, false), host_veth(r, rt));
    let mut lines = Vec::new();
    for args in [&["-4", "route"][..], &["-6", "route"]] {
        lines.extend(pod.sh("ip", args).lines().filter(|l| !l.starts_with("fe80")).map(str::to_string));
    }
    lines.extend(addresses(&pod.sh("ip", &["-o", "addr", "show", "eth0"])));
    for args in [&["-4", "route", "show", "dev", &veth][..], &["-6", "route", "show", "dev", &veth]] {
        lines.extend(sh("ip", args).lines().filter(|l| !l.starts_with("fe80")).map(|l| format!("host: {l}")));
    }
    lines.extend(addresses(&sh("ip", &["-o", "addr", "show", "dev", &veth])).map(|l| format!("host: {l}")));
    let mut lines: Vec<String> = lines
        .into_iter()
        .map(|l| l.replace(&a4, "POD4").replace(&a6, "POD6").replace(&veth, "VETH").trim().to_string())
        .map(|l| l.replace(&format!("10.202.{n}."), "NET4.").replace(&format!("fd00:202:{n}::"), "NET6::"))
        // `tentative` is the reference's host gateway still in DAD.
        .map(|l| l.replace(" tentative", ""))
        .collect();
    lines.sort();
    lines
}

#[test]
fn ptp_on_every_version() {
    for (i, version) in SUPPORTED.iter().enumerate() {
        attach_detach(version, 10 + i as u8);
    }
}

fn attach_detach(version: &str, n: u8) {
    let net = network(version, n, 24, json!({}));
    let pod1 = Netns::new("cnpa");
    let mut pod2 = Netns::new("cnpb");
    let (rt1, rt2) = (rt(&pod1), rt(&pod2));
    let r1 = net.add(&rt1).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
    let r2 = net.add(&rt2).unwrap_or_else(|e| panic!("{version}: ADD pod2: {e}"));
    let (gw4, gw6) = (format!("10.202.{n}.1"), format!("fd00:202:{n}::1"));
    let (a4, a6, veth1) = (addr(&r1, true), addr(&r1, false), host_veth(&r1, &rt1));

    // The result: [host veth, pod interface], the addresses on interface 1 (from 0.3.0 on).
    if at_least(version, "0.3.0") {
        assert_eq!(r1.interfaces.len(), 2, "{version}: {r1:?}");
        assert_eq!(r1.interfaces[1].sandbox.as_deref(), Some(pod1.path.as_str()), "{version}");
        assert!(r1.ips.iter().all(|ip| ip.interface == Some(1)), "{version}: {:?}", r1.ips);
    }

    // The reference's layout: the subnet through the gateway, the gateway as a link route, no
    // kernel subnet route; the host end holds the gateways as /32 and /128 and routes to the pod.
    let routes = pod1.sh("ip", &["-4", "route"]);
    for want in [
        format!("default via {gw4} dev eth0"),
        format!("10.202.{n}.0/24 via {gw4} dev eth0 src {a4}"),
        format!("{gw4} dev eth0 scope link src {a4}"),
    ] {
        assert!(routes.contains(&want), "{version}: no `{want}` in\n{routes}");
    }
    assert!(!routes.contains("proto kernel"), "{version}: the kernel's subnet route is left:\n{routes}");
    let routes6 = pod1.sh("ip", &["-6", "route"]);
    for want in [
        format!("default via {gw6} dev eth0"),
        format!("fd00:202:{n}::/64 via {gw6} dev eth0 src {a6}"),
        format!("{gw6} dev eth0 src {a6}"),
    ] {
        assert!(routes6.contains(&want), "{version}: no `{want}` in\n{routes6}");
    }
    assert!(!routes6.contains(&format!("fd00:202:{n}::/64 dev eth0 proto kernel")), "{version}:\n{routes6}");
    let host_addrs = sh("ip", &["-o", "addr", "show", "dev", &veth1]);
    assert!(host_addrs.contains(&format!("{gw4}/32")), "{version}: {host_addrs}");
    assert!(host_addrs.contains(&format!("{gw6}/128")), "{version}: {host_addrs}");
    let gw6_line = host_addrs.lines().find(|l| l.contains(&format!("{gw6}/128"))).unwrap_or_default();
    assert!(!gw6_line.contains("tentative"), "{version}: the host's gateway is still in DAD: {gw6_line}");
    let host_routes = sh("ip", &["-4", "route", "show", "dev", &veth1]);
    assert!(host_routes.contains(&format!("{a4} scope host")), "{version}: {host_routes}");
    let host_routes6 = sh("ip", &["-6", "route", "show", "dev", &veth1]);
    assert!(host_routes6.contains(&a6), "{version}: {host_routes6}");

    // Real traffic: the other pod and the host (the gateway is the host's), both families.
    assert!(pings(&pod1, &addr(&r2, true)), "{version}: pod1 cannot ping pod2 over IPv4");
    assert!(pings(&pod2, &a6), "{version}: pod2 cannot ping pod1 over IPv6");
    assert!(pings(&pod1, &gw4), "{version}: pod1 cannot ping the host at {gw4}");
    assert!(pings(&pod2, &gw6), "{version}: pod2 cannot ping the host at {gw6}");
    assert!(
        run("busybox", &["ping", "-c", "1", "-W", "2", &addr(&r2, true)]).status.success(),
        "{version}: the host cannot ping pod2"
    );

    if at_least(version, "0.4.0") {
        net.cni.check_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        // CHECK sees a broken layout: the host route to the pod removed.
        sh("ip", &["route", "del", &a4, "dev", &veth1]);
        let e = net.cni.check_network_list(&net.list, &rt1).expect_err("CHECK without the host route");
        assert_eq!(e.code, libcni::code::CHECK_FAILED, "{version}: {e}");
    }
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 4, "{version}");

    // DEL removes the veth (and with it the host's gateway address and route); a second DEL succeeds.
    net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
    assert!(!link_exists(&veth1), "{version}: host veth {veth1} survived DEL");
    assert!(!pod1.exec("ip", &["link", "show", "eth0"]).status.success(), "{version}: eth0 survived DEL");
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 2, "{version}: pod1's addresses not released");
    net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));
    // pod2 still works with pod1's host end (which held the same gateway) gone.
    assert!(pings(&pod2, &gw4), "{version}: pod2 lost the host with pod1's DEL");

    // DEL after the namespace is gone frees the addresses; the kernel removes the pair.
    let veth2 = host_veth(&r2, &rt2);
    pod2.delete();
    net.cni.del_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{version}: DEL without netns: {e}"));
    assert!(reservations(net.data.path(), &net.list.name).is_empty(), "{version}: addresses leaked");
    for _ in 0..50 {
        if !link_exists(&veth2) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!link_exists(&veth2), "{version}: {veth2} left after its namespace went");
}

/// An IPAM failure (the /30 holds one pod) leaves no veth, no address and no rule.
#[test]
fn failed_add_leaves_nothing() {
    let net = network("1.1.0", 40, 30, json!({ "ipMasq": true }));
    let (pod1, pod2) = (Netns::new("cnpc"), Netns::new("cnpd"));
    let (rt1, rt2) = (rt(&pod1), rt(&pod2));
    net.add(&rt1).expect("ADD of the only pod that fits");
    let e = net.add(&rt2).expect_err("the /30 is full");
    assert_eq!(e.code, libcni::code::RANGE_EXHAUSTED, "{e}");
    assert!(!pod2.exec("ip", &["link", "show", "eth0"]).status.success(), "eth0 left after the failed ADD");
    for attempt in 0..8 {
        let name = netkit::iface::naming::host_veth_name(&rt2.container_id, "eth0", attempt);
        assert!(!link_exists(&name), "host veth {name} left after the failed ADD");
    }
    let rules = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!rules.contains(&rt2.container_id), "masquerade left for the failed ADD:\n{rules}");
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 2, "the failed ADD kept an address");
    net.cni.del_network_list(&net.list, &rt1).expect("DEL");
    assert!(reservations(net.data.path(), &net.list.name).is_empty(), "DEL left the addresses");
}

/// `mtu` on both ends, and `ipMasq` on each backend: the pod reaches a host that has no route back
/// to the pod subnet, so only a masqueraded packet is answered; DEL removes the rules.
#[test]
fn mtu_and_masquerade() {
    for (i, backend) in ["nftables", "iptables"].into_iter().enumerate() {
        let net = network("1.0.0", 50 + i as u8, 24, json!({ "ipMasq": true, "ipMasqBackend": backend, "mtu": 1400 }));
        let pod = Netns::new("cnpm");
        let _remote = RemoteHost::up();
        let r = rt(&pod);
        let res = net.add(&r).unwrap_or_else(|e| panic!("{backend}: ADD: {e}"));
        assert!(pod.sh("ip", &["link", "show", "eth0"]).contains("mtu 1400"), "{backend}: pod mtu");
        assert!(sh("ip", &["link", "show", &host_veth(&res, &r)]).contains("mtu 1400"), "{backend}: host end mtu");
        assert!(pings(&pod, RemoteHost::ADDR), "{backend}: the pod cannot reach the remote host through masquerade");
        net.cni.check_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{backend}: CHECK: {e}"));
        net.cni.del_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{backend}: DEL: {e}"));
        let subnet = format!("10.202.{}.", 50 + i);
        let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
        let ipt = String::from_utf8_lossy(&run("iptables-save", &[]).stdout).into_owned();
        for (what, rules) in [("nft", &nft), ("iptables", &ipt)] {
            assert!(!rules.contains(&subnet), "{backend}: {what} still mentions the pod address:\n{rules}");
            assert!(!rules.contains(&r.container_id), "{backend}: {what} still mentions the container id");
        }
    }
}

/// A node switching between the reference ptp and ours: for the same configuration both program
/// the same addresses and routes; ours DELs what the reference ADDed (veth, address, its iptables
/// masquerade chain), and the reference DELs what ours ADDed.
#[test]
fn compatible_with_the_reference_ptp() {
    assert!(
        Path::new(REFERENCE).join("ptp").exists(),
        "the reference ptp is missing: install containernetworking-plugins"
    );
    // Both through the same directory of plugins: ptp and host-local from one side each time.
    let reference = PathBuf::from(REFERENCE);
    let n = 60;
    // iptables: the reference's only masquerade; our DEL finds its chain.
    let net = network("1.0.0", n, 24, json!({ "ipMasq": true }));
    let theirs = net.with_plugins(&reference);

    let pod_ref = Netns::new("cnpf");
    let rt_ref = rt(&pod_ref);
    let r_ref = net.add_with(&theirs, &rt_ref).expect("reference ADD");
    let pod_ours = Netns::new("cnpo");
    let rt_ours = rt(&pod_ours);
    let r_ours = net.add(&rt_ours).expect("our ADD");
    assert_eq!(
        layout(&pod_ours, &r_ours, &rt_ours, n),
        layout(&pod_ref, &r_ref, &rt_ref, n),
        "our layout differs from the reference's"
    );
    // The reference's host gateway stays in IPv6 DAD for a second or two: its pod reaches nothing
    // over IPv6 until then.
    let veth_ref = host_veth(&r_ref, &rt_ref);
    for _ in 0..50 {
        if sh("ip", &["-6", "addr", "show", "dev", &veth_ref, "tentative"]).trim().is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(pings(&pod_ours, &addr(&r_ref, true)), "our pod cannot reach the reference's");
    assert!(pings(&pod_ref, &addr(&r_ours, false)), "the reference's pod cannot reach ours over IPv6");

    let chain_of = |id: &str| {
        let ipt = String::from_utf8_lossy(&run("iptables-save", &["-t", "nat"]).stdout).into_owned();
        ipt.lines().any(|l| l.contains(&format!("id: \\\"{id}\\\"")) || l.contains(&format!("id: \"{id}\"")))
    };
    assert!(chain_of(&rt_ref.container_id), "the reference added no iptables masquerade");
    net.cni.del_network_list(&net.list, &rt_ref).expect("our DEL of the reference's pod");
    assert!(!link_exists(&veth_ref), "{veth_ref} left");
    assert!(!chain_of(&rt_ref.container_id), "the reference's masquerade left after our DEL");
    let left: Vec<_> = reservations(net.data.path(), &net.list.name);
    assert_eq!(left.len(), 2, "the reference's addresses not released: {left:?}");

    net.cni.del_network_list(&net.list, &rt_ours).expect("our DEL");

    // The reference DELs ours. Its DEL fails on masquerade rules it cannot find, so a node that may
    // switch back runs ours with `ipMasqBackend: iptables`: the reference's chains and comments.
    let back = network("1.0.0", n + 1, 24, json!({ "ipMasq": true, "ipMasqBackend": "iptables" }));
    let pod = Netns::new("cnpg");
    let rt_back = rt(&pod);
    let r = back.add(&rt_back).expect("our ADD on iptables");
    assert!(chain_of(&rt_back.container_id), "our iptables masquerade is not the reference's");
    let veth = host_veth(&r, &rt_back);
    back.with_plugins(&reference).del_network_list(&back.list, &rt_back).expect("reference DEL of our pod");
    assert!(!link_exists(&veth), "{veth} left");
    assert!(!chain_of(&rt_back.container_id), "our masquerade left after the reference's DEL");
    assert!(reservations(back.data.path(), &back.list.name).is_empty(), "our addresses not released");
}
