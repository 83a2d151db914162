//! Memory: a plugin's peak RSS stays within four times its configuration, up to the 16 MiB limit on a
//! configuration, whatever the configuration's shape; larger ones, and ones whose decoded tree would
//! be too large, are refused with code 6 without being read further. Peak RSS is measured by
//! `cni-peak` (tests/bench/src/bin/peak.rs): wait4's `ru_maxrss` of a child of a small process, since
//! a child spawned by this (large) test process would start at our own high-water mark.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, unique, TempDir};
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Command, Stdio};

const LIMIT: usize = 16 << 20;

struct Peak {
    kib: u64,
    code: Option<i32>,
    stdout: String,
}

/// Run `plugin` under cni-peak with `stdin`; `ADD` unless `command` says otherwise.
fn peak(plugin: &str, stdin: Vec<u8>, data: &TempDir) -> Peak {
    let out = data.path().join(unique("peak"));
    let mut child = Command::new(bin_dir().join("cni-peak"))
        .arg(&out)
        .arg(bin_dir().join(plugin))
        .env_clear()
        .env("CNI_COMMAND", "ADD")
        .env("CNI_CONTAINERID", unique("ctrm"))
        .env("CNI_NETNS", "/run/netns/cni-rs-memory-test-no-such-ns")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn cni-peak (run `cargo build --workspace --bins`): {e}"));
    let mut pipe = child.stdin.take().unwrap();
    // A refused configuration is not read to its end: the broken pipe is expected.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&stdin);
    });
    let done = child.wait_with_output().unwrap();
    writer.join().unwrap();
    let report = std::fs::read_to_string(&out).unwrap();
    let kib = report.split_whitespace().next().unwrap().parse().unwrap();
    Peak { kib, code: done.status.code(), stdout: String::from_utf8_lossy(&done.stdout).into_owned() }
}

fn base(data: &TempDir) -> Value {
    json!({ "cniVersion": "1.0.0", "name": unique("netm"), "type": "bridge",
            "ipam": { "type": "host-local", "subnet": "10.212.0.0/24", "dataDir": data.path().join("ipam") } })
}

/// `conf` with, at `path` (dot-separated), one long string (for a one-character `item`) or an array
/// of `item`, so that the whole text is just under the limit.
fn just_under_limit(conf: &Value, path: &str, item: Value) -> Vec<u8> {
    let mut v = conf.clone();
    let keys: Vec<&str> = path.split('.').collect();
    let last = keys[keys.len() - 1];
    let room = LIMIT - 64 - v.to_string().len() - last.len();
    let mut at = &mut v;
    for k in &keys[..keys.len() - 1] {
        if at.get(*k).is_none() {
            at[*k] = json!({});
        }
        at = &mut at[*k];
    }
    at[last] = match item {
        Value::String(s) if s.len() == 1 => Value::String(s.repeat(room)),
        item => {
            let each = item.to_string().len() + 1;
            Value::Array(vec![item; room / each])
        }
    };
    let text = v.to_string().into_bytes();
    assert!(text.len() <= LIMIT && text.len() > LIMIT - (1 << 10), "{}", text.len());
    text
}

/// `conf`'s text followed by spaces up to `len` bytes: valid JSON of that size.
fn padded(conf: &Value, len: usize) -> Vec<u8> {
    let mut text = conf.to_string().into_bytes();
    text.resize(len, b' ');
    text
}

fn error_code(p: &Peak) -> u64 {
    let v: Value = serde_json::from_str(&p.stdout).unwrap_or_else(|e| panic!("{e}: {}", p.stdout));
    v["code"].as_u64().unwrap()
}

/// The bounds hold for what a node runs too: with dlmalloc alone, the static binary read a 16 MiB
/// stdin at a peak of 43 MiB (it grows a large block by copying it), over the bound below.
#[test]
fn the_bounds_hold_for_the_shipped_static_binary() {
    if cni_tests::in_shipped_run() {
        return;
    }
    cni_tests::holds_for_the_shipped_binary(&libcni::registry::NAMES, &["cni-peak"], 2);
}

#[test]
fn peak_memory_stays_within_four_times_the_configuration() {
    let data = TempDir::new("cnm");
    let conf = base(&data);
    // The costliest shapes that are accepted (a subtree of the netconf's own keys is copied into the
    // typed config) through every plugin; the others through host-local only (all plugins share skel).
    const ALL: &[&str] = &["host-local", "bridge", "portmap", "loopback"];
    const ONE: &[&str] = &["host-local"];
    let shapes = [
        ("a long string", "pad", json!("x"), ONE),
        ("a long string in ipam", "ipam.pad", json!("x"), ALL),
        ("a long string in runtimeConfig", "runtimeConfig.pad", json!("x"), ONE),
        ("200-byte strings in runtimeConfig", "runtimeConfig.pad", json!("y".repeat(200)), ALL),
        ("200-byte strings in args", "args.cni.pad", json!("y".repeat(200)), ONE),
    ];
    let mut failures = Vec::new();
    for (label, path, item, plugins) in shapes {
        let stdin = just_under_limit(&conf, path, item);
        let len = stdin.len() as u64;
        for &plugin in plugins {
            let p = peak(plugin, stdin.clone(), &data);
            // Every plugin gets past parsing: host-local succeeds, the others stop at the missing
            // namespace or prevResult, never at the configuration's size.
            let parsed = if plugin == "host-local" {
                p.code == Some(0)
            } else {
                ![Some(0), None].contains(&p.code) && error_code(&p) != 6
            };
            if !parsed {
                failures.push(format!("{plugin} {label}: did not get past parsing: {}", p.stdout));
            }
            let ratio = (p.kib * 1024) as f64 / len as f64;
            eprintln!("{plugin} {label}: peak {} KiB for {} KiB, {ratio:.2}x", p.kib, len >> 10);
            if p.kib * 1024 > 4 * len {
                failures.push(format!("{plugin} {label}: peak {} KiB is {ratio:.2} times the input", p.kib));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn too_large_or_too_costly_configurations_are_refused_early() {
    let data = TempDir::new("cnm");
    let conf = base(&data);
    const ALL: &[&str] = &["host-local", "bridge", "portmap", "loopback"];
    const ONE: &[&str] = &["host-local"];
    let mapping = json!({ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" });
    let costly = "too many small JSON values";
    let rows: Vec<(&str, Vec<u8>, &str, &[&str])> = vec![
        ("one byte over the limit", padded(&conf, LIMIT + 1), "16 MiB", ALL),
        // What a runaway writer sends: far more than the limit; at most the limit + 1 is read.
        ("256 MiB", vec![b' '; 256 << 20], "16 MiB", ONE),
        ("port mappings under the limit", just_under_limit(&conf, "runtimeConfig.portMappings", mapping), costly, ALL),
        ("numbers under the limit", just_under_limit(&conf, "pad", json!(1)), costly, ONE),
    ];
    let mut failures = Vec::new();
    for (label, stdin, says, plugins) in rows {
        for &plugin in plugins {
            let p = peak(plugin, stdin.clone(), &data);
            if p.code != Some(1) || error_code(&p) != 6 || !p.stdout.contains(says) {
                failures.push(format!("{plugin} {label}: wanted code 6 saying {says:?}: {}", p.stdout));
            }
            // The text itself (at most the limit + 1 byte) and the process: nothing decoded.
            if p.kib * 1024 > LIMIT as u64 + (8 << 20) {
                failures.push(format!("{plugin} {label}: peak {} KiB while refusing", p.kib));
            }
        }
    }
    assert!(std::fs::read_dir(data.path().join("ipam")).map(|d| d.count()).unwrap_or(0) == 0, "refused ADD reserved");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
