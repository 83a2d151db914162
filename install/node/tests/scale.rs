//! Scale, through the benchmark's own command (tests/bench/node-scale.sh, run here on this
//! build's agent at 10 and 1,000 other nodes): the first sync programs every route (1,000 added,
//! none failed), one node joining adds exactly its route and leaving removes exactly it, and each
//! costs the same number of netlink messages at 1,000 nodes as at 10 (counted by strace on the
//! agent's netlink sockets; a count, not a time). The times are the benchmark's business
//! (docs/bench/README.md), not this test's.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use std::path::Path;
use std::process::Command;

/// (other nodes, join messages "S sent, R received", leave messages) from the script's table.
fn rows(table: &str) -> Vec<(usize, String, String)> {
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let nodes = cells.first()?.parse().ok()?;
            Some((nodes, cells.get(2)?.to_string(), cells.get(3)?.to_string()))
        })
        .collect()
}

#[test]
fn join_and_leave_cost_the_same_messages_at_10_and_1000_nodes() {
    require(&["etcd", "etcdctl", "curl", "strace"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/bench/node-scale.sh");
    let out = Command::new("bash").arg(&script).args(["10", "1000"]).env("CNI_RS_NODE", AGENT).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "node-scale.sh failed:\n{stderr}");

    let rows = rows(&stdout);
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [10, 1000], "{stdout}");
    let (small, large) = (&rows[0], &rows[1]);
    assert_eq!(small.1, large.1, "a join costs more messages at 1,000 nodes than at 10");
    assert_eq!(small.2, large.2, "a leave costs more messages at 1,000 nodes than at 10");
    // A route add or delete is one request and its acknowledgement: no listing of the routes.
    for cell in [&large.1, &large.2] {
        let counts: Vec<usize> = cell.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse().ok()).collect();
        assert!(counts.len() == 2 && counts.iter().all(|&n| (1..=4).contains(&n)), "{cell}");
    }
}
