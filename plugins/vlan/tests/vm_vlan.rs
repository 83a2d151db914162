#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! vlan inside a VM that boots Debian's kernel (the host kernel has no 8021q): the host's masters
//! are the two ends of a veth pair called `eth0` and `eth1` (so the pod's `eth0` name is taken on
//! the host, as on a real node); pods on VLAN 10 of either end reach each other over IPv4 and
//! IPv6, a pod on VLAN 20 reaches neither; `mtu`; `linkInContainer` with the master inside the pod;
//! CHECK sees the MTU drift and the master vanish; failures (a VLAN id taken on the master, an MTU
//! above the master's, a missing master) leave nothing; DEL twice, with the namespace gone, with the
//! master gone; every verb at every spec version. One boot runs every case.

use cni_tests::exec::VERSIONS;
use cni_tests::vm::{version_round_cases, Vm};

const SCRIPT: &str = r#"
mkdir -p /tmp/ipam
net() { # name version master vlanId extra-keys...
    local name=$1 version=$2 master=$3 id=$4
    shift 4
    local IFS=,
    printf '{"cniVersion":"%s","name":"%s","type":"vlan","master":"%s","vlanId":%s%s}' \
        "$version" "$name" "$master" "$id" "${*:+,$*}" > "/tmp/$name.json"
}
ipam() { # ranges [rangeStart for the first]
    printf '"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":[%s]}' "$1"
}
reservations() { ls "/tmp/ipam/$1" 2>/dev/null | grep -c '^[0-9a-f]*[.:]' || true; }
pings() { pod "$1" ping -c 1 -W 2 "$2" > /dev/null 2>&1; }
pings6() { pod "$1" ping -6 -c 1 -W 2 "$2" > /dev/null 2>&1; }

# The wire: eth0 <-> eth1 on the host.
ip link add eth0 type veth peer name eth1
ip link set eth0 up
ip link set eth1 up
DS='[{"subnet":"10.10.0.0/24"}],[{"subnet":"fd00:10::/64"}]'
net v10a 1.1.0 eth0 10 "$(ipam "$DS")"
net v10b 1.1.0 eth1 10 "$(ipam "$DS")"
net v20 1.1.0 eth1 20 "$(ipam '[{"subnet":"10.10.0.0/24","rangeStart":"10.10.0.200"}]')"
ip netns add a
ip netns add b
ip netns add c
check "add a on eth0 (the host has an eth0)" cni ADD vlan /tmp/v10a.json a a eth0
# v10a and v10b share the IPAM store by network name only: give b its own addresses.
check "add b on eth1" cni ADD vlan /tmp/v10b.json b b eth0
check "add c on eth1 vlan 20" cni ADD vlan /tmp/v20.json c c eth0
check "a's eth0 is vlan 10 on eth0" has <(pod a ip -d -o link show eth0) 'vlan protocol 802\.1Q id 10 '
check "c's eth0 is vlan 20" has <(pod c ip -d -o link show eth0) 'vlan protocol 802\.1Q id 20 '
check "host keeps its eth0" has <(ip -d -o link show eth0) ' veth '
check "a has its addresses" has <(pod a ip -o addr show dev eth0) ' 10\.10\.0\.2/24 ' ' fd00:10::2/64 '
check "b has its addresses" has <(pod b ip -o addr show dev eth0) ' 10\.10\.0\.2/24 ' ' fd00:10::2/64 '
# Both networks hand out .2: move b to .3 so the two pods differ.
pod b ip addr del 10.10.0.2/24 dev eth0
pod b ip addr add 10.10.0.3/24 dev eth0
pod b ip addr del fd00:10::2/64 dev eth0
pod b ip -6 addr add fd00:10::3/64 dev eth0 nodad
check "vlan 10 pods reach each other (v4)" pings a 10.10.0.3
check "vlan 10 pods reach each other back (v4)" pings b 10.10.0.2
check "vlan 10 pods reach each other (v6)" pings6 a fd00:10::3
check "vlan 10 pods reach each other back (v6)" pings6 b fd00:10::2
refuse "vlan 20 pod does not reach vlan 10" pings c 10.10.0.2
R=/tmp/cni-results/a-eth0.json
MAC=$(pod a cat /sys/class/net/eth0/address)
check "result lists eth0 with its MAC and sandbox" has "$R" '"name": *"eth0"' "\"mac\": *\"$MAC\"" '"sandbox": *"/run/netns/a"'
check "result addresses are on interface 0" is "$(grep -c '"interface": *0' "$R")" 2

# The same VLAN id twice on one master: the kernel refuses, nothing is left.
ip netns add dup
net dupnet 1.1.0 eth0 10 "$(ipam '[{"subnet":"10.11.0.0/24"}]')"
refuse "second vlan 10 on eth0 fails" cni ADD vlan /tmp/dupnet.json dup dup eth0
check "second vlan 10: the error says the id is taken" has <(cni ADD vlan /tmp/dupnet.json dup dup eth0) 'create vlan link tmp[0-9a-f]{8} \(8021q: VLAN device already exists\): File exists'

check "second vlan 10: no link in the pod" is "$(links_of dup)" 0
check "second vlan 10: no temporary link on the host" is "$(ip -o link show | grep -c ' tmp')" 0
check "second vlan 10: no reservation" is "$(reservations dupnet)" 0

# mtu: applied; above the master's refused with code 7; CHECK sees drift.
net mtu 1.1.0 eth0 30 '"mtu":1400' "$(ipam '[{"subnet":"10.30.0.0/24"}]')"
ip netns add m
check "add with mtu" cni ADD vlan /tmp/mtu.json m m eth0
check "mtu applied" has <(pod m ip -o link show eth0) ' mtu 1400 '
check "check with mtu" cni CHECK vlan /tmp/mtu.json m m eth0
pod m ip link set eth0 mtu 1300
refuse "check fails on mtu drift" cni CHECK vlan /tmp/mtu.json m m eth0
pod m ip link set eth0 mtu 1400
net bigmtu 1.1.0 eth0 31 '"mtu":9000' "$(ipam '[{"subnet":"10.31.0.0/24"}]')"
ip netns add big
check "mtu above the master's: code 7" is "$(cni ADD vlan /tmp/bigmtu.json big big eth0 | code_of)" 7
check "mtu above the master's: no link" is "$(links_of big)" 0
check "mtu above the master's: no reservation" is "$(reservations bigmtu)" 0
net nomaster 1.1.0 eth9 32 "$(ipam '[{"subnet":"10.32.0.0/24"}]')"
check "missing master: code 7" is "$(cni ADD vlan /tmp/nomaster.json big big eth0 | code_of)" 7
check "missing master: message names it" has <(cni ADD vlan /tmp/nomaster.json big big eth0) 'master: interface eth9 not found on the host'
check "missing master: no link" is "$(links_of big)" 0
net noipam 1.1.0 eth0 33
check "no ipam: code 7" is "$(cni ADD vlan /tmp/noipam.json big big eth0 | code_of)" 7

# linkInContainer: the master is inside the pod; the host talks to it through the wire's other end.
ip netns add d
ip link add ens1 netns d type veth peer name hd
pod d ip link set ens1 up
ip link set hd up
ip link add link hd name hd.40 type vlan id 40
ip addr add 10.40.0.1/24 dev hd.40
ip link set hd.40 up
net inpod 1.1.0 ens1 40 '"linkInContainer":true' "$(ipam '[{"subnet":"10.40.0.0/24","rangeStart":"10.40.0.5"}]')"
check "linkInContainer: add" cni ADD vlan /tmp/inpod.json d d eth0
check "linkInContainer: eth0 is vlan 40 on ens1" has <(pod d ip -d -o link show eth0) '^[0-9]+: eth0@ens1: .* vlan protocol 802\.1Q id 40 '
check "linkInContainer: the host reaches the pod" ping -c 1 -W 2 10.40.0.5
check "linkInContainer: check" cni CHECK vlan /tmp/inpod.json d d eth0
refuse "linkInContainer: the master is not looked up on the host" cni CHECK vlan \
    <(sed 's/"linkInContainer":true/"linkInContainer":false/' /tmp/inpod.json) d d eth0
check "linkInContainer: del" cni DEL vlan /tmp/inpod.json d d eth0
check "linkInContainer: del leaves the master" is "$(links_of d)" 1

# CHECK; DEL; again; with the master gone; with the namespace gone.
check "check a" cni CHECK vlan /tmp/v10a.json a a eth0
check "del a" cni DEL vlan /tmp/v10a.json a a eth0
check "del a removes eth0" is "$(links_of a)" 0
check "del a again" cni DEL vlan /tmp/v10a.json a a eth0
ip link add w0 type veth peer name w1
net gonemaster 1.1.0 w0 50 "$(ipam '[{"subnet":"10.50.0.0/24"}]')"
ip netns add gm
check "master down: add fails naming it" has <(cni ADD vlan /tmp/gonemaster.json gm gm eth0) 'master w0 is down'
check "master down: no link" is "$(links_of gm)" 0
check "master down: no reservation" is "$(reservations gonemaster)" 0
ip link set w0 up
cni ADD vlan /tmp/gonemaster.json gm gm eth0
ip link del w0
refuse "check fails with the master gone" cni CHECK vlan /tmp/gonemaster.json gm gm eth0
check "master gone: del succeeds" cni DEL vlan /tmp/gonemaster.json gm gm eth0
check "master gone: address released" is "$(reservations gonemaster)" 0
net gone 1.1.0 eth0 60 "$(ipam '[{"subnet":"10.60.0.0/24"}]')"
ip netns add gone
cni ADD vlan /tmp/gone.json gone gone eth0
ip netns del gone
check "netns gone: del succeeds" cni DEL vlan /tmp/gone.json gone gone eth0
check "netns gone: address released" is "$(reservations gone)" 0
for p in b:v10b c:v20 m:mtu; do
    check "del ${p%%:*}" cni DEL vlan "/tmp/${p#*:}.json" "${p%%:*}" "${p%%:*}" eth0
done
check "no vlan link is left on the host masters" is "$(ip -o link show type vlan | grep -c '@eth[01]' || true)" 0
check "status" cni STATUS vlan /tmp/v10a.json a a eth0

# Debian's reference vlan (1.1.1, in /bin) and ours on one attachment: ours checks and deletes
# what the reference made, and the reference checks and deletes what ours made.
net mixnet 1.0.0 eth0 80 "$(ipam '[{"subnet":"10.80.0.0/24"}]')"
ip netns add mix
check "reference: add" env CNI_COMMAND=ADD CNI_CONTAINERID=mix CNI_NETNS=/run/netns/mix CNI_IFNAME=eth0 \
    CNI_PATH=/opt/cni/bin sh -c '/bin/vlan < /tmp/mixnet.json > /tmp/cni-results/mix-eth0.json'
check "ours checks the reference's vlan" cni CHECK vlan /tmp/mixnet.json mix mix eth0
check "ours deletes the reference's vlan" cni DEL vlan /tmp/mixnet.json mix mix eth0
check "ours deleted it and released its address" is "$(links_of mix):$(reservations mixnet)" 0:0
cni ADD vlan /tmp/mixnet.json mix mix eth0 > /dev/null
body=$(cat /tmp/mixnet.json)
printf '%s' "${body%\}},\"prevResult\":$(cat /tmp/cni-results/mix-eth0.json)}" > /tmp/mixprev.json
check "reference checks ours" env CNI_COMMAND=CHECK CNI_CONTAINERID=mix CNI_NETNS=/run/netns/mix CNI_IFNAME=eth0 \
    CNI_PATH=/opt/cni/bin sh -c '/bin/vlan < /tmp/mixprev.json'
check "reference deletes ours" env CNI_COMMAND=DEL CNI_CONTAINERID=mix CNI_NETNS=/run/netns/mix CNI_IFNAME=eth0 \
    CNI_PATH=/opt/cni/bin sh -c '/bin/vlan < /tmp/mixprev.json'
check "the reference deleted it and released its address" is "$(links_of mix):$(reservations mixnet)" 0:0

after_add() { check "add $1: address" has <(pod "$2" ip -4 -o addr show dev eth0) ' 10\.70\.0\.2/24 '; }
after_del() { check "del $1: no link" is "$(links_of "$2")" 0; }
for v in VERSIONS; do
    n=ver${v//./}
    net "$n" "$v" eth1 70 "$(ipam '[{"subnet":"10.70.0.0/24"}]')"
    version_round "$v" vlan "$n"
done
"#;

#[test]
fn vlan_in_a_vm() {
    let run = Vm::new().plugins(&["vlan", "host-local"]).bin("/usr/lib/cni/vlan").run_versions(SCRIPT, &VERSIONS);
    let mut cases: Vec<String> = [
        "add a on eth0 (the host has an eth0)",
        "add b on eth1",
        "add c on eth1 vlan 20",
        "a's eth0 is vlan 10 on eth0",
        "c's eth0 is vlan 20",
        "host keeps its eth0",
        "a has its addresses",
        "b has its addresses",
        "vlan 10 pods reach each other (v4)",
        "vlan 10 pods reach each other back (v4)",
        "vlan 10 pods reach each other (v6)",
        "vlan 10 pods reach each other back (v6)",
        "vlan 20 pod does not reach vlan 10",
        "result lists eth0 with its MAC and sandbox",
        "result addresses are on interface 0",
        "second vlan 10 on eth0 fails",
        "second vlan 10: the error says the id is taken",
        "second vlan 10: no link in the pod",
        "second vlan 10: no temporary link on the host",
        "second vlan 10: no reservation",
        "add with mtu",
        "mtu applied",
        "check with mtu",
        "check fails on mtu drift",
        "mtu above the master's: code 7",
        "mtu above the master's: no link",
        "mtu above the master's: no reservation",
        "missing master: code 7",
        "missing master: message names it",
        "missing master: no link",
        "no ipam: code 7",
        "linkInContainer: add",
        "linkInContainer: eth0 is vlan 40 on ens1",
        "linkInContainer: the host reaches the pod",
        "linkInContainer: check",
        "linkInContainer: the master is not looked up on the host",
        "linkInContainer: del",
        "linkInContainer: del leaves the master",
        "check a",
        "del a",
        "del a removes eth0",
        "del a again",
        "master down: add fails naming it",
        "master down: no link",
        "master down: no reservation",
        "check fails with the master gone",
        "master gone: del succeeds",
        "master gone: address released",
        "netns gone: del succeeds",
        "netns gone: address released",
        "del b",
        "del c",
        "del m",
        "no vlan link is left on the host masters",
        "status",
        "reference: add",
        "ours checks the reference's vlan",
        "ours deletes the reference's vlan",
        "ours deleted it and released its address",
        "reference checks ours",
        "reference deletes ours",
        "the reference deleted it and released its address",
    ]
    .map(String::from)
    .to_vec();
    cases.extend(version_round_cases(&VERSIONS, &["add {v}: address", "del {v}: no link"]));
    run.assert_passed(&cases);
}
