#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! bridge's `isGateway` never puts on the bridge a gateway of a network the node is on. The node is
//! a namespace with a LAN interface `lan0` (192.168.77.10/24, fd77::10/64) whose peer, in a second
//! namespace, is a neighbour on that LAN (192.168.77.20); the LAN's router would be 192.168.77.1,
//! which the neighbour asks for with ARP: only a node that took the router's address answers. The
//! plugin runs inside the node namespace. Privileged: everything lives in namespaces of its own.

use cni_tests::exec::{exec_in, Out};
use cni_tests::{bin_dir, require_tools, reservations, unique, Netns, TempDir};
use serde_json::{json, Value};

struct World {
    node: Netns,
    neighbour: Netns,
    data: TempDir,
}

impl World {
    fn new() -> World {
        require_tools(&["busybox"]);
        let node = Netns::new("cnbn");
        let neighbour = Netns::new("cnbb");
        node.ip(&["link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", &neighbour.name]);
        for (ns, v4, v6) in
            [(&node, "192.168.77.10/24", "fd77::10/64"), (&neighbour, "192.168.77.20/24", "fd77::20/64")]
        {
            ns.ip(&["addr", "add", v4, "dev", "lan0"]);
            ns.ip(&["addr", "add", v6, "dev", "lan0", "nodad"]);
            ns.ip(&["link", "set", "lan0", "up"]);
        }
        World { node, neighbour, data: TempDir::new("cnbn-ipam") }
    }

    /// A bridge network on bridge `br0` of the node, with `keys` merged in.
    fn conf(&self, ranges: Value, keys: Value) -> Value {
        let mut c = json!({ "cniVersion": "1.1.0", "name": unique("netb"), "type": "bridge", "bridge": "br0",
            "isGateway": true, "ipam": { "type": "host-local", "dataDir": self.data.path(), "ranges": ranges } });
        for (k, v) in keys.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    fn bridge(&self, command: &str, conf: &Value, id: &str, pod: &Netns) -> Out {
        let bin = bin_dir();
        exec_in(&self.node.name, &bin.join("bridge"), command, conf, id, &pod.path, &bin)
    }

    fn arp_answered(&self, ip: &str) -> bool {
        self.neighbour.exec("busybox", &["arping", "-f", "-c", "2", "-w", "1", "-I", "lan0", ip]).status.success()
    }

    /// The node's addresses and the ports of br0 (none before the bridge exists).
    fn node_state(&self) -> String {
        let out = self.node.exec("ip", &["-o", "link", "show", "master", "br0"]);
        let ports = String::from_utf8_lossy(&out.stdout);
        format!("addresses:\n{}ports:\n{ports}", self.node.ip(&["-o", "addr", "show"]))
    }

    /// ADD that must be refused with code 7 and a message holding each of `says`, leaving no port,
    /// no address and no reservation (the bridge itself stays, as after any failed ADD).
    fn refused(&self, what: &str, conf: &Value, says: &[&str]) {
        let pod = Netns::new("cnbp");
        let id = unique("ctrb");
        let before = self.node_state();
        let out = self.bridge("ADD", conf, &id, &pod);
        if out.rc == 0 {
            let layout = self.node_state();
            self.bridge("DEL", conf, &id, &pod);
            panic!("{what}: ADD succeeded: {}\nnode:\n{layout}", out.stdout);
        }
        assert_eq!(out.err_code(), 7, "{what}: {}", out.stdout);
        eprintln!("{what}: refused: {}", out.msg());
        for s in says {
            assert!(out.msg().contains(s), "{what}: the message lacks {s:?}: {}", out.msg());
        }
        let after = self.node_state();
        // A bridge the refused ADD made has only its link-local address: compare the rest.
        let without_br0 = |s: &str| s.lines().filter(|l| !l.contains(" br0 ")).collect::<Vec<_>>().join("\n");
        assert_eq!(without_br0(&after), without_br0(&before), "{what}: the refused ADD left something");
        let on_br0: Vec<&str> = after.lines().filter(|l| l.contains(" br0 ")).collect();
        assert!(
            on_br0.iter().all(|l| !l.contains("inet ") && !l.contains("scope global")),
            "{what}: br0 holds an address:\n{after}"
        );
        let ports = self.node.ip(&["-o", "link", "show", "master", "br0"]);
        assert!(ports.trim().is_empty(), "{what}: a port is left on br0:\n{ports}");
        let network = conf["name"].as_str().unwrap();
        assert!(reservations(self.data.path(), network).is_empty(), "{what}: the refused ADD kept an address");
        assert_eq!(self.bridge("DEL", conf, &id, &pod).rc, 0, "{what}: DEL after the refused ADD");
    }
}

/// `isGateway` on a subnet that overlaps the node's LAN (a slice of it, inside it, over IPv6), or
/// with a gateway the node already holds, is refused (code 7) and the bridge takes no address:
/// the node does not answer ARP for the LAN's router, and its route to the LAN stays on lan0. The
/// bridge's own gateway, shared by its pods, and a layer 2 bridge on the LAN's addresses stay
/// allowed.
#[test]
fn bridge_gateway_takes_no_address_of_the_nodes_networks() {
    let w = World::new();
    assert!(!w.arp_answered("192.168.77.1"), "something answers for the router before any ADD");
    let slice = w.conf(
        json!([[{ "subnet": "192.168.77.0/24", "rangeStart": "192.168.77.100", "rangeEnd": "192.168.77.110" }]]),
        json!({}),
    );
    w.refused("a range on the LAN", &slice, &["192.168.77.0/24", "gateway 192.168.77.1", "lan0"]);
    assert!(!w.arp_answered("192.168.77.1"), "the node answers ARP for the LAN's router");

    let inside = w.conf(json!([[{ "subnet": "192.168.77.128/25" }]]), json!({}));
    w.refused("a subnet inside the LAN", &inside, &["192.168.77.128/25", "192.168.77.0/24", "lan0"]);
    let route = w.node.ip(&["route", "get", "192.168.77.200"]);
    assert!(route.contains("dev lan0"), "the node's route to the LAN moved:\n{route}");

    let v6 =
        w.conf(json!([[{ "subnet": "fd77::/64", "rangeStart": "fd77::100", "rangeEnd": "fd77::110" }]]), json!({}));
    w.refused("an IPv6 subnet on the LAN", &v6, &["fd77::/64", "gateway fd77::1", "lan0"]);

    w.node.ip(&["addr", "add", "10.57.0.1/32", "dev", "lo"]);
    let held = w.conf(json!([[{ "subnet": "10.57.0.0/24" }]]), json!({}));
    w.refused("a gateway the node holds", &held, &["gateway 10.57.0.1", "an address of the node", "lo"]);

    // What stays allowed: the bridge holding its own gateway for every pod, and a bridge without
    // `isGateway` on the LAN's addresses (layer 2 only: nothing goes on the host).
    let own = w.conf(json!([[{ "subnet": "10.205.0.0/24" }], [{ "subnet": "fd00:205::/64" }]]), json!({}));
    let pods: Vec<(Netns, String)> = (0..2).map(|_| (Netns::new("cnbp"), unique("ctrb"))).collect();
    for (pod, id) in &pods {
        let out = w.bridge("ADD", &own, id, pod);
        assert_eq!(out.rc, 0, "a pod of a subnet off the node's networks: {}", out.stdout);
        assert!(cni_tests::pings(pod, "10.205.0.1"), "the pod cannot reach its gateway");
    }
    assert_eq!(bridge_ports_in(&w.node, "br0"), 2, "both pods are ports of br0");
    for (pod, id) in &pods {
        assert_eq!(w.bridge("DEL", &own, id, pod).rc, 0, "DEL");
    }

    let l2 = w.conf(
        json!([[{ "subnet": "192.168.77.0/24", "rangeStart": "192.168.77.100", "rangeEnd": "192.168.77.110" }]]),
        json!({ "bridge": "br1", "isGateway": false }),
    );
    let pod = Netns::new("cnbp");
    let id = unique("ctrb");
    let out = w.bridge("ADD", &l2, &id, &pod);
    assert_eq!(out.rc, 0, "a layer 2 bridge on the LAN's addresses: {}", out.stdout);
    assert!(!w.arp_answered("192.168.77.1"), "the node answers ARP for the LAN's router");
    assert_eq!(w.bridge("DEL", &l2, &id, &pod).rc, 0, "DEL");
    w.node.ip(&["link", "del", "br0"]);
    w.node.ip(&["link", "del", "br1"]);
}

fn bridge_ports_in(node: &Netns, bridge: &str) -> usize {
    node.ip(&["-o", "link", "show", "master", bridge]).lines().count()
}
