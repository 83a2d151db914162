//! Kubernetes NetworkPolicy compiled into the node's nf_tables state ([`netkit::firewall::netpol`]).
//!
//! The semantics are the API's (networking.k8s.io/v1): a pod is isolated for ingress (egress)
//! when a policy with that policy type selects it; then only what the union of those policies'
//! rules allows passes in that direction. A rule allows traffic from (to) any of its peers, on
//! any of its ports; an empty or missing `from`/`to` is every peer, empty or missing `ports`
//! every port. A peer is pods chosen by `podSelector` in the policy's namespace, by
//! `namespaceSelector` in every namespace it picks, by both (pods picked by the one in
//! namespaces picked by the other), or an `ipBlock` minus its `except`. A named port resolves
//! per destination pod, to that pod's container port of that name and protocol.
//!
//! What is compiled:
//! - the [`Ruleset`] depends on the policies only (one nf_tables rule per peer and port of each
//!   policy rule, and each family), so a pod or namespace change is set elements, never rules;
//! - sets are named by what they hold (`s4-<hash of the selector>`, `n4-<hash of the named port>`)
//!   and shared by every rule that needs the same thing;
//! - this node protects its own pods only: ingress to and egress from a pod of this node is
//!   checked here, the other end on its own node.
//!
//! Addresses are believed only where they can be: a pod of this node only with addresses in
//! this node's pod CIDRs, any other pod only with addresses in the cluster range; host-network
//! pods (the node's address) and finished pods (whose address may be reused) are no one's peer.

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use netkit::firewall::netpol::{
    empty_ruleset, Element, Elements, Peer, Ports, Rule, Ruleset, SetKind, EGRESS_ISOLATED, INGRESS_ISOLATED, SCTP,
    TCP, UDP,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub type Labels = BTreeMap<String, String>;

/// A pod as policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub node: Option<String>,
    pub ips: Vec<IpAddr>,
    /// Named container ports: (name, protocol, port).
    pub named_ports: Vec<(String, u8, u16)>,
}

/// A pod that can be a peer or be protected: `None` for a host-network pod, a finished one, or
/// one without an address yet.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let spec = pod.spec.as_ref()?;
    if spec.host_network == Some(true) {
        return None;
    }
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let mut ips: Vec<IpAddr> = status
        .pod_ips
        .iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .filter_map(|ip| ip.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    if ips.is_empty() {
        return None;
    }
    // Sidecars (init containers that keep running) serve ports as containers do.
    let sidecars = spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    let named_ports = spec.containers.iter().chain(sidecars).flat_map(named_ports).collect();
    Some(PodInfo {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        node: spec.node_name.clone(),
        ips,
        named_ports,
    })
}

fn named_ports(c: &Container) -> Vec<(String, u8, u16)> {
    c.ports
        .iter()
        .flatten()
        .filter_map(|p| {
            let name = p.name.clone()?;
            let proto = protocol(p.protocol.as_deref())?;
            Some((name, proto, u16::try_from(p.container_port).ok().filter(|p| *p > 0)?))
        })
        .collect()
}

/// TCP when unset; `None` for a protocol policies cannot name.
fn protocol(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

/// What the agent knows of the cluster.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// Namespace name to its labels.
    pub namespaces: BTreeMap<String, Labels>,
    /// (namespace, name) to pod.
    pub pods: BTreeMap<(String, String), PodInfo>,
    /// (namespace, name) to policy.
    pub policies: BTreeMap<(String, String), NetworkPolicySpec>,
}

impl Cluster {
    pub fn apply_namespace(&mut self, ns: &Namespace) {
        if let Some(name) = &ns.metadata.name {
            self.namespaces.insert(name.clone(), ns.metadata.labels.clone().unwrap_or_default());
        }
    }
    pub fn delete_namespace(&mut self, ns: &Namespace) {
        if let Some(name) = &ns.metadata.name {
            self.namespaces.remove(name);
        }
    }
    pub fn apply_pod(&mut self, pod: &Pod) {
        let key = key(&pod.metadata.namespace, &pod.metadata.name);
        match pod_info(pod) {
            Some(info) => self.pods.insert(key, info),
            None => self.pods.remove(&key),
        };
    }
    pub fn delete_pod(&mut self, pod: &Pod) {
        self.pods.remove(&key(&pod.metadata.namespace, &pod.metadata.name));
    }
    pub fn apply_policy(&mut self, p: &NetworkPolicy) {
        let key = key(&p.metadata.namespace, &p.metadata.name);
        self.policies.insert(key, p.spec.clone().unwrap_or_default());
    }
    pub fn delete_policy(&mut self, p: &NetworkPolicy) {
        self.policies.remove(&key(&p.metadata.namespace, &p.metadata.name));
    }
}

fn key(ns: &Option<String>, name: &Option<String>) -> (String, String) {
    (ns.clone().unwrap_or_default(), name.clone().unwrap_or_default())
}

/// Whether `labels` satisfy `selector` (an empty selector selects everything). An operator the
/// API does not define selects nothing, as the API server would have refused it.
pub fn selects(selector: &LabelSelector, labels: &Labels) -> bool {
    let by_label = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    by_label
        && selector.match_expressions.iter().flatten().all(|req| {
            let values = req.values.as_deref().unwrap_or_default();
            let value = labels.get(&req.key);
            match req.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// The node this agent protects.
pub struct Node<'a> {
    pub name: &'a str,
    /// This node's pod CIDRs: its pods' addresses are believed only inside them.
    pub pod_cidrs: &'a [IpNetwork],
    /// The cluster range: other pods' addresses are believed only inside it.
    pub cluster: &'a [IpNetwork],
}

/// The ruleset and set elements for `cluster` as seen from `node`.
pub fn compile(cluster: &Cluster, node: &Node) -> (Ruleset, Elements) {
    let mut c = Compiler { cluster, node, rules: empty_ruleset(), elements: Elements::new() };
    for name in c.rules.sets.keys() {
        c.elements.insert(name.clone(), BTreeSet::new());
    }
    for ((ns, name), spec) in &cluster.policies {
        c.policy(ns, name, spec);
    }
    c.rules.ingress.dedup();
    c.rules.egress.dedup();
    (c.rules, c.elements)
}

struct Compiler<'a> {
    cluster: &'a Cluster,
    node: &'a Node<'a>,
    rules: Ruleset,
    elements: Elements,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Compiler<'_> {
    /// The addresses of `pod` of one family that can be believed.
    fn addresses<'p>(&self, pod: &'p PodInfo, v6: bool) -> impl Iterator<Item = IpAddr> + 'p {
        let local = pod.node.as_deref() == Some(self.node.name);
        let ranges: &[IpNetwork] = if local { self.node.pod_cidrs } else { self.node.cluster };
        let ranges = ranges.to_vec();
        pod.ips.iter().copied().filter(move |ip| ip.is_ipv6() == v6 && ranges.iter().any(|r| r.contains(*ip)))
    }

    fn is_local(&self, pod: &PodInfo) -> bool {
        pod.node.as_deref() == Some(self.node.name)
    }

    /// Declares set `name` of `kind` holding `elems` (a set with that name holds the same thing
    /// wherever it is used: its name is a hash of what chose its elements).
    fn set(&mut self, name: String, kind: SetKind, elems: impl IntoIterator<Item = Element>) -> String {
        if self.rules.sets.insert(name.clone(), kind).is_none() {
            self.elements.insert(name.clone(), elems.into_iter().collect());
        }
        name
    }

    fn policy(&mut self, ns: &str, name: &str, spec: &NetworkPolicySpec) {
        let all = LabelSelector::default();
        let selector = spec.pod_selector.as_ref().unwrap_or(&all);
        // The API server fills policyTypes; an object without them gets the API's default.
        let types: Vec<Direction> = match &spec.policy_types {
            Some(types) => types
                .iter()
                .filter_map(|t| match t.as_str() {
                    "Ingress" => Some(Direction::Ingress),
                    "Egress" => Some(Direction::Egress),
                    _ => None,
                })
                .collect(),
            None if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) => vec![Direction::Ingress, Direction::Egress],
            None => vec![Direction::Ingress],
        };
        let selected: Vec<&PodInfo> = self
            .cluster
            .pods
            .values()
            .filter(|p| p.namespace == ns && self.is_local(p) && selects(selector, &p.labels))
            .collect();
        for v6 in [false, true] {
            let family = usize::from(v6);
            let ips: Vec<IpAddr> = selected.iter().flat_map(|p| self.addresses(p, v6)).collect();
            let sel = self.set(
                set_name("s", v6, &format!("local|{ns}|{}", canonical(selector))),
                SetKind::Addr { v6 },
                ips.iter().map(|ip| Element::Addr(*ip)),
            );
            for direction in &types {
                let iso = match direction {
                    Direction::Ingress => INGRESS_ISOLATED[family],
                    Direction::Egress => EGRESS_ISOLATED[family],
                };
                if let Some(set) = self.elements.get_mut(iso) {
                    set.extend(ips.iter().map(|ip| Element::Addr(*ip)));
                }
                for (i, (peers, ports)) in rules_of(*direction, spec).into_iter().enumerate() {
                    let comment = format!(
                        "{ns}/{name} {} {i}",
                        if *direction == Direction::Ingress { "ingress" } else { "egress" }
                    );
                    self.rule(ns, *direction, v6, &sel, peers, ports, &comment);
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn rule(
        &mut self,
        ns: &str,
        direction: Direction,
        v6: bool,
        sel: &str,
        peers: &[NetworkPolicyPeer],
        ports: &[NetworkPolicyPort],
        comment: &str,
    ) {
        let peers: Vec<Peer> = if peers.is_empty() {
            vec![Peer::Any]
        } else {
            peers.iter().filter_map(|p| self.peer(ns, v6, p)).collect()
        };
        let ports: Vec<Ports> = if ports.is_empty() {
            vec![Ports::Any]
        } else {
            ports.iter().filter_map(|p| self.port(direction, v6, p)).collect()
        };
        let list = match direction {
            Direction::Ingress => &mut self.rules.ingress,
            Direction::Egress => &mut self.rules.egress,
        };
        for peer in &peers {
            for port in &ports {
                list.push(Rule {
                    v6,
                    selected: sel.to_string(),
                    peer: peer.clone(),
                    ports: port.clone(),
                    comment: comment.to_string(),
                });
            }
        }
    }

    /// A peer in one family; `None` when it cannot match in that family (an ipBlock of the
    /// other, or a peer the API would refuse).
    fn peer(&mut self, ns: &str, v6: bool, peer: &NetworkPolicyPeer) -> Option<Peer> {
        if let Some(block) = &peer.ip_block {
            let net: IpNetwork = block.cidr.parse().ok()?;
            if net.is_ipv6() != v6 {
                return None;
            }
            let except =
                block.except.iter().flatten().filter_map(|e| e.parse::<IpNetwork>().ok()).filter(|e| e.is_ipv6() == v6);
            // `10.0.0.1/8` means 10.0.0.0/8, as the API server's validation reads it.
            let base = |n: IpNetwork| IpNetwork::new(n.network(), n.prefix()).unwrap_or(n);
            return Some(Peer::Block { net: base(net), except: except.map(base).collect() });
        }
        if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
            return None;
        }
        let all = LabelSelector::default();
        let pods = peer.pod_selector.as_ref().unwrap_or(&all);
        let key = format!(
            "peer|{}|{}|{}",
            if peer.namespace_selector.is_some() { "" } else { ns },
            canonical(pods),
            peer.namespace_selector.as_ref().map(canonical).unwrap_or_default()
        );
        let cluster = self.cluster;
        let in_namespace = |pod: &PodInfo| match &peer.namespace_selector {
            None => pod.namespace == ns,
            Some(sel) => cluster.namespaces.get(&pod.namespace).is_some_and(|labels| selects(sel, labels)),
        };
        let ips: Vec<Element> = cluster
            .pods
            .values()
            .filter(|p| in_namespace(p) && selects(pods, &p.labels))
            .flat_map(|p| self.addresses(p, v6))
            .map(Element::Addr)
            .collect();
        Some(Peer::Set(self.set(set_name("s", v6, &key), SetKind::Addr { v6 }, ips)))
    }

    /// A port in one family; `None` for what the API would refuse.
    fn port(&mut self, direction: Direction, v6: bool, port: &NetworkPolicyPort) -> Option<Ports> {
        let proto = protocol(port.protocol.as_deref())?;
        match &port.port {
            None => Some(Ports::Protocol(proto)),
            Some(IntOrString::Int(p)) => {
                let first = u16::try_from(*p).ok().filter(|p| *p > 0)?;
                let last = match port.end_port {
                    Some(end) => u16::try_from(end).ok().filter(|e| *e >= first)?,
                    None => first,
                };
                Some(Ports::Range { proto, first, last })
            }
            Some(IntOrString::String(name)) => {
                // Ingress: the destination is one of this node's pods; egress: any pod.
                let local = direction == Direction::Ingress;
                let key = format!("named|{}|{proto}|{name}", if local { "local" } else { "all" });
                let elems: Vec<Element> = self
                    .cluster
                    .pods
                    .values()
                    .filter(|p| !local || self.is_local(p))
                    .flat_map(|p| {
                        let ports: Vec<u16> =
                            p.named_ports.iter().filter(|(n, pr, _)| n == name && *pr == proto).map(|t| t.2).collect();
                        self.addresses(p, v6)
                            .flat_map(move |ip| {
                                ports.clone().into_iter().map(move |port| Element::AddrPort(ip, proto, port))
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                Some(Ports::Named(self.set(set_name("n", v6, &key), SetKind::AddrPort { v6 }, elems)))
            }
        }
    }
}

/// The (peers, ports) of each rule of one direction.
fn rules_of(direction: Direction, spec: &NetworkPolicySpec) -> Vec<(&[NetworkPolicyPeer], &[NetworkPolicyPort])> {
    match direction {
        Direction::Ingress => spec
            .ingress
            .iter()
            .flatten()
            .map(|r| (r.from.as_deref().unwrap_or_default(), r.ports.as_deref().unwrap_or_default()))
            .collect(),
        Direction::Egress => spec
            .egress
            .iter()
            .flatten()
            .map(|r| (r.to.as_deref().unwrap_or_default(), r.ports.as_deref().unwrap_or_default()))
            .collect(),
    }
}

/// A selector as text that is the same for the same selector.
fn canonical(s: &LabelSelector) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// `<prefix><4|6>-<16 hex digits of FNV-1a of key>`: stable across restarts, so a restarted agent
/// computes the names the table already has.
fn set_name(prefix: &str, v6: bool, key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{prefix}{}-{h:016x}", if v6 { 6 } else { 4 })
}

#[cfg(test)]
mod tests;
