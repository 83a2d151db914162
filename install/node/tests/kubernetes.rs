//! The Kubernetes datastore against a stand-in API server (tests/k8s_standin.py: HTTPS, bearer
//! token, Node list and watch, merge patch), since no API server runs on these machines. The Node
//! objects have the shape of real kubeadm nodes. The agent learns its pod CIDRs from its Node,
//! routes to the others' `spec.podCIDRs` via their InternalIP, follows ADDED / MODIFIED / DELETED,
//! lists again after a 410 Gone, and records its VTEP MAC in an annotation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::k8s::*;
use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// The agent of node n0 on the stand-in (`--backend auto`, no plugins installed), `extra` appended.
fn agent_args(kubeconfig: &Path, conf: &Path, node_ips: &str, extra: &[&str]) -> Vec<String> {
    let base = [
        "--node-name",
        "n0",
        "--datastore",
        "kubernetes",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/56",
        "--node-ip",
        node_ips,
        "--backend",
        "auto",
        "--no-plugins",
        "--conf-dir",
        conf.to_str().unwrap(),
    ];
    base.iter().chain(extra).map(|s| s.to_string()).collect()
}

#[test]
fn kubernetes_nodes_list_watch_gone_and_annotation() {
    require(&["openssl", "python3"]);
    let t = tag();
    let dir = TempDir::new("k8s");
    let seg = Segment::new(format!("cnseg{t}"), "10.95.0.1/24");
    let node_ns = Netns::new(format!("cnn{t}-0"));
    seg.attach(&node_ns, "p0", "10.95.0.11/24");
    let ns = node_ns.0.clone();
    run_in(&ns, &["ip", "addr", "add", "fd00:95::11/64", "dev", "eth0", "nodad"]);

    let nodes = json!([
        node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", "fd00:10:244::/64"),
        node("n1", "10.95.0.12", "fd00:95::12", "10.244.1.0/24", "fd00:10:244:1::/64"),
    ]);
    let (standin, kubeconfig) = standin(&ns, &dir.0, &nodes);

    let conf = dir.0.join("net.d");
    let args = agent_args(&kubeconfig, &conf, "10.95.0.11,fd00:95::11", &[]);
    let agent = Agent::start(&ns, &dir.0, args);
    let routes = |family: &str| run_in(&ns, &["ip", family, "route", "show", "proto", "210"]);
    let log = || format!("agent:\n{}\nstand-in:\n{}", agent.proc.log(), standin.log());

    // The list: this node's CIDRs in the conflist, a host-gw route to n1 per family.
    wait_for("n1's routes", Duration::from_secs(30), || {
        (routes("-4").contains("10.244.1.0/24 via 10.95.0.12")
            && routes("-6").contains("fd00:10:244:1::/64 via fd00:95::12"))
        .then_some(())
    });
    let conflist = std::fs::read_to_string(conf.join("10-cni-rs.conflist")).unwrap();
    assert!(conflist.contains("10.244.0.0/24") && conflist.contains("fd00:10:244::/64"), "{conflist}");

    // ADDED: n2 on another subnet (VXLAN with auto) once its VTEP MAC is annotated.
    let mut n2 = node("n2", "10.97.0.13", "fd00:97::13", "10.244.2.0/24", "fd00:10:244:2::/64");
    n2["metadata"]["annotations"]["cni-rs.io/vtep-mac"] = json!("02:00:00:00:00:13");
    control(&ns, "/add", &n2.to_string());
    wait_for("n2's VXLAN route", Duration::from_secs(10), || {
        routes("-4").contains("10.244.2.0/24 via 10.244.2.0 dev cni-rs.1 onlink").then_some(())
    });
    let fdb = run_in(&ns, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("02:00:00:00:00:13 dst 10.97.0.13"), "{fdb}");

    // MODIFIED: n1 moves to another address.
    control(
        &ns,
        "/modify",
        &node("n1", "10.95.0.22", "fd00:95::22", "10.244.1.0/24", "fd00:10:244:1::/64").to_string(),
    );
    wait_for("n1's new route", Duration::from_secs(10), || {
        routes("-4").contains("10.244.1.0/24 via 10.95.0.22").then_some(())
    });

    // DELETED: n2's routes go.
    control(&ns, "/delete?name=n2", "");
    wait_for("n2's routes to go", Duration::from_secs(10), || (!routes("-4").contains("10.244.2.0/24")).then_some(()));

    // 410 Gone: n3 appears without a watch event; only the re-list the 410 forces shows it.
    let n3 = node("n3", "10.95.0.14", "fd00:95::14", "10.244.3.0/24", "fd00:10:244:3::/64");
    control(&ns, "/gone", &json!([n3]).to_string());
    wait_for("n3's route after the re-list", Duration::from_secs(20), || {
        routes("-4").contains("10.244.3.0/24 via 10.95.0.14").then_some(())
    });

    // This node's VTEP MAC went into its annotation; every request carried the token.
    let seen = run_in(&ns, &["curl", "-sSf", "http://127.0.0.1:6444/log"]);
    assert!(seen.lines().any(|l| l == "PATCH n0"), "{seen}\n{}", log());
    assert!(seen.lines().filter(|l| l.starts_with("LIST")).count() >= 2, "no re-list after 410: {seen}");
    assert!(!seen.contains("401"), "{seen}");
    let mac = run_in(&ns, &["cat", "/sys/class/net/cni-rs.1/address"]);
    assert!(agent.proc.log().contains(&format!("\"cni-rs.io/vtep-mac\":\"{}\"", mac.trim())), "{}", log());
    drop(agent);
    drop(standin);
}

/// Two Nodes whose spec.podCIDRs overlap: the older Node (creationTimestamp, not name) keeps
/// them. A pod range in an annotation is never routed. A VTEP MAC annotation copied from another
/// Node (which any holder of the agents' `patch nodes` can write) leaves the MAC with its older
/// holder, and this node's own MAC with this node. Each refusal is logged, counted, and /healthz
/// stays 200.
#[test]
fn kubernetes_overlapping_pod_cidrs_go_to_the_older_node_and_annotations_claim_nothing() {
    require(&["openssl", "python3", "curl"]);
    let t = tag();
    let dir = TempDir::new("k8s-trust");
    let seg = Segment::new(format!("cnseg{t}"), "10.95.0.1/24");
    let node_ns = Netns::new(format!("cnn{t}-0"));
    seg.attach(&node_ns, "p0", "10.95.0.11/24");
    let ns = node_ns.0.clone();
    let aged = |mut n: Value, created: &str| {
        n["metadata"]["creationTimestamp"] = json!(created);
        n
    };
    let with_mac = |mut n: Value, mac: &str| {
        n["metadata"]["annotations"]["cni-rs.io/vtep-mac"] = json!(mac);
        n
    };
    let mut annotated = node("annotated", "10.95.0.15", "fd00:95::15", "unused", "unused");
    annotated["spec"] = json!({});
    annotated["metadata"]["annotations"]["cni-rs.io/pod-cidrs"] = json!("10.244.9.0/24,fd00:10:244:9::/64");
    let nodes = json!([
        node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", "fd00:10:244::/64"),
        // Sorted by name the newer Node comes first.
        aged(
            node("aa-new", "10.95.0.13", "fd00:95::13", "10.244.1.0/24", "fd00:10:244:1::/64"),
            "2026-11-02T09:00:00Z"
        ),
        aged(
            node("zz-old", "10.95.0.14", "fd00:95::14", "10.244.1.0/24", "fd00:10:244:1::/64"),
            "2026-11-01T09:00:00Z"
        ),
        annotated,
        with_mac(
            aged(
                node("far-old", "10.97.0.20", "fd00:97::20", "10.244.2.0/24", "fd00:10:244:2::/64"),
                "2026-11-01T08:00:00Z"
            ),
            "02:00:00:00:00:20",
        ),
        with_mac(
            aged(
                node("far-new", "10.97.0.21", "fd00:97::21", "10.244.3.0/24", "fd00:10:244:3::/64"),
                "2026-11-01T11:00:00Z"
            ),
            "02:00:00:00:00:20",
        ),
    ]);
    let (standin, kubeconfig) = standin(&ns, &dir.0, &nodes);
    let conf = dir.0.join("net.d");
    let args = agent_args(&kubeconfig, &conf, "10.95.0.11", &["--metrics-addr", "127.0.0.1:0"]);
    let agent = Agent::start(&ns, &dir.0, args);
    let log = || format!("agent:\n{}\nstand-in:\n{}", agent.proc.log(), standin.log());

    // Once the agent runs, a Node older than every other one claims this node's own VTEP MAC.
    let own_mac = wait_for("the VXLAN device", Duration::from_secs(20), || {
        let (ok, mac) = try_in(&ns, &["cat", "/sys/class/net/cni-rs.1/address"]);
        ok.then(|| mac.trim().to_string())
    });
    let thief = with_mac(
        aged(
            node("far-me", "10.97.0.22", "fd00:97::22", "10.244.4.0/24", "fd00:10:244:4::/64"),
            "2020-01-01T00:00:00Z",
        ),
        &own_mac,
    );
    control(&ns, "/add", &thief.to_string());

    let want = ["10.244.1.0/24 via 10.95.0.14 dev eth0", "10.244.2.0/24 via 10.244.2.0 dev cni-rs.1 onlink"];
    wait_for("the older holders' routes, and only those", Duration::from_secs(20), || {
        let routes = run_in(&ns, &["ip", "-4", "route", "show", "proto", "210"]);
        let mut lines: Vec<&str> = routes.lines().map(str::trim).collect();
        lines.sort();
        (lines == want && agent.proc.log().contains("node far-me")).then_some(())
    });
    let fdb = run_in(&ns, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("02:00:00:00:00:20 dst 10.97.0.20 self permanent"), "{fdb}");
    assert!(!fdb.contains("10.97.0.21") && !fdb.contains("10.97.0.22"), "{fdb}");

    let text = agent.proc.log();
    for line in [
        "warning: node aa-new (Node/aa-new) claims 10.244.1.0/24,fd00:10:244:1::/64, which the older holder node zz-old (Node/zz-old, 10.244.1.0/24,fd00:10:244:1::/64) holds; ignored",
        "warning: node far-new (Node/far-new): VTEP MAC 02:00:00:00:00:20 is used by node far-old (Node/far-old); ignored",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{}", log());
    }
    let mine = format!("warning: node far-me (Node/far-me): VTEP MAC {own_mac} is used by this node n0; ignored");
    assert!(text.contains(&mine), "no {mine:?} in\n{}", log());
    assert!(!text.contains("10.244.9.0"), "{}", log());
    let (status, _) = wait_for("/healthz 200", Duration::from_secs(10), || {
        Some(agent_http(&agent, "/healthz")).filter(|r| r.0 == 200)
    });
    assert_eq!(status, 200);
    let (_, metrics) = agent_http(&agent, "/metrics");
    assert_eq!(metric(&metrics, "cni_rs_node_record_conflicts_total"), Some(1.0), "{metrics}");
    assert_eq!(
        metric(&metrics, r#"cni_rs_node_records_rejected_total{reason="duplicate_vtep_mac"}"#),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "cni_rs_node_reconcile_errors_total"), Some(0.0), "{metrics}");
    drop(agent);
    drop(standin);
}
