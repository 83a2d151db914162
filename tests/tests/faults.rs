//! Fault injection: bridge and host-local built with the `fault-injection` feature are killed
//! (kill -9) or made to fail after each state-changing step of ADD. A killed ADD followed by DEL,
//! and a failed ADD on its own, must leave no link, reservation or firewall rule. A full disk under
//! the dataDir fails ADD cleanly. Privileged; subnets 10.211.x.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bridge_ports, require_root, run, sh, unique, LinkGuard, Mount, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};

/// Every fault point of bridge ADD, in order, then host-local's.
const BRIDGE_STEPS: [&str; 7] = [
    "bridge-ensured",
    "veth-created",
    "port-configured",
    "ipam-done",
    "container-configured",
    "gateway-set",
    "masquerade-added",
];
const HOST_LOCAL_STEPS: [&str; 2] = ["host-local-reserved", "host-local-allocated"];

fn fault_bin_dir() -> &'static Path {
    cni_tests::fault_injection_bin_dir()
}

/// A CNI_PATH whose plugins run the fault-injection builds with `var=step` in their environment
/// (the runtime API passes no extra variables, and the test process's own must not change).
struct FaultPath(TempDir);

impl FaultPath {
    fn new(var: &str, step: &str) -> FaultPath {
        let dir = TempDir::new("cnfw");
        for plugin in ["bridge", "host-local"] {
            let real = fault_bin_dir().join(plugin);
            let script = format!("#!/bin/sh\n{var}='{step}' exec '{}' \"$@\"\n", real.display());
            let path = dir.path().join(plugin);
            std::fs::write(&path, script).expect("write wrapper");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        FaultPath(dir)
    }
}

struct Net {
    list: NetworkConfigList,
    cni: CniConfig,
    subnet: String,
    data: TempDir,
    _cache: TempDir,
    bridge: LinkGuard,
    _path: FaultPath,
}

fn next_subnet() -> String {
    static N: AtomicU8 = AtomicU8::new(0);
    format!("10.211.{}", N.fetch_add(1, Ordering::Relaxed))
}

/// bridge + host-local with a gateway and masquerade, run through `path`; `host_local_only` makes
/// a list of host-local alone (a kill inside it then kills the top-level plugin).
fn network(path: FaultPath, backend: &str, host_local_only: bool) -> Net {
    let bridge = unique("cnf");
    let data = TempDir::new("cnf-ipam");
    let cache = TempDir::new("cnf-cache");
    let subnet = next_subnet();
    let ipam =
        json!({ "type": "host-local", "ranges": [[{ "subnet": format!("{subnet}.0/24") }]], "dataDir": data.path() });
    let plugin = if host_local_only {
        json!({ "type": "host-local", "ipam": ipam })
    } else {
        json!({ "type": "bridge", "bridge": bridge, "isGateway": true, "isDefaultGateway": true,
                "ipMasq": true, "ipMasqBackend": backend, "ipam": ipam })
    };
    let list = json!({ "cniVersion": "1.1.0", "name": unique("netf"), "plugins": [plugin] });
    let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).expect("conflist");
    let cni = CniConfig::with_cache_dir(vec![path.0.path().to_path_buf()], cache.path().to_path_buf());
    Net { list, cni, subnet, data, _cache: cache, bridge: LinkGuard(bridge), _path: path }
}

fn rt(ns: &Netns) -> RuntimeConf {
    RuntimeConf { container_id: unique("ctf"), netns: ns.path.clone(), ifname: "eth0".into(), ..Default::default() }
}

fn reservations(data: &Path, network: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(data.join(network)) else { return vec![] };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok() || n.starts_with(".host-local-tmp"))
        .collect()
}

fn rulesets() -> String {
    let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    let ipt = String::from_utf8_lossy(&run("iptables-save", &[]).stdout).into_owned();
    format!("{nft}\n{ipt}")
}

/// No host veth, no port on the bridge, no pod interface, no reservation, no rule of this pod.
fn assert_clean(what: &str, net: &Net, pod: &Netns, r: &RuntimeConf) {
    let veth = bridge::host_veth_name(&r.container_id, &r.ifname, 0);
    assert!(!run("ip", &["link", "show", &veth]).status.success(), "{what}: host veth {veth} left");
    let ports = bridge_ports(&net.bridge.0);
    assert!(ports.is_empty(), "{what}: ports left on the bridge: {ports:?}");
    let links = pod.sh("ip", &["-o", "link", "show"]);
    assert_eq!(links.lines().count(), 1, "{what}: pod interface left:\n{links}");
    let left = reservations(net.data.path(), &net.list.name);
    assert!(left.is_empty(), "{what}: reservations left: {left:?}");
    let rules = rulesets();
    assert!(!rules.contains(&r.container_id), "{what}: a rule of the container is left:\n{rules}");
    assert!(!rules.contains(&format!("{}.", net.subnet)), "{what}: a rule of the pod subnet is left:\n{rules}");
}

/// kill -9 at each step of ADD, then DEL through the runtime API: nothing remains.
#[test]
fn killed_add_then_del_leaves_nothing() {
    require_root();
    for (i, step) in BRIDGE_STEPS.iter().chain(&HOST_LOCAL_STEPS).enumerate() {
        let backend = if i % 2 == 0 { "nftables" } else { "iptables" };
        let net = network(FaultPath::new("CNI_RS_FAULT_AT", step), backend, false);
        let pod = Netns::new("cnfk");
        let r = rt(&pod);
        let err = net.cni.add_network_list(&net.list, &r).expect_err("a killed ADD fails");
        assert_eq!(err.code, 102, "{step}: {err}");
        if BRIDGE_STEPS.contains(step) {
            assert!(err.msg.contains("signal"), "{step}: the plugin was not killed: {err}");
        }
        net.cni.del_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{step}: DEL after kill: {e}"));
        assert_clean(&format!("kill at {step} + DEL"), &net, &pod, &r);
    }
}

/// host-local killed right after reserving, called on its own: DEL releases the reservation.
#[test]
fn killed_host_local_then_del_releases() {
    require_root();
    for step in HOST_LOCAL_STEPS {
        let net = network(FaultPath::new("CNI_RS_FAULT_AT", step), "nftables", true);
        let pod = Netns::new("cnfh");
        let r = rt(&pod);
        let err = net.cni.add_network_list(&net.list, &r).expect_err("a killed ADD fails");
        assert!(err.code == 102 && err.msg.contains("signal"), "{step}: {err}");
        let held = reservations(net.data.path(), &net.list.name);
        assert_eq!(held.len(), 1, "{step}: the kill came after the reservation: {held:?}");
        let content = std::fs::read_to_string(net.data.path().join(&net.list.name).join(&held[0])).expect("read");
        assert_eq!(content, format!("{}\r\neth0", r.container_id), "{step}: a reservation is whole or absent");
        net.cni.del_network_list(&net.list, &r).unwrap_or_else(|e| panic!("{step}: DEL: {e}"));
        assert!(reservations(net.data.path(), &net.list.name).is_empty(), "{step}: DEL left the reservation");
    }
}

/// An ADD that fails at step k undoes steps 1..k-1 itself: nothing remains without any DEL. A
/// host-local killed under bridge is such a failure for bridge, which must release the address.
#[test]
fn failed_add_undoes_itself() {
    require_root();
    let cases = BRIDGE_STEPS
        .iter()
        .chain(&HOST_LOCAL_STEPS)
        .map(|s| ("CNI_RS_FAIL_AT", *s))
        .chain(HOST_LOCAL_STEPS.iter().map(|s| ("CNI_RS_FAULT_AT", *s)));
    for (i, (var, step)) in cases.enumerate() {
        let backend = if i % 2 == 0 { "iptables" } else { "nftables" };
        let net = network(FaultPath::new(var, step), backend, false);
        let pod = Netns::new("cnfu");
        let r = rt(&pod);
        let err = net.cni.add_network_list(&net.list, &r).expect_err("the injected failure fails ADD");
        if var == "CNI_RS_FAIL_AT" {
            assert_eq!(err.code, 5, "{step}: {err}");
            assert!(err.msg.contains(step), "{step}: {err}");
        }
        assert_clean(&format!("{var}={step}, no DEL"), &net, &pod, &r);
        assert!(net.cni.get_cached_result(&net.list, &r).expect("cache").is_none(), "{step}: a failed ADD was cached");
    }
    // Without a fault variable the same builds work: the points are otherwise inert.
    let net = network(FaultPath::new("CNI_RS_FAIL_AT", "no-such-step"), "nftables", false);
    let pod = Netns::new("cnfo");
    let r = rt(&pod);
    net.cni.add_network_list(&net.list, &r).expect("ADD with no matching fault point");
    net.cni.del_network_list(&net.list, &r).expect("DEL");
    assert_clean("ADD + DEL", &net, &pod, &r);
}

/// A full disk under the dataDir: ADD fails with code 5 and a clear message, and leaves neither a
/// half-written reservation nor a veth.
#[test]
fn full_disk_fails_add_cleanly() {
    require_root();
    let net = network(FaultPath::new("CNI_RS_FAIL_AT", "none"), "nftables", false);
    let mount = Mount::tmpfs(net.data.path(), "16k");
    std::fs::create_dir_all(net.data.path().join(&net.list.name)).expect("network dir");
    mount.fill();
    let pod = Netns::new("cnfd");
    let r = rt(&pod);
    let err = net.cni.add_network_list(&net.list, &r).expect_err("ADD on a full disk");
    assert_eq!(err.code, 5, "{err}");
    assert!(err.msg.contains("No space left on device"), "{err}");
    let names: Vec<String> = std::fs::read_dir(net.data.path().join(&net.list.name))
        .expect("read")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    // The lock, and the boot marker the first ADD of a boot writes (an empty file: its name is the
    // record) once it has released earlier boots' reservations; no reservation.
    let own = |n: &String| n == "lock" || n.starts_with("last_reserved_ip") || n.starts_with(".cni-rs-boot.");
    assert!(names.iter().all(own), "{names:?}");
    assert_clean("full disk", &net, &pod, &r);
    net.cni.del_network_list(&net.list, &r).expect("DEL on a full disk");
    drop(mount);
}

/// One call of the host-local binary; (exit code, stdout).
fn host_local(command: &str, conf: &serde_json::Value, container_id: &str, netns: &Netns) -> (i32, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(cni_tests::bin_dir().join("host-local"))
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", container_id)
        .env("CNI_NETNS", &netns.path)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_tests::bin_dir())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn host-local");
    child.stdin.take().expect("stdin").write_all(conf.to_string().as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A dataDir remounted read-only, as ext4 does after an I/O error: DEL succeeds when the attachment
/// holds nothing there (also where no lock file exists) and names what it could not release
/// otherwise; GC fails only when it had something to release; STATUS reports the store unwritable.
#[test]
fn read_only_data_dir_del_and_gc() {
    require_root();
    let data = TempDir::new("cnf-ro");
    let mount = Mount::tmpfs(data.path(), "1m");
    let pod = Netns::new("cnfr");
    let conf = |name: &str| {
        json!({ "cniVersion": "1.1.0", "name": name, "type": "host-local",
                "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.211.200.0/24" }]], "dataDir": data.path() } })
    };
    let (net, bare) = (unique("netro"), unique("netro"));
    let (code, out) = host_local("ADD", &conf(&net), "held", &pod);
    assert_eq!(code, 0, "ADD: {out}");
    // Written by hand (or by a plugin that never ran DEL): no lock file.
    std::fs::create_dir(data.path().join(&bare)).expect("mkdir");
    std::fs::write(data.path().join(&bare).join("10.211.200.9"), "other\r\neth0").expect("write");
    sh("mount", &["-o", "remount,ro", &mount.0.display().to_string()]);

    for name in [&net, &bare] {
        let (code, out) = host_local("DEL", &conf(name), "nobody", &pod);
        assert_eq!(code, 0, "DEL of an attachment holding nothing in {name}: {out}");
    }
    let reservation = data.path().join(&net).join("10.211.200.2");
    let (code, out) = host_local("DEL", &conf(&net), "held", &pod);
    assert_eq!(code, 1, "DEL of a held address on a read-only store: {out}");
    let err: serde_json::Value = serde_json::from_str(&out).expect("error JSON");
    assert_eq!(err["code"], 5, "{out}");
    assert!(err["msg"].as_str().unwrap_or_default().contains(&reservation.display().to_string()), "{out}");
    assert!(reservation.is_file());

    let mut gc = conf(&net);
    gc["cni.dev/valid-attachments"] = json!([{ "containerID": "held", "ifname": "eth0" }]);
    let (code, out) = host_local("GC", &gc, "", &pod);
    assert_eq!(code, 0, "GC with nothing to release: {out}");
    gc["cni.dev/valid-attachments"] = json!([]);
    let (code, out) = host_local("GC", &gc, "", &pod);
    assert_eq!(code, 1, "GC with something to release: {out}");
    assert!(out.contains("\"code\":5") || out.contains("\"code\": 5"), "{out}");
    assert!(out.contains(&reservation.display().to_string()), "{out}");

    let (code, out) = host_local("STATUS", &conf(&net), "", &pod);
    assert_eq!(code, 1, "STATUS on a read-only store: {out}");
    assert!(out.contains("\"code\": 50") && out.contains("Read-only file system"), "{out}");
    drop(mount);
}
