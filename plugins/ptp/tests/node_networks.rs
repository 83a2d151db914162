#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! ptp never puts on the host an address of a network the node is on. The node is a namespace with
//! a LAN interface `lan0` (192.168.77.10/24, fd77::10/64) whose peer, in a second namespace, is a
//! neighbour on that LAN (192.168.77.20); the LAN's router would be 192.168.77.1, which the
//! neighbour asks for with ARP: only a node that took the router's address answers. The plugin runs
//! inside the node namespace. Privileged: everything lives in namespaces of its own.

use cni_tests::exec::{exec_in, Out};
use cni_tests::{bin_dir, require_tools, reservations, unique, Netns, TempDir};
use serde_json::{json, Value};

/// The node, its LAN neighbour, and a data directory for host-local.
struct World {
    node: Netns,
    neighbour: Netns,
    data: TempDir,
}

impl World {
    fn new() -> World {
        require_tools(&["busybox", "nft"]);
        let node = Netns::new("cnln");
        let neighbour = Netns::new("cnlb");
        node.ip(&["link", "add", "lan0", "type", "veth", "peer", "name", "lan0", "netns", &neighbour.name]);
        for (ns, v4, v6) in
            [(&node, "192.168.77.10/24", "fd77::10/64"), (&neighbour, "192.168.77.20/24", "fd77::20/64")]
        {
            ns.ip(&["addr", "add", v4, "dev", "lan0"]);
            ns.ip(&["addr", "add", v6, "dev", "lan0", "nodad"]);
            ns.ip(&["link", "set", "lan0", "up"]);
        }
        node.ip(&["route", "add", "default", "via", "192.168.77.1"]);
        World { node, neighbour, data: TempDir::new("cnln-ipam") }
    }

    fn conf(&self, ipam: Value) -> Value {
        json!({ "cniVersion": "1.1.0", "name": unique("netl"), "type": "ptp", "ipMasq": true, "ipam": ipam })
    }

    fn host_local(&self, subnet: &str, start: &str, end: &str) -> Value {
        json!({ "type": "host-local", "dataDir": self.data.path(),
                "ranges": [[{ "subnet": subnet, "rangeStart": start, "rangeEnd": end }]] })
    }

    fn ptp(&self, command: &str, conf: &Value, id: &str, pod: &Netns) -> Out {
        let bin = bin_dir();
        exec_in(&self.node.name, &bin.join("ptp"), command, conf, id, &pod.path, &bin)
    }

    /// The node's links and addresses, for "nothing was left" comparisons.
    fn node_state(&self) -> String {
        let links = self.node.ip(&["-o", "link", "show"]);
        let names: Vec<&str> = links.lines().filter_map(|l| l.split(": ").nth(1)).collect();
        format!("links {names:?}\naddresses:\n{}", self.node.ip(&["-o", "addr", "show"]))
    }

    /// Whether anything on the LAN answers the neighbour's ARP request for `ip` (no host on this
    /// LAN holds the router's address, so only a node that took it answers).
    fn arp_answered(&self, ip: &str) -> bool {
        self.neighbour.exec("busybox", &["arping", "-f", "-c", "2", "-w", "1", "-I", "lan0", ip]).status.success()
    }

    /// ADD that must be refused with `code` and a message holding every one of `says`, leaving the
    /// node as it was: no veth, no address, no reservation, no masquerade rule.
    fn refused(&self, what: &str, conf: &Value, code: u64, says: &[&str]) {
        let before = self.node_state();
        let pod = Netns::new("cnlp");
        let id = unique("ctrl");
        let out = self.ptp("ADD", conf, &id, &pod);
        if out.rc == 0 {
            let layout = self.node_state();
            self.ptp("DEL", conf, &id, &pod);
            panic!("{what}: ADD succeeded: {}\nnode:\n{layout}", out.stdout);
        }
        assert_eq!(out.err_code(), code, "{what}: {}", out.stdout);
        eprintln!("{what}: refused: {}", out.msg());
        for s in says {
            assert!(out.msg().contains(s), "{what}: the message lacks {s:?}: {}", out.msg());
        }
        assert_eq!(self.node_state(), before, "{what}: the refused ADD left something on the node");
        assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "{what}: eth0 left in the pod");
        let network = conf["name"].as_str().unwrap();
        assert!(reservations(self.data.path(), network).is_empty(), "{what}: the refused ADD kept an address");
        let rules = self.node.sh("nft", &["list", "ruleset"]);
        assert!(!rules.contains(&id), "{what}: a masquerade rule was left:\n{rules}");
        assert!(self.ptp("DEL", conf, &id, &pod).rc == 0, "{what}: DEL after the refused ADD");
    }
}

/// A gateway, or a pod address, on the node's LAN is refused (code 7) before anything is made, and
/// the node does not start answering ARP for the LAN's router; so is a gateway ptp would take as the
/// subnet's first address from a subnet the LAN is part of, and an address the node already holds.
#[test]
fn ptp_takes_no_address_of_the_nodes_networks() {
    let w = World::new();
    assert!(!w.arp_answered("192.168.77.1"), "something answers for the router before any ADD");

    // A range that is a slice of the LAN: host-local's gateway is the LAN router's address.
    let lan_slice = w.conf(w.host_local("192.168.77.0/24", "192.168.77.100", "192.168.77.110"));
    w.refused("a range on the LAN", &lan_slice, 7, &["gateway 192.168.77.1", "192.168.77.0/24", "lan0"]);
    assert!(!w.arp_answered("192.168.77.1"), "the node answers ARP for the LAN's router");

    // The operator names the router as the gateway of a range of the node's LAN, over IPv6.
    let v6 = w.conf(json!({ "type": "host-local", "dataDir": w.data.path(),
        "ranges": [[{ "subnet": "fd77::/64", "rangeStart": "fd77::100", "rangeEnd": "fd77::110", "gateway": "fd77::1" }]] }));
    w.refused("an IPv6 gateway on the LAN", &v6, 7, &["gateway fd77::1", "fd77::/64", "lan0"]);

    // No gateway from IPAM: the subnet's first address would be the router's.
    let no_gw = w.conf(json!({ "type": "static", "addresses": [{ "address": "192.168.77.50/24" }] }));
    w.refused("no gateway, a subnet on the LAN", &no_gw, 7, &["no gateway", "192.168.77.1", "lan0"]);
    assert!(!w.arp_answered("192.168.77.1"), "the node answers ARP for the LAN's router");

    // Addresses the node holds (here on lo, on no connected subnet): as the gateway, as the pod's.
    w.node.ip(&["addr", "add", "10.55.0.1/32", "dev", "lo"]);
    w.node.ip(&["addr", "add", "10.56.0.9/32", "dev", "lo"]);
    let local_gw =
        w.conf(json!({ "type": "static", "addresses": [{ "address": "10.55.0.5/24", "gateway": "10.55.0.1" }] }));
    w.refused("a gateway the node holds", &local_gw, 7, &["gateway 10.55.0.1", "an address of the node", "lo"]);
    let local_pod =
        w.conf(json!({ "type": "static", "addresses": [{ "address": "10.56.0.9/24", "gateway": "10.56.0.1" }] }));
    w.refused("a pod address the node holds", &local_pod, 7, &["10.56.0.9", "an address of the node", "lo"]);
}

/// What stays allowed: the pods of one network share the gateway on their host veths, a subnet no
/// other interface is on gets its first address as the gateway, and a pod address another ptp host
/// veth still routes (its pod's DEL under way) is code 11, try again.
#[test]
fn ptp_shares_its_gateway_and_takes_its_own_subnets_first_address() {
    let w = World::new();
    let net = w.conf(w.host_local("10.203.0.0/24", "10.203.0.10", "10.203.0.20"));
    let pods: Vec<(Netns, String)> = (0..2).map(|_| (Netns::new("cnlp"), unique("ctrl"))).collect();
    for (pod, id) in &pods {
        let out = w.ptp("ADD", &net, id, pod);
        assert_eq!(out.rc, 0, "a pod of a subnet off the node's networks: {}", out.stdout);
        assert!(cni_tests::pings(pod, "10.203.0.1"), "the pod cannot reach its gateway");
    }
    let holders = w.node.ip(&["-o", "-4", "addr", "show", "to", "10.203.0.1/32"]);
    assert_eq!(holders.lines().count(), 2, "both host veths hold the gateway:\n{holders}");

    let no_gw = w.conf(json!({ "type": "static", "addresses": [{ "address": "10.204.0.7/24" }] }));
    let pod = Netns::new("cnlp");
    let id = unique("ctrl");
    let out = w.ptp("ADD", &no_gw, &id, &pod);
    assert_eq!(out.rc, 0, "a subnet of ptp's own without a gateway: {}", out.stdout);
    assert_eq!(out.ok()["ips"][0]["gateway"], "10.204.0.1", "{}", out.stdout);
    assert!(cni_tests::pings(&pod, "10.204.0.1"), "the pod cannot reach the gateway ptp chose");

    // A host veth of ptp's (the network's gateway on it) still routing the address IPAM hands out.
    w.node.ip(&["link", "add", "veth0badc0de", "type", "veth", "peer", "name", "cnlstale"]);
    w.node.ip(&["link", "set", "veth0badc0de", "up"]);
    w.node.ip(&["addr", "add", "10.203.0.1/32", "dev", "veth0badc0de"]);
    w.node.ip(&["route", "add", "10.203.0.77/32", "dev", "veth0badc0de", "scope", "host"]);
    let stale =
        w.conf(json!({ "type": "static", "addresses": [{ "address": "10.203.0.77/24", "gateway": "10.203.0.1" }] }));
    w.refused("an address a host veth still routes", &stale, 11, &["veth0badc0de", "10.203.0.77", "try again"]);

    for (pod, id) in &pods {
        assert_eq!(w.ptp("DEL", &net, id, pod).rc, 0, "DEL");
    }
    assert_eq!(w.ptp("DEL", &no_gw, &id, &pod).rc, 0, "DEL");
}
