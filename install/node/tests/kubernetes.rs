//! The Kubernetes datastore against a stand-in API server (tests/k8s_standin.py: HTTPS, bearer
//! token, Node list and watch, merge patch), since no API server runs on these machines. The Node
//! objects have the shape of real kubeadm nodes. The agent learns its pod CIDRs from its Node,
//! routes to the others' `spec.podCIDRs` via their InternalIP, follows ADDED / MODIFIED / DELETED,
//! lists again after a 410 Gone, and records its VTEP MAC in an annotation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::time::{Duration, Instant};

/// Starts the stand-in in namespace `ns` on 127.0.0.1 serving `nodes`.
fn standin(ns: &str, dir: &Path, nodes: &Value) -> Standin {
    Standin::start(ns, dir, "127.0.0.1", nodes)
}

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
        k8s_node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", "fd00:10:244::/64"),
        k8s_node("n1", "10.95.0.12", "fd00:95::12", "10.244.1.0/24", "fd00:10:244:1::/64"),
    ]);
    let standin = standin(&ns, &dir.0, &nodes);
    let kubeconfig = standin.kubeconfig.clone();

    let conf = dir.0.join("net.d");
    let args = agent_args(&kubeconfig, &conf, "10.95.0.11,fd00:95::11", &[]);
    let agent = Agent::start(&ns, &dir.0, args);
    let routes = |family: &str| run_in(&ns, &["ip", family, "route", "show", "proto", "210"]);
    let log = || format!("agent:\n{}\nstand-in:\n{}", agent.proc.log(), standin.proc.log());

    // The list: this node's CIDRs in the conflist, a host-gw route to n1 per family.
    wait_for("n1's routes", Duration::from_secs(30), || {
        (routes("-4").contains("10.244.1.0/24 via 10.95.0.12")
            && routes("-6").contains("fd00:10:244:1::/64 via fd00:95::12"))
        .then_some(())
    });
    let conflist = std::fs::read_to_string(conf.join("10-cni-rs.conflist")).unwrap();
    assert!(conflist.contains("10.244.0.0/24") && conflist.contains("fd00:10:244::/64"), "{conflist}");

    // ADDED: n2 on another subnet (VXLAN with auto) once its VTEP MAC is annotated.
    let mut n2 = k8s_node("n2", "10.97.0.13", "fd00:97::13", "10.244.2.0/24", "fd00:10:244:2::/64");
    n2["metadata"]["annotations"]["cni-rs.io/vtep-mac"] = json!("02:00:00:00:00:13");
    standin.control("/add", &n2.to_string());
    wait_for("n2's VXLAN route", Duration::from_secs(10), || {
        routes("-4").contains("10.244.2.0/24 via 10.244.2.0 dev cni-rs.1 onlink").then_some(())
    });
    let fdb = run_in(&ns, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("02:00:00:00:00:13 dst 10.97.0.13"), "{fdb}");

    // MODIFIED: n1 moves to another address.
    standin.control(
        "/modify",
        &k8s_node("n1", "10.95.0.22", "fd00:95::22", "10.244.1.0/24", "fd00:10:244:1::/64").to_string(),
    );
    wait_for("n1's new route", Duration::from_secs(10), || {
        routes("-4").contains("10.244.1.0/24 via 10.95.0.22").then_some(())
    });

    // DELETED: n2's routes go.
    standin.control("/delete?name=n2", "");
    wait_for("n2's routes to go", Duration::from_secs(10), || (!routes("-4").contains("10.244.2.0/24")).then_some(()));

    // 410 Gone: n3 appears without a watch event; only the re-list the 410 forces shows it.
    let n3 = k8s_node("n3", "10.95.0.14", "fd00:95::14", "10.244.3.0/24", "fd00:10:244:3::/64");
    standin.control("/gone", &json!([n3]).to_string());
    wait_for("n3's route after the re-list", Duration::from_secs(20), || {
        routes("-4").contains("10.244.3.0/24 via 10.95.0.14").then_some(())
    });

    // This node's VTEP MAC went into its annotation; every request carried the token.
    let seen = standin.requests();
    assert!(seen.lines().any(|l| l == "PATCH n0"), "{seen}\n{}", log());
    assert!(seen.lines().filter(|l| *l == "LIST nodes").count() >= 2, "no re-list after 410: {seen}");
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
    let mut annotated = k8s_node("annotated", "10.95.0.15", "fd00:95::15", "unused", "unused");
    annotated["spec"] = json!({});
    annotated["metadata"]["annotations"]["cni-rs.io/pod-cidrs"] = json!("10.244.9.0/24,fd00:10:244:9::/64");
    let nodes = json!([
        k8s_node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", "fd00:10:244::/64"),
        // Sorted by name the newer Node comes first.
        aged(
            k8s_node("aa-new", "10.95.0.13", "fd00:95::13", "10.244.1.0/24", "fd00:10:244:1::/64"),
            "2026-11-02T09:00:00Z"
        ),
        aged(
            k8s_node("zz-old", "10.95.0.14", "fd00:95::14", "10.244.1.0/24", "fd00:10:244:1::/64"),
            "2026-11-01T09:00:00Z"
        ),
        annotated,
        with_mac(
            aged(
                k8s_node("far-old", "10.97.0.20", "fd00:97::20", "10.244.2.0/24", "fd00:10:244:2::/64"),
                "2026-11-01T08:00:00Z"
            ),
            "02:00:00:00:00:20",
        ),
        with_mac(
            aged(
                k8s_node("far-new", "10.97.0.21", "fd00:97::21", "10.244.3.0/24", "fd00:10:244:3::/64"),
                "2026-11-01T11:00:00Z"
            ),
            "02:00:00:00:00:20",
        ),
    ]);
    let standin = standin(&ns, &dir.0, &nodes);
    let kubeconfig = standin.kubeconfig.clone();
    let conf = dir.0.join("net.d");
    let args = agent_args(&kubeconfig, &conf, "10.95.0.11", &["--metrics-addr", "127.0.0.1:0"]);
    let agent = Agent::start(&ns, &dir.0, args);
    let log = || format!("agent:\n{}\nstand-in:\n{}", agent.proc.log(), standin.proc.log());

    // Once the agent runs, a Node older than every other one claims this node's own VTEP MAC.
    let own_mac = wait_for("the VXLAN device", Duration::from_secs(20), || {
        let (ok, mac) = try_in(&ns, &["cat", "/sys/class/net/cni-rs.1/address"]);
        ok.then(|| mac.trim().to_string())
    });
    let thief = with_mac(
        aged(
            k8s_node("far-me", "10.97.0.22", "fd00:97::22", "10.244.4.0/24", "fd00:10:244:4::/64"),
            "2020-01-01T00:00:00Z",
        ),
        &own_mac,
    );
    standin.control("/add", &thief.to_string());

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

/// Reports every event of a kube-runtime watcher of `K` (the agent's own client) as
/// `KIND EVENT [namespace/]name` with the time it arrived.
async fn report<K>(client: kube::Client, kind: &'static str, tx: Sender<(String, Instant)>)
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    use futures::StreamExt;
    use kube::runtime::watcher::{watcher, Config, Event};
    use kube::runtime::WatchStreamExt;
    use kube::ResourceExt;
    let name = |o: &K| match o.namespace() {
        Some(ns) => format!("{ns}/{}", o.name_any()),
        None => o.name_any(),
    };
    let mut stream = watcher(kube::Api::<K>::all(client), Config::default()).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        let text = match event {
            Ok(Event::Init) => "Init".to_string(),
            Ok(Event::InitApply(o)) => format!("InitApply {}", name(&o)),
            Ok(Event::InitDone) => "InitDone".to_string(),
            Ok(Event::Apply(o)) => format!("Apply {}", name(&o)),
            Ok(Event::Delete(o)) => format!("Delete {}", name(&o)),
            Err(e) => format!("error {e}"),
        };
        if tx.send((format!("{kind} {text}"), Instant::now())).is_err() {
            return;
        }
    }
}

fn pod(ns: &str, name: &str, ip: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": {"pod": name}},
           "spec": {"nodeName": "n0", "containers": [{"name": "c", "image": "i",
                    "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}]}]},
           "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
}

/// The stand-in serves Pods, Namespaces and NetworkPolicies to kube-runtime's watcher (the
/// client the agent uses) as the API server does: the list, then every ADDED / MODIFIED / DELETED
/// as it happens, and a new list after 410 Gone; a raw watch gets BOOKMARK events and ends after
/// timeoutSeconds; namespaced paths list one namespace.
#[test]
fn kubernetes_standin_serves_pods_namespaces_and_policies_to_kube_runtime() {
    require(&["openssl", "python3", "curl"]);
    let t = tag();
    let dir = TempDir::new("k8s-kinds");
    let node_ns = Netns::new(format!("cnn{t}-0"));
    let ns = node_ns.0.clone();
    let objects = json!([
        k8s_node("n0", "10.95.0.11", "fd00:95::11", "10.244.0.0/24", "fd00:10:244::/64"),
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "labels": {"ns": "x"}}},
        pod("x", "a", "10.244.0.2"),
    ]);
    let standin = standin(&ns, &dir.0, &objects);
    let (tx, rx) = channel::<(String, Instant)>();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let kubeconfig = standin.kubeconfig.clone();
    let netns = format!("/var/run/netns/{ns}");
    let watchers = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&netns).unwrap();
        // SAFETY: moves only this thread, which makes the client's sockets, into the namespace.
        assert_eq!(unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) }, 0, "setns {netns}");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let file = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
            let config = kube::Config::from_custom_kubeconfig(file, &Default::default()).await.unwrap();
            let client = kube::Client::try_from(config).unwrap();
            use k8s_openapi::api::{core::v1, networking::v1 as net};
            tokio::select! {
                _ = report::<v1::Pod>(client.clone(), "pods", tx.clone()) => {}
                _ = report::<v1::Namespace>(client.clone(), "namespaces", tx.clone()) => {}
                _ = report::<net::NetworkPolicy>(client, "networkpolicies", tx) => {}
                _ = stopped => {}
            }
        });
    });
    // Events of different kinds interleave: each awaited one is taken from those not yet awaited.
    let mut seen: Vec<String> = Vec::new();
    let mut pending: Vec<(String, Instant)> = Vec::new();
    let mut expect = |what: &str, since: Instant| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(k) = pending.iter().position(|(event, _)| event == what) {
                return pending.remove(k).1.duration_since(since);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((event, at)) => {
                    seen.push(event.clone());
                    pending.push((event, at));
                }
                Err(_) => panic!("no {what:?} from the watchers; seen: {seen:#?}\nstand-in:\n{}", standin.proc.log()),
            }
        }
    };
    let start = Instant::now();
    for kind in ["pods", "namespaces", "networkpolicies"] {
        expect(&format!("{kind} Init"), start);
    }
    for event in ["pods InitApply x/a", "pods InitDone", "namespaces InitApply x", "namespaces InitDone"] {
        expect(event, start);
    }
    expect("networkpolicies InitDone", start);

    let policy = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                        "metadata": {"name": "deny", "namespace": "x"},
                        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}});
    let mut latencies = Vec::new();
    let sent = Instant::now();
    standin.apply(&policy);
    latencies.push(expect("networkpolicies Apply x/deny", sent));
    let mut relabelled = pod("x", "a", "10.244.0.2");
    relabelled["metadata"]["labels"]["role"] = json!("client");
    let sent = Instant::now();
    standin.apply(&relabelled);
    latencies.push(expect("pods Apply x/a", sent));
    let sent = Instant::now();
    standin.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "y"}}));
    latencies.push(expect("namespaces Apply y", sent));
    let sent = Instant::now();
    standin.delete("NetworkPolicy", "x", "deny");
    latencies.push(expect("networkpolicies Delete x/deny", sent));
    eprintln!("watch event latencies (control request included): {latencies:?}");

    // 410 Gone for pods: x/b appears without an event; only the new list shows it.
    standin.control("/gone?kind=Pod", &json!([pod("x", "b", "10.244.0.3")]).to_string());
    for event in ["pods Init", "pods InitApply x/b", "pods InitDone"] {
        expect(event, start);
    }
    let requests = standin.requests();
    assert!(requests.lines().filter(|l| *l == "LIST pods").count() >= 2, "{requests}");
    assert!(requests.lines().filter(|l| *l == "LIST networkpolicies").count() == 1, "{requests}");

    // Raw requests: the namespaced list; a watch with bookmarks that ends after timeoutSeconds; a
    // watch from before the 410 gets 410.
    let ca = standin.pki.ca();
    let get = |path: &str| {
        let url = format!("https://127.0.0.1:6443{path}");
        let auth = format!("Authorization: Bearer {TOKEN}");
        run_in(&ns, &["curl", "-sSN", "--max-time", "6", "--cacert", &ca, "-H", &auth, &url])
    };
    let list: Value = serde_json::from_str(&get("/api/v1/namespaces/x/pods?limit=500")).unwrap();
    let names: Vec<&str> =
        list["items"].as_array().unwrap().iter().map(|p| p["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b"], "{list}");
    assert_eq!(list["kind"], "PodList");
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let began = Instant::now();
    let stream =
        get(&format!("/api/v1/pods?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=2"));
    let took = began.elapsed();
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(5), "watch ended after {took:?}");
    let event: Value = serde_json::from_str(stream.lines().next().unwrap()).unwrap();
    assert_eq!(event["type"], "BOOKMARK", "{stream}");
    assert_eq!(event["object"]["kind"], "Pod", "{stream}");
    let old = get("/api/v1/pods?watch=true&resourceVersion=2");
    let event: Value = serde_json::from_str(old.lines().next().unwrap()).unwrap();
    assert_eq!((event["type"].as_str(), event["object"]["code"].as_i64()), (Some("ERROR"), Some(410)), "{old}");

    stop.send(()).unwrap();
    watchers.join().unwrap();
    drop(standin);
}
