#!/usr/bin/env bash
# The test command: installs what the tests need, builds every binary, runs every test (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: the privileged tests need root (network namespaces, bridges, firewall rules)" >&2
    exit 1
fi
tests/setup.sh
# The installer image test's static builds (install/build-image.sh: cni-rs in release, fat LTO; the
# installer and the node agent in the image-test profile) are the slowest builds of the run, and
# they lock target dirs of their own (target/release, target/image-test and their --target twins),
# not target/debug. Started now at the lowest priority, they take the CPU that the builds below and
# the tests waiting on the kernel, podman, containerd or a VM leave idle; the image test runs the
# same commands, which wait for this build and find it done (or show its errors).
CNI_RS_AGENT_PROFILE=image-test setsid nice -n 19 install/build-image.sh --build-only >/dev/null 2>&1 &
prebuild=$!
log=$(mktemp)
# A run filtered to a few tests may end first: stop the build rather than leave it running.
trap 'kill -- -"$prebuild" 2>/dev/null || true; rm -f "$log"' EXIT
# Integration tests exec the plugins from target/debug, so build every binary first.
cargo build --workspace --bins
# The VM tests boot a static cni-rs (tests/vm/build.sh): build it before the clock of any test starts.
tests/vm/build.sh >/dev/null
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "summary: %d passed, %d failed\n", p, f }' "$log"
exit "$rc"
