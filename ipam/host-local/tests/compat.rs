//! On-disk compatibility with the reference Go host-local (Debian's containernetworking-plugins):
//! each plugin sees the other's reservations as taken and releases them on DEL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::*;
use cni_tests::{prerequisite, reservations, TempDir};
use host_local::store::TEST_BOOT_ENV;
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

/// `CNI_RS_TEST_BOOT` for a boot whose id ends in `n` and that started at `started`.
fn fake_boot(n: u8, started: std::time::SystemTime) -> String {
    let nanos = started.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f{n:02x},{nanos}")
}

fn boot_markers(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(".cni-rs-boot."))
        .collect();
    names.sort();
    names
}

/// A reboot between two allocations: our first ADD of the new boot releases what both plugins reserved in
/// the earlier boot, keeps what the reference reserved in this boot before it, and from then on each plugin
/// sees the other's reservations as taken. The boot is faked through `CNI_RS_TEST_BOOT`.
#[test]
fn after_a_reboot_our_first_add_releases_earlier_boots_and_shares_this_one_with_the_reference() {
    let Some(reference) = reference() else { return };
    let dir = TempDir::new("compat-reboot");
    let conf = netconf(
        "1.0.0",
        "bootnet",
        json!({"type": "host-local", "dataDir": dir.path(), "ranges": [[{"subnet": "10.61.0.0/29"}]]}),
    );
    let net_dir = dir.path().join("bootnet");
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let boot_a = fake_boot(0xa, hour_ago);
    let ours = |cid: &str, boot: &str| exec_with_env(OURS, "ADD", &conf, cid, "eth0", "", &[(TEST_BOOT_ENV, boot)]);

    // Boot A: one reservation each.
    assert_eq!(ours("pod-a1", &boot_a).ips(), ["10.61.0.2/29"]);
    assert_eq!(exec(reference, "ADD", &conf, "pod-a2", "eth0", "").ips(), ["10.61.0.3/29"]);
    assert_eq!(boot_markers(&net_dir), [".cni-rs-boot.0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f0a"]);

    // The node reboots (file times are coarse: keep the boot's start clear of both sides).
    std::thread::sleep(std::time::Duration::from_millis(30));
    let boot_b = fake_boot(0xb, std::time::SystemTime::now());
    std::thread::sleep(std::time::Duration::from_millis(30));
    // The reference allocates first in boot B and skips boot A's reservations, as it always did.
    assert_eq!(exec(reference, "ADD", &conf, "pod-b1", "eth0", "").ips(), ["10.61.0.4/29"]);
    // Our first ADD releases .2 and .3 (boot A) and keeps the reference's .4.
    assert_eq!(ours("pod-b2", &boot_b).ips(), ["10.61.0.5/29"]);
    let owners = |dir: &TempDir| -> Vec<(String, String)> { reservations(dir.path(), "bootnet") };
    let expected = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs.iter().map(|(ip, cid)| (ip.to_string(), format!("{cid}\r\neth0"))).collect()
    };
    assert_eq!(owners(&dir), expected(&[("10.61.0.4", "pod-b1"), ("10.61.0.5", "pod-b2")]));
    assert_eq!(boot_markers(&net_dir), [".cni-rs-boot.0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f0b"]);

    // Within boot B both take turns and each skips the other's addresses; nothing more is released.
    assert_eq!(exec(reference, "ADD", &conf, "pod-b3", "eth0", "").ips(), ["10.61.0.6/29"]);
    assert_eq!(ours("pod-b4", &boot_b).ips(), ["10.61.0.2/29"]);
    assert_eq!(exec(reference, "ADD", &conf, "pod-b5", "eth0", "").ips(), ["10.61.0.3/29"]);
    assert_eq!(
        owners(&dir),
        expected(&[
            ("10.61.0.2", "pod-b4"),
            ("10.61.0.3", "pod-b5"),
            ("10.61.0.4", "pod-b1"),
            ("10.61.0.5", "pod-b2"),
            ("10.61.0.6", "pod-b3"),
        ])
    );
    // Full: each refuses, and each plugin's DEL releases the other's reservation (the marker is no owner).
    assert_eq!(ours("pod-b6", &boot_b).err_code(), 101);
    assert_ne!(exec(reference, "ADD", &conf, "pod-b6", "eth0", "").rc, 0);
    exec(reference, "DEL", &conf, "pod-b2", "eth0", "").ok();
    exec_with_env(OURS, "DEL", &conf, "pod-b1", "eth0", "", &[(TEST_BOOT_ENV, &boot_b)]).ok();
    let left: Vec<String> = owners(&dir).into_iter().map(|(ip, _)| ip).collect();
    assert_eq!(left, ["10.61.0.2", "10.61.0.3", "10.61.0.6"]);
    assert_eq!(boot_markers(&net_dir).len(), 1);
}
