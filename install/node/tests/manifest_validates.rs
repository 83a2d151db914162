//! install/daemonset.yaml (ServiceAccount, ClusterRole, binding, DaemonSet) must be valid
//! Kubernetes: `kubernetes-validate --strict` checks every document against the API schemas and
//! rejects unknown fields. It must also run this agent as the README says: `/cni-rs-node` with
//! flags the agent knows, NODE_NAME from the downward API, the host's network and CNI directories,
//! a ServiceAccount allowed exactly what the agent uses (nodes; pods, namespaces and
//! networkpolicies for NetworkPolicy), an init container given the agent's --cluster-cidr, and no
//! ConfigMap of pod CIDRs. install/node/tests/daemonset_pod.rs runs the pod it describes.
//! A missing kubernetes-validate fails the test, naming what installs it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
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

    // Every flag the agent and the init container pass is one the agent accepts (its --help lists
    // them).
    let help = Command::new(common::AGENT).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let docs = common::manifest_documents();
    let pod = &common::manifest_kind(&docs, "DaemonSet")["spec"]["template"]["spec"];
    let containers = [&pod["containers"][0], &pod["initContainers"][0]];
    for container in containers {
        let argv: Vec<&str> = [&container["command"], &container["args"]]
            .iter()
            .flat_map(|list| list.as_array().unwrap().iter().map(|v| v.as_str().unwrap()))
            .collect();
        assert_eq!(argv[0], "/cni-rs-node", "{}", container["name"]);
        assert!(argv.iter().any(|f| f.starts_with("--cluster-cidr=")), "{argv:?}");
        for flag in &argv[1..] {
            let name = flag.split('=').next().unwrap();
            assert!(help.contains(&format!("  {name} ")), "cni-rs-node does not know {name} (from daemonset.yaml)");
        }
    }
}

/// The ClusterRole grants exactly what the agent reads and writes: Nodes (their pod CIDRs and
/// addresses; patch for its own annotations), and for NetworkPolicy the pods, namespaces and
/// policies it lists and watches. Nothing else, no wildcard.
#[test]
fn the_cluster_role_grants_exactly_what_the_agent_uses() {
    let docs = common::manifest_documents();
    let mut granted = BTreeSet::new();
    for rule in common::manifest_kind(&docs, "ClusterRole")["rules"].as_array().unwrap() {
        let list = |key: &str| -> Vec<String> {
            rule[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        for group in list("apiGroups") {
            for resource in list("resources") {
                for verb in list("verbs") {
                    granted.insert(format!("{group}/{resource}: {verb}"));
                }
            }
        }
    }
    let want: BTreeSet<String> = [
        "/nodes: get",
        "/nodes: list",
        "/nodes: watch",
        "/nodes: patch",
        "/pods: list",
        "/pods: watch",
        "/namespaces: list",
        "/namespaces: watch",
        "networking.k8s.io/networkpolicies: list",
        "networking.k8s.io/networkpolicies: watch",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(granted, want);
}
