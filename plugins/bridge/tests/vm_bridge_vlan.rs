#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! bridge's `vlan`, `vlanTrunk` and `preserveDefaultVlan` with real VLAN filtering, inside a VM that
//! boots Debian's kernel (the host kernel has no CONFIG_BRIDGE_VLAN_FILTERING): pods on one VLAN
//! reach each other and their gateway, pods on another VLAN of the same bridge and subnet do not,
//! a trunk port carries tagged frames to a VLAN sub-interface in the pod, the port VLAN layout is
//! the reference's, CHECK sees a VLAN removed behind its back, DEL leaves nothing of the pod, and
//! ADD/CHECK/DEL work at every spec version. One boot runs every case.

use cni_tests::exec::VERSIONS;
use cni_tests::vm::{version_round_cases, Vm};

const SCRIPT: &str = r#"
mkdir -p /tmp/ipam
ipam() { # subnet [rangeStart]
    printf '"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":[[{"subnet":"%s"%s}]]}' \
        "$1" "${2:+,\"rangeStart\":\"$2\"}"
}
net() { # name version keys...
    local name=$1 version=$2
    shift 2
    local IFS=,
    printf '{"cniVersion":"%s","name":"%s","type":"bridge","bridge":"br0",%s}' "$version" "$name" "$*" \
        > "/tmp/$name.json"
}
add() { # network id -> the pod's netns is the id
    ip netns add "$2"
    cni ADD bridge "/tmp/$1.json" "$2" "$2" eth0 > /dev/null
}
# The host end's name is derived from the attachment (results before 0.3.0 list no interfaces).
port_of() { echo "veth$(printf '%s' "$1:eth0" | sha256sum | cut -c1-8)"; }
ip_of() { pod "$1" ip -4 -o addr show dev "${2:-eth0}" | awk '{print $4}' | cut -d/ -f1; }
# A port's VLANs as one line: "1 Egress Untagged;10 PVID Egress Untagged;20".
vids() {
    bridge vlan show dev "$1" | awk 'NR > 1 { if ($1 !~ /^[0-9]+$/) $1 = ""; sub(/^ +/, ""); if ($0 != "") print }' |
        paste -sd ';'
}
# One echo; a reply comes within milliseconds when the path exists, so a miss is called after 1 s.
pings() { pod "$1" ping -c 1 -W 1 "$2" > /dev/null 2>&1; }
# An interface's IPv6 link-local address exists and is past DAD (the kernel solicits from it for
# forwarded packets, and not while it is tentative).
usable_link_local() {
    a=$(ip -6 -o addr show dev "$1" scope link)
    case "$a" in *fe80::*) case "$a" in *tentative*) ;; *) return 0 ;; esac ;; esac
    echo "$a"; return 1
}
is() { # actual expected
    [ "$1" = "$2" ] || { echo "got '$1', want '$2'"; return 1; }
}

# Access ports on VLAN 10 with their gateway; VLAN 20 in the same IP subnet, so only the VLANs
# keep the two apart.
net v10 1.1.0 '"vlan":10' '"isGateway":true' "$(ipam 10.10.0.0/24)"
net v20 1.1.0 '"vlan":20' "$(ipam 10.10.0.0/24 10.10.0.200)"
add v10 a
check "the new bridge's link-local is usable at once" usable_link_local br0
check "the new vlan gateway's link-local is usable at once" usable_link_local br0.10
add v10 b
add v20 c
A=$(ip_of a) B=$(ip_of b) C=$(ip_of c)
echo "a=$A b=$B c=$C"
check "bridge has vlan filtering" has <(ip -d link show br0) 'vlan_filtering 1'
check "vlan 10 pods reach each other" pings a "$B"
check "vlan 10 pods reach each other back" pings b "$A"
check "vlan 10 pod reaches its gateway on br0.10" pings a 10.10.0.1
check "host reaches a vlan 10 pod" ping -c 1 -W 1 "$A"
refuse "vlan 20 pod cannot reach vlan 10 pod" pings c "$A"
refuse "vlan 10 pod cannot reach vlan 20 pod" pings a "$C"
check "access port layout" is "$(vids "$(port_of a)")" "10 PVID Egress Untagged"
check "vlan 20 port layout" is "$(vids "$(port_of c)")" "20 PVID Egress Untagged"
check "gateway interface holds the gateway" has <(ip -4 -o addr show dev br0.10) ' 10\.10\.0\.1/24 '
GWPORT=$(ip -o link show master br0 | grep -o 'vgw[0-9a-f]*' | head -n1)
check "gateway port layout" is "$(vids "$GWPORT")" "10 PVID Egress Untagged"
check "bridge itself keeps vlan 1" is "$(vids br0)" "1 PVID Egress Untagged"
check "result lists the vlan gateway" has "/tmp/cni-results/a-eth0.json" '"name": *"br0\.10"'

# A trunk port: VLAN 10 and 20-22 tagged, no VLAN 1; a VLAN sub-interface in the pod talks to
# the access ports of its VLAN only.
net trunk 1.1.0 '"vlanTrunk":[{"id":10},{"minID":20,"maxID":22}]'
add trunk t
check "trunk port layout" is "$(vids "$(port_of t)")" "10;20;21;22"
pod t ip link add link eth0 name eth0.10 type vlan id 10
pod t ip addr add 10.10.0.250/24 dev eth0.10
pod t ip link set eth0.10 up
check "trunk pod reaches a vlan 10 pod through eth0.10" pings t "$A"
check "trunk pod reaches the vlan 10 gateway" pings t 10.10.0.1
refuse "trunk pod's vlan 10 does not reach vlan 20" pings t "$C"
pod t ip link del eth0.10
pod t ip link add link eth0 name eth0.20 type vlan id 20
pod t ip addr add 10.10.0.251/24 dev eth0.20
pod t ip link set eth0.20 up
check "trunk pod reaches a vlan 20 pod through eth0.20" pings t "$C"
refuse "trunk pod's vlan 20 does not reach vlan 10" pings t "$A"

# preserveDefaultVlan: true keeps VLAN 1 on the port (no longer its PVID), on an access and a
# trunk port; false (the default, above) removes it.
net keep 1.1.0 '"vlan":30' '"preserveDefaultVlan":true'
net keeptrunk 1.1.0 '"vlanTrunk":[{"id":40}]' '"preserveDefaultVlan":true'
add keep k
add keeptrunk kt
check "preserveDefaultVlan keeps vlan 1 on an access port" \
    is "$(vids "$(port_of k)")" "1 Egress Untagged;30 PVID Egress Untagged"
check "preserveDefaultVlan keeps vlan 1 on a trunk port" is "$(vids "$(port_of kt)")" "1 PVID Egress Untagged;40"

# Dual stack on a VLAN: both gateways on br0.70, IPv6 between pods and to the gateway.
net ds 1.1.0 '"vlan":70' '"isGateway":true' \
    '"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":[[{"subnet":"10.70.0.0/24"}],[{"subnet":"fd00:70::/64"}]]}'
add ds d1
add ds d2
check "dual stack: both gateways on br0.70" has <(ip -o addr show dev br0.70) ' 10\.70\.0\.1/24 ' ' fd00:70::1/64 '
check "dual stack: v4 pod to pod" pings d1 10.70.0.3
check "dual stack: v4 pod to gateway" pings d1 10.70.0.1
check "dual stack: v6 pod to pod" pod d1 ping -6 -c 1 -W 1 fd00:70::3
check "dual stack: v6 pod to gateway" pod d1 ping -6 -c 1 -W 1 fd00:70::1
check "dual stack: host to v6 pod" ping -6 -c 1 -W 1 fd00:70::2

# CHECK sees the port's VLANs drift from the configuration.
check "check passes" cni CHECK bridge /tmp/v10.json a a eth0
PA=$(port_of a)
bridge vlan del dev "$PA" vid 10
refuse "check fails without the port's vlan" cni CHECK bridge /tmp/v10.json a a eth0
bridge vlan add dev "$PA" vid 10 pvid untagged
check "check passes again" cni CHECK bridge /tmp/v10.json a a eth0
bridge vlan add dev "$PA" vid 1
refuse "check fails with vlan 1 back" cni CHECK bridge /tmp/v10.json a a eth0
bridge vlan del dev "$PA" vid 1
check "check passes on the trunk" cni CHECK bridge /tmp/trunk.json t t eth0
bridge vlan del dev "$(port_of t)" vid 21
refuse "check fails without a trunk vlan" cni CHECK bridge /tmp/trunk.json t t eth0

# DEL leaves nothing of the pods: ports, their VLANs, addresses; a second DEL succeeds.
for p in a:v10 b:v10 c:v20 t:trunk k:keep kt:keeptrunk d1:ds d2:ds; do
    id=${p%%:*} n=${p#*:}
    port=$(port_of "$id")
    check "del $id" cni DEL bridge "/tmp/$n.json" "$id" "$id" eth0
    refuse "del $id removes its port" ip link show "$port"
    check "del $id again" cni DEL bridge "/tmp/$n.json" "$id" "$id" eth0
done
check "no pod port is left on br0" is "$(ip -o link show master br0 | grep -c ' veth')" 0
check "no vlan of a pod is left" is "$(bridge vlan show | grep -c veth)" 0
check "no address is left allocated" is "$(ls /tmp/ipam/v10 /tmp/ipam/v20 /tmp/ipam/ds | grep -c '^[1f][0d]')" 0

# DEL once the pod's namespace is gone: the kernel took the port with it; DEL releases the address.
add v10 gone
GONE_PORT=$(port_of gone)
ip netns del gone
# The kernel dismantles a namespace in the background: give it up to 10 s under emulation.
gone() { for _ in $(seq 100); do ip link show "$1" > /dev/null 2>&1 || return 0; sleep 0.1; done; return 1; }
check "netns gone: its port went with it" gone "$GONE_PORT"
check "netns gone: del succeeds" cni DEL bridge /tmp/v10.json gone gone eth0
check "netns gone: address released" is "$(ls /tmp/ipam/v10 | grep -c '^10\.')" 0

# A failed ADD undoes its work: VLAN 60's gateway name is taken by a dummy, so ADD fails naming it
# and leaves no port and no address behind.
ip link add br0.60 type dummy
net v60 1.1.0 '"vlan":60' '"isGateway":true' "$(ipam 10.60.0.0/24)"
ip netns add fail
refuse "add fails when the vlan gateway name is taken" cni ADD bridge /tmp/v60.json fail fail eth0
check "failed add names the taken interface" has <(cni ADD bridge /tmp/v60.json fail fail eth0 2>&1) \
    'br0\.60 exists and is not a veth'
refuse "failed add leaves no port" ip link show "$(port_of fail)"
refuse "failed add leaves no pod interface" pod fail ip link show eth0
check "failed add leaves no address" is "$(ls /tmp/ipam/v60 2>/dev/null | grep -c '^10\.')" 0
ip link del br0.60

# Every spec version: ADD (the pod holds its address and reaches its VLAN's gateway), CHECK from
# 0.4.0 on (refused before, as the spec says), DEL twice.
after_add() {
    check "add $1: pod address" is "$(ip_of "$2")" 10.50.0.2
    check "add $1: port layout" is "$(vids "$(port_of "$2")")" "50 PVID Egress Untagged"
    check "add $1: gateway reachable" pings "$2" 10.50.0.1
    port=$(port_of "$2")
}
after_del() { refuse "del $1 removes the port" ip link show "$port"; }
for v in VERSIONS; do
    n=ver${v//./}
    net "$n" "$v" '"vlan":50' '"isGateway":true' "$(ipam 10.50.0.0/24)"
    version_round "$v" bridge "$n"
done
"#;

#[test]
fn bridge_vlans_in_a_vm() {
    let run = Vm::new().plugins(&["bridge", "host-local"]).run_versions(SCRIPT, &VERSIONS);
    let mut cases: Vec<String> = [
        "bridge has vlan filtering",
        "the new bridge's link-local is usable at once",
        "the new vlan gateway's link-local is usable at once",
        "vlan 10 pods reach each other",
        "vlan 10 pods reach each other back",
        "vlan 10 pod reaches its gateway on br0.10",
        "host reaches a vlan 10 pod",
        "vlan 20 pod cannot reach vlan 10 pod",
        "vlan 10 pod cannot reach vlan 20 pod",
        "access port layout",
        "vlan 20 port layout",
        "gateway interface holds the gateway",
        "gateway port layout",
        "bridge itself keeps vlan 1",
        "result lists the vlan gateway",
        "trunk port layout",
        "trunk pod reaches a vlan 10 pod through eth0.10",
        "trunk pod reaches the vlan 10 gateway",
        "trunk pod's vlan 10 does not reach vlan 20",
        "trunk pod reaches a vlan 20 pod through eth0.20",
        "trunk pod's vlan 20 does not reach vlan 10",
        "preserveDefaultVlan keeps vlan 1 on an access port",
        "preserveDefaultVlan keeps vlan 1 on a trunk port",
        "dual stack: both gateways on br0.70",
        "dual stack: v4 pod to pod",
        "dual stack: v4 pod to gateway",
        "dual stack: v6 pod to pod",
        "dual stack: v6 pod to gateway",
        "dual stack: host to v6 pod",
        "check passes",
        "check fails without the port's vlan",
        "check passes again",
        "check fails with vlan 1 back",
        "check passes on the trunk",
        "check fails without a trunk vlan",
        "no pod port is left on br0",
        "no vlan of a pod is left",
        "no address is left allocated",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    cases.extend(
        [
            "netns gone: its port went with it",
            "netns gone: del succeeds",
            "netns gone: address released",
            "add fails when the vlan gateway name is taken",
            "failed add names the taken interface",
            "failed add leaves no port",
            "failed add leaves no pod interface",
            "failed add leaves no address",
        ]
        .map(String::from),
    );
    for id in ["a", "b", "c", "t", "k", "kt", "d1", "d2"] {
        cases.push(format!("del {id}"));
        cases.push(format!("del {id} removes its port"));
        cases.push(format!("del {id} again"));
    }
    cases.extend(version_round_cases(
        &VERSIONS,
        &["add {v}: pod address", "add {v}: port layout", "add {v}: gateway reachable", "del {v} removes the port"],
    ));
    run.assert_passed(&cases);
}
