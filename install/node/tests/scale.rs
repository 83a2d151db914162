//! Scale: with 1,000 other nodes in etcd, an agent's first sync programs their 1,000 routes in
//! under a second, and one node leaving removes exactly its route.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use base64::Engine;
use common::*;
use std::time::Duration;

const PEERS: usize = 1000;

/// Block `j` of 10.240.0.0/12 in /24s.
fn block(j: usize) -> String {
    format!("10.240.{}.0/24", j % 256).replacen("240", &(240 + j / 256).to_string(), 1)
}

fn synced_line(log: &str, wanted: usize) -> Option<(f64, String)> {
    log.lines().filter(|l| l.starts_with("routes synced in ")).find_map(|l| {
        let ms: f64 = l.strip_prefix("routes synced in ")?.split(' ').next()?.parse().ok()?;
        l.contains(&format!(": {wanted} wanted,")).then(|| (ms, l.to_string()))
    })
}

#[test]
fn a_thousand_peers_sync_in_under_a_second() {
    if skip_unless_root("a_thousand_peers_sync_in_under_a_second") || !which("curl") {
        return;
    }
    let t = tag();
    let dir = TempDir::new("scale");
    let seg = Segment::new(format!("cnseg{t}"), "10.95.0.1/16");
    let etcd = Etcd::start(&seg.ns.0, "10.95.0.1");
    let node = Netns::new(format!("cnn{t}-0"));
    seg.attach(&node, "p0", "10.95.0.11/16");

    // 1,000 records through etcd's JSON gateway, one curl process.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let mut config = Vec::new();
    for j in 1..=PEERS {
        let cidr = block(j);
        let key = format!("/cni-rs/subnets/{}", cidr.replace('/', "-"));
        let ip = format!("10.95.{}.{}", 1 + j / 250, 1 + j % 250);
        let value = format!(r#"{{"node":"s{j}","nodeIPs":["{ip}"],"podCIDRs":["{cidr}"]}}"#);
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(&key), b64(&value)).replace('"', "\\\"");
        config.push(format!("url = \"{}/v3/kv/put\"\ndata = \"{body}\"\noutput = \"/dev/null\"\n", etcd.url));
    }
    let config_path = dir.0.join("curl.conf");
    std::fs::write(&config_path, config.join("next\n")).unwrap();
    run_in(&seg.ns.0, &["curl", "-sSf", "-K", config_path.to_str().unwrap()]);
    let keys = etcd.etcdctl(&["get", "--prefix", "/cni-rs/subnets/", "--keys-only"]);
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), PEERS);

    let conf = dir.0.join("net.d");
    let args: Vec<String> = [
        "--node-name",
        "n0",
        "--etcd-endpoints",
        &etcd.url,
        "--cluster-cidr",
        "10.240.0.0/12",
        "--node-ip",
        "10.95.0.11",
        "--backend",
        "host-gw",
        "--no-plugins",
        "--conf-dir",
        conf.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut agent = Agent::start(&node.0, &dir.0, args);
    let (ms, line) = wait_for("the first sync", Duration::from_secs(60), || synced_line(&agent.proc.log(), PEERS));
    eprintln!("{line}");
    assert!(line.contains(&format!("{PEERS} added, 0 removed, 0 errors")), "{line}");
    assert!(ms < 1000.0, "the first sync of {PEERS} routes took {ms} ms");
    let routes = run_in(&node.0, &["ip", "-4", "route", "show", "proto", "210"]);
    assert_eq!(routes.lines().count(), PEERS);
    assert!(routes.contains("10.240.1.0/24 via 10.95.1.2 dev eth0"), "{}", &routes[..200]);

    // One node leaves: exactly its route goes.
    etcd.etcdctl(&["del", &format!("/cni-rs/subnets/{}", block(500).replace('/', "-"))]);
    let (ms, line) = wait_for("the leave", Duration::from_secs(20), || synced_line(&agent.proc.log(), PEERS - 1));
    eprintln!("{line}");
    assert!(line.contains("0 added, 1 removed, 0 errors"), "{line}");
    assert!(ms < 1000.0);
    let routes = run_in(&node.0, &["ip", "-4", "route", "show", "proto", "210"]);
    assert_eq!(routes.lines().count(), PEERS - 1);
    assert!(!routes.contains(&block(500)));
    assert!(agent.proc.running());
    drop(agent);
    drop(etcd);
}
