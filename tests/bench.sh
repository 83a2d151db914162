#!/usr/bin/env bash
# One command for the benchmark of cni-rs against the reference Go plugins (docs/bench/README.md):
# builds the benchmark (release), the static multi-call binary and the floor, installs the reference
# plugins if missing, and runs
# target/release/cni-bench as root, which writes docs/bench/{results.csv,latency.svg,scaling.svg}
# and the results block of docs/bench/README.md.
#
#   tests/bench.sh            # full: latency, churn, scaling at 10,100,500,1000 pods (~15 min)
#   tests/bench.sh --quick    # scaling at 10,100 only, fewer samples (~2 min)
#   tests/bench.sh --help     # every option
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
# cni-bench and its helpers (cni-peak); the plugins measured are the static build below.
cargo build --release -p cni-bench --bins
if [ ! -x /usr/lib/cni/bridge ]; then
    echo "bench: installing the reference plugins (containernetworking-plugins)" >&2
    apt-get install -y containernetworking-plugins >&2
fi
target="${CARGO_TARGET_DIR:-$repo/target}"
# Ours as a node gets it from install/: the multi-call cni-rs, static musl, one hard link per
# plugin name (cni-bench lays the links out from this directory).
triple="$(install/static-target.sh --install)"
RUSTFLAGS="$(install/static-target.sh --rustflags)" cargo build --release --target "$triple" -p cni-rs
# The floor the same way, so its start-up is no heavier than ours.
RUSTFLAGS="$(install/static-target.sh --rustflags)" cargo build --release --target "$triple" -p cni-bench --bin cni-floor
floor="$target/$triple/release/cni-floor"
ours="$target/bench-ours"
rm -rf "$ours" && mkdir -p "$ours"
cp "$target/$triple/release/cni-rs" "$ours/cni-rs"
for p in bridge host-local loopback portmap firewall ptp macvlan bandwidth tuning; do ln "$ours/cni-rs" "$ours/$p"; done
if [ "$(id -u)" -ne 0 ]; then
    exec sudo env CNI_BENCH_OURS="$ours" CNI_BENCH_FLOOR="$floor" "$target/release/cni-bench" "$@"
fi
CNI_BENCH_OURS="$ours" CNI_BENCH_FLOOR="$floor" exec "$target/release/cni-bench" "$@"
