//! Three nodes, each a network namespace running its own agent and its own pods (our bridge and
//! host-local from target/debug, with the conflist the agent wrote):
//!
//! ```text
//!   n0 10.95.0.11 ─┐                          ┌─ n2 10.96.0.13
//!   n1 10.95.0.12 ─┴─ br0 [router+etcd] br1 ──┘
//!                   10.95.0.1      10.96.0.1
//! ```
//! With `--backend auto`, n0 and n1 share a subnet (host-gw between them) and reach n2 over VXLAN.
//! Pods ping and talk TCP across nodes both ways and see each other's pod address (no NAT);
//! traffic leaving the cluster range is masqueraded; an agent restart changes no route and keeps
//! traffic flowing; a stopped node's routes go within the lease TTL and come back with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TTL: u32 = 5;

struct Cluster {
    // Drop order: pods, agents, etcd, node namespaces, the segment, the temp dir.
    pods: Vec<Netns>,
    agents: Vec<Agent>,
    etcd: Etcd,
    nodes: Vec<ClusterNode>,
    seg: Segment,
    dir: TempDir,
    plugins: PathBuf,
}

fn cluster(backend: &str) -> Cluster {
    let t = tag();
    let plugins = plugin_dir();
    let dir = TempDir::new("three-nodes");
    let (seg, nodes) = three_node_network(&t, &dir.0);
    let etcd = Etcd::start(&seg.ns.0, "10.95.0.1");
    let mut c = Cluster { pods: Vec::new(), agents: Vec::new(), etcd, nodes, seg, dir, plugins };
    for i in 0..3 {
        let args = c.agent_args(i, backend);
        let agent = Agent::start(&c.nodes[i].ns.0, &c.nodes[i].dir, args);
        c.agents.push(agent);
    }
    // While the agents start: the pods' first IPv6 packets are forwarded by the nodes.
    let mut namespaces: Vec<&str> = c.nodes.iter().map(|n| n.ns.0.as_str()).collect();
    namespaces.push(&c.seg.ns.0);
    wait_for_dad(&namespaces);
    c
}

impl Cluster {
    fn agent_args(&self, i: usize, backend: &str) -> Vec<String> {
        let etcd = ["--datastore", "etcd", "--etcd-endpoints", &self.etcd.url, "--lease-ttl", &TTL.to_string()];
        self.nodes[i].agent_args(i, &etcd, backend)
    }

    fn conflist(&self, i: usize) -> Option<Value> {
        let text = std::fs::read_to_string(self.nodes[i].dir.join("net.d/10-cni-rs.conflist")).ok()?;
        serde_json::from_str(&text).ok()
    }

    fn pod_cidr(&self, i: usize) -> String {
        self.conflist(i).unwrap()["plugins"][0]["ipam"]["ranges"][0][0]["subnet"].as_str().unwrap().to_string()
    }

    fn pod_cidr6(&self, i: usize) -> String {
        self.conflist(i).unwrap()["plugins"][0]["ipam"]["ranges"][1][0]["subnet"].as_str().unwrap().to_string()
    }

    fn routes(&self, i: usize) -> String {
        run_in(&self.nodes[i].ns.0, &["ip", "-4", "route", "show", "proto", "210"])
    }

    fn routes6(&self, i: usize) -> String {
        run_in(&self.nodes[i].ns.0, &["ip", "-6", "route", "show", "proto", "210"])
    }

    /// A pod on node `i` (namespace `<node ns>-p<k>`) added with cnitool and the agent's conflist;
    /// returns its namespace and its IPv4 and IPv6 addresses.
    fn add_pod(&mut self, i: usize) -> Pod {
        let name = format!("{}-p{}", self.nodes[i].ns.0, self.pods.len());
        let pod = Netns::new(name.clone());
        let result = cni_add(&self.nodes[i], &self.plugins, &name);
        let ip = |k: usize| result["ips"][k]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        let (v4, v6) = (ip(0), ip(1));
        self.pods.push(pod);
        Pod { ns: name, v4, v6 }
    }
}

fn ping(from: &str, to: &str) -> bool {
    try_in(from, &["busybox", "ping", "-c", "1", "-W", "2", to]).0
}

/// A TCP server in `ns` on `port` that answers each connection with the peer address it sees.
struct Pod {
    ns: String,
    v4: String,
    v6: String,
}

fn peer_address_server(ns: &str, addr: &str, port: u16, dir: &Path) -> Proc {
    let listen = if addr.contains(':') {
        format!("TCP6-LISTEN:{port},bind=[{addr}],reuseaddr,fork")
    } else {
        format!("TCP-LISTEN:{port},bind={addr},reuseaddr,fork")
    };
    let args: Vec<String> = ["socat", &listen, "SYSTEM:echo $SOCAT_PEERADDR"].iter().map(|s| s.to_string()).collect();
    let p = Proc::spawn(ns, &args, dir.join(format!("socat-{ns}-{port}.log")));
    wait_for("socat to listen", Duration::from_secs(5), || {
        run_in(ns, &["ss", "-ltnH"]).contains(&format!(":{port} ")).then_some(())
    });
    p
}

/// Connects from `ns` to `addr:port` and returns what the server saw as our address.
fn seen_as(ns: &str, addr: &str, port: u16) -> String {
    let target = if addr.contains(':') { format!("TCP6:[{addr}]:{port}") } else { format!("TCP:{addr}:{port}") };
    let (ok, out) = try_in(ns, &["socat", "-T", "3", "-", &format!("{target},connect-timeout=3")]);
    assert!(ok, "TCP from {ns} to {addr}:{port}: {out}");
    // socat shows an IPv6 peer as [fd00:0010:...]: print it the usual way.
    let seen = out.trim().trim_start_matches('[').trim_end_matches(']');
    seen.parse::<std::net::IpAddr>().map(|ip| ip.to_string()).unwrap_or_else(|_| out.trim().to_string())
}

/// Every pod pings every other and connects to it over TCP, IPv4 and IPv6, and the receiver sees
/// the sender's pod address.
fn assert_full_mesh(c: &mut Cluster, pods: &[Pod]) {
    let dir = c.dir.0.clone();
    let mut servers = Vec::new();
    for (k, pod) in pods.iter().enumerate() {
        servers.push(peer_address_server(&pod.ns, &pod.v4, 7000 + k as u16, &dir));
        servers.push(peer_address_server(&pod.ns, &pod.v6, 7100 + k as u16, &dir));
    }
    for (a, from) in pods.iter().enumerate() {
        for (b, to) in pods.iter().enumerate() {
            if a == b {
                continue;
            }
            for (src, dst, port) in [(&from.v4, &to.v4, 7000 + b as u16), (&from.v6, &to.v6, 7100 + b as u16)] {
                assert!(ping(&from.ns, dst), "pod {src} (n{a}) cannot ping pod {dst} (n{b})");
                let seen = seen_as(&from.ns, dst, port);
                assert_eq!(&seen, src, "pod {dst} saw {src} as {seen}: pod-to-pod traffic must keep its source");
            }
        }
    }
}

#[test]
fn three_nodes_route_pods_across_host_gw_and_vxlan() {
    require(&["etcd", "etcdctl", "socat", "busybox"]);
    let mut c = cluster("auto");
    for i in 0..3 {
        wait_for("every node's conflist and two routes", Duration::from_secs(30), || {
            (c.conflist(i).is_some() && c.routes(i).lines().count() == 2).then_some(())
        });
    }
    let cidrs: Vec<String> = (0..3).map(|i| c.pod_cidr(i)).collect();
    let cidrs6: Vec<String> = (0..3).map(|i| c.pod_cidr6(i)).collect();
    // host-gw between n0 and n1 (same subnet), VXLAN to and from n2.
    let r0 = c.routes(0);
    assert!(r0.contains(&format!("{} via 10.95.0.12 dev eth0", cidrs[1])), "{r0}");
    let vtep2 = cidrs[2].split('/').next().unwrap();
    assert!(r0.contains(&format!("{} via {vtep2} dev cni-rs.1 onlink", cidrs[2])), "{r0}");
    let r2 = c.routes(2);
    assert!(
        r2.contains(&format!("{} via {} dev cni-rs.1 onlink", cidrs[0], cidrs[0].split('/').next().unwrap())),
        "{r2}"
    );
    // IPv6: host-gw to n1, and over the same (IPv4) VXLAN device to n2.
    let r6 = wait_for("IPv6 routes", Duration::from_secs(10), || {
        let r6 = c.routes6(0);
        (r6.lines().count() == 2).then_some(r6)
    });
    assert!(r6.contains(&format!("{} via fd00:95::12 dev eth0", cidrs6[1])), "{r6}");
    let vtep6 = cidrs6[2].split('/').next().unwrap();
    assert!(r6.contains(&format!("{} via {vtep6} dev cni-rs.1", cidrs6[2])) && r6.contains("onlink"), "{r6}");
    let link = run_in(&c.nodes[0].ns.0, &["ip", "-d", "link", "show", "cni-rs.1"]);
    assert!(link.contains("vxlan id 1 ") && link.contains("dstport 8472") && link.contains("mtu 1450"), "{link}");
    let fdb = run_in(&c.nodes[0].ns.0, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("dst 10.96.0.13") && fdb.contains("permanent"), "{fdb}");
    let neigh = run_in(&c.nodes[0].ns.0, &["ip", "neigh", "show", "dev", "cni-rs.1"]);
    assert!(neigh.contains(&format!("{vtep2} lladdr")) && neigh.contains("PERMANENT"), "{neigh}");
    // The conflist: our CIDR, no masquerade in the bridge, the MTU lowered for VXLAN.
    let conf = c.conflist(0).unwrap();
    assert_eq!(conf["plugins"][0]["ipMasq"], false);
    assert_eq!(conf["plugins"][0]["mtu"], 1450);
    let nft = run_in(&c.nodes[0].ns.0, &["nft", "list", "table", "inet", "cni-rs-node"]);
    assert!(nft.contains(&format!("ip saddr {} ip daddr != 10.244.0.0/16 masquerade", cidrs[0])), "{nft}");

    // /healthz and /metrics on the default --metrics-addr (127.0.0.1:9901 in each node).
    let health = run_in(&c.nodes[0].ns.0, &["curl", "-sS", "-w", " %{http_code}", "http://127.0.0.1:9901/healthz"]);
    assert_eq!(health, "ok\n 200", "/healthz");
    let metrics = run_in(&c.nodes[0].ns.0, &["curl", "-sS", "http://127.0.0.1:9901/metrics"]);
    for line in [
        "cni_rs_node_nodes_known 2\n",
        "cni_rs_node_routes_programmed 4\n",
        "cni_rs_node_vxlan_peers 1\n",
        "cni_rs_node_reconcile_errors_total 0\n",
        "# TYPE cni_rs_node_last_sync_timestamp_seconds gauge\n",
    ] {
        assert!(metrics.contains(line), "no {line:?} in\n{metrics}");
    }
    let last_sync: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cni_rs_node_last_sync_timestamp_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(now - last_sync < 60.0, "last sync {last_sync}, now {now}");

    let pods: Vec<Pod> = (0..3).map(|i| c.add_pod(i)).collect();
    for (i, pod) in pods.iter().enumerate() {
        for (ip, cidr) in [(&pod.v4, &cidrs[i]), (&pod.v6, &cidrs6[i])] {
            let cidr: ipnetwork::IpNetwork = cidr.parse().unwrap();
            assert!(cidr.contains(ip.parse().unwrap()), "pod on n{i} got {ip}, outside {cidr}");
        }
    }
    assert_full_mesh(&mut c, &pods);

    // Leaving the cluster range: masqueraded to the node's address (the router is outside).
    let dir = c.dir.0.clone();
    let seg = c.seg.ns.0.clone();
    let _outside = peer_address_server(&seg, "10.95.0.1", 7200, &dir);
    assert_eq!(seen_as(&pods[0].ns, "10.95.0.1", 7200), "10.95.0.11");
    assert_eq!(seen_as(&pods[2].ns, "10.95.0.1", 7200), "10.96.0.13");

    // An agent restart: traffic keeps flowing while it is down, and the new agent changes nothing.
    let before = c.routes(0);
    let start = Instant::now();
    let status = c.agents[0].proc.stop(SIGTERM, Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()) && start.elapsed() < Duration::from_secs(5), "SIGTERM exit");
    assert!(ping(&pods[0].ns, &pods[1].v4) && ping(&pods[0].ns, &pods[2].v4), "traffic stopped with the agent");
    let args = c.agent_args(0, "auto");
    c.agents[0] = Agent::start(&c.nodes[0].ns.0, &c.nodes[0].dir, args);
    wait_for("the restarted agent's first sync", Duration::from_secs(20), || {
        c.agents[0].proc.log().contains("node joined: n2").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let log = c.agents[0].proc.log();
    assert!(!log.contains("added route") && !log.contains("removed route"), "restart changed routes:\n{log}");
    assert_eq!(c.routes(0), before);
    assert!(ping(&pods[0].ns, &pods[2].v4) && ping(&pods[2].ns, &pods[0].v4));

    // Reconcile, not flush: with a stale route of ours and a missing one, a restart removes and
    // adds exactly those, and leaves the VXLAN route and foreign routes alone.
    c.agents[0].proc.stop(SIGTERM, Duration::from_secs(10));
    let ns0 = c.nodes[0].ns.0.clone();
    run_in(&ns0, &["ip", "route", "add", "10.244.99.0/24", "via", "10.95.0.12", "proto", "210"]);
    run_in(&ns0, &["ip", "route", "add", "10.244.98.0/24", "via", "10.95.0.12"]);
    run_in(&ns0, &["ip", "route", "del", &cidrs[1]]);
    let args = c.agent_args(0, "auto");
    c.agents[0] = Agent::start(&ns0, &c.nodes[0].dir, args);
    wait_for("the stale route to go", Duration::from_secs(20), || (c.routes(0) == before).then_some(()));
    let log = c.agents[0].proc.log();
    let changes: Vec<&str> = log.lines().filter(|l| l.contains("added route") || l.contains("removed route")).collect();
    assert_eq!(changes.len(), 2, "{log}");
    assert!(run_in(&ns0, &["ip", "route"]).contains("10.244.98.0/24 via 10.95.0.12"), "a foreign route was touched");

    // n1 stops: its routes leave n0 and n2 within the TTL plus a few seconds.
    let gone = Instant::now();
    c.agents[1].proc.stop(SIGTERM, Duration::from_secs(10));
    for i in [0, 2] {
        wait_for("n1's routes to go", Duration::from_secs(u64::from(TTL) + 5), || {
            (!c.routes(i).contains(&cidrs[1])).then_some(())
        });
    }
    eprintln!("n1's routes were gone {:?} after it stopped (TTL {TTL}s)", gone.elapsed());
    assert!(ping(&pods[0].ns, &pods[2].v4), "n0 <-> n2 must not be disturbed");
    // n1 returns, takes its block back, and its pod is reachable again.
    let args = c.agent_args(1, "auto");
    c.agents[1] = Agent::start(&c.nodes[1].ns.0, &c.nodes[1].dir, args);
    for i in [0, 2] {
        wait_for("n1's routes to return", Duration::from_secs(20), || c.routes(i).contains(&cidrs[1]).then_some(()));
    }
    assert_eq!(c.pod_cidr(1), cidrs[1]);
    assert_full_mesh(&mut c, &pods);
}

#[test]
fn three_nodes_all_over_vxlan() {
    require(&["etcd", "etcdctl", "socat", "busybox"]);
    let mut c = cluster("vxlan");
    for i in 0..3 {
        wait_for("every node's conflist and two routes", Duration::from_secs(30), || {
            (c.conflist(i).is_some() && c.routes(i).lines().count() == 2).then_some(())
        });
    }
    // Even the node on the same subnet is reached through the VXLAN device.
    let r0 = c.routes(0);
    assert_eq!(r0.lines().filter(|l| l.contains("dev cni-rs.1 onlink")).count(), 2, "{r0}");
    let pods: Vec<Pod> = (0..3).map(|i| c.add_pod(i)).collect();
    assert_full_mesh(&mut c, &pods);
}
