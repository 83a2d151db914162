#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The core attach path through our libcni: bridge + host-local + loopback, on every spec version.
//! Privileged: makes its own namespaces and bridges and removes them even when an assertion fails.

use cni_tests::{bin_dir, bridge_ports, pings, reservations, sh, unique, LinkGuard, Netns, TempDir};
use libcni::conf::Attachment;
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::version::{at_least, SUPPORTED};
use serde_json::json;
use std::path::Path;

struct Net {
    list: NetworkConfigList,
    cni: CniConfig,
    data: TempDir,
    _cache: TempDir,
    bridge: LinkGuard,
}

/// A dual-stack bridge network on its own bridge and subnets (`n` keeps parallel tests apart).
fn network(version: &str, n: u8, v4_prefix: u8, extra_ranges: bool) -> Net {
    let bridge = unique("cnt");
    let name = unique("net");
    let data = TempDir::new("cnt-ipam");
    let cache = TempDir::new("cnt-cache");
    let mut ranges = vec![json!([{ "subnet": format!("10.{}.{n}.0/{v4_prefix}", 200) }])];
    if extra_ranges {
        ranges.push(json!([{ "subnet": format!("fd00:200:{n}::/64") }]));
    }
    let list = json!({
        "cniVersion": version,
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "isDefaultGateway": true,
                "ipam": { "type": "host-local", "ranges": ranges, "dataDir": data.path() }
            },
            { "type": "loopback" }
        ]
    });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
    Net { list, cni, data, _cache: cache, bridge: LinkGuard(bridge) }
}

impl Net {
    /// Run the plugins found in `dir` instead of the build's, with the same cache.
    fn use_plugins(&mut self, dir: &Path) {
        self.cni = CniConfig::with_cache_dir(vec![dir.to_path_buf()], self._cache.path().to_path_buf());
    }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf { container_id: unique("ctr"), netns: ns.path.clone(), ifname: "eth0".into(), ..Default::default() }
}

#[test]
fn bridge_host_local_loopback_on_every_version() {
    for (i, version) in SUPPORTED.iter().enumerate() {
        attach_detach(version, 10 + i as u8);
    }
}

/// The multi-call binary as a node gets it (install/, tests/bench.sh): one `cni-rs` with a hard
/// link per plugin name. bridge then runs its IPAM call in process, host-local being the same file
/// as itself (libcni's unit tests show that path is the one taken); everything must work as it does
/// with the separate binaries.
#[test]
fn multi_call_binary_with_hard_links() {
    // Hard links need the file system of the build: the directory goes next to the binaries.
    let links = TempDir(bin_dir().join(unique("multicall")));
    std::fs::create_dir_all(links.path()).expect("link dir");
    for name in ["bridge", "host-local", "loopback"] {
        std::fs::hard_link(bin_dir().join("cni-rs"), links.path().join(name)).expect("hard link to cni-rs");
    }
    attach_detach_with(SUPPORTED[SUPPORTED.len() - 1], 30, Some(links.path()));

    // An IPAM failure in process is reported as from a process (host-local's code 101 passed
    // through), and bridge undoes its veth: a /30 has one address for pods.
    let mut small = network("1.1.0", 31, 30, false);
    small.use_plugins(links.path());
    let (pod1, pod2) = (Netns::new("cntm"), Netns::new("cntn"));
    let (rt1, rt2) = (rt(&pod1), rt(&pod2));
    small.cni.add_network_list(&small.list, &rt1).expect("ADD of the only pod that fits");
    let e = small.cni.add_network_list(&small.list, &rt2).expect_err("the /30 is full");
    assert_eq!(e.code, libcni::code::RANGE_EXHAUSTED, "{e}");
    assert!(!pod2.exec("ip", &["link", "show", "eth0"]).status.success(), "eth0 left after the failed ADD");
    assert_eq!(reservations(small.data.path(), &small.list.name).len(), 1, "the failed ADD kept an address");
    small.cni.del_network_list(&small.list, &rt1).expect("DEL");
    assert!(reservations(small.data.path(), &small.list.name).is_empty(), "DEL left the address");
}

fn attach_detach(version: &str, n: u8) {
    attach_detach_with(version, n, None)
}

fn attach_detach_with(version: &str, n: u8, plugins: Option<&Path>) {
    let mut net = network(version, n, 24, true);
    if let Some(dir) = plugins {
        net.use_plugins(dir);
    }
    let pod1 = Netns::new("cntp");
    let mut pod2 = Netns::new("cntq");
    let (rt1, rt2) = (rt(&pod1), rt(&pod2));

    let r1 = net.cni.add_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
    let r2 = net.cni.add_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{version}: ADD pod2: {e}"));
    let v4 =
        |r: &libcni::CniResult| r.ips.iter().find(|ip| ip.address.is_ipv4()).map(|ip| ip.address.ip()).expect("v4");
    let v6 =
        |r: &libcni::CniResult| r.ips.iter().find(|ip| ip.address.is_ipv6()).map(|ip| ip.address.ip()).expect("v6");
    let (a1, a2) = (v4(&r1), v4(&r2));
    assert_ne!(a1, a2, "{version}: two pods got one address");
    let gw4 = format!("10.200.{n}.1");
    let gw6 = format!("fd00:200:{n}::1");

    // Addresses, lo, and the default routes are really in the namespace.
    let addrs = pod1.sh("ip", &["-o", "addr", "show", "eth0"]);
    assert!(addrs.contains(&format!("{a1}/24")), "{version}: {addrs}");
    assert!(addrs.contains(&format!("{}/64", v6(&r1))), "{version}: {addrs}");
    assert!(pod1.sh("ip", &["link", "show", "lo"]).contains("UP"), "{version}: lo is down");
    let routes = pod1.sh("ip", &["route"]);
    assert!(routes.contains(&format!("default via {gw4} dev eth0")), "{version}: {routes}");
    let routes6 = pod1.sh("ip", &["-6", "route"]);
    assert!(routes6.contains(&format!("default via {gw6} dev eth0")), "{version}: {routes6}");
    let bridge_addrs = sh("ip", &["-o", "addr", "show", &net.bridge.0]);
    assert!(bridge_addrs.contains(&format!("{gw4}/24")), "{version}: {bridge_addrs}");

    // Real traffic: the gateway, the other pod, over both families.
    assert!(pings(&pod1, &gw4), "{version}: pod1 cannot ping its gateway {gw4}");
    assert!(pings(&pod1, &a2.to_string()), "{version}: pod1 cannot ping pod2 {a2}");
    assert!(pings(&pod2, &v6(&r1).to_string()), "{version}: pod2 cannot ping pod1 over IPv6");
    assert!(pings(&pod2, &gw6), "{version}: pod2 cannot ping its IPv6 gateway {gw6}");
    // The host ends carry the pods' IPv6 at layer 2 and have none of their own: no link-local
    // address, no routes in the host's table.
    let ports = bridge_ports(&net.bridge.0);
    assert_eq!(ports.len(), 2, "{version}: {ports:?}");
    for port in &ports {
        let off = std::fs::read_to_string(format!("/proc/sys/net/ipv6/conf/{port}/disable_ipv6")).expect("sysctl");
        assert_eq!(off.trim(), "1", "{version}: IPv6 left on for host port {port}");
        assert!(sh("ip", &["-6", "-o", "addr", "show", "dev", port]).trim().is_empty(), "{version}: {port} has IPv6");
        let routes = sh("ip", &["-6", "route", "show", "table", "all", "dev", port]);
        assert!(routes.trim().is_empty(), "{version}: IPv6 routes through {port}: {routes}");
    }

    if at_least(version, "0.4.0") {
        net.cni.check_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
    }
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 4, "{version}");

    // DEL removes it all; a second DEL succeeds.
    net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
    assert!(!pod1.exec("ip", &["link", "show", "eth0"]).status.success(), "{version}: eth0 survived DEL");
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 2, "{version}: pod1's addresses not released");
    net.cni.del_network_list(&net.list, &rt1).unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));

    // DEL after the namespace is gone still frees the addresses.
    pod2.delete();
    net.cni.del_network_list(&net.list, &rt2).unwrap_or_else(|e| panic!("{version}: DEL without netns: {e}"));
    assert!(reservations(net.data.path(), &net.list.name).is_empty(), "{version}: addresses leaked");
    // The kernel destroys a deleted namespace's veth pairs asynchronously: give it a moment.
    let mut ports = Vec::new();
    for _ in 0..50 {
        ports = bridge_ports(&net.bridge.0);
        if ports.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ports.is_empty(), "{version}: ports left on the bridge: {ports:?}");
}

#[test]
fn thirty_parallel_adds_get_distinct_addresses() {
    let net = network("1.1.0", 40, 24, false);
    let pods: Vec<Netns> = (0..30).map(|_| Netns::new("cntr")).collect();
    let rts: Vec<RuntimeConf> = pods.iter().map(rt).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = rts.iter().map(|r| s.spawn(|| net.cni.add_network_list(&net.list, r))).collect();
        handles.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let mut addrs: Vec<String> = results
        .into_iter()
        .map(|r| r.unwrap_or_else(|e| panic!("parallel ADD: {e}")).ips[0].address.ip().to_string())
        .collect();
    addrs.sort();
    addrs.dedup();
    assert_eq!(addrs.len(), 30, "addresses handed out twice");
    assert_eq!(reservations(net.data.path(), &net.list.name).len(), 30);
    std::thread::scope(|s| {
        for r in &rts {
            let net = &net;
            s.spawn(move || net.cni.del_network_list(&net.list, r).unwrap_or_else(|e| panic!("parallel DEL: {e}")));
        }
    });
    assert!(reservations(net.data.path(), &net.list.name).is_empty(), "reservations left after DEL");
}

#[test]
fn gc_keeps_exactly_the_valid_attachments_and_status_reports_exhaustion() {
    let net = network("1.1.0", 50, 24, false);
    let pods: Vec<Netns> = (0..3).map(|_| Netns::new("cntg")).collect();
    let rts: Vec<RuntimeConf> = pods.iter().map(rt).collect();
    for r in &rts {
        net.cni.add_network_list(&net.list, r).expect("ADD");
    }
    // Lose the runtime's cache of the third pod: only the plugins' own GC can find its address.
    let cache = net.cni.cache_dir.join("results").join(format!("{}-{}-eth0", net.list.name, rts[2].container_id));
    std::fs::remove_file(&cache).expect("remove cache file");
    let keep = [Attachment { container_id: rts[0].container_id.clone(), ifname: "eth0".into() }];
    net.cni.gc_network_list(&net.list, Some(&keep)).expect("GC");
    let left = reservations(net.data.path(), &net.list.name);
    assert_eq!(left.len(), 1, "GC kept {left:?}");
    let kept = std::fs::read_to_string(net.data.path().join(&net.list.name).join(&left[0].0)).expect("read");
    assert!(kept.starts_with(&rts[0].container_id), "GC kept the wrong reservation: {kept}");
    net.cni.status_network_list(&net.list).expect("STATUS on a network with room");
    net.cni.del_network_list(&net.list, &rts[0]).expect("DEL");

    // A /30 holds one pod besides the gateway: after that STATUS says 50.
    let small = network("1.1.0", 51, 30, false);
    let pod = Netns::new("cnts");
    let r = rt(&pod);
    small.cni.add_network_list(&small.list, &r).expect("ADD into /30");
    let err = small.cni.status_network_list(&small.list).expect_err("STATUS must fail on an exhausted range");
    assert_eq!(err.code, 50, "{err}");
    small.cni.del_network_list(&small.list, &r).expect("DEL");
    small.cni.status_network_list(&small.list).expect("STATUS after the range has room again");
}
