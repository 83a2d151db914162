#!/bin/bash
# NetworkPolicy enforcement by the node agent (docs/bench/README.md, "NetworkPolicy enforcement").
# In a fresh network namespace: the project's Kubernetes API stand-in
# (install/node/tests/k8s_standin.py, HTTPS + token), `nft monitor`, and one agent
# (`cni-rs-node --datastore kubernetes`), at two scales:
#   small: 10 pods, 5 policies;
#   large: 1,000 pods in 23 namespaces across 10 nodes (~100 on this node), 500 policies.
# For pod add, relabel and delete and policy add, update and delete (events posted one at a time to
# the stand-in's control port), the time until `nft monitor` shows the change in the kernel
# (p50, p99), the nf_tables changes of each event (elements, rules, table swaps) and the agent's
# CPU time per event; and the first sync (agent start to table, its sets, rules and elements).
# tests/bench/netpol_bench.py does the measuring; this script builds, sets up and cleans up.
# Every namespace, process and file it makes is removed at the end, also on error or Ctrl-C.
# Needs root, python3, nft (nftables), openssl, iproute2.
#
#   tests/bench/netpol-bench.sh [--pod-events N] [--policy-events N]   # default 200 and 100 of each
#   CNI_RS_NODE=path/to/cni-rs-node ...   # default: target/release/cni-rs-node (built)
#   NETPOL_BENCH_KEEP=1 ...               # keep the logs, objects and certificates
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
ARGS=("$@")
for tool in python3 nft openssl ip; do
    command -v "$tool" >/dev/null || { echo "netpol-bench: needs $tool (tests/setup.sh installs it)" >&2; exit 2; }
done
[ "$(id -u)" -eq 0 ] || { echo "netpol-bench: needs root (network namespaces, nf_tables)" >&2; exit 2; }
AGENT="${CNI_RS_NODE:-}"
if [ -z "$AGENT" ]; then
    (cd "$repo" && cargo build --release -q -p cni-rs-node)
    AGENT="${CARGO_TARGET_DIR:-$repo/target}/release/cni-rs-node"
fi

NODE=cnib-np$$
WORK=$(mktemp -d /tmp/cni-netpol-bench.XXXXXX)
PIDS="$WORK/pids"
: >"$PIDS"
HELPER=
cleanup() {
    set +e
    if [ -n "$HELPER" ]; then
        kill "$HELPER" 2>/dev/null
        wait "$HELPER" 2>/dev/null
    fi
    while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$PIDS"
    ip netns del "$NODE" 2>/dev/null || true
    if [ -n "${NETPOL_BENCH_KEEP:-}" ]; then echo "netpol-bench: logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The node: one namespace, its address on eth0 (one end of a veth pair whose other end stays in
# the namespace: no segment is needed, the stand-in serves on the node's address too).
NODE_IP=10.95.0.11
ip netns add "$NODE"
ip -n "$NODE" link set lo up
ip -n "$NODE" link add eth0 type veth peer name eth1
ip -n "$NODE" addr add "$NODE_IP/16" dev eth0
ip -n "$NODE" link set eth0 up
ip -n "$NODE" link set eth1 up

# A CA and the stand-in's certificate for $NODE_IP; a kubeconfig with the stand-in's token.
TOKEN=standin-token-0123456789
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${ec[@]}" -keyout "$WORK/ca.key" -out "$WORK/ca.crt" -days 1 -subj /CN=standin-ca 2>/dev/null
openssl req "${ec[@]}" -keyout "$WORK/srv.key" -out "$WORK/srv.csr" -subj /CN=standin 2>/dev/null
printf 'subjectAltName=IP:%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' \
    "$NODE_IP" >"$WORK/ext.cnf"
openssl x509 -req -in "$WORK/srv.csr" -CA "$WORK/ca.crt" -CAkey "$WORK/ca.key" -CAcreateserial \
    -out "$WORK/srv.crt" -days 1 -extfile "$WORK/ext.cnf" 2>/dev/null
cat >"$WORK/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: standin
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority-data: $(base64 -w0 "$WORK/ca.crt")
users:
- name: agent
  user:
    token: $TOKEN
contexts:
- name: standin
  context:
    cluster: standin
    user: agent
current-context: standin
EOF

start=$(date +%s)
ip netns exec "$NODE" python3 "$repo/tests/bench/netpol_bench.py" --agent "$AGENT" \
    --standin "$repo/install/node/tests/k8s_standin.py" --cert "$WORK/srv.crt" --key "$WORK/srv.key" \
    --token "$TOKEN" --kubeconfig "$WORK/kubeconfig" --work "$WORK" --pids "$PIDS" "${ARGS[@]}" >"$WORK/table.md" &
HELPER=$!
wait "$HELPER"
HELPER=

echo "Measured $(date -u '+%Y-%m-%d %H:%M UTC') · $(nproc) CPUs · Linux $(uname -r) · cni-rs $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?') · $(basename "$(dirname "$AGENT")") build · run time $(($(date +%s) - start)) s"
echo "Command: \`${CNI_RS_NODE:+CNI_RS_NODE=$CNI_RS_NODE }tests/bench/netpol-bench.sh${ARGS[*]:+ ${ARGS[*]}}\`"
echo
cat "$WORK/table.md"
