#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! vrf inside a VM that boots Debian's kernel (the host kernel has no VRF links), chained after
//! bridge: the VRF is created with the first free table (or the configured one), the pod's
//! interface is in it (`ip vrf`, `ip link show vrf`), its IPv4 and IPv6 addresses stay, its routes
//! (default and IPAM's) are in the VRF's table and gone from main, and traffic flows through the VRF
//! both ways over IPv4 and IPv6; a second interface joins the same VRF, a second VRF gets the next
//! table; CHECK sees the interface leave; refused cases (another table, a non-VRF of that name, an
//! interface with a master) leave no VRF; DEL detaches, deletes the VRF with its last member only,
//! twice, with the namespace gone, with an invalid configuration; every spec version vrf speaks.
//! One boot runs every case.

use cni_tests::vm::{per_version_cases, Vm};

const VERSIONS: [&str; 4] = ["0.3.1", "0.4.0", "1.0.0", "1.1.0"];

const SCRIPT: &str = r#"
mkdir -p /tmp/ipam
DEFAULT_ROUTE='[{"dst":"0.0.0.0/0"}]'
br() { # name version subnets-json [routes-json]
    printf '{"cniVersion":"%s","name":"%s","type":"bridge","bridge":"br0","isGateway":true,"ipam":{"type":"host-local","dataDir":"/tmp/ipam","ranges":%s,"routes":%s}}' \
        "$2" "$1" "$3" "${4:-$DEFAULT_ROUTE}" > "/tmp/$1.json"
}
vrf() { # file version vrfname [extra-keys]
    printf '{"cniVersion":"%s","name":"vrfnet","type":"vrf","vrfname":"%s"%s}' "$2" "$3" "${4:+,$4}" > "/tmp/$1.json"
}
# ADD of vrf with the main plugin's result as prevResult (a runtime does this for a conflist).
vrf_add() { # file id ifname
    local body
    body=$(cat "/tmp/$1.json")
    printf '%s' "${body%\}},\"prevResult\":$(cat "/tmp/cni-results/$2-$3.json")}" > "/tmp/$1-add.json"
    cni ADD vrf "/tmp/$1-add.json" "$2" "$2" "$3"
}
vrf_table() { pod "$1" ip -d -o link show "$2" | sed -n 's/.* vrf table \([0-9]*\) .*/\1/p'; }

DS='[[{"subnet":"10.80.0.0/24"}],[{"subnet":"fd00:80::/64"}]]'
ROUTES='[{"dst":"0.0.0.0/0"},{"dst":"::/0"},{"dst":"192.168.80.0/24"}]'
br ds 1.1.0 "$DS" "$ROUTES"
vrf blue 1.1.0 blue
ip netns add p
cni ADD bridge /tmp/ds.json p p eth0
check "add" vrf_add blue p eth0
check "vrf blue exists with the first free table" is "$(vrf_table p blue)" 1
check "ip vrf lists blue" has <(pod p ip vrf show) '^blue +1$'
check "eth0 is in vrf blue" has <(pod p ip -o link show vrf blue) ': eth0@'
check "vrf blue is up" has <(pod p ip -o link show blue) '<[^>]*,UP[,>]'
check "eth0 keeps its v4 address" has <(pod p ip -4 -o addr show dev eth0) ' 10\.80\.0\.2/24 '
check "eth0 keeps its v6 address" has <(pod p ip -6 -o addr show dev eth0) ' fd00:80::2/64 '
check "v4 default route in the vrf table" has <(pod p ip -4 route show vrf blue) '^default via 10\.80\.0\.1 dev eth0'
check "IPAM's route in the vrf table" has <(pod p ip -4 route show vrf blue) '^192\.168\.80\.0/24 via 10\.80\.0\.1 dev eth0'
check "v6 default route in the vrf table" has <(pod p ip -6 route show vrf blue) '^default via fd00:80::1 dev eth0'
check "connected route in the vrf table" has <(pod p ip -4 route show vrf blue) '^10\.80\.0\.0/24 dev eth0'
check "main table keeps no route of eth0" is "$(pod p ip route show table main | grep -c 'dev eth0' || true)" 0
check "pod reaches its gateway through the vrf (v4)" pod p ping -I blue -c 1 -W 2 10.80.0.1
check "pod reaches its gateway through the vrf (v6)" pod p ping -6 -I blue -c 1 -W 2 fd00:80::1
check "host reaches the pod in the vrf (v4)" ping -c 1 -W 2 10.80.0.2
check "host reaches the pod in the vrf (v6)" ping -6 -c 1 -W 2 fd00:80::2
check "the result is prevResult" has /tmp/cni-results/p-eth0.json '"name": *"br0"' '"address": *"10\.80\.0\.2/24"'
check "check" cni CHECK vrf /tmp/blue.json p p eth0

# A second interface joins the same VRF; another VRF takes the next free table; a set table.
br second 1.1.0 '[[{"subnet":"10.81.0.0/24"}]]'
cni ADD bridge /tmp/second.json p p eth1 > /dev/null
check "second interface joins blue" vrf_add blue p eth1
check "blue holds eth0 and eth1" is "$(pod p ip -o link show vrf blue | grep -c ': eth[01]@')" 2
br third 1.1.0 '[[{"subnet":"10.82.0.0/24"}]]'
vrf green 1.1.0 green
cni ADD bridge /tmp/third.json p p eth2 > /dev/null
check "another vrf" vrf_add green p eth2
check "another vrf takes the next free table" is "$(vrf_table p green)" 2
br fourth 1.1.0 '[[{"subnet":"10.83.0.0/24"}]]'
vrf red 1.1.0 red '"table":1000'
ip netns add q
cni ADD bridge /tmp/fourth.json q q eth0 > /dev/null
check "a set table" vrf_add red q eth0
check "red has table 1000" is "$(vrf_table q red)" 1000
check "red's routes are in table 1000" has <(pod q ip route show table 1000) '^default via 10\.83\.0\.1 dev eth0'

# Refusals leave no VRF behind and the interface where it was.
vrf red2 1.1.0 red '"table":1001'
ip netns add r
cni ADD bridge /tmp/fourth.json r r eth0 > /dev/null
pod r ip link add red type vrf table 1000
check "an existing vrf with another table: code 7" is "$(vrf_add red2 r eth0 | code_of)" 7
check "an existing vrf with another table: eth0 not in it" is "$(pod r ip -o link show vrf red | grep -c eth0 || true)" 0
pod r ip link del red
pod r ip link add red type dummy
check "a non-vrf link named vrfname: code 7" is "$(vrf_add red2 r eth0 | code_of)" 7
pod r ip link del red
pod r ip link add brx type bridge
pod r ip link set eth0 master brx
refuse "an interface with a master is refused" vrf_add red2 r eth0
check "the refused add deleted the vrf it created" is "$(pod r ip -o link show type vrf | wc -l)" 0
pod r ip link set eth0 nomaster
vrf novrfname 1.1.0 ""
check "no vrfname: code 7" is "$(vrf_add novrfname r eth0 | code_of)" 7
check "no prevResult: code 7" is "$(cni ADD vrf /tmp/blue.json r r eth0 | code_of)" 7
vrf old 0.3.0 blue
check "spec 0.3.0: code 1" is "$(cni ADD vrf /tmp/old.json r r eth0 | code_of)" 1

# CHECK sees the interface leave the VRF.
pod p ip link set eth1 nomaster
refuse "check fails once eth1 left the vrf" cni CHECK vrf /tmp/blue.json p p eth1
pod p ip link set eth1 master blue

# DEL: the VRF stays while a member is left; goes with its last; twice; with the netns gone.
check "del eth1" cni DEL vrf /tmp/blue.json p p eth1
check "del eth1 detaches it" is "$(pod p ip -o link show vrf blue | grep -c ': eth1@' || true)" 0
check "blue stays while eth0 is in it" pod p ip link show blue
check "del eth0" cni DEL vrf /tmp/blue.json p p eth0
check "blue goes with its last member" is "$(pod p ip -o link show type vrf | grep -c ' blue:' || true)" 0
check "del eth0 again" cni DEL vrf /tmp/blue.json p p eth0
check "green stays" pod p ip link show green
printf '{"cniVersion":"1.1.0","name":"vrfnet","type":"vrf"}' > /tmp/broken.json
check "del with an invalid configuration" cni DEL vrf /tmp/broken.json p p eth2
check "del with an invalid configuration removes the interface's vrf" is "$(pod p ip -o link show type vrf | wc -l)" 0
ip netns del q
check "netns gone: del succeeds" cni DEL vrf /tmp/red.json q q eth0

# Debian's reference vrf (1.1.1, in /bin) shares the pod's VRFs with ours, both ways: one creates
# the VRF, the other joins it, the first leaves without deleting it, the last deletes it.
ref() { local CNI_PATH=/bin; "$@"; }
br mixa 1.0.0 '[[{"subnet":"10.84.0.0/24"}]]'
br mixb 1.0.0 '[[{"subnet":"10.85.0.0/24"}]]'
vrf mixed 1.0.0 mixed
ip netns add mix
cni ADD bridge /tmp/mixa.json mix mix eth0
cni ADD bridge /tmp/mixb.json mix mix eth1
# A successful DEL drops the saved result: keep bridge's for the second round.
cp /tmp/cni-results/mix-eth0.json /tmp/cni-results/mix-eth1.json /tmp/
check "reference: creates the vrf" ref vrf_add mixed mix eth0
check "ours joins the reference's vrf" vrf_add mixed mix eth1
check "reference and ours: both interfaces in one vrf" is "$(pod mix ip -o link show vrf mixed | grep -c ': eth[01]@')" 2
check "ours checks the reference's vrf" cni CHECK vrf /tmp/mixed.json mix mix eth1
check "reference: del keeps the vrf ours still uses" ref cni DEL vrf /tmp/mixed.json mix mix eth0
check "reference del detached its interface" is "$(pod mix ip -o link show vrf mixed | grep -c ': eth0@' || true)" 0
check "ours deletes the vrf with its last member" cni DEL vrf /tmp/mixed.json mix mix eth1
check "no vrf left after both" is "$(pod mix ip -o link show type vrf | wc -l)" 0
cp /tmp/mix-eth0.json /tmp/mix-eth1.json /tmp/cni-results/
check "ours creates the vrf" vrf_add mixed mix eth1
check "reference joins ours" ref vrf_add mixed mix eth0
check "reference: same table" is "$(vrf_table mix mixed)" 1
check "ours: del keeps the vrf the reference still uses" cni DEL vrf /tmp/mixed.json mix mix eth1
check "the vrf stays for the reference's interface" is "$(pod mix ip -o link show vrf mixed | grep -c ': eth0@')" 1
check "reference deletes the vrf with its last member" ref cni DEL vrf /tmp/mixed.json mix mix eth0
check "no vrf left after both, the other way" is "$(pod mix ip -o link show type vrf | wc -l)" 0

for v in VERSIONS; do
    n=ver${v//./}
    br "$n" "$v" '[[{"subnet":"10.90.0.0/24"}]]'
    vrf "v$n" "$v" "vrf$n"
    ip netns add "$n"
    cni ADD bridge "/tmp/$n.json" "$n" "$n" eth0 > /dev/null
    check "add $v" vrf_add "v$n" "$n" eth0
    check "add $v: eth0 in the vrf" has <(pod "$n" ip -o link show vrf "vrf$n") ': eth0@'
    check "add $v: traffic through the vrf" pod "$n" ping -I "vrf$n" -c 1 -W 2 10.90.0.1
    check_by_version "$v" vrf "/tmp/v$n.json" "$n" "$n" eth0
    check "del $v" cni DEL vrf "/tmp/v$n.json" "$n" "$n" eth0
    check "del $v: no vrf" is "$(pod "$n" ip -o link show type vrf | wc -l)" 0
    check "del $v again" cni DEL vrf "/tmp/v$n.json" "$n" "$n" eth0
    cni DEL bridge "/tmp/$n.json" "$n" "$n" eth0 > /dev/null
done
"#;

#[test]
fn vrf_in_a_vm() {
    let run =
        Vm::new().plugins(&["vrf", "bridge", "host-local"]).bin("/usr/lib/cni/vrf").run_versions(SCRIPT, &VERSIONS);
    let mut cases: Vec<String> = [
        "add",
        "vrf blue exists with the first free table",
        "ip vrf lists blue",
        "eth0 is in vrf blue",
        "vrf blue is up",
        "eth0 keeps its v4 address",
        "eth0 keeps its v6 address",
        "v4 default route in the vrf table",
        "IPAM's route in the vrf table",
        "v6 default route in the vrf table",
        "connected route in the vrf table",
        "main table keeps no route of eth0",
        "pod reaches its gateway through the vrf (v4)",
        "pod reaches its gateway through the vrf (v6)",
        "host reaches the pod in the vrf (v4)",
        "host reaches the pod in the vrf (v6)",
        "the result is prevResult",
        "check",
        "second interface joins blue",
        "blue holds eth0 and eth1",
        "another vrf",
        "another vrf takes the next free table",
        "a set table",
        "red has table 1000",
        "red's routes are in table 1000",
        "an existing vrf with another table: code 7",
        "an existing vrf with another table: eth0 not in it",
        "a non-vrf link named vrfname: code 7",
        "an interface with a master is refused",
        "the refused add deleted the vrf it created",
        "no vrfname: code 7",
        "no prevResult: code 7",
        "spec 0.3.0: code 1",
        "check fails once eth1 left the vrf",
        "del eth1",
        "del eth1 detaches it",
        "blue stays while eth0 is in it",
        "del eth0",
        "blue goes with its last member",
        "del eth0 again",
        "green stays",
        "del with an invalid configuration",
        "del with an invalid configuration removes the interface's vrf",
        "netns gone: del succeeds",
        "reference: creates the vrf",
        "ours joins the reference's vrf",
        "reference and ours: both interfaces in one vrf",
        "ours checks the reference's vrf",
        "reference: del keeps the vrf ours still uses",
        "reference del detached its interface",
        "ours deletes the vrf with its last member",
        "no vrf left after both",
        "ours creates the vrf",
        "reference joins ours",
        "reference: same table",
        "ours: del keeps the vrf the reference still uses",
        "the vrf stays for the reference's interface",
        "reference deletes the vrf with its last member",
        "no vrf left after both, the other way",
    ]
    .map(String::from)
    .to_vec();
    cases.extend(per_version_cases(
        &VERSIONS,
        &[
            "add {v}",
            "add {v}: eth0 in the vrf",
            "add {v}: traffic through the vrf",
            "del {v}",
            "del {v}: no vrf",
            "del {v} again",
        ],
    ));
    run.assert_passed(&cases);
}
