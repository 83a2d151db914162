//! install/node-agent.yaml (ServiceAccount, ClusterRole, binding, DaemonSet) must be valid
//! Kubernetes: `kubernetes-validate --strict` checks every document against the API schemas and
//! rejects unknown fields.
//! Outside CI a missing tool is a note; with CI=true it is a failure (`pip install kubernetes-validate`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

#[test]
fn node_agent_manifest_validates() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../node-agent.yaml");
    assert!(manifest.is_file(), "{} is missing", manifest.display());

    let out = match Command::new("kubernetes-validate").arg("--strict").arg(&manifest).output() {
        Ok(out) => out,
        Err(err) => {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            let why =
                format!("cannot run kubernetes-validate ({err}); install it with `pip install kubernetes-validate`");
            if ci {
                panic!("{why}");
            }
            eprintln!("note: skipping node_agent_manifest_validates: {why} (CI=true makes this a failure)");
            return;
        }
    };
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    eprintln!("{report}");
    assert!(out.status.success(), "kubernetes-validate --strict failed:\n{report}");
    // It exits 0 with a warning for kinds it has no schema for; every document must really pass.
    for line in report.lines().filter(|line| !line.trim().is_empty()) {
        assert!(line.starts_with("INFO") && line.contains("passed"), "unexpected kubernetes-validate output: {line}");
    }
}
