use super::*;
use serde_json::json;
use std::collections::BTreeSet;

const NODE: &str = "n0";

fn pod(ns: &str, name: &str, node: &str, ips: &[&str], labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "namespace": ns, "name": name, "labels": labels },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "ports": [
            { "name": "http", "containerPort": if name == "b" { 8081 } else { 8080 } },
            { "name": "dns", "containerPort": 53, "protocol": "UDP" }
        ] }] },
        "status": { "phase": "Running", "podIPs": ips.iter().map(|ip| json!({ "ip": ip })).collect::<Vec<_>>() }
    }))
    .unwrap()
}

fn namespace(name: &str, labels: serde_json::Value) -> Namespace {
    serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).unwrap()
}

fn policy(ns: &str, name: &str, spec: serde_json::Value) -> NetworkPolicy {
    serde_json::from_value(json!({ "metadata": { "namespace": ns, "name": name }, "spec": spec })).unwrap()
}

/// ns x: a (n0), b (n1); ns y: a (n0); addresses in n0's 10.244.0.0/24 and n1's 10.244.1.0/24.
fn cluster() -> Cluster {
    let mut c = Cluster::default();
    c.apply_namespace(&namespace("x", json!({ "ns": "x", "team": "red" })));
    c.apply_namespace(&namespace("y", json!({ "ns": "y" })));
    c.apply_pod(&pod("x", "a", "n0", &["10.244.0.5", "fd00:10:244::5"], json!({ "pod": "a" })));
    c.apply_pod(&pod("x", "b", "n1", &["10.244.1.6", "fd00:10:244:1::6"], json!({ "pod": "b", "tier": "web" })));
    c.apply_pod(&pod("y", "a", "n0", &["10.244.0.7"], json!({ "pod": "a" })));
    c
}

const POD_CIDRS: [&str; 2] = ["10.244.0.0/24", "fd00:10:244::/64"];
const CLUSTER: [&str; 2] = ["10.244.0.0/16", "fd00:10:244::/56"];

fn compiled(c: &Cluster) -> (Ruleset, Elements) {
    let pod_cidrs: Vec<IpNetwork> = POD_CIDRS.iter().map(|s| s.parse().unwrap()).collect();
    let cluster: Vec<IpNetwork> = CLUSTER.iter().map(|s| s.parse().unwrap()).collect();
    let compiled = compile(c, &Node { name: NODE, pod_cidrs: &pod_cidrs, cluster: &cluster });
    let elements = compiled.elements();
    (compiled.rules, elements)
}

fn addrs(e: &Elements, set: &str) -> Vec<String> {
    e[set]
        .iter()
        .map(|el| match el {
            Element::Addr(a) => a.to_string(),
            Element::AddrPort(a, p, port) => format!("{a} {p} {port}"),
        })
        .collect()
}

fn peer_set(r: &Rule) -> &str {
    match &r.peer {
        Peer::Set(s) => s,
        other => panic!("not a set peer: {other:?}"),
    }
}

#[test]
fn no_policy_isolates_nothing() {
    let (rules, elements) = compiled(&cluster());
    assert_eq!(rules, empty_ruleset());
    assert!(elements.values().all(BTreeSet::is_empty), "{elements:?}");
}

#[test]
fn default_deny_isolates_only_this_nodes_selected_pods() {
    let mut c = cluster();
    c.apply_policy(&policy("x", "deny", json!({ "podSelector": {}, "policyTypes": ["Ingress", "Egress"] })));
    let (rules, e) = compiled(&c);
    assert!(rules.ingress.is_empty() && rules.egress.is_empty());
    // x/b runs on n1 (protected there); y/a is in another namespace.
    assert_eq!(addrs(&e, "in-iso4"), ["10.244.0.5"]);
    assert_eq!(addrs(&e, "eg-iso4"), ["10.244.0.5"]);
    assert_eq!(addrs(&e, "in-iso6"), ["fd00:10:244::5"]);
}

#[test]
fn policy_types_default_from_the_rules() {
    let mut c = cluster();
    c.apply_policy(&policy("x", "p", json!({ "podSelector": {}, "egress": [{}] })));
    let (rules, e) = compiled(&c);
    assert_eq!(addrs(&e, "in-iso4"), ["10.244.0.5"]);
    assert_eq!(addrs(&e, "eg-iso4"), ["10.244.0.5"]);
    assert_eq!(rules.egress.len(), 2, "one allow-all rule per family: {:?}", rules.egress);
    assert!(rules.egress.iter().all(|r| r.peer == Peer::Any && r.ports == Ports::Any));
}

#[test]
fn pod_and_namespace_selectors_and_their_and_or() {
    let mut c = cluster();
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "policyTypes": ["Ingress"], "ingress": [
            { "from": [{ "podSelector": { "matchLabels": { "pod": "a" } } }] },
            { "from": [{ "namespaceSelector": { "matchLabels": { "ns": "y" } } }] },
            { "from": [{ "namespaceSelector": {}, "podSelector": { "matchLabels": { "pod": "a" } } }] },
            { "from": [{ "namespaceSelector": { "matchLabels": { "ns": "y" } } }, { "podSelector": { "matchLabels": { "tier": "web" } } }] },
        ] }),
    ));
    let (rules, e) = compiled(&c);
    let v4: Vec<&Rule> = rules.ingress.iter().filter(|r| r.family == Family::V4).collect();
    let peers: Vec<Vec<String>> = v4.iter().map(|r| addrs(&e, peer_set(r))).collect();
    assert_eq!(peers[0], ["10.244.0.5"], "pod=a in x only");
    assert_eq!(peers[1], ["10.244.0.7"], "every pod of y");
    assert_eq!(peers[2], ["10.244.0.5", "10.244.0.7"], "pod=a in every namespace");
    assert_eq!((peers[3].clone(), peers[4].clone()), (vec!["10.244.0.7".to_string()], vec!["10.244.1.6".to_string()]));
    assert_eq!(v4.len(), 5);
    assert_eq!(v4[4].comment, "x/p ingress 3");
    assert_eq!(addrs(&e, &v4[0].selected), ["10.244.0.5"]);
}

#[test]
fn match_expressions_operators() {
    let labels: Labels = [("a".to_string(), "1".to_string())].into();
    let sel = |op: &str, key: &str, values: &[&str]| -> LabelSelector {
        serde_json::from_value(json!({ "matchExpressions": [{ "key": key, "operator": op, "values": values }] }))
            .unwrap()
    };
    assert!(selects(&sel("In", "a", &["1", "2"]), &labels));
    assert!(!selects(&sel("In", "a", &["2"]), &labels));
    assert!(!selects(&sel("In", "b", &["1"]), &labels));
    assert!(selects(&sel("NotIn", "a", &["2"]), &labels));
    assert!(!selects(&sel("NotIn", "a", &["1"]), &labels));
    assert!(selects(&sel("NotIn", "b", &["1"]), &labels), "NotIn holds for a missing key");
    assert!(selects(&sel("Exists", "a", &[]), &labels));
    assert!(!selects(&sel("Exists", "b", &[]), &labels));
    assert!(selects(&sel("DoesNotExist", "b", &[]), &labels));
    assert!(!selects(&sel("DoesNotExist", "a", &[]), &labels));
    assert!(!selects(&sel("Matches", "a", &["1"]), &labels), "an unknown operator selects nothing");
    assert!(selects(&LabelSelector::default(), &labels));
}

#[test]
fn ports_named_ranged_and_protocol_only() {
    let mut c = cluster();
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": {}, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{ "ports": [{ "port": "http" }, { "port": 8000, "endPort": 9000, "protocol": "UDP" }, { "protocol": "SCTP" }] }],
                "egress": [{ "ports": [{ "port": "http" }] }] }),
    ));
    let (rules, e) = compiled(&c);
    let v4: Vec<&Rule> = rules.ingress.iter().filter(|r| r.family == Family::V4).collect();
    let Ports::Named(local) = &v4[0].ports else { panic!("{:?}", v4[0]) };
    // Ingress: this node's pods only, each with its own number.
    assert_eq!(addrs(&e, local), ["10.244.0.5 6 8080", "10.244.0.7 6 8080"]);
    assert_eq!(v4[1].ports, Ports::Range { proto: UDP, first: 8000, last: 9000 });
    assert_eq!(v4[2].ports, Ports::Protocol(SCTP));
    let eg: Vec<&Rule> = rules.egress.iter().filter(|r| r.family == Family::V4).collect();
    let Ports::Named(all) = &eg[0].ports else { panic!("{:?}", eg[0]) };
    // Egress: the destination may be any pod; x/b names its http port 8081.
    assert_eq!(addrs(&e, all), ["10.244.0.5 6 8080", "10.244.0.7 6 8080", "10.244.1.6 6 8081"]);
}

#[test]
fn ip_blocks_by_family_with_except() {
    let mut c = cluster();
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": {}, "policyTypes": ["Egress"], "egress": [{ "to": [
            { "ipBlock": { "cidr": "10.0.0.0/8", "except": ["10.244.1.0/24", "fd00::/8"] } },
            { "ipBlock": { "cidr": "fd00:10:244::1/48" } }
        ] }] }),
    ));
    let (rules, _) = compiled(&c);
    let blocks: Vec<&Peer> = rules.egress.iter().map(|r| &r.peer).collect();
    assert_eq!(
        blocks,
        [
            &Peer::Block { net: "10.0.0.0/8".parse().unwrap(), except: vec!["10.244.1.0/24".parse().unwrap()] },
            &Peer::Block { net: "fd00:10:244::/48".parse().unwrap(), except: vec![] },
        ]
    );
}

#[test]
fn addresses_that_are_not_theirs_are_not_believed() {
    let mut c = cluster();
    // A pod of this node claiming an address outside its pod CIDRs, one of another node claiming
    // one outside the cluster, a host-network pod and a finished one.
    c.apply_pod(&pod("x", "liar", "n0", &["10.244.1.99", "10.244.0.9"], json!({ "pod": "a" })));
    c.apply_pod(&pod("x", "far", "n1", &["8.8.8.8"], json!({ "pod": "a" })));
    let mut host = pod("x", "host", "n0", &["10.244.0.10"], json!({ "pod": "a" }));
    host.spec.as_mut().unwrap().host_network = Some(true);
    c.apply_pod(&host);
    let mut done = pod("x", "done", "n0", &["10.244.0.11"], json!({ "pod": "a" }));
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    c.apply_pod(&done);
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": [{ "from": [{ "podSelector": {} }] }] }),
    ));
    let (rules, e) = compiled(&c);
    assert_eq!(addrs(&e, "in-iso4"), ["10.244.0.5", "10.244.0.9"]);
    assert_eq!(addrs(&e, peer_set(&rules.ingress[0])), ["10.244.0.5", "10.244.0.9", "10.244.1.6"]);
}

#[test]
fn pods_change_elements_never_rules() {
    let mut c = cluster();
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "tier": "web" } } }], "ports": [{ "port": "http" }] }] }),
    ));
    let (before, e1) = compiled(&c);
    c.apply_pod(&pod("x", "c", "n0", &["10.244.0.12"], json!({ "pod": "a", "tier": "web" })));
    c.apply_pod(&pod("x", "a", "n0", &["10.244.0.5"], json!({ "pod": "z" })));
    let (after, e2) = compiled(&c);
    assert_eq!(before, after);
    assert_ne!(e1, e2);
    assert_eq!(addrs(&e2, "in-iso4"), ["10.244.0.12"]);
    // The same policy compiled again names the same sets: a restarted agent finds its table.
    assert_eq!(compiled(&c).0, after);
}

#[test]
fn a_pod_change_moves_the_elements_a_whole_compile_would() {
    let pod_cidrs: Vec<IpNetwork> = POD_CIDRS.iter().map(|s| s.parse().unwrap()).collect();
    let range: Vec<IpNetwork> = CLUSTER.iter().map(|s| s.parse().unwrap()).collect();
    let node = Node { name: NODE, pod_cidrs: &pod_cidrs, cluster: &range };
    let mut c = cluster();
    c.apply_policy(&policy(
        "x",
        "p",
        json!({ "podSelector": { "matchLabels": { "pod": "a" } }, "policyTypes": ["Ingress", "Egress"],
                "ingress": [{ "from": [{ "namespaceSelector": { "matchLabels": { "ns": "y" } } }], "ports": [{ "port": "http" }] }],
                "egress": [{ "to": [{ "podSelector": { "matchExpressions": [{ "key": "tier", "operator": "Exists" }] } }], "ports": [{ "port": "dns", "protocol": "UDP" }] }] }),
    ));
    let mut compiled = compile(&c, &node);
    let steps = [
        (pod("x", "c", "n0", &["10.244.0.12"], json!({ "pod": "a", "tier": "db" })), false),
        (pod("y", "d", "n1", &["10.244.1.13"], json!({})), false),
        (pod("x", "c", "n0", &["10.244.0.12"], json!({ "pod": "b" })), false),
        // Another pod with the same address (a reused address, for a moment): deleting one
        // keeps the address for the other.
        (pod("x", "e", "n0", &["10.244.0.5"], json!({ "pod": "a" })), false),
        (pod("x", "a", "n0", &["10.244.0.5"], json!({ "pod": "a" })), true),
        (pod("y", "d", "n1", &["10.244.1.13"], json!({})), true),
    ];
    for (p, gone) in steps {
        let key = pod_key(&p);
        let before = c.pods.get(&key).cloned();
        if gone {
            c.delete_pod(&p);
        } else {
            c.apply_pod(&p);
        }
        let after = c.pods.get(&key).cloned();
        let was = compiled.elements();
        let moved = compiled.pod_changed(&c, &node, before.as_ref(), after.as_ref());
        let whole = compile(&c, &node);
        assert_eq!(compiled.elements(), whole.elements(), "after {key:?}");
        assert_eq!(compiled.rules, whole.rules);
        // What it reports is exactly what moved.
        let mut expected = Vec::new();
        for (set, now) in whole.elements() {
            let then = &was[&set];
            expected.extend(now.difference(then).map(|e| ((set.clone(), *e), 1)));
            expected.extend(then.difference(&now).map(|e| ((set.clone(), *e), -1)));
        }
        let mut moved = moved;
        moved.sort();
        expected.sort();
        assert_eq!(moved, expected, "after {key:?}");
    }
    assert_eq!(addrs(&compiled.elements(), "in-iso4"), ["10.244.0.5"], "x/e keeps the address x/a had");
}
