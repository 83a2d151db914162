//! install/daemonset.yaml must be valid Kubernetes: `kubernetes-validate --strict` checks every
//! document against the API schemas and rejects unknown fields.
//! A missing tool is a prerequisite (`cni_tests::prerequisite`): a note outside CI, a failure with
//! CI=true (`pip install kubernetes-validate`).

use std::path::Path;

#[test]
fn daemonset_validates() {
    cni_tests::kubernetes_validates(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemonset.yaml"));
}
