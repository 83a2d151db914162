#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A configuration error is reported before any change: each plugin's ADD is run on a test node (a
//! namespace of its own) with a configuration it refuses, while `ip monitor` watches the node and the
//! pod; the error must come with the right code and with no link, address, route or netconf (a
//! sysctl such as forwarding) event in either.
//! Link types this kernel lacks (ipvlan, vlan, dummy) can still be run: the error must come before
//! the first netlink request that would need them. Privileged: makes its own namespaces, removed
//! even when an assertion fails.

use cni_tests::exec::{exec_in, Out};
use cni_tests::{bin_dir, require_root, unique, Netns};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

const CONFIG: u64 = 7;
const NETWORK: u64 = 100;

/// `ip monitor` of one namespace, its lines arriving on a channel.
struct Monitor {
    ns: String,
    child: Child,
    lines: Receiver<String>,
}

/// The marker addresses put on `lo` around the watched call; their own events are not counted.
const MARK: &str = "127.77.0.";

impl Monitor {
    /// Watches `ns` from the moment this returns.
    fn start(ns: &Netns) -> Monitor {
        let mut child = Command::new("ip")
            .args(["-n", &ns.name, "-o", "monitor", "link", "address", "route", "netconf"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ip monitor");
        let (tx, lines) = channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut m = Monitor { ns: ns.name.clone(), child, lines };
        // The monitor has subscribed once it reports a change made after it started.
        m.mark(1);
        m
    }

    /// Puts marker address `n` on `lo` and waits for the monitor to report it; the lines before it.
    fn mark(&mut self, n: u8) -> Vec<String> {
        let addr = format!("{MARK}{n}");
        let mut before = Vec::new();
        for _ in 0..50 {
            let out = Command::new("ip")
                .args(["-n", &self.ns, "addr", "replace", &format!("{addr}/32"), "dev", "lo"])
                .output()
                .unwrap();
            assert!(out.status.success(), "marker on {}: {}", self.ns, String::from_utf8_lossy(&out.stderr));
            while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                if line.contains(&format!("{addr}/32")) {
                    return before;
                }
                before.push(line);
            }
            // Not subscribed yet when the marker went on: take it off and try again.
            let _ =
                Command::new("ip").args(["-n", &self.ns, "addr", "del", &format!("{addr}/32"), "dev", "lo"]).output();
        }
        panic!("ip monitor in {} never reported the marker", self.ns);
    }

    /// The events since [`Monitor::start`], markers left out.
    fn stop(mut self) -> Vec<String> {
        let lines = self.mark(2);
        lines.into_iter().filter(|l| !l.contains(MARK)).collect()
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One refused ADD: the plugin, its keys (beside cniVersion, name, type), the namespace path
/// given as CNI_NETNS (`None`: the pod's), and the error code it must get.
struct Refused {
    what: &'static str,
    plugin: &'static str,
    keys: Value,
    netns: Option<&'static str>,
    code: u64,
}

/// Runs `r` on a fresh node and pod: the ADD's output and the events seen in either namespace.
fn run(r: &Refused) -> (Out, Vec<String>) {
    let node = Netns::new("cnvn");
    let pod = Netns::new("cnvp");
    // What the plugins look for on the node: a master (m0), a device to move (hd0).
    for (a, b) in [("m0", "m1"), ("hd0", "hd1")] {
        node.ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        node.ip(&["link", "set", a, "up"]);
    }
    let mut conf = json!({ "cniVersion": "1.0.0", "name": unique("valnet"), "type": r.plugin });
    for (k, v) in r.keys.as_object().unwrap() {
        conf[k] = v.clone();
    }
    let (watch_node, watch_pod) = (Monitor::start(&node), Monitor::start(&pod));
    let netns = r.netns.map_or(pod.path.clone(), str::to_string);
    let bin = bin_dir().join(r.plugin);
    let out = exec_in(&node.name, &bin, "ADD", &conf, &unique("ctr"), &netns, &bin_dir());
    let mut events: Vec<String> = watch_node.stop().into_iter().map(|l| format!("node: {l}")).collect();
    events.extend(watch_pod.stop().into_iter().map(|l| format!("pod: {l}")));
    (out, events)
}

#[test]
fn a_config_error_is_reported_before_any_change() {
    require_root();
    let no_ipam = json!({ "type": "no-such-ipam" });
    let mut cases = Vec::new();
    for (plugin, keys) in [
        ("bridge", json!({ "bridge": "cni0", "isGateway": true })),
        ("ptp", json!({})),
        ("macvlan", json!({ "master": "m0" })),
        ("ipvlan", json!({ "master": "m0" })),
        ("vlan", json!({ "master": "m0", "vlanId": 5 })),
        ("host-device", json!({ "device": "hd0" })),
        ("tap", json!({})),
        ("dummy", json!({})),
    ] {
        let mut keys = keys;
        keys["ipam"] = no_ipam.clone();
        cases.push(Refused { what: "an IPAM plugin not in CNI_PATH", plugin, keys, netns: None, code: CONFIG });
    }
    // The master's MTU is 1500; a namespace path that is not there shows the error comes before
    // the pod's namespace is opened.
    for (plugin, keys) in [
        ("macvlan", json!({ "master": "m0", "mtu": 9000 })),
        ("ipvlan", json!({ "master": "m0", "mtu": 9000 })),
        ("vlan", json!({ "master": "m0", "vlanId": 5, "mtu": 9000, "ipam": { "type": "static" } })),
    ] {
        cases.push(Refused {
            what: "an MTU above the master's",
            plugin,
            keys: keys.clone(),
            netns: Some("/run/netns/cnv-no-such-pod"),
            code: CONFIG,
        });
        cases.push(Refused { what: "an MTU above the master's", plugin, keys, netns: None, code: CONFIG });
    }
    // No IPAM at 0.2.0: a result without addresses cannot be printed there (upstream's error, 999).
    for (plugin, keys) in [
        ("bridge", json!({ "cniVersion": "0.2.0", "bridge": "cni0" })),
        ("host-device", json!({ "cniVersion": "0.2.0", "device": "hd0" })),
        ("tap", json!({ "cniVersion": "0.2.0" })),
    ] {
        cases.push(Refused { what: "no IPAM at cniVersion 0.2.0", plugin, keys, netns: None, code: 999 });
    }
    // tuning chained after nothing that made CNI_IFNAME: refused before its sysctl is written
    // (off in a new namespace; turning it on is a netconf event).
    cases.push(Refused {
        what: "no CNI_IFNAME in the pod",
        plugin: "tuning",
        keys: json!({
            "sysctl": { "net.ipv4.conf.all.ignore_routes_with_linkdown": "1" }, "mtu": 1400,
            "prevResult": { "cniVersion": "1.0.0", "interfaces": [{ "name": "eth0" }] }
        }),
        netns: None,
        code: NETWORK,
    });
    let mut failures = Vec::new();
    for r in &cases {
        let (out, events) = run(r);
        let what = format!("{} with {} (CNI_NETNS {})", r.plugin, r.what, r.netns.unwrap_or("the pod"));
        if out.rc == 0 || out.json["code"].as_u64() != Some(r.code) {
            failures.push(format!("{what}: wanted code {}, got {}", r.code, out.stdout.trim()));
        }
        if !events.is_empty() {
            failures.push(format!("{what}: changes made before the error:\n  {}", events.join("\n  ")));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
