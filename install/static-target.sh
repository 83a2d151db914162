#!/usr/bin/env bash
# How the node's cni-rs is built: static musl, not position-independent. Every pod ADD and DEL
# starts a plugin process, and start-up is most of a plugin's own time (docs/bench/README.md, "A
# plugin process starts fast"): static glibc probes the CPU with some 40 cpuid instructions, each a VM exit on a
# virtual machine, and a static-pie binary relocates itself (~2,400 relocations, a dozen
# copy-on-write page faults) before main. The reference plugins are not PIE either.
#
#   install/static-target.sh             # the target triple
#   install/static-target.sh --install   # the same, adding its standard library with rustup first if missing
#   install/static-target.sh --rustflags # the RUSTFLAGS of the build
set -euo pipefail
triple=x86_64-unknown-linux-musl
case "${1:-}" in
    --rustflags)
        echo "-C relocation-model=static"
        exit 0 ;;
    --install)
        sysroot="$("${RUSTC:-rustc}" --print sysroot)"
        if [ ! -d "$sysroot/lib/rustlib/$triple/lib" ]; then
            command -v rustup >/dev/null 2>&1 ||
                { echo "static-target: the $triple standard library is missing and there is no rustup to add it" >&2; exit 1; }
            echo "static-target: rustup target add $triple" >&2
            rustup target add "$triple" >&2
        fi ;;
    "") ;;
    *) echo "usage: install/static-target.sh [--install | --rustflags]" >&2; exit 2 ;;
esac
echo "$triple"
