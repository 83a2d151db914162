//! The stand-in Kubernetes API server (tests/k8s_standin.py) and Node objects shaped like a
//! kubeadm cluster's, for the tests that run the agent in its Kubernetes mode.

use super::*;
use base64::Engine;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

pub const TOKEN: &str = "standin-token-0123456789";

/// A Node as `kubectl get node -o json` shows one on a kubeadm cluster.
pub fn node(name: &str, v4: &str, v6: &str, cidr4: &str, cidr6: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("5b0e3c1a-0000-4000-8000-{:012}", name.len()),
            "creationTimestamp": "2026-11-01T10:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"
            },
            "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///var/run/containerd/containerd.sock",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            },
            "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                               "time": "2026-11-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
        },
        "spec": {
            "podCIDR": cidr4,
            "podCIDRs": [cidr4, cidr6],
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": v4},
                {"type": "InternalIP", "address": v6},
                {"type": "Hostname", "address": name}
            ],
            "allocatable": {"cpu": "2", "ephemeral-storage": "28Gi", "memory": "3913Mi", "pods": "110"},
            "capacity": {"cpu": "2", "ephemeral-storage": "30Gi", "memory": "4013Mi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                            "message": "container runtime network not ready: NetworkReady=false",
                            "lastHeartbeatTime": "2026-11-01T10:05:00Z", "lastTransitionTime": "2026-11-01T10:00:00Z"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"architecture": "amd64", "bootID": "b", "containerRuntimeVersion": "containerd://1.6.20",
                         "kernelVersion": "6.1.0-27-amd64", "kubeProxyVersion": "v1.31.2", "kubeletVersion": "v1.31.2",
                         "machineID": "m", "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "systemUUID": "s"}
        }
    })
}

/// A CA and a server certificate for 127.0.0.1 in `dir` (ca.crt, srv.crt, srv.key); returns the
/// CA certificate in base64.
pub fn certs(dir: &Path) -> String {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["openssl", "req", "-x509"];
    let (ca_key, ca_crt) = (p("ca.key"), p("ca.crt"));
    ca.extend(ec);
    ca.extend(["-keyout", &ca_key, "-out", &ca_crt, "-days", "1", "-subj", "/CN=standin-ca"]);
    run(&ca);
    let (key, csr, crt, ext) = (p("srv.key"), p("srv.csr"), p("srv.crt"), p("ext.cnf"));
    let mut req = vec!["openssl", "req"];
    req.extend(ec);
    req.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=standin"]);
    run(&req);
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "openssl",
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca_crt,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &crt,
        "-days",
        "1",
        "-extfile",
        &ext,
    ]);
    base64::engine::general_purpose::STANDARD.encode(std::fs::read(&ca_crt).unwrap())
}

/// Changes the stand-in's Nodes through its control port (see tests/k8s_standin.py).
pub fn control(ns: &str, path: &str, body: &str) {
    run_in(ns, &["curl", "-sSf", "-X", "POST", "--data-binary", body, &format!("http://127.0.0.1:6444{path}")]);
}

/// Starts the stand-in in namespace `ns` serving `nodes`; returns it and a kubeconfig for it.
pub fn standin(ns: &str, dir: &Path, nodes: &Value) -> (Proc, std::path::PathBuf) {
    let ca = certs(dir);
    std::fs::write(dir.join("nodes.json"), nodes.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/k8s_standin.py");
    let args: Vec<String> = [
        "python3",
        script.to_str().unwrap(),
        dir.join("srv.crt").to_str().unwrap(),
        dir.join("srv.key").to_str().unwrap(),
        TOKEN,
        "6443",
        "6444",
        dir.join("nodes.json").to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let standin = Proc::spawn(ns, &args, dir.join("standin.log"));
    wait_for("the stand-in", Duration::from_secs(10), || standin.log().contains("serving").then_some(()));
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {ca}\nusers:\n- name: agent\n  user:\n    token: {TOKEN}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: agent\ncurrent-context: standin\n"
        ),
    )
    .unwrap();
    (standin, kubeconfig)
}
