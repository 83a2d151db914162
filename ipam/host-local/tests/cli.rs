//! The built binary driven through env and stdin, as a runtime drives it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::*;
use cni_tests::{reservations, TempDir};
use serde_json::{json, Value};
use std::collections::HashSet;

/// The host-local binary this crate builds.
const OURS: &str = env!("CARGO_BIN_EXE_host-local");

fn dual_stack(dir: &TempDir) -> Value {
    json!({"type": "host-local", "dataDir": dir.path(),
        "ranges": [[{"subnet": "10.10.0.0/24"}], [{"subnet": "fd10::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}]})
}

#[test]
fn every_version_add_check_del() {
    for v in VERSIONS {
        let dir = TempDir::new("versions");
        let net = format!("net-{}", v.replace('.', "-"));
        let conf = netconf(v, &net, dual_stack(&dir));
        let add = exec(OURS, "ADD", &conf, "cid1", "eth0", "");
        let result = add.ok().clone();
        assert_eq!(result["cniVersion"], v, "{}", add.stdout);
        assert_eq!(add.ips(), ["10.10.0.2/24", "fd10::2/64"], "{v}: {}", add.stdout);
        if v == "0.1.0" || v == "0.2.0" {
            assert_eq!(result["ip4"]["gateway"], "10.10.0.1", "{}", add.stdout);
        } else {
            assert_eq!(result["ips"][0]["gateway"], "10.10.0.1");
            assert!(result["ips"][0].get("interface").is_none(), "{}", add.stdout);
            assert_eq!(result["routes"][0]["dst"], "0.0.0.0/0");
        }
        assert_eq!(
            reservations(dir.path(), &net),
            [
                ("10.10.0.2".to_string(), "cid1\r\neth0".to_string()),
                ("fd10::2".to_string(), "cid1\r\neth0".to_string())
            ]
        );

        let mut with_prev = conf.clone();
        with_prev["prevResult"] = result.clone();
        let check = exec(OURS, "CHECK", &with_prev, "cid1", "eth0", "");
        if v >= "0.4.0" {
            check.ok();
            assert_eq!(exec(OURS, "CHECK", &with_prev, "other", "eth0", "").err_code(), 103);
        } else {
            assert_eq!(check.err_code(), 1, "{v}");
        }

        let gc = exec(OURS, "GC", &conf, "", "", "");
        let status = exec(OURS, "STATUS", &conf, "", "", "");
        if v == "1.1.0" {
            gc.ok();
            status.ok();
        } else {
            assert_eq!(gc.err_code(), 1, "{v}");
            assert_eq!(status.err_code(), 1, "{v}");
        }

        exec(OURS, "DEL", &conf, "cid1", "eth0", "").ok();
        assert!(reservations(dir.path(), &net).is_empty(), "{v}");
        exec(OURS, "DEL", &conf, "cid1", "eth0", "").ok();
        if v >= "0.4.0" {
            assert_eq!(exec(OURS, "CHECK", &with_prev, "cid1", "eth0", "").err_code(), 103);
        }
    }
}

#[test]
fn repeated_add_returns_the_held_address_and_round_robin_continues() {
    let dir = TempDir::new("repeat");
    let conf = netconf("1.0.0", "repeat", dual_stack(&dir));
    let first = exec(OURS, "ADD", &conf, "a", "eth0", "");
    let again = exec(OURS, "ADD", &conf, "a", "eth0", "");
    assert_eq!(first.ips(), again.ips());
    assert_eq!(exec(OURS, "ADD", &conf, "a", "eth1", "").first_ip(), "10.10.0.3");
    assert_eq!(exec(OURS, "ADD", &conf, "b", "eth0", "").first_ip(), "10.10.0.4");
    exec(OURS, "DEL", &conf, "a", "eth0", "").ok();
    // Round-robin: the freed .2 is not reused before the range wraps.
    assert_eq!(exec(OURS, "ADD", &conf, "c", "eth0", "").first_ip(), "10.10.0.5");
}

#[test]
fn requested_addresses_from_cni_args_and_runtime_config() {
    let dir = TempDir::new("requested");
    let conf = netconf("1.0.0", "req", dual_stack(&dir));
    let out = exec(OURS, "ADD", &conf, "a", "eth0", "IP=10.10.0.50,fd10::50");
    assert_eq!(out.ips(), ["10.10.0.50/24", "fd10::50/64"]);
    let taken = exec(OURS, "ADD", &conf, "b", "eth0", "IP=10.10.0.50");
    assert_eq!(taken.err_code(), 7, "{}", taken.stdout);
    assert!(taken.msg().contains("10.10.0.50"));
    // The failed ADD reserved nothing for b.
    assert!(!reservations(dir.path(), "req").iter().any(|(_, c)| c.starts_with("b\r\n")));
    assert_eq!(exec(OURS, "ADD", &conf, "b", "eth0", "IP=10.10.0.1").err_code(), 7);
    assert_eq!(exec(OURS, "ADD", &conf, "b", "eth0", "IP=192.168.9.9").err_code(), 7);

    let mut rc = conf.clone();
    rc["runtimeConfig"] = json!({"ips": ["10.10.0.60/24"]});
    rc["args"] = json!({"cni": {"ips": ["fd10::60"]}});
    assert_eq!(exec(OURS, "ADD", &rc, "c", "eth0", "").ips(), ["10.10.0.60/24", "fd10::60/64"]);

    let mut ranges = conf.clone();
    ranges["runtimeConfig"] = json!({"ipRanges": [[{"subnet": "192.168.5.0/24"}]]});
    // Prepending shifts the set indices, so round-robin restarts (the reference behaves the same).
    assert_eq!(exec(OURS, "ADD", &ranges, "d", "eth0", "").ips(), ["192.168.5.2/24", "10.10.0.2/24", "fd10::2/64"]);
}

#[test]
fn a_refused_request_leaves_the_data_directory_as_it_was() {
    let dir = TempDir::new("refused");
    let conf = netconf("1.0.0", "refused", dual_stack(&dir));
    // The first set's address is free; the second set's is its gateway.
    let out = exec(OURS, "ADD", &conf, "a", "eth0", "IP=10.10.0.50,fd10::1");
    assert_eq!(out.err_code(), 7, "{}", out.stdout);
    assert!(out.msg().contains("fd10::1"), "{}", out.msg());
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(left.is_empty(), "a configuration error changed the data directory: {left:?}");
}

#[test]
fn exhaustion_is_101_and_rolls_back_earlier_sets() {
    let dir = TempDir::new("exhaust");
    let ipam = json!({"dataDir": dir.path(), "ranges": [
        [{"subnet": "10.20.0.0/24"}],
        [{"subnet": "10.30.0.0/29", "rangeStart": "10.30.0.2", "rangeEnd": "10.30.0.3"}]]});
    let conf = netconf("1.1.0", "small", ipam);
    exec(OURS, "ADD", &conf, "a", "eth0", "").ok();
    exec(OURS, "ADD", &conf, "b", "eth0", "").ok();
    let before = reservations(dir.path(), "small");
    let out = exec(OURS, "ADD", &conf, "c", "eth0", "");
    assert_eq!(out.err_code(), 101, "{}", out.stdout);
    assert!(out.msg().contains("range set 1 (10.30.0.2-10.30.0.3)"), "{}", out.msg());
    assert_eq!(reservations(dir.path(), "small"), before, "the address from set 0 was released");
    let status = exec(OURS, "STATUS", &conf, "", "", "");
    assert_eq!(status.err_code(), 50, "{}", status.stdout);
    assert!(status.msg().contains("range set 1"), "{}", status.msg());
    exec(OURS, "DEL", &conf, "a", "eth0", "").ok();
    exec(OURS, "STATUS", &conf, "", "", "").ok();
}

#[test]
fn status_fails_50_when_the_store_is_not_writable() {
    let dir = TempDir::new("unwritable");
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let conf = netconf("1.1.0", "n", json!({"subnet": "10.0.0.0/24", "dataDir": file.join("below")}));
    let out = exec(OURS, "STATUS", &conf, "", "", "");
    assert_eq!(out.err_code(), 50, "{}", out.stdout);
    assert_eq!(exec(OURS, "ADD", &conf, "a", "eth0", "").err_code(), 5);
}

#[test]
fn gc_keeps_exactly_the_valid_attachments() {
    let dir = TempDir::new("gc");
    let conf = netconf("1.1.0", "gcnet", json!({"subnet": "10.40.0.0/24", "dataDir": dir.path()}));
    for (cid, ifname) in [("a", "eth0"), ("a", "eth1"), ("b", "eth0"), ("c", "eth0")] {
        exec(OURS, "ADD", &conf, cid, ifname, "").ok();
    }
    // Old-format reservations (container ID only) are kept by container ID.
    let net_dir = dir.path().join("gcnet");
    std::fs::write(net_dir.join("10.40.0.100"), "old-kept").unwrap();
    std::fs::write(net_dir.join("10.40.0.101"), "old-gone").unwrap();
    std::fs::write(net_dir.join(".host-local-tmp.1.2.3"), "crash leftover").unwrap();
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "a", "ifname": "eth1"}, {"containerID": "c", "ifname": "eth0"},
        {"containerID": "old-kept", "ifname": "eth0"}]);
    exec(OURS, "GC", &gc, "", "", "").ok();
    let left: Vec<String> = reservations(dir.path(), "gcnet").into_iter().map(|(_, c)| c).collect();
    // Sorted by file name: 10.40.0.100, 10.40.0.3, 10.40.0.5.
    assert_eq!(left, ["old-kept", "a\r\neth1", "c\r\neth0"]);
    assert!(!net_dir.join(".host-local-tmp.1.2.3").exists());
    // No list at all: nothing is released.
    exec(OURS, "GC", &conf, "", "", "").ok();
    assert_eq!(reservations(dir.path(), "gcnet").len(), 3);
    gc["cni.dev/valid-attachments"] = json!([]);
    exec(OURS, "GC", &gc, "", "", "").ok();
    assert!(reservations(dir.path(), "gcnet").is_empty());
}

#[test]
fn del_of_unknown_id_and_missing_data_dir_succeed() {
    let dir = TempDir::new("del");
    let conf = netconf("1.0.0", "n", json!({"subnet": "10.0.0.0/24", "dataDir": dir.path().join("never")}));
    exec(OURS, "DEL", &conf, "nobody", "eth0", "").ok();
    assert!(!dir.path().join("never").exists());
    exec(OURS, "ADD", &conf, "a", "eth0", "").ok();
    exec(OURS, "DEL", &conf, "nobody", "eth0", "").ok();
    assert_eq!(reservations(&dir.path().join("never"), "n").len(), 1);
}

#[test]
fn old_format_reservation_is_released_by_del() {
    let dir = TempDir::new("oldfmt");
    let conf = netconf("1.0.0", "old", json!({"subnet": "10.0.0.0/24", "dataDir": dir.path()}));
    std::fs::create_dir_all(dir.path().join("old")).unwrap();
    std::fs::write(dir.path().join("old/10.0.0.2"), "legacy-cid").unwrap();
    assert_eq!(exec(OURS, "ADD", &conf, "x", "eth0", "").first_ip(), "10.0.0.3");
    exec(OURS, "DEL", &conf, "legacy-cid", "eth0", "").ok();
    assert_eq!(reservations(dir.path(), "old").len(), 1);
}

#[test]
fn invalid_config_is_code_7() {
    let dir = TempDir::new("invalid");
    for ipam in [
        json!({"subnet": "10.0.0.0/31", "dataDir": dir.path()}),
        json!({"subnet": "10.0.0.1/24", "dataDir": dir.path()}),
        json!({"subnet": "10.0.0.0/24", "dataDir": "relative"}),
        json!({"ranges": [[{"subnet": "10.0.0.0/24"}], [{"subnet": "10.0.0.0/25"}]], "dataDir": dir.path()}),
    ] {
        let out = exec(OURS, "ADD", &netconf("1.0.0", "n", ipam.clone()), "a", "eth0", "");
        assert_eq!(out.err_code(), 7, "{ipam}: {}", out.stdout);
    }
}

#[test]
fn resolv_conf_becomes_dns() {
    let dir = TempDir::new("dns");
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.0.0.53\nsearch example.com\n").unwrap();
    let conf = netconf("1.0.0", "n", json!({"subnet": "10.0.0.0/24", "dataDir": dir.path(), "resolvConf": resolv}));
    let out = exec(OURS, "ADD", &conf, "a", "eth0", "");
    assert_eq!(out.ok()["dns"], json!({"nameservers": ["10.0.0.53"], "search": ["example.com"]}));
}

#[test]
fn thirty_parallel_adds_get_distinct_addresses_and_dels_leave_nothing() {
    let dir = TempDir::new("parallel");
    let conf = netconf("1.0.0", "par", json!({"subnet": "10.50.0.0/24", "dataDir": dir.path()}));
    let run_all = |cmd: &'static str| -> Vec<Out> {
        let handles: Vec<_> = (0..30)
            .map(|i| {
                let conf = conf.clone();
                std::thread::spawn(move || exec(OURS, cmd, &conf, &format!("pod{i}"), "eth0", ""))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    };
    let adds = run_all("ADD");
    let ips: HashSet<String> = adds.iter().map(Out::first_ip).collect();
    assert_eq!(ips.len(), 30, "{ips:?}");
    let files = reservations(dir.path(), "par");
    assert_eq!(files.len(), 30);
    for (ip, owner) in &files {
        assert!(ips.contains(ip));
        assert!(owner.starts_with("pod") && owner.ends_with("\r\neth0"));
    }
    for out in run_all("DEL") {
        out.ok();
    }
    assert!(reservations(dir.path(), "par").is_empty());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("par"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.') && n != ".cni-rs-index" && !n.starts_with(".cni-rs-boot."))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn del_only_needs_the_store_location() {
    let dir = TempDir::new("del-lenient");
    let conf = netconf("1.0.0", "lenient", json!({"subnet": "10.0.0.0/24", "dataDir": dir.path()}));
    exec(OURS, "ADD", &conf, "a", "eth0", "IP=10.0.0.9").ok();
    // The ranges were edited into something invalid and the runtime repeats a bad IP arg: DEL still works.
    let edited = netconf("1.0.0", "lenient", json!({"subnet": "10.0.0.0/31", "dataDir": dir.path()}));
    exec(OURS, "DEL", &edited, "a", "eth0", "IP=garbage").ok();
    assert!(reservations(dir.path(), "lenient").is_empty());
    let relative = netconf("1.0.0", "lenient", json!({"subnet": "10.0.0.0/24", "dataDir": "rel"}));
    assert_eq!(exec(OURS, "DEL", &relative, "a", "eth0", "").err_code(), 7);
}

/// containerd's go-cni sends `runtimeConfig.ipRanges` as `[[{"Subnet":...,"RangeStart":"",...}]]` (Go
/// structs without JSON tags), and a Go runtime's `args.cni.ips` the same way: the reference decodes them
/// case-insensitively, so ADD allocates from that subnet and DEL releases it.
#[test]
fn go_style_ip_ranges_as_containerd_sends_them() {
    let dir = TempDir::new("gostyle");
    let mut conf = netconf(
        "1.0.0",
        "gostyle",
        json!({"Type": "host-local", "DataDir": dir.path(),
        "Ranges": [[{"Subnet": "10.10.0.0/24"}]]}),
    );
    conf["runtimeConfig"] = json!({"ipRanges": [[
        {"Subnet": "10.77.0.0/16", "RangeStart": "10.77.3.10", "RangeEnd": "10.77.3.20", "Gateway": ""}]]});
    let add = exec(OURS, "ADD", &conf, "a", "eth0", "");
    assert_eq!(add.ips(), ["10.77.3.10/16", "10.10.0.2/24"], "{}", add.stdout);
    assert_eq!(add.ok()["ips"][0]["gateway"], "10.77.0.1", "{}", add.stdout);
    conf["Args"] = json!({"CNI": {"IPs": ["10.77.3.15"]}});
    assert_eq!(exec(OURS, "ADD", &conf, "b", "eth0", "").first_ip(), "10.77.3.15");
    assert_eq!(reservations(dir.path(), "gostyle").len(), 4);
    exec(OURS, "DEL", &conf, "a", "eth0", "").ok();
    exec(OURS, "DEL", &conf, "b", "eth0", "").ok();
    assert!(reservations(dir.path(), "gostyle").is_empty());
    // A wrong type names the key as the runtime wrote it.
    conf["runtimeConfig"]["ipRanges"][0][0]["Subnet"] = json!(5);
    let bad = exec(OURS, "ADD", &conf, "c", "eth0", "");
    assert_eq!(bad.err_code(), 7);
    assert!(bad.msg().contains("runtimeConfig.ipRanges[0][0].Subnet"), "{}", bad.msg());
}

/// `CNI_RS_TEST_BOOT` for a boot whose id ends in `n`, started `ago` before now.
fn fake_boot(n: u8, ago: std::time::Duration) -> String {
    let started = std::time::SystemTime::now() - ago;
    let nanos = started.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("5a1d0c3e-0b7f-4e11-8d2a-6c4f00b7e9{n:02x},{nanos}")
}

/// The first ADD of a new boot releases reservations made before it started, unless
/// `keepReservationsOnReboot` says to keep them (VMs whose addresses must persist).
#[test]
fn a_reboot_releases_earlier_reservations_unless_kept() {
    for keep in [false, true] {
        let dir = TempDir::new("reboot");
        let mut ipam = dual_stack(&dir);
        if keep {
            ipam["keepReservationsOnReboot"] = json!(true);
        }
        let conf = netconf("1.1.0", "rebootnet", ipam);
        let add = |cid: &str, boot: &str| {
            exec_with_env(OURS, "ADD", &conf, cid, "eth0", "", &[(host_local::store::TEST_BOOT_ENV, boot)])
        };
        let earlier = fake_boot(1, std::time::Duration::from_secs(7200));
        assert_eq!(add("before-reboot", &earlier).ips(), ["10.10.0.2/24", "fd10::2/64"]);
        assert_eq!(add("also-before", &earlier).ips(), ["10.10.0.3/24", "fd10::3/64"]);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let now = fake_boot(2, std::time::Duration::ZERO);
        std::thread::sleep(std::time::Duration::from_millis(30));
        assert_eq!(add("after-reboot", &now).ips(), ["10.10.0.4/24", "fd10::4/64"]);
        let owners: Vec<String> = reservations(dir.path(), "rebootnet").into_iter().map(|(_, o)| o).collect();
        let after_only = ["after-reboot\r\neth0"; 2];
        if keep {
            assert_eq!(owners.len(), 6, "keepReservationsOnReboot kept nothing: {owners:?}");
        } else {
            assert_eq!(owners, after_only, "the reboot released nothing");
        }
        // The recorded boot is the new one only when reservations are released on reboot.
        let markers: Vec<String> = std::fs::read_dir(dir.path().join("rebootnet"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".cni-rs-boot."))
            .collect();
        let boot_id = |b: &str| format!(".cni-rs-boot.{}", b.split(',').next().unwrap());
        let want = if keep { vec![] } else { vec![boot_id(&now)] };
        assert_eq!(markers, want);
        // A wrong type for the key is code 7 naming it.
        let mut bad = dual_stack(&dir);
        bad["keepReservationsOnReboot"] = json!(1);
        let out = exec(OURS, "ADD", &netconf("1.1.0", "rebootnet", bad), "x", "eth0", "");
        assert_eq!(out.err_code(), 7);
        assert!(out.stdout.contains("ipam.keepReservationsOnReboot"), "{}", out.stdout);
    }
}
