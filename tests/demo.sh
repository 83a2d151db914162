#!/usr/bin/env bash
# The main job, end to end: build, make a demo pod namespace, ADD it through cnitool with
# conf/demo.conflist (bridge + host-local + portmap + loopback), show its address, routes and a
# mapped port answering, then DEL it and show that nothing is left. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "demo: run as root (it makes a network namespace and a bridge)" >&2; exit 1; }
tests/setup.sh --demo
cargo build --release -q -p bridge -p host-local -p loopback -p portmap -p cnitool
bin="$PWD/target/release"
pod="cnirs-demo-$$"
nspath="/run/netns/$pod"
httpd_pid=""
bridge_was_there=$(ip link show cnirs-demo0 >/dev/null 2>&1 && echo yes || echo no)
# The conflist's dataDir (host-local's reservations) and the web root live under this directory.
state_was_there=$([ -e /run/cni-rs-demo ] && echo yes || echo no)
# portmap's and the bridge's masquerade nftables tables stay for the next pod, as the bridge does.
new_tables=()
for t in cni_rs_portmap cni_rs_masq; do
    nft list table inet "$t" >/dev/null 2>&1 || new_tables+=("$t")
done
cleanup() {
    [ -n "$httpd_pid" ] && kill "$httpd_pid" 2>/dev/null || true
    if [ -e "$nspath" ]; then
        NETCONFPATH="$PWD/conf" CNI_PATH="$bin" "$bin/cnitool" del cni-rs-demo "$nspath" 2>/dev/null || true
        ip netns del "$pod" 2>/dev/null || true
    fi
    # The bridge plugin keeps a bridge for the next pod, as the reference does; the demo leaves none.
    [ "$bridge_was_there" = no ] && ip link del cnirs-demo0 2>/dev/null || true
    rm -rf /run/cni-rs-demo/www
    [ "$state_was_there" = no ] && rm -rf /run/cni-rs-demo || true
    for t in "${new_tables[@]}"; do nft delete table inet "$t" 2>/dev/null || true; done
}
trap cleanup EXIT

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "create the pod's network namespace $pod"
ip netns add "$pod"

step "cnitool add cni-rs-demo $nspath (hostPort 8080 -> containerPort 80)"
export NETCONFPATH="$PWD/conf" CNI_PATH="$bin" CAP_ARGS='{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}'
"$bin/cnitool" add cni-rs-demo "$nspath"
echo   # cnitool prints the result as upstream's does, without a final newline

step "addresses in the pod"
ip -n "$pod" -br addr
step "routes in the pod"
ip -n "$pod" route
ip -n "$pod" -6 route | grep -v '^fe80' || true

step "an HTTP server in the pod, reached through the mapped port"
mkdir -p /run/cni-rs-demo/www
echo "hello from pod $pod" > /run/cni-rs-demo/www/index.html
ip netns exec "$pod" busybox httpd -f -p 80 -h /run/cni-rs-demo/www &
httpd_pid=$!
pod_ip=$(ip -n "$pod" -4 -o addr show eth0 | awk '{print $4}' | cut -d/ -f1)
gw_ip=$(ip -4 -o addr show cnirs-demo0 | awk '{print $4}' | cut -d/ -f1)
for i in $(seq 50); do curl -s -o /dev/null "http://$pod_ip:80/" && break; sleep 0.1; done
echo "curl http://127.0.0.1:8080/ ->  $(curl -s --max-time 5 http://127.0.0.1:8080/)"
echo "curl http://$gw_ip:8080/ ->  $(curl -s --max-time 5 "http://$gw_ip:8080/")"
kill "$httpd_pid"; wait "$httpd_pid" 2>/dev/null || true; httpd_pid=""

step "cnitool del cni-rs-demo $nspath"
"$bin/cnitool" del cni-rs-demo "$nspath"
ip netns del "$pod"
step "what is left: reservations, rules, ports on the bridge"
echo "reservations: $(ls /run/cni-rs-demo/ipam/cni-rs-demo 2>/dev/null | grep -cv -e lock -e last_reserved || true)"
echo "ports on cnirs-demo0: $(ip -br link show master cnirs-demo0 | wc -l)"
echo "nft rules naming $pod_ip: $(nft list ruleset 2>/dev/null | grep -c "$pod_ip" || true)"
echo "demo: done"
