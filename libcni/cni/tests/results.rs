//! Result parsing and conversion against upstream libcni's vectors and our own 1.1.0 goldens.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::gojson::{go_1_2_print, Ordered};
use libcni::types::{convert, CniResult, Dns, Interface, IpConfig, Route};
use libcni::{code, version::SUPPORTED};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Upstream's vectors, kept in the repository (tests/testdata/README.md says where they came from).
fn vectors() -> Vec<Value> {
    let all: Vec<Value> = serde_json::from_str(&vectors_text()).unwrap();
    assert_eq!(all.len(), 54, "conversions.json should hold 54 vectors");
    all
}

fn vectors_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/conversions.json");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("test vectors {}: {e}", path.display()))
}

/// The vectors with every object's keys in the order upstream wrote them (Go's field order).
fn ordered_vectors() -> Vec<Ordered> {
    match Ordered::parse(&vectors_text()) {
        Ordered::Array(items) => items,
        other => panic!("conversions.json is not an array: {other:?}"),
    }
}

/// A vector's output as libcni >= 1.2 gives it: the 1.x type leaves out an empty `dns` (the vectors
/// come from v1.1.2, which kept it).
fn go_1_2_value(output: &Value, to: &str) -> Value {
    let mut out = output.clone();
    if to.starts_with("1.") && out["dns"] == json!({}) {
        out.as_object_mut().unwrap().remove("dns");
    }
    out
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap()
}

#[test]
fn upstream_vectors() {
    let ordered = ordered_vectors();
    for (i, vector) in vectors().iter().enumerate() {
        let (from, to) = (s(&vector["from"]), s(&vector["to"]));
        let label = format!("vector {i}: {from} -> {to}");
        let parsed = CniResult::parse(&vector["input"], from).unwrap();
        assert_eq!(parsed.cni_version, from, "{label}");
        let got = parsed.to_value(to);
        let via_convert = convert(&vector["input"], to);
        match vector.get("error") {
            Some(msg) => {
                let err = got.expect_err(&label);
                assert_eq!(err.msg, s(msg), "{label}");
                assert_eq!(via_convert.expect_err(&label).msg, s(msg), "{label}");
            }
            None => {
                let got = got.unwrap_or_else(|e| panic!("{label}: {e}"));
                let expected = go_1_2_value(&vector["output"], to);
                assert_eq!(got, expected, "{label}");
                assert_eq!(via_convert.unwrap(), expected, "{label}");
                // Print() is upstream's text, byte for byte.
                let text = parsed.to_pretty(to).unwrap();
                let upstream = go_1_2_print(ordered[i].get("output").unwrap(), to);
                assert_eq!(text, upstream, "{label}");
            }
        }
    }
}

/// 1.0.0 and 1.1.0 share one Go type, so upstream renders them alike but for `cniVersion`.
#[test]
fn upstream_inputs_to_1_1_0() {
    let all = vectors();
    let to_100 = all.iter().filter(|v| v["to"] == "1.0.0");
    let mut seen = 0;
    for vector in to_100 {
        let mut expected = go_1_2_value(&vector["output"], "1.1.0");
        expected["cniVersion"] = json!("1.1.0");
        assert_eq!(convert(&vector["input"], "1.1.0").unwrap(), expected, "{}", vector["input"]);
        seen += 1;
    }
    assert_eq!(seen, 9);
}

fn full_110() -> Value {
    json!({
        "cniVersion": "1.1.0",
        "interfaces": [
            {"name": "br0", "mac": "0a:58:0a:f4:00:01", "mtu": 9000},
            {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "mtu": 1450, "sandbox": "/var/run/netns/pod9",
             "socketPath": "/run/vhost/sock0", "pciID": "0000:00:1f.6"}
        ],
        "ips": [
            {"interface": 1, "address": "10.244.0.5/24", "gateway": "10.244.0.1"},
            {"interface": 1, "address": "fd00:10:244::5/64", "gateway": "fd00:10:244::1"},
            {"interface": 0, "address": "10.244.0.1/24"}
        ],
        "routes": [
            {"dst": "0.0.0.0/0", "gw": "10.244.0.1", "mtu": 1400, "advmss": 1360, "priority": 100,
             "table": 0, "scope": 0},
            {"dst": "10.96.0.0/12", "table": 254, "scope": 253},
            {"dst": "::/0", "gw": "fd00:10:244::1", "priority": 1024}
        ],
        "dns": {"nameservers": ["10.96.0.10"], "domain": "cluster.local",
                "search": ["svc.cluster.local"], "options": ["ndots:5"]}
    })
}

#[test]
fn full_110_parses_into_every_field() {
    let r = CniResult::parse(&full_110(), "").unwrap();
    assert_eq!(r.cni_version, "1.1.0");
    assert_eq!(
        r.interfaces[1],
        Interface {
            name: "eth0".into(),
            mac: Some("0a:58:0a:f4:00:05".into()),
            mtu: Some(1450),
            sandbox: Some("/var/run/netns/pod9".into()),
            socket_path: Some("/run/vhost/sock0".into()),
            pci_id: Some("0000:00:1f.6".into()),
        }
    );
    assert_eq!(
        r.ips[0],
        IpConfig {
            address: "10.244.0.5/24".parse().unwrap(),
            gateway: Some("10.244.0.1".parse().unwrap()),
            interface: Some(1),
        }
    );
    assert_eq!(r.ips[0].address.ip().to_string(), "10.244.0.5", "host bits kept");
    assert_eq!(
        r.routes[0],
        Route {
            dst: "0.0.0.0/0".parse().unwrap(),
            gw: Some("10.244.0.1".parse().unwrap()),
            mtu: Some(1400),
            advmss: Some(1360),
            priority: Some(100),
            table: Some(0),
            scope: Some(0),
        }
    );
    assert_eq!(r.routes[1].scope, Some(253));
    assert_eq!(r.dns.domain.as_deref(), Some("cluster.local"));
    assert_eq!(r.to_value("1.1.0").unwrap(), full_110());
}

#[test]
fn full_110_pretty_is_go_print() {
    let r = CniResult::parse(&full_110(), "").unwrap();
    // libcni >= 1.2 prints a 1.x result through a Go map: keys sorted at every level.
    let expected = r#"{
    "cniVersion": "1.1.0",
    "dns": {
        "domain": "cluster.local",
        "nameservers": [
            "10.96.0.10"
        ],
        "options": [
            "ndots:5"
        ],
        "search": [
            "svc.cluster.local"
        ]
    },
    "interfaces": [
        {
            "mac": "0a:58:0a:f4:00:01",
            "mtu": 9000,
            "name": "br0"
        },
        {
            "mac": "0a:58:0a:f4:00:05",
            "mtu": 1450,
            "name": "eth0",
            "pciID": "0000:00:1f.6",
            "sandbox": "/var/run/netns/pod9",
            "socketPath": "/run/vhost/sock0"
        }
    ],
    "ips": [
        {
            "address": "10.244.0.5/24",
            "gateway": "10.244.0.1",
            "interface": 1
        },
        {
            "address": "fd00:10:244::5/64",
            "gateway": "fd00:10:244::1",
            "interface": 1
        },
        {
            "address": "10.244.0.1/24",
            "interface": 0
        }
    ],
    "routes": [
        {
            "advmss": 1360,
            "dst": "0.0.0.0/0",
            "gw": "10.244.0.1",
            "mtu": 1400,
            "priority": 100,
            "scope": 0,
            "table": 0
        },
        {
            "dst": "10.96.0.0/12",
            "scope": 253,
            "table": 254
        },
        {
            "dst": "::/0",
            "gw": "fd00:10:244::1",
            "priority": 1024
        }
    ]
}"#;
    assert_eq!(r.to_pretty("1.1.0").unwrap(), expected);
    // The same text the Go printer model gives for the struct-ordered input.
    assert_eq!(expected, go_1_2_print(&Ordered::parse(&full_110().to_string()), "1.1.0"));

    // An empty dns is left out of a 1.x result, kept in 0.x ones; strings are escaped as Go does.
    let bare = CniResult {
        cni_version: "1.0.0".into(),
        interfaces: vec![Interface { name: "a<b>&c\u{2028}".into(), ..Interface::default() }],
        ..CniResult::default()
    };
    assert_eq!(
        bare.to_pretty("1.0.0").unwrap(),
        "{\n    \"cniVersion\": \"1.0.0\",\n    \"interfaces\": [\n        {\n            \"name\": \"a\\u003cb\\u003e\\u0026c\\u2028\"\n        }\n    ]\n}"
    );
    assert_eq!(
        bare.to_pretty("0.4.0").unwrap(),
        "{\n    \"cniVersion\": \"0.4.0\",\n    \"interfaces\": [\n        {\n            \"name\": \"a\\u003cb\\u003e\\u0026c\\u2028\"\n        }\n    ],\n    \"dns\": {}\n}"
    );
}

/// 1.1.0 down to every older version: the lossy rules in one place.
#[test]
fn full_110_to_every_version() {
    let input = full_110();
    let dns = input["dns"].clone();

    let mut v100 = input.clone();
    v100["cniVersion"] = json!("1.0.0");
    assert_eq!(convert(&input, "1.0.0").unwrap(), v100, "1.0.0 keeps the 1.1 fields");

    for v in ["0.3.0", "0.3.1", "0.4.0"] {
        let expected = json!({
            "cniVersion": v,
            "interfaces": [
                {"name": "br0", "mac": "0a:58:0a:f4:00:01"},
                {"name": "eth0", "mac": "0a:58:0a:f4:00:05", "sandbox": "/var/run/netns/pod9"}
            ],
            "ips": [
                {"version": "4", "interface": 1, "address": "10.244.0.5/24", "gateway": "10.244.0.1"},
                {"version": "6", "interface": 1, "address": "fd00:10:244::5/64",
                 "gateway": "fd00:10:244::1"},
                {"version": "4", "interface": 0, "address": "10.244.0.1/24"}
            ],
            "routes": input["routes"],
            "dns": dns,
        });
        assert_eq!(convert(&input, v).unwrap(), expected, "to {v}");
    }

    for v in ["0.1.0", "0.2.0"] {
        let expected = json!({
            "cniVersion": v,
            "ip4": {"ip": "10.244.0.5/24", "gateway": "10.244.0.1",
                    "routes": [input["routes"][0], input["routes"][1]]},
            "ip6": {"ip": "fd00:10:244::5/64", "gateway": "fd00:10:244::1",
                    "routes": [input["routes"][2]]},
            "dns": dns,
        });
        assert_eq!(convert(&input, v).unwrap(), expected, "to {v}");
    }
}

/// Older versions up to 1.1.0 (the vectors only reach 1.0.0).
#[test]
fn every_version_to_110() {
    let from_020 = json!({
        "cniVersion": "0.2.0",
        "ip4": {"ip": "10.1.2.3/24", "routes": [{"dst": "10.0.0.0/8", "gw": "10.1.2.1"}]},
        "ip6": {"ip": "fd00::3/64", "gateway": "fd00::1"},
    });
    assert_eq!(
        convert(&from_020, "1.1.0").unwrap(),
        json!({
            "cniVersion": "1.1.0",
            "ips": [{"address": "10.1.2.3/24"}, {"address": "fd00::3/64", "gateway": "fd00::1"}],
            "routes": [{"dst": "10.0.0.0/8", "gw": "10.1.2.1"}],
        })
    );
    let mut from_010 = from_020.clone();
    from_010.as_object_mut().unwrap().remove("cniVersion");
    assert_eq!(convert(&from_010, "1.1.0").unwrap(), convert(&from_020, "1.1.0").unwrap());

    // The 0.4 Go type has no interface mtu/socketPath/pciID: upstream never reads them.
    for v in ["0.3.0", "0.3.1", "0.4.0"] {
        let input = json!({
            "cniVersion": v,
            "interfaces": [{"name": "eth0", "mtu": 1500, "socketPath": "/x", "pciID": "y"}],
            "ips": [{"version": "4", "interface": 0, "address": "10.0.0.2/8"}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "table": 100}],
        });
        assert_eq!(
            convert(&input, "1.1.0").unwrap(),
            json!({
                "cniVersion": "1.1.0",
                "interfaces": [{"name": "eth0"}],
                "ips": [{"interface": 0, "address": "10.0.0.2/8"}],
                "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "table": 100}],
            }),
            "from {v}"
        );
    }

    let from_100 = json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": 1500}]});
    assert_eq!(
        convert(&from_100, "1.1.0").unwrap(),
        json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "mtu": 1500}]})
    );
}

#[test]
fn lossy_110_edges() {
    // No IPs: fine for 0.3+, an error below.
    let no_ips = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0", "pciID": "0000:01:00.0"}]});
    for v in ["0.1.0", "0.2.0"] {
        let err = convert(&no_ips, v).unwrap_err();
        assert_eq!(err.msg, "cannot convert: no valid IP addresses");
        assert_eq!(err.code, code::UNTYPED, "upstream's plain error, which its skel prints as 999");
    }
    assert_eq!(
        convert(&no_ips, "0.4.0").unwrap(),
        json!({"cniVersion": "0.4.0", "interfaces": [{"name": "eth0"}], "dns": {}})
    );

    // IPv4-mapped addresses count as IPv4 and Go prints them as IPv4.
    let mapped = json!({
        "cniVersion": "1.1.0",
        "ips": [{"address": "::ffff:10.1.2.3/120", "gateway": "::ffff:10.1.2.1"}],
        "routes": [{"dst": "::ffff:0.0.0.0/96"}],
    });
    assert_eq!(
        convert(&mapped, "0.4.0").unwrap(),
        json!({"cniVersion": "0.4.0",
               "ips": [{"version": "4", "address": "10.1.2.3/24", "gateway": "10.1.2.1"}],
               "routes": [{"dst": "0.0.0.0/0"}], "dns": {}})
    );
    assert_eq!(
        convert(&mapped, "0.2.0").unwrap(),
        json!({"cniVersion": "0.2.0",
               "ip4": {"ip": "10.1.2.3/24", "gateway": "10.1.2.1", "routes": [{"dst": "0.0.0.0/0"}]},
               "dns": {}})
    );

    // Routes of a family with no address are dropped going down to 0.2.
    let v6_route_only = json!({
        "cniVersion": "1.1.0",
        "ips": [{"address": "10.0.0.2/24"}],
        "routes": [{"dst": "::/0", "mtu": 1280}, {"dst": "10.9.0.0/16", "scope": 253}],
    });
    assert_eq!(
        convert(&v6_route_only, "0.1.0").unwrap(),
        json!({"cniVersion": "0.1.0",
               "ip4": {"ip": "10.0.0.2/24", "routes": [{"dst": "10.9.0.0/16", "scope": 253}]},
               "dns": {}})
    );
}

#[test]
fn legacy_without_ips_stays_legacy() {
    let empty = json!({"cniVersion": "0.2.0", "dns": {"nameservers": ["1.1.1.1"]}});
    assert_eq!(convert(&empty, "0.1.0").unwrap(), json!({"cniVersion": "0.1.0", "dns": {"nameservers": ["1.1.1.1"]}}));
    assert_eq!(convert(&empty, "1.1.0").unwrap(), json!({"cniVersion": "1.1.0", "dns": {"nameservers": ["1.1.1.1"]}}));
}

#[test]
fn errors() {
    let r = CniResult::parse(&full_110(), "").unwrap();
    for bad in ["1.0.1", "0.5.0", "2.0.0", "1.1", "x"] {
        let err = r.to_value(bad).unwrap_err();
        assert_eq!(err.code, code::INCOMPATIBLE_VERSION, "{bad}");
        assert_eq!(err.msg, format!("no converter for CNI result version 1.1.0 to {bad}"));
        assert_eq!(r.to_pretty(bad).unwrap_err().code, code::INCOMPATIBLE_VERSION);
        assert_eq!(convert(&full_110(), bad).unwrap_err().code, code::INCOMPATIBLE_VERSION);
    }
    let odd = CniResult { cni_version: "1.0.1".into(), ..CniResult::default() };
    assert_eq!(odd.to_value("1.0.0").unwrap_err().code, code::INCOMPATIBLE_VERSION);

    let err = CniResult::parse(&json!({"cniVersion": "1.0.1"}), "").unwrap_err();
    assert_eq!(err.code, code::INCOMPATIBLE_VERSION);
    assert_eq!(err.msg, r#"unsupported CNI result version "1.0.1""#);
    assert_eq!(CniResult::parse(&json!({}), "9.9.9").unwrap_err().code, code::INCOMPATIBLE_VERSION);

    let decode = |v: Value| {
        let err = CniResult::parse(&v, "").unwrap_err();
        assert_eq!(err.code, code::DECODE, "{v}: {err}");
        err.msg
    };
    assert_eq!(
        decode(json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.1/24"}, {"address": "10.0.0.1"}]})),
        r#"ips[1].address: invalid CIDR address "10.0.0.1""#
    );
    assert_eq!(
        decode(json!({"cniVersion": "1.1.0", "routes": [{"dst": "10.0.0.0/33"}]})),
        r#"routes[0].dst: invalid CIDR address "10.0.0.0/33""#
    );
    assert_eq!(decode(json!({"cniVersion": "1.1.0", "ips": [{"gateway": "10.0.0.1"}]})), "ips[0].address: missing");
    assert_eq!(
        decode(json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.0.0.2/24", "gateway": "10.0.0.300"}})),
        r#"ip4.gateway: invalid IP address "10.0.0.300""#
    );
    assert_eq!(
        decode(json!({"cniVersion": "0.1.0", "ip6": {"ip": "fd00::2/64", "routes": [{"dst": 5}]}})),
        "ip6.routes[0].dst: expected a CIDR string, got a number"
    );
    assert_eq!(
        decode(json!({"cniVersion": "1.1.0", "ips": [{"address": "10.0.0.2/24", "interface": -1}]})),
        "ips[0].interface: expected a non-negative integer, got a number"
    );
    assert_eq!(
        decode(json!({"cniVersion": "1.1.0", "routes": [{"dst": "::/0", "scope": 256}]})),
        "routes[0].scope: out of range"
    );
    assert_eq!(
        decode(json!({"cniVersion": "1.1.0", "interfaces": {"name": "eth0"}})),
        "interfaces: expected an array, got an object"
    );
    assert_eq!(
        decode(json!({"cniVersion": "1.1.0", "dns": {"search": ["a", 1]}})),
        "dns.search[1]: expected a string, got a number"
    );
    assert_eq!(
        decode(json!({"cniVersion": "0.4.0", "ips": [{"version": 4, "address": "10.0.0.2/24"}]})),
        "ips[0].version: expected a string, got a number"
    );
    assert_eq!(decode(json!({"cniVersion": 1})), "cniVersion: expected a string, got a number");
    assert_eq!(decode(json!([])), "result: expected an object, got an array");
    assert_eq!(CniResult::parse_bytes(b"{", "").unwrap_err().code, code::DECODE);
}

/// Upstream #895: a plugin result without cniVersion takes the config's.
#[test]
fn version_fallback() {
    let bare = json!({"ips": [{"address": "10.0.0.2/24", "interface": 0}], "interfaces": [{"name": "eth0"}]});
    let r = CniResult::parse(&bare, "1.1.0").unwrap();
    assert_eq!(r.cni_version, "1.1.0");
    assert_eq!(r.ips.len(), 1);
    let own_wins = CniResult::parse(&json!({"cniVersion": "0.4.0"}), "1.1.0").unwrap();
    assert_eq!(own_wins.cni_version, "0.4.0");
    let empty_is_absent = CniResult::parse(&json!({"cniVersion": ""}), "1.0.0").unwrap();
    assert_eq!(empty_is_absent.cni_version, "1.0.0");
    // Without either it is 0.1.0, whose shape has no `ips`.
    let legacy = CniResult::parse(&bare, "").unwrap();
    assert_eq!((legacy.cni_version.as_str(), legacy.ips.len()), ("0.1.0", 0));
}

#[test]
fn go_decoder_leniency() {
    let r = CniResult::parse(
        &json!({
            "CNIVersion": "1.1.0",
            "IPs": [{"Address": "10.0.0.2/24", "Gateway": "", "Interface": null}],
            "routes": null,
            "dns": {"nameservers": null, "domain": ""},
            "unknownKey": {"anything": true},
        }),
        "",
    )
    .unwrap();
    assert_eq!(r.cni_version, "1.1.0");
    assert_eq!(r.ips[0].gateway, None);
    assert_eq!(r.ips[0].interface, None);
    assert!(r.dns.is_empty());
    // Zero mtu/advmss/priority are absent in Go; zero table/scope are not.
    let zero = CniResult::parse(
        &json!({"cniVersion": "1.1.0", "interfaces": [{"name": "", "mtu": 0, "mac": ""}],
                "routes": [{"dst": "0.0.0.0/0", "mtu": 0, "advmss": 0, "priority": 0, "table": 0, "scope": 0}]}),
        "",
    )
    .unwrap();
    assert_eq!(
        zero.to_value("1.1.0").unwrap(),
        json!({"cniVersion": "1.1.0", "interfaces": [{"name": ""}],
               "routes": [{"dst": "0.0.0.0/0", "table": 0, "scope": 0}]})
    );
}

#[test]
fn empty_target_is_unversioned_010() {
    let r = CniResult::parse(&full_110(), "").unwrap();
    let mut expected = convert(&full_110(), "0.1.0").unwrap();
    expected.as_object_mut().unwrap().remove("cniVersion");
    assert_eq!(r.to_value("").unwrap(), expected);
}

/// What a plugin builds by hand: an unset cniVersion means the 1.x shape.
#[test]
fn hand_built_result() {
    let r = CniResult {
        ips: vec![IpConfig {
            address: "192.168.1.10/24".parse().unwrap(),
            gateway: Some("192.168.1.1".parse().unwrap()),
            interface: Some(0),
        }],
        interfaces: vec![Interface { name: "eth0".into(), mtu: Some(1500), ..Interface::default() }],
        ..CniResult::default()
    };
    assert_eq!(
        r.to_value("1.0.0").unwrap(),
        json!({"cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mtu": 1500}],
               "ips": [{"interface": 0, "address": "192.168.1.10/24", "gateway": "192.168.1.1"}]})
    );
    assert_eq!(
        r.to_value("0.2.0").unwrap(),
        json!({"cniVersion": "0.2.0", "ip4": {"ip": "192.168.1.10/24", "gateway": "192.168.1.1"},
               "dns": {}})
    );
    let serialized = serde_json::to_value(&r).unwrap();
    assert_eq!(serialized["cniVersion"], "1.1.0");
}

/// Versions between which nothing is lost, in both directions.
fn lossless(a: &str, b: &str) -> bool {
    let family = |v: &str| match v {
        "0.1.0" | "0.2.0" => 0,
        "0.3.0" | "0.3.1" | "0.4.0" => 1,
        _ => 2,
    };
    let (fa, fb) = (family(a), family(b));
    // 0.3/0.4 results carry nothing that 1.x cannot hold (ips[].version follows the address).
    fa == fb || (fa == 1 && fb == 2)
}

#[test]
fn round_trips() {
    let mut inputs: Vec<Value> = Vec::new();
    for vector in vectors() {
        if !inputs.contains(&vector["input"]) {
            inputs.push(vector["input"].clone());
        }
    }
    assert_eq!(inputs.len(), 9);
    inputs.push(full_110());
    let mut checked = 0;
    for input in &inputs {
        let r = CniResult::parse(input, "").unwrap();
        let own = r.cni_version.clone();
        assert_eq!(CniResult::parse(&r.to_value(&own).unwrap(), "").unwrap(), r, "{own} itself");
        for &v in SUPPORTED.iter() {
            if !lossless(&own, v) {
                continue;
            }
            let there = CniResult::parse(&r.to_value(v).unwrap(), "").unwrap();
            assert_eq!(there.cni_version, v);
            assert_eq!(there.as_version(&own).unwrap(), r, "{own} -> {v} -> {own}");
            assert_eq!(r.as_version(v).unwrap(), there);
            checked += 1;
        }
    }
    // 2 for each 0.1/0.2/1.x input, 5 for each 0.3/0.4 one.
    assert_eq!(checked, 26);
}

#[test]
fn serde_in_1x_shape() {
    let r = CniResult::parse(&full_110(), "").unwrap();
    for route in &r.routes {
        let v = serde_json::to_value(route).unwrap();
        assert_eq!(&serde_json::from_value::<Route>(v).unwrap(), route);
    }
    for ip in &r.ips {
        let v = serde_json::to_value(ip).unwrap();
        assert!(v.get("version").is_none());
        assert_eq!(&serde_json::from_value::<IpConfig>(v).unwrap(), ip);
    }
    for iface in &r.interfaces {
        let v = serde_json::to_value(iface).unwrap();
        assert_eq!(&serde_json::from_value::<Interface>(v).unwrap(), iface);
    }
    let dns: Dns = serde_json::from_value(full_110()["dns"].clone()).unwrap();
    assert_eq!(dns, r.dns);
    assert_eq!(serde_json::to_value(Dns::default()).unwrap(), json!({}));
    let dns: Dns = serde_json::from_value(json!({"nameservers": null})).unwrap();
    assert!(dns.is_empty());

    assert_eq!(serde_json::to_value(&r).unwrap(), full_110());
    let back: CniResult = serde_json::from_value(full_110()).unwrap();
    assert_eq!(back, r);
    let err = serde_json::from_value::<Route>(json!({"dst": "nope"})).unwrap_err();
    assert!(err.to_string().contains("route.dst"), "{err}");
}
