//! tuning in real network namespaces: sysctls and link attributes as the kernel reports them
//! (`ip -j link`, /proc/sys inside the pod), the saved file on disk, the Debian reference tuning
//! (/usr/lib/cni/tuning, 1.1.1) as a peer sharing that file, and the allowlist file at its real
//! path inside a private mount namespace. Needs root, iproute2 and util-linux `unshare`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{json_of, Call};
use cni_tests::{bin_dir, sh, unique, LinkGuard, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use libcni::version::{at_least, SUPPORTED};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

const REFERENCE: &str = "/usr/lib/cni/tuning";

fn ours() -> PathBuf {
    bin_dir().join("tuning")
}

/// Runs a plugin binary (optionally through a wrapper command), returning (exit code, stdout JSON).
fn run_with(
    wrapper: &[&str],
    bin: &Path,
    cmd: &str,
    ns: &str,
    cid: &str,
    conf: &Value,
    cni_args: &str,
) -> (i32, Value) {
    let mut argv: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
    argv.push(bin.display().to_string());
    let mut command = Command::new(&argv[0]);
    command.args(&argv[1..]);
    let out = Call::new(cmd, cid, ns).path(bin_dir()).args(cni_args).run(command, conf);
    (out.status.code().unwrap_or(-1), json_of(&out.stdout))
}

fn run(bin: &Path, cmd: &str, ns: &Netns, cid: &str, conf: &Value) -> (i32, Value) {
    run_with(&[], bin, cmd, &ns.path, cid, conf, "")
}

/// A pod namespace with `eth0` (one end of a veth pair) at known values.
fn pod() -> Netns {
    let ns = Netns::new("tun");
    ns.sh("ip", &["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"]);
    ns.sh("ip", &["link", "set", "eth0", "address", "02:11:22:33:44:55", "mtu", "1500", "txqueuelen", "1000"]);
    ns.sh("ip", &["link", "set", "eth0", "up"]);
    ns
}

#[derive(Debug, PartialEq, Eq)]
struct Attrs {
    mac: String,
    mtu: u64,
    promisc: bool,
    allmulti: bool,
    txqlen: u64,
}

fn attrs(ns: &Netns) -> Attrs {
    let out = ns.sh("ip", &["-j", "-d", "link", "show", "eth0"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let l = &v[0];
    let flags: Vec<&str> = l["flags"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    Attrs {
        mac: l["address"].as_str().unwrap().to_string(),
        mtu: l["mtu"].as_u64().unwrap(),
        promisc: flags.contains(&"PROMISC"),
        allmulti: flags.contains(&"ALLMULTI"),
        txqlen: l["txqlen"].as_u64().unwrap(),
    }
}

fn original() -> Attrs {
    Attrs { mac: "02:11:22:33:44:55".into(), mtu: 1500, promisc: false, allmulti: false, txqlen: 1000 }
}

fn sysctl(ns: Option<&Netns>, path: &str) -> String {
    let p = format!("/proc/sys/{path}");
    match ns {
        Some(ns) => ns.sh("cat", &[&p]).trim().to_string(),
        None => std::fs::read_to_string(&p).unwrap().trim().to_string(),
    }
}

fn prev_result(version: &str, ns: &Netns) -> Value {
    if !at_least(version, "0.3.0") {
        return json!({ "cniVersion": version, "ip4": { "ip": "10.9.9.2/24" } });
    }
    let mut ip = json!({ "address": "10.9.9.2/24", "interface": 0 });
    if !at_least(version, "1.0.0") {
        ip["version"] = json!("4");
    }
    json!({
        "cniVersion": version,
        "interfaces": [{ "name": "eth0", "mac": "02:11:22:33:44:55", "sandbox": ns.path }],
        "ips": [ip]
    })
}

fn conf(version: &str, ns: &Netns, data: &Path, keys: Value) -> Value {
    let mut c = json!({
        "cniVersion": version, "name": unique("tnet"), "type": "tuning",
        "dataDir": data, "prevResult": prev_result(version, ns)
    });
    for (k, v) in keys.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn saved_file(data: &Path, cid: &str) -> PathBuf {
    data.join(format!("{cid}_eth0.json"))
}

/// A somaxconn value the host does not have, so leaking it to the host would show.
fn somaxconn_not_host() -> String {
    let host: u64 = sysctl(None, "net/core/somaxconn").parse().unwrap();
    (if host == 4242 { 4243 } else { 4242 }).to_string()
}

#[test]
fn every_version_sets_checks_and_restores() {
    for version in SUPPORTED {
        let ns = pod();
        let data = TempDir::new("tun-data");
        let cid = unique("ctr");
        let host_before = sysctl(None, "net/core/somaxconn");
        let host_arp = sysctl(None, "net/ipv4/conf/all/arp_ignore");
        let value = somaxconn_not_host();
        let c = conf(
            version,
            &ns,
            data.path(),
            json!({
                "sysctl": { "net.core.somaxconn": value, "net.ipv4.conf.IFNAME.arp_ignore": "2" },
                "mac": "0a:58:0a:f4:01:02", "mtu": 1400, "promisc": true, "allmulti": true, "txQLen": 77
            }),
        );
        let (rc, out) = run(&ours(), "ADD", &ns, &cid, &c);
        assert_eq!(rc, 0, "{version}: ADD: {out}");
        assert_eq!(out["cniVersion"], json!(version), "{version}: {out}");
        if at_least(version, "0.3.0") {
            assert_eq!(out["interfaces"][0]["mac"], json!("0a:58:0a:f4:01:02"), "{version}: {out}");
        }
        // In the pod: the sysctls (IFNAME is eth0) and every attribute.
        assert_eq!(sysctl(Some(&ns), "net/core/somaxconn"), value, "{version}");
        assert_eq!(sysctl(Some(&ns), "net/ipv4/conf/eth0/arp_ignore"), "2", "{version}");
        assert_eq!(
            attrs(&ns),
            Attrs { mac: "0a:58:0a:f4:01:02".into(), mtu: 1400, promisc: true, allmulti: true, txqlen: 77 },
            "{version}"
        );
        // The host is untouched.
        assert_eq!(sysctl(None, "net/core/somaxconn"), host_before, "{version}: host somaxconn changed");
        assert_eq!(sysctl(None, "net/ipv4/conf/all/arp_ignore"), host_arp, "{version}");
        // The originals, in the reference's file.
        let saved: Value = serde_json::from_slice(&std::fs::read(saved_file(data.path(), &cid)).unwrap()).unwrap();
        assert_eq!(
            saved,
            json!({"mac": "02:11:22:33:44:55", "promisc": false, "mtu": 1500, "allmulti": false, "txQLen": 1000})
        );
        if at_least(version, "0.4.0") {
            let (rc, out) = run(&ours(), "CHECK", &ns, &cid, &c);
            assert_eq!(rc, 0, "{version}: CHECK: {out}");
        }
        for _ in 0..2 {
            let (rc, out) = run(&ours(), "DEL", &ns, &cid, &c);
            assert_eq!(rc, 0, "{version}: DEL: {out}");
            assert_eq!(attrs(&ns), original(), "{version}: DEL did not restore");
            assert!(!saved_file(data.path(), &cid).exists(), "{version}: saved file left");
        }
        // Sysctls are not restored (as the reference): they go with the namespace.
        assert_eq!(sysctl(Some(&ns), "net/core/somaxconn"), value);
    }
}

#[test]
fn check_finds_drift_in_every_value() {
    let ns = pod();
    let data = TempDir::new("tun-data");
    let cid = unique("ctr");
    let c = conf(
        "1.1.0",
        &ns,
        data.path(),
        json!({ "sysctl": { "net.ipv4.conf.IFNAME.arp_ignore": "2" }, "mac": "0a:58:0a:f4:01:02", "mtu": 1400,
                "promisc": true, "allmulti": true, "txQLen": 77 }),
    );
    assert_eq!(run(&ours(), "ADD", &ns, &cid, &c).0, 0);
    let drifts: [(&[&str], &[&str], &str); 6] = [
        (
            &["sysctl", "-w", "net.ipv4.conf.eth0.arp_ignore=1"],
            &["sysctl", "-w", "net.ipv4.conf.eth0.arp_ignore=2"],
            "arp_ignore",
        ),
        (
            &["ip", "link", "set", "eth0", "address", "02:00:00:00:00:09"],
            &["ip", "link", "set", "eth0", "address", "0a:58:0a:f4:01:02"],
            "MAC",
        ),
        (&["ip", "link", "set", "eth0", "mtu", "1300"], &["ip", "link", "set", "eth0", "mtu", "1400"], "MTU"),
        (&["ip", "link", "set", "eth0", "promisc", "off"], &["ip", "link", "set", "eth0", "promisc", "on"], "promisc"),
        (
            &["ip", "link", "set", "eth0", "allmulticast", "off"],
            &["ip", "link", "set", "eth0", "allmulticast", "on"],
            "allmulticast",
        ),
        (
            &["ip", "link", "set", "eth0", "txqueuelen", "5"],
            &["ip", "link", "set", "eth0", "txqueuelen", "77"],
            "txqueuelen",
        ),
    ];
    for (drift, back, needle) in drifts {
        ns.sh(drift[0], &drift[1..]);
        let (rc, out) = run(&ours(), "CHECK", &ns, &cid, &c);
        assert_eq!((rc, out["code"].as_u64()), (1, Some(103)), "{needle}: {out}");
        assert!(out["msg"].as_str().unwrap().contains(needle), "{out}");
        ns.sh(back[0], &back[1..]);
        assert_eq!(run(&ours(), "CHECK", &ns, &cid, &c).0, 0, "{needle} put back");
    }
    assert_eq!(run(&ours(), "DEL", &ns, &cid, &c).0, 0);
}

/// The reference writes the same file, byte for byte, and each plugin's DEL restores what the
/// other's ADD saved. Debian's 1.1.1 has no txQLen, so the shared config leaves it out.
#[test]
fn saved_file_is_shared_with_the_reference() {
    assert!(Path::new(REFERENCE).is_file(), "{REFERENCE} missing: install containernetworking-plugins");
    let keys = json!({ "mac": "0a:58:0a:f4:01:02", "mtu": 1400, "promisc": true, "allmulti": true });
    let tuned = Attrs { mac: "0a:58:0a:f4:01:02".into(), mtu: 1400, promisc: true, allmulti: true, txqlen: 1000 };
    let mut files = Vec::new();
    for (add, del) in [(PathBuf::from(REFERENCE), ours()), (ours(), PathBuf::from(REFERENCE))] {
        let ns = pod();
        let data = TempDir::new("tun-data");
        let cid = unique("ctr");
        let c = conf("1.0.0", &ns, data.path(), keys.clone());
        let (rc, out) = run(&add, "ADD", &ns, &cid, &c);
        assert_eq!(rc, 0, "ADD by {}: {out}", add.display());
        assert_eq!(attrs(&ns), tuned);
        files.push(std::fs::read_to_string(saved_file(data.path(), &cid)).unwrap());
        let (rc, out) = run(&del, "CHECK", &ns, &cid, &c);
        assert_eq!(rc, 0, "CHECK by {}: {out}", del.display());
        let (rc, out) = run(&del, "DEL", &ns, &cid, &c);
        assert_eq!(rc, 0, "DEL by {}: {out}", del.display());
        assert_eq!(attrs(&ns), original(), "DEL by {} after ADD by {}", del.display(), add.display());
        assert!(!saved_file(data.path(), &cid).exists());
    }
    assert_eq!(files[0], files[1], "the reference's file and ours differ");
}

/// ADD with `keys` on a fresh pod, which fails: the pod's somaxconn sysctl and link are as they
/// were and nothing is in dataDir (no saved file). (exit code, stdout JSON) for the error's checks.
fn failed_add(keys: Value, what: &str) -> (i32, Value) {
    let ns = pod();
    let data = TempDir::new("tun-data");
    let cid = unique("ctr");
    let before = sysctl(Some(&ns), "net/core/somaxconn");
    let c = conf("1.0.0", &ns, data.path(), keys);
    let (rc, out) = run(&ours(), "ADD", &ns, &cid, &c);
    assert_eq!(sysctl(Some(&ns), "net/core/somaxconn"), before, "{what}: a sysctl was written");
    assert_eq!(attrs(&ns), original(), "{what}: the link was changed");
    assert!(!saved_file(data.path(), &cid).exists(), "{what}: the saved file was written");
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0, "{what}: something written in dataDir");
    (rc, out)
}

#[test]
fn hostile_sysctl_keys_are_refused_and_nothing_is_written() {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    for key in [
        "kernel.hostname",
        "kernel/hostname",
        "net/../kernel/hostname",
        "net.ipv4.conf.IFNAME.../../../../kernel/hostname",
        "net.ipv4.conf.IFNAME.../../../..",
        "net/core/../../kernel/hostname",
        "/proc/sys/kernel/hostname",
        "vm.swappiness",
    ] {
        let keys = json!({ "sysctl": { key: "pwned", "net.core.somaxconn": somaxconn_not_host() }, "mtu": 1300 });
        let (rc, out) = failed_add(keys, key);
        assert_eq!((rc, out["code"].as_u64()), (1, Some(7)), "{key}: {out}");
        assert!(out["msg"].as_str().unwrap().contains(key), "{key}: {out}");
    }
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(), hostname);
}

/// The allowlist at its real path, /etc/cni/tuning/allowlist.conf, inside a private mount
/// namespace (a tmpfs over /etc/cni seen only by the plugin). Debian's reference (1.1.1) predates
/// the allowlist (upstream added it in v1.2.0, commit 96c3af81) and is not a peer here.
#[test]
fn allowlist_refuses_keys_it_does_not_list() {
    let ns = pod();
    let data = TempDir::new("tun-data");
    let script = r"mount -t tmpfs none /etc/cni && mkdir /etc/cni/tuning &&
        printf '%s\n' '^net\.core\.somaxconn$' '' '  net\.ipv4\.conf\.IFNAME\.arp_ignore  ' > /etc/cni/tuning/allowlist.conf &&
        exec $0";
    let wrapper = ["unshare", "-m", "--propagation", "private", "sh", "-c", script];
    let value = somaxconn_not_host();
    let forward = sysctl(Some(&ns), "net/ipv4/ip_forward");
    let flipped = if forward == "1" { "0" } else { "1" };
    {
        let bin = ours();
        let cid = unique("ctr");
        let refused = conf("1.0.0", &ns, data.path(), json!({ "sysctl": { "net.ipv4.ip_forward": flipped } }));
        let (rc, out) = run_with(&wrapper, &bin, "ADD", &ns.path, &cid, &refused, "");
        assert_eq!(rc, 1, "{}: {out}", bin.display());
        assert!(out["msg"].as_str().unwrap().contains("net.ipv4.ip_forward"), "{out}");
        assert_eq!(out["code"], json!(7), "{out}");
        assert_eq!(sysctl(Some(&ns), "net/ipv4/ip_forward"), forward, "{}: refused key written", bin.display());
        let allowed = conf(
            "1.0.0",
            &ns,
            data.path(),
            json!({ "sysctl": { "net.core.somaxconn": value, "net.ipv4.conf.IFNAME.arp_ignore": "2" } }),
        );
        let (rc, out) = run_with(&wrapper, &bin, "ADD", &ns.path, &cid, &allowed, "");
        assert_eq!(rc, 0, "{}: {out}", bin.display());
        assert_eq!(sysctl(Some(&ns), "net/core/somaxconn"), value);
        assert_eq!(sysctl(Some(&ns), "net/ipv4/conf/eth0/arp_ignore"), "2");
        ns.sh("sysctl", &["-w", "net.ipv4.conf.eth0.arp_ignore=0"]);
    }
    // Without the file (the host has none here) the same key goes through.
    assert!(!Path::new("/etc/cni/tuning/allowlist.conf").exists());
    let c = conf("1.0.0", &ns, data.path(), json!({ "sysctl": { "net.ipv4.ip_forward": flipped } }));
    assert_eq!(run(&ours(), "ADD", &ns, &unique("ctr"), &c).0, 0);
    assert_eq!(sysctl(Some(&ns), "net/ipv4/ip_forward"), flipped);
}

#[test]
fn mac_capability_beats_config_and_args_cni_beats_both() {
    let ns = pod();
    let data = TempDir::new("tun-data");
    let mut c = conf("1.0.0", &ns, data.path(), json!({ "mac": "02:00:00:00:00:01" }));
    let cid = unique("ctr");
    assert_eq!(run_with(&[], &ours(), "ADD", &ns.path, &cid, &c, "IgnoreUnknown=1;MAC=02:00:00:00:00:02").0, 0);
    assert_eq!(attrs(&ns).mac, "02:00:00:00:00:02");
    c["runtimeConfig"] = json!({ "mac": "02:00:00:00:00:03" });
    assert_eq!(run(&ours(), "ADD", &ns, &cid, &c).0, 0);
    assert_eq!(attrs(&ns).mac, "02:00:00:00:00:03");
    c["args"] = json!({ "cni": { "mac": "02:00:00:00:00:04" } });
    let (rc, out) = run(&ours(), "ADD", &ns, &cid, &c);
    assert_eq!(rc, 0);
    assert_eq!(attrs(&ns).mac, "02:00:00:00:00:04");
    assert_eq!(out["interfaces"][0]["mac"], json!("02:00:00:00:00:04"));
    // Three ADDs for one attachment: DEL still restores the MAC from before the first.
    assert_eq!(run(&ours(), "DEL", &ns, &cid, &c).0, 0);
    assert_eq!(attrs(&ns), original());
}

#[test]
fn del_with_the_netns_gone_removes_the_saved_file() {
    let mut ns = pod();
    let data = TempDir::new("tun-data");
    let cid = unique("ctr");
    let c = conf("1.0.0", &ns, data.path(), json!({ "mtu": 1400 }));
    assert_eq!(run(&ours(), "ADD", &ns, &cid, &c).0, 0);
    assert!(saved_file(data.path(), &cid).exists());
    ns.delete();
    for _ in 0..2 {
        let (rc, out) = run(&ours(), "DEL", &ns, &cid, &c);
        assert_eq!(rc, 0, "{out}");
        assert!(!saved_file(data.path(), &cid).exists());
    }
}

#[test]
fn failed_add_undoes_sysctls_and_link_changes() {
    // 65536 passes our range check, but a veth takes no MTU above 65535: the kernel refuses it
    // after the sysctl and the MAC are set.
    let keys =
        json!({ "sysctl": { "net.core.somaxconn": somaxconn_not_host() }, "mac": "0a:58:0a:f4:01:02", "mtu": 65536 });
    let (rc, out) = failed_add(keys, "mtu 65536");
    assert_eq!(rc, 1, "{out}");
}

/// bridge + host-local + tuning through libcni, as a runtime runs the chain.
#[test]
fn bridge_host_local_tuning_chain() {
    for (i, version) in ["0.3.1", "0.4.0", "1.0.0", "1.1.0"].iter().enumerate() {
        let ns = Netns::new("tunc");
        let bridge = LinkGuard(unique("tunb"));
        let ipam = TempDir::new("tun-ipam");
        let data = TempDir::new("tun-data");
        let cache = TempDir::new("tun-cache");
        let value = somaxconn_not_host();
        let host_before = sysctl(None, "net/core/somaxconn");
        let list = json!({
            "cniVersion": version, "name": unique("tnet"),
            "plugins": [
                { "type": "bridge", "bridge": bridge.0, "isGateway": true,
                  "ipam": { "type": "host-local", "subnet": format!("10.213.{i}.0/24"), "dataDir": ipam.path() } },
                { "type": "tuning", "dataDir": data.path(), "mtu": 1400, "promisc": true, "txQLen": 99,
                  "capabilities": { "mac": true },
                  "sysctl": { "net.core.somaxconn": value, "net.ipv4.conf.IFNAME.arp_ignore": "1" } }
            ]
        });
        let list = NetworkConfigList::from_bytes(list.to_string().as_bytes()).unwrap();
        let cni = CniConfig::with_cache_dir(vec![bin_dir()], cache.path().to_path_buf());
        let mut rt = RuntimeConf {
            container_id: unique("ctr"),
            netns: ns.path.clone(),
            ifname: "eth0".into(),
            ..Default::default()
        };
        rt.capability_args.insert("mac".into(), json!("0a:58:0a:d5:00:09"));
        let r = cni.add_network_list(&list, &rt).unwrap_or_else(|e| panic!("{version}: ADD: {e}"));
        let eth0 = r.interfaces.iter().find(|i| i.name == "eth0").unwrap();
        assert_eq!(eth0.mac.as_deref(), Some("0a:58:0a:d5:00:09"), "{version}");
        let a = attrs(&ns);
        assert_eq!((a.mac.as_str(), a.mtu, a.promisc, a.txqlen), ("0a:58:0a:d5:00:09", 1400, true, 99), "{version}");
        assert_eq!(sysctl(Some(&ns), "net/core/somaxconn"), value);
        assert_eq!(sysctl(Some(&ns), "net/ipv4/conf/eth0/arp_ignore"), "1");
        assert_eq!(sysctl(None, "net/core/somaxconn"), host_before);
        // The pod still reaches its gateway with the new MAC.
        sh("ip", &["netns", "exec", &ns.name, "busybox", "ping", "-c", "1", "-W", "2", &format!("10.213.{i}.1")]);
        if at_least(version, "0.4.0") {
            cni.check_network_list(&list, &rt).unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        }
        cni.del_network_list(&list, &rt).unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        cni.del_network_list(&list, &rt).unwrap_or_else(|e| panic!("{version}: DEL again: {e}"));
        assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0, "{version}: saved file left");
    }
}

/// The multi-call binary, hard-linked as `tuning`, is the same plugin.
#[test]
fn multi_call_binary_runs_tuning() {
    let dir = TempDir::new("tun-mc");
    let link = dir.path().join("tuning");
    std::fs::hard_link(bin_dir().join("cni-rs"), &link).unwrap();
    let ns = pod();
    let data = TempDir::new("tun-data");
    let cid = unique("ctr");
    let c = conf("1.1.0", &ns, data.path(), json!({ "mtu": 1400, "txQLen": 5 }));
    assert_eq!(run(&link, "ADD", &ns, &cid, &c).0, 0);
    assert_eq!((attrs(&ns).mtu, attrs(&ns).txqlen), (1400, 5));
    assert_eq!(run(&link, "CHECK", &ns, &cid, &c).0, 0);
    assert_eq!(run(&link, "DEL", &ns, &cid, &c).0, 0);
    assert_eq!(attrs(&ns), original());
}
