#!/usr/bin/env bash
# Builds the cni-rs installer image FROM scratch out of statically linked binaries.
# No base image is pulled, so this works without access to any registry.
#
#   install/build-image.sh                 # static release build, then podman build
#
# Environment:
#   CNI_RS_IMAGE        tag to build                (default cni-rs-installer:dev)
#   CNI_RS_BIN_DIR      dir of prebuilt static binaries (cni-installer + plugins); skips cargo
#   CNI_RS_CONTEXT_DIR  where to stage the build context (default: a temp dir, removed afterwards)
#   CNI_RS_PLUGINS      plugins to ship when present (default "bridge loopback host-local portmap")
#   PODMAN              podman command line (default "podman"), e.g.
#                       "podman --runtime runc --cgroup-manager=cgroupfs --events-backend=file"
#   CARGO, CARGO_TARGET_DIR  honoured as usual
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${CNI_RS_IMAGE:-cni-rs-installer:dev}"
plugins="${CNI_RS_PLUGINS:-bridge loopback host-local portmap}"
podman_cmd="${PODMAN:-podman}"
cargo_cmd="${CARGO:-cargo}"
triple=x86_64-unknown-linux-gnu

if [ -n "${CNI_RS_BIN_DIR:-}" ]; then
    bin_dir="$CNI_RS_BIN_DIR"
else
    # --target keeps crt-static away from build scripts and proc macros, which must stay dynamic.
    packages=(-p cni-installer)
    for plugin in $plugins; do packages+=(-p "$plugin"); done
    echo "build-image: static release build of cni-installer $plugins" >&2
    (cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" \
        "$cargo_cmd" build --release --target "$triple" "${packages[@]}")
    bin_dir="${CARGO_TARGET_DIR:-$repo/target}/$triple/release"
fi

if [ -n "${CNI_RS_CONTEXT_DIR:-}" ]; then
    ctx="$CNI_RS_CONTEXT_DIR"
    mkdir -p "$ctx"
else
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"' EXIT
fi
rm -rf "$ctx/bin" "$ctx/conf" "$ctx/cni-installer"
mkdir -p "$ctx/bin" "$ctx/conf"

require_static() {
    if ! command -v file >/dev/null 2>&1; then
        echo "build-image: 'file' not installed; cannot check that $1 is static" >&2
        return 0
    fi
    local kind
    kind="$(file -bL "$1")"
    case "$kind" in
        *"statically linked"* | *"static-pie linked"*) ;;
        *) echo "build-image: $1 is not statically linked ($kind); build with" \
                "RUSTFLAGS=\"-C target-feature=+crt-static\" --target $triple" >&2
           exit 1 ;;
    esac
}

[ -f "$bin_dir/cni-installer" ] || { echo "build-image: $bin_dir/cni-installer not found" >&2; exit 1; }
require_static "$bin_dir/cni-installer"
install -m 0755 "$bin_dir/cni-installer" "$ctx/cni-installer"

shipped=()
for plugin in $plugins; do
    if [ -f "$bin_dir/$plugin" ]; then
        require_static "$bin_dir/$plugin"
        install -m 0755 "$bin_dir/$plugin" "$ctx/bin/$plugin"
        shipped+=("$plugin")
    else
        echo "build-image: warning: plugin $plugin not built yet; image will not ship it" >&2
    fi
done
if ((${#shipped[@]} == 0)); then
    echo "build-image: none of the plugins ($plugins) exist in $bin_dir" >&2
    exit 1
fi
install -m 0644 "$repo/install/conf/10-cni-rs.conflist.template" "$ctx/conf/"

echo "build-image: building $image with plugins: ${shipped[*]}" >&2
# shellcheck disable=SC2086 # PODMAN is a command line on purpose
$podman_cmd build --quiet --layers=false -f "$repo/install/Containerfile" -t "$image" "$ctx" >/dev/null
# shellcheck disable=SC2086
$podman_cmd image inspect --format "build-image: built {{.Id}} ({{.Size}} bytes)" "$image" >&2
