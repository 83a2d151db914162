//! bridge's ordering of firewall steps against the other steps of ADD, CHECK and DEL, with a
//! recording firewall double: no root, no kernel state.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;
use libcni::skel::execute;
use netkit::fake::RecordingFirewall;
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Captures the request skel builds.
#[derive(Default)]
struct Capture(RefCell<Option<Request>>);

impl Plugin for Capture {
    fn add(&self, req: &Request) -> Result<CniResult> {
        *self.0.borrow_mut() = Some(req.clone());
        Ok(CniResult::default())
    }
    fn del(&self, req: &Request) -> Result<()> {
        *self.0.borrow_mut() = Some(req.clone());
        Ok(())
    }
    fn check(&self, _: &Request) -> Result<()> {
        Ok(())
    }
}

/// The request skel builds from `conf` (a DEL of container `c1`, ifname `eth0`).
pub(crate) fn request(conf: Value) -> Request {
    request_with(conf, &[("CNI_COMMAND", "DEL"), ("CNI_PATH", "/nonexistent")])
}

/// The request skel builds from `conf` and `env` (container `c1`, ifname `eth0` unless set).
fn request_with(conf: Value, env: &[(&str, &str)]) -> Request {
    let env: HashMap<String, String> = [("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0")]
        .iter()
        .chain(env)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let plugin = Capture::default();
    let out = execute(&plugin, &env, &mut conf.to_string().as_bytes());
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    plugin.0.take().expect("the verb ran")
}

fn masq_conf() -> Value {
    json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge", "ipMasq": true, "ipMasqBackend": "nftables"})
}

fn ips() -> Vec<IpConfig> {
    vec![IpConfig { address: "10.1.2.7/24".parse().unwrap(), gateway: None, interface: Some(2) }]
}

/// A step of ADD before masquerade, writing its reversal into the shared log.
fn earlier_step<'a>(undo: &mut Undo<'a>, log: &'a Mutex<Vec<String>>, what: &'static str) {
    undo.push(move || log.lock().unwrap().push(format!("undo {what}")));
}

#[test]
fn masquerade_is_undone_first_when_a_later_step_fails() {
    let req = request(masq_conf());
    let conf = config::parse(&req).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let fw = RecordingFirewall::new(log.clone());
    let mut undo = Undo::default();
    earlier_step(&mut undo, &log, "veth");
    earlier_step(&mut undo, &log, "ipam");
    add_masquerade(&fw, &req, &conf, &ips(), &mut undo).unwrap();
    // A later step (the MAC spoof check) fails: ADD runs the undo.
    undo.run();
    assert_eq!(
        fw.calls(),
        ["add_masquerade net c1 eth0 10.1.2.7/24", "del_masquerade net c1 eth0", "undo ipam", "undo veth"]
    );
}

#[test]
fn a_failed_masquerade_add_is_still_removed() {
    let req = request(masq_conf());
    let conf = config::parse(&req).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let fw = RecordingFirewall { log: log.clone(), fail: vec!["add_masquerade"], ..Default::default() };
    let mut undo = Undo::default();
    earlier_step(&mut undo, &log, "veth");
    let e = add_masquerade(&fw, &req, &conf, &ips(), &mut undo).unwrap_err();
    assert!(e.msg.contains("add_masquerade"), "{e}");
    undo.run();
    assert_eq!(fw.calls(), ["add_masquerade net c1 eth0 10.1.2.7/24", "del_masquerade net c1 eth0", "undo veth"]);
}

#[test]
fn del_removes_masquerade_on_the_configured_backend() {
    let req = request(masq_conf());
    let fw = RecordingFirewall::default();
    let opened = RefCell::new(Vec::new());
    let errs = del_firewall(&req, &DelPlan::new(&req), &|kind| {
        opened.borrow_mut().push(kind);
        Box::new(fw.clone())
    });
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(*opened.borrow(), [BackendKind::Nftables]);
    assert_eq!(fw.calls(), ["del_masquerade net c1 eth0"]);
    // Without ipMasq, DEL touches no masquerade rules.
    let req = request(json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge"}));
    let errs = del_firewall(&req, &DelPlan::new(&req), &|_| Box::new(fw.clone()));
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(fw.calls().len(), 1);
}

#[test]
fn check_compares_masquerade_with_the_pods_own_addresses() {
    let req = request(masq_conf());
    let conf = config::parse(&req).unwrap();
    let mut prev = CniResult { ips: ips(), ..Default::default() };
    prev.ips.push(IpConfig { address: "10.9.9.9/24".parse().unwrap(), gateway: None, interface: Some(0) });
    let m = masquerade::rules(&req, &conf.network, own_ips(&prev, Some(2)));
    let fw = RecordingFirewall::default();
    fw.check_masquerade(&m).unwrap();
    assert_eq!(fw.calls(), ["check_masquerade net c1 eth0 10.1.2.7/24"]);
}

/// Root, or a loud failure unless CNI_RS_UNPRIVILEGED=1 says skipping is intended (as netkit's
/// privileged tests do).
fn privileged() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    if status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0")) {
        return true;
    }
    if std::env::var("CNI_RS_UNPRIVILEGED").as_deref() == Ok("1") {
        eprintln!("skipping privileged test: not root and CNI_RS_UNPRIVILEGED=1");
        return false;
    }
    panic!("this test needs root (network namespaces, links); run as root or set CNI_RS_UNPRIVILEGED=1 to skip");
}

fn sh(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd).args(args).output().unwrap();
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A namespace, a bridge and a host-local data dir of one test, removed on drop.
struct Scratch {
    netns: String,
    bridge: String,
    data: std::path::PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.netns]).status();
        let _ = std::process::Command::new("ip").args(["link", "del", &self.bridge]).status();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

#[test]
fn add_masquerades_once_the_pod_holds_its_address_and_undo_removes_it() {
    if !privileged() {
        return;
    }
    let tag = format!("{:08x}", std::process::id() ^ std::time::UNIX_EPOCH.elapsed().unwrap().subsec_nanos());
    let s = Scratch {
        netns: format!("cnbf-{tag}"),
        bridge: format!("cnbf{tag}"),
        data: std::env::temp_dir().join(format!("cnbf-{tag}")),
    };
    sh("ip", &["netns", "add", &s.netns]);
    // host-local, built beside this test binary (target/debug/deps/..).
    let exe = std::env::current_exe().unwrap();
    let cni_path = exe.parent().and_then(|d| d.parent()).unwrap().display().to_string();
    let netns_path = format!("/run/netns/{}", s.netns);
    let req = request_with(
        json!({"cniVersion": "1.0.0", "name": "net", "type": "bridge", "bridge": s.bridge, "ipMasq": true,
            "ipMasqBackend": "nftables",
            "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.203.77.0/24"}]], "dataDir": s.data}}),
        &[("CNI_COMMAND", "ADD"), ("CNI_NETNS", &netns_path), ("CNI_PATH", &cni_path)],
    );
    let conf = config::parse(&req).unwrap();
    let pod = Pod::open_for_add(&req).unwrap();
    let netns = s.netns.clone();
    let probe: netkit::fake::Probe = Arc::new(move || {
        let out = std::process::Command::new("ip").args(["-n", &netns, "-o", "-4", "addr", "show", "eth0"]).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().nth(3).unwrap_or("").to_string())
            .unwrap_or_default()
    });
    let fw = RecordingFirewall { probe: Some(probe), ..Default::default() };
    let mut undo = Undo::default();
    let result = add(&pod, &conf, Some(&fw), &mut undo).unwrap();
    assert_eq!(result.ips[0].address.to_string(), "10.203.77.2/24");
    // Masquerade came after the pod's interface was configured: it already held its address.
    assert_eq!(fw.calls(), ["add_masquerade net c1 eth0 10.203.77.2/24 | 10.203.77.2/24"]);
    // A later step failing: the rules go first, then the address and the veth.
    undo.run();
    let calls = fw.calls();
    assert_eq!(calls[1], "del_masquerade net c1 eth0 | 10.203.77.2/24");
    assert!(sh("ip", &["-n", &s.netns, "-o", "link"]).lines().all(|l| !l.contains("eth0")), "the veth survived");
    assert!(s.data.join("net").is_dir(), "host-local kept no state in {}", s.data.display());
    assert!(!s.data.join("net/10.203.77.2").exists(), "the address is still reserved");
}
