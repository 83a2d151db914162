//! sbr in real namespaces: a pod on two networks (veth pairs to two "network" namespaces, each with
//! a client address behind its gateway), where replies must leave by the interface the request came
//! in on. Without sbr the second network's client gets no answer (strict rp_filter and the default
//! route through the first network); with sbr it does. The layout (`ip rule`, the tables) equals the
//! Debian reference sbr's for the same input. Privileged; subnets 10.248.x, fd48::/16.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::Call;
use cni_tests::{bin_dir, require_root, sh, veth_off_shared_backlog, Netns};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const REFERENCE: &str = "/usr/lib/cni/sbr";
const VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A pod with eth0 on network 1 (10.248.1.5/24, default route via 10.248.1.1) and eth1 on
/// network 2 (10.248.2.5/24, fd48:2::5/64 when dual stack). Network n has its gateway 10.248.n.1
/// and a client 10.248.1n.2 on its loopback, which is not on the pod's subnets.
struct World {
    pod: Netns,
    nets: Vec<Netns>,
}

impl World {
    fn new(dual_stack: bool) -> World {
        require_root();
        let pod = Netns::new("cnbp");
        let nets = vec![Netns::new("cnbn"), Netns::new("cnbn")];
        for (i, net) in nets.iter().enumerate() {
            let n = i + 1;
            let ifname = format!("eth{i}");
            sh(
                "ip",
                &["-n", &pod.name, "link", "add", &ifname, "type", "veth", "peer", "name", "gw", "netns", &net.name],
            );
            // The probes are single echoes: no other test's traffic may drop them.
            veth_off_shared_backlog(&pod, &ifname);
            veth_off_shared_backlog(net, "gw");
            sh("ip", &["-n", &pod.name, "addr", "add", &format!("10.248.{n}.5/24"), "dev", &ifname]);
            sh("ip", &["-n", &pod.name, "link", "set", &ifname, "up"]);
            sh("ip", &["-n", &net.name, "addr", "add", &format!("10.248.{n}.1/24"), "dev", "gw"]);
            sh("ip", &["-n", &net.name, "addr", "add", &format!("10.248.1{n}.2/32"), "dev", "lo"]);
            sh("ip", &["-n", &net.name, "link", "set", "gw", "up"]);
            // The gateway asks for the pod's address from its own (10.248.n.1), not from the
            // client's: the pod's strict rp_filter drops an ARP request from 10.248.12.2 on eth1
            // before sbr, which left network 2's neighbour entry unresolved and the probe with sbr
            // depending on whether an ARP retry happened to come after the rule was in place.
            net.sh("sysctl", &["-q", "-w", "net.ipv4.conf.gw.arp_announce=2"]);
            if dual_stack {
                sh("ip", &["-n", &pod.name, "addr", "add", &format!("fd48:{n}::5/64"), "dev", &ifname, "nodad"]);
                sh("ip", &["-n", &net.name, "addr", "add", &format!("fd48:{n}::1/64"), "dev", "gw", "nodad"]);
                sh("ip", &["-n", &net.name, "addr", "add", &format!("fd48:1{n}::2/128"), "dev", "lo"]);
            }
        }
        sh("ip", &["-n", &pod.name, "route", "add", "default", "via", "10.248.1.1", "dev", "eth0"]);
        if dual_stack {
            sh("ip", &["-n", &pod.name, "-6", "route", "add", "default", "via", "fd48:1::1", "dev", "eth0"]);
        }
        for key in ["net.ipv4.conf.all.rp_filter=1", "net.ipv4.conf.eth0.rp_filter=1", "net.ipv4.conf.eth1.rp_filter=1"]
        {
            sh("ip", &["netns", "exec", &pod.name, "sysctl", "-q", "-w", key]);
        }
        World { pod, nets }
    }

    /// Whether network n's client gets an answer from `addr`.
    fn client_reaches(&self, n: usize, addr: &str) -> bool {
        let src = if addr.contains(':') { format!("fd48:1{n}::2") } else { format!("10.248.1{n}.2") };
        // The first IPv6 echo waits for neighbour discovery on both sides (about 2 s here).
        let wait = if addr.contains(':') { "5" } else { "2" };
        let out = self.nets[n - 1].exec("busybox", &["ping", "-c", "1", "-W", wait, "-I", &src, addr]);
        out.status.success()
    }

    fn pod_sh(&self, args: &[&str]) -> String {
        self.pod.sh("ip", args)
    }

    /// The routes of a table; empty when the kernel has no such table (yet, or any more).
    fn table(&self, family: &str, table: &str) -> String {
        let out = self.pod.exec("ip", &[family, "route", "show", "table", table]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ip rule` of both families, and every table but local, with the link-local route of lo
    /// and cache lines left out.
    fn layout(&self) -> String {
        let mut out = String::new();
        for fam in ["-4", "-6"] {
            out += &self.pod_sh(&[fam, "rule"]);
            for line in self.pod_sh(&[fam, "route", "show", "table", "all"]).lines() {
                if !line.contains("table local") && !line.starts_with("local ") && !line.contains("dev lo ") {
                    out += line;
                    out.push('\n');
                }
            }
        }
        out
    }
}

/// prevResult for the pod's eth1 in `version`'s shape.
fn prev_result(version: &str, pod: &Netns, dual_stack: bool) -> Value {
    if version < "0.3.0" {
        let mut r = json!({"cniVersion": version, "ip4": {"ip": "10.248.2.5/24", "gateway": "10.248.2.1"}});
        if dual_stack {
            r["ip6"] = json!({"ip": "fd48:2::5/64", "gateway": "fd48:2::1"});
        }
        return r;
    }
    let with_version = version < "1.0.0";
    let ip = |addr: &str, gw: &str, v: &str| {
        let mut o = json!({"address": addr, "gateway": gw, "interface": 1});
        if with_version {
            o["version"] = json!(v);
        }
        o
    };
    let mut ips = vec![ip("10.248.2.5/24", "10.248.2.1", "4")];
    if dual_stack {
        ips.push(ip("fd48:2::5/64", "fd48:2::1", "6"));
    }
    json!({"cniVersion": version,
        "interfaces": [{"name": "host-side"}, {"name": "eth1", "sandbox": pod.path}],
        "ips": ips})
}

fn conf(version: &str, prev: Value, extra: Value) -> Value {
    let mut c = json!({"cniVersion": version, "name": "sbrnet", "type": "sbr", "prevResult": prev});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            c[k] = v;
        }
    }
    c
}

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn exec(bin: &Path, command: &str, netns: &str, ifname: &str, conf: &Value) -> Ran {
    let mut cmd = Command::new(bin);
    cmd.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    let out = Call::new(command, "ctr-sbr", netns).ifname(ifname).path(bin_dir()).run(cmd, conf);
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn ours() -> PathBuf {
    bin_dir().join("sbr")
}

fn ok(ran: &Ran, what: &str) -> Value {
    assert_eq!(ran.code, Some(0), "{what}: {} {}", ran.stdout, ran.stderr);
    if ran.stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&ran.stdout).unwrap()
    }
}

/// The second network's client gets no reply without sbr and one with it; the first network's
/// client is answered either way; the layout is the reference's; DEL removes it (twice).
#[test]
fn replies_leave_by_the_interface_the_request_came_in_on() {
    let w = World::new(false);
    assert!(w.client_reaches(1, "10.248.1.5"), "network 1 reaches the pod before sbr");
    assert!(!w.client_reaches(2, "10.248.2.5"), "network 2 must fail before sbr (asymmetric route, rp_filter)");

    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({}));
    let result = ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    assert_eq!(result["ips"][0]["address"], "10.248.2.5/24", "prevResult passes through: {result}");

    assert!(w.client_reaches(2, "10.248.2.5"), "network 2 reaches the pod with sbr");
    assert!(w.client_reaches(1, "10.248.1.5"), "network 1 still reaches the pod with sbr");

    let rules = w.pod_sh(&["-4", "rule"]);
    assert!(rules.contains("32765:\tfrom 10.248.2.5 lookup 100"), "{rules}");
    let t100 = w.table("-4", "100");
    assert!(t100.contains("default via 10.248.2.1 dev eth1"), "{t100}");
    assert!(t100.contains("10.248.2.0/24 dev eth1 proto kernel scope link src 10.248.2.5"), "{t100}");
    let main = w.pod_sh(&["-4", "route", "show", "table", "main"]);
    assert!(!main.contains("eth1"), "eth1's routes left main: {main}");
    assert!(main.contains("default via 10.248.1.1 dev eth0"), "{main}");

    let check = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({}));
    ok(&exec(&ours(), "CHECK", &w.pod.path, "eth1", &check), "CHECK");

    for round in ["DEL", "second DEL"] {
        ok(&exec(&ours(), "DEL", &w.pod.path, "eth1", &c), round);
        let rules = w.pod_sh(&["-4", "rule"]);
        assert!(!rules.contains("10.248.2.5"), "{round}: {rules}");
        assert_eq!(w.table("-4", "100"), "", "{round}");
    }
    // CHECK now finds the rule gone.
    let ran = exec(&ours(), "CHECK", &w.pod.path, "eth1", &check);
    assert!(ran.stdout.contains("\"code\": 103") && ran.stdout.contains("no rule from 10.248.2.5"), "{}", ran.stdout);
}

/// Our ADD leaves exactly the reference sbr's layout: `ip rule` and every table, dual stack (IPv4
/// table 100, IPv6 table 101, the link-local route copied as the reference copies it).
#[test]
fn layout_equals_the_reference_sbr() {
    for dual in [false, true] {
        let (a, b) = (World::new(dual), World::new(dual));
        let before = a.layout();
        assert_eq!(before, b.layout(), "the two worlds differ before sbr");
        let ca = conf("1.0.0", prev_result("1.0.0", &a.pod, dual), json!({}));
        let cb = conf("1.0.0", prev_result("1.0.0", &b.pod, dual), json!({}));
        ok(&exec(&ours(), "ADD", &a.pod.path, "eth1", &ca), "our ADD");
        ok(&exec(Path::new(REFERENCE), "ADD", &b.pod.path, "eth1", &cb), "reference ADD");
        let (ours_layout, theirs) = (a.layout(), b.layout());
        assert_eq!(ours_layout, theirs, "dual stack {dual}: ours (left) differs from the reference (right)");
        assert_ne!(ours_layout, before);
        if dual {
            assert!(a.pod_sh(&["-6", "rule"]).contains("from fd48:2::5 lookup 101"), "{ours_layout}");
            let t101 = a.table("-6", "101");
            assert!(t101.contains("default via fd48:2::1 dev eth1"), "{t101}");
            assert!(a.client_reaches(2, "fd48:2::5"), "IPv6 from network 2 with sbr");
            assert!(b.client_reaches(2, "fd48:2::5"), "IPv6 from network 2 with the reference sbr");
        }
        assert!(a.client_reaches(2, "10.248.2.5") && b.client_reaches(2, "10.248.2.5"));
        // Our DEL cleans what the reference's ADD made: its rules, and eth1's routes in its tables.
        ok(&exec(&ours(), "DEL", &b.pod.path, "eth1", &cb), "our DEL after the reference's ADD");
        let rules = b.pod_sh(&["rule"]) + &b.pod_sh(&["-6", "rule"]);
        assert!(!rules.contains("lookup 10"), "{rules}");
        assert_eq!(b.table("-4", "100"), "");
        assert_eq!(b.table("-6", "101"), "");
    }
}

/// A second attachment picks the next free tables; a table with routes but no rule is skipped too.
#[test]
fn the_next_attachment_picks_the_next_free_table() {
    let w = World::new(false);
    // Something else's routes in table 100 (no rule): not ours to share.
    sh("ip", &["-n", &w.pod.name, "route", "add", "10.248.99.0/24", "dev", "eth0", "table", "100"]);
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({}));
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    let rules = w.pod_sh(&["-4", "rule"]);
    assert!(rules.contains("from 10.248.2.5 lookup 101"), "{rules}");
    // eth0 next: its addresses go to table 102.
    let prev0 = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "sandbox": w.pod.path}],
        "ips": [{"address": "10.248.1.5/24", "gateway": "10.248.1.1", "interface": 0}]});
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth0", &conf("1.0.0", prev0, json!({}))), "ADD eth0");
    let rules = w.pod_sh(&["-4", "rule"]);
    assert!(rules.contains("32764:\tfrom 10.248.1.5 lookup 102"), "{rules}");
    assert!(w.table("-4", "102").contains("default via 10.248.1.1 dev eth0"));
    assert!(w.client_reaches(1, "10.248.1.5") && w.client_reaches(2, "10.248.2.5"));
    // The foreign route in table 100 is untouched by our DEL.
    ok(&exec(&ours(), "DEL", &w.pod.path, "eth1", &c), "DEL");
    assert!(w.table("-4", "100").contains("10.248.99.0/24"));
}

/// `table` given: only the rules, to that table, and the routes stay in main (as the reference);
/// DEL removes the rules only from that table.
#[test]
fn a_configured_table_gets_only_rules() {
    let w = World::new(false);
    sh("ip", &["-n", &w.pod.name, "rule", "add", "from", "10.248.2.5", "lookup", "300"]);
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({"table": 5000}));
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    let rules = w.pod_sh(&["-4", "rule"]);
    assert!(rules.contains("from 10.248.2.5 lookup 5000"), "{rules}");
    assert_eq!(w.table("-4", "5000"), "");
    assert!(w.pod_sh(&["route", "show", "table", "main"]).contains("10.248.2.0/24 dev eth1"));
    ok(&exec(&ours(), "CHECK", &w.pod.path, "eth1", &c), "CHECK");
    ok(&exec(&ours(), "DEL", &w.pod.path, "eth1", &c), "DEL");
    let rules = w.pod_sh(&["-4", "rule"]);
    assert!(!rules.contains("lookup 5000") && rules.contains("from 10.248.2.5 lookup 300"), "{rules}");
}

/// `gateways` replaces prevResult's gateway in the table's default route.
#[test]
fn configured_gateways_win() {
    let w = World::new(false);
    sh("ip", &["-n", &w.nets[1].name, "addr", "add", "10.248.2.254/24", "dev", "gw"]);
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({"gateways": ["10.248.2.254"]}));
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    let t = w.table("-4", "100");
    assert!(t.contains("default via 10.248.2.254 dev eth1"), "{t}");
    assert!(w.client_reaches(2, "10.248.2.5"));
    ok(&exec(&ours(), "CHECK", &w.pod.path, "eth1", &c), "CHECK");
}

/// `addSourceHints`: eth1's subnet stays in main with its address as source, its other routes
/// leave main, and the table is built as usual.
#[test]
fn source_hints_keep_the_subnet_route_in_main() {
    let w = World::new(false);
    sh("ip", &["-n", &w.pod.name, "route", "add", "10.248.77.0/24", "via", "10.248.2.1", "dev", "eth1"]);
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({"addSourceHints": true}));
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    let main = w.pod_sh(&["-4", "route", "show", "table", "main"]);
    assert!(main.contains("10.248.2.0/24 dev eth1") && main.contains("src 10.248.2.5"), "{main}");
    assert!(!main.contains("10.248.77.0/24"), "{main}");
    let t = w.table("-4", "100");
    assert!(t.contains("10.248.77.0/24 via 10.248.2.1 dev eth1"), "{t}");
    assert!(w.client_reaches(2, "10.248.2.5"));
}

/// Every spec version: ADD (prevResult in that version's shape), CHECK from 0.4.0, DEL twice,
/// GC and STATUS on 1.1.0.
#[test]
fn every_version() {
    for version in VERSIONS {
        let w = World::new(false);
        let c = conf(version, prev_result(version, &w.pod, false), json!({}));
        let result = ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), version);
        assert_eq!(result["cniVersion"], version);
        assert!(w.pod_sh(&["rule"]).contains("from 10.248.2.5 lookup 100"), "{version}");
        assert!(w.client_reaches(2, "10.248.2.5"), "{version}");
        if version >= "0.4.0" {
            ok(&exec(&ours(), "CHECK", &w.pod.path, "eth1", &c), version);
        }
        if version >= "1.1.0" {
            ok(&exec(&ours(), "STATUS", "", "eth1", &c), version);
            ok(&exec(&ours(), "GC", "", "eth1", &c), version);
        }
        for _ in 0..2 {
            ok(&exec(&ours(), "DEL", &w.pod.path, "eth1", &c), version);
        }
        assert!(!w.pod_sh(&["rule"]).contains("10.248.2.5"), "{version}");
    }
}

/// DEL with the netns gone succeeds (nothing to remove); DEL after the interface went away removes
/// the rules by prevResult's addresses.
#[test]
fn del_with_the_netns_or_the_interface_gone() {
    let mut w = World::new(false);
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({}));
    ok(&exec(&ours(), "ADD", &w.pod.path, "eth1", &c), "ADD");
    sh("ip", &["-n", &w.pod.name, "link", "del", "eth1"]);
    ok(&exec(&ours(), "DEL", &w.pod.path, "eth1", &c), "DEL without eth1");
    assert!(!w.pod_sh(&["rule"]).contains("10.248.2.5"), "{}", w.pod_sh(&["rule"]));
    let path = w.pod.path.clone();
    w.pod.delete();
    ok(&exec(&ours(), "DEL", &path, "eth1", &c), "DEL with the netns gone");
    ok(&exec(&ours(), "DEL", "", "eth1", &c), "DEL without CNI_NETNS");
}

/// ADD that fails half way leaves nothing: the gateway is unreachable, so the default route in the
/// table cannot be added, and the rule added before it is removed again; main is untouched.
#[test]
fn a_failed_add_undoes_itself() {
    let w = World::new(false);
    let before = w.layout();
    let c = conf("1.0.0", prev_result("1.0.0", &w.pod, false), json!({"gateways": ["10.248.200.1"]}));
    let ran = exec(&ours(), "ADD", &w.pod.path, "eth1", &c);
    assert_eq!(ran.code, Some(1), "{}", ran.stdout);
    assert!(ran.stdout.contains("10.248.200.1"), "{}", ran.stdout);
    assert_eq!(w.layout(), before);
    // No prevResult, no addresses for the interface, no such interface: code 7, 7, 100.
    let mut none = conf("1.0.0", Value::Null, json!({}));
    none.as_object_mut().unwrap().remove("prevResult");
    assert!(exec(&ours(), "ADD", &w.pod.path, "eth1", &none).stdout.contains("\"code\": 7"));
    let empty = conf("1.0.0", json!({"cniVersion": "1.0.0"}), json!({}));
    assert!(exec(&ours(), "ADD", &w.pod.path, "eth1", &empty).stdout.contains("\"code\": 7"));
    let unindexed = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.248.2.5/24", "gateway": "10.248.2.1"}]});
    let ran = exec(&ours(), "ADD", &w.pod.path, "eth7", &conf("1.0.0", unindexed, json!({})));
    assert!(ran.stdout.contains("\"code\": 100") && ran.stdout.contains("eth7"), "{}", ran.stdout);
    assert_eq!(w.layout(), before);
}

/// Through libcni, chained after bridge with static IPAM on a pod's second interface: sbr reads
/// bridge's prevResult (three interfaces, the address on index 2), builds table 100, the pod still
/// reaches the gateway through it, CHECK passes, and the chain's DEL leaves no rule.
#[test]
fn chained_after_bridge_and_static_through_libcni() {
    use cni_tests::{pings, unique, LinkGuard, TempDir};
    use libcni::conflist::NetworkConfigList;
    use libcni::runtime::{CniConfig, RuntimeConf};
    require_root();
    let cache = TempDir::new("cnb-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let pod = Netns::new("cnbp");
    let (br0, br1) = (LinkGuard(unique("cnb")), LinkGuard(unique("cnb")));
    let net = |bridge: &str, n: u8, sbr: bool| {
        let mut plugins = vec![json!({"type": "bridge", "bridge": bridge, "isGateway": true,
            "ipam": {"type": "static", "addresses": [{"address": format!("10.248.3{n}.5/24"), "gateway": format!("10.248.3{n}.1")}],
                     "routes": [{"dst": "0.0.0.0/0"}]}})];
        if sbr {
            plugins.push(json!({"type": "sbr"}));
        }
        let v = json!({"cniVersion": "1.0.0", "name": unique("netb"), "plugins": plugins});
        NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap()
    };
    let rt = |ifname: &str| RuntimeConf {
        container_id: "ctr-sbr-chain".into(),
        netns: pod.path.clone(),
        ifname: ifname.into(),
        ..Default::default()
    };
    let (first, second) = (net(&br0.0, 1, false), net(&br1.0, 2, true));
    cni.add_network_list(&first, &rt("eth0")).unwrap();
    let result = cni.add_network_list(&second, &rt("eth1")).unwrap();
    assert_eq!(result.ips[0].interface, Some(2), "{result:?}");
    let rules = pod.sh("ip", &["-4", "rule"]);
    assert!(rules.contains("from 10.248.32.5 lookup 100"), "{rules}");
    let t100 = pod.sh("ip", &["-4", "route", "show", "table", "100"]);
    assert!(t100.contains("default via 10.248.32.1 dev eth1"), "{t100}");
    let main = pod.sh("ip", &["-4", "route", "show", "table", "main"]);
    assert!(!main.contains("eth1") && main.contains("default via 10.248.31.1 dev eth0"), "{main}");
    assert!(pings(&pod, "10.248.31.1"), "eth0's gateway");
    let out = pod.exec("busybox", &["ping", "-c", "1", "-W", "2", "-I", "10.248.32.5", "10.248.32.1"]);
    assert!(out.status.success(), "eth1's gateway from eth1's address, through table 100");
    cni.check_network_list(&second, &rt("eth1")).unwrap();
    cni.del_network_list(&second, &rt("eth1")).unwrap();
    assert!(!pod.sh("ip", &["-4", "rule"]).contains("10.248.32.5"));
    cni.del_network_list(&second, &rt("eth1")).unwrap();
    cni.del_network_list(&first, &rt("eth0")).unwrap();
}
