//! The bandwidth binary against the kernel: real TCP transfers through a limited pod, the tc layout
//! compared with the reference plugin's (/usr/lib/cni/bandwidth) for the same input, every spec
//! version, CHECK, DEL twice, DEL with the netns gone, GC, and the undo of a failed ADD.
//!
//! Most tests run the plugin inside a private "node" namespace holding the host end of a veth
//! whose other end is in a "pod" namespace, so their ifbs and qdiscs never touch the real host.
//! The chain test goes through libcni with bridge + host-local + bandwidth on the host.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cni_tests::exec::{json_of, netns_exec, Call};
use cni_tests::{bin_dir, sh, unique, LinkGuard, Netns, TempDir};
use common::{add, del_twice, in_netns, receive, send, within};
use libcni::conf::Attachment;
use libcni::conflist::NetworkConfigList;
use libcni::runtime::CniConfig;
use serde_json::{json, Map, Value};
use std::net::TcpListener;

const REFERENCE: &str = "/usr/lib/cni/bandwidth";

/// A node namespace with `vethh` whose peer is `eth0` in a pod namespace.
struct Pair {
    node: Netns,
    pod: Netns,
}

impl Pair {
    fn new() -> Pair {
        let node = Netns::new("bwn");
        let pod = Netns::new("bwq");
        sh(
            "ip",
            &["-n", &node.name, "link", "add", "vethh", "type", "veth", "peer", "name", "eth0", "netns", &pod.name],
        );
        sh("ip", &["-n", &node.name, "link", "set", "vethh", "up"]);
        sh("ip", &["-n", &pod.name, "link", "set", "eth0", "up"]);
        Pair { node, pod }
    }

    fn prev_result(&self, version: &str) -> Value {
        let ip = if version.starts_with("0.") {
            json!({"version": "4", "address": "10.9.0.2/24", "interface": 1})
        } else {
            json!({"address": "10.9.0.2/24", "interface": 1})
        };
        json!({
            "cniVersion": version,
            "interfaces": [{"name": "vethh"}, {"name": "eth0", "sandbox": self.pod.path}],
            "ips": [ip]
        })
    }

    fn conf(&self, version: &str, keys: Value) -> Value {
        let mut c = json!({"cniVersion": version, "name": "bwnet", "type": "bandwidth",
                           "prevResult": self.prev_result(version)});
        for (k, v) in keys.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }

    /// Runs `plugin` with `cmd` inside the node namespace: (exit ok, stdout as JSON or Null).
    fn exec(&self, plugin: &str, cmd: &str, cid: &str, conf: &Value) -> (bool, Value) {
        let out = Call::new(cmd, cid, &self.pod.path).run(netns_exec(&self.node.name, plugin), conf);
        (out.status.success(), json_of(&out.stdout))
    }

    fn ours(&self, cmd: &str, cid: &str, conf: &Value) -> (bool, Value) {
        self.exec(bin_dir().join("bandwidth").to_str().unwrap(), cmd, cid, conf)
    }

    /// `tc -j qdisc show` and `tc -j filter show dev vethh ingress` in the node namespace, with
    /// the counters that differ between runs removed.
    fn layout(&self) -> String {
        let q = self.node.sh("tc", &["-j", "qdisc", "show"]);
        let f = self.node.sh("tc", &["-j", "filter", "show", "dev", "vethh", "ingress"]);
        let mut f: Value = serde_json::from_str(&f).unwrap_or(Value::Null);
        strip(&mut f, &["index", "ref", "bind"]);
        format!("{q}\n{f}")
    }

    fn links(&self) -> String {
        self.node.sh("ip", &["-o", "link", "show"])
    }
}

fn strip(v: &mut Value, keys: &[&str]) {
    match v {
        Value::Object(m) => {
            for k in keys {
                m.remove(*k);
            }
            m.values_mut().for_each(|x| strip(x, keys));
        }
        Value::Array(a) => a.iter_mut().for_each(|x| strip(x, keys)),
        _ => {}
    }
}

fn limits() -> Value {
    json!({"ingressRate": 16_000_000, "ingressBurst": 800_000, "egressRate": 8_000_000, "egressBurst": 400_000})
}

#[test]
fn layout_equals_the_reference_plugin() {
    assert!(
        std::path::Path::new(REFERENCE).is_file(),
        "{REFERENCE} missing: apt-get install containernetworking-plugins"
    );
    let p = Pair::new();
    for (keys, what) in [
        (limits(), "plugin config"),
        (
            json!({"runtimeConfig": {"bandwidth": {"IngressRate": 24_000_000, "IngressBurst": 96_000, "EgressRate": 40_000_000, "EgressBurst": 160_000}}}),
            "capability",
        ),
        (json!({"egressRate": 8_000_000, "egressBurst": 400_000}), "egress only"),
        (json!({"ingressRate": 8_000_000, "ingressBurst": 400_000}), "ingress only"),
    ] {
        let conf = p.conf("1.0.0", keys);
        let (ok, out) = p.exec(REFERENCE, "ADD", "c1", &conf);
        assert!(ok, "reference ADD ({what}): {out}");
        let reference = p.layout();
        let ref_ifaces = out["interfaces"].as_array().unwrap().len();
        assert!(p.exec(REFERENCE, "DEL", "c1", &conf).0);
        // The reference leaves its qdiscs on the veth (it expects the veth to go); clear them.
        let _ = p.node.exec("tc", &["qdisc", "del", "dev", "vethh", "root"]);
        let _ = p.node.exec("tc", &["qdisc", "del", "dev", "vethh", "ingress"]);

        let (ok, out) = p.ours("ADD", "c1", &conf);
        assert!(ok, "ADD ({what}): {out}");
        assert_eq!(p.layout(), reference, "tc layout differs from the reference's ({what})");
        assert_eq!(out["interfaces"].as_array().unwrap().len(), ref_ifaces, "result interfaces ({what}): {out}");
        let (ok, out) = p.ours("DEL", "c1", &conf);
        assert!(ok, "DEL ({what}): {out}");
        let q = p.node.sh("tc", &["qdisc", "show"]);
        assert!(!q.contains("tbf") && !q.contains("ingress"), "DEL left qdiscs ({what}): {q}");
        assert!(!p.links().contains("bwp"), "DEL left the ifb ({what})");
    }
}

#[test]
fn every_spec_version_add_check_del_twice() {
    let p = Pair::new();
    for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let conf = p.conf(version, limits());
        let (ok, out) = p.ours("ADD", "cv", &conf);
        assert!(ok, "{version} ADD: {out}");
        assert_eq!(out["cniVersion"], version);
        let ifb = out["interfaces"][2]["name"].as_str().unwrap().to_string();
        assert!(ifb.starts_with("bwp") && ifb.len() == 15, "{version}: ifb {ifb}");
        assert!(p.links().contains(&ifb), "{version}: no ifb {ifb}");
        if version >= "0.4.0" {
            let mut checked = conf.clone();
            checked["prevResult"] = out.clone();
            let (ok, err) = p.ours("CHECK", "cv", &checked);
            assert!(ok, "{version} CHECK: {err}");
            // A different rate is a CHECK failure naming the direction.
            checked["egressRate"] = json!(9_000_000);
            let (ok, err) = p.ours("CHECK", "cv", &checked);
            assert!(!ok && err["code"] == 103 && err["msg"].as_str().unwrap().contains("egress"), "{version}: {err}");
        }
        for n in 1..=2 {
            let (ok, out) = p.ours("DEL", "cv", &conf);
            assert!(ok, "{version} DEL #{n}: {out}");
        }
        assert!(!p.links().contains(&ifb), "{version}: ifb left");
        assert!(!p.node.sh("tc", &["qdisc", "show", "dev", "vethh"]).contains("tbf"), "{version}: tbf left");
    }
    for version in ["0.1.0", "0.2.0"] {
        let (ok, out) = p.ours("ADD", "cv", &p.conf(version, limits()));
        assert!(!ok && out["code"] == 1, "{version} is not a bandwidth version (the reference starts at 0.3.0): {out}");
    }
}

#[test]
fn del_with_the_netns_gone_removes_the_ifb() {
    let mut p = Pair::new();
    let conf = p.conf("1.0.0", limits());
    let (ok, out) = p.ours("ADD", "cg", &conf);
    assert!(ok, "ADD: {out}");
    let ifb = out["interfaces"][2]["name"].as_str().unwrap().to_string();
    let pod_path = p.pod.path.clone();
    p.pod.delete();
    assert!(!std::path::Path::new(&pod_path).exists());
    for n in 1..=2 {
        let (ok, out) = p.ours("DEL", "cg", &conf);
        assert!(ok, "DEL #{n} with the netns gone: {out}");
    }
    assert!(!p.links().contains(&ifb), "ifb {ifb} left after DEL");
}

#[test]
fn failed_add_undoes_and_leaves_a_foreign_ifb_alone() {
    let p = Pair::new();
    let conf = p.conf("1.0.0", limits());
    let name = bandwidth::ifb_name("bwnet", "cf");
    sh("ip", &["-n", &p.node.name, "link", "add", &name, "type", "ifb"]);
    let (ok, out) = p.ours("ADD", "cf", &conf);
    assert!(!ok, "ADD must fail when the ifb name is taken: {out}");
    let msg = out["msg"].as_str().unwrap_or_default().to_string() + out["details"].as_str().unwrap_or_default();
    assert!(msg.contains(&name), "the error names the ifb: {out}");
    let q = p.node.sh("tc", &["qdisc", "show", "dev", "vethh"]);
    assert!(!q.contains("tbf") && !q.contains("ingress"), "failed ADD left qdiscs on the veth: {q}");
    assert!(p.links().contains(&name), "the ifb that was there before ADD must stay");
}

#[test]
fn invalid_and_unusable_input() {
    let p = Pair::new();
    let (ok, out) = p.ours("ADD", "ci", &p.conf("1.0.0", json!({"ingressRate": 8000})));
    assert!(!ok && out["code"] == 7 && out["msg"].as_str().unwrap().contains("ingressBurst"), "{out}");
    let mut conf = p.conf("1.0.0", limits());
    conf.as_object_mut().unwrap().remove("prevResult");
    let (ok, out) = p.ours("ADD", "ci", &conf);
    assert!(!ok && out["msg"].as_str().unwrap().contains("chained"), "{out}");
    // No limits: prevResult passes through untouched, nothing is made.
    let conf = p.conf("1.0.0", json!({}));
    let (ok, out) = p.ours("ADD", "ci", &conf);
    assert!(ok && out["interfaces"].as_array().unwrap().len() == 2, "{out}");
    assert!(!p.links().contains("bwp"));
}

#[test]
fn gc_removes_ifbs_of_attachments_no_longer_valid() {
    let p = Pair::new();
    let conf = p.conf("1.1.0", json!({"egressRate": 8_000_000, "egressBurst": 400_000}));
    let (ok, out) = p.ours("ADD", "keep", &conf);
    assert!(ok, "{out}");
    // A second attachment needs a second veth host end: reuse the same one after clearing it.
    let _ = p.node.exec("tc", &["qdisc", "del", "dev", "vethh", "ingress"]);
    let (ok, out) = p.ours("ADD", "gone", &conf);
    assert!(ok, "{out}");
    // A reference-made ifb (no alias) of the same network is never touched.
    let foreign = bandwidth::ifb_name("bwnet", "foreign");
    sh("ip", &["-n", &p.node.name, "link", "add", &foreign, "type", "ifb"]);
    let mut gc = json!({"cniVersion": "1.1.0", "name": "bwnet", "type": "bandwidth",
                        "cni.dev/valid-attachments": [{"containerID": "keep", "ifname": "eth0"}]});
    let (ok, out) = p.ours("GC", "", &gc);
    assert!(ok, "GC: {out}");
    let links = p.links();
    assert!(links.contains(&bandwidth::ifb_name("bwnet", "keep")), "GC removed a valid attachment's ifb");
    assert!(!links.contains(&bandwidth::ifb_name("bwnet", "gone")), "GC left a stale ifb");
    assert!(links.contains(&foreign), "GC removed an ifb it did not make");
    gc["name"] = json!("othernet");
    gc["cni.dev/valid-attachments"] = json!([]);
    assert!(p.ours("GC", "", &gc).0);
    assert!(p.links().contains(&bandwidth::ifb_name("bwnet", "keep")), "GC of another network removed ours");
    let (ok, out) = p.ours("STATUS", "", &json!({"cniVersion": "1.1.0", "name": "bwnet", "type": "bandwidth"}));
    assert!(ok, "STATUS: {out}");
}

#[test]
fn chain_through_libcni_limits_real_traffic_both_directions() {
    let bridge = unique("bwbr");
    let _bridge = LinkGuard(bridge.clone());
    let data = TempDir::new("bw-ipam");
    let cache = TempDir::new("bw-cache");
    let (ingress, egress) = (16_000_000.0, 8_000_000.0);
    let list = json!({"cniVersion": "1.1.0", "name": unique("bwnet"), "plugins": [
        {"type": "bridge", "bridge": bridge, "isGateway": true,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.219.1.0/24"}]], "dataDir": data.path()}},
        {"type": "bandwidth", "capabilities": {"bandwidth": true}}
    ]});
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).unwrap();
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let pod = Netns::new("bwpod");
    let mut caps = Map::new();
    // go-cni's spelling of the capability (untagged Go struct fields).
    caps.insert(
        "bandwidth".into(),
        json!({"IngressRate": ingress as u64, "IngressBurst": 800_000, "EgressRate": egress as u64, "EgressBurst": 800_000}),
    );
    let (rt, result, ifb) = add(&cni, &list, &pod, caps);
    let pod_ip = result.ips[0].address.ip().to_string();

    // Pod ingress: the host sends to the pod.
    let listener = in_netns(&pod.path, || TcpListener::bind("0.0.0.0:5201").unwrap()).join().unwrap();
    let rx = std::thread::spawn(move || receive(listener));
    send(format!("{pod_ip}:5201"), (ingress as usize / 8) * 3);
    within(rx.join().unwrap(), ingress, "pod ingress");

    // Pod egress: the pod sends to the host's bridge address.
    let gw = result.ips[0].gateway.unwrap().to_string();
    let listener = TcpListener::bind(format!("{gw}:0")).unwrap();
    let to = listener.local_addr().unwrap().to_string();
    let rx = std::thread::spawn(move || receive(listener));
    in_netns(&pod.path, move || send(to, (egress as usize / 8) * 3)).join().unwrap();
    within(rx.join().unwrap(), egress, "pod egress");

    del_twice(&cni, &list, &rt, &ifb);
    let gc_valid: Vec<Attachment> = Vec::new();
    cni.gc_network_list(&list, Some(&gc_valid)).expect("GC");
}
