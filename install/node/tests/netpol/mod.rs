//! NetworkPolicy semantics as the networking.k8s.io/v1 API reference and the upstream e2e suite
//! (kubernetes test/e2e/network/netpol) define them, written in the test and independently of the
//! agent: tests/network_policy.rs compares the probe matrix it sees with what this computes.
//!
//! - A pod is isolated for ingress (egress) only when a policy of its own namespace selects it
//!   and has that policy type; a non-isolated direction allows everything.
//! - policyTypes, when empty, is Ingress plus Egress if the policy has egress rules.
//! - Traffic passes when egress from the source and ingress to the destination both allow it; a
//!   direction allows it when any rule of any policy selecting the pod does (a union).
//! - A rule matches when a peer matches (no peers: everyone) and a port matches (no ports: all).
//! - A peer: ipBlock (cidr minus except, the address family must agree) or selectors; a
//!   podSelector alone means pods of the policy's namespace, a namespaceSelector alone all pods
//!   of the selected namespaces, both in one peer both at once (AND); separate peers are OR.
//! - A port: protocol (TCP when absent), a number (up to endPort when given) or a name resolved
//!   on the destination pod (a container port of that name and protocol), or none: every port
//!   of the protocol.
#![allow(dead_code)]

use ipnetwork::IpNetwork;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;
use std::net::IpAddr;

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
}

/// A named container port (Pod spec.containers[].ports[]).
#[derive(Clone, Debug)]
pub struct ContainerPort {
    pub name: String,
    pub port: u16,
    pub proto: Proto,
}

/// What of a Pod the semantics depend on.
#[derive(Clone, Debug)]
pub struct PodModel {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub ips: Vec<IpAddr>,
    pub ports: Vec<ContainerPort>,
}

impl PodModel {
    /// The pod's address of the same family as `other`.
    pub fn ip_like(&self, other: IpAddr) -> IpAddr {
        *self.ips.iter().find(|ip| ip.is_ipv4() == other.is_ipv4()).expect("the pod has an address of each family")
    }
}

/// The cluster's Namespaces (their labels) and NetworkPolicies.
#[derive(Clone, Debug, Default)]
pub struct World {
    pub namespaces: BTreeMap<String, Labels>,
    pub policies: Vec<NetworkPolicy>,
}

/// Does `selector` select an object with `labels`? An empty selector selects everything.
pub fn selects(selector: &LabelSelector, labels: &Labels) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|req| {
        let values = req.values.as_deref().unwrap_or_default();
        let value = labels.get(&req.key);
        match req.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => !value.is_some_and(|v| values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("label selector operator {other:?} is not one of In, NotIn, Exists, DoesNotExist"),
        }
    });
    by_labels && by_expressions
}

fn namespace_of(policy: &NetworkPolicy) -> &str {
    policy.metadata.namespace.as_deref().expect("a NetworkPolicy has a namespace")
}

/// (isolates for ingress, isolates for egress), policyTypes defaulted as the API server does.
pub fn policy_types(policy: &NetworkPolicy) -> (bool, bool) {
    let spec = policy.spec.as_ref().expect("a NetworkPolicy has a spec");
    match spec.policy_types.as_deref() {
        Some(types) if !types.is_empty() => (types.iter().any(|t| t == "Ingress"), types.iter().any(|t| t == "Egress")),
        _ => (true, spec.egress.as_ref().is_some_and(|rules| !rules.is_empty())),
    }
}

fn selects_pod(policy: &NetworkPolicy, pod: &PodModel) -> bool {
    let spec = policy.spec.as_ref().expect("a NetworkPolicy has a spec");
    namespace_of(policy) == pod.namespace && spec.pod_selector.as_ref().is_none_or(|s| selects(s, &pod.labels))
}

fn ip_in(cidr: &str, ip: IpAddr) -> bool {
    let net: IpNetwork = cidr.parse().unwrap_or_else(|e| panic!("ipBlock {cidr:?}: {e}"));
    net.is_ipv4() == ip.is_ipv4() && net.contains(ip)
}

impl World {
    fn namespace_labels(&self, name: &str) -> Labels {
        self.namespaces.get(name).cloned().unwrap_or_else(|| panic!("namespace {name} is not in the world"))
    }

    /// Does `peer` of a policy in namespace `policy_ns` match `pod` at address `ip`?
    fn peer_matches(&self, peer: &NetworkPolicyPeer, policy_ns: &str, pod: &PodModel, ip: IpAddr) -> bool {
        if let Some(block) = &peer.ip_block {
            return ip_in(&block.cidr, ip) && !block.except.iter().flatten().any(|e| ip_in(e, ip));
        }
        assert!(
            peer.pod_selector.is_some() || peer.namespace_selector.is_some(),
            "a peer needs a podSelector, a namespaceSelector or an ipBlock"
        );
        let namespace_ok = match &peer.namespace_selector {
            None => pod.namespace == policy_ns,
            Some(s) => selects(s, &self.namespace_labels(&pod.namespace)),
        };
        namespace_ok && peer.pod_selector.as_ref().is_none_or(|s| selects(s, &pod.labels))
    }

    fn peers_match(&self, peers: Option<&Vec<NetworkPolicyPeer>>, ns: &str, pod: &PodModel, ip: IpAddr) -> bool {
        match peers {
            None => true,
            Some(peers) if peers.is_empty() => true,
            Some(peers) => peers.iter().any(|p| self.peer_matches(p, ns, pod, ip)),
        }
    }

    /// Is traffic from pod `src` to pod `dst` at `dst_ip`, `port`/`proto`, allowed?
    pub fn allowed(&self, src: &PodModel, dst: &PodModel, dst_ip: IpAddr, port: u16, proto: Proto) -> bool {
        let src_ip = src.ip_like(dst_ip);
        self.egress_allows(src, dst, dst_ip, port, proto) && self.ingress_allows(src, src_ip, dst, port, proto)
    }

    fn egress_allows(&self, src: &PodModel, dst: &PodModel, dst_ip: IpAddr, port: u16, proto: Proto) -> bool {
        let selecting: Vec<&NetworkPolicy> =
            self.policies.iter().filter(|p| policy_types(p).1 && selects_pod(p, src)).collect();
        selecting.is_empty()
            || selecting.iter().any(|p| {
                let spec = p.spec.as_ref().expect("spec");
                spec.egress.iter().flatten().any(|rule| {
                    ports_match(rule.ports.as_ref(), dst, port, proto)
                        && self.peers_match(rule.to.as_ref(), namespace_of(p), dst, dst_ip)
                })
            })
    }

    fn ingress_allows(&self, src: &PodModel, src_ip: IpAddr, dst: &PodModel, port: u16, proto: Proto) -> bool {
        let selecting: Vec<&NetworkPolicy> =
            self.policies.iter().filter(|p| policy_types(p).0 && selects_pod(p, dst)).collect();
        selecting.is_empty()
            || selecting.iter().any(|p| {
                let spec = p.spec.as_ref().expect("spec");
                spec.ingress.iter().flatten().any(|rule| {
                    ports_match(rule.ports.as_ref(), dst, port, proto)
                        && self.peers_match(rule.from.as_ref(), namespace_of(p), src, src_ip)
                })
            })
    }
}

/// Does any of `ports` (none: all) take `port`/`proto` on the destination pod `dst`?
fn ports_match(ports: Option<&Vec<NetworkPolicyPort>>, dst: &PodModel, port: u16, proto: Proto) -> bool {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else { return true };
    ports.iter().any(|p| {
        if p.protocol.as_deref().unwrap_or("TCP") != proto.name() {
            return false;
        }
        match &p.port {
            None => true,
            Some(IntOrString::Int(first)) => {
                let last = p.end_port.unwrap_or(*first);
                (*first..=last).contains(&i32::from(port))
            }
            Some(IntOrString::String(name)) => {
                dst.ports.iter().any(|c| &c.name == name && c.proto == proto && c.port == port)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn pod(ns: &str, name: &str, v4: &str, http: u16) -> PodModel {
        PodModel {
            namespace: ns.into(),
            name: name.into(),
            labels: labels(&[("pod", name)]),
            ips: vec![v4.parse().unwrap(), format!("fd00::{}", v4.rsplit('.').next().unwrap()).parse().unwrap()],
            ports: vec![
                ContainerPort { name: "http".into(), port: http, proto: Proto::Tcp },
                ContainerPort { name: "dns".into(), port: 53, proto: Proto::Udp },
            ],
        }
    }

    fn policy(ns: &str, name: &str, spec: Value) -> NetworkPolicy {
        serde_json::from_value(json!({
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": ns, "name": name}, "spec": spec
        }))
        .unwrap()
    }

    fn world(policies: Vec<NetworkPolicy>) -> World {
        let namespaces = [
            ("x", labels(&[("ns", "x"), ("team", "blue")])),
            ("y", labels(&[("ns", "y")])),
            ("z", labels(&[("ns", "z"), ("team", "red")])),
        ];
        World { namespaces: namespaces.into_iter().map(|(k, v)| (k.to_string(), v)).collect(), policies }
    }

    /// x/a 10.0.0.1, x/b 10.0.0.2, y/a 10.0.1.1, y/b 10.0.1.2, z/c 10.0.2.3; http is 80 on a, 81 on b and c.
    fn pods() -> Vec<PodModel> {
        vec![
            pod("x", "a", "10.0.0.1", 80),
            pod("x", "b", "10.0.0.2", 81),
            pod("y", "a", "10.0.1.1", 80),
            pod("y", "b", "10.0.1.2", 81),
            pod("z", "c", "10.0.2.3", 81),
        ]
    }

    /// Which of (from, to) index pairs pass on `port`/`proto` over IPv4.
    fn reach(w: &World, port: u16, proto: Proto) -> Vec<(usize, usize)> {
        let p = pods();
        let mut out = Vec::new();
        for (i, s) in p.iter().enumerate() {
            for (j, d) in p.iter().enumerate() {
                if i != j && w.allowed(s, d, d.ips[0], port, proto) {
                    out.push((i, j));
                }
            }
        }
        out
    }

    fn all_pairs_except(denied: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        for i in 0..5 {
            for j in 0..5 {
                if i != j && !denied.contains(&(i, j)) {
                    out.push((i, j));
                }
            }
        }
        out
    }

    #[test]
    fn evaluator_without_policies_allows_everything() {
        assert_eq!(reach(&world(vec![]), 80, Proto::Tcp), all_pairs_except(&[]));
        assert_eq!(reach(&world(vec![]), 9, Proto::Sctp), all_pairs_except(&[]));
    }

    #[test]
    fn evaluator_default_deny_ingress_isolates_only_its_namespace() {
        let w = world(vec![policy("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress"]}))]);
        // Nothing reaches x/a (0) or x/b (1), not even from x; x still sends everywhere.
        let denied = [(1, 0), (2, 0), (3, 0), (4, 0), (0, 1), (2, 1), (3, 1), (4, 1)];
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&denied));
        // No policyTypes and no egress rules: Ingress only, the same result.
        let w = world(vec![policy("x", "deny", json!({"podSelector": {}}))]);
        assert_eq!(reach(&w, 80, Proto::Udp), all_pairs_except(&denied));
    }

    #[test]
    fn evaluator_default_deny_egress_with_a_dns_like_exception() {
        let deny = json!({"podSelector": {}, "policyTypes": ["Egress"]});
        let w = world(vec![policy("y", "deny", deny)]);
        let from_y: Vec<(usize, usize)> =
            [2, 3].iter().flat_map(|&i| (0..5).filter(move |&j| j != i).map(move |j| (i, j))).collect();
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&from_y));
        let dns = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]});
        let w = world(vec![policy("y", "dns", dns)]);
        assert_eq!(reach(&w, 53, Proto::Udp), all_pairs_except(&[]));
        assert_eq!(reach(&w, 53, Proto::Tcp), all_pairs_except(&from_y));
        // Egress rules without policyTypes isolate egress too; an empty egress list does not.
        let implicit = json!({"podSelector": {}, "egress": [{"ports": [{"protocol": "UDP", "port": 53}]}]});
        assert_eq!(policy_types(&policy("y", "p", implicit)), (true, true));
        assert_eq!(policy_types(&policy("y", "p", json!({"podSelector": {}, "egress": []}))), (true, false));
    }

    #[test]
    fn evaluator_selectors_and_within_a_peer_or_across_peers() {
        let and = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]});
        // Into x/a only from y/b.
        let w = world(vec![policy("x", "and", and)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(1, 0), (2, 0), (4, 0)]));
        let or = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": {"matchLabels": {"pod": "b"}}}]}]});
        // Into x/a from all of y and from x/b (podSelector alone: the policy's namespace).
        let w = world(vec![policy("x", "or", or)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(4, 0)]));
        // An empty namespaceSelector is every namespace; with a podSelector, pod b of any.
        let any = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"namespaceSelector": {}, "podSelector": {"matchLabels": {"pod": "b"}}}]}]});
        let w = world(vec![policy("x", "any", any)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(2, 0), (4, 0)]));
    }

    #[test]
    fn evaluator_match_expressions_all_operators() {
        let sel = |op: &str, values: Value| -> LabelSelector {
            serde_json::from_value(json!({"matchExpressions": [{"key": "team", "operator": op, "values": values}]}))
                .unwrap()
        };
        let (x, y, z) = (labels(&[("team", "blue")]), labels(&[]), labels(&[("team", "red")]));
        let pick = |s: &LabelSelector| [&x, &y, &z].map(|l| selects(s, l));
        assert_eq!(pick(&sel("In", json!(["blue", "green"]))), [true, false, false]);
        assert_eq!(pick(&sel("NotIn", json!(["blue"]))), [false, true, true]);
        assert_eq!(pick(&sel("Exists", Value::Null)), [true, false, true]);
        assert_eq!(pick(&sel("DoesNotExist", Value::Null)), [false, true, false]);
        let both: LabelSelector = serde_json::from_value(json!({"matchLabels": {"team": "red"},
            "matchExpressions": [{"key": "team", "operator": "Exists"}]}))
        .unwrap();
        assert_eq!(pick(&both), [false, false, true]);
        // In a policy: into y from namespaces without a team label, i.e. y itself.
        let p = json!({"podSelector": {}, "ingress": [{"from": [
            {"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}}]}]});
        let w = world(vec![policy("y", "p", p)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(0, 2), (1, 2), (4, 2), (0, 3), (1, 3), (4, 3)]));
    }

    #[test]
    fn evaluator_named_ports_resolve_on_the_destination_pod() {
        // Ingress to x on "http": 80 on x/a, 81 on x/b.
        let p = json!({"podSelector": {}, "ingress": [{"ports": [{"port": "http"}]}]});
        let w = world(vec![policy("x", "http", p)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(0, 1), (2, 1), (3, 1), (4, 1)]));
        assert_eq!(reach(&w, 81, Proto::Tcp), all_pairs_except(&[(1, 0), (2, 0), (3, 0), (4, 0)]));
        // The named port is TCP: UDP to the same number is not taken by it.
        assert_eq!(reach(&w, 80, Proto::Udp).iter().filter(|(_, d)| *d < 2).count(), 0);
        // Egress from z to "http": resolved on each destination (80 on the a pods, 81 on the b ones).
        let p = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [{"port": "http"}]}]});
        let w = world(vec![policy("z", "out", p)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(4, 1), (4, 3)]));
        assert_eq!(reach(&w, 81, Proto::Tcp), all_pairs_except(&[(4, 0), (4, 2)]));
    }

    #[test]
    fn evaluator_port_ranges_protocols_and_sctp() {
        let p = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"ports": [{"protocol": "TCP", "port": 79, "endPort": 80}, {"protocol": "UDP"}]}]});
        let w = world(vec![policy("x", "range", p)]);
        let into_xa = [(1, 0), (2, 0), (3, 0), (4, 0)];
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[]));
        assert_eq!(reach(&w, 81, Proto::Tcp), all_pairs_except(&into_xa));
        assert_eq!(reach(&w, 81, Proto::Udp), all_pairs_except(&[]));
        // A rule for SCTP 80 only is not one for TCP 80.
        let p = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]});
        let w = world(vec![policy("x", "sctp", p)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&into_xa));
        assert_eq!(reach(&w, 80, Proto::Sctp), all_pairs_except(&[]));
        assert_eq!(reach(&w, 81, Proto::Sctp), all_pairs_except(&into_xa));
    }

    #[test]
    fn evaluator_ip_blocks_with_except_and_families() {
        // Into x/a from 10.0.0.0/16 except 10.0.1.0/24, and from y/b's /32: an address in both
        // the except and another block is allowed (the union).
        let p = json!({"podSelector": {"matchLabels": {"pod": "a"}}, "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.1.0/24"]}},
            {"ipBlock": {"cidr": "10.0.1.2/32"}}]}]});
        let w = world(vec![policy("x", "block", p)]);
        assert_eq!(reach(&w, 80, Proto::Tcp), all_pairs_except(&[(2, 0)]));
        // IPv6 traffic matches no IPv4 block.
        let p6 = pods();
        assert!(!w.allowed(&p6[1], &p6[0], p6[0].ips[1], 80, Proto::Tcp));
        assert!(w.allowed(&p6[1], &p6[0], p6[0].ips[0], 80, Proto::Tcp));
        // Egress to a /128 only.
        let p = json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"to": [{"ipBlock": {"cidr": "fd00::2/128"}}]}]});
        let w = world(vec![policy("z", "six", p)]);
        assert!(w.allowed(&p6[4], &p6[3], p6[3].ips[1], 80, Proto::Tcp));
        assert!(!w.allowed(&p6[4], &p6[3], p6[3].ips[0], 80, Proto::Tcp));
        assert!(!w.allowed(&p6[4], &p6[2], p6[2].ips[1], 80, Proto::Tcp));
    }

    #[test]
    fn evaluator_stacked_policies_are_a_union_and_directions_are_independent() {
        let deny = policy("x", "deny", json!({"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}));
        let p = pods();
        let w = world(vec![deny.clone()]);
        assert!(!w.allowed(&p[0], &p[2], p[2].ips[0], 80, Proto::Tcp));
        assert!(!w.allowed(&p[2], &p[0], p[0].ips[0], 80, Proto::Tcp));
        // An allow-all ingress policy beside it opens ingress only.
        let all_in = policy("x", "all-in", json!({"podSelector": {}, "ingress": [{}]}));
        let w = world(vec![deny, all_in]);
        assert!(w.allowed(&p[2], &p[0], p[0].ips[0], 80, Proto::Tcp));
        assert!(!w.allowed(&p[0], &p[2], p[2].ips[0], 80, Proto::Tcp));
        // x/a to x/b needs x/a's egress, which stays closed.
        assert!(!w.allowed(&p[0], &p[1], p[1].ips[0], 80, Proto::Tcp));
    }
}
