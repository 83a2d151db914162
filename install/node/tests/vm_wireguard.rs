#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `--backend wireguard` inside a VM that boots Debian's kernel (the host kernel has no wireguard
//! module): three nodes (network namespaces on one bridge, the segment), a real etcd, the agents,
//! and pods made with the conflist each agent wrote (through cnitool and cni-rs's bridge and
//! host-local). The agents run as the DaemonSet runs them: uid 0 with only the capabilities
//! install/daemonset.yaml gives, and no_new_privs. One boot runs every case.

mod common;

use cni_tests::vm::Vm;
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = r#"
S=cni-rs.wg
wait_for() { # seconds command...
    local n=$1; shift
    for _ in $(seq "$n"); do "$@" > /dev/null 2>&1 && return 0; sleep 1; done
    "$@"
}
# The agents find no `ip` or `wg` on their PATH but these, which leave a trace.
mkdir -p /tmp/shim
for tool in ip wg; do
    printf '#!/bin/sh\necho "$0 $*" >> /tmp/forbidden\nexit 1\n' > /tmp/shim/$tool
    chmod +x /tmp/shim/$tool
done

ip link add seg type bridge
ip link set seg up
ip addr add 10.95.0.1/24 dev seg
mkdir -p /tmp/etcd
etcd --name vm --data-dir /tmp/etcd/data --listen-client-urls http://10.95.0.1:2379 \
    --advertise-client-urls http://10.95.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
    --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster vm=http://127.0.0.1:2380 \
    > /tmp/etcd/log 2>&1 &
node() {
    ip netns add n$1
    ip link add s$1 type veth peer name eth0 netns n$1
    ip link set s$1 master seg up
    ip -n n$1 link set lo up
    ip -n n$1 link set eth0 up
    ip -n n$1 addr add 10.95.0.1$1/24 dev eth0
    ip -n n$1 -6 addr add fd00:95::1$1/64 dev eth0 nodad
    mkdir -p /tmp/n$1
}
start() {
    # As the DaemonSet runs it: uid 0 with only the container's capabilities, no_new_privs.
    ip netns exec n$1 setpriv --no-new-privs --bounding-set __BOUNDING__ --inh-caps -all -- \
        env PATH=/tmp/shim /bin/cni-rs-node --node-name n$1 \
        --etcd-endpoints http://10.95.0.1:2379 --cluster-cidr 10.244.0.0/16,fd00:10:244::/56 \
        --node-ip 10.95.0.1$1,fd00:95::1$1 --lease-ttl 5 --backend ${BACKEND:-wireguard} \
        --state-dir /tmp/n$1/state --conf-dir /tmp/n$1/net.d --no-plugins \
        --metrics-addr 127.0.0.1:9901 >> /tmp/n$1/log 2>&1 &
    echo $! > /tmp/n$1/pid
}
conflist() { cat /tmp/n$1/net.d/10-cni-rs.conflist; }
cidrs_of() { conflist $1 | grep -o '"subnet": *"[^"]*"' | cut -d'"' -f4 | sort | paste -sd,; }
wgn() { ip netns exec n$1 wg "${@:2}"; }
peer_count() { wgn $1 show $S peers | grep -c . || true; }
# "<public key> <endpoint> <sorted allowed IPs>" per peer, sorted.
peers_of() {
    wgn $1 show $S dump | tail -n +2 | while read -r key _ endpoint allowed _; do
        echo "$key $endpoint $(echo "$allowed" | tr , '\n' | sort | paste -sd,)"
    done | sort
}
expect_peers() { # node, other nodes...
    local n=$1 want="" i; shift
    for i in "$@"; do
        want="$want$(wgn $i show $S public-key) 10.95.0.1$i:51820 $(cidrs_of $i)
"
    done
    is "$(peers_of $n)" "$(printf '%s' "$want" | sort)"
}
pod_add() { # node pod
    ip netns add $2
    ip netns exec n$1 env NETCONFPATH=/tmp/n$1/net.d CNI_PATH=/opt/cni/bin cnitool add cni-rs /run/netns/$2 > /dev/null
}
pod_del() {
    ip netns exec n$1 env NETCONFPATH=/tmp/n$1/net.d CNI_PATH=/opt/cni/bin cnitool del cni-rs /run/netns/$2
    ip netns del $2
}
v4_of() { pod $1 ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1; }
v6_of() { pod $1 ip -6 -o addr show dev eth0 scope global | awk '{print $4}' | cut -d/ -f1; }

# An agent that cannot get a lease exits (its DaemonSet would restart it): start them on a ready etcd.
check "etcd is ready" wait_for 120 grep -q 'ready to serve client requests' /tmp/etcd/log
for i in 1 2 3; do node $i; start $i; done
for i in 1 2 3; do
    check "node $i wrote its conflist" wait_for 60 test -s /tmp/n$i/net.d/10-cni-rs.conflist
done
check "the agents have only the DaemonSet's capabilities" \
    has /proc/$(cat /tmp/n1/pid)/status '^CapEff:[[:space:]]+__CAPMASK__$' '^CapPrm:[[:space:]]+__CAPMASK__$'
has_peers() { test "$(peer_count $1)" = "$2"; }
for i in 1 2 3; do wait_for 60 has_peers $i 2 || tail -n 20 /tmp/n$i/log; done
all_peers() { expect_peers 1 2 3 && expect_peers 2 1 3 && expect_peers 3 1 2; }
check "each device has exactly the other nodes as peers, with their pod CIDRs and endpoints" all_peers
check "routes to the other nodes' pod CIDRs go through the device" \
    has <(ip -n n1 route show proto 210; ip -n n1 -6 route show proto 210) \
    "^$(cidrs_of 2 | cut -d, -f1 | sed 's/\./\\./g') dev $S" "^$(cidrs_of 3 | cut -d, -f2) dev $S"
check "the pods' MTU is the underlay's minus 60" has <(conflist 1) '"mtu": *1440[,}]'
check "the key file is mode 0600" is "$(stat -c %a /tmp/n1/state/wireguard.key)" 600

pod_add 1 a
pod_add 2 b
pod_add 3 c
A=$(v4_of a) B=$(v4_of b) C=$(v4_of c) B6=$(v6_of b) C6=$(v6_of c)
echo "a=$A b=$B c=$C b6=$B6 c6=$C6"
check "a pod reaches a pod on another node (IPv4)" wait_for 20 pod a ping -c 1 -W 1 $B
check "a pod reaches a pod on a third node (IPv4)" wait_for 20 pod a ping -c 1 -W 1 $C
check "a pod reaches a pod on another node (IPv6)" wait_for 20 pod a ping -c 1 -W 1 $B6
check "a pod reaches a pod on a third node (IPv6)" wait_for 20 pod c ping -c 1 -W 1 $B6

metric() { ip netns exec n$1 wget -qO- http://127.0.0.1:9901/metrics; }
check "metrics: peers, handshake age and bytes per peer, from the device" has <(metric 1) \
    '^cni_rs_node_wireguard_peers 2$' \
    '^cni_rs_node_wireguard_last_handshake_age_seconds\{node="n2",public_key="[A-Za-z0-9+/]{43}="\} [0-9]+$' \
    '^cni_rs_node_wireguard_received_bytes_total\{node="n2",public_key="[^"]+"\} [1-9][0-9]*$' \
    '^cni_rs_node_wireguard_sent_bytes_total\{node="n3",public_key="[^"]+"\} [1-9][0-9]*$'

# The segment, captured while a marker goes from pod to pod and back.
# tcpdump drops to a user it looks up; the guest has no user database.
mkdir -p /etc
echo 'root:x:0:0:root:/:/bin/sh' >> /etc/passwd
echo 'root:x:0:' >> /etc/group
tcpdump -Z root -i seg -U -w /tmp/seg.pcap 2> /tmp/tcpdump.log &
TCPDUMP=$!
sleep 2
cat /tmp/tcpdump.log
MARKER=cni-rs-wireguard-marker-$$
pod b sh -c "nc -l -p 7777 > /tmp/got" &
LISTENER=$!
sleep 1
echo "$MARKER" | pod a nc -w 2 $B 7777 || true
wait $LISTENER || true
pod c ping -c 2 -W 1 $B6 > /dev/null
sleep 1
check "tcpdump captured the segment throughout" kill $TCPDUMP
wait $TCPDUMP || cat /tmp/tcpdump.log
check "the marker reached the other pod" has /tmp/got "^$MARKER\$"
refuse "the marker never appears on the segment" grep -qa "$MARKER" /tmp/seg.pcap
# Everything but etcd's traffic (the host end of the segment), ARP, IPv6 neighbour discovery and
# multicast: a pod's packet in the clear (ICMP echo included) is counted.
OTHER='not host 10.95.0.1 and not arp and not (ip6 and (dst net ff00::/8 or (icmp6 and ip6[40] >= 133 and ip6[40] <= 137))) and not (udp port 51820)'
# A capture cut off by the kill ends in a partial record, which tcpdump reports as an error.
tcpdump -Z root -nn -r /tmp/seg.pcap 'udp port 51820' > /tmp/wg.txt || true
tcpdump -Z root -nn -r /tmp/seg.pcap "$OTHER" > /tmp/other.txt || true
echo "WireGuard packets: $(wc -l < /tmp/wg.txt), others between nodes: $(wc -l < /tmp/other.txt)"
head -5 /tmp/other.txt
check "the segment carried WireGuard between node addresses" \
    has /tmp/wg.txt '^[0-9:.]+ IP 10\.95\.0\.1[123]\.51820 > 10\.95\.0\.1[123]\.51820: UDP'
check "the segment carried nothing else between the nodes" is "$(wc -l < /tmp/other.txt)" 0
check "only WireGuard's port and node addresses" is "$(grep -cv ' IP 10\.95\.0\.1[123]\.51820 > 10\.95\.0\.1[123]\.51820: UDP' /tmp/wg.txt)" 0

# Throughput pod to pod across nodes (ratios only: the VM is slow and shared).
mkdir -p /tmp/www
dd if=/dev/zero of=/tmp/www/blob bs=64k count=64 2> /dev/null
pod b busybox httpd -f -p 8080 -h /tmp/www &
HTTPD=$!
sleep 1
throughput() { # backend
    local t0 t1
    t0=${EPOCHREALTIME/./}
    if pod a wget -q -O /tmp/blob.$1 http://$B:8080/blob; then
        t1=${EPOCHREALTIME/./}
        echo "THROUGHPUT $1: $(wc -c < /tmp/blob.$1) bytes in $(( (t1 - t0) / 1000 )) ms"
    else
        echo "THROUGHPUT $1: transfer failed"
    fi
    rm -f /tmp/blob.$1
}
throughput wireguard

# SIGTERM keeps the device, peers and routes; traffic flows while the agent is down; the
# restarted agent keeps its key.
KEY1=$(wgn 1 show $S public-key)
kill -TERM $(cat /tmp/n1/pid)
check "SIGTERM: the agent exits" wait $(cat /tmp/n1/pid)
check "SIGTERM keeps the peers" is "$(peer_count 1)" 2
check "SIGTERM keeps traffic" pod a ping -c 1 -W 2 $B
start 1
check "the restarted agent keeps its key" wait_for 30 grep -q "WireGuard key kept in /tmp/n1/state/wireguard.key" /tmp/n1/log
check "the restarted agent has the same public key" is "$(wgn 1 show $S public-key)" "$KEY1"
check "the key file stays mode 0600" is "$(stat -c %a /tmp/n1/state/wireguard.key)" 600
check "traffic flows after the restart" wait_for 10 pod a ping -c 1 -W 1 $B
sleep 3
check "the restarted agent keeps the peers" is "$(peer_count 1)" 2

# A node that leaves (killed; its lease expires) is removed from the others.
pod_del 3 c
kill -KILL $(cat /tmp/n3/pid)
wait $(cat /tmp/n3/pid) || true
# bash: busybox sh would run busybox's own ip.
left() { has_peers 1 1 && has_peers 2 1; }
check "a node that leaves is removed from the other devices" wait_for 30 left
check "and its routes are gone" bash -c "! ip -n n1 route show proto 210 | grep -q '$(cidrs_of 3 | cut -d, -f1)'"
remaining() { expect_peers 1 2 && expect_peers 2 1; }
check "the remaining peer is the node still there" remaining

check "no ip or wg process was run by an agent" test ! -e /tmp/forbidden

# The same transfer over the other backends, in this run: nodes 1 and 2 restarted with each.
for backend in vxlan host-gw; do
    for i in 1 2; do kill -TERM $(cat /tmp/n$i/pid); wait $(cat /tmp/n$i/pid) || true; done
    BACKEND=$backend start 1
    BACKEND=$backend start 2
    wait_for 30 bash -c "ip -n n1 route show proto 210 | grep -v 'dev $S' | grep -q ." || tail -n 5 /tmp/n1/log
    wait_for 20 pod a ping -c 1 -W 1 $B > /dev/null || true
    throughput $backend
done

for i in 1 2; do kill -TERM $(cat /tmp/n$i/pid); wait $(cat /tmp/n$i/pid) || true; done
kill $HTTPD; wait $HTTPD || true
pod_del 1 a
pod_del 2 b
for i in 1 2 3; do ip netns del n$i; done
# `ip netns del` returns before the kernel has torn the namespace down (cleanup_net runs from a
# workqueue): the other ends of its veth pairs, here, go a moment later.
leftovers() {
    is "$(ip netns list | wc -l) $(ip -o link show | grep -Evc ': (lo|seg):') $(ls /var/lib/cni/networks/cni-rs | grep -Evc '^(lock|last_reserved_ip\.[0-9]+)$')" \
        "0 0 0"
}
check "nothing is left after cleanup" wait_for 20 leftovers
"#;

fn stripped(binary: &Path, dir: &Path) -> PathBuf {
    let name = binary.file_name().unwrap();
    let out = dir.join(name);
    let status = Command::new("strip").arg("-o").arg(&out).arg(binary).status().expect("run strip (binutils)");
    assert!(status.success(), "strip {}", binary.display());
    out
}

#[test]
fn wireguard_backend_in_a_vm() {
    cni_tests::require_root();
    let agent = PathBuf::from(env!("CARGO_BIN_EXE_cni-rs-node"));
    let cnitool = agent.with_file_name("cnitool");
    assert!(cnitool.exists(), "{} is missing: run cargo build --workspace --bins", cnitool.display());
    for tool in ["/usr/bin/etcd", "/usr/bin/tcpdump", "/usr/bin/wg"] {
        assert!(Path::new(tool).exists(), "{tool} is missing: apt-get install etcd-server tcpdump wireguard-tools");
    }
    let caps = common::manifest_agent_capabilities(&common::manifest_documents());
    let script = SCRIPT
        .replace("__BOUNDING__", &common::setpriv_bounding(&caps))
        .replace("__CAPMASK__", &common::cap_mask(&caps));
    let dir = std::env::temp_dir().join(cni_tests::unique("cni-rs-wg-vm"));
    std::fs::create_dir_all(&dir).unwrap();
    let run = Vm::new()
        .plugins(&["bridge", "host-local", "portmap", "loopback"])
        .modules(&["wireguard", "vxlan", "nf_tables", "nft_chain_nat", "nft_masq"])
        .bin(stripped(&agent, &dir))
        .bin(stripped(&cnitool, &dir))
        .bin("/usr/bin/etcd")
        .bin("/usr/bin/tcpdump")
        .bin("/usr/bin/wg")
        .bin("/usr/bin/setpriv")
        .timeout(900)
        .run(&script);
    let _ = std::fs::remove_dir_all(&dir);
    for line in run.output.lines().filter(|l| l.starts_with("THROUGHPUT") || l.contains("WireGuard packets")) {
        eprintln!("{line}");
    }
    run.assert_passed(&[
        "etcd is ready",
        "node 1 wrote its conflist",
        "node 2 wrote its conflist",
        "node 3 wrote its conflist",
        "the agents have only the DaemonSet's capabilities",
        "each device has exactly the other nodes as peers, with their pod CIDRs and endpoints",
        "routes to the other nodes' pod CIDRs go through the device",
        "the pods' MTU is the underlay's minus 60",
        "the key file is mode 0600",
        "a pod reaches a pod on another node (IPv4)",
        "a pod reaches a pod on a third node (IPv4)",
        "a pod reaches a pod on another node (IPv6)",
        "a pod reaches a pod on a third node (IPv6)",
        "metrics: peers, handshake age and bytes per peer, from the device",
        "tcpdump captured the segment throughout",
        "the marker reached the other pod",
        "the marker never appears on the segment",
        "the segment carried WireGuard between node addresses",
        "the segment carried nothing else between the nodes",
        "only WireGuard's port and node addresses",
        "SIGTERM: the agent exits",
        "SIGTERM keeps the peers",
        "SIGTERM keeps traffic",
        "the restarted agent keeps its key",
        "the restarted agent has the same public key",
        "the key file stays mode 0600",
        "traffic flows after the restart",
        "the restarted agent keeps the peers",
        "a node that leaves is removed from the other devices",
        "and its routes are gone",
        "the remaining peer is the node still there",
        "no ip or wg process was run by an agent",
        "nothing is left after cleanup",
    ]);
}
