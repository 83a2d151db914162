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

/// Captures the request skel builds for a DEL.
#[derive(Default)]
struct Capture(RefCell<Option<Request>>);

impl Plugin for Capture {
    fn add(&self, _: &Request) -> Result<CniResult> {
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
    let env: HashMap<String, String> =
        [("CNI_COMMAND", "DEL"), ("CNI_CONTAINERID", "c1"), ("CNI_IFNAME", "eth0"), ("CNI_PATH", "/nonexistent")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    let plugin = Capture::default();
    let out = execute(&plugin, &env, &mut conf.to_string().as_bytes());
    assert_eq!(out.exit_code, 0, "{}", out.stdout);
    plugin.0.take().expect("DEL ran")
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
    let fw = RecordingFirewall { log: log.clone(), fail: vec!["add_masquerade"] };
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
    let m = masquerade(&req, &conf, iface::own_ips(&prev, Some(2)));
    let fw = RecordingFirewall::default();
    fw.check_masquerade(&m).unwrap();
    assert_eq!(fw.calls(), ["check_masquerade net c1 eth0 10.1.2.7/24"]);
}
