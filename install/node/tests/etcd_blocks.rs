//! The etcd datastore against a real etcd (Debian's etcd-server 3.4): blocks are leased, distinct
//! under concurrency, kept across a restart, freed when the lease expires, and taken back.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// Arguments for node `name` at `ip` (dual-stack cluster range).
fn node_args(etcd: &Etcd, name: &str, ip: &str, conf: &std::path::Path, ttl: u32) -> Vec<String> {
    etcd_agent_args(&etcd.url, name, "10.244.0.0/16,fd00:10:244::/56", ip, ttl, conf)
}

struct Fixture {
    // Field order is drop order: agents, then etcd, then the namespaces.
    agents: Vec<Agent>,
    etcd: Etcd,
    nodes: Vec<Netns>,
    _segment: Segment,
    dir: TempDir,
}

fn fixture(nodes: usize) -> Fixture {
    let t = tag();
    let dir = TempDir::new("etcd-blocks");
    let segment = Segment::new(format!("cnseg{t}"), "10.95.0.1/24");
    let etcd = Etcd::start(&segment.ns.0, "10.95.0.1");
    let mut list = Vec::new();
    for i in 0..nodes {
        let ns = Netns::new(format!("cnn{t}-{i}"));
        segment.attach(&ns, &format!("p{i}"), &format!("10.95.0.{}/24", 11 + i));
        std::fs::create_dir_all(dir.0.join(format!("n{i}"))).unwrap();
        list.push(ns);
    }
    Fixture { agents: Vec::new(), etcd, nodes: list, _segment: segment, dir }
}

impl Fixture {
    fn start(&mut self, i: usize, ttl: u32) -> usize {
        let conf = self.dir.0.join(format!("n{i}"));
        let args = node_args(&self.etcd, &format!("n{i}"), &format!("10.95.0.{}", 11 + i), &conf, ttl);
        self.agents.push(Agent::start(&self.nodes[i].0, &conf, args));
        self.agents.len() - 1
    }

    /// node name -> (key, value) of every block in etcd.
    fn blocks(&self) -> Vec<(String, serde_json::Value)> {
        self.etcd
            .get_prefix("/cni-rs/subnets/")
            .into_iter()
            .filter_map(|(k, v)| Some((k, serde_json::from_str(&v).ok()?)))
            .collect()
    }

    fn key_of(&self, node: &str) -> Option<String> {
        self.blocks().into_iter().find(|(_, v)| v["node"] == node).map(|(k, _)| k)
    }
}

#[test]
fn twenty_agents_starting_at_once_get_twenty_distinct_blocks() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(20);
    for i in 0..20 {
        f.start(i, 60);
    }
    let blocks = wait_for("20 blocks in etcd", Duration::from_secs(60), || {
        let b = f.blocks();
        (b.len() == 20).then_some(b)
    });
    let keys: BTreeSet<&String> = blocks.iter().map(|(k, _)| k).collect();
    let names: BTreeSet<String> = blocks.iter().map(|(_, v)| v["node"].as_str().unwrap().to_string()).collect();
    let v4: BTreeSet<String> = blocks.iter().map(|(_, v)| v["podCIDRs"][0].as_str().unwrap().to_string()).collect();
    let v6: BTreeSet<String> = blocks.iter().map(|(_, v)| v["podCIDRs"][1].as_str().unwrap().to_string()).collect();
    assert_eq!((keys.len(), names.len(), v4.len(), v6.len()), (20, 20, 20, 20), "{blocks:#?}");
    for (key, value) in &blocks {
        let cidr = value["podCIDRs"][0].as_str().unwrap();
        assert_eq!(key, &format!("/cni-rs/subnets/{}", cidr.replace('/', "-")));
        assert!(cidr.starts_with("10.244.") && cidr.ends_with(".0/24"), "{cidr}");
        let name = value["node"].as_str().unwrap();
        let i: usize = name[1..].parse().unwrap();
        assert_eq!(value["nodeIPs"][0], format!("10.95.0.{}", 11 + i));
    }
    // Every node routes to the 19 others' pod CIDRs (host-gw: via their node address), both
    // families' blocks, and to nothing else.
    for (i, ns) in f.nodes.iter().enumerate() {
        let routes = wait_for("19 routes on every node", Duration::from_secs(30), || {
            let out = run_in(&ns.0, &["ip", "-4", "route", "show", "proto", "210"]);
            (out.lines().count() == 19).then_some(out)
        });
        let own = blocks.iter().find(|(_, v)| v["node"] == format!("n{i}")).unwrap();
        let own_cidr = own.1["podCIDRs"][0].as_str().unwrap();
        assert!(!routes.contains(own_cidr), "n{i} routes to its own block: {routes}");
        for (_, v) in blocks.iter().filter(|(_, v)| v["node"] != format!("n{i}")) {
            let line =
                format!("{} via {} dev eth0", v["podCIDRs"][0].as_str().unwrap(), v["nodeIPs"][0].as_str().unwrap());
            assert!(routes.contains(&line), "n{i} lacks {line:?}: {routes}");
        }
    }
    for agent in &mut f.agents {
        assert!(agent.proc.running(), "agent exited: {}", agent.proc.log());
    }
}

#[test]
fn a_block_survives_a_restart_and_is_never_shared_with_a_live_holder() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(2);
    // Block 0 is held by a live lease of a node that is not running an agent here.
    let lease = f.etcd.etcdctl(&["lease", "grant", "120"]);
    let lease = lease.split_whitespace().nth(1).unwrap().to_string();
    let other = r#"{"node":"elsewhere","nodeIPs":["10.95.0.99"],"podCIDRs":["10.244.0.0/24","fd00:10:244::/64"]}"#;
    f.etcd.etcdctl(&["put", "--lease", &lease, "/cni-rs/subnets/10.244.0.0-24", other]);

    let a = f.start(0, 60);
    let key = wait_for("n0's block", Duration::from_secs(20), || f.key_of("n0"));
    assert_eq!(key, "/cni-rs/subnets/10.244.1.0-24", "block 0 is held by a live node");
    let lease_line = f.etcd.etcdctl(&["get", &key, "-w", "fields"]);
    assert!(lease_line.contains("\"Lease\" : "), "{lease_line}");

    // SIGTERM: exits within seconds, and the lease is not revoked (the block stays).
    let start = Instant::now();
    let status = f.agents[a].proc.stop(SIGTERM, Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "agent did not exit 0 on SIGTERM within 5s");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(f.key_of("n0").as_deref(), Some(key.as_str()), "SIGTERM must not revoke the lease");

    // Another node starting meanwhile does not get n0's block; n0 restarted gets it back.
    f.start(1, 60);
    let key1 = wait_for("n1's block", Duration::from_secs(20), || f.key_of("n1"));
    assert_eq!(key1, "/cni-rs/subnets/10.244.2.0-24");
    f.agents[a].restart();
    wait_for("n0's block re-leased", Duration::from_secs(20), || {
        f.agents[a].proc.log().contains("holding").then_some(())
    });
    assert_eq!(f.key_of("n0").as_deref(), Some(key.as_str()), "{}", f.agents[a].proc.log());
    let blocks = f.blocks();
    assert_eq!(blocks.len(), 3, "{blocks:?}");
}

#[test]
fn an_expired_lease_frees_the_block_and_the_node_takes_it_back() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(3);
    for i in 0..3 {
        f.start(i, 5);
        // One at a time: n0, n1, n2 hold blocks 0, 1, 2.
        wait_for("block", Duration::from_secs(20), || f.key_of(&format!("n{i}")));
    }
    assert_eq!(f.key_of("n0").as_deref(), Some("/cni-rs/subnets/10.244.0.0-24"));
    assert_eq!(f.key_of("n1").as_deref(), Some("/cni-rs/subnets/10.244.1.0-24"));
    // Killed agents stop renewing: their blocks go within the TTL (5s) plus a little.
    let killed = Instant::now();
    f.agents[0].proc.stop(9, Duration::from_secs(5));
    f.agents[1].proc.stop(9, Duration::from_secs(5));
    wait_for("n0's and n1's blocks to expire", Duration::from_secs(12), || {
        (f.key_of("n0").is_none() && f.key_of("n1").is_none()).then_some(())
    });
    eprintln!("blocks expired {:?} after the kill", killed.elapsed());
    // n1 returns first and takes its old block back (its conflist names it), not the lowest
    // free one (block 0).
    f.agents[1].restart();
    let key = wait_for("n1's block again", Duration::from_secs(20), || f.key_of("n1"));
    assert_eq!(key, "/cni-rs/subnets/10.244.1.0-24", "{}", f.agents[1].proc.log());
    f.agents[0].restart();
    let key = wait_for("n0's block again", Duration::from_secs(20), || f.key_of("n0"));
    assert_eq!(key, "/cni-rs/subnets/10.244.0.0-24");
    assert_eq!(f.blocks().len(), 3);
}

#[test]
fn hostile_records_route_nothing_and_break_nothing() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(1);
    let put = |key: &str, value: &str| {
        f.etcd.etcdctl(&["put", &format!("/cni-rs/subnets/{key}"), value]);
    };
    put("garbage", "not json");
    put("wrong-shape", r#"{"node":7}"#);
    // Overlaps the block n0 will take (block 0).
    put("overlap", r#"{"node":"evil1","nodeIPs":["10.95.0.50"],"podCIDRs":["10.244.0.0/23","fd00:10:244::/63"]}"#);
    // A default route (overlaps everything), and a network outside the cluster range.
    put("default", r#"{"node":"evil2","nodeIPs":["10.95.0.51"],"podCIDRs":["0.0.0.0/0","::/0"]}"#);
    put("outside", r#"{"node":"evil4","nodeIPs":["10.95.0.53"],"podCIDRs":["192.168.7.0/24","fd00:99::/64"]}"#);
    // Claims n0's own address.
    put(
        "10.244.9.0-24",
        r#"{"node":"evil3","nodeIPs":["10.95.0.11"],"podCIDRs":["10.244.9.0/24","fd00:10:244:9::/64"]}"#,
    );
    // One honest peer.
    put(
        "10.244.5.0-24",
        r#"{"node":"peer","nodeIPs":["10.95.0.52"],"podCIDRs":["10.244.5.0/24","fd00:10:244:5::/64"]}"#,
    );
    let a = f.start(0, 60);
    let key = wait_for("n0's block", Duration::from_secs(20), || f.key_of("n0"));
    assert_eq!(key, "/cni-rs/subnets/10.244.0.0-24");
    let routes = wait_for("the honest peer's route", Duration::from_secs(20), || {
        let r = run_in(&f.nodes[0].0, &["ip", "-4", "route", "show", "proto", "210"]);
        r.contains("10.244.5.0/24").then_some(r)
    });
    std::thread::sleep(Duration::from_millis(500));
    let routes = format!("{routes}{}", run_in(&f.nodes[0].0, &["ip", "-6", "route", "show", "proto", "210"]));
    assert_eq!(routes.lines().count(), 1, "only the honest peer's IPv4 route (no IPv6 node address): {routes}");
    assert!(run_in(&f.nodes[0].0, &["ip", "route", "show", "default"]).is_empty());
    let log = f.agents[a].proc.log();
    for want in [
        "not a node record",
        "node evil1 (/cni-rs/subnets/overlap): claims 10.244.0.0/23,fd00:10:244::/63, which is not one block",
        "node evil2 (/cni-rs/subnets/default): claims 0.0.0.0/0,::/0, which is not one block",
        "node evil4 (/cni-rs/subnets/outside): claims 192.168.7.0/24,fd00:99::/64, which is not one block",
        "node evil3 (/cni-rs/subnets/10.244.9.0-24): 10.95.0.11 is an address of this node",
    ] {
        assert!(log.contains(want), "no {want:?} in\n{log}");
    }
    assert!(f.agents[a].proc.running());
}

#[test]
fn node_ip_defaults_to_the_default_route_interface() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(1);
    let ns = f.nodes[0].0.clone();
    // A second interface with an address that sorts first, and the default route via eth0.
    run_in(&ns, &["ip", "link", "add", "extra0", "type", "bridge"]);
    run_in(&ns, &["ip", "addr", "add", "10.1.1.1/24", "dev", "extra0"]);
    run_in(&ns, &["ip", "link", "set", "extra0", "up"]);
    run_in(&ns, &["ip", "route", "add", "default", "via", "10.95.0.1"]);
    let conf = f.dir.0.join("n0");
    let mut args = node_args(&f.etcd, "n0", "unused", &conf, 60);
    let at = args.iter().position(|a| a == "--node-ip").unwrap();
    args.drain(at..at + 2);
    f.agents.push(Agent::start(&ns, &conf, args));
    wait_for("n0's block", Duration::from_secs(20), || f.key_of("n0"));
    let (_, value) = f.blocks().into_iter().find(|(_, v)| v["node"] == "n0").unwrap();
    assert_eq!(value["nodeIPs"], serde_json::json!(["10.95.0.11"]), "{}", f.agents[0].proc.log());
}

/// A record naming n1 at a key that is not its blocks' key, with n0's live block: on restart n1
/// must not take it back (which would hand out n0's pod range twice), but a block of its own.
#[test]
fn a_forged_record_naming_a_node_never_makes_it_take_another_nodes_block() {
    require(&["etcd", "etcdctl"]);
    let mut f = fixture(2);
    let a = f.start(0, 60);
    let key = wait_for("n0's block", Duration::from_secs(20), || f.key_of("n0"));
    assert_eq!(key, "/cni-rs/subnets/10.244.0.0-24");
    let forged = r#"{"node":"n1","nodeIPs":["10.95.0.12"],"podCIDRs":["10.244.0.0/24","fd00:10:244::/64"]}"#;
    f.etcd.etcdctl(&["put", "/cni-rs/subnets/forged", forged]);
    f.etcd.etcdctl(&["put", "/cni-rs/subnets/10.244.7.0-24", forged]);

    let b = f.start(1, 60);
    let held = wait_for("n1 holding a block", Duration::from_secs(20), || {
        f.agents[b].proc.log().lines().find(|l| l.starts_with("holding ")).map(String::from)
    });
    assert!(
        held.starts_with("holding 10.244.1.0/24,fd00:10:244:1::/64 (/cni-rs/subnets/10.244.1.0-24)"),
        "{held}\n{}",
        f.agents[b].proc.log()
    );
    let value = f.etcd.etcdctl(&["get", "--print-value-only", "/cni-rs/subnets/10.244.0.0-24"]);
    assert!(value.contains(r#""node":"n0""#), "n0 keeps its block: {value}");
    // n0 believes neither forged record: its one route goes to n1's real block.
    let routes = wait_for("n0's route to n1", Duration::from_secs(20), || {
        let r = run_in(&f.nodes[0].0, &["ip", "-4", "route", "show", "proto", "210"]);
        r.contains("10.244.1.0/24 via 10.95.0.12").then_some(r)
    });
    assert_eq!(routes.lines().count(), 1, "{routes}");
    let log = f.agents[a].proc.log();
    let want =
        "(/cni-rs/subnets/forged): claims 10.244.0.0/24,fd00:10:244::/64, whose key is /cni-rs/subnets/10.244.0.0-24";
    assert!(log.contains(want), "{log}");
    let (_, metrics) = agent_http(&f.agents[a], "/metrics");
    assert_eq!(
        metric(&metrics, r#"cni_rs_node_records_rejected_total{reason="key_mismatch"}"#),
        Some(2.0),
        "{metrics}"
    );
}

/// Records whose addresses or MACs no route may use: each is a warning and a metric, the honest
/// ones are routed, no netlink request fails, and /healthz stays 200 (so a liveness probe does not
/// restart every agent because of one bad record). n0 runs `--backend auto` (host-gw on its subnet,
/// VXLAN beyond), n1 `--backend host-gw`.
#[test]
fn unusable_records_are_warnings_and_metrics_never_sync_errors() {
    require(&["etcd", "etcdctl", "curl"]);
    let mut f = fixture(2);
    // A second address of n0 that is not its --node-ip.
    run_in(&f.nodes[0].0, &["ip", "addr", "add", "10.95.0.200/24", "dev", "eth0"]);
    let put = |i: u8, node: &str, ip: &str, mac: &str| {
        let value = serde_json::json!({
            "node": node, "nodeIPs": [ip],
            "podCIDRs": [format!("10.244.{i}.0/24"), format!("fd00:10:244:{i:x}::/64")], "vtepMAC": mac,
        });
        f.etcd.etcdctl(&["put", &format!("/cni-rs/subnets/10.244.{i}.0-24"), &value.to_string()]);
    };
    put(5, "peer", "10.95.0.52", "02:00:00:00:00:52");
    put(6, "own-address", "10.95.0.200", "02:00:00:00:00:06");
    put(7, "broadcast", "10.95.0.255", "02:00:00:00:00:07");
    put(8, "multicast", "224.0.0.5", "02:00:00:00:00:08");
    put(9, "far", "10.99.0.9", "02:00:00:00:00:09");
    put(10, "zero-mac", "10.99.0.10", "00:00:00:00:00:00");
    put(11, "copycat", "10.99.0.11", "02:00:00:00:00:09");
    put(12, "multicast-mac", "10.99.0.12", "01:00:5e:00:00:01");
    put(13, "metadata", "169.254.169.254", "02:00:00:00:00:13");
    let mismatch = r#"{"node":"mismatch","nodeIPs":["10.95.0.60"],"podCIDRs":["10.244.15.0/24","fd00:10:244:f::/64"]}"#;
    f.etcd.etcdctl(&["put", "/cni-rs/subnets/10.244.14.0-24", mismatch]);
    let halves = r#"{"node":"halves","nodeIPs":["10.95.0.61"],"podCIDRs":["10.244.16.0/24","fd00:10:244:17::/64"]}"#;
    f.etcd.etcdctl(&["put", "/cni-rs/subnets/10.244.16.0-24", halves]);

    let conf = f.dir.0.join("n0");
    let mut args = node_args(&f.etcd, "n0", "10.95.0.11", &conf, 60);
    let at = args.iter().position(|x| x == "host-gw").unwrap();
    args[at] = "auto".into();
    f.agents.push(Agent::start(&f.nodes[0].0, &conf, args));
    let a = f.agents.len() - 1;
    // One at a time: n0 holds block 0, n1 block 1.
    wait_for("n0's block", Duration::from_secs(20), || f.key_of("n0"));
    let b = f.start(1, 60);
    let wanted4 = |ns: &str, want: &[&str]| {
        let ns = ns.to_string();
        wait_for(&format!("routes {want:?} in {ns}"), Duration::from_secs(20), || {
            let r = run_in(&ns, &["ip", "-4", "route", "show", "proto", "210"]);
            let mut lines: Vec<&str> = r.lines().map(str::trim).collect();
            lines.sort();
            (lines == want).then_some(())
        })
    };
    let n0 = f.nodes[0].0.clone();
    let n1 = f.nodes[1].0.clone();
    wanted4(
        &n0,
        &[
            "10.244.1.0/24 via 10.95.0.12 dev eth0",
            "10.244.5.0/24 via 10.95.0.52 dev eth0",
            "10.244.9.0/24 via 10.244.9.0 dev cni-rs.1 onlink",
        ],
    );
    wanted4(
        &n1,
        &[
            "10.244.0.0/24 via 10.95.0.11 dev eth0",
            "10.244.5.0/24 via 10.95.0.52 dev eth0",
            "10.244.6.0/24 via 10.95.0.200 dev eth0",
        ],
    );
    // The older holder keeps MAC ...:09; no all-zero (default destination) or multicast entry.
    let fdb = run_in(&n0, &["bridge", "fdb", "show", "dev", "cni-rs.1"]);
    assert!(fdb.contains("02:00:00:00:00:09 dst 10.99.0.9 self permanent"), "{fdb}");
    for absent in ["10.99.0.11", "00:00:00:00:00:00", "01:00:5e:00:00:01", "10.99.0.12", "10.99.0.10", "224.0.0.5"] {
        assert!(!fdb.contains(absent), "{absent} in\n{fdb}");
    }

    let expect = |agent: &Agent, lines: &[&str], counts: &[(&str, f64)]| {
        let log = agent.proc.log();
        for want in lines {
            assert!(log.contains(want), "no {want:?} in\n{log}");
        }
        assert!(!log.lines().any(|l| l.starts_with("error")), "{log}");
        let (status, body) = wait_for("/healthz 200", Duration::from_secs(10), || {
            Some(agent_http(agent, "/healthz")).filter(|r| r.0 == 200)
        });
        assert_eq!((status, body.trim()), (200, "ok"));
        let (_, metrics) = agent_http(agent, "/metrics");
        for (reason, count) in counts {
            let name = format!("cni_rs_node_records_rejected_total{{reason=\"{reason}\"}}");
            assert_eq!(metric(&metrics, &name), Some(*count), "{name} in\n{metrics}");
        }
        assert_eq!(metric(&metrics, "cni_rs_node_reconcile_errors_total"), Some(0.0), "{metrics}");
    };
    expect(
        &f.agents[a],
        &[
            "node own-address (/cni-rs/subnets/10.244.6.0-24): 10.95.0.200 is an address of this node; ignored",
            "node broadcast (/cni-rs/subnets/10.244.7.0-24): 10.95.0.255 is the network or broadcast address of this node's subnet 10.95.0.0/24",
            "node multicast (/cni-rs/subnets/10.244.8.0-24): 224.0.0.5 is a multicast",
            "node zero-mac (/cni-rs/subnets/10.244.10.0-24): VTEP MAC 00:00:00:00:00:00 is all zero",
            "node copycat (/cni-rs/subnets/10.244.11.0-24): VTEP MAC 02:00:00:00:00:09 is used by node far (/cni-rs/subnets/10.244.9.0-24)",
            "node metadata (/cni-rs/subnets/10.244.13.0-24): 169.254.169.254 is link-local",
            "whose key is /cni-rs/subnets/10.244.15.0-24",
            "node halves (/cni-rs/subnets/10.244.16.0-24): claims 10.244.16.0/24,fd00:10:244:17::/64, which is not one block",
        ],
        &[
            ("own_address", 1.0),
            ("bad_node_ip", 3.0),
            ("bad_vtep_mac", 2.0),
            ("duplicate_vtep_mac", 1.0),
            ("key_mismatch", 1.0),
            ("not_a_block", 1.0),
        ],
    );
    expect(
        &f.agents[b],
        &["no route to 10.244.9.0/24 of node far: host-gw needs a node address of its family on this node's subnet"],
        &[("own_address", 0.0), ("bad_node_ip", 3.0), ("key_mismatch", 1.0), ("not_a_block", 1.0)],
    );

    // Another writer's value on n0's own key: n0 keeps its block, logs the conflict naming both,
    // and counts it.
    let thief = r#"{"node":"thief","nodeIPs":["10.95.0.66"],"podCIDRs":["10.244.0.0/24","fd00:10:244::/64"]}"#;
    f.etcd.etcdctl(&["put", "/cni-rs/subnets/10.244.0.0-24", thief]);
    wait_for("the conflict in n0's log", Duration::from_secs(10), || {
        f.agents[a]
            .proc
            .log()
            .contains(
                "node thief (/cni-rs/subnets/10.244.0.0-24) claims 10.244.0.0/24,fd00:10:244::/64, which this node n0",
            )
            .then_some(())
    });
    let (_, metrics) = agent_http(&f.agents[a], "/metrics");
    assert_eq!(metric(&metrics, "cni_rs_node_record_conflicts_total"), Some(1.0), "{metrics}");
    assert_eq!(agent_http(&f.agents[a], "/healthz").0, 200);
    assert!(!run_in(&n0, &["ip", "-4", "route", "show", "proto", "210"]).contains("10.95.0.66"));

    // An address this node gains later counts too: the peer's route through it goes at once.
    run_in(&n0, &["ip", "addr", "add", "10.95.0.52/24", "dev", "eth0"]);
    wanted4(&n0, &["10.244.1.0/24 via 10.95.0.12 dev eth0", "10.244.9.0/24 via 10.244.9.0 dev cni-rs.1 onlink"]);
    let log = f.agents[a].proc.log();
    assert!(log.contains("node peer (/cni-rs/subnets/10.244.5.0-24): 10.95.0.52 is an address of this node"), "{log}");
    let (_, metrics) = agent_http(&f.agents[a], "/metrics");
    assert_eq!(metric(&metrics, r#"cni_rs_node_records_rejected_total{reason="own_address"}"#), Some(2.0), "{metrics}");
    assert_eq!(metric(&metrics, "cni_rs_node_reconcile_errors_total"), Some(0.0), "{metrics}");
}
