#!/bin/bash
# The node agent at scale (docs/bench/README.md, "The node agent at scale"). For each level N:
# N other nodes' blocks in a real etcd, one agent (cni-rs-node, --backend host-gw) in a node
# namespace, and
#   - the first sync: the agent's own measure of the sync that programs the N routes
#     ("routes synced in X ms"), the median of three runs from an empty routing table;
#   - one node joining and then leaving: the netlink messages the agent exchanges with the
#     kernel for each (requests it sends and messages it receives, acknowledgements and dump
#     entries included), counted by strace on the agent's netlink sockets, which does not rely
#     on the agent's own bookkeeping.
# Every namespace, process and file it makes is removed at the end, also on error or Ctrl-C.
# Needs root, etcd and etcdctl (etcd-server, etcd-client), curl, strace, iproute2.
#
#   tests/bench/node-scale.sh [levels]      # default: 10 100 1000
#   CNI_RS_NODE=path/to/cni-rs-node ...     # default: target/release/cni-rs-node (built if missing)
#   NODE_SCALE_KEEP=1 ...                   # keep the agents' logs and the strace output
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
LEVELS=("${@:-10 100 1000}")
# shellcheck disable=SC2206
LEVELS=(${LEVELS[*]})
for tool in etcd etcdctl curl strace ip base64; do
    command -v "$tool" >/dev/null || { echo "node-scale: needs $tool (tests/setup.sh installs it)" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "node-scale: needs root (network namespaces)" >&2; exit 2; }
AGENT="${CNI_RS_NODE:-}"
if [ -z "$AGENT" ]; then
    AGENT="${CARGO_TARGET_DIR:-$repo/target}/release/cni-rs-node"
    [ -x "$AGENT" ] || (cd "$repo" && cargo build --release -q -p cni-rs-node)
fi

TAG=$$
SEG=cnib-seg$TAG
NODE=cnib-node$TAG
WORK=$(mktemp -d /tmp/cni-node-scale.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    ip netns del "$NODE" 2>/dev/null || true
    ip netns del "$SEG" 2>/dev/null || true
    if [ -n "${NODE_SCALE_KEEP:-}" ]; then echo "node-scale: logs and traces kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "$SEG"
ip netns add "$NODE"
ip -n "$SEG" link set lo up
ip -n "$NODE" link set lo up
ip -n "$SEG" link add br0 type bridge
ip -n "$SEG" addr add 10.95.0.1/16 dev br0
ip -n "$SEG" link set br0 up
ip -n "$NODE" link add eth0 type veth peer name p0 netns "$SEG"
ip -n "$SEG" link set p0 master br0 up
ip -n "$NODE" addr add 10.95.0.11/16 dev eth0
ip -n "$NODE" link set eth0 up

URL=http://10.95.0.1:2379
ip netns exec "$SEG" etcd --name bench --data-dir "$WORK/etcd" --listen-client-urls "$URL" \
    --advertise-client-urls "$URL" --listen-peer-urls http://10.95.0.1:2380 \
    --initial-advertise-peer-urls http://10.95.0.1:2380 --initial-cluster bench=http://10.95.0.1:2380 \
    >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
etcdctl() { ip netns exec "$SEG" etcdctl --endpoints "$URL" "$@"; }
for _ in $(seq 100); do etcdctl endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
etcdctl endpoint health >/dev/null 2>&1 || { echo "node-scale: etcd did not start:" >&2; tail "$WORK/etcd.log" >&2; exit 1; }

# Node j: block j of 10.240.0.0/12 in /24s, address 10.95.x.y on the segment.
block() { echo "10.$((240 + $1 / 256)).$(($1 % 256)).0/24"; }
record() {
    printf '{"node":"s%d","nodeIPs":["10.95.%d.%d"],"podCIDRs":["%s"]}' "$1" $((1 + $1 / 250)) $((1 + $1 % 250)) "$(block "$1")"
}
key() { echo "/cni-rs/subnets/$(block "$1" | tr / -)"; }
b64() { printf '%s' "$1" | base64 -w0; }
# Records 1..n, through etcd's JSON gateway in one curl process.
load() {
    local from=$1 to=$2 conf="$WORK/curl.conf"
    : >"$conf"
    for ((j = from; j <= to; j++)); do
        ((j > from)) && echo next >>"$conf"
        printf 'url = "%s/v3/kv/put"\ndata = "{\\"key\\":\\"%s\\",\\"value\\":\\"%s\\"}"\noutput = "/dev/null"\n' \
            "$URL" "$(b64 "$(key "$j")")" "$(b64 "$(record "$j")")" >>"$conf"
    done
    ip netns exec "$SEG" curl -sSf -K "$conf"
}

AGENT_ARGS=(--node-name n0 --etcd-endpoints "$URL" --cluster-cidr 10.240.0.0/12 --node-ip 10.95.0.11
    --backend host-gw --no-plugins --conf-dir "$WORK/net.d" --metrics-addr 127.0.0.1:0)
AGENT_PID=
start_agent() { # log, then the command prefix (e.g. strace ...)
    local log=$1
    shift
    : >"$log"
    ip netns exec "$NODE" "$@" "$AGENT" "${AGENT_ARGS[@]}" >"$log" 2>&1 &
    AGENT_PID=$!
    PIDS+=("$AGENT_PID")
}
stop_agent() { # the agent itself: strace started with a command and -o ignores SIGTERM
    local child
    child=$(pgrep -P "$AGENT_PID" -x cni-rs-node || true)
    kill -TERM "${child:-$AGENT_PID}" 2>/dev/null || true
    wait "$AGENT_PID" 2>/dev/null || true
}
# Waits for a "routes synced" line with `wanted` routes that has not been seen before (the
# count of such lines goes above `seen`); prints the line.
wait_synced() {
    local log=$1 wanted=$2 seen=$3 line
    for _ in $(seq 600); do
        line=$(grep "^routes synced in .*: $wanted wanted, .*)$" "$log" | sed -n "$((seen + 1))p" || true)
        [ -n "$line" ] && { echo "$line"; return; }
        sleep 0.1
    done
    echo "node-scale: no sync of $wanted routes in 60 s; agent log:" >&2
    tail -20 "$log" >&2
    exit 1
}
# Netlink messages in strace lines from+1..to: (sent, received). An acknowledgement quotes the
# header of the request it answers (`{error=0, msg={nlmsg_len=...}}`): that is not a message.
count() {
    sed -n "$(($1 + 1)),$2p" "$3" | grep 'NETLINK' | awk '
        { gsub(/msg=\{nlmsg_len=[0-9]+, nlmsg_type=/, "msg={") }
        /^[0-9]+ +(sendto|sendmsg)\(/ { s += gsub(/nlmsg_type=[A-Z]/, "&") }
        /^[0-9]+ +(recvfrom|recvmsg)\(/ { r += gsub(/nlmsg_type=[A-Z]/, "&") }
        END { printf "%d %d\n", s, r }'
}
flush_routes() {
    ip -n "$NODE" route flush proto 210 2>/dev/null || true
    [ -z "$(ip -n "$NODE" route show proto 210)" ] || { echo "node-scale: routes of proto 210 left" >&2; exit 1; }
}
settle() { # waits until the strace output stops growing
    local file=$1 size=-1
    while [ "$(stat -c %s "$file")" != "$size" ]; do
        size=$(stat -c %s "$file")
        sleep 0.5
    done
}

ROWS=()
loaded=0
for n in "${LEVELS[@]}"; do
    ((n > loaded)) && load $((loaded + 1)) "$n"
    ((n < loaded)) && for ((j = n + 1; j <= loaded; j++)); do etcdctl del "$(key "$j")" >/dev/null; done
    loaded=$n
    times=()
    for run in 1 2 3; do
        flush_routes
        log="$WORK/agent-$n-$run.log"
        start_agent "$log"
        line=$(wait_synced "$log" "$n" 0)
        stop_agent
        case "$line" in *" $n added, 0 removed, 0 errors"*) ;; *) echo "node-scale: $line" >&2; exit 1 ;; esac
        times+=("$(echo "$line" | awk '{print $4}')")
    done
    first=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)

    flush_routes
    log="$WORK/agent-$n-strace.log"
    trace="$WORK/strace-$n"
    start_agent "$log" strace -f -qq -yy -s 65536 -e trace=sendto,sendmsg,recvfrom,recvmsg -o "$trace"
    wait_synced "$log" "$n" 0 >/dev/null
    settle "$trace"
    l0=$(wc -l <"$trace")
    etcdctl put "$(key $((n + 1)))" "$(record $((n + 1)))" >/dev/null
    join=$(wait_synced "$log" $((n + 1)) 0)
    settle "$trace"
    l1=$(wc -l <"$trace")
    etcdctl del "$(key $((n + 1)))" >/dev/null
    leave=$(wait_synced "$log" "$n" 1)
    settle "$trace"
    l2=$(wc -l <"$trace")
    stop_agent
    case "$join" in *"0 removed, 0 errors"*) ;; *) echo "node-scale: join: $join" >&2; exit 1 ;; esac
    case "$leave" in *"0 added, 1 removed, 0 errors"*) ;; *) echo "node-scale: leave: $leave" >&2; exit 1 ;; esac
    read -r js jr <<<"$(count "$l0" "$l1" "$trace")"
    read -r ls lr <<<"$(count "$l1" "$l2" "$trace")"
    routes=$(ip -n "$NODE" -4 route show proto 210 | wc -l)
    [ "$routes" -eq "$n" ] || { echo "node-scale: $routes routes after the leave, not $n" >&2; exit 1; }
    ROWS+=("| $n | $first (${times[*]}) | $js sent, $jr received | $ls sent, $lr received |")
    echo "node-scale: level $n done" >&2
done

echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') · $(nproc) CPUs · Linux $(uname -r) · cni-rs $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?') · $(basename "$(dirname "$AGENT")") build"
echo "Command: \`${CNI_RS_NODE:+CNI_RS_NODE=$CNI_RS_NODE }tests/bench/node-scale.sh ${LEVELS[*]}\`"
echo
echo "| other nodes | first sync, ms (median of 3 runs) | one node joins: netlink messages | one node leaves: netlink messages |"
echo "|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
