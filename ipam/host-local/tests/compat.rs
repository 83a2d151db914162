//! On-disk compatibility with the reference Go host-local (Debian's containernetworking-plugins):
//! each plugin sees the other's reservations as taken and releases them on DEL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::*;
use cni_tests::{prerequisite, reservations, TempDir};
use serde_json::json;
use std::collections::HashSet;
use std::path::Path;

/// The host-local binary this crate builds.
const OURS: &str = env!("CARGO_BIN_EXE_host-local");
/// The reference Go host-local (Debian's containernetworking-plugins).
const REFERENCE: &str = "/usr/lib/cni/host-local";

/// The reference binary, or None to skip; in CI a missing binary fails the test instead.
fn reference() -> Option<&'static str> {
    let present = Path::new(REFERENCE).exists();
    prerequisite(present, &format!("{REFERENCE} is missing: apt-get install -y containernetworking-plugins"))
        .then_some(REFERENCE)
}

fn conf(dir: &TempDir, name: &str) -> serde_json::Value {
    netconf(
        "1.0.0",
        name,
        json!({"type": "host-local", "dataDir": dir.path(),
            "ranges": [[{"subnet": "10.60.0.0/29"}], [{"subnet": "fd60::/125"}]]}),
    )
}

fn forget_round_robin(dir: &TempDir, name: &str) {
    for i in 0..2 {
        let _ = std::fs::remove_file(dir.path().join(name).join(format!("last_reserved_ip.{i}")));
    }
}

#[test]
fn reference_reservation_is_taken_by_ours_and_released_by_our_del() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("compat-ref-first");
    let conf = conf(&dir, "refnet");
    let theirs = exec(reference, "ADD", &conf, "ref-pod", "eth0", "");
    assert_eq!(theirs.ips(), ["10.60.0.2/29", "fd60::2/125"], "{}", theirs.stdout);
    // Without the round-robin cursor ours would start at the same addresses: it must skip them.
    forget_round_robin(&dir, "refnet");
    let ours = exec(OURS, "ADD", &conf, "our-pod", "eth0", "");
    assert_eq!(ours.ips(), ["10.60.0.3/29", "fd60::3/125"]);
    assert_eq!(exec(OURS, "ADD", &conf, "x", "eth0", "IP=10.60.0.2").err_code(), 7);

    exec(OURS, "DEL", &conf, "ref-pod", "eth0", "").ok();
    let left: Vec<String> = reservations(dir.path(), "refnet").into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(left, ["10.60.0.3", "fd60::3"]);
    // The reference reads our round-robin cursor and our reservations.
    let next = exec(reference, "ADD", &conf, "ref-pod2", "eth0", "");
    assert_eq!(next.ips(), ["10.60.0.4/29", "fd60::4/125"], "{}", next.stdout);
}

#[test]
fn our_reservation_is_taken_by_reference_and_released_by_its_del() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("compat-ours-first");
    let conf = conf(&dir, "ournet");
    assert_eq!(exec(OURS, "ADD", &conf, "our-pod", "eth0", "").ips(), ["10.60.0.2/29", "fd60::2/125"]);
    forget_round_robin(&dir, "ournet");
    let theirs = exec(reference, "ADD", &conf, "ref-pod", "eth0", "");
    assert_eq!(theirs.ips(), ["10.60.0.3/29", "fd60::3/125"], "{}", theirs.stdout);
    let refused = exec(reference, "ADD", &conf, "ref-pod2", "eth0", "IP=10.60.0.2");
    assert_ne!(refused.rc, 0, "reference handed out our address: {}", refused.stdout);
    // The reference's duplicate check sees our file as this attachment's reservation.
    assert_ne!(exec(reference, "ADD", &conf, "our-pod", "eth0", "").rc, 0);

    exec(reference, "DEL", &conf, "our-pod", "eth0", "").ok();
    let left: Vec<String> = reservations(dir.path(), "ournet").into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(left, ["10.60.0.3", "fd60::3"]);
    let mut with_prev = conf.clone();
    with_prev["prevResult"] = theirs.ok().clone();
    exec(OURS, "CHECK", &with_prev, "ref-pod", "eth0", "").ok();
}

#[test]
fn both_plugins_in_parallel_share_the_lock() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("compat-parallel");
    let conf = netconf("1.0.0", "mixed", json!({"subnet": "10.70.0.0/24", "dataDir": dir.path()}));
    let handles: Vec<_> = (0..20)
        .map(|i| {
            let conf = conf.clone();
            let bin = if i % 2 == 0 { OURS } else { reference };
            std::thread::spawn(move || exec(bin, "ADD", &conf, &format!("pod{i}"), "eth0", ""))
        })
        .collect();
    let ips: HashSet<String> = handles.into_iter().map(|h| h.join().unwrap().first_ip()).collect();
    assert_eq!(ips.len(), 20, "{ips:?}");
    assert_eq!(reservations(dir.path(), "mixed").len(), 20);
    // Each plugin releases the other's reservations.
    for i in 0..20 {
        let bin = if i % 2 == 0 { reference } else { OURS };
        exec(bin, "DEL", &conf, &format!("pod{i}"), "eth0", "").ok();
    }
    assert!(reservations(dir.path(), "mixed").is_empty());
}

#[test]
fn reference_churn_behind_our_scan_cache() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("compat-churn");
    let conf = conf(&dir, "churn");
    assert_eq!(exec(OURS, "ADD", &conf, "pod-a", "eth0", "").ips(), ["10.60.0.2/29", "fd60::2/125"]);
    let index = dir.path().join("churn/.cni-rs-index");
    assert!(index.is_file());
    // The reference frees a's addresses and hands .2 to b (a file system may give the new file a's inode).
    exec(reference, "DEL", &conf, "pod-a", "eth0", "").ok();
    let b = exec(reference, "ADD", &conf, "pod-b", "eth0", "IP=10.60.0.2");
    assert_eq!(b.first_ip(), "10.60.0.2", "{}", b.stdout);
    assert!(index.is_file(), "the reference's DEL removed our index");
    // Ours sees b's reservation: a repeated ADD of a does not get .2 back.
    let a = exec(OURS, "ADD", &conf, "pod-a", "eth0", "");
    assert!(!a.ips().contains(&"10.60.0.2/29".to_string()), "{}", a.stdout);
    exec(OURS, "DEL", &conf, "pod-b", "eth0", "").ok();
    let left: Vec<String> = reservations(dir.path(), "churn").into_iter().map(|(_, owner)| owner).collect();
    assert_eq!(left, ["pod-a\r\neth0", "pod-a\r\neth0"]);
    exec(reference, "DEL", &conf, "pod-a", "eth0", "").ok();
    assert!(reservations(dir.path(), "churn").is_empty());
    assert!(index.is_file());
}
