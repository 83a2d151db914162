//! NetworkPolicy enforcement by the agent, seen as real traffic: three node namespaces (n0 and n1
//! on one subnet, host-gw between them; n2 on another, VXLAN), each running the agent against the
//! Kubernetes API stand-in (tests/k8s_standin.py, in the router namespace):
//!
//! ```text
//!   n0 10.95.0.11 ─┐                               ┌─ n2 10.96.0.13
//!   n1 10.95.0.12 ─┴─ br0 [router + API] br1 ──────┘
//!   pods x/a y/a z/a on n0, x/b y/b z/b on n1, x/c y/c z/c on n2 (IPv4 and IPv6)
//! ```
//! Namespaces x, y, z with pods a, b, c as in the upstream e2e suite (test/e2e/network/netpol),
//! added with cnitool and the conflist the agent wrote, and registered as Pod objects. Every pod
//! serves TCP and UDP on ports 80 and 81 (IPv4 and IPv6). A probe matrix (every pod to every other
//! pod, both ports, both protocols, both families) is compared with what the evaluator in
//! tests/netpol computes from the same objects, case after case, modelled on the upstream suite.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod netpol;

use common::*;
use netpol::{ContainerPort, Labels, PodModel, Proto, World};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Debian's interpreter (tests/setup.sh installs python3), by path: a version manager's shim
/// earlier in PATH costs ~0.4 s a start, and a matrix starts nine probers.
const PYTHON: &str = "/usr/bin/python3";
const NAMESPACES: [&str; 3] = ["x", "y", "z"];
const PODS: [&str; 3] = ["a", "b", "c"];
const PORTS: [u16; 2] = [80, 81];
/// How long a probe waits for a connection or an answer: a denied probe costs this much.
const PROBE_TIMEOUT: &str = "0.8";
/// How long enforcement may take to match a change (poll until then).
const CONVERGE: Duration = Duration::from_secs(10);

/// Each pod serves TCP and UDP (and SCTP when the kernel has it) on the ports given, IPv4 and
/// IPv6 on one socket each; TCP connections are accepted and closed, UDP datagrams echoed.
const SERVER: &str = r#"
import selectors, socket, sys
ports = [int(p) for p in sys.argv[1].split(",")]
sel = selectors.DefaultSelector()
def bound(kind, proto, port):
    s = socket.socket(socket.AF_INET6, kind, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.bind(("::", port))
    s.setblocking(False)
    return s
for port in ports:
    for proto in ([0, socket.IPPROTO_SCTP] if sys.argv[2] == "1" else [0]):
        t = bound(socket.SOCK_STREAM, proto, port)
        t.listen(128)
        sel.register(t, selectors.EVENT_READ, "accept")
    sel.register(bound(socket.SOCK_DGRAM, 0, port), selectors.EVENT_READ, "echo")
print("listening", flush=True)
while True:
    for key, _ in sel.select():
        try:
            if key.data == "accept":
                key.fileobj.accept()[0].close()
            else:
                data, peer = key.fileobj.recvfrom(512)
                key.fileobj.sendto(data, peer)
        except OSError:
            pass
"#;

/// One prober per source pod: every target at once (a thread each), a TCP or SCTP connect or a
/// UDP datagram answered within the timeout; prints one JSON list of booleans.
const PROBER: &str = r#"
import json, socket, sys, threading
timeout, targets = float(sys.argv[1]), json.loads(sys.argv[2])
results = [False] * len(targets)
def probe(i, ip, port, proto):
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    try:
        if proto == "UDP":
            s = socket.socket(family, socket.SOCK_DGRAM)
            s.settimeout(timeout)
            s.connect((ip, port))
            s.send(b"probe")
            results[i] = s.recv(64) == b"probe"
        else:
            s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_SCTP if proto == "SCTP" else 0)
            s.settimeout(timeout)
            s.connect((ip, port))
            results[i] = True
        s.close()
    except OSError:
        pass
threads = [threading.Thread(target=probe, args=(i, *t)) for i, t in enumerate(targets)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(results))
"#;

/// A TCP connect to one address every 20 ms (each attempt a thread with a 1 s timeout) until a
/// stop file exists (at most a minute); prints `attempts successes`.
const HAMMER: &str = r#"
import os, socket, sys, threading, time
ip, port, stop = sys.argv[1], int(sys.argv[2]), sys.argv[3]
family = socket.AF_INET6 if ":" in ip else socket.AF_INET
count = [0, 0]
def attempt():
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect((ip, port))
        count[1] += 1
    except OSError:
        pass
    s.close()
threads, end = [], time.monotonic() + 60
print("started", flush=True)
while time.monotonic() < end and not os.path.exists(stop):
    count[0] += 1
    t = threading.Thread(target=attempt)
    t.start()
    threads.append(t)
    time.sleep(0.02)
for t in threads:
    t.join()
print(count[0], count[1], flush=True)
"#;

/// A pod of the cluster: where it runs and what the evaluator knows of it.
struct TestPod {
    uid: String,
    node: usize,
    netns: String,
    model: PodModel,
}

struct Cluster {
    // Drop order: servers, pod namespaces, agents, the stand-in, nodes, the segment, the directory.
    servers: Vec<Proc>,
    pod_netns: Vec<Netns>,
    agents: Vec<Agent>,
    standin: Standin,
    nodes: Vec<ClusterNode>,
    seg: Segment,
    dir: TempDir,
    pods: Vec<TestPod>,
    world: World,
    plugins: PathBuf,
    protos: Vec<Proto>,
}

fn pod_cidrs(i: usize) -> (String, String) {
    let six = if i == 0 { "fd00:10:244::/64".to_string() } else { format!("fd00:10:244:{i}::/64") };
    (format!("10.244.{i}.0/24"), six)
}

/// A Namespace with `labels` and the one the API server adds to every namespace.
fn namespace_object(name: &str, labels: &mut Labels) -> Value {
    labels.insert("kubernetes.io/metadata.name".into(), name.into());
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels},
           "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
}

/// The container ports of pod `name`: "http" is 80 on a and c but 81 on b (a named port
/// resolves per pod), "alt" the other one, and the same for UDP ("dns", "dns-alt").
fn container_ports(name: &str) -> Vec<ContainerPort> {
    let (http, alt) = if name == "b" { (81, 80) } else { (80, 81) };
    let port = |name: &str, port, proto| ContainerPort { name: name.into(), port, proto };
    vec![
        port("http", http, Proto::Tcp),
        port("alt", alt, Proto::Tcp),
        port("dns", http, Proto::Udp),
        port("dns-alt", alt, Proto::Udp),
    ]
}

fn pod_object(pod: &TestPod) -> Value {
    let m = &pod.model;
    let ports: Vec<Value> =
        m.ports.iter().map(|p| json!({"name": p.name, "containerPort": p.port, "protocol": p.proto.name()})).collect();
    let ips: Vec<Value> = m.ips.iter().map(|ip| json!({"ip": ip.to_string()})).collect();
    let host_ip = ["10.95.0.11", "10.95.0.12", "10.96.0.13"][pod.node];
    let status = match ips.first() {
        Some(first) => json!({"phase": "Running", "podIP": first["ip"], "podIPs": ips, "hostIP": host_ip}),
        None => json!({"phase": "Pending", "hostIP": host_ip}),
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": m.name, "namespace": m.namespace, "labels": m.labels,
                     "uid": pod.uid},
        "spec": {"nodeName": format!("n{}", pod.node), "hostNetwork": false,
                 "containers": [{"name": "server", "image": "registry.k8s.io/e2e-test-images/agnhost:2.53",
                                 "ports": ports}]},
        "status": status
    })
}

/// Does this kernel let a pod open SCTP sockets? (Many test kernels lack the module.)
fn sctp_works(netns: &str) -> bool {
    let probe = "import socket; socket.socket(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_SCTP)";
    try_in(netns, &[PYTHON, "-c", probe]).0
}

impl Cluster {
    /// The cluster with every agent started with `extra` arguments, namespaces x, y, z and their
    /// nine pods registered and serving; no policies.
    fn new(label: &str, extra: &[&str]) -> Cluster {
        require(&["openssl", "python3", "curl", "nft"]);
        assert!(Path::new(PYTHON).is_file(), "{PYTHON} missing: apt-get install python3");
        let t = tag();
        let plugins = plugin_dir();
        let dir = TempDir::new(label);
        let (seg, nodes) = three_node_network(&t, &dir.0);
        let mut objects: Vec<Value> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (c4, c6) = pod_cidrs(i);
                k8s_node(&format!("n{i}"), n.ip, n.ip6, &c4, &c6)
            })
            .collect();
        let mut world = World::default();
        for ns in NAMESPACES {
            let mut labels: Labels = [("ns".to_string(), ns.to_string())].into();
            match ns {
                "x" => labels.insert("team".into(), "blue".into()),
                "z" => labels.insert("team".into(), "red".into()),
                _ => None,
            };
            objects.push(namespace_object(ns, &mut labels));
            world.namespaces.insert(ns.into(), labels);
        }
        let standin = Standin::start(&seg.ns.0, &dir.0, "10.95.0.1", &Value::Array(objects));
        let mut agents = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let kubernetes = ["--datastore", "kubernetes", "--kubeconfig", standin.kubeconfig.to_str().unwrap()];
            let mut args = n.agent_args(i, &kubernetes, "auto");
            args.extend(extra.iter().map(|s| s.to_string()));
            agents.push(Agent::start(&n.ns.0, &n.dir, args));
        }
        let mut c = Cluster {
            servers: Vec::new(),
            pod_netns: Vec::new(),
            agents,
            standin,
            nodes,
            seg,
            dir,
            pods: Vec::new(),
            world,
            plugins,
            protos: vec![Proto::Tcp, Proto::Udp],
        };
        let mut namespaces: Vec<&str> = c.nodes.iter().map(|n| n.ns.0.as_str()).collect();
        namespaces.push(&c.seg.ns.0);
        wait_for_dad(&namespaces);
        for i in 0..3 {
            let conflist = c.nodes[i].dir.join("net.d/10-cni-rs.conflist");
            let ns = c.nodes[i].ns.0.clone();
            let agent = &mut c.agents[i];
            wait_for("every node's conflist and its two routes", Duration::from_secs(30), || {
                assert!(agent.proc.running(), "the agent of n{i} exited:\n{}", agent.proc.log());
                let routes = run_in(&ns, &["ip", "-4", "route", "show", "proto", "210"]);
                (conflist.is_file() && routes.lines().count() == 2).then_some(())
            });
        }
        if sctp_works(&c.nodes[0].ns.0) {
            c.protos.push(Proto::Sctp);
        }
        for ns in NAMESPACES {
            for (node, name) in PODS.iter().enumerate() {
                c.add_pod(ns, name, node, &[("pod", name)]);
            }
        }
        c
    }

    /// A pod as the kubelet makes one: the Pod object (Pending, no address), the CNI ADD with the
    /// conflist the node's agent wrote, the servers, then the Pod Running with its addresses.
    fn add_pod(&mut self, ns: &str, name: &str, node: usize, labels: &[(&str, &str)]) {
        let netns = format!("{}-{ns}{name}", self.nodes[node].ns.0);
        let labels: Labels = labels.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        let model =
            PodModel { namespace: ns.into(), name: name.into(), labels, ips: vec![], ports: container_ports(name) };
        static PODS_MADE: AtomicUsize = AtomicUsize::new(0);
        let uid = format!("9d1c0000-0000-4000-8000-{:012}", PODS_MADE.fetch_add(1, Ordering::SeqCst));
        let mut pod = TestPod { uid, node, netns: netns.clone(), model };
        self.standin.apply(&pod_object(&pod));
        self.pod_netns.push(Netns::new(netns.clone()));
        let result = cni_add(&self.nodes[node], &self.plugins, &netns);
        let ips: Vec<IpAddr> = result["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ip| ip["address"].as_str().unwrap().split('/').next().unwrap().parse().unwrap())
            .collect();
        assert!(ips.len() == 2 && ips[0].is_ipv4() && ips[1].is_ipv6(), "{result}");
        pod.model.ips = ips;
        let sctp = if self.protos.contains(&Proto::Sctp) { "1" } else { "0" };
        let ports = PORTS.map(|p| p.to_string()).join(",");
        let args: Vec<String> = [PYTHON, "-c", SERVER, &ports, sctp].iter().map(|s| s.to_string()).collect();
        let server = Proc::spawn(&netns, &args, self.dir.0.join(format!("server-{netns}.log")));
        wait_for("the pod's servers", Duration::from_secs(10), || server.log().contains("listening").then_some(()));
        self.servers.push(server);
        self.standin.apply(&pod_object(&pod));
        self.pods.push(pod);
    }

    /// Deletes a pod: the Pod object (DELETED), its servers and its namespace.
    fn delete_pod(&mut self, ns: &str, name: &str) {
        let k = self.pod(ns, name);
        self.standin.delete("Pod", ns, name);
        self.pods.remove(k);
        self.servers.remove(k);
        self.pod_netns.remove(k);
    }

    fn pod(&self, ns: &str, name: &str) -> usize {
        self.pods.iter().position(|p| p.model.namespace == ns && p.model.name == name).unwrap()
    }

    /// Creates or replaces a policy, in the stand-in and in the world the evaluator sees.
    fn apply_policy(&mut self, ns: &str, name: &str, spec: Value) {
        let obj = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                         "metadata": {"name": name, "namespace": ns}, "spec": spec});
        let policy: k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(obj.clone()).unwrap();
        self.world
            .policies
            .retain(|p| !(p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)));
        self.world.policies.push(policy);
        self.standin.apply(&obj);
    }

    fn delete_policy(&mut self, ns: &str, name: &str) {
        let before = self.world.policies.len();
        self.world
            .policies
            .retain(|p| !(p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)));
        assert_eq!(before, self.world.policies.len() + 1, "no policy {ns}/{name} to delete");
        self.standin.delete("NetworkPolicy", ns, name);
    }

    fn delete_all_policies(&mut self) {
        let names: Vec<(String, String)> = self
            .world
            .policies
            .iter()
            .map(|p| (p.metadata.namespace.clone().unwrap(), p.metadata.name.clone().unwrap()))
            .collect();
        for (ns, name) in names {
            self.delete_policy(&ns, &name);
        }
    }

    /// Changes a pod's labels (a MODIFIED Pod event).
    fn relabel_pod(&mut self, ns: &str, name: &str, labels: &[(&str, &str)]) {
        let k = self.pod(ns, name);
        self.pods[k].model.labels = labels.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        self.standin.apply(&pod_object(&self.pods[k]));
    }

    /// Changes a namespace's labels (a MODIFIED Namespace event).
    fn relabel_namespace(&mut self, ns: &str, labels: &[(&str, &str)]) {
        let mut labels: Labels = labels.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        self.standin.apply(&namespace_object(ns, &mut labels));
        self.world.namespaces.insert(ns.into(), labels);
    }

    /// Every probe of the matrix: (source pod, destination pod, destination address, port, protocol).
    fn probes(&self) -> Vec<(usize, usize, IpAddr, u16, Proto)> {
        let mut out = Vec::new();
        for s in 0..self.pods.len() {
            for d in 0..self.pods.len() {
                if s == d {
                    continue;
                }
                for &ip in &self.pods[d].model.ips {
                    for port in PORTS {
                        for &proto in &self.protos {
                            out.push((s, d, ip, port, proto));
                        }
                    }
                }
            }
        }
        out
    }

    fn expected(&self) -> Vec<bool> {
        self.probes()
            .iter()
            .map(|&(s, d, ip, port, proto)| {
                self.world.allowed(&self.pods[s].model, &self.pods[d].model, ip, port, proto)
            })
            .collect()
    }

    /// Runs every probe, one prober process per source pod, all at once.
    fn observe(&self) -> Vec<bool> {
        let probes = self.probes();
        let children: Vec<(usize, std::process::Child)> = (0..self.pods.len())
            .map(|s| {
                let targets: Vec<Value> = probes
                    .iter()
                    .filter(|p| p.0 == s)
                    .map(|&(_, _, ip, port, proto)| json!([ip.to_string(), port, proto.name()]))
                    .collect();
                let child = std::process::Command::new("ip")
                    .args(["netns", "exec", &self.pods[s].netns, PYTHON, "-c", PROBER, PROBE_TIMEOUT])
                    .arg(Value::Array(targets).to_string())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (s, child)
            })
            .collect();
        let mut seen: BTreeMap<usize, Vec<bool>> = BTreeMap::new();
        for (s, child) in children {
            let out = child.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let list: Vec<bool> = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
                panic!("prober in {}: {e}: {text}{}", self.pods[s].netns, String::from_utf8_lossy(&out.stderr))
            });
            seen.insert(s, list);
        }
        seen.into_values().flatten().collect()
    }

    /// Each node to its own pods, every address and port over TCP: the API's rule is that a pod's
    /// node always reaches it, whatever isolates the pod. Returns the probes that failed.
    fn node_to_own_pods(&self) -> Vec<String> {
        let mut failed = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let targets: Vec<(String, u16)> = self
                .pods
                .iter()
                .filter(|p| p.node == i)
                .flat_map(|p| p.model.ips.iter().flat_map(|ip| PORTS.map(|port| (ip.to_string(), port))))
                .collect();
            let list: Vec<Value> = targets.iter().map(|(ip, port)| json!([ip, port, "TCP"])).collect();
            let out = run_in(&node.ns.0, &[PYTHON, "-c", PROBER, PROBE_TIMEOUT, &Value::Array(list).to_string()]);
            let seen: Vec<bool> = serde_json::from_str(out.trim()).unwrap();
            failed.extend(
                targets.iter().zip(seen).filter(|(_, ok)| !ok).map(|((ip, port), _)| format!("n{i} -> {ip}:{port}")),
            );
        }
        failed
    }

    fn describe(&self, probe: &(usize, usize, IpAddr, u16, Proto)) -> String {
        let &(s, d, ip, port, proto) = probe;
        let (src, dst) = (&self.pods[s], &self.pods[d]);
        let at = if ip.is_ipv6() { format!("[{ip}]") } else { ip.to_string() };
        format!(
            "{}/{} (n{}) -> {}/{} (n{}) {at}:{port}/{}",
            src.model.namespace,
            src.model.name,
            src.node,
            dst.model.namespace,
            dst.model.name,
            dst.node,
            proto.name()
        )
    }

    /// Polls the matrix until it is what the evaluator expects; on timeout, fails with the
    /// probes that differ, the policies and the agents' logs.
    fn expect_matrix(&self, case: &str) {
        let start = Instant::now();
        let expected = self.expected();
        let allowed = expected.iter().filter(|a| **a).count();
        let mut rounds = 0;
        loop {
            rounds += 1;
            let seen = self.observe();
            if seen == expected {
                eprintln!(
                    "{case}: matrix as expected ({allowed} of {} allowed) after {:?}, {rounds} round(s)",
                    expected.len(),
                    start.elapsed()
                );
                return;
            }
            if start.elapsed() > CONVERGE {
                let probes = self.probes();
                let diff: Vec<String> = probes
                    .iter()
                    .zip(expected.iter().zip(&seen))
                    .filter(|(_, (e, s))| e != s)
                    .map(|(p, (e, _))| {
                        let (want, got) = if *e { ("allowed", "denied") } else { ("denied", "allowed") };
                        format!("  {}: expected {want}, seen {got}", self.describe(p))
                    })
                    .collect();
                let policies: Vec<String> =
                    self.world.policies.iter().map(|p| serde_json::to_string(p).unwrap()).collect();
                let logs: Vec<String> = self.agents.iter().map(|a| a.proc.log()).collect();
                panic!(
                    "{case}: {} of {} probes differ after {CONVERGE:?}:\n{}\npolicies:\n  {}\nagent logs:\n{}",
                    diff.len(),
                    probes.len(),
                    diff.join("\n"),
                    policies.join("\n  "),
                    logs.join("\n---\n")
                );
            }
        }
    }

    fn metrics(&self, i: usize) -> String {
        run_in(&self.nodes[i].ns.0, &["curl", "-sS", "http://127.0.0.1:9901/metrics"])
    }

    fn policy_table(&self, i: usize) -> (bool, String) {
        try_in(&self.nodes[i].ns.0, &["nft", "list", "table", "inet", "cni-rs-netpol"])
    }
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The agents' policy metrics: the number of policies, a recent successful apply, no errors.
fn expect_policy_metrics(c: &Cluster) {
    let want = c.world.policies.len() as f64;
    for i in 0..3 {
        let metrics = wait_for("the policy count in /metrics", Duration::from_secs(10), || {
            let m = c.metrics(i);
            (metric(&m, "cni_rs_node_network_policies") == Some(want)).then_some(m)
        });
        let last = metric(&metrics, "cni_rs_node_policy_last_sync_seconds").unwrap_or(0.0);
        assert!(now() - last < 60.0, "n{i}: last policy sync {last}, now {}:\n{metrics}", now());
        assert_eq!(metric(&metrics, "cni_rs_node_policy_apply_errors_total"), Some(0.0), "n{i}:\n{metrics}");
        let applies = metric(&metrics, "cni_rs_node_policy_apply_seconds_count").unwrap_or(0.0);
        assert!(applies >= 1.0, "n{i}: no apply in the histogram:\n{metrics}");
        // Every node holds a pod of x, which default deny ingress has had refuse probes.
        let dropped = metric(&metrics, "cni_rs_node_policy_dropped_packets_total{direction=\"ingress\"}");
        assert!(dropped.unwrap_or(0.0) >= 1.0, "n{i}: no ingress drop counted:\n{metrics}");
    }
}

#[test]
fn network_policy_matrix_follows_policies_pods_and_namespaces() {
    let start = Instant::now();
    let mut c = Cluster::new("netpol", &[]);
    eprintln!("cluster up in {:?} (protocols {:?})", start.elapsed(), c.protos);
    c.expect_matrix("no policies: everything reachable");

    // Default deny ingress (upstream: should support a 'default-deny-ingress' policy).
    c.apply_policy("x", "deny-ingress", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    c.expect_matrix("default deny ingress in x");
    for i in 0..3 {
        let (ok, text) = c.policy_table(i);
        assert!(ok, "n{i}: no inet cni-rs-netpol table with enforcement on: {text}");
    }
    let failed = c.node_to_own_pods();
    assert!(failed.is_empty(), "a node must reach its own isolated pods: {failed:?}");
    // Stacked: pods labelled pod=b of x may reach x/a (should enforce policy to allow traffic
    // from pods within server namespace based on PodSelector).
    c.apply_policy(
        "x",
        "a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    c.expect_matrix("x/a also from x's pod=b");
    // A new pod labelled pod=b in x, on another node (its ADDED, then MODIFIED with addresses,
    // events), then deleted.
    c.add_pod("x", "d", 2, &[("pod", "b")]);
    c.expect_matrix("new pod x/d labelled pod=b");
    c.delete_pod("x", "d");
    c.expect_matrix("pod x/d deleted");
    // Policy update: the same policy now takes namespace y instead (by namespaceSelector).
    c.apply_policy(
        "x",
        "a-from-b",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}),
    );
    c.expect_matrix("x/a from namespace y (policy updated)");
    expect_policy_metrics(&c);
    // Policy delete: back to everything.
    c.delete_all_policies();
    c.expect_matrix("policies deleted");

    // podSelector AND namespaceSelector in one peer, then the same as two peers (OR), there by
    // the label the API server gives every namespace.
    c.apply_policy(
        "x",
        "and",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}},
                                      "podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    c.expect_matrix("x/a from y/b only (AND)");
    c.delete_policy("x", "and");
    c.apply_policy(
        "x",
        "or",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}},
                                     {"podSelector": {"matchLabels": {"pod": "b"}}}]}]}),
    );
    c.expect_matrix("x/a from namespace y or x/b (OR)");
    c.delete_all_policies();

    // matchExpressions, every operator, in pod and namespace selectors.
    c.apply_policy(
        "x",
        "in-notin",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a"]}]},
               "ingress": [{"from": [{
                   "namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["y"]}]},
                   "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "b"]}]}}]}]}),
    );
    c.apply_policy(
        "y",
        "no-team",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "Exists"}]},
               "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                   {"key": "team", "operator": "DoesNotExist"}]}}]}]}),
    );
    c.apply_policy(
        "z",
        "team-c",
        json!({"podSelector": {"matchExpressions": [{"key": "pod", "operator": "NotIn", "values": ["c"]}]},
               "ingress": [{"from": [{
                   "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Exists"}]},
                   "podSelector": {"matchLabels": {"pod": "c"}}}]}]}),
    );
    c.expect_matrix("matchExpressions In, NotIn, Exists, DoesNotExist");
    // Namespace relabel: y gains a team, so y's own pods no longer pass no-team, and y/c now
    // reaches z/a and z/b.
    c.relabel_namespace("y", &[("ns", "y"), ("team", "green")]);
    c.expect_matrix("namespace y relabelled");
    c.relabel_namespace("y", &[("ns", "y")]);
    c.delete_all_policies();

    // Ports: by number, by protocol alone, SCTP only (not TCP), a range.
    c.apply_policy(
        "x",
        "tcp-81",
        json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP", "port": 81}]}]}),
    );
    c.apply_policy("y", "udp-any", json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "UDP"}]}]}));
    c.apply_policy(
        "z",
        "sctp-80",
        json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]}),
    );
    c.expect_matrix("TCP 81 into x, any UDP into y, SCTP 80 only into z");
    c.delete_all_policies();
    c.apply_policy(
        "x",
        "range",
        json!({"podSelector": {}, "ingress": [{"ports": [{"protocol": "TCP", "port": 70, "endPort": 80}]}]}),
    );
    c.apply_policy(
        "y",
        "range-out",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"protocol": "UDP", "port": 81, "endPort": 90}]}]}),
    );
    c.expect_matrix("port ranges (endPort) in and out");
    c.delete_all_policies();

    // Named ports: "http" is 80 on a and c but 81 on b, resolved per destination pod, in
    // ingress and in egress.
    c.apply_policy("y", "http-in", json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]}));
    c.apply_policy(
        "z",
        "dns-out",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"protocol": "UDP", "port": "dns"}]}]}),
    );
    c.expect_matrix("named ports in and out");
    c.delete_all_policies();

    // Default deny egress, then updated to let DNS-like UDP 80 out (upstream allows port 53).
    c.apply_policy("y", "egress", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    c.expect_matrix("default deny egress in y");
    c.apply_policy(
        "y",
        "egress",
        json!({"podSelector": {}, "policyTypes": ["Egress"],
               "egress": [{"ports": [{"protocol": "UDP", "port": 80}]}]}),
    );
    c.expect_matrix("y's egress updated to allow UDP 80");
    c.delete_all_policies();

    // ipBlock: into x/a from the cluster range except node n1's pod CIDRs, plus y/b's own
    // addresses as /32 and /128 (in an except of the other block: the union allows them); out of
    // z only to x/c's IPv4 address (its IPv6 address is in no block).
    let yb = c.pod("y", "b");
    let xc = c.pod("x", "c");
    let (n1_v4, n1_v6) = pod_cidrs(1);
    let yb_ips = c.pods[yb].model.ips.clone();
    c.apply_policy(
        "x",
        "blocks",
        json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"], "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.244.0.0/16", "except": [n1_v4]}},
            {"ipBlock": {"cidr": "fd00:10:244::/56", "except": [n1_v6]}},
            {"ipBlock": {"cidr": format!("{}/32", yb_ips[0])}},
            {"ipBlock": {"cidr": format!("{}/128", yb_ips[1])}}]}]}),
    );
    c.apply_policy(
        "z",
        "to-xc",
        json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [
            {"ipBlock": {"cidr": format!("{}/32", c.pods[xc].model.ips[0])}}]}]}),
    );
    c.expect_matrix("ipBlock with except, /32 and /128");
    c.delete_all_policies();

    // Pod relabel: x/a admits only pods labelled role=client; y/c gains the label, then loses it.
    c.apply_policy(
        "x",
        "clients",
        json!({"podSelector": {"matchLabels": {"pod": "a"}},
               "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "client"}}}]}]}),
    );
    c.expect_matrix("x/a from role=client pods (none yet)");
    c.relabel_pod("y", "c", &[("pod", "c"), ("role", "client")]);
    c.expect_matrix("y/c relabelled role=client");
    c.relabel_pod("y", "c", &[("pod", "c")]);
    c.expect_matrix("y/c's role label removed");
    c.delete_all_policies();
    // A relabelled pod becomes selected, then unselected (upstream: should deny ingress access
    // to updated pod).
    c.apply_policy(
        "y",
        "isolate",
        json!({"podSelector": {"matchLabels": {"isolated": "yes"}}, "policyTypes": ["Ingress"]}),
    );
    c.expect_matrix("no pod labelled isolated=yes");
    c.relabel_pod("y", "a", &[("pod", "a"), ("isolated", "yes")]);
    c.expect_matrix("y/a relabelled isolated=yes");
    c.relabel_pod("y", "a", &[("pod", "a")]);
    c.expect_matrix("y/a's isolated label removed");
    c.delete_all_policies();

    // Ingress and egress together, and an allow-all ingress beside a deny-all (upstream: multiple
    // ingress policies with ingress allow-all policy taking precedence).
    c.apply_policy("z", "deny-all", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
    c.expect_matrix("default deny all in z");
    c.apply_policy("z", "allow-in", json!({"podSelector": {}, "ingress": [{}]}));
    c.expect_matrix("allow-all ingress beside deny-all in z");
    c.delete_all_policies();
    c.expect_matrix("every policy deleted");
    eprintln!("whole walk took {:?}", start.elapsed());
}

/// A denied pair probed every 20 ms while the agents of both its nodes restart: no connection
/// may succeed (the table stays while the agent is down, and the new agent reconciles it).
#[test]
fn network_policy_agent_restart_opens_no_window() {
    let mut c = Cluster::new("netpol-restart", &[]);
    // y/b is denied ingress (enforced on n1); z/a is denied egress (enforced on n0).
    c.apply_policy("y", "deny-in", json!({"podSelector": {}, "policyTypes": ["Ingress"]}));
    c.apply_policy("z", "deny-out", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
    c.expect_matrix("deny ingress in y, deny egress in z");
    let (xa, yb, za, xb) = (c.pod("x", "a"), c.pod("y", "b"), c.pod("z", "a"), c.pod("x", "b"));
    let hammer = |c: &Cluster, from: usize, to: usize, family: usize, name: &str| {
        let ip = c.pods[to].model.ips[family].to_string();
        let stop = c.dir.0.join("stop-hammers");
        let args: Vec<String> =
            [PYTHON, "-c", HAMMER, &ip, "80", stop.to_str().unwrap()].iter().map(|s| s.to_string()).collect();
        Proc::spawn(&c.pods[from].netns, &args, c.dir.0.join(format!("hammer-{name}.log")))
    };
    let mut hammers = vec![
        ("x/a -> y/b (ingress denied on n1) IPv4", hammer(&c, xa, yb, 0, "in4")),
        ("x/a -> y/b (ingress denied on n1) IPv6", hammer(&c, xa, yb, 1, "in6")),
        ("z/a -> x/b (egress denied on n0) IPv4", hammer(&c, za, xb, 0, "out4")),
        ("z/a -> x/b (egress denied on n0) IPv6", hammer(&c, za, xb, 1, "out6")),
        ("x/a -> x/b (allowed) IPv4", hammer(&c, xa, xb, 0, "allowed")),
    ];
    for (_, h) in &hammers {
        wait_for("the prober to start", Duration::from_secs(5), || h.log().contains("started").then_some(()));
    }
    let begun = Instant::now();
    for i in [1, 0] {
        let restarted = now().floor();
        c.agents[i].restart();
        wait_for("the restarted agent's policy sync", Duration::from_secs(10), || {
            let (ok, m) = try_in(&c.nodes[i].ns.0, &["curl", "-sS", "http://127.0.0.1:9901/metrics"]);
            (ok && metric(&m, "cni_rs_node_policy_last_sync_seconds").unwrap_or(0.0) >= restarted).then_some(())
        });
    }
    // Keep probing a while after both agents are back.
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(c.dir.0.join("stop-hammers"), "").unwrap();
    let window = begun.elapsed() + Duration::from_millis(200);
    for (name, h) in &mut hammers {
        wait_for("the prober to finish", Duration::from_secs(15), || (!h.running()).then_some(()));
        let log = h.log();
        let counts: Vec<u32> = log.lines().last().unwrap_or("").split(' ').filter_map(|n| n.parse().ok()).collect();
        assert_eq!(counts.len(), 2, "{name}: {log}");
        assert!(counts[0] as f64 >= window.as_secs_f64() * 25.0, "{name}: only {} attempts in {window:?}", counts[0]);
        if name.contains("allowed") {
            assert_eq!(counts[1], counts[0], "{name}: an allowed pair failed during the restart");
        } else {
            assert_eq!(counts[1], 0, "{name}: {} of {} connections passed during the restart", counts[1], counts[0]);
        }
    }
    c.expect_matrix("after both restarts");
}

/// `--network-policy=false`: no policy table on any node, and a deny-all policy in every
/// namespace changes nothing.
#[test]
fn network_policy_disabled_filters_nothing() {
    let mut c = Cluster::new("netpol-off", &["--network-policy=false"]);
    c.expect_matrix("no policies");
    let everything = c.expected();
    for ns in NAMESPACES {
        c.apply_policy(ns, "deny-all", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
    }
    // The agents saw the policies' events (they are on the watch streams already open) or never
    // asked for them; either way a second later the matrix is still everything.
    std::thread::sleep(Duration::from_secs(1));
    let seen = c.observe();
    let denied: Vec<String> = c.probes().iter().zip(&seen).filter(|(_, s)| !**s).map(|(p, _)| c.describe(p)).collect();
    assert!(denied.is_empty(), "denied with --network-policy=false:\n{}", denied.join("\n"));
    assert!(everything.iter().all(|a| *a));
    // The probes see a drop: a table of the test's own on n1 drops forwarded TCP to x/b's IPv4
    // port 80 (bridged traffic from n1's own pods only when br_netfilter hands it to the IP hooks).
    let xb = c.pod("x", "b");
    let n1 = c.nodes[1].ns.0.clone();
    let target = c.pods[xb].model.ips[0];
    let rules = format!(
        "add table inet probe-check; add chain inet probe-check forward {{ type filter hook forward priority 0; }}; add rule inet probe-check forward ip daddr {target} tcp dport 80 drop"
    );
    run_in(&n1, &["nft", &rules]);
    let bridged = run_in(&n1, &["sysctl", "-n", "net.bridge.bridge-nf-call-iptables"]).trim() == "1";
    let seen = c.observe();
    run_in(&n1, &["nft", "delete", "table", "inet", "probe-check"]);
    for (p, s) in c.probes().iter().zip(&seen) {
        let dropped =
            p.1 == xb && p.2 == target && p.3 == 80 && p.4 == Proto::Tcp && (bridged || c.pods[p.0].node != 1);
        assert_eq!(*s, !dropped, "{} with a drop rule for {target}:80/TCP on n1", c.describe(p));
    }
    for i in 0..3 {
        let (ok, text) = c.policy_table(i);
        assert!(!ok, "n{i}: inet cni-rs-netpol exists with --network-policy=false:\n{text}");
        let tables = run_in(&c.nodes[i].ns.0, &["nft", "list", "tables"]);
        assert!(!tables.contains("cni-rs-netpol"), "n{i}: {tables}");
    }
}
