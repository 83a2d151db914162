//! The firewall plugin with real traffic under a FORWARD policy of DROP, and side by side with the
//! reference binary (/usr/lib/cni/firewall).
//!
//! Each test makes a "node" network namespace whose iptables FORWARD policy is DROP (IPv4 and
//! IPv6), a "remote" host behind the node's uplink (192.168.77.0/24, routing the pod subnets via
//! the node, no NAT), and pods attached through cnitool run inside the node namespace: bridge +
//! host-local + firewall as a conflist. Nothing touches the host's own tables.
//! Needs root, iptables (nft or legacy, as the node's), busybox and the built binaries
//! (`cargo build --workspace --bins`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{netns_exec, Call};
use cni_tests::{bin_dir, pings, require_root, Netns, TempDir};
use netkit::Family;
use serde_json::{json, Value};
use std::process::{Command, Output};

const NODE_UP: &str = "192.168.77.1";
const REMOTE: &str = "192.168.77.2";
const REFERENCE: &str = "/usr/lib/cni/firewall";
const VERSIONS: [&str; 3] = ["0.4.0", "1.0.0", "1.1.0"];

/// A node with FORWARD policy DROP and a remote host behind it.
struct Node {
    ns: Netns,
    remote: Netns,
    confs: TempDir,
    cache: TempDir,
    ipam: TempDir,
    /// A PATH directory whose iptables tools lead to xtables-legacy-multi: the node is an
    /// iptables-legacy node for the plugins run through [`direct`].
    legacy: Option<TempDir>,
}

impl Node {
    fn new() -> Node {
        require_root();
        let ns = Netns::new("fwn");
        let remote = Netns::new("fwr");
        let (n, r) = (&ns.name, &remote.name);
        must(&format!(
            "ip netns exec {n} sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 && \
             ip netns exec {n} iptables -P FORWARD DROP && ip netns exec {n} ip6tables -P FORWARD DROP && \
             ip -n {n} link add up0 type veth peer name eth0 netns {r} && \
             ip -n {n} addr add {NODE_UP}/24 dev up0 && ip -n {n} link set up0 up && \
             ip -n {r} addr add {REMOTE}/24 dev eth0 && ip -n {r} link set eth0 up && \
             ip -n {r} route add 10.77.0.0/16 via {NODE_UP}"
        ));
        let (confs, cache, ipam) = (TempDir::new("fwconf"), TempDir::new("fwcache"), TempDir::new("fwipam"));
        Node { ns, remote, confs, cache, ipam, legacy: None }
    }

    /// A node whose iptables is iptables-legacy, with its legacy FORWARD policies DROP too.
    fn legacy() -> Node {
        let mut node = Node::new();
        let fake = TempDir::new("fwlegacy");
        for tool in
            ["iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"]
        {
            std::os::unix::fs::symlink("/usr/sbin/xtables-legacy-multi", fake.path().join(tool)).unwrap();
        }
        node.legacy = Some(fake);
        let n = &node.ns.name;
        must(&format!(
            "ip netns exec {n} iptables-legacy -P FORWARD DROP && ip netns exec {n} ip6tables-legacy -P FORWARD DROP"
        ));
        node
    }

    /// The node's `iptables`: iptables-legacy on a legacy node.
    fn iptables(&self, family: Family) -> String {
        format!("{}{}", family.tool(), if self.legacy.is_some() { "-legacy" } else { "" })
    }

    /// Writes a conflist: bridge `br` on `subnet` with host-local, then firewall with `fw` keys
    /// (no firewall when None).
    fn network(&self, version: &str, name: &str, br: &str, subnet: &str, fw: Option<Value>) {
        let mut plugins = vec![json!({
            "type": "bridge", "bridge": br, "isGateway": true,
            "ipam": {
                "type": "host-local", "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.ipam.path().display().to_string()
            }
        })];
        if let Some(mut fw) = fw {
            fw["type"] = json!("firewall");
            plugins.push(fw);
        }
        let list = json!({"cniVersion": version, "name": name, "plugins": plugins});
        std::fs::write(self.confs.path().join(format!("{name}.conflist")), list.to_string()).unwrap();
    }

    fn cnitool(&self, verb: &str, network: &str, pod: &str) -> Output {
        self.cnitool_caps(verb, network, pod, "")
    }

    fn cnitool_caps(&self, verb: &str, network: &str, pod: &str, caps: &str) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.ns.name])
            .arg(bin_dir().join("cnitool"))
            .args([verb, network, pod])
            .env("NETCONFPATH", self.confs.path())
            .env("CNI_PATH", bin_dir())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env("CAP_ARGS", caps)
            .env_remove("CNI_ARGS")
            .env_remove("CNI_IFNAME")
            .output()
            .unwrap()
    }

    /// ADD through cnitool; the pod's IPv4 address.
    fn add(&self, network: &str, pod: &Netns) -> String {
        let out = self.cnitool("add", network, &pod.path);
        assert!(out.status.success(), "cnitool add {network}: {}{}", text(&out.stdout), text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let addr = v["ips"][0]["address"].as_str().unwrap();
        addr.split('/').next().unwrap().to_string()
    }

    fn ok(&self, verb: &str, network: &str, pod: &str) {
        let out = self.cnitool(verb, network, pod);
        assert!(out.status.success(), "cnitool {verb} {network}: {}{}", text(&out.stdout), text(&out.stderr));
    }

    fn filter(&self) -> String {
        let mut s = String::new();
        for family in [Family::V4, Family::V6] {
            s.push_str(&text(&self.ns.exec(&format!("{}-save", self.iptables(family)), &["-t", "filter"]).stdout));
        }
        normalise(&s)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn must(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(out.status.success(), "`{cmd}` failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// iptables-save output without comments and counters.
fn normalise(save: &str) -> String {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| match l.strip_prefix(':') {
            Some(decl) => {
                let mut parts = decl.split_whitespace();
                format!(":{} {}", parts.next().unwrap_or(""), parts.next().unwrap_or(""))
            }
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn pod_reaches_a_remote_host_only_through_the_firewall_plugin_on_every_version() {
    for version in VERSIONS {
        let node = Node::new();
        node.network(version, "nofw", "fwbr0", "10.77.1.0/24", None);
        node.network(version, "withfw", "fwbr1", "10.77.2.0/24", Some(json!({})));
        let pod = Netns::new("fwp");

        // Without the firewall plugin the DROP policy stops the pod's traffic.
        node.add("nofw", &pod);
        assert!(!pings(&pod, REMOTE), "{version}: the pod got through a FORWARD policy of DROP without the plugin");
        node.ok("del", "nofw", &pod.path);

        let ip = node.add("withfw", &pod);
        assert!(pings(&pod, REMOTE), "{version}: the pod cannot reach the remote host with the firewall plugin");
        // Only replies come back in: the remote host cannot open a connection to the pod.
        assert!(!pings(&node.remote, &ip), "{version}: the remote host reached the pod unasked");
        let rules = node.filter();
        assert!(rules.contains(&format!("-A CNI-FORWARD -s {ip}/32 -j ACCEPT")), "{rules}");
        node.ok("check", "withfw", &pod.path);

        node.ok("del", "withfw", &pod.path);
        let rules = node.filter();
        assert!(!rules.contains(&ip), "{version}: DEL left the pod's rules:\n{rules}");
        // The shared chains stay, as the reference leaves them.
        assert!(rules.contains("-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD"));
        node.ok("del", "withfw", &pod.path);
    }
}

#[test]
fn check_finds_a_missing_rule() {
    let node = Node::new();
    node.network("1.0.0", "chk", "fwbr2", "10.77.3.0/24", Some(json!({})));
    let pod = Netns::new("fwp");
    let ip = node.add("chk", &pod);
    node.ok("check", "chk", &pod.path);
    node.ns.exec("iptables", &["-D", "CNI-FORWARD", "-s", &format!("{ip}/32"), "-j", "ACCEPT"]);
    let out = node.cnitool("check", "chk", &pod.path);
    assert!(!out.status.success(), "CHECK passed with the pod's rule removed");
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(said.contains(&format!("-s {ip}/32 -j ACCEPT")) && said.contains("103"), "{said}");
    node.ok("del", "chk", &pod.path);
}

#[test]
fn del_with_the_netns_gone_removes_the_rules() {
    let node = Node::new();
    node.network("1.0.0", "gone", "fwbr3", "10.77.4.0/24", Some(json!({})));
    let mut pod = Netns::new("fwp");
    let path = pod.path.clone();
    let ip = node.add("gone", &pod);
    assert!(node.filter().contains(&format!("-s {ip}/32 -j ACCEPT")), "ADD wrote no rule:\n{}", node.filter());
    pod.delete();
    node.ok("del", "gone", &path);
    node.ok("del", "gone", &path);
    assert!(!node.filter().contains(&ip), "DEL with the netns gone left the rules:\n{}", node.filter());
}

#[test]
fn same_bridge_isolates_the_pods_of_two_bridges() {
    let node = Node::new();
    let fw = json!({"ingressPolicy": "same-bridge"});
    node.network("1.0.0", "isoa", "fwbra", "10.77.5.0/24", Some(fw.clone()));
    node.network("1.0.0", "isob", "fwbrb", "10.77.6.0/24", Some(fw));
    node.network("1.0.0", "opena", "fwbrc", "10.77.7.0/24", Some(json!({})));
    let (a1, a2, b1) = (Netns::new("fwa"), Netns::new("fwa"), Netns::new("fwb"));
    let ip_a2 = node.add("isoa", &a2);
    node.add("isoa", &a1);
    let ip_b1 = node.add("isob", &b1);
    assert!(pings(&a1, &ip_a2), "pods on one bridge cannot reach each other");
    assert!(!pings(&a1, &ip_b1), "a pod reached a pod of another bridge under same-bridge");
    assert!(!pings(&b1, &ip_a2), "a pod reached a pod of another bridge under same-bridge");
    assert!(pings(&a1, REMOTE) && pings(&b1, REMOTE), "same-bridge stopped traffic to the outside");
    let rules = node.filter();
    for line in [
        "-A FORWARD -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-1",
        "-A CNI-ISOLATION-STAGE-1 -i fwbra ! -o fwbra -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j CNI-ISOLATION-STAGE-2",
        "-A CNI-ISOLATION-STAGE-2 -o fwbrb -m comment --comment \"CNI firewall plugin rules (ingressPolicy: same-bridge)\" -j DROP",
    ] {
        assert!(rules.contains(line), "missing {line}:\n{rules}");
    }
    // The stage-1 jump comes before CNI-FORWARD, or CNI-FORWARD's accepts would win.
    let stage1 = rules.find("-j CNI-ISOLATION-STAGE-1").unwrap();
    assert!(
        stage1 < rules.find("-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD").unwrap()
    );
    // As upstream builds it, same-bridge separates the bridges that have it from each other:
    // traffic between such a bridge and a bridge without it is not stage-2's business.
    let c1 = Netns::new("fwc");
    let ip_c1 = node.add("opena", &c1);
    assert!(pings(&a1, &ip_c1), "same-bridge on bridge a stopped traffic into an open bridge");
    assert!(pings(&c1, &ip_a2), "upstream lets an open bridge's pod reach a same-bridge pod");
    for (net, pod) in [("isoa", &a1), ("isoa", &a2), ("isob", &b1), ("opena", &c1)] {
        node.ok("del", net, &pod.path);
    }
}

#[test]
fn isolated_stops_pods_of_one_bridge_too() {
    let node = Node::new();
    node.network("1.0.0", "isol", "fwbrd", "10.77.8.0/24", Some(json!({"ingressPolicy": "isolated"})));
    let (p1, p2) = (Netns::new("fwi"), Netns::new("fwi"));
    let ip2 = node.add("isol", &p2);
    node.add("isol", &p1);
    // br_netfilter passes bridged traffic through FORWARD; without it the kernel never sees it.
    let bridged = node.ns.exec("sysctl", &["-n", "net.bridge.bridge-nf-call-iptables"]);
    if text(&bridged.stdout).trim() == "1" {
        assert!(!pings(&p1, &ip2), "isolated let two pods of one bridge talk");
    }
    assert!(pings(&p1, REMOTE), "isolated stopped traffic to the outside");
    let rules = node.filter();
    assert!(rules.contains("-A CNI-ISOLATION-STAGE-1 -i fwbrd -o fwbrd -m comment --comment \"CNI firewall plugin rules (ingressPolicy: isolated)\" -j DROP"), "{rules}");
    node.ok("del", "isol", &p1.path);
    node.ok("del", "isol", &p2.path);
}

/// Runs a firewall binary inside the node namespace.
fn direct(node: &Node, bin: &str, command: &str, container: &str, conf: &Value) -> Output {
    let mut cmd = netns_exec(&node.ns.name, bin);
    if let Some(fake) = &node.legacy {
        cmd.env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", fake.path().display()));
    }
    Call::new(command, container, &node.remote.path).run(cmd, conf)
}

fn direct_ok(node: &Node, bin: &str, command: &str, container: &str, conf: &Value) {
    let out = direct(node, bin, command, container, conf);
    assert!(out.status.success(), "{bin} {command}: {}{}", text(&out.stdout), text(&out.stderr));
}

fn ref_conf(ips: &[&str], extra: Value) -> Value {
    let ips: Vec<Value> = ips.iter().map(|a| json!({"address": a, "interface": 2})).collect();
    let mut c = json!({
        "cniVersion": "1.0.0", "name": "refnet", "type": "firewall",
        "prevResult": {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "cni0"}, {"name": "veth1"}, {"name": "eth0", "sandbox": "/run/netns/x"}],
            "ips": ips
        }
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn ours() -> String {
    env!("CARGO_BIN_EXE_firewall").to_string()
}

#[test]
fn rules_equal_the_reference_and_each_deletes_the_others() {
    each_deletes_the_others(Node::new);
}

/// On an iptables-legacy node (where ours write the legacy table in process and the reference
/// runs iptables-legacy): the same tables, and each CHECKs and DELs the other's rules.
#[test]
fn legacy_rules_equal_the_reference_and_each_deletes_the_others() {
    each_deletes_the_others(Node::legacy);
}

fn each_deletes_the_others(new: fn() -> Node) {
    assert!(
        std::path::Path::new(REFERENCE).is_file(),
        "the reference plugin is missing: apt-get install containernetworking-plugins"
    );
    for extra in [json!({}), json!({"ingressPolicy": "same-bridge", "iptablesAdminChainName": "MY-ADMIN"})] {
        let conf = ref_conf(&["10.78.0.2/24", "fd78::2/64"], extra.clone());
        // The same input gives the same filter tables.
        let theirs = new();
        direct_ok(&theirs, REFERENCE, "ADD", "c1", &conf);
        let mine = new();
        direct_ok(&mine, &ours(), "ADD", "c1", &conf);
        assert_eq!(mine.filter(), theirs.filter(), "{extra}: our rules differ from the reference's");

        // Theirs added, ours deleted (and the other way round): the pod's rules are gone, and
        // CHECK by the other one passes before that.
        for (node, adder, deleter) in [(&theirs, REFERENCE.to_string(), ours()), (&mine, ours(), REFERENCE.to_string())]
        {
            direct_ok(node, &deleter, "CHECK", "c1", &conf);
            let second = ref_conf(&["10.78.0.3/24"], extra.clone());
            direct_ok(node, &deleter, "ADD", "c2", &second);
            let both = node.filter();
            assert_eq!(both.matches("-j CNI-FORWARD").count(), 2, "{adder} then {deleter} duplicated a jump:\n{both}");
            direct_ok(node, &deleter, "DEL", "c1", &conf);
            direct_ok(node, &adder, "DEL", "c2", &second);
            let left = node.filter();
            for ip in ["10.78.0.2", "fd78::2", "10.78.0.3"] {
                assert!(!left.contains(ip), "{adder} ADD then {deleter} DEL left {ip}:\n{left}");
            }
        }
    }
}

#[test]
fn status_and_gc_answer() {
    let node = Node::new();
    let mut conf = ref_conf(&[], json!({}));
    conf["cniVersion"] = json!("1.1.0");
    conf.as_object_mut().unwrap().remove("prevResult");
    direct_ok(&node, &ours(), "STATUS", "", &conf);
    conf["cni.dev/valid-attachments"] = json!([]);
    direct_ok(&node, &ours(), "GC", "", &conf);
}

/// Why there is no nftables backend: an accept in a table of our own does not pass the node's
/// iptables(-nft) FORWARD policy of DROP, nor a drop in another nftables table, while the same
/// accept in the chain that drops does.
#[test]
fn an_accept_in_another_nftables_table_does_not_pass_a_forward_drop() {
    let node = Node::new();
    node.network("1.0.0", "nofw2", "fwbr9", "10.77.9.0/24", None);
    let pod = Netns::new("fwp");
    let ip = node.add("nofw2", &pod);
    let n = &node.ns.name;
    must(&format!(
        "ip netns exec {n} nft add table inet cni_rs_fwtest && \
         ip netns exec {n} nft add chain inet cni_rs_fwtest pass_pods '{{ type filter hook forward priority -10; policy accept; }}' && \
         ip netns exec {n} nft add rule inet cni_rs_fwtest pass_pods ip saddr {ip} accept && \
         ip netns exec {n} nft add rule inet cni_rs_fwtest pass_pods ct state established,related accept"
    ));
    assert!(!pings(&pod, REMOTE), "an accept in another table passed iptables' FORWARD DROP");
    // The node's drop in nftables of its own: the same, whatever the priorities.
    must(&format!(
        "ip netns exec {n} iptables -P FORWARD ACCEPT && ip netns exec {n} nft add table inet nodefw && \
         ip netns exec {n} nft add chain inet nodefw forward '{{ type filter hook forward priority 0; policy drop; }}'"
    ));
    assert!(!pings(&pod, REMOTE), "an accept in another table passed a drop in the node's nftables table");
    // In the chain that drops, the accept works.
    must(&format!(
        "ip netns exec {n} nft add rule inet nodefw forward ip saddr {ip} accept && \
         ip netns exec {n} nft add rule inet nodefw forward ct state established,related accept"
    ));
    assert!(pings(&pod, REMOTE), "an accept in the dropping chain did not pass");
    node.ok("del", "nofw2", &pod.path);
}

/// The body served at `ip:port` as seen from `ns`, or None if nothing answered.
fn http(ns: &str, ip: &str, port: u16) -> Option<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "curl", "-sf", "--connect-timeout", "2", "-m", "3"])
        .arg(format!("http://{ip}:{port}/"))
        .output()
        .unwrap();
    out.status.success().then(|| text(&out.stdout).trim().to_string())
}

/// conf/podman-firewall.conflist (podman's default CNI shape: bridge + portmap + firewall + tuning) in a
/// node with FORWARD DROP: the pod reaches the outside, its mapped port serves, DEL leaves nothing.
#[test]
fn podman_shape_conflist_passes_the_pods_traffic() {
    let node = Node::new();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/podman-firewall.conflist");
    let mut list: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let types: Vec<&str> = list["plugins"].as_array().unwrap().iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["bridge", "portmap", "firewall", "tuning"]);
    list["plugins"][0]["ipam"]["dataDir"] = json!(node.ipam.path().display().to_string());
    let name = list["name"].as_str().unwrap().to_string();
    std::fs::write(node.confs.path().join("podman.conflist"), list.to_string()).unwrap();

    let pod = Netns::new("fwpm");
    let caps = r#"{"portMappings":[{"hostPort":18080,"containerPort":80,"protocol":"tcp"}]}"#;
    let out = node.cnitool_caps("add", &name, &pod.path, caps);
    assert!(out.status.success(), "podman shape ADD: {}{}", text(&out.stdout), text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let ip = result["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();

    let www = TempDir::new("fwwww");
    std::fs::write(www.path().join("index.html"), "pod\n").unwrap();
    let mut server = Command::new("ip")
        .args(["netns", "exec", &pod.name, "busybox", "httpd", "-f", "-p", "80", "-h"])
        .arg(www.path())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while http(&pod.name, "127.0.0.1", 80).is_none() {
        assert!(std::time::Instant::now() < deadline, "httpd did not start in the pod");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    assert!(pings(&pod, REMOTE), "the pod cannot reach the remote host through FORWARD DROP");
    assert_eq!(http(&node.ns.name, NODE_UP, 18080).as_deref(), Some("pod"), "mapped port from the node");
    assert_eq!(http(&node.ns.name, &ip, 80).as_deref(), Some("pod"), "the pod from the node");
    node.ok("check", &name, &pod.path);
    // A DNATed connection from another host is a new forwarded connection: the reference's rules
    // (and so ours) do not accept it under a DROP policy.
    assert_eq!(http(&node.remote.name, NODE_UP, 18080), None, "a remote host got through FORWARD DROP");

    let _ = server.kill();
    let _ = server.wait();
    node.ok("del", &name, &pod.path);
    let rules = format!("{}\n{}", node.filter(), text(&node.ns.exec("nft", &["list", "ruleset"]).stdout));
    assert!(!rules.contains(&ip), "the podman shape's DEL left rules of {ip}:\n{rules}");
    node.ok("del", &name, &pod.path);
}

/// A failed ADD undoes itself: when the IPv6 rules cannot be written (the node's `ip6 filter`
/// table has a CNI-FORWARD base chain, which nothing can jump to), the IPv4 rules already written
/// are removed again.
#[test]
fn add_that_fails_for_one_family_leaves_no_rule_of_the_other() {
    let node = Node::new();
    let n = &node.ns.name;
    must(&format!(
        "ip netns exec {n} nft add table ip6 filter && ip netns exec {n} nft add chain ip6 filter CNI-FORWARD \
         '{{ type filter hook input priority 0; policy accept; }}'"
    ));
    let conf = ref_conf(&["10.78.0.2/24", "fd78::2/64"], json!({}));
    let out = direct(&node, &ours(), "ADD", "c1", &conf);
    assert!(!out.status.success(), "ADD succeeded with IPv6 rules that cannot be written");
    let err: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(err["code"], 100, "{err}");
    assert!(err["msg"].as_str().unwrap().contains("ip6 filter FORWARD"), "{err}");
    let rules = node.filter();
    assert!(!rules.contains("10.78.0.2"), "the failed ADD left its IPv4 rules:\n{rules}");
}

/// DEL succeeds when the pod's rules, or all of CNI-FORWARD, are already gone, and removes what
/// is left of them; the other pod's rules stay.
#[test]
fn del_with_the_rules_already_gone_succeeds() {
    let node = Node::new();
    let (one, two) = (ref_conf(&["10.78.0.2/24", "fd78::2/64"], json!({})), ref_conf(&["10.78.0.3/24"], json!({})));
    direct_ok(&node, &ours(), "ADD", "c1", &one);
    direct_ok(&node, &ours(), "ADD", "c2", &two);
    node.ns.exec("iptables", &["-D", "CNI-FORWARD", "-s", "10.78.0.2/32", "-j", "ACCEPT"]);
    direct_ok(&node, &ours(), "DEL", "c1", &one);
    let rules = node.filter();
    assert!(!rules.contains("10.78.0.2") && !rules.contains("fd78::2"), "DEL left rules:\n{rules}");
    assert!(rules.contains("-A CNI-FORWARD -s 10.78.0.3/32 -j ACCEPT"), "DEL removed another pod's rule:\n{rules}");
    direct_ok(&node, &ours(), "DEL", "c1", &one);
    must(&format!(
        "ip netns exec {n} iptables -F CNI-FORWARD && ip netns exec {n} ip6tables -F CNI-FORWARD",
        n = node.ns.name
    ));
    direct_ok(&node, &ours(), "DEL", "c2", &two);
}

/// IPv6: ADD writes the /128 rules (ip6tables lists the reference's lines), CHECK finds a missing
/// one, DEL removes them.
#[test]
fn ipv6_rules_add_check_and_del() {
    let node = Node::new();
    let conf = ref_conf(&["fd78::5/64"], json!({}));
    direct_ok(&node, &ours(), "ADD", "c6", &conf);
    let rules = node.filter();
    for line in [
        "-A FORWARD -m comment --comment \"CNI firewall plugin rules\" -j CNI-FORWARD",
        "-A CNI-FORWARD -m comment --comment \"CNI firewall plugin admin overrides\" -j CNI-ADMIN",
        "-A CNI-FORWARD -d fd78::5/128 -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "-A CNI-FORWARD -s fd78::5/128 -j ACCEPT",
    ] {
        assert!(rules.contains(line), "missing {line}:\n{rules}");
    }
    direct_ok(&node, &ours(), "CHECK", "c6", &conf);
    direct_ok(&node, REFERENCE, "CHECK", "c6", &conf);
    node.ns.exec("ip6tables", &["-D", "CNI-FORWARD", "-s", "fd78::5/128", "-j", "ACCEPT"]);
    let out = direct(&node, &ours(), "CHECK", "c6", &conf);
    let said = text(&out.stdout);
    assert!(!out.status.success() && said.contains("-s fd78::5/128 -j ACCEPT"), "{said}");
    direct_ok(&node, &ours(), "DEL", "c6", &conf);
    assert!(!node.filter().contains("fd78::5"), "DEL left rules:\n{}", node.filter());
}

/// On an iptables-legacy node the rules go into the legacy tables and nothing into nf_tables;
/// the rules of other chains, the FORWARD policy and their counters stay as they were across
/// ADD, CHECK, DEL and a DEL with nothing left to delete; an ADD or DEL with nothing to change
/// (and CHECK) writes no table.
#[test]
fn legacy_add_and_del_keep_other_rules_and_their_counters() {
    let node = Node::legacy();
    let n = &node.ns.name;
    let kept = [
        ":FORWARD DROP [5:500]",
        ":OTHER - [0:0]",
        "[3:300] -A FORWARD -j OTHER",
        "[7:700] -A OTHER -s ADDR -p tcp -m tcp --dport 80 -j LOG --log-prefix x",
        "[9:900] -A OTHER -i eth+",
    ];
    for (family, addr) in [(Family::V4, "192.0.2.1/32"), (Family::V6, "2001:db8::1/128")] {
        let lines: Vec<String> = kept.iter().map(|l| l.replace("ADDR", addr)).collect();
        let restore = format!("*filter\n{}\nCOMMIT\n", lines.join("\n"));
        must(&format!("printf '{restore}' | ip netns exec {n} {}-restore --noflush --counters", node.iptables(family)));
    }
    let counted =
        |family| text(&node.ns.exec(&format!("{}-save", node.iptables(family)), &["-t", "filter", "-c"]).stdout);
    let still_kept = |when: &str| {
        for (family, addr) in [(Family::V4, "192.0.2.1/32"), (Family::V6, "2001:db8::1/128")] {
            let save = counted(family);
            for line in kept.iter().map(|l| l.replace("ADDR", addr)) {
                assert!(save.lines().any(|l| l == line), "{when}: {line} changed:\n{save}");
            }
        }
    };
    let conf = ref_conf(&["10.78.0.7/24", "fd78::7/64"], json!({}));
    // Our binary under strace, counting the table replacements (one per family that changes).
    let traces = TempDir::new("fwtrace");
    let traced = traces.path().join("firewall");
    let trace = traces.path().join("trace");
    let script = format!("#!/bin/sh\nexec strace -qq -f -e trace=setsockopt -o '{}' '{}'\n", trace.display(), ours());
    std::fs::write(&traced, script).unwrap();
    std::fs::set_permissions(&traced, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let replaces = |command: &str| {
        direct_ok(&node, &traced.display().to_string(), command, "c7", &conf);
        std::fs::read_to_string(&trace).unwrap().matches("SO_SET_REPLACE").count()
    };
    assert_eq!(replaces("ADD"), 2, "ADD replaces each family's table once");
    let legacy = node.filter();
    for line in ["-A CNI-FORWARD -s 10.78.0.7/32 -j ACCEPT", "-A CNI-FORWARD -s fd78::7/128 -j ACCEPT"] {
        assert!(legacy.contains(line), "no legacy rule {line}:\n{legacy}");
    }
    let nft = text(&node.ns.exec("iptables-nft-save", &["-t", "filter"]).stdout);
    assert!(!nft.contains("10.78.0.7"), "the rules went to nf_tables:\n{nft}");
    still_kept("after ADD");
    assert_eq!(replaces("ADD"), 0, "an ADD with every rule there writes nothing");
    assert_eq!(replaces("CHECK"), 0, "CHECK writes nothing");
    assert_eq!(replaces("DEL"), 2, "DEL replaces each family's table once");
    still_kept("after DEL");
    let legacy = node.filter();
    assert!(!legacy.contains("10.78.0.7") && !legacy.contains("fd78::7"), "DEL left legacy rules:\n{legacy}");
    assert_eq!(replaces("DEL"), 0, "a DEL with nothing left to delete writes nothing");
    still_kept("after a second DEL");
}

/// Sixteen ADDs at once (IPv4 and IPv6), while iptables itself keeps changing the ruleset, then
/// sixteen DELs at once: every pod's rules are there exactly once, the shared jumps once, and
/// nothing of the pods is left after DEL.
#[test]
fn concurrent_adds_and_dels_with_iptables_writing_alongside() {
    concurrent_adds_and_dels(Node::new());
}

/// The same on an iptables-legacy node, with iptables-legacy writing alongside.
#[test]
fn legacy_concurrent_adds_and_dels_with_iptables_writing_alongside() {
    concurrent_adds_and_dels(Node::legacy());
}

fn concurrent_adds_and_dels(node: Node) {
    let n = node.ns.name.clone();
    let iptables = node.iptables(Family::V4);
    must(&format!("ip netns exec {n} {iptables} -N OTHER"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let confs: Vec<Value> =
        (10..26).map(|i| ref_conf(&[&format!("10.78.1.{i}/24"), &format!("fd78:1::{i}/64")], json!({}))).collect();
    let node = &node;
    let each = |command: &str| {
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    must(&format!(
                        "ip netns exec {n} {iptables} -A OTHER -j RETURN && ip netns exec {n} {iptables} -F OTHER"
                    ));
                }
            });
            let pods: Vec<_> = confs
                .iter()
                .enumerate()
                .map(|(i, c)| s.spawn(move || direct_ok(node, &ours(), command, &format!("c{i}"), c)))
                .collect();
            for p in pods {
                p.join().unwrap();
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        stop.store(false, std::sync::atomic::Ordering::Relaxed);
    };
    each("ADD");
    let rules = node.filter();
    for i in 10..26 {
        for line in [
            format!("-A CNI-FORWARD -s 10.78.1.{i}/32 -j ACCEPT"),
            format!("-A CNI-FORWARD -s fd78:1::{i}/128 -j ACCEPT"),
        ] {
            assert_eq!(rules.matches(&format!("{line}\n")).count(), 1, "{line}:\n{rules}");
        }
    }
    assert_eq!(rules.matches("-j CNI-FORWARD").count(), 2, "one jump per family:\n{rules}");
    assert_eq!(rules.matches("-j CNI-ADMIN").count(), 2, "one admin jump per family:\n{rules}");
    each("DEL");
    let rules = node.filter();
    assert!(!rules.contains("10.78.1.") && !rules.contains("fd78:1::"), "DEL left rules:\n{rules}");
}
