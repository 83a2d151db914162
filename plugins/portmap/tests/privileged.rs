//! End-to-end tests of the portmap binary and the firewall backends with real traffic.
//!
//! Each test builds its own world of network namespaces: a "node" (bridge br0 10.66.0.1/24 +
//! fd66::1/64, uplink up0 192.168.66.1/24 + fd67::1/64), two pods on the bridge and a "remote"
//! host behind the uplink with no route to the pod subnet. The plugin runs inside the node
//! namespace, so its rules, sysctls and conntrack entries never touch the real host, and tests
//! can run in parallel. Everything is removed on drop, even when an assertion fails. The bridge
//! ports have hairpin mode on, as the bridge plugin's `hairpinMode` sets them: with br_netfilter
//! loaded, a pod reaching its own host port is DNATed back out of the port it came in on.
//!
//! Needs root, nft, iptables, conntrack, busybox (httpd), socat and curl: without them a test fails
//! (tests/setup.sh installs the tools).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{self, json_of, netns_exec};
use cni_tests::{prerequisite, require_root, require_tools, unique};
use netkit::firewall::{self, BackendKind, Masquerade};
use netkit::NetNs;
use serde_json::{json, Value};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const POD1: &str = "10.66.0.2";
const POD1_V6: &str = "fd66::2";
const NODE_BR: &str = "10.66.0.1";
const NODE_UP: &str = "192.168.66.1";
const NODE_UP_V6: &str = "fd67::1";
const REMOTE: &str = "192.168.66.2";

/// Fails the test unless it runs as root with every tool it drives.
fn require_privileges() {
    require_root();
    require_tools(&["nft", "iptables-save", "busybox", "socat", "conntrack", "curl"]);
}

fn sh(cmd: &str) -> Output {
    Command::new("sh").arg("-c").arg(cmd).output().unwrap()
}

fn must(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A node, two pods and a remote host; torn down on drop.
struct World {
    node: String,
    pod1: String,
    pod2: String,
    remote: String,
    servers: Vec<Child>,
    dir: std::path::PathBuf,
}

impl World {
    fn new() -> World {
        let id = unique("");
        let w = World {
            node: format!("pmn-{id}"),
            pod1: format!("pmp1-{id}"),
            pod2: format!("pmp2-{id}"),
            remote: format!("pmr-{id}"),
            servers: Vec::new(),
            dir: std::env::temp_dir().join(format!("portmap-test-{id}")),
        };
        for ns in [&w.node, &w.pod1, &w.pod2, &w.remote] {
            // No DAD: a tentative link-local address would drop the first IPv6 exchanges.
            must(&format!(
                "ip netns add {ns} && ip -n {ns} link set lo up && ip netns exec {ns} sysctl -qw \
                 net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0"
            ));
        }
        let n = &w.node;
        must(&format!(
            "ip -n {n} link add br0 type bridge && ip -n {n} addr add {NODE_BR}/24 dev br0 && \
             ip -n {n} addr add fd66::1/64 dev br0 nodad && ip -n {n} link set br0 up && \
             ip netns exec {n} sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1"
        ));
        for (pod, idx, port) in [(&w.pod1, 2, "vp1"), (&w.pod2, 3, "vp2")] {
            must(&format!(
                "ip -n {n} link add {port} type veth peer name eth0 netns {pod} && \
                 ip -n {n} link set {port} master br0 up && \
                 ip -n {n} link set {port} type bridge_slave hairpin on && \
                 ip -n {pod} addr add 10.66.0.{idx}/24 dev eth0 && ip -n {pod} addr add fd66::{idx}/64 dev eth0 nodad && \
                 ip -n {pod} link set eth0 up && ip -n {pod} route add default via {NODE_BR} && \
                 ip -n {pod} -6 route add default via fd66::1"
            ));
        }
        let r = &w.remote;
        must(&format!(
            "ip -n {n} link add up0 type veth peer name eth0 netns {r} && \
             ip -n {n} addr add {NODE_UP}/24 dev up0 && ip -n {n} addr add {NODE_UP_V6}/64 dev up0 nodad && \
             ip -n {n} link set up0 up && \
             ip -n {r} addr add {REMOTE}/24 dev eth0 && ip -n {r} addr add fd67::2/64 dev eth0 nodad && ip -n {r} link set eth0 up"
        ));
        std::fs::create_dir_all(&w.dir).unwrap();
        w
    }

    /// An HTTP server answering `name` on port 80 in `ns`.
    fn http_server(&mut self, ns: &str, name: &str) {
        let root = self.dir.join(ns);
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("index.html"), format!("{name}\n")).unwrap();
        let argv = ["busybox", "httpd", "-f", "-p", "80", "-h", root.to_str().unwrap()];
        let ready = || http(ns, "127.0.0.1", 80).as_deref() == Some(name);
        self.start_server(ns, &argv, Duration::from_millis(50), ready, &format!("http server in {ns}"));
    }

    /// Runs `argv` in `ns` (output discarded) until the world is dropped; returns once `ready`,
    /// polled every `poll`, and fails the test when `what` is not ready after 5 s.
    fn start_server(&mut self, ns: &str, argv: &[&str], poll: Duration, ready: impl Fn() -> bool, what: &str) {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.servers.push(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ready() {
            assert!(Instant::now() < deadline, "{what} did not start");
            std::thread::sleep(poll);
        }
    }

    /// A UDP server on `port` in `ns` (IPv4) that answers each datagram with what the socat address
    /// `reply` gives it (`EXEC:cat` echoes it back); returns once it listens.
    fn udp_server(&mut self, ns: &str, port: u16, reply: &str) {
        self.socat_server(ns, &format!("UDP4-RECVFROM:{port},fork"), reply, "u", port);
    }

    /// `socat <listen> <reply>` in `ns`; returns once `ss -l<kind>` (`t`, `u`) lists the port.
    fn socat_server(&mut self, ns: &str, listen: &str, reply: &str, kind: &str, port: u16) {
        let listening = format!("ip netns exec {ns} ss -Hl{kind}n 'sport = :{port}'");
        let ready = || !must(&listening).trim().is_empty();
        self.start_server(
            ns,
            &["socat", listen, reply],
            Duration::from_millis(20),
            ready,
            &format!("{listen} in {ns}"),
        );
    }

    /// A UDP echo server on `port` in `ns` (IPv4).
    fn udp_echo(&mut self, ns: &str, port: u16) {
        self.udp_server(ns, port, "EXEC:cat");
    }

    /// A UDP server on `port` in `ns` (IPv4) that answers each datagram with the address it came
    /// from, as the pod sees it. The shell reads the datagram before it answers: socat writes the
    /// datagram to the shell's stdin, and a shell that has already exited makes that write fail
    /// with EPIPE, and socat then drops the answer (about one datagram in three under load).
    fn udp_peer(&mut self, ns: &str, port: u16) {
        self.udp_server(ns, port, "SYSTEM:read -r line; echo $SOCAT_PEERADDR");
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for c in &mut self.servers {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in [&self.node, &self.pod1, &self.pod2, &self.remote] {
            // Processes still inside would keep it alive; the servers are gone already.
            let _ = sh(&format!("ip netns pids {ns} | xargs -r kill -9; ip netns del {ns}"));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The body served at `ip:port` as seen from `ns`, or None if nothing answered.
fn http(ns: &str, ip: &str, port: u16) -> Option<String> {
    let host = if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() };
    let out = sh(&format!("ip netns exec {ns} curl -sf --connect-timeout 2 -m 3 http://{host}:{port}/"));
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn udp(ns: &str, ip: &str, port: u16, msg: &str) -> Option<String> {
    let out = sh(&format!("echo {msg} | ip netns exec {ns} socat -t 1 -T 2 - UDP4:{ip}:{port}"));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// A plugin call (see [`exec::Call`]) made inside the node namespace `node`.
struct InNode<'a> {
    node: &'a str,
    command: &'a str,
    container: &'a str,
    netns: &'a str,
}

/// Runs a plugin binary inside the node namespace; (exit ok, stdout JSON or Null).
fn plugin(bin: &str, call: &InNode, conf: &Value) -> (bool, Value) {
    let out = exec::Call::new(call.command, call.container, call.netns).run(netns_exec(call.node, bin), conf);
    if !out.status.success() {
        eprintln!(
            "{} {} failed: {} {}",
            bin,
            call.command,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (out.status.success(), json_of(&out.stdout))
}

fn ours() -> &'static str {
    env!("CARGO_BIN_EXE_portmap")
}

fn prev_result(pod: &str, v4: &str, v6: Option<&str>) -> Value {
    let mut ips = vec![json!({"address": format!("{v4}/24"), "gateway": NODE_BR, "interface": 2})];
    if let Some(v6) = v6 {
        ips.push(json!({"address": format!("{v6}/64"), "gateway": "fd66::1", "interface": 2}));
    }
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "br0"}, {"name": "vp"}, {"name": "eth0", "sandbox": format!("/run/netns/{pod}")}],
        "ips": ips,
    })
}

fn netconf(version: &str, network: &str, backend: Option<&str>, prev: &Value, mappings: Option<Value>) -> Value {
    let mut c = json!({
        "cniVersion": version,
        "name": network,
        "type": "portmap",
        "capabilities": {"portMappings": true},
        "prevResult": prev,
    });
    if let Some(b) = backend {
        c["backend"] = json!(b);
    }
    if let Some(m) = mappings {
        c["runtimeConfig"] = json!({"portMappings": m});
    }
    c
}

fn mappings() -> Value {
    json!([
        {"hostPort": 8080, "containerPort": 80, "protocol": "tcp"},
        {"hostPort": 5300, "containerPort": 5300, "protocol": "udp"},
        {"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": NODE_UP}
    ])
}

/// Every ruleset of the node without counters or timestamps, for "nothing of the pod is left"
/// and "nothing changed" assertions.
fn rulesets(node: &str) -> String {
    let all = must(&format!(
        "ip netns exec {node} nft -s list ruleset; ip netns exec {node} iptables-save; ip netns exec {node} ip6tables-save"
    ));
    all.lines().filter(|l| !l.starts_with('#')).collect::<Vec<_>>().join("\n")
}

fn assert_forwarding(w: &World) {
    assert_eq!(http(&w.node, NODE_BR, 8080).as_deref(), Some("pod1"), "node IP from the node");
    assert_eq!(http(&w.node, "127.0.0.1", 8080).as_deref(), Some("pod1"), "localhost from the node");
    assert_eq!(http(&w.pod2, NODE_BR, 8080).as_deref(), Some("pod1"), "from another pod");
    assert_eq!(http(&w.pod1, NODE_BR, 8080).as_deref(), Some("pod1"), "hairpin from the pod itself");
    assert_eq!(http(&w.remote, NODE_UP, 8080).as_deref(), Some("pod1"), "from a remote host");
    assert_eq!(http(&w.remote, NODE_UP_V6, 8080).as_deref(), Some("pod1"), "IPv6 from a remote host");
    assert_eq!(udp(&w.remote, NODE_UP, 5300, "ping").as_deref(), Some("ping"), "UDP echo from a remote host");
    assert_eq!(http(&w.remote, NODE_UP, 8081).as_deref(), Some("pod1"), "hostIP-bound mapping on its address");
    assert_eq!(http(&w.node, NODE_BR, 8081), None, "hostIP-bound mapping on another address");
    assert_eq!(http(&w.pod2, NODE_BR, 8081), None, "hostIP-bound mapping on another address, from a pod");
}

fn assert_gone(w: &World, container: &str) {
    let rules = rulesets(&w.node);
    for needle in [POD1, POD1_V6, container] {
        assert!(!rules.contains(needle), "{needle} still in the rules:\n{rules}");
    }
    assert_eq!(http(&w.node, NODE_BR, 8080), None, "port still answers after DEL");
    assert_eq!(http(&w.remote, NODE_UP, 8080), None, "port still answers after DEL");
}

/// A world whose pod1 serves HTTP ("pod1") on 80 and echoes UDP on 5300, with its [`names`].
fn serving(prefix: &str) -> (World, String, String, String) {
    require_privileges();
    let mut w = World::new();
    w.http_server(&w.pod1.clone(), "pod1");
    w.udp_echo(&w.pod1.clone(), 5300);
    let (network, cid, pod_ns) = names(&w, prefix);
    (w, network, cid, pod_ns)
}

/// A fresh network name (`<prefix>-…`) and container id, and pod1's netns path.
fn names(w: &World, prefix: &str) -> (String, String, String) {
    (format!("{prefix}-{}", unique("")), format!("ctr-{}", unique("")), format!("/run/netns/{}", w.pod1))
}

fn end_to_end(backend: &str) {
    let (w, network, cid, pod_ns) = serving("pmnet");
    let prev = prev_result(&w.pod1, POD1, Some(POD1_V6));
    let call = |command| InNode { node: &w.node, command, container: &cid, netns: &pod_ns };
    let add_conf = netconf("1.1.0", &network, Some(backend), &prev, Some(mappings()));
    let bare_conf = netconf("1.1.0", &network, Some(backend), &prev, None);

    // Nothing forwarded before ADD.
    assert_eq!(http(&w.remote, NODE_UP, 8080), None);

    for round in 0..2 {
        let started = Instant::now();
        let (ok, out) = plugin(ours(), &call("ADD"), &add_conf);
        let add_time = started.elapsed();
        assert!(ok, "ADD: {out}");
        assert_eq!(out["ips"], prev["ips"], "ADD returns prevResult");
        assert_eq!(must(&format!("ip netns exec {} sysctl -n net.ipv4.conf.br0.route_localnet", w.node)).trim(), "1");
        assert!(plugin(ours(), &call("CHECK"), &add_conf).0, "CHECK after ADD");
        assert_forwarding(&w);

        // Round 0: DEL without portMappings (the runtime didn't resend them); round 1: with them.
        let del_conf = if round == 0 { &bare_conf } else { &add_conf };
        let started = Instant::now();
        assert!(plugin(ours(), &call("DEL"), del_conf).0, "DEL");
        eprintln!("{backend}: portmap ADD {add_time:?}, DEL {:?} (whole plugin process)", started.elapsed());
        assert_gone(&w, &cid);
        let (ok, err) = plugin(ours(), &call("CHECK"), &add_conf);
        assert!(!ok && err["code"] == 103, "CHECK after DEL must fail: {err}");
        assert!(plugin(ours(), &call("DEL"), del_conf).0, "DEL twice");
    }

    // DEL after the netns is gone, and parallel DELs.
    assert!(plugin(ours(), &call("ADD"), &add_conf).0);
    let gone = InNode { node: &w.node, command: "DEL", container: &cid, netns: "/run/netns/does-not-exist" };
    let dels: Vec<_> = (0..3)
        .map(|_| {
            let bare = bare_conf.clone();
            let node = w.node.clone();
            let cid = cid.clone();
            std::thread::spawn(move || {
                plugin(ours(), &InNode { node: &node, command: "DEL", container: &cid, netns: "" }, &bare).0
            })
        })
        .collect();
    assert!(plugin(ours(), &gone, &bare_conf).0);
    for d in dels {
        assert!(d.join().unwrap(), "parallel DEL");
    }
    assert_gone(&w, &cid);

    // GC removes containers that are not valid attachments, keeps the others.
    let other = format!("ctr-{}", unique(""));
    assert!(plugin(ours(), &call("ADD"), &add_conf).0);
    let prev2 = prev_result(&w.pod2, "10.66.0.3", None);
    let conf2 =
        netconf("1.1.0", &network, Some(backend), &prev2, Some(json!([{"hostPort": 9090, "containerPort": 80}])));
    let pod2_ns = format!("/run/netns/{}", w.pod2);
    assert!(plugin(ours(), &InNode { node: &w.node, command: "ADD", container: &other, netns: &pod2_ns }, &conf2).0);
    let mut gc = netconf("1.1.0", &network, Some(backend), &prev, None);
    gc.as_object_mut().unwrap().remove("prevResult");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": other, "ifname": "eth0"}]);
    assert!(plugin(ours(), &InNode { node: &w.node, command: "GC", container: "", netns: "" }, &gc).0, "GC");
    assert_gone(&w, &cid);
    assert!(
        plugin(ours(), &InNode { node: &w.node, command: "CHECK", container: &other, netns: &pod2_ns }, &conf2).0,
        "GC kept the valid attachment"
    );
    let mut status = gc.clone();
    status.as_object_mut().unwrap().remove("cni.dev/valid-attachments");
    assert!(plugin(ours(), &InNode { node: &w.node, command: "STATUS", container: "", netns: "" }, &status).0);
}

/// Which connections are masqueraded: the source address the pod sees, from a remote host, from
/// another pod of the subnet (hairpin) and from the node's localhost, with `snat` (the default) and
/// with `masqAll`; the same on both backends, as the reference decides it.
fn sources(backend: &str) {
    require_privileges();
    let mut w = World::new();
    w.udp_peer(&w.pod1.clone(), 5300);
    let (network, cid, pod_ns) = names(&w, "pmsrc");
    let prev = prev_result(&w.pod1, POD1, Some(POD1_V6));
    let call = |command| InNode { node: &w.node, command, container: &cid, netns: &pod_ns };
    let conf = netconf("1.1.0", &network, Some(backend), &prev, Some(mappings()));
    let seen = |from: &str, to: &str| udp(from, to, 5300, "who");

    assert!(plugin(ours(), &call("ADD"), &conf).0, "ADD");
    assert_eq!(seen(&w.remote, NODE_UP).as_deref(), Some(REMOTE), "a remote client keeps its address");
    assert_eq!(seen(&w.pod2, NODE_BR).as_deref(), Some(NODE_BR), "hairpin from the subnet is masqueraded");
    assert_eq!(seen(&w.node, "127.0.0.1").as_deref(), Some(NODE_BR), "localhost is masqueraded");
    assert!(plugin(ours(), &call("DEL"), &conf).0, "DEL");
    assert_eq!(seen(&w.remote, NODE_UP), None, "nothing mapped after DEL");

    let mut all = conf.clone();
    all["masqAll"] = json!(true);
    assert!(plugin(ours(), &call("ADD"), &all).0, "ADD with masqAll");
    assert_eq!(seen(&w.remote, NODE_UP).as_deref(), Some(NODE_BR), "masqAll: a remote client is masqueraded too");
    assert!(plugin(ours(), &call("CHECK"), &all).0, "CHECK with masqAll");
    assert!(plugin(ours(), &call("DEL"), &all).0, "DEL");
}

/// What a pod reaches on the node's loopback: a TCP and a UDP service bound to 127.0.0.1 on the
/// node, which write down every connection or datagram that reaches them. The pod routes
/// 127.0.0.0/8 through its gateway (its own loopback address removed, so the kernel routes it out).
fn loopback_services(w: &mut World, log: &std::path::Path) {
    let node = w.node.clone();
    let note = |what: &str| format!("echo {what} >> {}", log.display());
    let tcp = format!("SYSTEM:{}; echo node-tcp", note("tcp"));
    w.socat_server(&node, "TCP4-LISTEN:7001,bind=127.0.0.1,reuseaddr,fork", &tcp, "t", 7001);
    let udp = format!("SYSTEM:read -r line; {}; echo node-udp", note("udp"));
    w.socat_server(&node, "UDP4-RECVFROM:7002,bind=127.0.0.1,fork", &udp, "u", 7002);
    must(&format!(
        "ip netns exec {} sh -c 'ip addr del 127.0.0.1/8 dev lo && sysctl -qw net.ipv4.conf.eth0.route_localnet=1 && \
         ip route add 127.0.0.0/8 via {NODE_BR} dev eth0'",
        w.pod2
    ));
}

fn tcp_line(ns: &str, ip: &str, port: u16) -> Option<String> {
    let out = sh(&format!("ip netns exec {ns} socat -T 2 - TCP4:{ip}:{port},connect-timeout=2 </dev/null"));
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// portmap turns route_localnet on for the bridge (127.0.0.1:hostPort from the node), and a pod
/// that routes 127.0.0.0/8 through its gateway must still not reach the node's 127.0.0.1-only
/// services, by TCP or UDP (CVE-2020-8558): the node drops such packets unless they were DNATed.
/// 127.0.0.1:hostPort keeps working from the node, the host port from a remote host, and a pod
/// sending to 127.0.0.1:hostPort is DNATed to the port's pod. `bin` is our portmap, or the
/// reference's (`guarded` false): it has the hole.
fn localnet(bin: &str, backend: Option<&str>, guarded: bool) {
    require_privileges();
    let mut w = World::new();
    w.http_server(&w.pod1.clone(), "pod1");
    let log = w.dir.join("loopback-hits");
    loopback_services(&mut w, &log);
    let hits = || std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(tcp_line(&w.node, "127.0.0.1", 7001).as_deref(), Some("node-tcp"), "the node reaches its own service");
    assert_eq!(udp(&w.node, "127.0.0.1", 7002, "x").as_deref(), Some("node-udp"), "the node reaches its own service");
    assert_eq!(hits(), "tcp\nudp\n");
    std::fs::remove_file(&log).unwrap();
    // Without route_localnet the kernel drops them itself.
    assert_eq!(tcp_line(&w.pod2, "127.0.0.1", 7001), None);

    let network = format!("pmlo-{}", unique(""));
    let cid = format!("ctr-{}", unique(""));
    let pod_ns = format!("/run/netns/{}", w.pod1);
    let prev = prev_result(&w.pod1, POD1, Some(POD1_V6));
    let call = |command| InNode { node: &w.node, command, container: &cid, netns: &pod_ns };
    let conf = netconf("1.0.0", &network, backend, &prev, Some(mappings()));
    assert!(plugin(bin, &call("ADD"), &conf).0, "ADD");
    assert_eq!(must(&format!("ip netns exec {} sysctl -n net.ipv4.conf.br0.route_localnet", w.node)).trim(), "1");

    let from_pod = (tcp_line(&w.pod2, "127.0.0.1", 7001), udp(&w.pod2, "127.0.0.1", 7002, "x"));
    if guarded {
        assert_eq!((from_pod, hits()), ((None, None), String::new()), "a pod reached the node's 127.0.0.1 services");
    } else {
        let reached = (Some("node-tcp".to_string()), Some("node-udp".to_string()));
        assert_eq!((from_pod, hits()), (reached, "tcp\nudp\n".to_string()), "the reference's hole");
    }

    assert_eq!(http(&w.node, "127.0.0.1", 8080).as_deref(), Some("pod1"), "127.0.0.1:hostPort from the node");
    assert_eq!(http(&w.remote, NODE_UP, 8080).as_deref(), Some("pod1"), "the host port from a remote host");
    assert_eq!(http(&w.pod2, "127.0.0.1", 8080).as_deref(), Some("pod1"), "127.0.0.1:hostPort from a pod (DNATed)");
    assert_eq!(tcp_line(&w.node, "127.0.0.1", 7001).as_deref(), Some("node-tcp"), "the node still reaches its service");
    if let (true, Some(backend)) = (guarded, backend) {
        // CHECK finds the drop gone, and a repeated ADD puts it back.
        assert!(plugin(bin, &call("CHECK"), &conf).0, "CHECK");
        let remove = match backend {
            "nftables" => "nft delete chain inet cni_rs_portmap input",
            _ => "iptables -D INPUT -j CNI-LOCALNET",
        };
        must(&format!("ip netns exec {} {remove}", w.node));
        let (ok, err) = plugin(bin, &call("CHECK"), &conf);
        assert!(!ok && err["code"] == 103 && err["msg"].as_str().unwrap_or_default().contains("127.0.0.0/8"), "{err}");
        assert!(plugin(bin, &call("ADD"), &conf).0, "ADD again");
        assert!(plugin(bin, &call("CHECK"), &conf).0, "CHECK after ADD again");
        assert_eq!(tcp_line(&w.pod2, "127.0.0.1", 7001), None, "a pod reached the node's 127.0.0.1 TCP service");
    }
    assert!(plugin(bin, &call("DEL"), &conf).0, "DEL");
}

/// Two pods cannot map the same host port (protocol, host address): the second ADD fails with
/// code 100 naming the port and leaves nothing, the first keeps serving (also after the runtime's
/// DEL of the second), and once the first is deleted the port is free for the second.
fn port_conflict(backend: &str) {
    require_privileges();
    let mut w = World::new();
    w.http_server(&w.pod1.clone(), "pod1");
    w.http_server(&w.pod2.clone(), "pod2");
    let network = format!("pmcf-{}", unique(""));
    let (cid1, cid2) = (format!("ctr-{}", unique("")), format!("ctr-{}", unique("")));
    let (ns1, ns2) = (format!("/run/netns/{}", w.pod1), format!("/run/netns/{}", w.pod2));
    let call = |command, container, netns| InNode { node: &w.node, command, container, netns };
    let conf = |pod: &str, addr: &str, mappings: Value| {
        netconf("1.1.0", &network, Some(backend), &prev_result(pod, addr, None), Some(mappings))
    };
    let any = json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]);
    let bound = json!([{"hostPort": 8081, "containerPort": 80, "protocol": "tcp", "hostIP": NODE_UP}]);
    let both = json!([any[0], bound[0]]);
    let first = conf(&w.pod1, POD1, both.clone());
    assert!(plugin(ours(), &call("ADD", &cid1, &ns1), &first).0, "first ADD");
    let before = rulesets(&w.node);

    for (mappings, port) in [(both.clone(), "8080/tcp"), (bound.clone(), "8081/tcp on 192.168.66.1")] {
        let (ok, err) = plugin(ours(), &call("ADD", &cid2, &ns2), &conf(&w.pod2, "10.66.0.3", mappings));
        assert!(!ok && err["code"] == 100, "second ADD of a held port must fail with 100: {err}");
        let msg = err["msg"].as_str().unwrap_or_default();
        assert!(msg.contains(&format!("host port {port}")) && msg.contains("already mapped by"), "{msg}");
        if backend == "iptables" {
            assert!(msg.contains(&cid1), "the holder is named: {msg}");
        }
        assert_eq!(rulesets(&w.node), before, "the refused ADD left something");
    }
    // The runtime's DEL of the refused attachment leaves the holder alone.
    let second = conf(&w.pod2, "10.66.0.3", both);
    assert!(plugin(ours(), &call("DEL", &cid2, &ns2), &second).0, "DEL of the refused attachment");
    assert_eq!(http(&w.remote, NODE_UP, 8080).as_deref(), Some("pod1"), "the first keeps its port");
    assert_eq!(http(&w.remote, NODE_UP, 8081).as_deref(), Some("pod1"), "the first keeps its bound port");
    assert!(plugin(ours(), &call("CHECK", &cid1, &ns1), &first).0, "CHECK of the first");

    assert!(plugin(ours(), &call("DEL", &cid1, &ns1), &first).0, "DEL of the first");
    assert!(plugin(ours(), &call("ADD", &cid2, &ns2), &second).0, "the port is free after the holder's DEL");
    assert_eq!(http(&w.remote, NODE_UP, 8080).as_deref(), Some("pod2"));
    assert_eq!(http(&w.remote, NODE_UP, 8081).as_deref(), Some("pod2"));
    assert!(plugin(ours(), &call("DEL", &cid2, &ns2), &second).0, "DEL of the second");
}

#[test]
fn nftables_port_conflict() {
    port_conflict("nftables");
}

#[test]
fn iptables_port_conflict() {
    port_conflict("iptables");
}

#[test]
fn nftables_localnet() {
    localnet(ours(), Some("nftables"), true);
}

#[test]
fn iptables_localnet() {
    localnet(ours(), Some("iptables"), true);
}

/// The reference portmap (Debian's /usr/lib/cni/portmap) turns route_localnet on without the drop.
#[test]
fn reference_localnet_has_the_hole() {
    let reference = "/usr/lib/cni/portmap";
    let present = std::path::Path::new(reference).exists();
    if !prerequisite(present, &format!("{reference} missing (apt-get install containernetworking-plugins)")) {
        return;
    }
    localnet(reference, None, false);
}

#[test]
fn nftables_sources() {
    sources("nftables");
}

#[test]
fn iptables_sources() {
    sources("iptables");
}

#[test]
fn nftables_end_to_end() {
    end_to_end("nftables");
}

#[test]
fn iptables_end_to_end() {
    end_to_end("iptables");
}

/// containerd's CRI (go-cni) marshals runtimeConfig from Go structs without JSON tags, and a Go
/// runtime may do the same with prevResult: ADD must map the ports and DEL remove them, with the
/// other capabilities it sends (bandwidth, dns) alongside.
fn go_style_keys(backend: &str) {
    let (w, network, cid, pod_ns) = serving("pmgo");
    let call = |command| InNode { node: &w.node, command, container: &cid, netns: &pod_ns };
    let prev = json!({
        "CNIVersion": "1.0.0",
        "Interfaces": [{"Name": "br0"}, {"Name": "vp"}, {"Name": "eth0", "Sandbox": pod_ns}],
        "IPs": [{"Address": format!("{POD1}/24"), "Gateway": NODE_BR, "Interface": 2},
                {"Address": format!("{POD1_V6}/64"), "Gateway": "fd66::1", "Interface": 2}],
    });
    let mut conf = netconf("1.0.0", &network, Some(backend), &prev, None);
    conf["runtimeConfig"] = json!({
        "portMappings": [
            {"HostPort": 8080, "ContainerPort": 80, "Protocol": "tcp", "HostIP": ""},
            {"HostPort": 5300, "ContainerPort": 5300, "Protocol": "udp", "HostIP": ""},
            {"HostPort": 8081, "ContainerPort": 80, "Protocol": "tcp", "HostIP": NODE_UP}],
        "bandwidth": {"IngressRate": 1_000_000, "IngressBurst": 1000, "EgressRate": 1_000_000, "EgressBurst": 1000},
        "dns": {"Servers": ["10.96.0.10"], "Searches": ["default.svc.cluster.local"], "Options": ["ndots:5"]},
        "io.kubernetes.cri.pod-annotations": {"a": "b"},
    });

    let (ok, out) = plugin(ours(), &call("ADD"), &conf);
    assert!(ok, "ADD: {out}");
    assert_eq!(out["ips"][0]["address"], format!("{POD1}/24"), "ADD returns prevResult: {out}");
    assert!(plugin(ours(), &call("CHECK"), &conf).0, "CHECK after ADD");
    assert_forwarding(&w);
    assert!(plugin(ours(), &call("DEL"), &conf).0, "DEL");
    assert_gone(&w, &cid);
    assert!(plugin(ours(), &call("DEL"), &conf).0, "DEL twice");
}

#[test]
fn nftables_go_style_keys() {
    go_style_keys("nftables");
}

#[test]
fn iptables_go_style_keys() {
    go_style_keys("iptables");
}

#[test]
fn no_mappings_does_nothing() {
    require_privileges();
    let w = World::new();
    let prev = prev_result(&w.pod1, POD1, None);
    let conf = netconf("1.0.0", "pmnet-none", Some("nftables"), &prev, None);
    let before = rulesets(&w.node);
    let (ok, out) = plugin(ours(), &InNode { node: &w.node, command: "ADD", container: "c", netns: "/x" }, &conf);
    assert!(ok);
    assert_eq!(out["ips"], prev["ips"]);
    assert_eq!(rulesets(&w.node), before);
    let mut chained = conf.clone();
    chained.as_object_mut().unwrap().remove("prevResult");
    let (ok, err) = plugin(ours(), &InNode { node: &w.node, command: "ADD", container: "c", netns: "/x" }, &chained);
    assert!(!ok && err["code"] == 7, "{err}");
    let bad = netconf("1.0.0", "pmnet-none", None, &prev, Some(json!([{"hostPort": 0, "containerPort": 80}])));
    let (ok, err) = plugin(ours(), &InNode { node: &w.node, command: "ADD", container: "c", netns: "/x" }, &bad);
    assert!(!ok && err["code"] == 7 && err["msg"].as_str().unwrap().contains("portMappings[0]"), "{err}");
}

/// Rules the Debian reference plugin (/usr/lib/cni/portmap, iptables) made are removed by our DEL.
#[test]
fn reference_rules_are_removed_by_our_del() {
    require_privileges();
    let reference = "/usr/lib/cni/portmap";
    let present = std::path::Path::new(reference).exists();
    if !prerequisite(present, &format!("{reference} missing (apt-get install containernetworking-plugins)")) {
        return;
    }
    let mut w = World::new();
    w.http_server(&w.pod1.clone(), "pod1");
    let network = format!("pmref-{}", unique(""));
    let cid = format!("ref-{}", unique(""));
    let pod_ns = format!("/run/netns/{}", w.pod1);
    let prev = prev_result(&w.pod1, POD1, None);
    let conf = netconf(
        "1.0.0",
        &network,
        None,
        &prev,
        Some(json!([{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}])),
    );
    let call = |command| InNode { node: &w.node, command, container: &cid, netns: &pod_ns };
    assert!(plugin(reference, &call("ADD"), &conf).0, "reference ADD");
    assert_eq!(http(&w.remote, NODE_UP, 8080).as_deref(), Some("pod1"));
    assert!(rulesets(&w.node).contains(&cid));
    let mut ours_conf = netconf("1.0.0", &network, Some("iptables"), &prev, None);
    ours_conf.as_object_mut().unwrap().remove("runtimeConfig");
    assert!(plugin(ours(), &call("DEL"), &ours_conf).0, "our DEL");
    assert_gone(&w, &cid);
}

/// Masquerade through the firewall API: a pod reaches a remote host that has no route back.
fn masquerade(kind: BackendKind) {
    require_privileges();
    let mut w = World::new();
    w.http_server(&w.remote.clone(), "remote");
    let node = NetNs::open(format!("/run/netns/{}", w.node)).unwrap();
    let fw = firewall::open(kind);
    let network = format!("mqnet-{}", unique(""));
    let m = Masquerade {
        network: network.clone(),
        container_id: format!("mq-{}", unique("")),
        ifname: "eth0".into(),
        addresses: vec![format!("{POD1}/24").parse().unwrap(), format!("{POD1_V6}/64").parse().unwrap()],
    };
    let other = Masquerade {
        container_id: format!("mq-{}", unique("")),
        addresses: vec!["10.66.0.3/24".parse().unwrap()],
        ..m.clone()
    };
    assert_eq!(http(&w.pod1, REMOTE, 80), None, "no route back without masquerade");
    node.run(|| fw.add_masquerade(&m)).unwrap().unwrap();
    node.run(|| fw.add_masquerade(&other)).unwrap().unwrap();
    node.run(|| fw.check_masquerade(&m)).unwrap().unwrap();
    assert_eq!(http(&w.pod1, REMOTE, 80).as_deref(), Some("remote"));
    assert_eq!(http(&w.pod2, REMOTE, 80).as_deref(), Some("remote"));
    // Inside the subnet nothing is masqueraded: the pods see each other's real address.
    node.run(|| fw.del_masquerade(&network, &m.container_id, "eth0")).unwrap().unwrap();
    node.run(|| fw.del_masquerade(&network, &m.container_id, "eth0")).unwrap().unwrap();
    assert_eq!(http(&w.pod1, REMOTE, 80), None, "masquerade still on after DEL");
    assert_eq!(node.run(|| fw.check_masquerade(&m)).unwrap().unwrap_err().code, 103);
    let rules = rulesets(&w.node);
    assert!(!rules.contains(POD1) && !rules.contains(&m.container_id), "{rules}");
    // GC keeps the valid attachment only.
    node.run(|| fw.add_masquerade(&m)).unwrap().unwrap();
    let keep = [libcni::conf::Attachment { container_id: other.container_id.clone(), ifname: "eth0".into() }];
    node.run(|| fw.gc_masquerade(&network, &keep)).unwrap().unwrap();
    assert_eq!(http(&w.pod1, REMOTE, 80), None);
    assert_eq!(http(&w.pod2, REMOTE, 80).as_deref(), Some("remote"));
    node.run(|| fw.status()).unwrap().unwrap();
}

#[test]
fn nftables_masquerade() {
    masquerade(BackendKind::Nftables);
}

#[test]
fn iptables_masquerade() {
    masquerade(BackendKind::Iptables);
}

/// The node's TCP and UDP conntrack entries as `proto sport>dport` of the original tuple, sorted
/// (the bridge's multicast makes others).
fn conntrack_entries(node: &str, family: &str) -> Vec<String> {
    let out = must(&format!("ip netns exec {node} conntrack -L -f {family} 2>/dev/null"));
    let mut entries: Vec<String> = out
        .lines()
        .filter(|l| l.starts_with("tcp ") || l.starts_with("udp "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let first = |k: &str| f.iter().find(|w| w.starts_with(k)).map_or("", |w| &w[k.len()..]).to_string();
            format!("{} {}>{}", f[0], first("sport="), first("dport="))
        })
        .collect();
    entries.sort();
    entries
}

/// What a traced run started besides itself: (programs executed after its own, fork/vfork/clone
/// calls that made a process rather than a thread). The trace is strace's `-f -o` file.
fn started(trace: &std::path::Path) -> (Vec<String>, usize) {
    let text = std::fs::read_to_string(trace).unwrap();
    let ok = |l: &&str| !l.contains(" = -1 ") && !l.contains("<unfinished");
    let programs: Vec<String> = text.lines().filter(|l| l.contains("execve(")).filter(ok).map(String::from).collect();
    let processes = text
        .lines()
        .filter(|l| ["fork(", "vfork(", "clone(", "clone3("].iter().any(|c| l.contains(c)))
        .filter(|l| !l.contains("CLONE_THREAD"))
        .filter(ok)
        .count();
    (programs.into_iter().skip(1).collect(), processes)
}

/// A datagram from the remote host to the node's host port before the mapping existed leaves a
/// conntrack entry that would keep later datagrams of that flow from being DNATed: ADD deletes
/// the node's UDP entries to the mapped port (IPv4 and IPv6 when the pod has both), DEL those of
/// both families, and nothing else. Neither starts a process on the default backend.
#[test]
fn stale_udp_entries_are_flushed_in_process() {
    require_privileges();
    require_tools(&["strace"]);
    let (w, network, cid, pod_ns) = serving("pmct");
    let n = &w.node;
    // The node tracks packets once a rule there needs conntrack.
    must(&format!(
        "ip netns exec {n} nft 'add table inet ctprobe; \
         add chain inet ctprobe pre {{ type filter hook prerouting priority 0; }}; \
         add rule inet ctprobe pre ct state new counter'"
    ));
    let from_40001 = |msg: &str| {
        let out = sh(&format!(
            "echo {msg} | ip netns exec {} socat -t 1 -T 2 - UDP4:{NODE_UP}:5300,sourceport=40001,reuseaddr",
            w.remote
        ));
        Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|t| !t.is_empty())
    };
    assert_eq!(from_40001("early"), None, "nothing answers before ADD");
    must(&format!(
        "ip netns exec {n} sh -c 'conntrack -I -t 120 -p udp -s {REMOTE} -d {NODE_UP} --sport 40002 --dport 5301 && \
         conntrack -I -t 120 -p tcp -s {REMOTE} -d {NODE_UP} --sport 40003 --dport 5300 --state ESTABLISHED && \
         conntrack -I -t 120 -p udp -s fd67::2 -d {NODE_UP_V6} --sport 40004 --dport 5300' 2>/dev/null"
    ));
    let others = ["tcp 40003>5300", "udp 40002>5301"];
    assert_eq!(conntrack_entries(n, "ipv4"), ["tcp 40003>5300", "udp 40001>5300", "udp 40002>5301"]);

    let prev = prev_result(&w.pod1, POD1, None);
    let conf = netconf(
        "1.0.0",
        &network,
        None,
        &prev,
        Some(json!([{"hostPort": 5300, "containerPort": 5300, "protocol": "udp"}])),
    );
    let traced = |command: &str| {
        let trace = w.dir.join(format!("strace.{command}"));
        let mut c = netns_exec(n, "strace");
        c.args(["-f", "-qq", "-e", "trace=execve,execveat,fork,vfork,clone,clone3", "-e", "signal=none", "-o"])
            .arg(&trace)
            .arg(ours());
        let out = exec::Call::new(command, &cid, &pod_ns).run(c, &conf);
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(started(&trace), (vec![], 0), "portmap {command} started a process");
    };

    traced("ADD");
    // The pod has no IPv6 address: ADD leaves IPv6 alone.
    assert_eq!(conntrack_entries(n, "ipv4"), others, "ADD deletes the stale entry, only it");
    assert_eq!(conntrack_entries(n, "ipv6"), ["udp 40004>5300"]);
    assert_eq!(from_40001("late").as_deref(), Some("late"), "the same flow reaches the pod after ADD");
    assert_eq!(conntrack_entries(n, "ipv4"), ["tcp 40003>5300", "udp 40001>5300", "udp 40002>5301"]);

    traced("DEL");
    assert_eq!(conntrack_entries(n, "ipv4"), others, "DEL deletes the flow's entry, only it");
    assert_eq!(conntrack_entries(n, "ipv6"), Vec::<String>::new(), "DEL deletes both families'");
}

/// route_localnet goes on the interface the node's routing really uses for the pod, policy rules
/// included: with the pod subnet routed through br0 in table 100 (a rule sends it there) and a
/// decoy route for it in the main table, br0 gets it, the decoy's link does not, and
/// 127.0.0.1:hostPort from the node reaches the pod.
#[test]
fn route_localnet_follows_policy_routing() {
    require_privileges();
    let mut w = World::new();
    w.http_server(&w.pod1.clone(), "pod1");
    let n = &w.node;
    must(&format!(
        "ip -n {n} link add dc0 type veth peer name dc1 && ip -n {n} link set dc0 up && ip -n {n} link set dc1 up && \
         ip -n {n} route del 10.66.0.0/24 dev br0 && ip -n {n} route add 10.66.0.0/24 dev dc0 && \
         ip -n {n} route add 10.66.0.0/24 dev br0 src {NODE_BR} table 100 && \
         ip -n {n} rule add to 10.66.0.0/24 lookup 100 pref 100"
    ));
    assert!(must(&format!("ip -n {n} route get {POD1}")).contains("dev br0"), "the rule routes the pod through br0");
    let (network, cid, pod_ns) = names(&w, "pmrule");
    let prev = prev_result(&w.pod1, POD1, None);
    let conf = netconf("1.0.0", &network, None, &prev, Some(json!([{"hostPort": 8080, "containerPort": 80}])));
    let call = |command| InNode { node: n, command, container: &cid, netns: &pod_ns };
    assert!(plugin(ours(), &call("ADD"), &conf).0, "ADD");
    let localnet = |link: &str| must(&format!("ip netns exec {n} sysctl -n net.ipv4.conf.{link}.route_localnet"));
    assert_eq!((localnet("br0").trim(), localnet("dc0").trim()), ("1", "0"), "route_localnet on (br0, dc0)");
    assert_eq!(http(n, "127.0.0.1", 8080).as_deref(), Some("pod1"), "127.0.0.1:hostPort from the node");
    assert!(plugin(ours(), &call("DEL"), &conf).0, "DEL");
}
