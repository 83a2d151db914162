#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A Linux bridge holds at most 1023 ports (its port numbers have 10 bits, 0 unused). An ADD to a
//! full bridge fails with a message that says so, and leaves nothing behind. Privileged: the bridge
//! and its ports live in a namespace of their own, the node the plugin runs in.

use cni_tests::exec::exec_in;
use cni_tests::{bin_dir, reservations, unique, Netns, TempDir};
use serde_json::json;

/// The names of the links of `ns` (`q1@p1` for a veth end), sorted.
fn links(ns: &Netns) -> Vec<String> {
    let mut names: Vec<String> =
        ns.ip(&["-o", "link", "show"]).lines().filter_map(|l| l.split(": ").nth(1)).map(str::to_string).collect();
    names.sort();
    names
}

#[test]
fn an_add_to_a_bridge_with_1023_ports_fails_saying_so_and_leaves_nothing() {
    let node = Netns::new("cnfl");
    let pod = Netns::new("cnfm");
    let data = TempDir::new("cnfl-ipam");
    node.ip(&["link", "add", "cnfl0", "type", "bridge"]);
    let batch: String =
        (0..1023).map(|i| format!("link add p{i} type veth peer name q{i}\nlink set p{i} master cnfl0\n")).collect();
    let file = data.path().join("ports.batch");
    std::fs::write(&file, batch).unwrap();
    node.ip(&["-batch", file.to_str().unwrap()]);
    let ports = node.sh("ls", &["/sys/class/net/cnfl0/brif"]).lines().count();
    assert_eq!(ports, 1023, "the bridge should be full");
    let before = links(&node);

    let network = unique("netfl");
    let conf = json!({
        "cniVersion": "1.1.0", "name": network, "type": "bridge", "bridge": "cnfl0", "isGateway": true,
        "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.251.0.0/24" }]], "dataDir": data.path() }
    });
    let bin = bin_dir();
    let out = exec_in(&node.name, &bin.join("bridge"), "ADD", &conf, "full-bridge-1", &pod.path, &bin);
    assert_ne!(out.rc, 0, "ADD to a full bridge succeeded: {}", out.stdout);
    assert_eq!(out.json["code"], 100, "{}", out.stdout);
    let msg = out.json["msg"].as_str().unwrap();
    assert!(
        msg.contains("cnfl0")
            && msg.contains("1023 ports, the most a bridge can have")
            && msg.contains("another bridge"),
        "the message should say the bridge is full and what to do: {msg}"
    );

    assert_eq!(links(&node), before, "the failed ADD left links on the node");
    let pod_links = links(&pod);
    assert_eq!(pod_links, ["lo"], "the failed ADD left links in the pod: {pod_links:?}");
    assert!(reservations(data.path(), &network).is_empty(), "the failed ADD left its address reserved");
    // The same holds for DEL afterwards: it succeeds with nothing to remove.
    let del = exec_in(&node.name, &bin.join("bridge"), "DEL", &conf, "full-bridge-1", &pod.path, &bin);
    assert_eq!(del.rc, 0, "DEL after the failed ADD: {}", del.stdout);
}
