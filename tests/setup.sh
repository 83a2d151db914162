#!/usr/bin/env bash
# Installs every system package the tests need (Debian), or with --demo only what tests/demo.sh
# needs. Safe to re-run. The Rust toolchain comes from rustup, not from here: Debian's rustc is
# older than the workspace's rust-version.
set -euo pipefail
demo=false
[ "${1:-}" = --demo ] && demo=true
# rustc the build needs: the plugins and cnitool (the demo) 1.83, the node agent (the tests) 1.89.
if $demo; then need_rust=1.83; else need_rust=1.89; fi
have_rust=$(rustc --version 2>/dev/null | awk '{print $2}')
if [ -z "$have_rust" ] || [ "$(printf '%s\n%s\n' "$need_rust" "$have_rust" | sort -V | head -n 1)" != "$need_rust" ]; then
    echo "setup: rustc ${have_rust:-(none found)} is older than the $need_rust this build needs: install a" \
        "toolchain with rustup (https://rustup.rs) and put ~/.cargo/bin on PATH" >&2
    exit 1
fi
if $demo; then
    pkgs=(iproute2 nftables busybox-static curl)
else
    pkgs=(iproute2 iptables nftables conntrack socat curl busybox-static podman runc containerd
          containernetworking-plugins python3-pip file qemu-system-x86 xz-utils
          etcd-server etcd-client protobuf-compiler libprotobuf-dev strace openssl python3
          dnsmasq-base systemd ethtool tcpdump wireguard-tools
          # setpriv and unshare: install/node/tests/daemonset_pod.rs runs the agent with only the
          # DaemonSet's capabilities and a read-only root and /proc/sys (Essential, listed for clarity).
          util-linux)
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
$demo && exit 0
if ! command -v kubernetes-validate >/dev/null 2>&1; then
    echo "setup: installing kubernetes-validate from PyPI" >&2
    pip install -q kubernetes-validate 2>/dev/null || pip install -q --break-system-packages kubernetes-validate
fi
# The CRI end-to-end test's client (tests/cri/cri.py): grpcio, and grpcio-tools to load api.proto.
if ! python3 -c "import grpc, grpc_tools" >/dev/null 2>&1; then
    echo "setup: installing grpcio and grpcio-tools from PyPI" >&2
    pip install -q grpcio grpcio-tools 2>/dev/null || pip install -q --break-system-packages grpcio grpcio-tools
fi
# The multi-call cni-rs as a node gets it is static musl (install/static-target.sh): its Rust
# standard library, from rustup.
"$(dirname "$0")/../install/static-target.sh" --install >/dev/null
# The VM tests (tests/vm/): Debian's kernel, unpacked into /var/tmp/cni-rs-vm once (~70 MB download).
"$(dirname "$0")/vm/vmtest.sh" --prepare
