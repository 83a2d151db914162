#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The benchmark behind the README's numbers keeps working: `cni-bench` at its smallest, against the
//! installed reference plugins, writes a CSV with measurements of both plugin sets and the floor
//! (also per scaling level) and of the meta plugins' chains, both plots and the results block, and
//! leaves nothing behind.

use cni_tests::{bin_dir, sh, Netns, TempDir};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

/// (section, side, metric, level) -> value, from results.csv.
fn read_csv(path: &Path) -> HashMap<(String, String, String, String), f64> {
    let text = std::fs::read_to_string(path).expect("results.csv");
    let mut out = HashMap::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 6 || f[0] == "machine" {
            continue;
        }
        let v: f64 = f[4].parse().unwrap_or_else(|_| panic!("not a number in {line:?}"));
        out.insert((f[0].into(), f[1].into(), f[2].into(), f[3].into()), v);
    }
    out
}

#[test]
fn cni_bench_measures_both_plugin_sets_and_the_floor() {
    let out = TempDir::new("cnib-out");
    let bin = bin_dir();
    // In a network namespace of its own: the tables and chains both plugin sets keep for the next
    // pod (cni_rs_portmap, the reference's CNI-HOSTPORT-* and CNI-FORWARD, ...) go with it.
    let node = Netns::new("cnibnode");
    let host_firewall = firewall_objects(None);
    let run = Command::new("ip")
        .args(["netns", "exec", &node.name])
        .arg(bin.join("cni-bench"))
        .env("CNI_BENCH_OURS", &bin)
        .args(["--quick", "--samples", "2", "--churn", "2", "--levels", "10", "--scale-samples", "2", "--out"])
        .arg(out.path())
        .output()
        .expect("run cni-bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "cni-bench failed: {stderr}");

    let csv = read_csv(&out.path().join("results.csv"));
    let key = |a: &str, b: &str, c: &str, d: &str| (a.to_string(), b.to_string(), c.to_string(), d.to_string());
    for k in [
        key("latency", "ours", "add_median", ""),
        key("latency", "ours", "del_median", ""),
        key("latency", "reference", "add_median", ""),
        key("latency", "reference", "del_median", ""),
        key("latency", "floor", "add_median", ""),
        key("latency", "ours", "ptp_add_median", ""),
        key("latency", "reference", "ptp_del_median", ""),
        key("latency", "floor+nft", "add_median", ""),
        key("latency_chain", "ours", "add_median", "bandwidth"),
        key("latency_chain", "reference", "del_median", "bandwidth"),
        key("latency_chain", "ours", "del_median", "podman"),
        key("latency_chain", "reference", "add_median", "podman"),
        // Each chain's floor, in its rotation: the kernel's own link work for that chain.
        key("latency", "floor", "ptp_del_median", ""),
        key("latency", "floor", "macvlan_add_median", ""),
        key("latency_chain", "floor", "del_median", "bandwidth"),
        key("latency_chain", "floor", "add_median", "podman"),
        key("churn", "ours", "pods_per_second", "1"),
        key("churn", "reference", "pods_per_second", "1"),
        key("scaling", "ours", "add_median", "10"),
        key("scaling", "reference", "del_median", "10"),
        key("scaling", "floor", "add_median", "10"),
        key("scaling_plugin", "ours", "bridge_add_ms", "10"),
        key("scaling_plugin", "reference", "portmap_add_ms", "10"),
        key("plugin", "ours", "host-local_add_ms", ""),
        key("footprint", "ours", "installed_bytes", "4"),
        key("footprint", "reference", "installed_bytes", "16"),
    ] {
        let v = csv.get(&k).unwrap_or_else(|| panic!("results.csv has no {k:?}"));
        assert!(*v > 0.0, "{k:?} = {v}");
    }
    // A pod's ADD is a real piece of kernel work on both sides: not zero, not a placeholder.
    let floor = csv[&key("latency", "floor", "add_median", "")];
    assert!(csv[&key("latency", "ours", "add_median", "")] > floor / 4.0);

    for svg in ["latency.svg", "scaling.svg"] {
        let s = std::fs::read_to_string(out.path().join(svg)).expect(svg);
        assert!(s.contains("<svg") && (s.contains("<rect") || s.contains("<polyline")), "{svg} draws nothing");
    }
    let readme = std::fs::read_to_string(out.path().join("README.md")).expect("README.md");
    assert!(
        readme.contains("cni-bench results: begin")
            && readme.contains("Where the ADD and DEL growth goes")
            && readme.contains("| bridge + portmap (snat) + bandwidth: ADD median |")
            && readme.contains("| bridge + portmap + firewall + tuning: DEL p99 |"),
        "{readme}"
    );

    // Nothing left: namespaces, links, state.
    let netns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    assert!(!netns.iter().any(|n| n.starts_with("cnib-")), "namespaces left: {netns:?}");
    for links in [node.ip(&["-o", "link", "show"]), sh("ip", &["-o", "link", "show"])] {
        assert!(!links.contains(": cnib"), "links left: {links}");
    }
    assert!(firewall_objects(Some(&node)).contains("cni_rs_portmap"), "the run was not in its namespace");
    assert_eq!(firewall_objects(None), host_firewall, "the host's firewall changed");
    for state in ["/run/cni-bench", "/run/cni-bench-bin", "/run/cni-bench-ref", "/run/cni-bench-floor"] {
        assert!(!Path::new(state).exists(), "state left: {state}");
    }
}

/// The nftables tables and the iptables chains of `ns` (the host's when `None`), as text.
fn firewall_objects(ns: Option<&Netns>) -> String {
    let run = |cmd: &str, args: &[&str]| match ns {
        Some(ns) => String::from_utf8_lossy(&ns.exec(cmd, args).stdout).into_owned(),
        None => String::from_utf8_lossy(&Command::new(cmd).args(args).output().map(|o| o.stdout).unwrap_or_default())
            .into_owned(),
    };
    let mut text = run("nft", &["list", "tables"]);
    for table in ["filter", "nat"] {
        text += &run("iptables", &["-t", table, "-S"]);
    }
    text
}

/// `cni-peak` reports the peak RSS of the program it runs, not that of whoever started it: the
/// benchmark's own memory (here a test process grown by 64 MiB) must not show up as a plugin's.
#[test]
fn cni_peak_measures_the_program_not_its_parent() {
    let peak = bin_dir().join("cni-peak");
    let mut ballast = vec![0u8; 64 << 20];
    for (i, b) in ballast.iter_mut().enumerate().step_by(4096) {
        *b = i as u8;
    }
    let out = TempDir::new("cni-peak");
    let run = |program: &str| -> (u64, u64) {
        let report = out.path().join("report");
        let status = Command::new(&peak).arg(&report).arg(program).status().expect("run cni-peak");
        assert!(status.success(), "cni-peak {program}: {status}");
        let text = std::fs::read_to_string(&report).expect("report");
        let f: Vec<u64> = text.split_whitespace().map(|x| x.parse().expect("number")).collect();
        assert_eq!(f.len(), 2, "{text:?}");
        (f[0], f[1])
    };
    // A small program: far below the 64 MiB its starter holds.
    let (small, ns) = run("/bin/true");
    assert!(small > 0 && small < 16 * 1024, "/bin/true peak {small} KiB");
    assert!(ns > 0);
    // A program that touches 32 MiB (dd's buffer) reads at least that.
    let script = out.path().join("dd.sh");
    std::fs::write(&script, "#!/bin/sh\nexec dd if=/dev/zero of=/dev/null bs=32M count=2 status=none\n")
        .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let (big, _) = run(script.to_str().expect("utf-8 path"));
    assert!(big >= 32 * 1024, "dd with a 32 MiB buffer: peak {big} KiB");
    std::hint::black_box(&ballast);
}
