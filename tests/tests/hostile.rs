//! Hostile input across plugins: what a plugin run by hand says, the DEL and CHECK rows several
//! plugins share, CNI_ARGS a plugin does not read, cnitool's own table, and every table of every
//! plugin against the shipped static binary. Each plugin's own table is `cni_tests::hostile::<plugin>`
//! (tests/src/hostile/), run against the debug build by the plugin's crate (`tests/hostile.rs`).
//! Privileged (a real pod netns for the cases that get that far); subnets 10.210.x (each table its own /24).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::hostile::{
    case, check_error, env_case, env_for, exec, list_tree, random_bytes, with, with_value, without, without_keys, Case,
    Fixture, Test, BAD_CNI_ARGS, CONFIG, ENV, SYNTAX, VERSION,
};
use cni_tests::{bin_dir, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The checks of this file, each run against the binaries in a directory: by its `#[test]` against
/// the debug builds, and by [`every_table_holds_for_the_shipped_static_binary`] against the shipped one.
const CROSS_PLUGIN: &[(&str, Test)] = &[
    ("a_plugin_run_by_hand_says_what_it_is", a_plugin_run_by_hand_says_what_it_is_in),
    ("del_and_check_refuse_hostile_input_too", del_and_check_refuse_hostile_input_too_in),
    ("a_missing_prev_result_says_what_to_fix", a_missing_prev_result_says_what_to_fix_in),
    ("del_succeeds_where_add_refuses", del_succeeds_where_add_refuses_in),
    ("ignores_cni_args_it_does_not_read", ignores_cni_args_it_does_not_read_in),
    ("ignore_unknown_lets_unknown_args_through", ignore_unknown_lets_unknown_args_through_in),
    ("cnitool_refuses_hostile_input", cnitool_refuses_hostile_input_in),
];

/// A person who runs a plugin by hand (no CNI_COMMAND, an empty one, or `--help`) is told on
/// stderr what it is and which spec versions it speaks, with exit 0 and nothing on stdout, as the
/// reference plugins do; a runtime's call with CNI_COMMAND set still gets the CNI error JSON.
#[test]
fn a_plugin_run_by_hand_says_what_it_is() {
    a_plugin_run_by_hand_says_what_it_is_in(&bin_dir());
}

fn a_plugin_run_by_hand_says_what_it_is_in(bins: &Path) {
    let f = Fixture::new(bins);
    let no_command: BTreeMap<String, String> = BTreeMap::new();
    let empty_command: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), String::new())].into();
    let with_command = f.env("ADD");
    for plugin in libcni::registry::NAMES {
        let bin = bins.join(plugin);
        for (how, args, env) in [
            ("no CNI_COMMAND", &[][..], &no_command),
            ("an empty CNI_COMMAND", &[][..], &empty_command),
            ("--help", &["--help"][..], &no_command),
            ("--help with CNI_COMMAND set", &["--help"][..], &with_command),
        ] {
            let ran = exec(&bin, args, env, b"");
            assert_eq!(ran.exit, Some(0), "{plugin}, {how}: {}{}", ran.stdout, ran.stderr);
            assert_eq!(ran.stdout, "", "{plugin}, {how}: stdout");
            let first = ran.stderr.lines().next().unwrap_or_default();
            assert!(first.starts_with(&format!("CNI {plugin} plugin, cni-rs v")), "{plugin}, {how}: {}", ran.stderr);
            assert!(ran.stderr.contains("CNI protocol versions supported: "), "{plugin}, {how}: {}", ran.stderr);
        }
        // An argument that is not UTF-8 is read, not a panic (std::env::args would panic on it).
        let out = Command::new(&bin)
            .arg(std::ffi::OsStr::from_bytes(b"\xff"))
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{plugin}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{plugin}, a non-UTF-8 argument: {stderr}");
        assert!(stderr.starts_with(&format!("CNI {plugin} plugin")), "{plugin}, a non-UTF-8 argument: {stderr}");
        // The spec versions listed are the ones VERSION reports.
        let ran = exec(&bin, &[], &no_command, b"");
        let listed = ran.stderr.lines().find_map(|l| l.strip_prefix("CNI protocol versions supported: ")).unwrap_or("");
        let version_env: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "VERSION".to_string())].into();
        let reply: Value = serde_json::from_str(&exec(&bin, &[], &version_env, b"").stdout).expect("VERSION reply");
        let spoken: Vec<&str> =
            reply["supportedVersions"].as_array().expect("versions").iter().filter_map(Value::as_str).collect();
        assert_eq!(listed, spoken.join(", "), "{plugin}");
        // A runtime's call (CNI_COMMAND set) with the rest missing is still refused as JSON.
        let only_command: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "ADD".to_string())].into();
        let ran = exec(&bin, &[], &only_command, b"{}");
        assert_ne!(ran.exit, Some(0), "{plugin}: ADD with no CNI_CONTAINERID");
        let v: Value = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{plugin}: {e}: {}", ran.stdout));
        assert_eq!(v["code"], ENV, "{plugin}: {}", ran.stdout);
    }
}

/// Every table holds for what a node runs too, the static multi-call binary under every plugin
/// name: on musl, std's `OpenOptions` dropped `O_PATH`, and a FIFO as CNI_NETNS hung it. Runs every
/// plugin's table ([`cni_tests::hostile::TABLES`]) and every check of this file against it, four at a
/// time, and names each that failed (its own message is above, in the output of its thread).
#[test]
fn every_table_holds_for_the_shipped_static_binary() {
    cni_tests::require_root();
    let links = cni_tests::shipped_bin_dir(&libcni::registry::NAMES, &["cnitool", "cni-noop"]);
    let all: Vec<(&str, Test)> = cni_tests::hostile::TABLES.iter().chain(CROSS_PLUGIN).copied().collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                while let Some((name, test)) = all.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    let ran = std::thread::scope(|t| {
                        std::thread::Builder::new()
                            .name(format!("shipped {name}"))
                            .spawn_scoped(t, || test(links.path()))
                            .expect("spawn a table")
                            .join()
                    });
                    if ran.is_err() {
                        failed.lock().expect("failures").push(*name);
                    }
                }
            });
        }
    });
    let failed = failed.into_inner().expect("failures");
    assert!(
        failed.is_empty(),
        "with the shipped binary as every plugin, {} of {} failed: {failed:?}",
        failed.len(),
        all.len()
    );
}

/// DEL and CHECK get the same treatment as ADD for input that is bad on every verb.
#[test]
fn del_and_check_refuse_hostile_input_too() {
    del_and_check_refuse_hostile_input_too_in(&bin_dir());
}

fn del_and_check_refuse_hostile_input_too_in(bins: &Path) {
    let f = Fixture::new(bins);
    let mut failures = Vec::new();
    for plugin in ["bridge", "host-local", "loopback", "portmap", "tuning", "bandwidth"] {
        let base = f.base(plugin);
        let rows = [
            case("truncated", &base.to_string().as_bytes()[..10], SYNTAX),
            case("nested 300000 deep", "[".repeat(300_000), SYNTAX),
            case("unknown version", with(&base, "cniVersion", json!("2.0.0")), VERSION),
            case("name with /", with(&base, "name", json!("../x")), CONFIG),
            env_case("container id with /", &base, vec![("CNI_CONTAINERID", Some("../x".into()))], ENV),
            env_case("ifname over 15 bytes", &base, vec![("CNI_IFNAME", Some("x".repeat(16)))], ENV),
        ];
        for command in ["DEL", "CHECK"] {
            for c in &rows {
                let ran = exec(&bins.join(plugin), &[], &env_for(&f, c, command), &c.stdin);
                if let Err(why) = check_error(&ran, c.want) {
                    failures.push(format!("{plugin} {command}: {}: {why}", c.label));
                }
            }
        }
    }
    f.assert_nothing_left("DEL/CHECK");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A missing prevResult is code 7 and says what to fix, which differs by verb: on CHECK the
/// runtime did not send ADD's result; on ADD a plugin that needs one is not chained after the
/// plugin that made the pod's interface.
#[test]
fn a_missing_prev_result_says_what_to_fix() {
    a_missing_prev_result_says_what_to_fix_in(&bin_dir());
}

fn a_missing_prev_result_says_what_to_fix_in(bins: &Path) {
    let f = Fixture::new(bins);
    let check = |p: &str| format!("{p} CHECK needs prevResult: the runtime must send the result of ADD");
    let chained = |p: &str| {
        format!(
            "{p} must be called as a chained plugin, after the plugin that made the pod's interface: the \
             configuration has no prevResult"
        )
    };
    let mut failures = Vec::new();
    let mut rows = vec![("bridge", "bridge", "CHECK"), ("ptp", "ptp", "CHECK"), ("static", "static", "CHECK")];
    for p in ["portmap", "tuning", "bandwidth", "sbr", "firewall", "vrf"] {
        rows.extend([(p, p, "ADD"), (p, p, "CHECK")]);
    }
    for (plugin, binary, command) in rows {
        let stdin = without(&f.base(plugin), "prevResult");
        let ran = exec(&bins.join(binary), &[], &f.env(command), &stdin);
        let want = if command == "CHECK" { check(plugin) } else { chained(plugin) };
        let msg = serde_json::from_str::<Value>(&ran.stdout).ok().and_then(|v| v["msg"].as_str().map(String::from));
        if let Err(why) = check_error(&ran, CONFIG) {
            failures.push(format!("{plugin} {command}: {why}"));
        } else if msg.as_deref() != Some(want.as_str()) {
            failures.push(format!("{plugin} {command}: {msg:?}, wanted {want:?}"));
        }
    }
    f.assert_nothing_left("no prevResult");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// DEL is best effort: what would refuse ADD but does not say which attachment to remove lets DEL
/// succeed (an unknown or malformed CNI_ARGS, a plugin key that no longer validates, a broken
/// prevResult or runtimeConfig, a netns path left as an empty file), and it leaves nothing behind.
#[test]
fn del_succeeds_where_add_refuses() {
    del_succeeds_where_add_refuses_in(&bin_dir());
}

fn del_succeeds_where_add_refuses_in(bins: &Path) {
    let f = Fixture::new(bins);
    std::fs::write(f.scratch.path().join("data").join("netns-empty"), "").expect("write");
    let empty_netns = f.scratch.path().join("data").join("netns-empty").display().to_string();
    let mut failures = Vec::new();
    for plugin in ["bridge", "host-local", "loopback", "portmap", "tuning", "bandwidth", "ptp", "host-device"] {
        let base = f.base(plugin);
        let mut rows: Vec<Case> = BAD_CNI_ARGS
            .iter()
            .map(|(label, args)| env_case(*label, &base, vec![("CNI_ARGS", Some(args.to_string()))], 0))
            .collect();
        rows.extend([
            case("prevResult garbage", with(&base, "prevResult", json!("garbage")), 0),
            case("prevResult of an unknown version", with(&base, "prevResult", json!({ "cniVersion": "0.0.7" })), 0),
            case("runtimeConfig a number", with(&base, "runtimeConfig", json!(5)), 0),
            case("args a string", with(&base, "args", json!("x")), 0),
            case("dns a number", with(&base, "dns", json!(5)), 0),
            env_case("CNI_NETNS an empty file", &base, vec![("CNI_NETNS", Some(empty_netns.clone()))], 0),
        ]);
        match plugin {
            "bridge" => rows.extend([
                case("mtu 67", with(&base, "mtu", json!(67)), 0),
                case("ipMasqBackend unknown", with(&base, "ipMasqBackend", json!("pf")), 0),
                case("vlan 4095", with(&base, "vlan", json!(4095)), 0),
                case("runtimeConfig.mac not a MAC", with(&base, "runtimeConfig", json!({ "mac": "zz:zz" })), 0),
                case(
                    "ipam subnet not a CIDR",
                    with(&base, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
                    0,
                ),
                // An IPAM type it will not run: everything else is removed, and DEL says so.
                case(
                    "ipam.type with / and a bad mtu",
                    with(&with_value(&base, "mtu", json!(67)), "ipam", json!({ "type": "../../bin/sh" })),
                    CONFIG,
                ),
            ]),
            "host-local" => rows.push(case(
                "ipam subnet not a CIDR",
                with(&base, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
                0,
            )),
            "portmap" => {
                let maps = |m: Value| with(&base, "runtimeConfig", json!({ "portMappings": m }));
                rows.extend([
                    case("hostPort 0", maps(json!([{ "hostPort": 0, "containerPort": 80 }])), 0),
                    case("hostIP not an IP", maps(json!([{ "hostPort": 1, "containerPort": 80, "hostIP": "x" }])), 0),
                    case("portMappings a string", maps(json!("8080:80")), 0),
                    case("backend unknown", with(&base, "backend", json!("pf")), 0),
                    case("markMasqBit a string", with(&base, "markMasqBit", json!("13")), 0),
                ]);
            }
            "tuning" => rows.extend([
                case("sysctl kernel.hostname", with(&base, "sysctl", json!({ "kernel.hostname": "x" })), 0),
                case("mtu -1", with(&base, "mtu", json!(-1)), 0),
                case("mac not a MAC", with(&base, "mac", json!("zz")), 0),
            ]),
            "bandwidth" => rows.extend([
                case("ingressRate without ingressBurst", with(&base, "ingressBurst", json!(0)), 0),
                case("egressRate a string", with(&base, "egressRate", json!("8Mbit")), 0),
                case("unshapedSubnets", with(&base, "unshapedSubnets", json!(["10.0.0.0/8"])), 0),
            ]),
            "ptp" => rows.extend([
                case("mtu 67", with(&base, "mtu", json!(67)), 0),
                case("ipMasqBackend unknown", with(&base, "ipMasqBackend", json!("pf")), 0),
                case("no ipam type", with(&base, "ipam", json!({})), 0),
            ]),
            "host-device" => rows.extend([
                case("no device key", without(&base, "device"), 0),
                case("hwaddr not a MAC", with(&without_keys(&base, &["device"]), "hwaddr", json!("zz")), 0),
            ]),
            _ => {}
        }
        for c in &rows {
            let ran = exec(&bins.join(plugin), &[], &env_for(&f, c, "DEL"), &c.stdin);
            let outcome = if c.want == 0 {
                if ran.exit == Some(0) {
                    Ok(())
                } else {
                    Err(format!("failed: {} {}", ran.stdout, ran.stderr))
                }
            } else {
                check_error(&ran, c.want)
            };
            if let Err(why) = outcome {
                failures.push(format!("{plugin} DEL: {}: {why}", c.label));
            }
        }
    }
    f.assert_nothing_left("DEL");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// portmap and loopback read no CNI_ARGS: unknown keys and malformed pairs are ignored on ADD and
/// DEL alike (as the reference plugins, which never load them), and the plugin really works.
#[test]
fn ignores_cni_args_it_does_not_read() {
    ignores_cni_args_it_does_not_read_in(&bin_dir());
}

fn ignores_cni_args_it_does_not_read_in(bins: &Path) {
    let f = Fixture::new(bins);
    for plugin in ["loopback", "portmap"] {
        let conf = f.base(plugin).to_string();
        for (label, args) in BAD_CNI_ARGS {
            let mut env = f.env("ADD");
            env.insert("CNI_ARGS".into(), args.into());
            let ran = exec(&bins.join(plugin), &[], &env, conf.as_bytes());
            assert_eq!(ran.exit, Some(0), "{plugin} ADD with {label}: {} {}", ran.stdout, ran.stderr);
            env.insert("CNI_COMMAND".into(), "DEL".into());
            let ran = exec(&bins.join(plugin), &[], &env, conf.as_bytes());
            assert_eq!(ran.exit, Some(0), "{plugin} DEL with {label}: {} {}", ran.stdout, ran.stderr);
        }
    }
    f.assert_nothing_left("after DEL");
}

/// Unknown CNI_ARGS keys pass with IgnoreUnknown, and the plugin then really works (and DEL undoes it).
#[test]
fn ignore_unknown_lets_unknown_args_through() {
    ignore_unknown_lets_unknown_args_through_in(&bin_dir());
}

fn ignore_unknown_lets_unknown_args_through_in(bins: &Path) {
    let f = Fixture::new(bins);
    for plugin in ["host-local", "loopback", "bridge"] {
        let conf = f.base(plugin).to_string();
        let mut env = f.env("ADD");
        env.insert("CNI_ARGS".into(), "IgnoreUnknown=1;NOSUCHKEY=1;K8S_POD_NAME=web".into());
        let ran = exec(&bins.join(plugin), &[], &env, conf.as_bytes());
        assert_eq!(ran.exit, Some(0), "{plugin}: ADD with IgnoreUnknown: {} {}", ran.stdout, ran.stderr);
        let result: Value = serde_json::from_str(&ran.stdout).expect("result JSON");
        assert_eq!(result["cniVersion"], "1.0.0");
        env.insert("CNI_COMMAND".into(), "DEL".into());
        let ran = exec(&bins.join(plugin), &[], &env, conf.as_bytes());
        assert_eq!(ran.exit, Some(0), "{plugin}: DEL: {} {}", ran.stdout, ran.stderr);
    }
    f.assert_nothing_left("after DEL");
}

/// cnitool: bad arguments, environment and configuration files are refused with the code, as JSON.
#[test]
fn cnitool_refuses_hostile_input() {
    cnitool_refuses_hostile_input_in(&bin_dir());
}

fn cnitool_refuses_hostile_input_in(bins: &Path) {
    let f = Fixture::new(bins);
    let confdir = TempDir::new("cnhc");
    let cache = TempDir::new("cnhk");
    let good = json!({ "cniVersion": "1.0.0", "name": f.network, "plugins": [{ "type": "loopback" }] });
    std::fs::write(confdir.path().join("10-good.conflist"), good.to_string()).expect("write");
    std::fs::write(confdir.path().join("20-random.conflist"), random_bytes(1 << 20, 7)).expect("write");
    std::fs::write(confdir.path().join("30-deep.conflist"), "[".repeat(300_000)).expect("write");
    let bad_ifname = json!({ "cniVersion": "9.9.9", "name": "badver", "plugins": [{ "type": "loopback" }] });
    std::fs::write(confdir.path().join("40-badver.conflist"), bad_ifname.to_string()).expect("write");
    let env = |extra: &[(&str, &str)]| -> BTreeMap<String, String> {
        let mut e: BTreeMap<String, String> = [
            ("NETCONFPATH", confdir.path().display().to_string()),
            ("CNI_PATH", bins.display().to_string()),
            ("CNI_CACHE_DIR", cache.path().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            e.insert(k.to_string(), v.to_string());
        }
        e
    };
    let netns_file = f.scratch.path().join("data").join("netns-file");
    std::fs::write(&netns_file, "x").expect("write");
    let file = netns_file.display().to_string();
    let pod = f.pod.path.as_str();
    let net = f.network.as_str();
    // Under the kernel's 128 KiB limit on one environment string, far over serde's depth limit.
    let deep_caps = "[".repeat(100_000);
    type Row<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, u32);
    let rows: Vec<Row> = vec![
        ("unknown command", vec!["attach", net, pod], vec![], ENV),
        ("unknown option", vec!["add", "--frobnicate", net, pod], vec![], ENV),
        // Arguments after <network> <netns> are ignored, as upstream's cnitool does.
        ("no arguments to add", vec!["add"], vec![], ENV),
        ("missing netns", vec!["add", net], vec![], ENV),
        ("network that does not exist", vec!["add", "nosuchnet", pod], vec![], CONFIG),
        ("network name with /", vec!["add", "../../etc", pod], vec![], CONFIG),
        ("network name with shell text", vec!["add", "$(reboot)", pod], vec![], CONFIG),
        ("network with an unknown cniVersion", vec!["add", "badver", pod], vec![], VERSION),
        ("ifname over 15 bytes", vec!["add", net, pod, "-i", "eth0123456789abc"], vec![], ENV),
        ("ifname with /", vec!["add", net, pod, "--ifname", "a/b"], vec![], ENV),
        ("netns a regular file", vec!["add", net, &file], vec![], ENV),
        ("netns a directory", vec!["add", net, "/tmp"], vec![], ENV),
        ("netns missing", vec!["add", net, "/run/netns/cni-rs-no-such-ns"], vec![], ENV),
        ("CNI_PATH empty", vec!["add", net, pod], vec![("CNI_PATH", "")], ENV),
        ("CNI_ARGS malformed", vec!["add", net, pod], vec![("CNI_ARGS", "a=b=c")], ENV),
        ("CAP_ARGS not JSON", vec!["add", net, pod], vec![("CAP_ARGS", "{portMappings")], ENV),
        ("CAP_ARGS an array", vec!["add", net, pod], vec![("CAP_ARGS", "[]")], ENV),
        ("CAP_ARGS nested 100000 deep", vec!["add", net, pod], vec![("CAP_ARGS", &deep_caps)], ENV),
        ("gc --keep malformed", vec!["gc", net, "--keep", "nocolon"], vec![], ENV),
    ];
    let mut failures = Vec::new();
    for (label, mut args, extra, want) in rows {
        args.push("--json");
        let ran = exec(&bins.join("cnitool"), &args, &env(&extra), b"");
        let check = || -> Result<(), String> {
            let Some(exit) = ran.exit else { return Err(format!("killed by a signal: {}", ran.stderr)) };
            if exit == 0 {
                return Err(format!("succeeded: {}", ran.stdout));
            }
            let line = ran.stdout.lines().last().unwrap_or_default();
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("stdout not JSON ({e}): {:?}", ran.stdout))?;
            let code = v["code"].as_u64().ok_or_else(|| format!("no code: {v}"))?;
            if code == 110 || ran.stderr.contains("panicked") || !v["msg"].is_string() {
                return Err(format!("bad error: {v} {}", ran.stderr));
            }
            if code != u64::from(want) {
                return Err(format!("code {code}, wanted {want}: {}", v["msg"]));
            }
            Ok(())
        };
        if let Err(why) = check() {
            failures.push(format!("cnitool {label}: {why}"));
        }
    }
    f.assert_nothing_left("cnitool");
    assert!(list_tree(&cache.path().join("results")).is_empty(), "cnitool cached a failed ADD");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
