//! conf/bandwidth.conflist, the seed-style chain bridge + portmap (snat) + bandwidth with both
//! capabilities, through libcni: a mapped port serves, and transfers through it measure within
//! 20% of the pod's limits in both directions; DEL leaves no ifb, qdisc, rule or reservation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cni_tests::{bin_dir, run, Netns, TempDir};
use common::{add, del_twice, in_netns, read_rate, receive, send, within, write_bytes};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::CniConfig;
use serde_json::{json, Map};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

const BRIDGE: &str = "cnirs-bw0";
const RUN_DIR: &str = "/run/cni-rs-bandwidth";

fn conflist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../conf/bandwidth.conflist")
}

/// Removes the bridge and the IPAM directory on drop unless they were there before.
struct Leftovers {
    bridge_was_there: bool,
    run_dir_was_there: bool,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if !self.bridge_was_there {
            let _ = run("ip", &["link", "del", BRIDGE]);
        }
        if !self.run_dir_was_there {
            let _ = std::fs::remove_dir_all(RUN_DIR);
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The addresses reserved in the seed conflist's dataDir.
fn reservations() -> Vec<String> {
    std::fs::read_dir(Path::new(RUN_DIR).join("ipam/cni-rs-bandwidth"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|f| f.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn seed_chain_conflist_maps_a_port_and_limits_both_directions() {
    let _leftovers = Leftovers {
        bridge_was_there: run("ip", &["link", "show", BRIDGE]).status.success(),
        run_dir_was_there: Path::new(RUN_DIR).exists(),
    };
    // The conflist's dataDir is fixed: a run killed before its cleanup leaves its reservation, which
    // is not this run's to judge.
    let reservations_before = reservations();
    let list = NetworkConfigList::from_bytes(&std::fs::read(conflist()).unwrap()).unwrap();
    let cache = TempDir::new("bw-chain-cache");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    let pod = Netns::new("bwch");
    let (ingress, egress) = (24_000_000.0, 8_000_000.0);
    let (up_port, down_port) = (free_port(), free_port());
    let mut caps = Map::new();
    caps.insert(
        "portMappings".into(),
        json!([{"hostPort": up_port, "containerPort": 5001, "protocol": "tcp"},
               {"hostPort": down_port, "containerPort": 5002, "protocol": "tcp"}]),
    );
    caps.insert(
        "bandwidth".into(),
        json!({"ingressRate": ingress as u64, "ingressBurst": 800_000, "egressRate": egress as u64, "egressBurst": 800_000}),
    );
    let (rt, _, ifb) = add(&cni, &list, &pod, caps);

    // Two servers in the pod: 5001 receives (pod ingress), 5002 sends (pod egress).
    let up = in_netns(&pod.path, || TcpListener::bind("0.0.0.0:5001").unwrap()).join().unwrap();
    let down = in_netns(&pod.path, || TcpListener::bind("0.0.0.0:5002").unwrap()).join().unwrap();
    let rx = std::thread::spawn(move || receive(up));
    let bytes = (egress as usize / 8) * 3;
    let tx = std::thread::spawn(move || {
        let (mut s, _) = down.accept().unwrap();
        let mut hello = [0u8; 5];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");
        write_bytes(s, bytes);
    });

    // Pod ingress through the mapped port on the node's localhost (DNAT + snat).
    send(format!("127.0.0.1:{up_port}"), (ingress as usize / 8) * 3);
    within(rx.join().unwrap(), ingress, "pod ingress via 127.0.0.1:hostPort");

    // Pod egress: the node reads from the pod's server through the other mapped port.
    let mut s = TcpStream::connect(format!("127.0.0.1:{down_port}")).unwrap();
    s.write_all(b"hello").unwrap();
    let listener_side = std::thread::spawn(move || read_rate(s));
    tx.join().unwrap();
    within(listener_side.join().unwrap(), egress, "pod egress via 127.0.0.1:hostPort");

    del_twice(&cni, &list, &rt, &ifb);
    let ports = String::from_utf8_lossy(&run("ip", &["-o", "link", "show", "master", BRIDGE]).stdout).into_owned();
    assert!(ports.trim().is_empty(), "ports left on {BRIDGE}: {ports}");
    // The pod is gone, so a mapping left behind would make this connect time out, not be refused.
    let refused =
        TcpStream::connect_timeout(&format!("127.0.0.1:{up_port}").parse().unwrap(), std::time::Duration::from_secs(2));
    assert!(
        refused.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "hostPort {up_port} still mapped after DEL"
    );
    let reservations_after = reservations();
    let left: Vec<&String> = reservations_after.iter().filter(|r| !reservations_before.contains(r)).collect();
    assert!(left.is_empty(), "reservations left: {left:?}");
}
