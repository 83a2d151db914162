#!/usr/bin/env bash
# Builds the cni-rs installer image FROM scratch out of statically linked binaries.
# No base image is pulled, so this works without access to any registry.
#
#   install/build-image.sh                 # static release build, then podman build
#   install/build-image.sh --build-only    # the static build alone (tests/run.sh starts it early)
#
# The image ships the multi-call binary cni-rs once, with the manifest /opt/cni-rs/bin/.plugins
# naming the plugins the installer links to it on the node (one hard link per name).
#
# Environment:
#   CNI_RS_IMAGE        tag to build                (default cni-rs-installer:dev)
#   CNI_RS_BIN_DIR      dir of prebuilt static binaries (cni-installer, cni-rs, cni-rs-node); skips cargo
#   CNI_RS_AGENT_PROFILE  cargo profile of cni-installer and cni-rs-node (default release); the image
#                       test uses image-test (Cargo.toml), which compiles in a fraction of the time.
#                       cni-rs is always the release build: it is what a node runs.
#   CNI_RS_CONTEXT_DIR  where to stage the build context (default: a temp dir, removed afterwards)
#   CNI_RS_PLUGINS      plugin names to install as links to cni-rs (default: every plugin the
#                       built binary is, as `cni-rs --plugins` prints them; each is checked to run)
#   PODMAN              podman command line (default "podman"), e.g.
#                       "podman --runtime runc --cgroup-manager=cgroupfs --events-backend=file"
#   CARGO, CARGO_TARGET_DIR  honoured as usual
set -euo pipefail
build_only=false
case "${1:-}" in
    --build-only) build_only=true ;;
    "") ;;
    *) echo "usage: install/build-image.sh [--build-only]" >&2; exit 2 ;;
esac
repo="$(cd "$(dirname "$0")/.." && pwd)"
image="${CNI_RS_IMAGE:-cni-rs-installer:dev}"
podman_cmd="${PODMAN:-podman}"
cargo_cmd="${CARGO:-cargo}"
triple=x86_64-unknown-linux-gnu
# The plugins start once per pod and verb, so their binary is built for the target that starts
# fastest (static musl); the installer and the node agent start once per node (static glibc).
plugins_triple="$("$repo/install/static-target.sh" --install)"

# Run from a test (cargo test), this script inherits what cargo sets for the test process
# (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, OUT_DIR, ...). Some build scripts (ring's) ask to be rerun
# when those change, so with them set the build would redo what tests/run.sh built beforehand.
while read -r var; do
    case "$var" in
        CARGO_MANIFEST_* | CARGO_PKG_* | CARGO_CRATE_NAME | CARGO_BIN_* | CARGO_PRIMARY_PACKAGE | \
            CARGO_TARGET_TMPDIR | CARGO_RUSTC_CURRENT_DIR | OUT_DIR) unset "$var" ;;
    esac
done < <(compgen -e)

agent_profile="${CNI_RS_AGENT_PROFILE:-release}"
case "$agent_profile" in
    dev | test) agent_profile_dir=debug ;;
    bench) agent_profile_dir=release ;;
    "" | */* | .*) echo "build-image: CNI_RS_AGENT_PROFILE=$agent_profile is not a cargo profile" >&2; exit 1 ;;
    *) agent_profile_dir="$agent_profile" ;;
esac

if [ -n "${CNI_RS_BIN_DIR:-}" ]; then
    "$build_only" && { echo "build-image: --build-only with CNI_RS_BIN_DIR set has nothing to build" >&2; exit 2; }
    bin_dir="$CNI_RS_BIN_DIR"
    plugins_bin_dir="$CNI_RS_BIN_DIR"
else
    # --target keeps crt-static away from build scripts and proc macros, which must stay dynamic.
    echo "build-image: static $agent_profile build of cni-installer cni-rs-node ($triple)," \
        "static release build of cni-rs ($plugins_triple)" >&2
    (cd "$repo" && RUSTFLAGS="-C target-feature=+crt-static" \
        "$cargo_cmd" build --profile "$agent_profile" --target "$triple" -p cni-installer -p cni-rs-node)
    (cd "$repo" && RUSTFLAGS="$("$repo/install/static-target.sh" --rustflags)" \
        "$cargo_cmd" build --release --target "$plugins_triple" -p cni-rs)
    bin_dir="${CARGO_TARGET_DIR:-$repo/target}/$triple/$agent_profile_dir"
    plugins_bin_dir="${CARGO_TARGET_DIR:-$repo/target}/$plugins_triple/release"
    "$build_only" && exit 0
fi

if [ -n "${CNI_RS_CONTEXT_DIR:-}" ]; then
    ctx="$CNI_RS_CONTEXT_DIR"
    mkdir -p "$ctx"
else
    ctx="$(mktemp -d)"
    trap 'rm -rf "$ctx"' EXIT
fi
rm -rf "$ctx/bin" "$ctx/conf" "$ctx/cni-installer" "$ctx/cni-rs-node"
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
        *) echo "build-image: $1 is not statically linked ($kind); build cni-rs with --target" \
                "$plugins_triple, the others with RUSTFLAGS=\"-C target-feature=+crt-static\" --target $triple" >&2
           exit 1 ;;
    esac
}

[ -f "$bin_dir/cni-installer" ] || { echo "build-image: $bin_dir/cni-installer not found" >&2; exit 1; }
require_static "$bin_dir/cni-installer"
install -m 0755 "$bin_dir/cni-installer" "$ctx/cni-installer"

[ -f "$bin_dir/cni-rs-node" ] || { echo "build-image: $bin_dir/cni-rs-node not found" >&2; exit 1; }
require_static "$bin_dir/cni-rs-node"
install -m 0755 "$bin_dir/cni-rs-node" "$ctx/cni-rs-node"

[ -f "$plugins_bin_dir/cni-rs" ] || { echo "build-image: $plugins_bin_dir/cni-rs not found" >&2; exit 1; }
require_static "$plugins_bin_dir/cni-rs"
# The binary names its plugins (libcni's registry), so no list here can fall behind it.
if [ -n "${CNI_RS_PLUGINS:-}" ]; then
    plugins="$CNI_RS_PLUGINS"
elif ! plugins="$("$plugins_bin_dir/cni-rs" --plugins)"; then
    echo "build-image: $plugins_bin_dir/cni-rs --plugins failed: it cannot name its plugins" >&2
    exit 1
fi
# cni-rs picks the plugin by the name it runs under, so run it under each name (bash's exec -a
# sets argv[0]): a name it does not know must not reach a node.
for plugin in $plugins; do
    case "$plugin" in
        cni-rs | .* | */* ) echo "build-image: $plugin is not a plugin name" >&2; exit 1 ;;
    esac
    if ! version="$(export CNI_COMMAND=VERSION; exec -a "$plugin" "$plugins_bin_dir/cni-rs" </dev/null 2>&1)" ||
        [[ "$version" != *'"supportedVersions"'* ]]; then
        echo "build-image: cni-rs does not run as $plugin: $version" >&2
        exit 1
    fi
done
[ -n "${plugins// /}" ] || { echo "build-image: no plugin names (CNI_RS_PLUGINS is empty, or cni-rs --plugins printed none)" >&2; exit 1; }
install -m 0755 "$plugins_bin_dir/cni-rs" "$ctx/bin/cni-rs"
# shellcheck disable=SC2086 # one name per word
printf '%s\n' $plugins >"$ctx/bin/.plugins"
chmod 0644 "$ctx/bin/.plugins"
install -m 0644 "$repo/install/conf/10-cni-rs.conflist.template" "$ctx/conf/"

echo "build-image: building $image with cni-rs as:" $plugins >&2
# shellcheck disable=SC2086 # PODMAN is a command line on purpose
$podman_cmd build --quiet --layers=false -f "$repo/install/Containerfile" -t "$image" "$ctx" >/dev/null
# shellcheck disable=SC2086
$podman_cmd image inspect --format "build-image: built {{.Id}} ({{.Size}} bytes)" "$image" >&2
