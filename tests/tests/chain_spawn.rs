#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! What bandwidth, tuning, firewall and ptp start on a pod's ADD and DEL, counted with strace in the
//! two chains users run (conf/bandwidth.conflist and conf/podman-firewall.conflist, through libcni)
//! and a ptp network with `ipMasq` on the iptables backend: bandwidth and tuning start no process at
//! all (their kernel work is netlink and /proc/sys writes in process), and neither does the
//! firewall's iptables backend on a node whose iptables is iptables-nft (Debian's default): it
//! writes the reference's rules over nf_tables netlink, on ADD, CHECK, DEL, GC and STATUS; nor on a
//! node whose iptables is iptables-legacy, where it reads and replaces the kernel's legacy filter
//! table through its socket options. ptp's (and bridge's) iptables masquerade is written the same
//! way, in the nat table: ptp starts only its IPAM plugin.
//!
//! The whole test runs on a thread in a network namespace of its own (the chains' bridges, the
//! host ends of the veths and the iptables tables live there), so the firewall's tables start
//! empty and no other test's rules change what it reads or retries.

use cni_tests::{bin_dir, require_root, require_tools, sh, unique, Netns, TempDir};
use libcni::conflist::NetworkConfigList;
use libcni::runtime::{CniConfig, RuntimeConf};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Every task in a file of its own (`<prefix>.<tid>`, so no call is split by another task's
/// output), and only the calls that start a task or a program.
const STRACE: [&str; 7] =
    ["-f", "-ff", "-qq", "-e", "trace=execve,execveat,fork,vfork,clone,clone3", "-e", "signal=none"];

/// What one traced run started besides the traced program itself.
#[derive(Debug, Default, PartialEq)]
struct Spawned {
    /// fork, vfork, and clone or clone3 without CLONE_THREAD, that returned a child.
    processes: usize,
    /// Base names of the programs executed (successful execve or execveat).
    programs: Vec<String>,
}

/// The return value strace printed for a call (`... = 1234`, `... = -1 ENOENT (...)`).
fn returned(line: &str) -> Option<i64> {
    line.rsplit_once(" = ").and_then(|(_, r)| r.split_whitespace().next()).and_then(|v| v.parse().ok())
}

/// Reads the traces `<dir>/<prefix>.<tid>` of one run of `program`.
fn spawned(dir: &Path, prefix: &str, program: &Path) -> Spawned {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&format!("{prefix}.")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no trace {prefix}.* in {}: the run was not traced", dir.display());
    let own = program.display().to_string();
    let (mut out, mut own_seen) = (Spawned::default(), false);
    for f in &files {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let call = line.split('(').next().unwrap_or("");
            let Some(rc) = returned(line) else { continue };
            match call {
                "execve" | "execveat" if rc == 0 => {
                    let path = line.split('"').nth(1).unwrap_or("").to_string();
                    if path == own && !own_seen {
                        own_seen = true;
                    } else {
                        out.programs.push(path.rsplit('/').next().unwrap_or("").to_string());
                    }
                }
                "fork" | "vfork" if rc > 0 => out.processes += 1,
                "clone" | "clone3" if rc > 0 && !line.contains("CLONE_THREAD") => out.processes += 1,
                _ => {}
            }
        }
    }
    assert!(own_seen, "{prefix}: the traces {files:?} do not show {own} starting");
    out
}

/// A plugin directory for libcni: the `plain` plugins of `bin` as they are, and `traced` ones under
/// strace, tracing into `traces` as `<plugin>.<CNI_COMMAND>.<tid>`; every one with `path_first` (if
/// any) first in its PATH (links when there is none, scripts otherwise).
fn plugin_dir(bin: &Path, dir: &Path, traces: &Path, plain: &[&str], traced: &[&str], path_first: Option<&Path>) {
    let path = path_first.map(|p| format!("PATH='{}':\"$PATH\" ", p.display())).unwrap_or_default();
    let script = |p: &str, body: String| {
        let path = dir.join(p);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    for p in plain {
        match path_first {
            None => std::os::unix::fs::symlink(bin.join(p), dir.join(p)).unwrap(),
            Some(_) => script(p, format!("{path}exec '{}'", bin.join(p).display())),
        }
    }
    for p in traced {
        let strace = STRACE.map(|a| format!("'{a}'")).join(" ");
        let out = format!("'{}/{p}.'\"$CNI_COMMAND\"", traces.display());
        script(p, format!("{path}exec strace {strace} -o {out} '{}'", bin.join(p).display()));
    }
}

/// A conflist from conf/ with its IPAM (and tuning) state in `state`.
fn conflist(file: &str, state: &Path, edit: impl FnOnce(&mut Value)) -> NetworkConfigList {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf").join(file);
    let mut conf: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    conf["plugins"][0]["ipam"]["dataDir"] = json!(state.join("ipam"));
    edit(&mut conf);
    NetworkConfigList::from_bytes(conf.to_string().as_bytes()).unwrap()
}

fn runtime(pod: &Netns, caps: Value) -> RuntimeConf {
    let Value::Object(capability_args) = caps else { panic!("capabilities are an object") };
    RuntimeConf {
        container_id: unique("spawn"),
        netns: pod.path.clone(),
        ifname: "eth0".into(),
        capability_args,
        ..Default::default()
    }
}

#[test]
fn bandwidth_tuning_and_the_firewall_on_iptables_nft_start_no_process() {
    require_root();
    require_tools(&["strace", "iptables-save", "iptables-restore", "tc"]);
    let iptables = std::fs::canonicalize("/usr/sbin/iptables").expect("no /usr/sbin/iptables");
    assert!(
        iptables.ends_with("xtables-nft-multi"),
        "this test needs the node's iptables to be iptables-nft, not {}",
        iptables.display()
    );
    in_own_netns(false);
}

/// The same where the plugins' `iptables` is iptables-legacy (a PATH whose iptables tools lead
/// to xtables-legacy-multi, first for the traced plugins).
#[test]
fn bandwidth_tuning_and_the_firewall_on_iptables_legacy_start_no_process() {
    require_root();
    require_tools(&["strace", "iptables-legacy-save", "xtables-legacy-multi", "tc"]);
    in_own_netns(true);
}

fn in_own_netns(legacy: bool) {
    let bin = bin_dir();
    std::thread::spawn(move || {
        // SAFETY: unshare has no memory preconditions; CLONE_NEWNET applies to this thread only,
        // and the programs it starts inherit it.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare: {}", std::io::Error::last_os_error());
        sh("ip", &["link", "set", "lo", "up"]);
        chains(&bin, legacy);
    })
    .join()
    .expect("the test thread failed (its panic is printed above)");
}

fn chains(bin: &Path, legacy: bool) {
    let tmp = TempDir::new("chain-spawn");
    let fake = tmp.path().join("legacy");
    std::fs::create_dir_all(&fake).unwrap();
    for tool in ["iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"] {
        std::os::unix::fs::symlink("/usr/sbin/xtables-legacy-multi", fake.join(tool)).unwrap();
    }
    let save = if legacy { "iptables-legacy-save" } else { "iptables-save" };
    let (traces, dir, state) = (tmp.path().join("traces"), tmp.path().join("bin"), tmp.path().join("state"));
    for d in [&traces, &dir, &state] {
        std::fs::create_dir_all(d).unwrap();
    }

    // The counting itself: a shell that runs two programs starts two processes.
    let st = Command::new("strace")
        .args(STRACE)
        .arg("-o")
        .arg(traces.join("calibration"))
        .args(["/bin/sh", "-c", "/bin/true; /bin/true; :"])
        .status()
        .unwrap();
    assert!(st.success());
    let two = Spawned { processes: 2, programs: vec!["true".into(), "true".into()] };
    assert_eq!(spawned(&traces, "calibration", Path::new("/bin/sh")), two);

    plugin_dir(
        bin,
        &dir,
        &traces,
        &["bridge", "host-local", "portmap", "loopback"],
        &["bandwidth", "tuning", "firewall", "ptp"],
        legacy.then_some(fake.as_path()),
    );
    let cni = CniConfig::with_cache_dir(vec![dir.clone()], state.join("cache"));

    // The seed-style chain, both capabilities.
    let bw = conflist("bandwidth.conflist", &state, |_| {});
    let pod = Netns::new("spawnbw");
    let rt = runtime(
        &pod,
        json!({"portMappings": [{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}],
               "bandwidth": {"ingressRate": 8_000_000, "ingressBurst": 800_000,
                             "egressRate": 8_000_000, "egressBurst": 800_000}}),
    );
    cni.add_network_list(&bw, &rt).expect("bandwidth chain ADD");
    let ifb = sh("ip", &["-o", "link", "show", "type", "ifb"]);
    assert!(ifb.contains("bwp"), "bandwidth made no ifb: {ifb:?}");
    let qdiscs = sh("tc", &["qdisc", "show"]);
    assert!(qdiscs.matches("qdisc tbf").count() == 2, "a TBF each way: {qdiscs}");
    cni.del_network_list(&bw, &rt).expect("bandwidth chain DEL");
    assert_eq!(sh("ip", &["-o", "link", "show", "type", "ifb"]).trim(), "", "DEL leaves no ifb");
    drop(pod);

    // podman's default chain, with tuning given work to do: an MTU and an IFNAME sysctl.
    let podman = conflist("podman-firewall.conflist", &state, |c| {
        // 1.1.0, so that GC and STATUS reach the plugins too.
        c["cniVersion"] = json!("1.1.0");
        c["plugins"][3] = json!({"type": "tuning", "mtu": 1400, "dataDir": state.join("tuning"),
                                 "sysctl": {"net.ipv4.conf.IFNAME.arp_ignore": "1"}});
        // bridge's masquerade in the reference's iptables chain.
        c["plugins"][0]["ipMasqBackend"] = json!("iptables");
    });
    let pod = Netns::new("spawnpm");
    let rt = runtime(&pod, json!({"portMappings": [{"hostPort": 18081, "containerPort": 80, "protocol": "tcp"}]}));
    let result = cni.add_network_list(&podman, &rt).expect("podman chain ADD");
    cni.check_network_list(&podman, &rt).expect("podman chain CHECK");
    let ip = result.ips[0].address.ip().to_string();
    assert!(pod.ip(&["link", "show", "eth0"]).contains("mtu 1400"), "tuning set no MTU");
    assert_eq!(pod.sh("cat", &["/proc/sys/net/ipv4/conf/eth0/arp_ignore"]).trim(), "1", "tuning set no sysctl");
    let filter = sh(save, &["-t", "filter"]);
    assert!(filter.contains(&format!("-A CNI-FORWARD -d {ip}/32")), "firewall let nothing through for {ip}: {filter}");
    let masquerade = |cid: &str, net: &str, ip: &str| {
        let c = format!("-m comment --comment \"name: \\\"{net}\\\" id: \\\"{cid}\\\"\"");
        let nat = sh(save, &["-t", "nat"]);
        let chain = nat.lines().find(|l| l.starts_with(&format!("-A POSTROUTING -s {ip}/32 {c} -j CNI-")));
        let chain = chain.and_then(|l| l.rsplit(' ').next()).unwrap_or_else(|| panic!("no masquerade of {ip}: {nat}"));
        assert!(nat.contains(&format!("-A {chain} ! -d 224.0.0.0/4 {c} -j MASQUERADE")), "{nat}");
    };
    masquerade(&rt.container_id, "cnirs-podman-fw", &ip);
    cni.del_network_list(&podman, &rt).expect("podman chain DEL");
    let filter = sh(save, &["-t", "filter"]);
    assert!(!filter.contains(&format!("{ip}/32")), "DEL left {ip}'s rules: {filter}");
    let nat = sh(save, &["-t", "nat"]);
    assert!(!nat.contains(&rt.container_id), "DEL left the masquerade: {nat}");
    cni.gc_network_list(&podman, Some(&[])).expect("podman chain GC");
    cni.status_network_list(&podman).expect("podman chain STATUS");
    drop(pod);

    // ptp with masquerade on the iptables backend.
    let ptp = json!({"cniVersion": "1.1.0", "name": "spawn-ptp", "plugins": [{
        "type": "ptp", "ipMasq": true, "ipMasqBackend": "iptables",
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.89.78.0/24"}]], "dataDir": state.join("ipam-ptp")}
    }]});
    let ptp = NetworkConfigList::from_bytes(ptp.to_string().as_bytes()).unwrap();
    let pod = Netns::new("spawnpt");
    let rt = runtime(&pod, json!({}));
    let result = cni.add_network_list(&ptp, &rt).expect("ptp ADD");
    cni.check_network_list(&ptp, &rt).expect("ptp CHECK");
    let ip = result.ips[0].address.ip().to_string();
    masquerade(&rt.container_id, "spawn-ptp", &ip);
    cni.del_network_list(&ptp, &rt).expect("ptp DEL");
    let nat = sh(save, &["-t", "nat"]);
    assert!(!nat.contains(&rt.container_id) && !nat.contains(&ip), "ptp DEL left the masquerade: {nat}");
    cni.gc_network_list(&ptp, Some(&[])).expect("ptp GC");
    cni.status_network_list(&ptp).expect("ptp STATUS");
    drop(pod);

    let none = Spawned::default();
    for (plugin, commands) in [
        ("bandwidth", &["ADD", "DEL"][..]),
        ("tuning", &["ADD", "DEL"]),
        ("firewall", &["ADD", "CHECK", "DEL", "GC", "STATUS"]),
    ] {
        for command in commands {
            let got = spawned(&traces, &format!("{plugin}.{command}"), &bin.join(plugin));
            assert_eq!(got, none, "{plugin} {command} started a process");
        }
    }
    // ptp starts its IPAM plugin, once per verb, and nothing else (no iptables). Where the
    // plugins' PATH is set, host-local is a script that executes it in the same process.
    let execs = if legacy { 2 } else { 1 };
    let ipam = Spawned { processes: 1, programs: vec!["host-local".into(); execs] };
    for command in ["ADD", "CHECK", "DEL", "GC", "STATUS"] {
        let got = spawned(&traces, &format!("ptp.{command}"), &bin.join("ptp"));
        assert_eq!(got, ipam, "ptp {command} started something besides its IPAM");
    }
    // Nothing else of the chains ran traced (a CHECK or a second ADD would show here).
    let names: Vec<String> = std::fs::read_dir(&traces)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().split('.').take(2).collect::<Vec<_>>().join("."))
        .collect();
    for n in &names {
        assert!(
            [
                "calibration",
                "bandwidth.ADD",
                "bandwidth.DEL",
                "tuning.ADD",
                "tuning.DEL",
                "tuning.CHECK",
                "tuning.GC",
                "tuning.STATUS",
                "firewall.ADD",
                "firewall.CHECK",
                "firewall.DEL",
                "firewall.GC",
                "firewall.STATUS",
                "ptp.ADD",
                "ptp.CHECK",
                "ptp.DEL",
                "ptp.GC",
                "ptp.STATUS"
            ]
            .iter()
            .any(|k| n.starts_with(k)),
            "unexpected trace {n}"
        );
    }
}
