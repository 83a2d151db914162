//! DEL never strands a pod: a DEL whose configuration no longer validates still removes the veth,
//! the reservation and the firewall elements; a CNI_NETNS that is the plugin's own namespace is
//! refused on DEL and CHECK with nothing touched there; a netns path left behind as an empty file
//! counts as a namespace that is gone. Privileged; subnets 10.237.x.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, bridge_ports, run, sh, unique, LinkGuard, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

/// bridge (ipMasq) + host-local + portmap on nftables, on its own bridge and subnet.
struct Net {
    name: String,
    bridge: LinkGuard,
    data: TempDir,
    cache: TempDir,
    subnet: String,
    host_port: u16,
    /// Every attachment ADDed, DELed again on drop so a failed assertion leaves no elements.
    added: std::cell::RefCell<Vec<(NetworkConfigList, RuntimeConf)>>,
}

impl Drop for Net {
    fn drop(&mut self) {
        for (list, rt) in self.added.take() {
            let rt = RuntimeConf { capability_args: self.mapping(), ..rt };
            let _ = self.cni().del_network_list(&list, &rt);
        }
    }
}

impl Net {
    fn new(n: u8) -> Net {
        Net {
            name: unique("netd"),
            bridge: LinkGuard(unique("cnd")),
            data: TempDir::new("cnd-ipam"),
            cache: TempDir::new("cnd-cache"),
            subnet: format!("10.237.{n}.0/24"),
            host_port: 18230 + u16::from(n),
            added: Default::default(),
        }
    }
    /// The conflist, with `bridge_extra` and `portmap_extra` merged into those plugins' objects.
    fn list(&self, bridge_extra: Value, portmap_extra: Value) -> NetworkConfigList {
        let mut bridge = json!({
            "type": "bridge", "bridge": self.bridge.0, "isGateway": true, "ipMasq": true,
            "ipam": { "type": "host-local", "ranges": [[{ "subnet": self.subnet }]], "dataDir": self.data.path() }
        });
        let mut portmap = json!({ "type": "portmap", "backend": "nftables", "capabilities": { "portMappings": true } });
        merge(&mut bridge, bridge_extra);
        merge(&mut portmap, portmap_extra);
        let list = json!({ "cniVersion": "1.0.0", "name": self.name, "plugins": [bridge, portmap] });
        NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist")
    }
    fn cni(&self) -> CniConfig {
        CniConfig::with_cache_dir(vec![bin_dir()], self.cache.path().to_path_buf())
    }
    fn reservations(&self) -> Vec<(String, String)> {
        cni_tests::reservations(self.data.path(), &self.name)
    }
    /// The nftables elements (set and map entries, and rules) that name this network's pod
    /// address or host port, except those DEL gave an expiry (nftables masquerade elements are
    /// expired rather than deleted, and the kernel drops them within seconds).
    fn firewall_lines(&self) -> Vec<String> {
        let out = run("nft", &["list", "ruleset"]);
        let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
        let pod = self.subnet.trim_end_matches("0/24");
        let port = format!(" {} ", self.host_port);
        text.split(", ")
            .flat_map(|s| s.split(['{', '}']))
            .filter(|e| (e.contains(pod) || e.contains(&port)) && !e.contains("expires"))
            .map(|e| e.trim().to_string())
            .collect()
    }
}

fn merge(into: &mut Value, extra: Value) {
    if let Value::Object(m) = extra {
        for (k, v) in m {
            into[k] = v;
        }
    }
}

fn mappings(m: Value) -> Map<String, Value> {
    let mut caps = Map::new();
    caps.insert("portMappings".into(), m);
    caps
}

fn rt(ns: &Netns, caps: Map<String, Value>) -> RuntimeConf {
    RuntimeConf {
        container_id: unique("ctrd"),
        netns: ns.path.clone(),
        ifname: "eth0".into(),
        capability_args: caps,
        ..Default::default()
    }
}

fn link_exists(name: &str) -> bool {
    run("ip", &["link", "show", name]).status.success()
}

/// ADD a pod with one hostPort; the host veth's name, after checking that everything is there.
fn add_pod(net: &Net, list: &NetworkConfigList, rt: &RuntimeConf) -> String {
    net.added.borrow_mut().push((list.clone(), rt.clone()));
    let result = net.cni().add_network_list(list, rt).expect("ADD");
    let host_veth = result.interfaces.iter().find(|i| i.sandbox.is_none() && i.name != net.bridge.0).unwrap();
    assert!(link_exists(&host_veth.name), "host veth {} after ADD", host_veth.name);
    assert_eq!(net.reservations().len(), 1, "reservation after ADD");
    let fw = net.firewall_lines();
    assert!(fw.iter().any(|l| l.contains(&net.host_port.to_string())), "no hostPort element after ADD: {fw:?}");
    host_veth.name.clone()
}

fn assert_all_gone(net: &Net, host_veth: &str, what: &str) {
    assert!(!link_exists(host_veth), "{what}: host veth {host_veth} left");
    assert!(bridge_ports(&net.bridge.0).is_empty(), "{what}: ports left on the bridge");
    assert!(net.reservations().is_empty(), "{what}: reservation left: {:?}", net.reservations());
    let fw = net.firewall_lines();
    assert!(fw.is_empty(), "{what}: firewall elements left: {fw:?}");
}

impl Net {
    fn mapping(&self) -> Map<String, Value> {
        mappings(json!([{ "hostPort": self.host_port, "containerPort": 80, "protocol": "tcp" }]))
    }
}

/// kubelet retries a DEL until it succeeds, and DEL runs the list in reverse: a portmap entry that
/// fails validation must not stop it there, or bridge and host-local are never called and the
/// retries never end. portmap removes the attachment's elements anyway and the chain goes on.
#[test]
fn conflist_del_with_an_invalid_portmap_entry_removes_everything() {
    let net = Net::new(1);
    let pod = Netns::new("cndp");
    let list = net.list(json!({}), json!({}));
    let rt_add = rt(&pod, net.mapping());
    let host_veth = add_pod(&net, &list, &rt_add);
    for bad in [
        json!([{ "hostPort": 0, "containerPort": 80 }]),
        json!([{ "hostPort": net.host_port, "containerPort": 80, "hostIP": "not-an-ip" }]),
        json!([{ "hostPort": net.host_port.to_string(), "containerPort": 80 }]),
        json!("18237:80"),
    ] {
        let rt_del = RuntimeConf { capability_args: mappings(bad.clone()), ..rt_add.clone() };
        net.cni().del_network_list(&list, &rt_del).unwrap_or_else(|e| panic!("DEL with portMappings {bad}: {e}"));
        assert_all_gone(&net, &host_veth, &format!("DEL with portMappings {bad}"));
    }
    // A broken portmap key (not the mappings) and an unknown backend: the same.
    let host_veth = add_pod(&net, &list, &rt_add);
    let broken = net.list(json!({}), json!({ "backend": "pf", "markMasqBit": "x" }));
    net.cni().del_network_list(&broken, &rt_add).expect("DEL with an unknown portmap backend");
    assert_all_gone(&net, &host_veth, "DEL with backend pf");
}

/// The same on the iptables backend: a DEL whose portmap and bridge keys no longer validate cannot
/// tell the backend, and removes the attachment's rules from iptables as well as nftables.
#[test]
fn conflist_del_with_an_invalid_config_removes_iptables_rules_too() {
    let net = Net::new(4);
    let pod = Netns::new("cndi");
    let list = net.list(json!({ "ipMasqBackend": "iptables" }), json!({ "backend": "iptables" }));
    let rt_add = rt(&pod, net.mapping());
    net.added.borrow_mut().push((list.clone(), rt_add.clone()));
    net.cni().add_network_list(&list, &rt_add).expect("ADD");
    let rules = || -> Vec<String> {
        let out = run("iptables-save", &["-t", "nat"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&rt_add.container_id))
            .map(str::to_string)
            .collect()
    };
    let before = rules();
    assert!(before.iter().any(|l| l.contains("dnat")), "no portmap rule after ADD: {before:?}");
    assert!(before.iter().any(|l| !l.contains("dnat")), "no masquerade rule after ADD: {before:?}");
    let broken = net.list(json!({ "ipMasqBackend": "pf" }), json!({ "backend": "pf" }));
    let rt_del =
        RuntimeConf { capability_args: mappings(json!([{ "hostPort": 0, "containerPort": 80 }])), ..rt_add.clone() };
    net.cni().del_network_list(&broken, &rt_del).expect("DEL with invalid keys");
    assert_eq!(rules(), Vec::<String>::new(), "iptables rules left");
    assert!(net.reservations().is_empty(), "reservation left");
    assert!(bridge_ports(&net.bridge.0).is_empty(), "ports left on the bridge");
}

/// bridge's own keys edited into something invalid since ADD (a bad mtu, an unknown
/// ipMasqBackend) and a host-local range that no longer parses: DEL still finds everything.
#[test]
fn conflist_del_with_an_invalid_bridge_and_ipam_config_removes_everything() {
    let net = Net::new(2);
    let pod = Netns::new("cndq");
    let list = net.list(json!({}), json!({}));
    let rt_add = rt(&pod, net.mapping());
    for (label, bridge_extra) in [
        ("mtu 5", json!({ "mtu": 5 })),
        ("ipMasqBackend pf", json!({ "ipMasqBackend": "pf" })),
        ("mtu a string, vlan 9999", json!({ "mtu": "1500", "vlan": 9999 })),
        (
            "a range that no longer parses",
            json!({ "ipam": { "type": "host-local", "ranges": [[{ "subnet": "banana" }]], "dataDir": net.data.path() } }),
        ),
    ] {
        let host_veth = add_pod(&net, &list, &rt_add);
        let edited = net.list(bridge_extra, json!({}));
        net.cni().del_network_list(&edited, &rt_add).unwrap_or_else(|e| panic!("DEL with {label}: {e}"));
        assert_all_gone(&net, &host_veth, label);
    }
}

/// Runs `plugin` inside `ns` (so that namespace is "the host" it runs in), with `env` and `stdin`.
fn run_in(ns: &Netns, plugin: &str, env: &BTreeMap<&str, String>, stdin: &str) -> (i32, Value) {
    run_plugin(Some(ns), plugin, env, stdin)
}

/// Runs `plugin` in `ns`, or where the test runs; the exit code and the JSON on stdout.
fn run_plugin(ns: Option<&Netns>, plugin: &str, env: &BTreeMap<&str, String>, stdin: &str) -> (i32, Value) {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &ns.name]).arg(bin_dir().join(plugin));
            c
        }
        None => Command::new(bin_dir().join(plugin)),
    };
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    cmd.envs(env.iter().map(|(k, v)| (*k, v.as_str())));
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), v)
}

fn lo_is_up(ns: &Netns) -> bool {
    ns.sh("ip", &["-o", "link", "show", "lo"]).contains("UP")
}

/// A sleeping process inside `ns`, killed on drop: its /proc/<pid>/ns/net names the namespace.
struct Sleeper(std::process::Child);

impl Sleeper {
    fn new(ns: &Netns) -> Sleeper {
        let child = Command::new("ip").args(["netns", "exec", &ns.name, "sleep", "120"]).spawn().expect("sleep");
        // `ip netns exec` execs sleep in place: wait until it has switched namespace.
        let want = std::fs::read_link(&ns.path).ok();
        for _ in 0..100 {
            let have = std::fs::read_link(format!("/proc/{}/ns/net", child.id())).ok();
            let host = std::fs::read_link("/proc/self/ns/net").ok();
            if have.is_some() && have != host && (want.is_none() || have == want) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Sleeper(child)
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// DEL and CHECK with CNI_NETNS naming the namespace the plugin runs in (here a test namespace
/// standing in for the node's), by /proc/self, by /proc/<pid> and by a bind mount: code 4, and the
/// link named CNI_IFNAME and lo are left as they were. CNI_NETNS_OVERRIDE=1 lets it through.
#[test]
fn del_and_check_refuse_the_plugins_own_netns() {
    let host = Netns::new("cndh");
    let link = unique("cndl");
    host.sh("ip", &["link", "add", &link, "type", "veth", "peer", "name", &unique("cndk")]);
    host.sh("ip", &["link", "set", &link, "up"]);
    let data = TempDir::new("cnd-own");
    let sleeper = Sleeper::new(&host);
    let bridge = json!({
        "cniVersion": "1.0.0", "name": unique("netd"), "type": "bridge", "bridge": unique("cnd"), "ipMasq": true,
        "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.237.9.0/24" }]], "dataDir": data.path() },
        "prevResult": { "cniVersion": "1.0.0", "interfaces": [{ "name": link, "sandbox": host.path }],
                        "ips": [{ "address": "10.237.9.2/24", "interface": 0 }] }
    })
    .to_string();
    let loopback = json!({ "cniVersion": "1.0.0", "name": "lo", "type": "loopback" }).to_string();
    let env = |command: &str, netns: &str| -> BTreeMap<&str, String> {
        BTreeMap::from([
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", unique("ctrd")),
            ("CNI_NETNS", netns.to_string()),
            ("CNI_IFNAME", link.clone()),
            ("CNI_PATH", bin_dir().display().to_string()),
        ])
    };
    let by_pid = format!("/proc/{}/ns/net", sleeper.0.id());
    for netns in ["/proc/self/ns/net", by_pid.as_str(), host.path.as_str()] {
        for (plugin, stdin) in [("bridge", &bridge), ("loopback", &loopback)] {
            for command in ["DEL", "CHECK", "ADD"] {
                let (rc, v) = run_in(&host, plugin, &env(command, netns), stdin);
                let what = format!("{plugin} {command} with CNI_NETNS={netns}");
                assert_eq!((rc, v["code"].as_u64()), (1, Some(4)), "{what}: {v}");
                assert!(v["msg"].as_str().unwrap().contains("own network namespace"), "{what}: {v}");
                assert!(host.exec("ip", &["link", "show", &link]).status.success(), "{what}: {link} was deleted");
                assert!(lo_is_up(&host), "{what}: lo was set down");
            }
        }
    }
    // The runtime says it means it: loopback acts on the namespace it runs in.
    let mut e = env("CHECK", "/proc/self/ns/net");
    e.insert("CNI_NETNS_OVERRIDE", "1".into());
    assert_eq!(run_in(&host, "loopback", &e, &loopback).0, 0, "CHECK with CNI_NETNS_OVERRIDE=1");
    e.insert("CNI_COMMAND", "DEL".into());
    e.insert("CNI_NETNS_OVERRIDE", "true".into());
    assert_eq!(run_in(&host, "loopback", &e, &loopback).0, 0, "DEL with CNI_NETNS_OVERRIDE=true");
    assert!(!lo_is_up(&host), "DEL with CNI_NETNS_OVERRIDE did not act on the namespace");
    // Nothing of the refused DELs reached the real host either.
    assert!(lo_is_up_host(), "the host's lo is down");
}

fn lo_is_up_host() -> bool {
    sh("ip", &["-o", "link", "show", "lo"]).contains("UP")
}

/// A netns path that is only an empty file (the bind mount was unmounted, as a crashed runtime
/// leaves /run/netns): DEL succeeds and cleans the host side, the host veth included when a
/// process still holds the namespace; ADD and CHECK still refuse the path (code 4).
#[test]
fn del_with_an_unmounted_netns_file_cleans_up() {
    let net = Net::new(3);
    let list = net.list(json!({}), json!({}));
    for held in [true, false] {
        let pod = Netns::new("cndu");
        let rt_add = rt(&pod, net.mapping());
        let host_veth = add_pod(&net, &list, &rt_add);
        let sleeper = held.then(|| Sleeper::new(&pod));
        sh("umount", &[&pod.path]);
        let meta = std::fs::metadata(&pod.path).expect("the mount point stays");
        assert!(meta.is_file() && meta.len() == 0);
        if held {
            // The pod's end lives on in the held namespace, so the host end does too.
            assert!(link_exists(&host_veth), "host veth gone before DEL");
        }
        let e = net.cni().check_network_list(&list, &rt_add).expect_err("CHECK of an unmounted netns");
        assert_eq!(e.code, 4, "{e}");
        let pod2 = RuntimeConf { container_id: unique("ctrd"), ..rt_add.clone() };
        let e = net.cni().add_network_list(&list, &pod2).expect_err("ADD into an unmounted netns");
        assert_eq!(e.code, 4, "{e}");
        net.cni().del_network_list(&list, &rt_add).unwrap_or_else(|e| panic!("DEL (held: {held}): {e}"));
        assert_all_gone(&net, &host_veth, &format!("DEL of an unmounted netns (held: {held})"));
        net.cni().del_network_list(&list, &rt_add).expect("DEL again");
        drop(sleeper);
    }
}

#[test]
fn loopback_del_of_an_unmounted_netns_file_succeeds() {
    let pod = Netns::new("cndv");
    sh("umount", &[&pod.path]);
    let mut env = BTreeMap::from([
        ("CNI_COMMAND", "DEL".to_string()),
        ("CNI_CONTAINERID", unique("ctrd")),
        ("CNI_NETNS", pod.path.clone()),
        ("CNI_IFNAME", "lo".to_string()),
        ("CNI_PATH", bin_dir().display().to_string()),
    ]);
    let conf = json!({ "cniVersion": "1.0.0", "name": "lo", "type": "loopback" }).to_string();
    let (rc, v) = run_plugin(None, "loopback", &env, &conf);
    assert_eq!(rc, 0, "{v}");
    env.insert("CNI_COMMAND", "CHECK".into());
    let (rc, v) = run_plugin(None, "loopback", &env, &conf);
    assert_eq!((rc, v["code"].as_u64()), (1, Some(4)), "CHECK: {v}");
}
