#!/bin/bash
# How one pod's nf_tables transaction grows with the pods already present, for a layout with a
# chain per pod (reached through verdict maps) and for the flat layout without per-pod chains
# that the nftables backend uses (docs/nftables-flat-layout.md: DNAT through data maps, the
# masquerade and hairpin checks through sets, one owner record per pod). Kernel time only: the
# time `nft` spends inside the sendmsg that carries the batch (strace -T), so nft's own start-up
# and cache fill do not count. Also times creating and deleting a veth pair with each layout
# present (nf_tables walks every chain of the namespace on each link registered or removed).
#
# Runs in a network namespace of its own (removed at the end, also on error); changes nothing
# else. Needs root, nft and strace.
#
#   tests/bench/nft-layout-probe.sh [levels]     # default: 10 1000 3000
set -euo pipefail

LEVELS=("${@:-10 1000 3000}")
# shellcheck disable=SC2206
LEVELS=(${LEVELS[*]})
NS=cnib-nftprobe
WORK=$(mktemp -d /tmp/cni-nftprobe.XXXXXX)
cleanup() {
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
for tool in nft strace ip; do
    command -v "$tool" >/dev/null || { echo "nft-layout-probe: needs $tool" >&2; exit 2; }
done
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
inns() { ip netns exec "$NS" "$@"; }

ip4() { echo "10.$((200 + $1 / 62500)).$(($1 / 250 % 250)).$(($1 % 250 + 2))"; }
# Pod i's host port (the ADD and the DEL of a sample must agree on it).
hport() { echo $((1024 + $1 % 60000)); }
# Sets `ip` and `port` (locals of the caller, bash scoping being dynamic) for pod $1.
pod_addr() {
    ip=$(ip4 "$1")
    port=$(hport "$1")
}

# The base chains every layout shares: DNAT from prerouting and output through `dispatch`, and an
# empty postrouting chain the layout fills.
hooks() {
    cat <<EOF
add chain inet $1 prerouting { type nat hook prerouting priority -100; policy accept; }
add rule inet $1 prerouting fib daddr type local jump dispatch
add chain inet $1 output { type nat hook output priority -100; policy accept; }
add rule inet $1 output fib daddr type local jump dispatch
add chain inet $1 postrouting { type nat hook postrouting priority 100; policy accept; }
EOF
}

# With a chain per pod, reached through verdict maps: one pod's lines.
chains_pod() {
    local i=$1 ip port
    pod_addr "$i"
    cat <<EOF
add chain inet pc pm-$i-dnat
add rule inet pc pm-$i-dnat meta nfproto ipv4 tcp dport $port dnat ip to $ip:80 comment "anyports4=tcp . $port;snat4=$ip"
add chain inet pc pm-$i-post
add rule inet pc pm-$i-post ct status dnat ip daddr $ip ip saddr 10.0.0.0/8 meta l4proto tcp ct original proto-dst $port masquerade
add rule inet pc pm-$i-post ct status dnat ip daddr $ip ip saddr 127.0.0.1 meta l4proto tcp ct original proto-dst $port masquerade
add element inet pc anyports4 { tcp . $port : jump pm-$i-dnat }
add element inet pc snat4 { $ip : jump pm-$i-post }
add chain inet pc mq-$i
add rule inet pc mq-$i ip saddr $ip ip daddr != 10.0.0.0/8 ip daddr != 224.0.0.0/4 masquerade comment "masq4=$ip"
add element inet pc masq4 { $ip : jump mq-$i }
EOF
}

chains_setup() {
    cat <<'EOF'
add table inet pc
add map inet pc anyports4 { type inet_proto . inet_service : verdict; }
add map inet pc snat4 { type ipv4_addr : verdict; }
add map inet pc masq4 { type ipv4_addr : verdict; }
add chain inet pc dispatch
add rule inet pc dispatch meta nfproto ipv4 meta l4proto . th dport vmap @anyports4
EOF
    hooks pc
    cat <<'EOF'
add rule inet pc postrouting ct status dnat ip daddr vmap @snat4
add rule inet pc postrouting ip saddr vmap @masq4
EOF
}

# Without per-pod chains: a pod is set and map elements only, plus its owner record (the keys it
# holds, in the record's comment, so that DEL needs nothing but the container id). nft 1.0.6 does
# not take `ct original proto-dst` inside a concatenation, so the hairpin set here matches the
# DNATed tuple (pod address . protocol . container port . source); same kernel cost.
flat_pod() {
    local i=$1 ip port
    pod_addr "$i"
    flat_elements pf "$ip" "$port" "anydnat4=tcp . $port;snat4=$ip;masq4=$ip" \
        "snat4 { $ip . tcp . 80 . 10.0.0.0/8, $ip . tcp . 80 . 127.0.0.1 }" "masq4 { $ip }" \
        "masqlocal4 { $ip . 10.0.0.0/8, $ip . 224.0.0.0/4 }"
}

# A pod's lines in flat table $1 for address $2 and host port $3: its DNAT element, one element
# per argument after the fourth (`set { value }`), and its owner record with comment $4.
flat_elements() {
    local t=$1 ip=$2 port=$3 owner=$4 e
    shift 4
    echo "add element inet $t anydnat4 { tcp . $port : $ip . 80 }"
    for e in "$@"; do echo "add element inet $t $e"; done
    echo "add element inet $t owners { $ip . $port comment \"$owner\" }"
}

# What both flat layouts have in table $1: the DNAT map, the owner records, DNAT from `dispatch`.
flat_base() {
    cat <<EOF
add table inet $1
add map inet $1 anydnat4 { type inet_proto . inet_service : ipv4_addr . inet_service; }
add set inet $1 owners { type ipv4_addr . inet_service; }
add chain inet $1 dispatch
add rule inet $1 dispatch meta nfproto ipv4 dnat ip to meta l4proto . th dport map @anydnat4
EOF
    hooks "$1"
}

flat_setup() {
    flat_base pf
    cat <<'EOF'
add set inet pf snat4 { type ipv4_addr . inet_proto . inet_service . ipv4_addr; flags interval; }
add set inet pf masq4 { type ipv4_addr; }
add set inet pf masqlocal4 { type ipv4_addr . ipv4_addr; flags interval; }
add rule inet pf postrouting ct status dnat ip daddr . meta l4proto . th dport . ip saddr @snat4 masquerade
add rule inet pf postrouting ip saddr @masq4 ip saddr . ip daddr != @masqlocal4 masquerade
EOF
}

# The same without interval sets (the kernel's pipapo set rebuilds its lookup tables on every
# change, so a deletion there costs time that grows with the elements): the pod's subnet and
# localhost move into one rule per network (added once, with the network's first pod), and the pod
# adds elements to plain hash sets only.
flathash_pod() {
    local i=$1 ip port
    pod_addr "$i"
    flat_elements ph "$ip" "$port" "anydnat4=tcp . $port;snat4-n1=$ip . tcp . 80;masq4-n1=$ip" \
        "snat4-n1 { $ip . tcp . 80 }" "masq4-n1 { $ip }"
}

flathash_setup() {
    flat_base ph
    cat <<'EOF'
add set inet ph snat4-n1 { type ipv4_addr . inet_proto . inet_service; }
add set inet ph masq4-n1 { type ipv4_addr; }
add rule inet ph postrouting ct status dnat ip daddr . meta l4proto . th dport @snat4-n1 ip saddr 10.0.0.0/8 masquerade
add rule inet ph postrouting ct status dnat ip daddr . meta l4proto . th dport @snat4-n1 ip saddr 127.0.0.1 masquerade
add rule inet ph postrouting ip saddr @masq4-n1 ip daddr != 10.0.0.0/8 ip daddr != 224.0.0.0/4 masquerade
EOF
}

# Kernel time of the largest sendmsg of a command run in the namespace, in ms.
sendmsg_ms() {
    inns strace -qq -T -e trace=sendmsg -o "$WORK/st" "$@"
    awk -F'<' '/sendmsg/ { t = substr($NF, 1, length($NF) - 1) * 1000; if (t > m) m = t } END { printf "%.3f", m }' "$WORK/st"
}

# Kernel time of `nft -f FILE` (the batch), in ms.
batch_ms() { sendmsg_ms nft -f "$1"; }

# Kernel time of creating and of deleting a veth pair in the namespace, in ms.
link_ms() {
    echo "$(sendmsg_ms ip link add cnibp0 type veth peer name cnibp1) $(sendmsg_ms ip link del cnibp0)"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

printf '%-8s %7s | %-36s | %-36s\n' layout pods "one pod's ADD / DEL batch (ms)" "veth pair add / del (ms)"
for layout in chains flat flathash; do
    inns nft flush ruleset
    "${layout}_setup" >"$WORK/setup.nft"
    inns nft -f "$WORK/setup.nft"
    have=0
    for level in "${LEVELS[@]}"; do
        : >"$WORK/bulk.nft"
        for ((i = have; i < level; i++)); do "${layout}_pod" "$i" >>"$WORK/bulk.nft"; done
        inns nft -f "$WORK/bulk.nft"
        have=$level
        adds=() dels=() ladds=() ldels=()
        for ((k = 0; k < 9; k++)); do
            i=$((100000 + k))
            "${layout}_pod" "$i" >"$WORK/one.nft"
            adds+=("$(batch_ms "$WORK/one.nft")")
            if [ "$layout" = chains ]; then
                pod_addr "$i"
                cat >"$WORK/del.nft" <<EOF
delete element inet pc anyports4 { tcp . $port }
delete element inet pc snat4 { $ip }
delete element inet pc masq4 { $ip }
flush chain inet pc pm-$i-dnat
delete chain inet pc pm-$i-dnat
flush chain inet pc pm-$i-post
delete chain inet pc pm-$i-post
flush chain inet pc mq-$i
delete chain inet pc mq-$i
EOF
            else
                sed -e 's/^add element/delete element/' -e 's/ : [0-9.]* \. 80 }/ }/' -e 's/ comment ".*" }/ }/' "$WORK/one.nft" >"$WORK/del.nft"
            fi
            dels+=("$(batch_ms "$WORK/del.nft")")
            read -r la ld < <(link_ms)
            ladds+=("$la")
            ldels+=("$ld")
        done
        a=$(printf '%s\n' "${adds[@]}" | median)
        d=$(printf '%s\n' "${dels[@]}" | median)
        la=$(printf '%s\n' "${ladds[@]}" | median)
        ld=$(printf '%s\n' "${ldels[@]}" | median)
        printf '%-8s %7s | %17s / %-16s | %17s / %-16s\n' "$layout" "$level" "$a" "$d" "$la" "$ld"
    done
done
