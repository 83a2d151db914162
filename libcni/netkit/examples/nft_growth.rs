//! How the cost of one pod's nftables work grows with the pods already there: adds 10, then 1000,
//! then 3000 pods' masquerade and port mappings through the nftables backend, and at each
//! level times the ADD and DEL of 20 more (medians). Run it as root in a namespace of its own, so
//! the host's ruleset is not touched and everything goes with the namespace:
//!
//!     ip netns add nftgrow
//!     ip netns exec nftgrow cargo run --release -p netkit --example nft_growth
//!     ip netns del nftgrow
//!
//! docs/bench/README.md quotes its output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/common/mod.rs"]
mod common;

use netkit::firewall::{self, BackendKind, Firewall, Masquerade, PortMap};
use std::time::{Duration, Instant};

fn masq(i: usize) -> Masquerade {
    Masquerade {
        network: "grow".into(),
        container_id: format!("g-{i}"),
        ifname: "eth0".into(),
        addresses: vec![format!("10.{}.{}.{}/8", i / 62500, (i / 250) % 250, i % 250 + 2).parse().unwrap()],
    }
}

fn portmap(i: usize) -> PortMap {
    let m = masq(i);
    common::portmap("grow", &m.container_id, &m.addresses[0].to_string(), vec![common::tcp(1024 + (i % 60000) as u16)])
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64() * 1e3
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let fw: Box<dyn Firewall> = firewall::open(BackendKind::Nftables);
    let mut n = 0;
    println!("pods | masquerade ADD | port mapping ADD | port mapping DEL | masquerade DEL (ms, medians of 20)");
    for level in [10usize, 1000, 3000] {
        while n < level {
            fw.add_masquerade(&masq(n)).unwrap();
            fw.add_portmap(&portmap(n)).unwrap();
            n += 1;
        }
        let mut t: [Vec<f64>; 4] = Default::default();
        for k in 0..20 {
            let i = 100_000 + level + k;
            let id = masq(i).container_id;
            t[0].push(timed(|| fw.add_masquerade(&masq(i)).unwrap()));
            t[1].push(timed(|| fw.add_portmap(&portmap(i)).unwrap()));
            // Let the previous deletion's grace period pass, as between two pods on a node.
            std::thread::sleep(Duration::from_millis(50));
            t[2].push(timed(|| fw.del_portmap("grow", &id, "eth0").unwrap()));
            std::thread::sleep(Duration::from_millis(50));
            t[3].push(timed(|| fw.del_masquerade("grow", &id, "eth0").unwrap()));
        }
        let [a, b, c, d] = t.map(median);
        println!("{level:>4} | {a:.3} | {b:.3} | {c:.3} | {d:.3}");
    }
}
