//! install/daemonset.yaml (ServiceAccount, ClusterRole, binding, DaemonSet) must be valid
//! Kubernetes: `kubernetes-validate --strict` checks every document against the API schemas and
//! rejects unknown fields. It must also run this agent as the README says: `/cni-rs-node` with
//! flags the agent knows, NODE_NAME from the downward API, the host's network and CNI directories,
//! a ServiceAccount allowed to get/list/watch nodes, and no ConfigMap of pod CIDRs.
//! A missing kubernetes-validate fails the test, naming what installs it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

fn manifest() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn daemonset_validates_strict() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset.yaml");
    let passed = cni_tests::kubernetes_validates(&manifest);
    assert_eq!(passed, 4, "ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet must each pass");
}

#[test]
fn daemonset_runs_the_agent_with_rbac_and_no_configmap() {
    let text = manifest();
    for kind in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"] {
        assert!(text.contains(&format!("\nkind: {kind}\n")), "no {kind} in daemonset.yaml");
    }
    for needed in [
        "serviceAccountName: cni-rs-node",
        "resources: [\"nodes\"]\n    verbs: [\"get\", \"list\", \"watch\"]",
        "hostNetwork: true",
        "command: [\"/cni-rs-node\"]",
        "- name: NODE_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: spec.nodeName",
        "- NET_ADMIN",
        "path: /opt/cni/bin",
        "path: /etc/cni/net.d",
        "mountPath: /host/opt/cni/bin",
        "mountPath: /host/etc/cni/net.d",
    ] {
        assert!(text.contains(needed), "daemonset.yaml lacks {needed:?}");
    }
    assert!(!text.to_lowercase().contains("configmap"), "daemonset.yaml still mentions a ConfigMap");

    // Every flag it passes is one the agent accepts (its --help lists them).
    let help = Command::new(common::AGENT).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let args_start = text.find("          args:\n").expect("the agent container has args");
    let flags: Vec<&str> = text[args_start..]
        .lines()
        .skip(1)
        .take_while(|line| line.starts_with("            "))
        .filter_map(|line| line.trim().strip_prefix("- "))
        .collect();
    assert!(flags.iter().any(|f| f.starts_with("--cluster-cidr=")), "{flags:?}");
    for flag in flags {
        let name = flag.split('=').next().unwrap();
        assert!(help.contains(&format!("  {name} ")), "cni-rs-node does not know {name} (from daemonset.yaml)");
    }
}
