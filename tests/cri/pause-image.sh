#!/usr/bin/env bash
# Builds the CRI test's sandbox ("pause") image with no registry: an OCI image layout tarball whose
# one layer holds a static busybox, with `busybox sleep infinity` as its entrypoint (the sandbox only
# has to hold the pod's namespaces open). Import it with `ctr -n k8s.io images import OUT.tar`; the
# image is then named NAME (the io.containerd.image.name annotation).
#
#   tests/cri/pause-image.sh OUT.tar NAME      e.g. NAME=localhost/cnirs-pause:test
set -euo pipefail
out=$1
name=$2
busybox=${BUSYBOX:-/bin/busybox}
case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) arch=$(uname -m) ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rootfs/bin" "$work/layout/blobs/sha256"
cp "$busybox" "$work/rootfs/bin/busybox"
ln -s busybox "$work/rootfs/bin/sh"
ln -s busybox "$work/rootfs/bin/sleep"

# blob FILE: moves FILE into the layout under its digest; prints "digest size".
blob() {
    local sum size
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    size=$(stat -c %s "$1")
    mv "$1" "$work/layout/blobs/sha256/$sum"
    echo "sha256:$sum $size"
}

# The layer is an uncompressed tar, so its diff_id is its digest.
tar -C "$work/rootfs" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$work/layer.tar" .
read -r layer layer_size < <(blob "$work/layer.tar")

printf '{"architecture":"%s","os":"linux","config":{"Entrypoint":["/bin/busybox","sleep","infinity"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]}}' \
    "$arch" "$layer" >"$work/config.json"
read -r config config_size < <(blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"%s","size":%s}]}' \
    "$config" "$config_size" "$layer" "$layer_size" >"$work/manifest.json"
read -r manifest manifest_size < <(blob "$work/manifest.json")

printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"%s","size":%s,"platform":{"architecture":"%s","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
    "$manifest" "$manifest_size" "$arch" "$name" "${name##*:}" >"$work/layout/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"

tar -C "$work/layout" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$out" .
