//! static as the IPAM of bridge, through libcni, in real namespaces: the pod gets exactly the
//! configured address, gateway and routes, on every spec version; the precedence of the address
//! sources; results per version; DEL twice and with the netns gone; GC and STATUS. Privileged;
//! subnets 10.247.x.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{json_of, Call};
use cni_tests::{bin_dir, pings, require_root, unique, LinkGuard, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Map, Value};
use std::process::Command;

const VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn list(name: &str, version: &str, bridge: &str, ipam: Value, caps: bool) -> NetworkConfigList {
    let mut b = json!({"type": "bridge", "bridge": bridge, "isGateway": true, "ipam": ipam});
    if caps {
        b["capabilities"] = json!({"ips": true});
    }
    let v = json!({"cniVersion": version, "name": name, "plugins": [b]});
    NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap()
}

fn rt(ns: &Netns, args: Vec<(String, String)>, caps: Map<String, Value>) -> RuntimeConf {
    RuntimeConf {
        container_id: unique("ctrs"),
        netns: ns.path.clone(),
        ifname: "eth0".into(),
        args,
        capability_args: caps,
    }
}

fn global_addrs(ns: &Netns) -> Vec<String> {
    let out = ns.sh("ip", &["-o", "addr", "show", "dev", "eth0", "scope", "global"]);
    out.lines().filter_map(|l| l.split_whitespace().nth(3).map(str::to_string)).collect()
}

fn routes(ns: &Netns, family: &str) -> String {
    ns.sh("ip", &[family, "route", "show", "dev", "eth0"])
}

/// A pod on bridge+static gets exactly the configured address, its gateway as default route and
/// the extra route, and reaches the gateway; DEL twice succeeds and leaves no interface. Every
/// version (0.1.0/0.2.0 results go through the ip4 shape).
#[test]
fn bridge_with_static_gives_the_pod_exactly_its_address_on_every_version() {
    require_root();
    let cache = TempDir::new("cns-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    for (i, version) in VERSIONS.iter().enumerate() {
        let bridge = LinkGuard(unique("cns"));
        let pod = Netns::new("cnsp");
        let ipam = json!({"type": "static",
            "addresses": [{"address": format!("10.247.{i}.5/24"), "gateway": format!("10.247.{i}.1")}],
            "routes": [{"dst": "0.0.0.0/0"}, {"dst": "10.99.0.0/16", "gw": format!("10.247.{i}.254")}],
            "dns": {"nameservers": ["10.247.0.53"], "search": ["example.com"]}});
        let l = list(&unique("nets"), version, &bridge.0, ipam, false);
        let r = rt(&pod, vec![], Map::new());
        let result = cni.add_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
        let ip = &result.ips[0];
        assert_eq!(ip.address.to_string(), format!("10.247.{i}.5/24"), "{version}");
        assert_eq!(ip.gateway.map(|g| g.to_string()), Some(format!("10.247.{i}.1")), "{version}");
        assert_eq!(result.routes.len(), 2, "{version}: {result:?}");
        assert_eq!(result.dns.nameservers, ["10.247.0.53"], "{version}");

        assert_eq!(global_addrs(&pod), [format!("10.247.{i}.5/24")], "{version}");
        let table = routes(&pod, "-4");
        assert!(table.contains(&format!("default via 10.247.{i}.1")), "{version}: {table}");
        assert!(table.contains(&format!("10.99.0.0/16 via 10.247.{i}.254")), "{version}: {table}");
        assert!(pings(&pod, &format!("10.247.{i}.1")), "{version}: the pod cannot ping its gateway");
        if *version >= "0.4.0" {
            cni.check_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        }
        if *version >= "1.1.0" {
            cni.status_network_list(&l).unwrap();
            cni.gc_network_list(&l, Some(&[])).unwrap();
        }
        cni.del_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "{version}: eth0 left after DEL");
        cni.del_network_list(&l, &r).unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));
    }
}

/// Dual stack: one IPv4 and one IPv6 address with their gateways land in the pod.
#[test]
fn dual_stack_addresses_and_gateways() {
    require_root();
    let cache = TempDir::new("cns-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let bridge = LinkGuard(unique("cns"));
    let pod = Netns::new("cnsp");
    let ipam = json!({"type": "static", "addresses": [
        {"address": "10.247.20.5/24", "gateway": "10.247.20.1"},
        {"address": "fd47:20::5/64", "gateway": "fd47:20::1"}],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]});
    let l = list(&unique("nets"), "1.0.0", &bridge.0, ipam, false);
    let r = rt(&pod, vec![], Map::new());
    cni.add_network_list(&l, &r).unwrap();
    let addrs = global_addrs(&pod);
    assert_eq!(addrs, ["10.247.20.5/24", "fd47:20::5/64"]);
    assert!(routes(&pod, "-6").contains("default via fd47:20::1"), "{}", routes(&pod, "-6"));
    assert!(routes(&pod, "-4").contains("default via 10.247.20.1"));
    assert!(pings(&pod, "10.247.20.1"));
    cni.del_network_list(&l, &r).unwrap();
}

/// runtimeConfig.ips (the `ips` capability) beats args.cni.ips, which beats the configured
/// addresses plus CNI_ARGS IP; the pod gets what wins.
#[test]
fn address_sources_take_precedence_as_the_reference_orders_them() {
    require_root();
    let cache = TempDir::new("cns-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let bridge = LinkGuard(unique("cns"));
    let ipam = json!({"type": "static", "addresses": [{"address": "10.247.30.5/24", "gateway": "10.247.30.1"}]});
    let name = unique("nets");
    // Runtimes send IgnoreUnknown=1 with these: the interface plugin in front of the IPAM
    // plugin reads CNI_ARGS too and does not know every IPAM key.
    let cni_args = vec![
        ("IgnoreUnknown".to_string(), "1".to_string()),
        ("IP".into(), "10.247.31.5/24".into()),
        ("GATEWAY".into(), "10.247.31.1".into()),
    ];

    // Config plus CNI_ARGS IP: both addresses.
    let pod = Netns::new("cnsp");
    let l = list(&name, "1.0.0", &bridge.0, ipam.clone(), true);
    let r = rt(&pod, cni_args.clone(), Map::new());
    let res = cni.add_network_list(&l, &r).unwrap();
    assert_eq!(global_addrs(&pod), ["10.247.30.5/24", "10.247.31.5/24"]);
    assert_eq!(res.ips[1].gateway.map(|g| g.to_string()).as_deref(), Some("10.247.31.1"));
    cni.del_network_list(&l, &r).unwrap();

    // args.cni.ips replaces both.
    let pod = Netns::new("cnsp");
    let mut v: Value = json!({"cniVersion": "1.0.0", "name": name, "plugins": [
        {"type": "bridge", "bridge": bridge.0, "isGateway": true, "ipam": ipam,
         "capabilities": {"ips": true}, "args": {"cni": {"ips": ["10.247.32.5/24"]}}}]});
    let l = NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap();
    let r = rt(&pod, cni_args.clone(), Map::new());
    cni.add_network_list(&l, &r).unwrap();
    assert_eq!(global_addrs(&pod), ["10.247.32.5/24"]);
    cni.del_network_list(&l, &r).unwrap();

    // runtimeConfig.ips replaces all of them.
    let pod = Netns::new("cnsp");
    let mut caps = Map::new();
    caps.insert("ips".into(), json!(["10.247.33.5/24"]));
    v["plugins"][0]["capabilities"] = json!({"ips": true});
    let l = NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap();
    let r = rt(&pod, cni_args, caps);
    cni.add_network_list(&l, &r).unwrap();
    assert_eq!(global_addrs(&pod), ["10.247.33.5/24"]);
    cni.del_network_list(&l, &r).unwrap();
}

/// CNI_ARGS `IP` and `GATEWAY` without `IgnoreUnknown`: bridge accepts both keys its IPAM reads,
/// and the pod gets that address with that gateway as its default route; CHECK and DEL take the
/// same CNI_ARGS.
#[test]
fn cni_args_ip_and_gateway_reach_static_through_bridge_without_ignore_unknown() {
    require_root();
    let cache = TempDir::new("cns-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let bridge = LinkGuard(unique("cns"));
    let pod = Netns::new("cnsp");
    let ipam = json!({"type": "static", "routes": [{"dst": "0.0.0.0/0"}]});
    let l = list(&unique("nets"), "1.0.0", &bridge.0, ipam, false);
    let args = vec![("IP".to_string(), "10.247.34.5/24".to_string()), ("GATEWAY".into(), "10.247.34.1".into())];
    let r = rt(&pod, args, Map::new());
    let res = cni.add_network_list(&l, &r).unwrap_or_else(|e| panic!("ADD with CNI_ARGS IP and GATEWAY: {e}"));
    assert_eq!(res.ips[0].gateway.map(|g| g.to_string()).as_deref(), Some("10.247.34.1"));
    assert_eq!(global_addrs(&pod), ["10.247.34.5/24"]);
    assert!(routes(&pod, "-4").contains("default via 10.247.34.1"), "{}", routes(&pod, "-4"));
    assert!(pings(&pod, "10.247.34.1"), "the pod cannot ping its gateway");
    cni.check_network_list(&l, &r).unwrap();
    cni.del_network_list(&l, &r).unwrap();
    assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "eth0 left after DEL");
}

struct Ran {
    code: Option<i32>,
    stdout: Value,
}

fn exec(command: &str, conf: &Value, netns: &str, cni_args: &str) -> Ran {
    let mut cmd = Command::new(bin_dir().join("static"));
    cmd.env_clear();
    let out = Call::new(command, "ctr-static", netns).path(bin_dir()).args(cni_args).run(cmd, conf);
    Ran { code: out.status.code(), stdout: json_of(&out.stdout) }
}

/// The result of each version has that version's shape: `ip4`/`ip6` blocks with their routes for
/// 0.1.0/0.2.0, `ips[].version` for 0.3.x/0.4.0, neither for 1.x.
#[test]
fn results_have_each_versions_shape() {
    let ipam = json!({"type": "static", "addresses": [
        {"address": "10.247.40.5/24", "gateway": "10.247.40.1"}, {"address": "fd47:40::5/64"}],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.247.40.1"}, {"dst": "::/0"}],
        "dns": {"nameservers": ["10.247.40.53"]}});
    for version in VERSIONS {
        let conf = json!({"cniVersion": version, "name": "nets", "type": "bridge", "ipam": ipam});
        let ran = exec("ADD", &conf, "/proc/self/ns/net", "");
        assert_eq!(ran.code, Some(0), "{version}: {}", ran.stdout);
        let r = &ran.stdout;
        assert_eq!(r["cniVersion"], version);
        assert_eq!(r["dns"]["nameservers"], json!(["10.247.40.53"]), "{version}");
        if version < "0.3.0" {
            assert_eq!(r["ip4"]["ip"], "10.247.40.5/24", "{version}: {r}");
            assert_eq!(r["ip4"]["gateway"], "10.247.40.1", "{version}: {r}");
            assert_eq!(r["ip4"]["routes"], json!([{"dst": "0.0.0.0/0", "gw": "10.247.40.1"}]), "{version}: {r}");
            assert_eq!(r["ip6"]["ip"], "fd47:40::5/64", "{version}: {r}");
            assert_eq!(r["ip6"]["routes"], json!([{"dst": "::/0"}]), "{version}: {r}");
            assert!(r.get("ips").is_none());
        } else {
            assert_eq!(r["ips"][0]["address"], "10.247.40.5/24", "{version}: {r}");
            assert_eq!(r["ips"][1]["address"], "fd47:40::5/64", "{version}: {r}");
            assert!(r["ips"][0].get("interface").is_none(), "{version}: {r}");
            let has_version = r["ips"][0].get("version").is_some();
            assert_eq!(has_version, version < "1.0.0", "{version}: {r}");
            assert_eq!(r["routes"].as_array().unwrap().len(), 2, "{version}: {r}");
        }
    }
}

/// The 1.1.0 route keys pass through to the result (and bridge installs them: mtu, advmss,
/// priority as metric, a table).
#[test]
fn route_keys_of_1_1_0_reach_the_pod() {
    require_root();
    let cache = TempDir::new("cns-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let bridge = LinkGuard(unique("cns"));
    let pod = Netns::new("cnsp");
    let ipam = json!({"type": "static", "addresses": [{"address": "10.247.50.5/24", "gateway": "10.247.50.1"}],
        "routes": [{"dst": "10.98.0.0/16", "gw": "10.247.50.1", "mtu": 1400, "advmss": 1360, "priority": 77},
                   {"dst": "10.97.0.0/16", "gw": "10.247.50.1", "table": 150}]});
    let l = list(&unique("nets"), "1.1.0", &bridge.0, ipam, false);
    let r = rt(&pod, vec![], Map::new());
    let res = cni.add_network_list(&l, &r).unwrap();
    assert_eq!(res.routes[0].mtu, Some(1400));
    assert_eq!(res.routes[1].table, Some(150));
    let main = routes(&pod, "-4");
    assert!(main.contains("10.98.0.0/16 via 10.247.50.1"), "{main}");
    assert!(main.contains("metric 77") && main.contains("mtu 1400") && main.contains("advmss 1360"), "{main}");
    let t150 = pod.sh("ip", &["-4", "route", "show", "table", "150"]);
    assert!(t150.contains("10.97.0.0/16 via 10.247.50.1"), "{t150}");
    cni.del_network_list(&l, &r).unwrap();
}

/// DEL has nothing to release: it succeeds twice, without a netns, and on a configuration that no
/// longer validates; ADD refuses that configuration with code 7 and CNI_ARGS trouble with code 4.
#[test]
fn del_always_succeeds_and_add_refuses_bad_input() {
    let good = json!({"cniVersion": "1.1.0", "name": "nets", "type": "bridge",
        "ipam": {"type": "static", "addresses": [{"address": "10.247.60.5/24"}]}});
    for _ in 0..2 {
        assert_eq!(exec("DEL", &good, "", "").code, Some(0));
    }
    let bad = json!({"cniVersion": "1.1.0", "name": "nets", "type": "bridge",
        "ipam": {"type": "static", "addresses": [{"address": "10.247.60.5"}]}});
    assert_eq!(exec("DEL", &bad, "/var/run/netns/gone-forever", "").code, Some(0));
    let ran = exec("ADD", &bad, "/proc/self/ns/net", "");
    assert_eq!((ran.code, ran.stdout["code"].clone()), (Some(1), json!(7)), "{}", ran.stdout);
    assert!(ran.stdout["msg"].as_str().unwrap().contains("ipam.addresses[0].address"));
    let ran = exec("ADD", &good, "/proc/self/ns/net", "IP=10.247.61.5");
    assert_eq!(ran.stdout["code"], 4, "{}", ran.stdout);
    let ran = exec("ADD", &good, "/proc/self/ns/net", "FOO=bar");
    assert_eq!(ran.stdout["code"], 4, "{}", ran.stdout);
    for cmd in ["GC", "STATUS"] {
        assert_eq!(exec(cmd, &good, "", "").code, Some(0), "{cmd}");
    }
}
