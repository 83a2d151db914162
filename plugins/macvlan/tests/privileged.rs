//! macvlan with real traffic: pods on a master made for the test (a veth pair, both ends up, so
//! the master has a carrier) reach each other over IPv4 and IPv6 in bridge mode on every spec
//! version, private mode keeps them apart, `linkInContainer` finds the master in the pod, the
//! default master is the default route's interface, `mtu`, `mac` and `bcqueuelen` reach the link,
//! DEL is idempotent and succeeds with the namespace gone, a failed ADD leaves nothing, and the
//! reference macvlan and ours can each clean up after the other. Privileged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, pings, prerequisite, reservations, sh, unique, LinkGuard, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::version::{at_least, SUPPORTED};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A veth pair in the host namespace, both ends up: `master` carries the macvlans.
struct Master {
    name: String,
    _guard: LinkGuard,
}

impl Master {
    fn new() -> Master {
        let name = unique("mvm");
        let peer = unique("mvp");
        sh("ip", &["link", "add", &name, "type", "veth", "peer", "name", &peer]);
        let guard = LinkGuard(name.clone());
        sh("ip", &["link", "set", &peer, "up"]);
        sh("ip", &["link", "set", &name, "up"]);
        Master { name, _guard: guard }
    }
}

/// A macvlan network on `master` with host-local ranges `10.226.<n>.0/24` (and
/// `fd00:226:<n>::/64` with `v6`), its own data and cache directories.
struct Net {
    list: NetworkConfigList,
    cni: CniConfig,
    data: TempDir,
    cache: TempDir,
}

fn macvlan_conf(master: &str, n: u8, v6: bool, data: &Path, extra: Value) -> Value {
    let mut ranges = vec![json!([{ "subnet": format!("10.226.{n}.0/24") }])];
    if v6 {
        ranges.push(json!([{ "subnet": format!("fd00:226:{n}::/64") }]));
    }
    let mut conf = json!({
        "type": "macvlan", "master": master,
        "ipam": { "type": "host-local", "ranges": ranges, "dataDir": data }
    });
    cni_tests::merge(&mut conf, extra);
    conf
}

impl Net {
    fn new(version: &str, master: &str, n: u8, v6: bool, extra: Value) -> Net {
        let data = TempDir::new("mv-ipam");
        let cache = TempDir::new("mv-cache");
        let plugin = macvlan_conf(master, n, v6, data.path(), extra);
        let list = json!({ "cniVersion": version, "name": unique("mvnet"), "plugins": [plugin] });
        let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
        let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
        Net { list, cni, data, cache }
    }
    fn reservations(&self) -> Vec<(String, String)> {
        reservations(self.data.path(), &self.list.name)
    }
    fn use_plugins(&mut self, dir: &Path) {
        self.cni = CniConfig::with_cache_dir(vec![dir.to_path_buf()], self.cache.path().to_path_buf());
    }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf { container_id: unique("mvc"), netns: ns.path.clone(), ifname: "eth0".into(), ..Default::default() }
}

fn addr_of(ns: &Netns, family: &str) -> String {
    let out = ns.ip(&[family, "-o", "addr", "show", "dev", "eth0", "scope", "global"]);
    out.split_whitespace().skip_while(|w| *w != "inet" && *w != "inet6").nth(1).expect("an address").to_string()
}

fn bare(cidr: &str) -> &str {
    cidr.split('/').next().unwrap()
}

/// `ip -d link show eth0` in the pod.
fn details(ns: &Netns, ifname: &str) -> String {
    ns.ip(&["-d", "link", "show", ifname])
}

fn links_in(ns: &Netns) -> Vec<String> {
    ns.ip(&["-o", "link", "show"])
        .lines()
        .filter_map(|l| Some(l.split(": ").nth(1)?.split('@').next()?.to_string()))
        .collect()
}

fn ping6(ns: &Netns, addr: &str) -> bool {
    ns.exec("busybox", &["ping", "-6", "-c", "1", "-W", "2", addr]).status.success()
}

#[test]
fn pods_reach_each_other_on_every_version() {
    let master = Master::new();
    for (i, version) in SUPPORTED.iter().enumerate() {
        let net = Net::new(version, &master.name, 10 + i as u8, true, json!({}));
        let pod1 = Netns::new("mva");
        let mut pod2 = Netns::new("mvb");
        let (rt1, rt2) = (rt(&pod1), rt(&pod2));
        let r1 = net.cni.add_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
        net.cni.add_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{version}: ADD pod2: {e}"));

        let d = details(&pod1, "eth0");
        assert!(d.contains("macvlan mode bridge"), "{version}: {d}");
        assert!(d.contains("eth0@if"), "{version}: the pod's eth0 is not on a link: {d}");
        let (a1, a2) = (addr_of(&pod1, "-4"), addr_of(&pod2, "-4"));
        let (b1, b2) = (addr_of(&pod1, "-6"), addr_of(&pod2, "-6"));
        assert!(a1.starts_with(&format!("10.226.{}.", 10 + i)) && a1.ends_with("/24"), "{version}: {a1}");
        assert!(r1.ips.iter().any(|ip| ip.address.to_string() == a1), "{version}: result {r1:?} lacks {a1}");
        if at_least(version, "0.3.0") {
            assert_eq!(r1.interfaces.len(), 1, "{version}: {r1:?}");
            assert_eq!(r1.interfaces[0].name, "eth0");
            assert_eq!(r1.interfaces[0].sandbox.as_deref(), Some(pod1.path.as_str()));
            let mac = pod1.ip(&["-o", "link", "show", "eth0"]);
            assert!(mac.contains(r1.interfaces[0].mac.as_deref().unwrap()), "{version}: {mac} vs {r1:?}");
            assert!(r1.ips.iter().all(|ip| ip.interface == Some(0)), "{version}: {r1:?}");
        }

        // Real traffic both ways, both families, through the macvlan bridge on the master.
        assert!(pings(&pod1, bare(&a2)), "{version}: pod1 cannot ping pod2 {a2}");
        assert!(pings(&pod2, bare(&a1)), "{version}: pod2 cannot ping pod1 {a1}");
        assert!(ping6(&pod1, bare(&b2)), "{version}: pod1 cannot ping pod2 over IPv6 {b2}");
        assert!(ping6(&pod2, bare(&b1)), "{version}: pod2 cannot ping pod1 over IPv6 {b1}");

        if at_least(version, "0.4.0") {
            net.cni.check_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        }
        assert_eq!(net.reservations().len(), 4, "{version}");

        net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        assert_eq!(links_in(&pod1), ["lo"], "{version}: DEL left links in the pod");
        assert_eq!(net.reservations().len(), 2, "{version}: DEL kept pod1's addresses");
        net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));

        pod2.delete();
        net.cni.del_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{version}: DEL, netns gone: {e}"));
        assert!(net.reservations().is_empty(), "{version}: addresses leaked: {:?}", net.reservations());
    }
    // The master is the test's and stays; no macvlan of ours is left on it.
    let uppers = sh("ip", &["-o", "link", "show", "type", "macvlan"]);
    assert!(!uppers.contains(&format!("@{}", master.name)), "{uppers}");
}

#[test]
fn private_mode_keeps_pods_apart_and_check_sees_the_mode() {
    let master = Master::new();
    let net = Net::new("1.1.0", &master.name, 30, false, json!({ "mode": "private" }));
    let (pod1, pod2) = (Netns::new("mvpa"), Netns::new("mvpb"));
    let (rt1, rt2) = (rt(&pod1), rt(&pod2));
    net.cni.add_network_list(&net.list, &rt1).expect("ADD");
    net.cni.add_network_list(&net.list, &rt2).expect("ADD pod2");
    assert!(details(&pod1, "eth0").contains("macvlan mode private"), "{}", details(&pod1, "eth0"));
    let a2 = addr_of(&pod2, "-4");
    assert!(!pings(&pod1, bare(&a2)), "private mode let pod1 reach pod2");
    net.cni.check_network_list(&net.list, &rt1).expect("CHECK");

    // The same pods in bridge mode talk: it is the mode that kept them apart.
    pod1.ip(&["link", "set", "eth0", "type", "macvlan", "mode", "bridge"]);
    pod2.ip(&["link", "set", "eth0", "type", "macvlan", "mode", "bridge"]);
    // Forget the failed resolutions of the private-mode attempt.
    for pod in [&pod1, &pod2] {
        pod.ip(&["neigh", "flush", "dev", "eth0"]);
    }
    assert!(pings(&pod1, bare(&a2)), "bridge mode: pod1 cannot reach pod2");
    // CHECK sees the mode drift from the configuration.
    let e = net.cni.check_network_list(&net.list, &rt1).expect_err("CHECK with the mode changed");
    assert_eq!(e.code, 103, "{e}");
    assert!(e.msg.contains("mode bridge") && e.msg.contains("private"), "{e}");
    for r in [&rt1, &rt2] {
        net.cni.del_network_list(&net.list, r).expect("DEL");
    }
}

#[test]
fn mtu_mac_and_bcqueuelen_reach_the_link() {
    let master = Master::new();
    let net = Net::new(
        "1.0.0",
        &master.name,
        31,
        false,
        json!({ "mtu": 1400, "bcqueuelen": 2000,
        "mac": "0a:58:0a:e2:1f:01", "capabilities": { "mac": true } }),
    );
    let pod = Netns::new("mvk");
    let r = rt(&pod);
    let result = net.cni.add_network_list(&net.list, &r).expect("ADD");
    let d = details(&pod, "eth0");
    assert!(d.contains("mtu 1400"), "{d}");
    assert!(d.contains("link/ether 0a:58:0a:e2:1f:01"), "{d}");
    assert!(d.contains("bcqueuelen 2000"), "{d}");
    assert_eq!(result.interfaces[0].mac.as_deref(), Some("0a:58:0a:e2:1f:01"));
    net.cni.del_network_list(&net.list, &r).expect("DEL");

    // The `mac` capability (runtimeConfig.mac) beats the configured key.
    let pod = Netns::new("mvk");
    let mut caps = Map::new();
    caps.insert("mac".into(), json!("0a:58:0a:e2:1f:02"));
    let r = RuntimeConf { capability_args: caps, ..rt(&pod) };
    net.cni.add_network_list(&net.list, &r).expect("ADD with the mac capability");
    assert!(details(&pod, "eth0").contains("link/ether 0a:58:0a:e2:1f:02"), "{}", details(&pod, "eth0"));
    net.cni.del_network_list(&net.list, &r).expect("DEL");

    // An MTU above the master's is refused before anything is made, naming both.
    sh("ip", &["link", "set", &master.name, "mtu", "1300"]);
    let pod = Netns::new("mvk");
    let r = rt(&pod);
    let e = net.cni.add_network_list(&net.list, &r).expect_err("mtu above the master's");
    assert_eq!(e.code, 7, "{e}");
    assert!(e.msg.contains("mtu 1400") && e.msg.contains(&master.name) && e.msg.contains("1300"), "{e}");
    assert_eq!(links_in(&pod), ["lo"]);
    assert!(net.reservations().is_empty());
}

#[test]
fn layer_2_only_without_ipam() {
    let master = Master::new();
    for version in ["0.3.0", "0.4.0", "1.1.0"] {
        let conf = json!({ "cniVersion": version, "name": unique("mvl2"),
            "plugins": [{ "type": "macvlan", "master": master.name }] });
        let list = NetworkConfigList::from_bytes(conf.to_string().as_bytes()).unwrap();
        let cache = TempDir::new("mv-cache");
        let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
        let pod = Netns::new("mvl");
        let r = rt(&pod);
        let result = cni.add_network_list(&list, &r).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
        assert!(result.ips.is_empty() && result.routes.is_empty(), "{version}: {result:?}");
        assert_eq!(result.interfaces.len(), 1, "{version}: {result:?}");
        let d = details(&pod, "eth0");
        assert!(d.contains("macvlan mode bridge") && d.contains(",UP"), "{version}: {d}");
        assert!(pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"]).trim().is_empty(), "{version}: an address");
        if at_least(version, "0.4.0") {
            cni.check_network_list(&list, &r).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        }
        cni.del_network_list(&list, &r).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        assert_eq!(links_in(&pod), ["lo"], "{version}");
    }
    // 0.1.0 and 0.2.0 results cannot hold a result without addresses: refused up front, as
    // converting it would fail after the link was made.
    for version in ["0.1.0", "0.2.0"] {
        let conf = json!({ "cniVersion": version, "name": "mvl2old", "type": "macvlan", "master": master.name });
        let pod = Netns::new("mvl");
        let out = call(&bin_dir().join("macvlan"), "ADD", &conf, &pod.path, "c1", None);
        assert_eq!(out.0, 1, "{version}: {}", out.1);
        let e: Value = serde_json::from_str(&out.1).unwrap();
        assert_eq!(e["code"], 1, "{version}: {e}");
        assert!(e["msg"].as_str().unwrap().contains("ipam"), "{version}: {e}");
        assert_eq!(links_in(&pod), ["lo"], "{version}: a refused ADD left a link");
    }
}

/// Runs `plugin` as a runtime does, inside `host_ns` when given (its "host" namespace then); (exit
/// status, stdout).
fn call(plugin: &Path, verb: &str, conf: &Value, netns: &str, id: &str, host_ns: Option<&Netns>) -> (i32, String) {
    let mut cmd = match host_ns {
        Some(h) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &h.name]).arg(plugin);
            c
        }
        None => Command::new(plugin),
    };
    cmd.env_clear()
        .env("CNI_COMMAND", verb)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir())
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn plugin");
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The code of a plugin's error output.
fn code_of(out: &str) -> u64 {
    let v: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    v["code"].as_u64().unwrap_or_else(|| panic!("no code in {out}"))
}

#[test]
fn default_master_is_the_default_route_interface() {
    // A namespace playing the host: its default route goes out through `up0`.
    let host = Netns::new("mvh");
    host.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up0p"]);
    host.ip(&["link", "set", "up0", "up"]);
    host.ip(&["link", "set", "up0p", "up"]);
    host.ip(&["addr", "add", "192.0.2.2/24", "dev", "up0"]);
    host.ip(&["route", "add", "default", "via", "192.0.2.1"]);
    let pod = Netns::new("mvd");
    let data = TempDir::new("mv-ipam");
    let mut conf = macvlan_conf("", 40, false, data.path(), json!({ "master": null }));
    cni_tests::merge(&mut conf, json!({ "cniVersion": "1.0.0", "name": "mvdefault" }));
    let plugin = bin_dir().join("macvlan");
    let (rc, out) = call(&plugin, "ADD", &conf, &pod.path, "c1", Some(&host));
    assert_eq!(rc, 0, "{out}");
    let links = host.ip(&["-o", "link", "show"]);
    let up0 = links.lines().find(|l| l.contains(" up0:") || l.contains(" up0@")).unwrap();
    let up0_index = up0.split(':').next().unwrap().trim();
    let d = details(&pod, "eth0");
    assert!(d.contains("macvlan mode bridge"), "{d}");
    assert!(d.contains(&format!("eth0@if{up0_index}")), "eth0 is not on up0 (index {up0_index}): {d}");
    let (rc, out) = call(&plugin, "DEL", &conf, &pod.path, "c1", Some(&host));
    assert_eq!(rc, 0, "{out}");

    // Without a default route, ADD says to set master.
    host.ip(&["route", "del", "default"]);
    let (rc, out) = call(&plugin, "ADD", &conf, &pod.path, "c1", Some(&host));
    assert_eq!(rc, 1, "{out}");
    assert_eq!(code_of(&out), 7, "{out}");
    assert!(out.contains("master is not set"), "{out}");
    assert_eq!(links_in(&pod), ["lo"]);
}

/// A veth pair `name`/`peer` in `ns`, both ends up: a master with a carrier.
fn veth_up(ns: &Netns, name: &str, peer: &str) {
    ns.ip(&["link", "add", name, "type", "veth", "peer", "name", peer]);
    ns.ip(&["link", "set", name, "up"]);
    ns.ip(&["link", "set", peer, "up"]);
}

#[test]
fn link_in_container_finds_the_master_in_the_pod() {
    let pod = Netns::new("mvi");
    // The master lives in the pod (as a device a former plugin moved there would).
    veth_up(&pod, "inner0", "inner0p");
    let data = TempDir::new("mv-ipam");
    let mut conf = macvlan_conf("inner0", 41, false, data.path(), json!({ "linkInContainer": true }));
    cni_tests::merge(&mut conf, json!({ "cniVersion": "1.1.0", "name": "mvinner" }));
    let plugin = bin_dir().join("macvlan");
    let (rc, out) = call(&plugin, "ADD", &conf, &pod.path, "c1", None);
    assert_eq!(rc, 0, "{out}");
    let result: Value = serde_json::from_str(&out).unwrap();
    let d = details(&pod, "eth0");
    assert!(d.contains("eth0@inner0") && d.contains("macvlan mode bridge"), "{d}");
    assert!(pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"]).contains("10.226.41.2/24"));
    let mut check = conf.clone();
    check["prevResult"] = result;
    let (rc, out) = call(&plugin, "CHECK", &check, &pod.path, "c1", None);
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = call(&plugin, "DEL", &check, &pod.path, "c1", None);
    assert_eq!(rc, 0, "{out}");
    let left = links_in(&pod);
    assert!(!left.contains(&"eth0".to_string()) && left.contains(&"inner0".to_string()), "{left:?}");
    assert!(reservations(data.path(), "mvinner").is_empty());

    // The same master name looked up on the host is not there: the message says where it looked.
    let mut host_conf = conf.clone();
    host_conf["linkInContainer"] = json!(false);
    let (rc, out) = call(&plugin, "ADD", &host_conf, &pod.path, "c2", None);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("master inner0 does not exist in the host's namespace"), "{out}");

    // Without master, the pod's own default route names it.
    pod.ip(&["addr", "add", "192.0.2.2/24", "dev", "inner0"]);
    pod.ip(&["route", "add", "default", "via", "192.0.2.1"]);
    let mut default = conf.clone();
    default.as_object_mut().unwrap().remove("master");
    let (rc, out) = call(&plugin, "ADD", &default, &pod.path, "c3", None);
    assert_eq!(rc, 0, "{out}");
    assert!(details(&pod, "eth0").contains("eth0@inner0"), "{}", details(&pod, "eth0"));
    let (rc, out) = call(&plugin, "DEL", &default, &pod.path, "c3", None);
    assert_eq!(rc, 0, "{out}");
}

#[test]
fn failed_add_leaves_nothing() {
    let master = Master::new();
    // A /30 has one address for pods: the second ADD fails in IPAM after the link was made.
    let data = TempDir::new("mv-ipam");
    let mut conf = macvlan_conf(&master.name, 42, false, data.path(), json!({}));
    conf["ipam"]["ranges"] = json!([[{ "subnet": "10.226.42.0/30" }]]);
    cni_tests::merge(&mut conf, json!({ "cniVersion": "1.0.0", "name": "mvfail" }));
    let plugin = bin_dir().join("macvlan");
    let (pod1, pod2) = (Netns::new("mvf"), Netns::new("mvg"));
    let (rc, out) = call(&plugin, "ADD", &conf, &pod1.path, "c1", None);
    assert_eq!(rc, 0, "{out}");
    let (rc, out) = call(&plugin, "ADD", &conf, &pod2.path, "c2", None);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(code_of(&out), 101, "{out}");
    assert_eq!(links_in(&pod2), ["lo"], "the failed ADD left a link (or its temporary name) in the pod");
    assert_eq!(reservations(data.path(), "mvfail").len(), 1);

    // A second ADD of a live attachment fails on the existing eth0 and leaves it alone.
    let (rc, out) = call(&plugin, "ADD", &conf, &pod1.path, "c1", None);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("already exists"), "{out}");
    assert!(details(&pod1, "eth0").contains("macvlan"));

    // A master that does not exist: code 7 naming it, nothing made or reserved.
    let mut missing = conf.clone();
    missing["master"] = json!("nosuchmaster0");
    let (rc, out) = call(&plugin, "ADD", &missing, &pod2.path, "c2", None);
    assert_eq!(rc, 1, "{out}");
    assert_eq!(code_of(&out), 7, "{out}");
    assert!(out.contains("nosuchmaster0 does not exist"), "{out}");
    assert_eq!(links_in(&pod2), ["lo"]);
    assert_eq!(reservations(data.path(), "mvfail").len(), 1);
    // DEL reads no key but the ipam type: keys that no longer validate never strand the pod.
    let mut broken = conf.clone();
    cni_tests::merge(&mut broken, json!({ "mode": "bogus", "mtu": -5, "mac": "zz", "master": "no/such" }));
    let (rc, out) = call(&plugin, "DEL", &broken, &pod1.path, "c1", None);
    assert_eq!(rc, 0, "{out}");
    assert_eq!(links_in(&pod1), ["lo"]);
    assert!(reservations(data.path(), "mvfail").is_empty());
}

/// Whether the running kernel is at least `major.minor` (from `uname -r`).
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = cni_tests::sh("uname", &["-r"]);
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// The pod's link is made under its own name, never renamed (a rename makes the kernel wait for
/// an RCU grace period), also where the host has a link of that name: here the master itself is
/// `eth0`, as on a node whose uplink is. A name the pod already has is refused, nothing made.
#[test]
fn the_link_is_made_under_its_own_name() {
    let host = Netns::new("mvk");
    veth_up(&host, "eth0", "peer0");
    let data = TempDir::new("mv-ipam");
    let mut conf = macvlan_conf("eth0", 43, false, data.path(), json!({}));
    cni_tests::merge(&mut conf, json!({ "cniVersion": "1.0.0", "name": "mvname" }));
    let plugin = bin_dir().join("macvlan");
    let pod = Netns::new("mvn");
    let (rc, out) = call(&plugin, "ADD", &conf, &pod.path, "c1", Some(&host));
    assert_eq!(rc, 0, "{out}");
    assert!(details(&pod, "eth0").contains("macvlan mode bridge"), "{}", details(&pod, "eth0"));
    assert_eq!(addr_of(&pod, "-4"), "10.226.43.2/24");
    // name_assign_type 3 is NET_NAME_USER (named at creation), 4 NET_NAME_RENAMED. A kernel before
    // 6.14 looks a new link's name up in the namespace the request comes from, the host's, which
    // has an eth0: there ADD falls back to a temporary name and a rename.
    let assigned = pod.sh("cat", &["/sys/class/net/eth0/name_assign_type"]);
    assert_eq!(assigned.trim(), if kernel_at_least(6, 14) { "3" } else { "4" });
    assert_eq!(links_in(&pod), ["lo", "eth0"]);

    // A pod that has an eth0 of its own: refused as the reference does, nothing made or reserved.
    let taken = Netns::new("mvo");
    taken.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "other0"]);
    let before = links_in(&taken);
    let (rc, out) = call(&plugin, "ADD", &conf, &taken.path, "c2", Some(&host));
    assert_eq!(rc, 1, "{out}");
    assert_eq!(code_of(&out), 100, "{out}");
    assert!(out.contains("interface eth0 already exists in"), "{out}");
    assert_eq!(links_in(&taken), before);
    assert!(details(&taken, "eth0").contains("veth"), "{}", details(&taken, "eth0"));
    assert_eq!(reservations(data.path(), "mvname").len(), 1);

    let (rc, out) = call(&plugin, "DEL", &conf, &pod.path, "c1", Some(&host));
    assert_eq!(rc, 0, "{out}");
    assert_eq!(links_in(&pod), ["lo"]);
    assert!(reservations(data.path(), "mvname").is_empty());
}

/// A directory of plugins under their type names: `macvlan` and `host-local` linked to `from`.
fn plugin_dir(from: &Path) -> TempDir {
    let dir = TempDir::new("mv-plugins");
    for name in ["macvlan", "host-local"] {
        std::os::unix::fs::symlink(from.join(name), dir.path().join(name)).unwrap();
    }
    dir
}

/// A node switching between the reference plugins and ours, either way, with the reference's
/// attachments still there: each side's DEL removes the other's link and reservation, and CHECK
/// passes on the other's ADD.
#[test]
fn reference_and_ours_clean_up_after_each_other() {
    let reference = PathBuf::from("/usr/lib/cni");
    if !prerequisite(reference.join("macvlan").is_file(), "the reference /usr/lib/cni/macvlan is not installed") {
        return;
    }
    let master = Master::new();
    let (ref_dir, our_dir) = (plugin_dir(&reference), plugin_dir(&bin_dir()));
    for (add_with, del_with, what) in
        [(&ref_dir, &our_dir, "reference ADD, our DEL"), (&our_dir, &ref_dir, "our ADD, reference DEL")]
    {
        let mut net = Net::new("1.0.0", &master.name, 50, true, json!({}));
        let (pod1, pod2) = (Netns::new("mvr"), Netns::new("mvs"));
        let (rt1, rt2) = (rt(&pod1), rt(&pod2));
        net.use_plugins(add_with.path());
        net.cni.add_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{what}: ADD: {e}"));
        net.use_plugins(del_with.path());
        // The other side's ADD on the same network and dataDir gets the next addresses.
        net.cni.add_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{what}: ADD pod2: {e}"));
        assert_eq!(net.reservations().len(), 4, "{what}");
        let a2 = addr_of(&pod2, "-4");
        assert!(pings(&pod1, bare(&a2)), "{what}: pods do not reach each other");
        net.cni.check_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{what}: CHECK of the other's: {e}"));
        net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{what}: DEL: {e}"));
        assert_eq!(links_in(&pod1), ["lo"], "{what}");
        net.cni.del_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{what}: DEL pod2: {e}"));
        assert!(net.reservations().is_empty(), "{what}: {:?}", net.reservations());
    }
}
