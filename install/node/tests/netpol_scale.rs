//! NetworkPolicy at scale, through the benchmark's own command (tests/bench/netpol-bench.sh, run
//! here on this build's agent with a few events of each kind, at 10 pods / 5 policies and at 1,000
//! pods / 500 policies): every event reaches the kernel (seen by `nft monitor`, not by the agent's
//! own bookkeeping); a pod added, relabelled or deleted changes set elements only, never swaps the
//! table, and changes as many elements at 1,000 pods as at 10; a policy added, changed or deleted
//! swaps the table with its rules. Counts, not times: the times are the benchmark's business
//! (docs/bench/README.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

const POD_EVENTS: usize = 20;
const POLICY_EVENTS: usize = 5;

/// One row of the script's event table.
#[derive(Debug)]
struct Row {
    scale: String,
    event: String,
    applied: String,
    swaps: usize,
    added: String,
    deleted: String,
    rules: String,
}

fn events(table: &str) -> Vec<Row> {
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() != 11 || !cells[2].contains('/') {
                return None;
            }
            Some(Row {
                scale: cells[0].split(' ').next()?.to_string(),
                event: cells[1].to_string(),
                applied: cells[2].to_string(),
                swaps: cells[6].parse().ok()?,
                added: cells[7].to_string(),
                deleted: cells[8].to_string(),
                rules: cells[9].to_string(),
            })
        })
        .collect()
}

/// (scale, pods, policies, rules) of the first-sync table.
fn syncs(table: &str) -> Vec<(String, usize, usize, usize)> {
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split('|').map(str::trim).collect();
            if cells.len() != 8 {
                return None;
            }
            Some((cells[0].to_string(), cells[1].parse().ok()?, cells[2].parse().ok()?, cells[6].parse().ok()?))
        })
        .collect()
}

/// A count that is the same for every event of a kind ("7"; "6-8" when they differ).
fn constant(cell: &str, what: &str) -> usize {
    cell.parse().unwrap_or_else(|_| panic!("{what}: {cell:?} is not one count for every event"))
}

#[test]
fn pod_events_change_the_same_elements_at_10_and_1000_pods() {
    require(&["openssl", "python3", "nft"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/bench/netpol-bench.sh");
    let out = Command::new("bash")
        .arg(&script)
        .args(["--pod-events", &POD_EVENTS.to_string(), "--policy-events", &POLICY_EVENTS.to_string()])
        .env("CNI_RS_NODE", AGENT)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "netpol-bench.sh failed:\n{stderr}");

    let rows = events(&stdout);
    let kinds = ["pod add", "pod relabel", "pod delete", "policy add", "policy update", "policy delete"];
    let order: Vec<(&str, &str)> = rows.iter().map(|r| (r.scale.as_str(), r.event.as_str())).collect();
    let expected: Vec<(&str, &str)> =
        ["small", "large"].iter().flat_map(|s| kinds.iter().map(move |k| (*s, *k))).collect();
    assert_eq!(order, expected, "{stdout}");
    for r in &rows {
        let n = if r.event.starts_with("pod") { POD_EVENTS } else { POLICY_EVENTS };
        assert_eq!(r.applied, format!("{n}/{n}"), "not every event reached the kernel: {r:?}");
    }

    for kind in &kinds[..3] {
        let [small, large] = [0, 6].map(|i| rows.iter().skip(i).find(|r| r.event == *kind).unwrap());
        for r in [small, large] {
            assert_eq!(r.swaps, 0, "a pod event swapped the table: {r:?}");
            assert_eq!(r.rules, "0", "a pod event added rules: {r:?}");
            let (added, deleted) = (constant(&r.added, kind), constant(&r.deleted, kind));
            match *kind {
                "pod add" => assert!(added > 0 && deleted == 0, "{r:?}"),
                "pod delete" => assert!(added == 0 && deleted > 0, "{r:?}"),
                _ => assert!(added > 0 && deleted > 0, "{r:?}"),
            }
        }
        assert_eq!(
            (&small.added, &small.deleted),
            (&large.added, &large.deleted),
            "a {kind} changes more elements at 1,000 pods / 500 policies than at 10 / 5"
        );
    }
    for r in rows.iter().filter(|r| r.event.starts_with("policy")) {
        assert_eq!(r.swaps, POLICY_EVENTS, "a policy event not applied as a table swap: {r:?}");
        let low: usize = r.rules.split('-').next().unwrap().parse().unwrap();
        assert!(low > 0, "a policy swap without rules: {r:?}");
    }

    let syncs = syncs(&stdout);
    assert_eq!(
        syncs.iter().map(|s| (s.0.as_str(), s.1, s.2)).collect::<Vec<_>>(),
        [("small", 10, 5), ("large", 1000, 500)]
    );
    assert!(syncs[0].3 > 0 && syncs[1].3 > syncs[0].3, "{syncs:?}");
}
