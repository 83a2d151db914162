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
use netkit::Family;
use std::collections::BTreeMap;
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

/// A pod's (namespace, name).
pub fn pod_key(pod: &Pod) -> (String, String) {
    key(&pod.metadata.namespace, &pod.metadata.name)
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

impl Node<'_> {
    fn is_local(&self, pod: &PodInfo) -> bool {
        pod.node.as_deref() == Some(self.name)
    }

    /// The addresses of `pod` of one family that can be believed.
    fn addresses<'p>(&self, pod: &'p PodInfo, family: Family) -> impl Iterator<Item = IpAddr> + 'p {
        let ranges: Vec<IpNetwork> = if self.is_local(pod) { self.pod_cidrs } else { self.cluster }.to_vec();
        pod.ips.iter().copied().filter(move |ip| Family::of(ip) == family && ranges.iter().any(|r| r.contains(*ip)))
    }
}

/// Which pods put their addresses in a set.
#[derive(Debug, Clone, PartialEq)]
enum Membership {
    /// This node's pods of a namespace that a selector picks (the pods a policy protects).
    Selected { namespace: String, selector: LabelSelector },
    /// Pods a peer picks: by pod selector in one namespace, or in the namespaces a namespace
    /// selector picks.
    Peer { namespace: Option<String>, pods: LabelSelector, namespaces: Option<LabelSelector> },
    /// Pods (this node's only, when `local`) with a container port of this name and protocol.
    Named { local: bool, proto: u8, name: String },
    /// This node's pods some policy of that type selects.
    Isolated { egress: bool },
}

/// A policy as the isolation sets need it: (namespace, pod selector, ingress, egress).
type Isolating = (String, LabelSelector, bool, bool);

/// The compiled state: rules, and set elements counted by the pods that put them there (two
/// pods may have the same address for a moment: the address leaves the set with the last one).
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    pub rules: Ruleset,
    members: BTreeMap<String, (Membership, Family)>,
    isolating: Vec<Isolating>,
    counts: BTreeMap<String, BTreeMap<Element, u32>>,
}

impl Compiled {
    /// Every set's elements.
    pub fn elements(&self) -> Elements {
        self.rules
            .sets
            .keys()
            .map(|set| (set.clone(), self.counts.get(set).map(|c| c.keys().copied().collect()).unwrap_or_default()))
            .collect()
    }

    /// Takes a pod's change (`old` to `new`; `None` is absent) into the elements, and returns what
    /// changed in the sets: each (set, element) with +1 when it came into its set, -1 when it
    /// left it (an address another pod still gives stays). Costs one check per set and policy,
    /// however many pods there are and however large the sets.
    pub fn pod_changed(
        &mut self,
        cluster: &Cluster,
        node: &Node,
        old: Option<&PodInfo>,
        new: Option<&PodInfo>,
    ) -> Vec<((String, Element), i32)> {
        let gone = old.map(|p| self.contributions(cluster, node, p)).unwrap_or_default();
        let came = new.map(|p| self.contributions(cluster, node, p)).unwrap_or_default();
        let present = |c: &Compiled, (set, e): &(String, Element)| c.counts.get(set).is_some_and(|m| m.contains_key(e));
        let touched: std::collections::BTreeSet<(String, Element)> = gone.iter().chain(&came).cloned().collect();
        let before: Vec<bool> = touched.iter().map(|k| present(self, k)).collect();
        for (set, e) in &gone {
            let Some(m) = self.counts.get_mut(set) else { continue };
            if let Some(n) = m.get_mut(e) {
                *n -= 1;
                if *n == 0 {
                    m.remove(e);
                }
            }
        }
        for (set, e) in came {
            *self.counts.entry(set).or_default().entry(e).or_insert(0) += 1;
        }
        touched
            .into_iter()
            .zip(before)
            .filter_map(|(k, was)| match (was, present(self, &k)) {
                (false, true) => Some((k, 1)),
                (true, false) => Some((k, -1)),
                _ => None,
            })
            .collect()
    }

    /// (set, element) for every element `pod` puts in a set.
    fn contributions(&self, cluster: &Cluster, node: &Node, pod: &PodInfo) -> Vec<(String, Element)> {
        let local = node.is_local(pod);
        let mut out = Vec::new();
        let labels = &pod.labels;
        for (set, (m, family)) in &self.members {
            let family = *family;
            let addrs = || node.addresses(pod, family).map(Element::Addr);
            match m {
                Membership::Selected { namespace, selector } => {
                    if local && pod.namespace == *namespace && selects(selector, labels) {
                        out.extend(addrs().map(|e| (set.clone(), e)));
                    }
                }
                Membership::Peer { namespace, pods, namespaces } => {
                    let in_namespace = match (namespace, namespaces) {
                        (_, Some(sel)) => cluster.namespaces.get(&pod.namespace).is_some_and(|l| selects(sel, l)),
                        (Some(ns), None) => pod.namespace == *ns,
                        (None, None) => false,
                    };
                    if in_namespace && selects(pods, labels) {
                        out.extend(addrs().map(|e| (set.clone(), e)));
                    }
                }
                Membership::Named { local: only_local, proto, name } => {
                    if local || !only_local {
                        for (_, _, port) in pod.named_ports.iter().filter(|(n, p, _)| n == name && p == proto) {
                            out.extend(
                                node.addresses(pod, family).map(|a| (set.clone(), Element::AddrPort(a, *proto, *port))),
                            );
                        }
                    }
                }
                Membership::Isolated { egress } => {
                    let isolated = local
                        && self.isolating.iter().any(|(ns, sel, i, e)| {
                            *ns == pod.namespace && (if *egress { *e } else { *i }) && selects(sel, labels)
                        });
                    if isolated {
                        out.extend(addrs().map(|e| (set.clone(), e)));
                    }
                }
            }
        }
        out
    }
}

/// The rules for `cluster`'s policies and every pod's elements, as seen from `node`.
pub fn compile(cluster: &Cluster, node: &Node) -> Compiled {
    let mut c = Compiled { rules: empty_ruleset(), ..Compiled::default() };
    for (i, family) in [(0, Family::V4), (1, Family::V6)] {
        c.members.insert(INGRESS_ISOLATED[i].to_string(), (Membership::Isolated { egress: false }, family));
        c.members.insert(EGRESS_ISOLATED[i].to_string(), (Membership::Isolated { egress: true }, family));
    }
    for ((ns, name), spec) in &cluster.policies {
        c.policy(ns, name, spec);
    }
    c.rules.ingress.dedup();
    c.rules.egress.dedup();
    // Counted directly: nothing is in the table yet, so there is no change to report.
    for pod in cluster.pods.values() {
        for (set, e) in c.contributions(cluster, node, pod) {
            *c.counts.entry(set).or_default().entry(e).or_insert(0) += 1;
        }
    }
    c
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Compiled {
    /// Declares the set for `membership` in one family (named by a hash of what picks its
    /// members, so every rule needing the same pods shares it) and returns its name.
    fn set(&mut self, prefix: &str, family: Family, membership: Membership) -> String {
        let kind = match membership {
            Membership::Named { .. } => SetKind::AddrPort(family),
            _ => SetKind::Addr(family),
        };
        let name = set_name(prefix, family, &format!("{membership:?}"));
        self.rules.sets.insert(name.clone(), kind);
        self.members.insert(name.clone(), (membership, family));
        name
    }

    fn policy(&mut self, ns: &str, name: &str, spec: &NetworkPolicySpec) {
        let selector = spec.pod_selector.clone().unwrap_or_default();
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
        let ingress = types.contains(&Direction::Ingress);
        let egress = types.contains(&Direction::Egress);
        self.isolating.push((ns.to_string(), selector.clone(), ingress, egress));
        for family in [Family::V4, Family::V6] {
            let selected = Membership::Selected { namespace: ns.to_string(), selector: selector.clone() };
            let sel = self.set("s", family, selected);
            for direction in &types {
                for (i, (peers, ports)) in rules_of(*direction, spec).into_iter().enumerate() {
                    let word = if *direction == Direction::Ingress { "ingress" } else { "egress" };
                    let comment = format!("{ns}/{name} {word} {i}");
                    self.rule(ns, *direction, family, &sel, (peers, ports), &comment);
                }
            }
        }
    }

    fn rule(
        &mut self,
        ns: &str,
        direction: Direction,
        family: Family,
        sel: &str,
        (peers, ports): (&[NetworkPolicyPeer], &[NetworkPolicyPort]),
        comment: &str,
    ) {
        let peers: Vec<Peer> = if peers.is_empty() {
            vec![Peer::Any]
        } else {
            peers.iter().filter_map(|p| self.peer(ns, family, p)).collect()
        };
        let ports: Vec<Ports> = if ports.is_empty() {
            vec![Ports::Any]
        } else {
            ports.iter().filter_map(|p| self.port(direction, family, p)).collect()
        };
        let list = match direction {
            Direction::Ingress => &mut self.rules.ingress,
            Direction::Egress => &mut self.rules.egress,
        };
        for peer in &peers {
            for port in &ports {
                list.push(Rule {
                    family,
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
    fn peer(&mut self, ns: &str, family: Family, peer: &NetworkPolicyPeer) -> Option<Peer> {
        if let Some(block) = &peer.ip_block {
            let net: IpNetwork = block.cidr.parse().ok()?;
            if Family::of_net(&net) != family {
                return None;
            }
            let except = block
                .except
                .iter()
                .flatten()
                .filter_map(|e| e.parse::<IpNetwork>().ok())
                .filter(|e| Family::of_net(e) == family);
            // `10.0.0.1/8` means 10.0.0.0/8, as the API server's validation reads it.
            let base = |n: IpNetwork| IpNetwork::new(n.network(), n.prefix()).unwrap_or(n);
            return Some(Peer::Block { net: base(net), except: except.map(base).collect() });
        }
        if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
            return None;
        }
        let membership = Membership::Peer {
            namespace: peer.namespace_selector.is_none().then(|| ns.to_string()),
            pods: peer.pod_selector.clone().unwrap_or_default(),
            namespaces: peer.namespace_selector.clone(),
        };
        Some(Peer::Set(self.set("s", family, membership)))
    }

    /// A port in one family; `None` for what the API would refuse.
    fn port(&mut self, direction: Direction, family: Family, port: &NetworkPolicyPort) -> Option<Ports> {
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
                Some(Ports::Named(self.set("n", family, Membership::Named { local, proto, name: name.clone() })))
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

/// `<prefix><4|6>-<16 hex digits of FNV-1a of key>`: stable across restarts, so a restarted agent
/// computes the names the table already has.
fn set_name(prefix: &str, family: Family, key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{prefix}{}-{h:016x}", family.pick(4, 6))
}

#[cfg(test)]
mod tests;
