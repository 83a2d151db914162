//! install/daemonset.yaml must be valid Kubernetes: `kubernetes-validate --strict` checks every
//! document against the API schemas and rejects unknown fields.
//! A missing tool is a prerequisite (`cni_tests::prerequisite`): a note outside CI, a failure with
//! CI=true (`pip install kubernetes-validate`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::prerequisite;
use std::path::Path;
use std::process::Command;

#[test]
fn daemonset_validates() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset.yaml");
    assert!(manifest.is_file(), "{} is missing", manifest.display());

    let out = match Command::new("kubernetes-validate").arg("--strict").arg(&manifest).output() {
        Ok(out) => out,
        Err(err) => {
            let why =
                format!("cannot run kubernetes-validate ({err}); install it with `pip install kubernetes-validate`");
            prerequisite(false, &why);
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
