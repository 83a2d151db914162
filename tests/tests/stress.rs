//! Concurrency stress: 100 pods on one network (bridge + host-local + portmap), ADD and DEL
//! interleaved at random from many threads. No address is ever held by two live pods, none is lost
//! (after every DEL no reservation remains), nothing deadlocks (bounded time), and the firewall ends
//! with no rule of any pod. Privileged; subnet 10.212.0.0/24.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, bridge_ports, require_root, run, unique, LinkGuard, Netns, Rng, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::json;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

const PODS: usize = 100;
const WORKERS: usize = 8;
const BUDGET: Duration = Duration::from_secs(90);

struct Shared {
    list: NetworkConfigList,
    cni: CniConfig,
    /// Address -> the container holding it, for live pods only.
    held: Mutex<HashMap<IpAddr, String>>,
    violations: Mutex<Vec<String>>,
}

fn rt(pod: &Netns, i: usize) -> RuntimeConf {
    let mut caps = serde_json::Map::new();
    caps.insert("portMappings".into(), json!([{ "hostPort": 21000 + i, "containerPort": 80, "protocol": "tcp" }]));
    RuntimeConf {
        container_id: format!("{}-{i}", unique("cts")),
        netns: pod.path.clone(),
        ifname: "eth0".into(),
        capability_args: caps,
        ..Default::default()
    }
}

fn add(shared: &Shared, r: &RuntimeConf) {
    match shared.cni.add_network_list(&shared.list, r) {
        Ok(result) => {
            let mut held = shared.held.lock().unwrap();
            for ip in &result.ips {
                if let Some(other) = held.insert(ip.address.ip(), r.container_id.clone()) {
                    shared
                        .violations
                        .lock()
                        .unwrap()
                        .push(format!("{} handed to {} while {other} held it", ip.address, r.container_id));
                }
            }
        }
        Err(e) => shared.violations.lock().unwrap().push(format!("ADD {}: {e}", r.container_id)),
    }
}

fn del(shared: &Shared, r: &RuntimeConf) {
    // Forget the address before DEL: once DEL frees it, another ADD may rightly get it.
    shared.held.lock().unwrap().retain(|_, cid| cid != &r.container_id);
    if let Err(e) = shared.cni.del_network_list(&shared.list, r) {
        shared.violations.lock().unwrap().push(format!("DEL {}: {e}", r.container_id));
    }
}

#[test]
fn hundred_pods_add_and_del_interleaved() {
    require_root();
    let bridge = LinkGuard(unique("cns"));
    let data = TempDir::new("cns-ipam");
    let cache = TempDir::new("cns-cache");
    let list = json!({
        "cniVersion": "1.1.0",
        "name": unique("nets"),
        "plugins": [
            { "type": "bridge", "bridge": bridge.0, "isGateway": true, "ipMasq": true, "ipMasqBackend": "nftables",
              "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.212.0.0/24" }]], "dataDir": data.path() } },
            { "type": "portmap", "backend": "nftables", "capabilities": { "portMappings": true } }
        ]
    });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let mut cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    // A hung plugin (a lock never released) fails its call instead of hanging the test.
    cni.timeout = Some(Duration::from_secs(30));
    let shared = Arc::new(Shared { list, cni, held: Mutex::new(HashMap::new()), violations: Mutex::new(Vec::new()) });
    let pods: Vec<Netns> = (0..PODS).map(|_| Netns::new("cnsp")).collect();
    let rts: Vec<RuntimeConf> = pods.iter().enumerate().map(|(i, p)| rt(p, i)).collect();

    let started = Instant::now();
    let (done_tx, done_rx) = mpsc::channel();
    for w in 0..WORKERS {
        let mine: Vec<RuntimeConf> = rts.iter().skip(w).step_by(WORKERS).cloned().collect();
        let shared = Arc::clone(&shared);
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ (w as u64 + 1));
            let mut waiting = mine;
            let mut live: Vec<RuntimeConf> = Vec::new();
            // At each turn, ADD a new pod or DEL a live one at random, until all are added and gone.
            while !waiting.is_empty() || !live.is_empty() {
                if !waiting.is_empty() && (live.is_empty() || rng.below(3) != 0) {
                    let r = waiting.swap_remove(rng.below(waiting.len()));
                    add(&shared, &r);
                    live.push(r);
                } else {
                    let r = live.swap_remove(rng.below(live.len()));
                    del(&shared, &r);
                }
            }
            let _ = done.send(());
        });
    }
    drop(done_tx);
    for _ in 0..WORKERS {
        let left = BUDGET.saturating_sub(started.elapsed());
        assert!(done_rx.recv_timeout(left).is_ok(), "workers still running after {BUDGET:?}: a deadlock?");
    }
    let elapsed = started.elapsed();
    eprintln!("{PODS} pods, {WORKERS} workers: ADD+DEL of all in {elapsed:?}");

    let violations = shared.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{} problems:\n{}", violations.len(), violations.join("\n"));
    assert!(shared.held.lock().unwrap().is_empty(), "the test lost track of a pod");
    let dir = data.path().join(&shared.list.name);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .expect("network dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<IpAddr>().is_ok() || n.starts_with(".host-local-tmp"))
        .collect();
    assert!(left.is_empty(), "reservations left after every DEL: {left:?}");
    let ports = bridge_ports(&bridge.0);
    assert!(ports.is_empty(), "ports left on the bridge: {ports:?}");
    let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!nft.contains("10.212.0."), "nft still has a rule of a pod:\n{nft}");
    for r in &rts {
        assert!(!nft.contains(&r.container_id), "nft still mentions {}", r.container_id);
    }
}
