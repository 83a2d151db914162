#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! dummy inside a VM that boots Debian's kernel (the host kernel has no dummy links): the pod gets a
//! dummy `eth0` holding IPAM's addresses (dual stack) and routes, up; the result lists it with its
//! MAC and sandbox; CHECK sees an address or the link state drift; a second ADD, an IPAM failure
//! and a failure after IPAM leave nothing behind; DEL removes the link and releases the addresses,
//! twice, and with the namespace gone; STATUS and GC reach IPAM; every verb at every spec version.
//! One boot runs every case.

use cni_tests::exec::VERSIONS;
use cni_tests::vm::{version_round_cases, Vm};

const SCRIPT: &str = r#"
mkdir -p /tmp/ipam
net() { # name version extra-keys...
    local name=$1 version=$2
    shift 2
    local IFS=,
    printf '{"cniVersion":"%s","name":"%s","type":"dummy"%s}' "$version" "$name" "${*:+,$*}" > "/tmp/$name.json"
}
ipam() { # ranges [routes]
    printf '"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":[%s]%s}' "$1" "${2:+,\"routes\":$2}"
}
reservations() { ls "/tmp/ipam/$1" 2>/dev/null | grep -c '^[0-9a-f]*[.:]' || true; }

net ds 1.1.0 "$(ipam '[{"subnet":"10.20.0.0/24"}],[{"subnet":"fd00:20::/64"}]' '[{"dst":"192.168.7.0/24"},{"dst":"fd00:77::/64"}]')"
ip netns add a
check "add" cni ADD dummy /tmp/ds.json a a eth0
check "eth0 is a dummy" has <(pod a ip -d -o link show eth0) ' dummy '
check "eth0 is up" has <(pod a ip -o link show eth0) '<[^>]*,UP[,>]'
check "v4 address" has <(pod a ip -4 -o addr show dev eth0) ' 10\.20\.0\.2/24 '
check "v6 address" has <(pod a ip -6 -o addr show dev eth0) ' fd00:20::2/64 '
check "v4 route through the gateway" has <(pod a ip -4 route) '^192\.168\.7\.0/24 via 10\.20\.0\.1 dev eth0'
check "v6 route through the gateway" has <(pod a ip -6 route) '^fd00:77::/64 via fd00:20::1 dev eth0'
# Local delivery goes through lo (the loopback plugin brings it up in a real chain).
pod a ip link set lo up
check "the pod reaches its v4 address" pod a ping -c 1 -W 1 10.20.0.2
check "the pod reaches its v6 address" pod a ping -6 -c 1 -W 1 fd00:20::2
MAC=$(pod a cat /sys/class/net/eth0/address)
R=/tmp/cni-results/a-eth0.json
check "result lists eth0 with its MAC and sandbox" has "$R" '"name": *"eth0"' "\"mac\": *\"$MAC\"" '"sandbox": *"/run/netns/a"'
check "result addresses are on interface 0" is "$(grep -c '"interface": *0' "$R")" 2
check "result keeps IPAM's routes" has "$R" '"dst": *"192\.168\.7\.0/24"'
check "only eth0 in the pod" is "$(links_of a)" 1

check "check passes" cni CHECK dummy /tmp/ds.json a a eth0
pod a ip addr del 10.20.0.2/24 dev eth0
refuse "check fails without the v4 address" cni CHECK dummy /tmp/ds.json a a eth0
pod a ip addr add 10.20.0.2/24 dev eth0
pod a ip route add 192.168.7.0/24 via 10.20.0.1 dev eth0
check "check passes again" cni CHECK dummy /tmp/ds.json a a eth0
pod a ip link set eth0 down
refuse "check fails with eth0 down" cni CHECK dummy /tmp/ds.json a a eth0
pod a ip link set eth0 up

# A second ADD of the same attachment fails and changes nothing.
cp "$R" /tmp/a-saved.json
refuse "second add fails" cni ADD dummy /tmp/ds.json a a eth0
cp /tmp/a-saved.json "$R"
check "second add: still one link" is "$(links_of a)" 1
check "second add: still two reservations" is "$(reservations ds)" 2
check "second add: address kept" has <(pod a ip -4 -o addr show dev eth0) ' 10\.20\.0\.2/24 '

# STATUS and GC go to IPAM: GC with no valid attachment releases a reservation of this network.
check "status" cni STATUS dummy /tmp/ds.json a a eth0
net gcnet 1.1.0 "$(ipam '[{"subnet":"10.21.0.0/24"}]')"
ip netns add g1
cni ADD dummy /tmp/gcnet.json g1 g1 eth0 > /dev/null
check "gc: one reservation before" is "$(reservations gcnet)" 1
sed 's/}$/,"cni.dev\/valid-attachments":[]}/' /tmp/gcnet.json > /tmp/gc.json
check "gc" cni GC dummy /tmp/gc.json none none eth0
check "gc released it" is "$(reservations gcnet)" 0

# Failures leave nothing: no IPAM (code 7), an exhausted range (after the link was made), and a
# route IPAM gives that the kernel refuses (after the addresses were reserved).
net noipam 1.1.0
ip netns add f1
check "no ipam: code 7" is "$(cni ADD dummy /tmp/noipam.json f1 f1 eth0 | code_of)" 7
check "no ipam: no link" is "$(links_of f1)" 0
net tiny 1.1.0 "$(ipam '[{"subnet":"10.22.0.0/30"}]')"
ip netns add f2
ip netns add f3
cni ADD dummy /tmp/tiny.json f2 f2 eth0 > /dev/null
check "exhausted range: code 101" is "$(cni ADD dummy /tmp/tiny.json f3 f3 eth0 | code_of)" 101
check "exhausted range: no link" is "$(links_of f3)" 0
net badroute 1.1.0 "$(ipam '[{"subnet":"10.23.0.0/24"}]' '[{"dst":"192.168.9.0/24","gw":"10.99.0.1"}]')"
ip netns add f4
refuse "unreachable route: add fails" cni ADD dummy /tmp/badroute.json f4 f4 eth0
check "unreachable route: no link" is "$(links_of f4)" 0
check "unreachable route: address released" is "$(reservations badroute)" 0

# DEL removes the link and releases the addresses; again; and with the namespace gone.
check "del" cni DEL dummy /tmp/ds.json a a eth0
check "del removes eth0" is "$(links_of a)" 0
check "del releases the addresses" is "$(reservations ds)" 0
check "del again" cni DEL dummy /tmp/ds.json a a eth0
net gone 1.1.0 "$(ipam '[{"subnet":"10.24.0.0/24"}]')"
ip netns add gone
cni ADD dummy /tmp/gone.json gone gone eth0 > /dev/null
ip netns del gone
check "netns gone: del succeeds" cni DEL dummy /tmp/gone.json gone gone eth0
check "netns gone: address released" is "$(reservations gone)" 0
check "del without ipam still succeeds" cni DEL dummy /tmp/noipam.json f1 f1 eth0

after_add() { check "add $1: address" has <(pod "$2" ip -4 -o addr show dev eth0) ' 10\.50\.0\.2/24 '; }
after_del() { check "del $1: no link" is "$(links_of "$2")" 0; }
for v in VERSIONS; do
    n=ver${v//./}
    net "$n" "$v" "$(ipam '[{"subnet":"10.50.0.0/24"}]')"
    version_round "$v" dummy "$n"
done
"#;

#[test]
fn dummy_in_a_vm() {
    let run = Vm::new().plugins(&["dummy", "host-local"]).run_versions(SCRIPT, &VERSIONS);
    let mut cases: Vec<String> = [
        "add",
        "eth0 is a dummy",
        "eth0 is up",
        "v4 address",
        "v6 address",
        "v4 route through the gateway",
        "v6 route through the gateway",
        "the pod reaches its v4 address",
        "the pod reaches its v6 address",
        "result lists eth0 with its MAC and sandbox",
        "result addresses are on interface 0",
        "result keeps IPAM's routes",
        "only eth0 in the pod",
        "check passes",
        "check fails without the v4 address",
        "check passes again",
        "check fails with eth0 down",
        "second add fails",
        "second add: still one link",
        "second add: still two reservations",
        "second add: address kept",
        "status",
        "gc: one reservation before",
        "gc",
        "gc released it",
        "no ipam: code 7",
        "no ipam: no link",
        "exhausted range: code 101",
        "exhausted range: no link",
        "unreachable route: add fails",
        "unreachable route: no link",
        "unreachable route: address released",
        "del",
        "del removes eth0",
        "del releases the addresses",
        "del again",
        "netns gone: del succeeds",
        "netns gone: address released",
        "del without ipam still succeeds",
    ]
    .map(String::from)
    .to_vec();
    cases.extend(version_round_cases(&VERSIONS, &["add {v}: address", "del {v}: no link"]));
    run.assert_passed(&cases);
}
