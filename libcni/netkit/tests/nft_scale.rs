//! The nftables backend at scale and on its edge cases, through the firewall API.
//!
//! Each test works in a network namespace of its own (nftables state is per namespace), so the
//! host's tables are never touched; a guard also garbage-collects the test network's chains and
//! elements before the namespace goes, even when an assertion fails. Needs root and nft.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use cni_tests::{require_root, unique, Netns};
use common::{portmap, tcp};
use libcni::conf::Attachment;
use netkit::firewall::{self, BackendKind, Firewall, Masquerade, PortMap};
use netkit::NetNs;
use serde_json::Value;
use std::process::Command;
use std::time::Instant;

/// More than the kernel's 1024 hooks per hook point: with a base chain per pod, ADD failed here.
const ATTACHMENTS: usize = 1100;
const THREADS: usize = 4;

fn fw() -> Box<dyn Firewall> {
    firewall::open(BackendKind::Nftables)
}

fn masq(network: &str, i: usize) -> Masquerade {
    Masquerade {
        network: network.into(),
        container_id: format!("scale-{i}"),
        ifname: "eth0".into(),
        addresses: vec![format!("10.230.{}.{}/16", i / 250, i % 250 + 2).parse().unwrap()],
    }
}

fn scale_portmap(network: &str, i: usize) -> PortMap {
    let m = masq(network, i);
    portmap(network, &m.container_id, &m.addresses[0].to_string(), vec![tcp(20000 + i as u16)])
}

/// `nft -j <args>` inside the namespace, parsed; Null when nft fails (an absent object).
fn nft_json(ns: &Netns, args: &[&str]) -> Value {
    let out = Command::new("ip").args(["netns", "exec", &ns.name, "nft", "-j"]).args(args).output().unwrap();
    if !out.status.success() {
        return Value::Null;
    }
    serde_json::from_slice(&out.stdout).unwrap()
}

fn items<'a>(v: &'a Value, kind: &str) -> Vec<&'a Value> {
    v["nftables"].as_array().map(|a| a.iter().filter_map(|i| i.get(kind)).collect()).unwrap_or_default()
}

/// (base chains, chains whose name starts with `prefix`) of a table.
fn chains(ns: &Netns, family: &str, table: &str, prefix: &str) -> (usize, usize) {
    let v = nft_json(ns, &["list", "table", family, table]);
    let chains = items(&v, "chain");
    let base = chains.iter().filter(|c| c.get("hook").is_some()).count();
    let ours = chains.iter().filter(|c| c["name"].as_str().is_some_and(|n| n.starts_with(prefix))).count();
    (base, ours)
}

/// The elements a map or set lists (expired ones are not listed).
fn elements(ns: &Netns, family: &str, table: &str, map: &str) -> usize {
    let v = nft_json(ns, &["list", "map", family, table, map]);
    if let Some(n) = items(&v, "map").first().map(|m| m["elem"].as_array().map_or(0, Vec::len)) {
        return n;
    }
    let v = nft_json(ns, &["list", "set", family, table, map]);
    items(&v, "set").first().and_then(|m| m["elem"].as_array()).map_or(0, Vec::len)
}

/// Port-mapping elements expire 1 ms after DEL (counted in jiffies): let them.
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(20));
}

fn rules(ns: &Netns, table: &str, chain: &str) -> usize {
    items(&nft_json(ns, &["list", "chain", "inet", table, chain]), "rule").len()
}

/// Removes everything of `network` in the namespace on drop (GC with nothing to keep).
struct Cleanup<'a> {
    ns: &'a Netns,
    network: String,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Ok(ns) = NetNs::open(&self.ns.path) {
            let _ = ns.run(|| {
                let _ = fw().gc_masquerade(&self.network, &[]);
                let _ = fw().gc_portmap(&self.network, &[]);
            });
        }
    }
}

/// Runs `f(i)` for i in 0..n on THREADS threads inside the namespace; the errors, with their i.
fn each(ns: &Netns, n: usize, f: impl Fn(usize) -> libcni::Result<()> + Sync) -> Vec<String> {
    let f = &f;
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                s.spawn(move || {
                    let netns = NetNs::open(&ns.path).unwrap();
                    let _inside = netns.enter().unwrap();
                    (t..n).step_by(THREADS).filter_map(|i| f(i).err().map(|e| format!("{i}: {e}"))).collect::<Vec<_>>()
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().unwrap()).collect()
    })
}

#[test]
fn more_pods_than_hooks() {
    require_root();
    let ns = Netns::new("cnk-");
    let network = unique("scale-");
    let _cleanup = Cleanup { ns: &ns, network: network.clone() };

    let started = Instant::now();
    let errors = each(&ns, ATTACHMENTS, |i| {
        fw().add_masquerade(&masq(&network, i))?;
        fw().add_portmap(&scale_portmap(&network, i))
    });
    let added = started.elapsed();
    assert!(errors.is_empty(), "{} ADDs failed, first: {:?}", errors.len(), errors.first());

    // The base chains stay as they are however many pods there are, and a pod is elements only
    // (the rules made on demand are one pair per subnet length).
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 0));
    assert_eq!(chains(&ns, "inet", "cni_rs_masq", "mq-"), (1, 0));
    assert_eq!(rules(&ns, "cni_rs_portmap", "dispatch"), 15);
    assert_eq!(rules(&ns, "cni_rs_portmap", "hairpin"), 2);
    assert_eq!(rules(&ns, "cni_rs_portmap", "postrouting"), 1);
    assert_eq!(rules(&ns, "cni_rs_masq", "postrouting"), 3);
    assert_eq!(rules(&ns, "cni_rs_masq", "local"), 1);
    for set in ["dnat4", "own4", "hp4-16", "sp4", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_portmap", set), ATTACHMENTS, "{set}");
    }
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "gate4"), 0);
    for set in ["pods4", "local4-16", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_masq", set), ATTACHMENTS, "{set}");
    }
    let netns = NetNs::open(&ns.path).unwrap();
    netns.run(|| fw().check_portmap(&scale_portmap(&network, ATTACHMENTS - 1))).unwrap().unwrap();
    netns.run(|| fw().check_masquerade(&masq(&network, 0))).unwrap().unwrap();

    // DEL gives the elements an expiry rather than deleting them: masquerade attachment by
    // attachment, port mappings for a sample, and the rest by one GC.
    let started = Instant::now();
    let errors = each(&ns, ATTACHMENTS, |i| {
        let id = format!("scale-{i}");
        fw().del_masquerade(&network, &id, "eth0")?;
        if i % 10 == 0 {
            fw().del_portmap(&network, &id, "eth0")?;
        }
        Ok(())
    });
    let deleted = started.elapsed();
    assert!(errors.is_empty(), "{} DELs failed, first: {:?}", errors.len(), errors.first());
    settle();
    for set in ["dnat4", "own4", "hp4-16", "sp4", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_portmap", set), ATTACHMENTS - ATTACHMENTS.div_ceil(10), "{set}");
    }
    let started = Instant::now();
    netns.run(|| fw().gc_portmap(&network, &[])).unwrap().unwrap();
    let collected = started.elapsed();
    eprintln!(
        "{ATTACHMENTS} attachments on {THREADS} threads: ADD (masquerade + portmap) {added:?}, \
         DEL (masquerade + a tenth of portmap) {deleted:?}, GC of the other port mappings {collected:?}"
    );

    settle();
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 0));
    assert_eq!(chains(&ns, "inet", "cni_rs_masq", "mq-"), (1, 0));
    for set in ["dnat4", "own4", "hp4-16", "sp4", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_portmap", set), 0, "{set}");
    }
    for set in ["pods4", "local4-16", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_masq", set), 0, "{set}");
    }
}

#[test]
fn port_conflicts_repeated_add_and_parallel_del() {
    require_root();
    let ns = Netns::new("cnk-");
    let network = unique("edge-");
    let _cleanup = Cleanup { ns: &ns, network: network.clone() };
    let netns = NetNs::open(&ns.path).unwrap();
    let inside = |f: &dyn Fn() -> libcni::Result<()>| netns.run(f).unwrap();

    let a = portmap(&network, "a", "10.231.0.2/16", vec![tcp(8080)]);
    inside(&|| fw().add_portmap(&a)).unwrap();
    inside(&|| fw().check_portmap(&a)).unwrap();

    // A second container on the same port fails, names the port, and adds nothing.
    let b = portmap(&network, "b", "10.231.0.3/16", vec![tcp(9000), tcp(8080)]);
    let err = inside(&|| fw().add_portmap(&b)).unwrap_err();
    assert_eq!(err.code, 100, "{err}");
    assert!(err.msg.contains("8080/tcp") && !err.msg.contains("9000"), "{err}");
    for set in ["dnat4", "own4", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_portmap", set), 1, "the failed ADD left elements in {set}");
    }
    assert_eq!(inside(&|| fw().check_portmap(&b)).unwrap_err().code, 103);
    // The same port bound to one host address is more specific, and allowed.
    let mut bound = tcp(8080);
    bound.host_ip = Some("198.51.100.7".parse().unwrap());
    let c = portmap(&network, "c", "10.231.0.4/16", vec![bound]);
    inside(&|| fw().add_portmap(&c)).unwrap();
    inside(&|| fw().check_portmap(&c)).unwrap();

    // ADD again with other mappings replaces the old ones: 8080 is free for b afterwards.
    let a2 = portmap(&network, "a", "10.231.0.2/16", vec![tcp(8081), tcp(8082)]);
    inside(&|| fw().add_portmap(&a2)).unwrap();
    inside(&|| fw().check_portmap(&a2)).unwrap();
    assert_eq!(inside(&|| fw().check_portmap(&a)).unwrap_err().code, 103);
    inside(&|| fw().add_portmap(&a2)).unwrap();
    inside(&|| fw().add_portmap(&b)).unwrap();
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "dnat4"), 4);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "hdnat4"), 1);

    // Parallel DELs of one container all succeed, and leave the others alone.
    let errors = each(&ns, 8, |_| fw().del_portmap(&network, "a", "eth0"));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(inside(&|| fw().check_portmap(&a2)).unwrap_err().code, 103);
    inside(&|| fw().check_portmap(&b)).unwrap();
    settle();
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "dnat4"), 2);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "owners"), 2);
    // Its ports are free again at once (a new ADD waits out the expiry if it must).
    let e = portmap(&network, "e", "10.231.0.9/16", vec![tcp(8081)]);
    inside(&|| fw().add_portmap(&e)).unwrap();
    inside(&|| fw().check_portmap(&e)).unwrap();
    inside(&|| fw().del_portmap(&network, "e", "eth0")).unwrap();

    // GC keeps only c; then nothing of the network is left.
    let keep = [Attachment { container_id: "c".into(), ifname: "eth0".into() }];
    inside(&|| fw().gc_portmap(&network, &keep)).unwrap();
    inside(&|| fw().check_portmap(&c)).unwrap();
    settle();
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "owners"), 1);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "dnat4"), 0);
    inside(&|| fw().del_portmap(&network, "c", "eth0")).unwrap();
    inside(&|| fw().del_portmap(&network, "c", "eth0")).unwrap();
    settle();
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 0));
    for set in ["dnat4", "hdnat4", "own4", "hown4", "hp4-16", "hhp4-16", "sp4", "hsp4", "owners"] {
        assert_eq!(elements(&ns, "inet", "cni_rs_portmap", set), 0, "{set}");
    }
}

#[test]
fn reused_address() {
    require_root();
    let ns = Netns::new("cnk-");
    let network = unique("reuse-");
    let _cleanup = Cleanup { ns: &ns, network: network.clone() };
    let netns = NetNs::open(&ns.path).unwrap();
    let inside = |f: &dyn Fn() -> libcni::Result<()>| netns.run(f).unwrap();

    // A stale container still holds the address a new one got: the new one takes it over, and the
    // stale one's DEL leaves the new one's element alone.
    let stale = Masquerade {
        network: network.clone(),
        container_id: "stale".into(),
        ifname: "eth0".into(),
        addresses: vec!["10.232.0.5/24".parse().unwrap()],
    };
    let fresh = Masquerade { container_id: "fresh".into(), ..stale.clone() };
    inside(&|| fw().add_masquerade(&stale)).unwrap();
    inside(&|| fw().add_masquerade(&fresh)).unwrap();
    inside(&|| fw().check_masquerade(&fresh)).unwrap();
    assert_eq!(inside(&|| fw().check_masquerade(&stale)).unwrap_err().code, 103);
    inside(&|| fw().del_masquerade(&network, "stale", "eth0")).unwrap();
    inside(&|| fw().check_masquerade(&fresh)).unwrap();
    inside(&|| fw().del_masquerade(&network, "fresh", "eth0")).unwrap();
    settle();
    assert_eq!(elements(&ns, "inet", "cni_rs_masq", "pods4"), 0);
    assert_eq!(chains(&ns, "inet", "cni_rs_masq", "mq-"), (1, 0));
}

/// conditionsV4/V6 are nft syntax the backend does not compile: such a pod has a chain of its own
/// (written by `nft`), reached through gate elements, and its ports are held in the same owner
/// maps as everyone's (conflicts, DEL, GC alike).
#[test]
fn conditions_have_a_chain_of_their_own() {
    require_root();
    let ns = Netns::new("cnk-");
    let network = unique("cond-");
    let _cleanup = Cleanup { ns: &ns, network: network.clone() };
    let netns = NetNs::open(&ns.path).unwrap();
    let inside = |f: &dyn Fn() -> libcni::Result<()>| netns.run(f).unwrap();

    let mut a = portmap(&network, "a", "10.233.0.2/16", vec![tcp(8080), tcp(8081)]);
    a.conditions_v4 = vec!["ip saddr != 10.0.0.0/8".into(), "meta mark != 0x10".into()];
    // The first ADD on the node: the shared setup is added too.
    inside(&|| fw().add_portmap(&a)).unwrap();
    inside(&|| fw().check_portmap(&a)).unwrap();
    let dnat: Vec<String> = {
        let v = nft_json(&ns, &["list", "table", "inet", "cni_rs_portmap"]);
        items(&v, "rule")
            .iter()
            .filter(|r| r["chain"].as_str().is_some_and(|c| c.starts_with("pm-")))
            .map(|r| r.to_string())
            .collect()
    };
    assert_eq!(dnat.len(), 2, "{dnat:?}");
    assert!(dnat.iter().all(|r| r.contains("10.0.0.0") && r.contains("mark")), "{dnat:?}");

    // A pod without conditions on a port the one with conditions holds: the same conflict.
    let b = portmap(&network, "b", "10.233.0.3/16", vec![tcp(8081)]);
    let err = inside(&|| fw().add_portmap(&b)).unwrap_err();
    assert!(err.msg.contains("8081/tcp"), "{err}");
    // And the other way round.
    let c = portmap(&network, "c", "10.233.0.4/16", vec![tcp(9090)]);
    inside(&|| fw().add_portmap(&c)).unwrap();
    let mut d = portmap(&network, "d", "10.233.0.5/16", vec![tcp(9090)]);
    d.conditions_v4 = a.conditions_v4.clone();
    let err = inside(&|| fw().add_portmap(&d)).unwrap_err();
    assert_eq!(err.code, 100, "{err}");
    assert!(err.msg.contains("9090/tcp"), "{err}");

    // Repeated ADD with other mappings, then DEL (twice).
    a.mappings = vec![tcp(8082)];
    inside(&|| fw().add_portmap(&a)).unwrap();
    inside(&|| fw().check_portmap(&a)).unwrap();
    inside(&|| fw().add_portmap(&b)).unwrap();
    inside(&|| fw().del_portmap(&network, "a", "eth0")).unwrap();
    inside(&|| fw().del_portmap(&network, "a", "eth0")).unwrap();
    assert_eq!(inside(&|| fw().check_portmap(&a)).unwrap_err().code, 103);
    inside(&|| fw().check_portmap(&b)).unwrap();
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 0));
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "gate4"), 0);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "dnat4"), 2);
    // Pods with and without conditions go by GC.
    d.mappings = vec![tcp(7070)];
    inside(&|| fw().add_portmap(&d)).unwrap();
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "gate4"), 1);
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 1));
    inside(&|| fw().gc_portmap(&network, &[])).unwrap();
    settle();
    assert_eq!(chains(&ns, "inet", "cni_rs_portmap", "pm-"), (4, 0));
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "gate4"), 0);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "dnat4"), 0);
    assert_eq!(elements(&ns, "inet", "cni_rs_portmap", "owners"), 0);
}
