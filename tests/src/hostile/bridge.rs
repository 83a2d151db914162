//! bridge's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/bridge/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{
    case, common_cases, env_case, netns_cases, run_table, with, with_value, without, Case, Fixture, CONFIG, ENV,
};
use serde_json::json;
use std::path::Path;

/// The rows of bridge's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("bridge");
    let mut cases = Vec::new();
    for key in [
        "isGateway",
        "isDefaultGateway",
        "forceAddress",
        "ipMasq",
        "hairpinMode",
        "promiscMode",
        "preserveDefaultVlan",
        "macspoofchk",
        "enabledad",
        "disableContainerInterface",
        "portIsolation",
    ] {
        cases.push(case(format!("{key} a number"), with(&b, key, json!(1)), CONFIG));
        cases.push(case(format!("{key} \"yes\""), with(&b, key, json!("yes")), CONFIG));
        cases.push(case(format!("{key} an object"), with(&b, key, json!({})), CONFIG));
    }
    for (key, bad) in [
        ("bridge", json!(5)),
        ("bridge", json!(["cni0"])),
        ("ipMasqBackend", json!(5)),
        ("mtu", json!("1500")),
        ("mtu", json!(1500.5)),
        ("mtu", json!(true)),
        ("vlan", json!("10")),
        ("vlanTrunk", json!(5)),
        ("vlanTrunk", json!([5])),
        ("vlanTrunk", json!([{ "id": "5" }])),
        ("vlanTrunk", json!([[10, 20, null]])),
    ] {
        cases.push(case(format!("{key} = {bad}"), with(&b, key, bad), CONFIG));
    }
    cases.extend([
        case("bridge name 16 bytes", with(&b, "bridge", json!("br0123456789abcd")), CONFIG),
        case("bridge name with /", with(&b, "bridge", json!("br/0")), CONFIG),
        case("bridge name ..", with(&b, "bridge", json!("..")), CONFIG),
        case("bridge name with a space", with(&b, "bridge", json!("br 0")), CONFIG),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 67", with(&b, "mtu", json!(67)), CONFIG),
        case("mtu 65536", with(&b, "mtu", json!(65536)), CONFIG),
        case("mtu huge", with(&b, "mtu", json!(9_007_199_254_740_993_i64)), CONFIG),
        case("mtu beyond i64", with(&b, "mtu", json!(1e30)), CONFIG),
        case("vlan -1", with(&b, "vlan", json!(-1)), CONFIG),
        case("vlan 4095", with(&b, "vlan", json!(4095)), CONFIG),
        case("vlanTrunk min > max", with(&b, "vlanTrunk", json!([{ "minID": 20, "maxID": 10 }])), CONFIG),
        case("vlanTrunk half a range", with(&b, "vlanTrunk", json!([{ "minID": 20 }])), CONFIG),
        case("ipMasqBackend unknown", with(&b, "ipMasqBackend", json!("pf")), CONFIG),
        case("macspoofchk a number", with(&b, "macspoofchk", json!(1)), CONFIG),
        case("hairpin with promisc", [with(&b, "hairpinMode", json!(true))].concat(), 0),
        case("runtimeConfig.mac not a MAC", with(&b, "runtimeConfig", json!({ "mac": "zz:zz" })), CONFIG),
        case("runtimeConfig.mac multicast", with(&b, "runtimeConfig", json!({ "mac": "01:00:5e:00:00:01" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        case("args.cni.mac a number", with(&b, "args", json!({ "cni": { "mac": 5 } })), CONFIG),
        case("ipam.type with /", with(&b, "ipam", json!({ "type": "../../bin/sh" })), CONFIG),
        case("ipam.type ..", with(&b, "ipam", json!({ "type": ".." })), CONFIG),
        case(
            "isDefaultGateway without ipam",
            without(&with_value(&b, "isDefaultGateway", json!(true)), "ipam"),
            CONFIG,
        ),
        case("disableContainerInterface with ipam", with(&b, "disableContainerInterface", json!(true)), CONFIG),
        case(
            "ipam subnet not a CIDR (delegated)",
            with(&b, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
            CONFIG,
        ),
        case("ipam plugin missing", with(&b, "ipam", json!({ "type": "no-such-ipam" })), CONFIG),
        case("ipam.type bridge (itself: a cycle)", with(&b, "ipam", json!({ "type": "bridge" })), CONFIG),
        case("ipam.type portmap (not IPAM)", with(&b, "ipam", json!({ "type": "portmap" })), CONFIG),
        case("ipam.type loopback (not IPAM)", with(&b, "ipam", json!({ "type": "loopback" })), CONFIG),
        env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=nope".into()))], CONFIG),
        env_case("CNI_ARGS IP not an IP (delegated)", &b, vec![("CNI_ARGS", Some("IP=10.210.1.300".into()))], ENV),
        case(
            "isGateway vlan: bridge name too long for <bridge>.<vlan>",
            with(
                &with_value(&with_value(&b, "bridge", json!("br0123456789a")), "isGateway", json!(true)),
                "vlan",
                json!(100),
            ),
            CONFIG,
        ),
    ]);
    // The hairpin-with-promisc row is built here, since both keys must be set.
    let last = cases.iter_mut().find(|c| c.label == "hairpin with promisc").expect("row");
    last.stdin = with(&with_value(&b, "hairpinMode", json!(true)), "promiscMode", json!(true));
    last.want = CONFIG;
    cases
}

/// Every row of bridge's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "bridge");
    cases.extend(netns_cases(&f, "bridge"));
    cases.extend(rows(&f));
    run_table(&f, "bridge", &cases);
}
