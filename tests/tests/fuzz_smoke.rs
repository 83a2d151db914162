//! The fuzz targets of `fuzz/` as a bounded, deterministic mutation run on stable Rust: seeds from
//! `fuzz/corpus/<target>`, mutated at the byte level and at the JSON level (values replaced by
//! hostile ones of other types) with a fixed seed, each through the same property as the cargo-fuzz
//! target. Unprivileged; a few seconds. `CNI_RS_FUZZ_ITERS` and `CNI_RS_FUZZ_SEED` change the run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../fuzz/src/lib.rs"]
mod checks;

use cni_tests::Rng;
use serde_json::{json, Value};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

const TOKENS: [&str; 16] =
    ["\"", "{", "}", "[", "]", ",", ":", "null", "-1", "1e400", "\\u0000", "\\ud800", "/", "..", "\"\":", "0.0.0.0/0"];

fn hostile_value(rng: &mut Rng, seeds: &[Value]) -> Value {
    let strings = [
        "",
        "/",
        "..",
        "../../etc",
        "a/b",
        "x;rm -rf /",
        "réseau",
        "\u{0}",
        "10.0.0.0/33",
        "10.0.0.1/32",
        "fd00::/128",
        "::ffff:10.0.0.1",
        "0.0.0.0/0",
        "255.255.255.255",
        "10.0.0.5",
        "fd00::1/64",
        "1.0.0",
        "0.2.0",
        "9.9.9",
        "1.0.0.0",
        "tcp",
        "sctp",
        "icmp",
        "true",
        "FALSE",
        "nftables",
        "iptables",
        "0a:58:0a:f4:01:02",
        "01:00:5e:00:00:01",
        "host-local",
        "eth0",
        "cni0123456789abcdef",
    ];
    match rng.below(12) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(rng.pick(&[-1i64, 0, 1, 67, 68, 4094, 4095, 65535, 65536, i64::from(i32::MAX), i64::MAX, i64::MIN])),
        3 => json!(rng.pick(&[0.5f64, 1e308, -0.0, 1e20])),
        4 => json!(u64::MAX),
        5 => json!([]),
        6 => json!({}),
        7 => "x".repeat(rng.below(300)).into(),
        8 => {
            // A copy of a node from another seed: plausible structure in the wrong place.
            let mut nodes = Vec::new();
            collect(rng.pick(seeds), &mut nodes);
            rng.pick(&nodes).clone()
        }
        _ => Value::String(rng.pick(&strings).to_string()),
    }
}

fn collect(v: &Value, out: &mut Vec<Value>) {
    out.push(v.clone());
    match v {
        Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
        Value::Object(m) => m.values().for_each(|x| collect(x, out)),
        _ => {}
    }
}

fn count(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(count).sum(),
        Value::Object(m) => m.values().map(count).sum(),
        _ => 0,
    }
}

/// Change the `n`th node (pre-order) of `v`: replace it, drop a key or element, or add one.
fn mutate_node(v: &mut Value, n: &mut usize, rng: &mut Rng, seeds: &[Value]) -> bool {
    if *n == 0 {
        match (rng.below(4), &mut *v) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let k = m.keys().nth(rng.below(m.len())).cloned().unwrap_or_default();
                m.remove(&k);
            }
            (1, Value::Object(m)) => {
                let keys = [
                    "cniVersion",
                    "name",
                    "type",
                    "ipam",
                    "prevResult",
                    "runtimeConfig",
                    "subnet",
                    "ranges",
                    "ips",
                    "interfaces",
                    "address",
                    "dst",
                    "gw",
                    "mtu",
                    "bridge",
                    "hostPort",
                    "portMappings",
                    "ip4",
                    "routes",
                    "dataDir",
                ];
                m.insert(rng.pick(&keys).to_string(), hostile_value(rng, seeds));
            }
            (2, Value::Array(a)) if !a.is_empty() => {
                let i = rng.below(a.len());
                let copy = a[i].clone();
                a.push(copy);
            }
            _ => *v = hostile_value(rng, seeds),
        }
        return true;
    }
    *n -= 1;
    match v {
        Value::Array(a) => a.iter_mut().any(|x| mutate_node(x, n, rng, seeds)),
        Value::Object(m) => m.values_mut().any(|x| mutate_node(x, n, rng, seeds)),
        _ => false,
    }
}

fn mutate(rng: &mut Rng, raw: &[Vec<u8>], seeds: &[Value]) -> Vec<u8> {
    let i = rng.below(raw.len());
    let mut data = if rng.below(2) == 0 && !seeds.is_empty() {
        let mut v = seeds[rng.below(seeds.len())].clone();
        for _ in 0..=rng.below(3) {
            let mut n = rng.below(count(&v));
            mutate_node(&mut v, &mut n, rng, seeds);
        }
        v.to_string().into_bytes()
    } else {
        raw[i].clone()
    };
    for _ in 0..rng.below(3) {
        let len = data.len();
        let at = rng.below(len + 1);
        match rng.below(6) {
            0 if len > 0 => data[at.min(len - 1)] ^= 1 << rng.below(8),
            1 => data.splice(at..at, rng.pick(&TOKENS).bytes()).for_each(drop),
            2 if len > 0 => {
                let end = (at + rng.below(16)).min(len);
                data.drain(at..end);
            }
            3 => data.truncate(at),
            4 => {
                let other = rng.pick(raw);
                let from = rng.below(other.len());
                let end = (from + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied()).for_each(drop);
            }
            _ => data.insert(at, rng.next_u64() as u8),
        }
    }
    data
}

fn run(target: &str, check: fn(&[u8]), default_iters: usize) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut raw: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.expect("entry").path()).expect("read seed"))
        .collect();
    raw.sort();
    assert!(!raw.is_empty(), "no seeds in {}", dir.display());
    let seeds: Vec<Value> = raw.iter().filter_map(|b| serde_json::from_slice(b).ok()).collect();
    let iters: usize = std::env::var("CNI_RS_FUZZ_ITERS").ok().and_then(|s| s.parse().ok()).unwrap_or(default_iters);
    let seed: u64 = std::env::var("CNI_RS_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_c0de);
    let mut rng = Rng(seed | 1);
    for seed_input in &raw {
        check(seed_input);
    }
    let started = std::time::Instant::now();
    for i in 0..iters {
        let input = mutate(&mut rng, &raw, &seeds);
        if catch_unwind(AssertUnwindSafe(|| check(&input))).is_err() {
            let saved = std::env::temp_dir().join(format!("cni-rs-fuzz-{target}-crash-{i}"));
            let _ = std::fs::write(&saved, &input);
            panic!(
                "{target}: iteration {i} failed (input saved to {}; replay: cargo fuzz run {target} {0}):\n{}",
                saved.display(),
                String::from_utf8_lossy(&input)
            );
        }
    }
    eprintln!("{target}: {iters} mutated inputs in {:?}", started.elapsed());
}

#[test]
fn netconf_mutations() {
    run("netconf", checks::netconf, 10_000);
}

#[test]
fn result_convert_mutations() {
    // Each input is parsed with 8 fallback versions and rendered to 8 targets: fewer iterations.
    run("result_convert", checks::result_convert, 4_000);
}

#[test]
fn hostile_values_reach_every_shape() {
    // The mutator itself: a seed changes, and object keys are added.
    let mut rng = Rng(7);
    let seeds = vec![json!({ "a": [1, { "b": "c" }] })];
    let raw = vec![b"{}".to_vec()];
    let changed = (0..200).filter(|_| mutate(&mut rng, &raw, &seeds) != seeds[0].to_string().into_bytes()).count();
    assert!(changed > 150, "the mutator rarely changes its input ({changed}/200)");
}
