#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Traffic routed to the first pod of a node over IPv6, right after its ADD. The node is a network
//! namespace that forwards between its uplink and the bridge; a peer on the uplink routes the pod
//! range through it, as another node does with host-gw routes.
//!
//! The bridge's link-local address appears when its first port comes up. While that address is
//! tentative (DAD), the node sends no neighbour solicitation for packets it forwards onto the
//! bridge, so the pod's neighbour entry stays INCOMPLETE and the packets wait, then are dropped.
//! Privileged: everything lives in namespaces of its own.

use cni_tests::exec::exec_in;
use cni_tests::{bin_dir, require_tools, unique, Netns, TempDir};
use serde_json::{json, Value};

/// Runs the bridge plugin inside `node` (its host side is the node) and returns the result.
fn bridge_in(node: &Netns, command: &str, conf: &Value, container_id: &str, pod: &Netns) -> Value {
    let bin = bin_dir();
    let out = exec_in(&node.name, &bin.join("bridge"), command, conf, container_id, &pod.path, &bin);
    assert_eq!(out.rc, 0, "bridge {command}: {}", out.stdout);
    out.json
}

#[test]
fn the_first_pod_of_a_node_answers_routed_ipv6_right_after_add() {
    require_tools(&["busybox"]);
    let node = Netns::new("cnfn");
    let peer = Netns::new("cnfp");
    node.ip(&["link", "add", "up0", "type", "veth", "peer", "name", "up0", "netns", &peer.name]);
    for (ns, addr) in [(&node, "fd00:95::12/64"), (&peer, "fd00:95::11/64")] {
        ns.ip(&["link", "set", "up0", "up"]);
        ns.ip(&["addr", "add", addr, "dev", "up0", "nodad"]);
    }
    node.sh("sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"]);
    peer.ip(&["-6", "route", "add", "fd00:10:244:1::/64", "via", "fd00:95::12"]);
    let data = TempDir::new("cnfn-ipam");

    // Each round is a node's first pod: the plugin makes the bridge, the peer pings at once. The
    // bridge's link-local must already be usable (not in its 1-2 s DAD window). In the first
    // round more pods follow on the same bridge, each pinged once right after its ADD (the node has
    // no neighbour entry for any of them).
    for round in 0..4 {
        let bridge = format!("cnfb{round}");
        let conf = json!({
            "cniVersion": "1.1.0", "name": unique("netf"), "type": "bridge", "bridge": bridge,
            "isGateway": true, "isDefaultGateway": true,
            "ipam": { "type": "host-local", "ranges": [[{ "subnet": "fd00:10:244:1::/64" }]],
                      "dataDir": data.path() }
        });
        let pods = if round == 0 { 6 } else { 1 };
        let mut attached = Vec::new();
        for k in 0..pods {
            let pod = Netns::new("cnfq");
            let id = unique("ctr");
            let result = bridge_in(&node, "ADD", &conf, &id, &pod);
            let pod_ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
            // The cause itself, read before any packet: a tentative link-local right after ADD is
            // what drops the first forwarded packets.
            let link_local = node.ip(&["-6", "addr", "show", "dev", &bridge, "scope", "link"]);
            assert!(
                !link_local.contains("tentative"),
                "round {round}: the bridge's link-local address is tentative right after ADD:\n{link_local}"
            );
            // Then the effect: one ping, answered. Its deadline allows for a loaded machine
            // (scheduling alone can take a second there); DAD's window is checked above.
            let answered = peer.exec("busybox", &["ping", "-c", "1", "-W", "5", &pod_ip]).status.success();
            let neigh = node.ip(&["-6", "neigh", "show", "dev", &bridge]);
            assert!(
                answered,
                "round {round}, pod {k}: {pod_ip} did not answer a routed ping right after ADD; bridge \
                 link-local:\n{link_local}neighbours: {neigh}"
            );
            let link_local = node.ip(&["-6", "addr", "show", "dev", &bridge, "scope", "link"]);
            assert!(
                link_local.contains("fe80::") && !link_local.contains("tentative"),
                "round {round}: the bridge's link-local address is not usable:\n{link_local}"
            );
            attached.push((id, pod));
        }
        for (id, pod) in &attached {
            bridge_in(&node, "DEL", &conf, id, pod);
        }
        node.ip(&["link", "del", &bridge]);
    }
}
