#!/usr/bin/env bash
# One command for the benchmark of cni-rs against the reference Go plugins (docs/bench/README.md):
# builds the release plugins and the benchmark, installs the reference plugins if missing, and runs
# target/release/cni-bench as root, which writes docs/bench/{results.csv,latency.svg,scaling.svg}
# and the results block of docs/bench/README.md.
#
#   tests/bench.sh            # full: latency, churn, scaling at 10,100,500,1000 pods (~15 min)
#   tests/bench.sh --quick    # scaling at 10,100 only, fewer samples (~2 min)
#   tests/bench.sh --help     # every option
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
cargo build --release --workspace --bins
if [ ! -x /usr/lib/cni/bridge ]; then
    echo "bench: installing the reference plugins (containernetworking-plugins)" >&2
    apt-get install -y containernetworking-plugins >&2
fi
target="${CARGO_TARGET_DIR:-$repo/target}"
if [ "$(id -u)" -ne 0 ]; then
    exec sudo "$target/release/cni-bench" "$@"
fi
exec "$target/release/cni-bench" "$@"
