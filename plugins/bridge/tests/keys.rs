#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! bridge keys with real effects: MAC, MTU, hairpin, port isolation, promisc, no gateway, L2 only,
//! forceAddress, masquerade to a host with no route back, and undo of a failed ADD.

use cni_tests::{bin_dir, bridge_ports, pings, run, sh, unique, Attachments, LinkGuard, Netns, RemoteHost, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Map, Value};

struct Net {
    /// Declared first: every attachment ADDed is DELed again before the bridge and data go.
    attached: Attachments,
    list: NetworkConfigList,
    cni: CniConfig,
    _data: TempDir,
    _cache: TempDir,
    bridge: LinkGuard,
}

fn network(bridge_keys: Value, subnet: Option<&str>) -> Net {
    let bridge = unique("cnb");
    let data = TempDir::new("cnb-ipam");
    let cache = TempDir::new("cnb-cache");
    let mut plugin = json!({ "type": "bridge", "bridge": bridge });
    if let Some(subnet) = subnet {
        plugin["ipam"] = json!({ "type": "host-local", "ranges": [[{ "subnet": subnet }]], "dataDir": data.path() });
    }
    for (k, v) in bridge_keys.as_object().expect("object") {
        plugin[k] = v.clone();
    }
    let list = json!({ "cniVersion": "1.1.0", "name": unique("netb"), "plugins": [plugin] });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    Net { attached: Attachments::new(&cni, &list), list, cni, _data: data, _cache: cache, bridge: LinkGuard(bridge) }
}

impl Net {
    fn add(&self, rt: &RuntimeConf) -> libcni::Result<libcni::CniResult> {
        self.attached.add(rt)
    }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf { container_id: unique("ctr"), netns: ns.path.clone(), ifname: "eth0".into(), ..Default::default() }
}

fn host_port_of(net: &Net) -> String {
    bridge_ports(&net.bridge.0).into_iter().next().expect("one port on the bridge")
}

#[test]
fn mac_mtu_hairpin_isolation() {
    let net = network(
        json!({ "isGateway": true, "mtu": 1400, "hairpinMode": true, "portIsolation": true, "capabilities": { "mac": true } }),
        Some("10.201.1.0/24"),
    );
    let pod = Netns::new("cnbp");
    let mut r = rt(&pod);
    let mut caps = Map::new();
    // In Go's dotted form (net.ParseMAC reads it, so the reference's bridge takes it).
    caps.insert("mac".into(), json!("0a58.0ac9.0163"));
    r.capability_args = caps;
    let result = net.add(&r).expect("ADD");
    let link = pod.sh("ip", &["-o", "link", "show", "eth0"]);
    assert!(link.contains("0a:58:0a:c9:01:63"), "runtimeConfig.mac not applied: {link}");
    assert!(link.contains("mtu 1400"), "mtu not applied in the pod: {link}");
    // Set over netlink (IFLA_INET_CONF), read back through the sysctl file.
    let arp_notify = pod.sh("cat", &["/proc/sys/net/ipv4/conf/eth0/arp_notify"]);
    assert_eq!(arp_notify.trim(), "1", "arp_notify not set on the pod's interface");
    assert_eq!(result.interfaces[2].mac.as_deref(), Some("0a:58:0a:c9:01:63"));
    assert_eq!(result.interfaces[2].sandbox.as_deref(), Some(pod.path.as_str()));
    assert_eq!(result.ips[0].interface, Some(2));
    let port = host_port_of(&net);
    assert_eq!(result.interfaces[1].name, port);
    let details = sh("bridge", &["-d", "link", "show", "dev", &port]);
    assert!(details.contains("hairpin on"), "hairpin not set: {details}");
    assert!(details.contains("isolated on"), "isolation not set: {details}");
    assert!(sh("ip", &["-o", "link", "show", &net.bridge.0]).contains("mtu 1400"), "bridge mtu");
    assert!(pings(&pod, "10.201.1.1"));
    net.cni.check_network_list(&net.list, &r).expect("CHECK");
    net.cni.del_network_list(&net.list, &r).expect("DEL");
}

#[test]
fn check_fails_when_the_pod_lost_its_address() {
    let net = network(json!({ "isGateway": true }), Some("10.201.2.0/24"));
    let pod = Netns::new("cnbc");
    let r = rt(&pod);
    let result = net.add(&r).expect("ADD");
    net.cni.check_network_list(&net.list, &r).expect("CHECK right after ADD");
    let addr = result.ips[0].address.to_string();
    pod.sh("ip", &["addr", "del", &addr, "dev", "eth0"]);
    let err = net.cni.check_network_list(&net.list, &r).expect_err("CHECK must notice the missing address");
    assert!(err.msg.contains(&result.ips[0].address.ip().to_string()), "{err}");
    net.cni.del_network_list(&net.list, &r).expect("DEL");
}

#[test]
fn no_gateway_and_l2_only() {
    // Without isGateway the bridge holds no address; without ipam the pod gets a link and no address.
    let net = network(json!({}), Some("10.201.3.0/24"));
    let pod = Netns::new("cnbn");
    let r = rt(&pod);
    net.add(&r).expect("ADD");
    assert!(!sh("ip", &["-o", "-4", "addr", "show", &net.bridge.0]).contains("inet "), "bridge got an address");
    net.cni.del_network_list(&net.list, &r).expect("DEL");

    let l2 = network(json!({}), None);
    let pod = Netns::new("cnbl");
    let r = rt(&pod);
    let result = l2.add(&r).expect("L2 ADD");
    assert!(result.ips.is_empty());
    assert!(pod.sh("ip", &["-o", "link", "show", "eth0"]).contains("UP"), "L2 pod interface is down");
    l2.cni.check_network_list(&l2.list, &r).expect("L2 CHECK");
    l2.cni.del_network_list(&l2.list, &r).expect("L2 DEL");
}

#[test]
fn conflicting_bridge_address_needs_force_address() {
    let net = network(json!({ "isGateway": true }), Some("10.201.4.0/24"));
    sh("ip", &["link", "add", &net.bridge.0, "type", "bridge"]);
    sh("ip", &["addr", "add", "10.201.4.254/24", "dev", &net.bridge.0]);
    let pod = Netns::new("cnbf");
    let r = rt(&pod);
    let err = net.add(&r).expect_err("a conflicting address must fail");
    assert!(err.msg.contains("forceAddress"), "{err}");
    // The failed ADD undid itself: no port, no pod interface, no reservation.
    assert!(bridge_ports(&net.bridge.0).is_empty());
    assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success());
    net.cni.del_network_list(&net.list, &r).expect("DEL after failed ADD");

    let forced = network(json!({ "isGateway": true, "forceAddress": true }), Some("10.201.5.0/24"));
    sh("ip", &["link", "add", &forced.bridge.0, "type", "bridge"]);
    sh("ip", &["addr", "add", "10.201.5.254/24", "dev", &forced.bridge.0]);
    forced.add(&r).expect("ADD with forceAddress");
    let addrs = sh("ip", &["-o", "-4", "addr", "show", &forced.bridge.0]);
    assert!(addrs.contains("10.201.5.1/24") && !addrs.contains("10.201.5.254"), "{addrs}");
    forced.cni.del_network_list(&forced.list, &r).expect("DEL");
}

#[test]
fn failed_ipam_undoes_the_veth() {
    // A /30 has one address for pods: the second ADD fails in IPAM and must leave nothing.
    let net = network(json!({ "isGateway": true }), Some("10.201.6.0/30"));
    let (a, b) = (Netns::new("cnbu"), Netns::new("cnbv"));
    let (ra, rb) = (rt(&a), rt(&b));
    net.add(&ra).expect("first ADD");
    let err = net.add(&rb).expect_err("second ADD must exhaust the range");
    assert_eq!(err.code, 101, "{err}");
    assert!(!b.exec("ip", &["link", "show", "eth0"]).status.success(), "pod interface left after failed ADD");
    let ports = bridge_ports(&net.bridge.0);
    assert_eq!(ports.len(), 1, "host veth left after failed ADD: {ports:?}");
    net.cni.del_network_list(&net.list, &ra).expect("DEL");
}

/// A bridge network whose `ipam` is `ipam`, with plugins looked up in `path` (then the build's).
fn network_with_ipam(bridge: &str, ipam: Value, path: &[&std::path::Path]) -> (NetworkConfigList, CniConfig, TempDir) {
    let cache = TempDir::new("cnb-cache");
    let plugin = json!({ "type": "bridge", "bridge": bridge, "isGateway": true, "ipam": ipam });
    let list = json!({ "cniVersion": "1.1.0", "name": unique("netb"), "plugins": [plugin] });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let mut dirs: Vec<_> = path.iter().map(|p| p.to_path_buf()).collect();
    dirs.push(bin_dir());
    let cni = CniConfig::with_cache_dir(dirs, cache.path().to_path_buf());
    (list, cni, cache)
}

fn link_exists(name: &str) -> bool {
    run("ip", &["link", "show", name]).status.success()
}

#[test]
fn an_add_refused_for_its_ipam_leaves_no_bridge() {
    let plugins = TempDir::new("cnb-path");
    let failing = plugins.path().join("failing-ipam");
    std::fs::write(
        &failing,
        "#!/bin/sh\necho '{\"cniVersion\":\"1.1.0\",\"code\":11,\"msg\":\"try again later\"}'\nexit 1\n",
    )
    .expect("write the failing IPAM plugin");
    sh("chmod", &["755", &failing.display().to_string()]);
    let data = TempDir::new("cnb-ipam");
    let cases = [
        ("an unknown IPAM type", json!({ "type": "no-such-ipam" }), 7),
        (
            "a malformed range",
            json!({ "type": "host-local", "ranges": [[{ "subnet": "10.201.9.0/33" }]], "dataDir": data.path() }),
            7,
        ),
        (
            "a range outside its subnet",
            json!({ "type": "host-local", "ranges": [[{ "subnet": "10.201.9.0/24", "rangeStart": "10.201.10.5" }]], "dataDir": data.path() }),
            7,
        ),
        ("an IPAM plugin that fails", json!({ "type": "failing-ipam" }), 11),
    ];
    for (what, ipam, code) in cases {
        let bridge = LinkGuard(unique("cnbr"));
        let (list, cni, _cache) = network_with_ipam(&bridge.0, ipam, &[plugins.path()]);
        let pod = Netns::new("cnbr");
        let r = rt(&pod);
        let err = cni.add_network_list(&list, &r).expect_err(what);
        assert_eq!(err.code, code, "{what}: {err}");
        assert!(!link_exists(&bridge.0), "{what}: the failed ADD left bridge {}", bridge.0);
        let veth = bridge::host_veth_name(&r.container_id, &r.ifname, 0);
        assert!(!link_exists(&veth), "{what}: the failed ADD left host veth {veth}");
        assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "{what}: pod interface left");
    }
    // A bridge this ADD did not create stays, with the port another pod has on it.
    let net = network(json!({ "isGateway": true }), Some("10.201.9.0/24"));
    let a = Netns::new("cnbr");
    net.add(&rt(&a)).expect("ADD of the pod that keeps the bridge");
    let (list, cni, _cache) = network_with_ipam(&net.bridge.0, json!({ "type": "failing-ipam" }), &[plugins.path()]);
    let b = Netns::new("cnbr");
    cni.add_network_list(&list, &rt(&b)).expect_err("ADD through the failing IPAM plugin");
    assert!(link_exists(&net.bridge.0), "a failed ADD removed a bridge it did not create");
    assert_eq!(bridge_ports(&net.bridge.0).len(), 1, "the other pod's port must stay, and only it");
}

#[test]
fn masquerade_reaches_a_host_with_no_route_back() {
    for backend in ["nftables", "iptables"] {
        let net = network(
            json!({ "isGateway": true, "isDefaultGateway": true, "ipMasq": true, "ipMasqBackend": backend }),
            Some("10.201.7.0/24"),
        );
        let pod = Netns::new("cnbm");
        let _remote = RemoteHost::up();
        let r = rt(&pod);
        net.add(&r).unwrap_or_else(|e| panic!("{backend}: ADD: {e}"));
        assert!(pings(&pod, RemoteHost::ADDR), "{backend}: the pod cannot reach the remote host through masquerade");
        net.cni.check_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{backend}: CHECK: {e}"));
        net.cni.del_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{backend}: DEL: {e}"));
        let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
        let ipt = String::from_utf8_lossy(&run("iptables-save", &[]).stdout).into_owned();
        for (what, rules) in [("nft", &nft), ("iptables", &ipt)] {
            assert!(!rules.contains("10.201.7."), "{backend}: {what} still mentions the pod address:\n{rules}");
            assert!(!rules.contains(&r.container_id), "{backend}: {what} still mentions the container id");
        }
    }
}

#[test]
fn macspoofchk_drops_frames_with_another_source_mac() {
    let net = network(json!({ "isGateway": true, "macspoofchk": true }), Some("10.201.8.0/24"));
    let pod = Netns::new("cnbs");
    let r = rt(&pod);
    let result = net.add(&r).expect("ADD");
    let mac = result.interfaces[2].mac.clone().expect("pod MAC");
    assert!(pings(&pod, "10.201.8.1"), "the pod cannot reach its gateway with its own MAC");
    net.cni.check_network_list(&net.list, &r).expect("CHECK");
    pod.sh("ip", &["link", "set", "eth0", "address", "0a:58:de:ad:be:ef"]);
    pod.sh("ip", &["neigh", "flush", "all"]);
    assert!(!pings(&pod, "10.201.8.1"), "a spoofed source MAC got through");
    pod.sh("ip", &["link", "set", "eth0", "address", &mac]);
    assert!(pings(&pod, "10.201.8.1"), "the pod's own MAC is blocked after it was restored");
    net.cni.del_network_list(&net.list, &r).expect("DEL");
    let rules = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!rules.contains(&result.interfaces[1].name), "the spoof check survived DEL:\n{rules}");
    net.cni.del_network_list(&net.list, &r).expect("second DEL");
}

#[test]
fn host_veth_name_collision_never_touches_the_other_link() {
    // Another link already holds the name this attachment's host end would get first (as after a
    // hash collision with another pod): ADD must pick another name, and DEL must leave that link alone.
    let net = network(json!({ "isGateway": true }), Some("10.201.9.0/24"));
    let mut pod = Netns::new("cnbk");
    let r = rt(&pod);
    let taken = bridge::host_veth_name(&r.container_id, &r.ifname, 0);
    let peer = unique("cnbo");
    sh("ip", &["link", "add", &taken, "type", "veth", "peer", "name", &peer]);
    let _other = LinkGuard(taken.clone());
    let result = net.add(&r).expect("ADD despite the taken name");
    assert_ne!(result.interfaces[1].name, taken);
    assert!(pings(&pod, "10.201.9.1"));
    net.cni.check_network_list(&net.list, &r).expect("CHECK");
    pod.delete();
    net.cni.del_network_list(&net.list, &r).expect("DEL after the namespace is gone");
    assert!(run("ip", &["link", "show", &taken]).status.success(), "DEL deleted another pod's link");
}

#[test]
fn gc_removes_masquerade_and_spoof_checks_of_attachments_not_kept() {
    let net = network(json!({ "isGateway": true, "ipMasq": true, "macspoofchk": true }), Some("10.201.10.0/24"));
    let (a, b) = (Netns::new("cnbg"), Netns::new("cnbh"));
    let (ra, rb) = (rt(&a), rt(&b));
    // Whatever the assertions say, both attachments are deleted at the end (Net's Attachments;
    // DEL works without cache).
    let ip_a = net.add(&ra).expect("ADD a").ips[0].address.ip().to_string();
    let result_b = net.add(&rb).expect("ADD b");
    let (ip_b, port_b) = (result_b.ips[0].address.ip().to_string(), result_b.interfaces[1].name.clone());
    // Lose the runtime's cache of b, so only the plugin's own GC can find b's rules.
    let cache = net.cni.cache_dir.join("results").join(format!("{}-{}-eth0", net.list.name, rb.container_id));
    std::fs::remove_file(&cache).expect("remove cache file");
    let keep = [libcni::conf::Attachment { container_id: ra.container_id.clone(), ifname: "eth0".into() }];
    net.cni.gc_network_list(&net.list, Some(&keep)).expect("GC");
    // GC gives b's elements an expiry of 1 ms: expired elements are not listed.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let rules = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    let element = |ip: &str| format!("{ip} : ");
    assert!(
        !rules.contains(&element(&ip_b)) && !rules.contains(&format!("\"{port_b}\"")),
        "GC left b's rules:\n{rules}"
    );
    assert!(rules.contains(&element(&ip_a)), "GC removed a's rules:\n{rules}");
    net.cni.check_network_list(&net.list, &ra).expect("CHECK a after GC");
    net.cni.del_network_list(&net.list, &ra).expect("DEL a");
    net.cni.del_network_list(&net.list, &rb).expect("DEL b without cache");
}

/// Chained after another plugin, bridge keeps that plugin's interfaces, addresses, routes and DNS in
/// its result (the spec: a plugin outputs the prevResult it got, modified); its own addresses point
/// at its own interfaces, after the earlier ones, and CHECK passes on the whole result.
#[test]
fn add_keeps_the_earlier_plugins_result() {
    let bridge = unique("cnb");
    let _bridge_guard = LinkGuard(bridge.clone());
    let data = TempDir::new("cnb-ipam");
    let cache = TempDir::new("cnb-cache");
    let pod = Netns::new("cnbk");
    // The earlier plugin's interface and address, for real in the pod.
    for args in [
        &["link", "add", "net0", "type", "veth", "peer", "name", "net0p"][..],
        &["addr", "add", "10.99.0.5/24", "dev", "net0"],
        &["link", "set", "net0p", "up"],
        &["link", "set", "net0", "up"],
        &["route", "add", "10.99.0.0/16", "dev", "net0"],
    ] {
        pod.sh("ip", args);
    }
    let earlier = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{ "name": "net0", "mac": "0a:58:0a:63:00:05", "sandbox": pod.path }],
        "ips": [{ "address": "10.99.0.5/24", "gateway": "10.99.0.1", "interface": 0 }],
        "routes": [{ "dst": "10.99.0.0/16" }],
        "dns": { "nameservers": ["10.99.0.53"] }
    });
    let debug = data.path().join("earlier.json");
    std::fs::write(&debug, json!({ "reportResult": earlier }).to_string()).expect("debug file");
    let list = json!({ "cniVersion": "1.1.0", "name": unique("netb"), "plugins": [
        { "type": "cni-noop", "debugFile": debug },
        { "type": "bridge", "bridge": bridge, "isGateway": true,
          "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.201.12.0/24" }]], "dataDir": data.path() } }
    ]});
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let r = rt(&pod);
    let result = cni.add_network_list(&list, &r).expect("ADD");

    let names: Vec<&str> = result.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert_eq!((names[0], names[1], names[3]), ("net0", bridge.as_str(), "eth0"), "{names:?}");
    assert_eq!(result.interfaces[0].mac.as_deref(), Some("0a:58:0a:63:00:05"));
    let ips: Vec<(String, Option<usize>)> =
        result.ips.iter().map(|ip| (ip.address.to_string(), ip.interface)).collect();
    assert_eq!(ips, [("10.99.0.5/24".to_string(), Some(0)), ("10.201.12.2/24".to_string(), Some(3))]);
    assert!(result.routes.iter().any(|rt| rt.dst.to_string() == "10.99.0.0/16"), "{:?}", result.routes);
    assert_eq!(result.dns.nameservers, ["10.99.0.53"]);
    // bridge's own address is on its own interface, the earlier one untouched.
    let eth0 = pod.sh("ip", &["-o", "addr", "show", "dev", "eth0"]);
    assert!(eth0.contains("10.201.12.2/24"), "{eth0}");
    assert!(pod.sh("ip", &["-o", "addr", "show", "dev", "net0"]).contains("10.99.0.5/24"));
    assert!(pings(&pod, "10.201.12.1"));
    cni.check_network_list(&list, &r).expect("CHECK on the chained result");
    cni.del_network_list(&list, &r).expect("DEL");
    assert!(bridge_ports(&bridge).is_empty());
}

/// Keys as Go's decoder takes them: a config written with the reference's Go field names (`IsGateway`,
/// `MTU`, `HairpinMode`, an `IPAM` object with `Type`/`Ranges`/`Subnet`) configures the same network.
#[test]
fn go_style_keys_configure_the_same_network() {
    let bridge = unique("cnb");
    let data = TempDir::new("cnb-ipam");
    let cache = TempDir::new("cnb-cache");
    let plugin = json!({ "type": "bridge", "Bridge": bridge, "IsGateway": true, "MTU": 1400, "HairpinMode": true,
        "IPAM": { "Type": "host-local", "Ranges": [[{ "Subnet": "10.201.11.0/24" }]], "DataDir": data.path() } });
    let list = json!({ "cniVersion": "1.1.0", "name": unique("netb"), "plugins": [plugin] });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let net = Net {
        attached: Attachments::new(&cni, &list),
        list,
        cni,
        _data: data,
        _cache: cache,
        bridge: LinkGuard(bridge),
    };
    let pod = Netns::new("cnbg");
    let r = rt(&pod);
    let result = net.add(&r).expect("ADD");
    assert_eq!(result.ips[0].address.to_string(), "10.201.11.2/24");
    let bridge_addr = sh("ip", &["-o", "-4", "addr", "show", &net.bridge.0]);
    assert!(bridge_addr.contains("10.201.11.1/24"), "IsGateway not applied: {bridge_addr}");
    assert!(pod.sh("ip", &["-o", "link", "show", "eth0"]).contains("mtu 1400"), "MTU not applied in the pod");
    let details = sh("bridge", &["-d", "link", "show", "dev", &host_port_of(&net)]);
    assert!(details.contains("hairpin on"), "HairpinMode not applied: {details}");
    assert!(pings(&pod, "10.201.11.1"));
    net.cni.check_network_list(&net.list, &r).expect("CHECK");
    net.cni.del_network_list(&net.list, &r).expect("DEL");
    assert!(bridge_ports(&net.bridge.0).is_empty(), "host veth left after DEL");
}
