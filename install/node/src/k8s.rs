//! The Kubernetes datastore: every Node's `spec.podCIDRs` (allocated by kube-controller-manager
//! `--allocate-node-cidrs`) and `InternalIP` addresses, read by list + watch. kube-runtime's
//! watcher keeps the resourceVersion, resumes a broken watch from it, and lists again when the API
//! server answers 410 Gone; this node's VTEP MAC is published in an annotation on its own Node.

use crate::etcd::{Held, NodeRecord, Peers, Published};
use crate::options::Options;
use crate::trust::Claim;
use anyhow::{anyhow, Result};
use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// The annotation holding a node's VTEP MAC (VXLAN backends).
pub const VTEP_MAC_ANNOTATION: &str = "cni-rs.io/vtep-mac";
/// The annotations holding a node's WireGuard public key (base64) and UDP port.
pub const WIREGUARD_KEY_ANNOTATION: &str = "cni-rs.io/wireguard-public-key";
pub const WIREGUARD_PORT_ANNOTATION: &str = "cni-rs.io/wireguard-port";

pub async fn client(options: &Options) -> Result<Client> {
    let config = match &options.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| anyhow!("read --kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| anyhow!("--kubeconfig {}: {e}", path.display()))?
        }
        None => Config::incluster().map_err(|e| {
            anyhow!("in-cluster Kubernetes config (service account token, KUBERNETES_SERVICE_HOST): {e}; outside a pod give --kubeconfig")
        })?,
    };
    Client::try_from(config).map_err(|e| anyhow!("Kubernetes client: {e}"))
}

/// A Node as the agent needs it, aged by its creationTimestamp (the older Node keeps pod CIDRs
/// two Nodes claim); `None` without a name. Pod CIDRs come from `spec` only: the API server lets
/// only the controller manager set them (once), whereas any holder of `patch nodes` can write an
/// annotation. The only annotations read are the VTEP MAC and the WireGuard key and port, which are
/// screened like everything else.
pub fn record(node: &Node) -> Option<Claim> {
    let name = node.metadata.name.clone()?;
    let spec = node.spec.as_ref();
    let cidrs: Vec<String> = spec
        .and_then(|s| s.pod_cidrs.clone().filter(|l| !l.is_empty()).or_else(|| s.pod_cidr.clone().map(|c| vec![c])))
        .unwrap_or_default();
    let pod_cidrs: Vec<IpNetwork> = cidrs.iter().filter_map(|c| c.parse().ok()).collect();
    let node_ips = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|list| list.iter().filter(|a| a.type_ == "InternalIP").filter_map(|a| a.address.parse().ok()).collect())
        .unwrap_or_default();
    let annotation = |key: &str| node.metadata.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    let vtep_mac = annotation(VTEP_MAC_ANNOTATION);
    let wireguard_key = annotation(WIREGUARD_KEY_ANNOTATION);
    // An unparsable port leaves the key without an endpoint; the screen then refuses the key.
    let wireguard_port = annotation(WIREGUARD_PORT_ANNOTATION).map(|p| p.parse::<u16>().unwrap_or(0));
    let age = node.metadata.creation_timestamp.as_ref().map_or(i64::MAX, |t| t.0.as_second());
    let record = NodeRecord { node: name, node_ips, pod_cidrs, vtep_mac, wireguard_key, wireguard_port };
    Some(Claim { record, age })
}

/// Lists and watches Nodes forever: this node's record goes to `own` once it has pod CIDRs, the
/// others to `peers` (marked synced after each complete list).
pub async fn watch_nodes(
    client: Client,
    options: Arc<Options>,
    published: Published,
    own: watch::Sender<Option<Arc<Held>>>,
    peers: watch::Sender<Arc<Peers>>,
) {
    let api: Api<Node> = Api::all(client.clone());
    let mut stream = watcher(api.clone(), watcher::Config::default()).default_backoff().boxed();
    let mut nodes: BTreeMap<String, Claim> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, Claim>> = None;
    let mut synced = false;
    let mut annotated = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listing = Some(BTreeMap::new()),
            Ok(Event::InitApply(node)) => {
                if let (Some(list), Some(r)) = (listing.as_mut(), record(&node)) {
                    list.insert(r.record.node.clone(), r);
                }
            }
            Ok(Event::InitDone) => {
                nodes = listing.take().unwrap_or_default();
                synced = true;
            }
            Ok(Event::Apply(node)) => {
                if let Some(r) = record(&node) {
                    nodes.insert(r.record.node.clone(), r);
                }
            }
            Ok(Event::Delete(node)) => {
                if let Some(name) = &node.metadata.name {
                    nodes.remove(name);
                }
            }
            Err(e) => {
                eprintln!("warning: kubernetes: watch nodes: {e}; retrying");
                continue;
            }
        }
        if listing.is_some() {
            continue;
        }
        if let Some(me) = nodes.get(&options.node_name).map(|c| &c.record) {
            if !annotated && published != Published::default() && !published.is_in(me) {
                annotated = annotate(&api, &options.node_name, &published).await;
            }
            if me.pod_cidrs.is_empty() {
                eprintln!(
                    "waiting: node {} has no spec.podCIDRs (kube-controller-manager --allocate-node-cidrs)",
                    options.node_name
                );
            } else {
                let record = published.record(&options, me.pod_cidrs.clone());
                let held = Held { key: format!("Node/{}", options.node_name), lease: 0, record };
                own.send_if_modified(|current| {
                    if current.as_ref().is_some_and(|c| c.record == held.record) {
                        return false;
                    }
                    *current = Some(Arc::new(held));
                    true
                });
            }
        } else if synced {
            eprintln!("waiting: no Node named {} in the API server", options.node_name);
        }
        let others: BTreeMap<String, Claim> = nodes
            .iter()
            .filter(|(name, _)| **name != options.node_name)
            .map(|(name, claim)| (format!("Node/{name}"), claim.clone()))
            .collect();
        let snapshot = Peers { nodes: others, synced };
        peers.send_if_modified(|current| {
            if **current == snapshot {
                return false;
            }
            *current = Arc::new(snapshot);
            true
        });
    }
}

fn watcher(
    api: Api<Node>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<Event<Node>, watcher::Error>> {
    watcher::watcher(api, config)
}

/// Records what this node publishes (VTEP MAC, WireGuard key and port) on its Node (merge patch;
/// a value it does not have removes the annotation); `true` when done.
async fn annotate(api: &Api<Node>, name: &str, published: &Published) -> bool {
    let patch = serde_json::json!({ "metadata": { "annotations": {
        VTEP_MAC_ANNOTATION: published.vtep_mac,
        WIREGUARD_KEY_ANNOTATION: published.wireguard_key,
        WIREGUARD_PORT_ANNOTATION: published.wireguard_port.map(|p| p.to_string()),
    } } });
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            eprintln!("annotated node {name}: {}", patch["metadata"]["annotations"]);
            true
        }
        Err(e) => {
            eprintln!(
                "warning: kubernetes: annotate node {name} with its VTEP MAC and WireGuard key: {e} \
                 (VXLAN and WireGuard peers cannot reach this node)"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_wireguard_key_and_port_from_annotations() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "n2", "annotations": {
                VTEP_MAC_ANNOTATION: "02:00:00:00:00:12",
                WIREGUARD_KEY_ANNOTATION: "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
                WIREGUARD_PORT_ANNOTATION: "51821",
            } },
            "spec": { "podCIDRs": ["10.244.2.0/24"] },
        }))
        .unwrap();
        let r = record(&node).unwrap().record;
        assert_eq!(r.wireguard_key.as_deref(), Some("AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="));
        assert_eq!(r.wireguard_port, Some(51821));
        assert_eq!(r.vtep_mac.as_deref(), Some("02:00:00:00:00:12"));
        // A port that is not one is kept as 0, so the screen refuses the key rather than guess.
        let mut node = node;
        node.metadata.annotations.as_mut().unwrap().insert(WIREGUARD_PORT_ANNOTATION.into(), "x".into());
        assert_eq!(record(&node).unwrap().record.wireguard_port, Some(0));
        node.metadata.annotations = None;
        let r = record(&node).unwrap().record;
        assert_eq!((r.wireguard_key, r.wireguard_port), (None, None));
    }
}
