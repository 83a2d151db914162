#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! ipvlan inside a VM that boots Debian's kernel (the host kernel has no ipvlan): pods on an ipvlan
//! master reach each other in l2 and l3 mode over IPv4 and IPv6, `mtu` and `linkInContainer` work,
//! a chained ipvlan with no `master` hangs from prevResult's interface and takes its addresses,
//! bad input gets its code with nothing left behind, DEL is idempotent and succeeds with the
//! netns gone, and ADD/CHECK/DEL work at every spec version. One boot runs every case.

use cni_tests::exec::VERSIONS;
use cni_tests::vm::{version_round_cases, Vm};

const SCRIPT: &str = r#"
mkdir -p /tmp/ipam
ipam() { # subnet...
    local sets="" s
    for s in "$@"; do sets="$sets${sets:+,}[{\"subnet\":\"$s\"}]"; done
    printf '"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":[%s]}' "$sets"
}
net() { # name version keys...
    local name=$1 version=$2
    shift 2
    local IFS=,
    printf '{"cniVersion":"%s","name":"%s","type":"ipvlan"%s}' "$version" "$name" "${*:+,$*}" > "/tmp/$name.json"
}
add() { # network id -> the pod's netns is the id
    ip netns add "$2"
    cni ADD ipvlan "/tmp/$1.json" "$2" "$2" eth0 > /dev/null
}
pings() { pod "$1" ping -c 1 -W 1 "$2" > /dev/null 2>&1; }
pings6() { pod "$1" ping -6 -c 1 -W 1 "$2" > /dev/null 2>&1; }
is() { # actual expected
    [ "$1" = "$2" ] || { echo "got '$1', want '$2'"; return 1; }
}
code() { # expected-code verb conf id: the plugin fails with that code
    local out
    if out=$(cni "$2" ipvlan "$3" "$4" "$4" eth0 2>&1); then echo "succeeded: $out"; return 1; fi
    printf '%s\n' "$out" | grep -Eq "\"code\": *$1[,}]" || { echo "want code $1: $out"; return 1; }
}
only_lo() { is "$(links_of "$1")" 0; }

# The masters: dummies, which always have a carrier. The kernel keeps one ipvlan mode per master
# (a new ipvlan in another mode switches the master's existing ones), so each mode gets its own.
for m in mst0 mst1 mst2 mst3; do ip link add "$m" type dummy; ip link set "$m" up; done
MST1_INDEX=$(cat /sys/class/net/mst1/ifindex)

# l2 and l3, dual stack: pods on one master reach each other over both families.
for mode in l2 l3; do
    master=mst0
    [ "$mode" = l2 ] || master=mst3
    net "$mode" 1.1.0 "\"master\":\"$master\"" "\"mode\":\"$mode\"" "$(ipam "10.6${mode#l}.0.0/24" "fd00:6${mode#l}::/64")"
    add "$mode" "${mode}a"
    add "$mode" "${mode}b"
    check "$mode: pod's eth0 is an ipvlan in $mode mode" has <(pod "${mode}a" ip -d link show eth0) "ipvlan  *mode $mode "
    check "$mode: pod holds its addresses" has <(pod "${mode}a" ip -o addr show dev eth0) \
        " 10\.6${mode#l}\.0\.2/24 " " fd00:6${mode#l}::2/64 "
    check "$mode: eth0 shares the master's MAC" is "$(pod "${mode}a" cat /sys/class/net/eth0/address)" \
        "$(cat /sys/class/net/$master/address)"
    check "$mode: v4 pod to pod" pings "${mode}a" "10.6${mode#l}.0.3"
    check "$mode: v4 pod to pod back" pings "${mode}b" "10.6${mode#l}.0.2"
    check "$mode: v6 pod to pod" pings6 "${mode}a" "fd00:6${mode#l}::3"
    check "$mode: v6 pod to pod back" pings6 "${mode}b" "fd00:6${mode#l}::2"
    check "$mode: check" cni CHECK ipvlan "/tmp/$mode.json" "${mode}a" "${mode}a" eth0
    check "$mode: result lists eth0 in the pod" has "/tmp/cni-results/${mode}a-eth0.json" \
        '"name": *"eth0"' "\"sandbox\": *\"/run/netns/${mode}a\""
done

# CHECK sees the mode drift: l2a's configuration now says l3 (no ipam, so only the link is checked).
net l2as3 1.1.0 '"master":"mst0"' '"mode":"l3"'
cp /tmp/cni-results/l2a-eth0.json /tmp/cni-results/l2x-eth0.json
cni CHECK ipvlan /tmp/l2as3.json l2x l2a eth0 > /tmp/l2as3.out 2>&1 || true
check "check fails on another mode" has /tmp/l2as3.out '"code": *103' 'eth0 is in ipvlan mode l2, the configuration says l3'
rm -f /tmp/cni-results/l2x-eth0.json

# DEL: the link goes, the addresses are released; a second DEL succeeds.
for p in l2a:l2 l2b:l2 l3a:l3 l3b:l3; do
    id=${p%%:*} n=${p#*:}
    check "del $id" cni DEL ipvlan "/tmp/$n.json" "$id" "$id" eth0
    check "del $id removes eth0" only_lo "$id"
    check "del $id again" cni DEL ipvlan "/tmp/$n.json" "$id" "$id" eth0
done
check "no address is left allocated" is "$(ls /tmp/ipam/l2 /tmp/ipam/l3 | grep -c '^[1f][0d]')" 0

# DEL once the pod's namespace is gone: the kernel took the link; DEL releases the addresses.
add l2 gone
ip netns del gone
check "netns gone: del succeeds" cni DEL ipvlan /tmp/l2.json gone gone eth0
check "netns gone: addresses released" is "$(ls /tmp/ipam/l2 | grep -c '^[1f][0d]')" 0

# mtu reaches the link; above the master's it is refused naming both.
net mtu 1.1.0 '"master":"mst0"' '"mtu":1400' "$(ipam 10.63.0.0/24)"
add mtu m1
check "mtu: eth0 has mtu 1400" has <(pod m1 ip link show eth0) ' mtu 1400 '
cni DEL ipvlan /tmp/mtu.json m1 m1 eth0 > /dev/null
net bigmtu 1.1.0 '"master":"mst0"' '"mtu":9000' "$(ipam 10.63.0.0/24)"
ip netns add m2
check "mtu above the master's: code 7" code 7 ADD /tmp/bigmtu.json m2
cni ADD ipvlan /tmp/bigmtu.json m2 m2 eth0 > /tmp/bigmtu.out 2>&1 || true
check "mtu above the master's: message names both" has /tmp/bigmtu.out \
    'mtu 9000 is above the MTU of its master mst0 \(1500\)'
check "mtu above the master's: nothing in the pod" only_lo m2

# linkInContainer: the master is in the pod.
ip netns add inpod
pod inpod ip link add inner0 type dummy
pod inpod ip link set inner0 up
net inpod 1.1.0 '"master":"inner0"' '"linkInContainer":true' "$(ipam 10.64.0.0/24)"
check "linkInContainer: add" cni ADD ipvlan /tmp/inpod.json inpod inpod eth0
check "linkInContainer: eth0 on inner0" has <(pod inpod ip -d link show eth0) 'eth0@inner0' 'ipvlan'
check "linkInContainer: check" cni CHECK ipvlan /tmp/inpod.json inpod inpod eth0
check "linkInContainer: del" cni DEL ipvlan /tmp/inpod.json inpod inpod eth0
check "linkInContainer: master stays" pod inpod ip link show inner0

# Chained with no master and no ipam: the master is prevResult's one interface, the addresses are
# prevResult's.
PREV='{"cniVersion":"1.0.0","interfaces":[{"name":"mst1"}],"ips":[{"address":"10.65.0.5/24","interface":0},{"address":"fd00:65::5/64","interface":0}],"routes":[{"dst":"10.99.0.0/16","gw":"10.65.0.1"}]}'
printf '{"cniVersion":"1.0.0","name":"chain","type":"ipvlan","prevResult":%s}' "$PREV" > /tmp/chain-add.json
net chain 1.0.0
ip netns add ch
check "chained: add" cni ADD ipvlan /tmp/chain-add.json ch ch eth0
check "chained: eth0 hangs from mst1" has <(pod ch ip -d link show eth0) "eth0@if$MST1_INDEX" 'ipvlan  *mode l2 '
check "chained: prevResult's addresses on eth0" has <(pod ch ip -o addr show dev eth0) ' 10\.65\.0\.5/24 ' \
    ' fd00:65::5/64 '
check "chained: prevResult's route" has <(pod ch ip route) '10\.99\.0\.0/16 via 10\.65\.0\.1 dev eth0'
check "chained: result keeps mst1 first and points the addresses at eth0" has /tmp/cni-results/ch-eth0.json \
    '"name": *"mst1"' '"interface": *1'
check "chained: check" cni CHECK ipvlan /tmp/chain.json ch ch eth0
check "chained: del" cni DEL ipvlan /tmp/chain.json ch ch eth0
check "chained: del removes eth0" only_lo ch
check "chained: del again" cni DEL ipvlan /tmp/chain.json ch ch eth0
printf '{"cniVersion":"1.0.0","name":"chain","type":"ipvlan","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"a"},{"name":"b"}],"ips":[{"address":"10.65.0.6/24"}]}}' > /tmp/chain-two.json
check "chained: two interfaces in prevResult is code 7" code 7 ADD /tmp/chain-two.json ch
check "chained: refused add leaves nothing" only_lo ch

# Bad input: the code, nothing left in the pod or the data directory.
ip netns add bad
net badmode 1.1.0 '"master":"mst0"' '"mode":"l4"' "$(ipam 10.66.0.0/24)"
net nomaster 1.1.0 '"master":"nosuch0"' "$(ipam 10.66.0.0/24)"
net noipam 1.1.0 '"master":"mst0"'
net badmtu 1.1.0 '"master":"mst0"' '"mtu":"big"' "$(ipam 10.66.0.0/24)"
net badversion 9.9.9 '"master":"mst0"' "$(ipam 10.66.0.0/24)"
check "bad mode: code 7" code 7 ADD /tmp/badmode.json bad
check "missing master: code 7" code 7 ADD /tmp/nomaster.json bad
check "no ipam and no prevResult: code 7" code 7 ADD /tmp/noipam.json bad
check "mtu of the wrong type: code 7" code 7 ADD /tmp/badmtu.json bad
check "unknown cniVersion: code 1" code 1 ADD /tmp/badversion.json bad
check "bad input leaves nothing in the pod" only_lo bad
check "bad input reserves nothing" is "$(ls /tmp/ipam/badmode /tmp/ipam/nomaster 2>/dev/null | grep -c '^10\.')" 0
check "del with a bad mode still succeeds" cni DEL ipvlan /tmp/badmode.json bad bad eth0

# A failed ADD undoes its link: a /30 holds one pod, the second ADD fails in IPAM.
net small 1.1.0 '"master":"mst2"' "$(ipam 10.67.0.0/30)"
add small s1
ip netns add s2
check "full range: code 101" code 101 ADD /tmp/small.json s2
check "failed add leaves no link in the pod" only_lo s2
check "failed add leaves one reservation" is "$(ls /tmp/ipam/small | grep -c '^10\.')" 1

# A host link named like the pod's interface: this kernel (before 6.14) looks a new link's name up
# in the namespace the request comes from, so ADD makes it under a temporary name and renames it in
# the pod (a newer kernel names it at creation); the host's link is left alone.
ip link add same0 type dummy
net samename 1.1.0 '"master":"mst0"' "$(ipam 10.69.0.0/24)"
ip netns add sn
check "host link of the pod's name: add" cni ADD ipvlan /tmp/samename.json sn sn same0
check "host link of the pod's name: the pod's is the ipvlan" has <(pod sn ip -d link show same0) 'ipvlan'
check "host link of the pod's name: the host's is still the dummy" has <(ip -d link show same0) 'dummy'
check "host link of the pod's name: nothing else in the pod" is "$(links_of sn)" 1
check "host link of the pod's name: renamed on this kernel" is "$(pod sn cat /sys/class/net/same0/name_assign_type)" 4
ip netns add sf
cni ADD ipvlan /tmp/samename.json sf sf free0 > /dev/null
check "a name free on the host: named at creation" is "$(pod sf cat /sys/class/net/free0/name_assign_type)" 3
cni DEL ipvlan /tmp/samename.json sf sf free0 > /dev/null
check "host link of the pod's name: del" cni DEL ipvlan /tmp/samename.json sn sn same0
check "host link of the pod's name: del removes it" only_lo sn
check "host link of the pod's name: the host's stays" ip link show same0

# Every spec version: ADD (address, traffic to a pod on the same master), CHECK from 0.4.0 on
# (refused before), DEL twice.
net peer 1.1.0 '"master":"mst2"' "$(ipam 10.68.0.0/24)"
add peer peer
after_add() { check "add $1: pod reaches a pod on the same master" pings "$2" 10.68.0.2; }
after_del() { check "del $1 removes eth0" only_lo "$2"; }
for v in VERSIONS; do
    n=ver${v//./}
    net "$n" "$v" '"master":"mst2"' "$(ipam 10.68.0.0/24)"
    # One network (one address pool) for every version, beside the peer.
    sed -i "s/\"name\":\"$n\"/\"name\":\"peer\"/" "/tmp/$n.json"
    version_round "$v" ipvlan "$n"
done
"#;

#[test]
fn ipvlan_in_a_vm() {
    let run = Vm::new().plugins(&["ipvlan", "host-local"]).run_versions(SCRIPT, &VERSIONS);
    let mut cases: Vec<String> = Vec::new();
    for mode in ["l2", "l3"] {
        for what in [
            "pod's eth0 is an ipvlan in {m} mode",
            "pod holds its addresses",
            "eth0 shares the master's MAC",
            "v4 pod to pod",
            "v4 pod to pod back",
            "v6 pod to pod",
            "v6 pod to pod back",
            "check",
            "result lists eth0 in the pod",
        ] {
            cases.push(format!("{mode}: {}", what.replace("{m}", mode)));
        }
    }
    for id in ["l2a", "l2b", "l3a", "l3b"] {
        cases.push(format!("del {id}"));
        cases.push(format!("del {id} removes eth0"));
        cases.push(format!("del {id} again"));
    }
    cases.extend(
        [
            "check fails on another mode",
            "no address is left allocated",
            "netns gone: del succeeds",
            "netns gone: addresses released",
            "mtu: eth0 has mtu 1400",
            "mtu above the master's: code 7",
            "mtu above the master's: message names both",
            "mtu above the master's: nothing in the pod",
            "linkInContainer: add",
            "linkInContainer: eth0 on inner0",
            "linkInContainer: check",
            "linkInContainer: del",
            "linkInContainer: master stays",
            "chained: add",
            "chained: eth0 hangs from mst1",
            "chained: prevResult's addresses on eth0",
            "chained: prevResult's route",
            "chained: result keeps mst1 first and points the addresses at eth0",
            "chained: check",
            "chained: del",
            "chained: del removes eth0",
            "chained: del again",
            "chained: two interfaces in prevResult is code 7",
            "chained: refused add leaves nothing",
            "bad mode: code 7",
            "missing master: code 7",
            "no ipam and no prevResult: code 7",
            "mtu of the wrong type: code 7",
            "unknown cniVersion: code 1",
            "bad input leaves nothing in the pod",
            "bad input reserves nothing",
            "del with a bad mode still succeeds",
            "full range: code 101",
            "failed add leaves no link in the pod",
            "failed add leaves one reservation",
            "host link of the pod's name: add",
            "host link of the pod's name: the pod's is the ipvlan",
            "host link of the pod's name: the host's is still the dummy",
            "host link of the pod's name: nothing else in the pod",
            "host link of the pod's name: renamed on this kernel",
            "a name free on the host: named at creation",
            "host link of the pod's name: del",
            "host link of the pod's name: del removes it",
            "host link of the pod's name: the host's stays",
        ]
        .map(String::from),
    );
    cases.extend(version_round_cases(
        &VERSIONS,
        &["add {v}: pod reaches a pod on the same master", "del {v} removes eth0"],
    ));
    run.assert_passed(&cases);
}
