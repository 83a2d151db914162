//! A node switched in place from the reference Go plugins to ours: a pod attached by the reference
//! (bridge + host-local + portmap + loopback, their default iptables backend) is detached by ours
//! with the same conflist and no backend keys, and nothing of it is left.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, prerequisite, require_root, run, unique, LinkGuard, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Map};
use std::path::{Path, PathBuf};

const REFERENCE: &str = "/usr/lib/cni";

fn rules() -> String {
    let mut all = String::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        all.push_str(&String::from_utf8_lossy(&run(tool, &[]).stdout));
    }
    all.push_str(&String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout));
    all
}

#[test]
fn pods_of_the_reference_plugins_are_detached_by_ours() {
    require_root();
    let present = Path::new(REFERENCE).join("portmap").is_file();
    if !prerequisite(
        present,
        &format!("{REFERENCE} has no reference plugins: apt-get install containernetworking-plugins"),
    ) {
        return;
    }
    let bridge = LinkGuard(unique("cnu"));
    let data = TempDir::new("cnu-ipam");
    let cache = TempDir::new("cnu-cache");
    let list = json!({
        "cniVersion": "1.0.0",
        "name": unique("netu"),
        "plugins": [
            { "type": "bridge", "bridge": bridge.0, "isGateway": true, "ipMasq": true,
              "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.202.1.0/24" }]], "dataDir": data.path() } },
            { "type": "portmap", "capabilities": { "portMappings": true } },
            { "type": "loopback" }
        ]
    });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).unwrap();
    let pod = Netns::new("cnup");
    let mut caps = Map::new();
    caps.insert("portMappings".into(), json!([{ "hostPort": 18471, "containerPort": 80, "protocol": "tcp" }]));
    let rt = RuntimeConf {
        container_id: unique("ctru"),
        netns: pod.path.clone(),
        ifname: "eth0".into(),
        capability_args: caps,
        ..Default::default()
    };
    let theirs = CniConfig::with_cache_dir(vec![PathBuf::from(REFERENCE)], cache.path().to_path_buf());
    let ours = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());

    let result = theirs.add_network_list(&list, &rt).expect("ADD by the reference plugins");
    let ip = result.ips[0].address.ip().to_string();
    let before = rules();
    assert!(before.contains(&ip), "the reference made no rule for {ip}:\n{before}");

    let del = ours.del_network_list(&list, &rt);
    let after = rules();
    // Whatever happened, leave the host clean for the next test.
    if del.is_err() || after.contains(&ip) {
        let _ = theirs.del_network_list(&list, &rt);
    }
    del.expect("DEL by our plugins");
    assert!(!after.contains(&ip), "rules for {ip} survived our DEL:\n{after}");
    assert!(!after.contains(&rt.container_id), "rules naming the container survived our DEL");
    assert!(!pod.exec("ip", &["link", "show", "eth0"]).status.success(), "eth0 survived our DEL");
    let left: Vec<_> = std::fs::read_dir(data.path().join(&list.name))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert!(left.is_empty(), "reservations left: {left:?}");
}
