#!/usr/bin/env bash
# vmtest.sh: boots Debian's own kernel under QEMU from a throwaway initramfs and runs a bash script
# in it as root, for the link types the host kernel lacks (dummy, 8021q, ipvlan, vrf, bonding,
# bridge VLAN filtering). Nothing on the host changes but the cache.
#
#   tests/vm/vmtest.sh --prepare
#       fetch and unpack the kernel into the cache (tests/setup.sh runs this)
#   tests/vm/vmtest.sh [--plugin-bin FILE --plugins "NAME..."] [--bin FILE]... [--modules "M..."]
#                      [--mem MB] [--timeout S] [--kernel-log] SCRIPT
#       run SCRIPT (a file) under `bash -e` in the guest's /, after tests/vm/guest.sh is sourced
#
# --plugin-bin FILE   copied to /opt/cni/bin/cni-rs; every --plugins NAME is a symlink to it there
#                     (a multi-call binary dispatches on its name); build it static
# --bin FILE          copied to /bin (a dynamic one brings the libraries ldd lists)
# --modules "M..."    kernel modules to load besides the default set (e.g. "tun nf_tables"),
#                     their dependencies first; built-in ones are skipped
# The guest's console (stdout and stderr of the script) goes to stdout. The exit status is the
# script's; 125 means no status came back (boot failure, timeout, missing module or file).
#
# Environment: CNI_RS_VM_CACHE (default /var/tmp/cni-rs-vm), CNI_RS_VM_ACCEL (kvm|tcg; default tcg
# unless /dev/kvm can run a stock kernel), CNI_RS_VM_CMDLINE (more kernel parameters).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${CNI_RS_VM_CACHE:-/var/tmp/cni-rs-vm}
base_modules="dummy 8021q ipvlan vrf bonding bridge macvlan veth"
extra_modules="" mem=512 timeout=300 quiet=quiet prepare_only=0 script="" plugin_bin="" plugins=""
bins=()

fail() {
    echo "vmtest: $*" >&2
    exit 125
}

while (($#)); do
    case $1 in
        --prepare) prepare_only=1; shift ;;
        --plugin-bin) plugin_bin=${2:?}; shift 2 ;;
        --plugins) plugins=${2?}; shift 2 ;;
        --bin) bins+=("${2:?}"); shift 2 ;;
        --modules) extra_modules=${2?}; shift 2 ;;
        --mem) mem=${2:?}; shift 2 ;;
        --timeout) timeout=${2:?}; shift 2 ;;
        --kernel-log) quiet=""; shift ;;
        -*) fail "unknown option $1 (see the head of $0)" ;;
        *) script=$1; shift ;;
    esac
done

for tool in qemu-system-x86_64 busybox ip bridge bash xz dpkg-deb; do
    command -v "$tool" >/dev/null || fail "$tool is missing: run tests/setup.sh"
done
# The guest runs busybox as its only userland besides bash and iproute2: it must be static.
bb=$(command -v busybox)
if ldd "$bb" >/dev/null 2>&1; then fail "$bb is dynamic: install busybox-static (tests/setup.sh)"; fi

# The kernel: the package linux-image-amd64 depends on, unpacked (never installed) into the cache.
# QEMU boots its uncompressed vmlinux directly (PVH entry), which skips ~4 s of xz decompression
# under TCG. One directory per package name, so a kernel update lands beside the old one.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
# A run uses the kernel already in the cache (asking apt costs seconds on a busy host); --prepare,
# or a cache without one, asks apt which package linux-image-amd64 means now and fetches it.
pkg=""
if ((!prepare_only)); then
    # The most recently prepared one.
    ready=$(ls -td "$cache"/linux-image-*/.ready 2>/dev/null | head -n1 || true)
    [ -z "$ready" ] || pkg=$(basename "$(dirname "$ready")")
fi
if [ -z "$pkg" ]; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
if [ -z "$pkg" ]; then
    apt-get update -qq >&2 || true
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[ -n "$pkg" ] || fail "cannot tell which kernel package linux-image-amd64 means (apt-get update failed?)"
kdir=$cache/$pkg
if [ ! -e "$kdir/.ready" ]; then
    echo "vmtest: fetching $pkg into $kdir" >&2
    rm -rf "$kdir" "$cache/download"
    mkdir -p "$cache/download"
    # apt fetches as its sandbox user when that user may write here (else it warns and runs as root).
    chown _apt "$cache/download" 2>/dev/null || true
    (cd "$cache/download" && apt-get download -qq "$pkg" >&2) || fail "apt-get download $pkg failed"
    dpkg-deb -x "$cache"/download/*.deb "$kdir"
    rm -rf "$cache/download"
    kver=$(ls "$kdir/lib/modules")
    busybox depmod -b "$kdir" "$kver"
    # vmlinuz is a bzImage whose payload is an xz stream: cut from its magic and decompress.
    offset=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$kdir/boot/vmlinuz-$kver" | head -n1 | cut -d: -f1)
    if [ -n "$offset" ]; then
        # xz complains about the bytes after the stream; what it wrote before is the whole kernel.
        tail -c +$((offset + 1)) "$kdir/boot/vmlinuz-$kver" | xz -dcq > "$kdir/vmlinux" 2>/dev/null || true
    fi
    # Not an ELF image: boot the compressed one (slower) rather than a broken one.
    [ "$(head -c 4 "$kdir/vmlinux" 2>/dev/null | tail -c 3)" = ELF ] || rm -f "$kdir/vmlinux"
    touch "$kdir/.ready"
fi
kver=$(ls "$kdir/lib/modules")
mdir=$kdir/lib/modules/$kver
kernel=$kdir/vmlinux
[ -s "$kernel" ] || kernel=$kdir/boot/vmlinuz-$kver
((prepare_only)) && exit 0
[ -n "$script" ] && [ -f "$script" ] || fail "no script file given (see the head of $0)"

# The base image (busybox, bash, iproute2, the modules and their load order) depends only on the
# module list and the kernel: built once into the cache, it is reused by every run. The per-run
# part (plugins, binaries, the script) is an uncompressed archive put in front of it; the kernel
# unpacks concatenated archives in order.
modules="$base_modules $extra_modules"
key=$( (echo "$kver $modules"; cat "$0" "$here/init"; ls -l "$bb" "$(command -v bash)" "$(command -v ip)" "$(command -v bridge)") |
    sha256sum | cut -c1-16)
base=$cache/base-$key.cpio.gz
if [ ! -s "$base" ]; then
    declare -A path_of deps seen
    while IFS=: read -r p d; do
        n=${p##*/}; n=${n%.ko*}; n=${n//-/_}
        path_of[$n]=$p; deps[$n]=$d
    done < "$mdir/modules.dep"
    order=()
    add_module() {
        local n=${1##*/} d
        n=${n%.ko*}; n=${n//-/_}
        [ -z "${seen[$n]:-}" ] || return 0
        seen[$n]=1
        if [ -z "${path_of[$n]:-}" ]; then
            grep -q "/${n//_/[-_]}\.ko" "$mdir/modules.builtin" && return 0
            fail "kernel $kver has no module $1"
        fi
        for d in ${deps[$n]}; do add_module "$d"; done
        # Soft dependencies ("softdep=pre: crc32c" in the module's modinfo) are what the module asks
        # modprobe for at init (libcrc32c needs a crc32c); the guest has no modprobe, so they load
        # first. A name is resolved through modules.alias, preferring a generic implementation.
        local soft s target
        soft=$(LC_ALL=C grep -ao 'softdep=[^[:cntrl:]]*' "$mdir/${path_of[$n]}" | head -n1 || true)
        soft=${soft#softdep=}
        soft=${soft%%post:*}
        case $soft in *pre:*) soft=${soft#*pre:} ;; *) soft="" ;; esac
        for s in $soft; do
            target=$(awk -v a="$s" '$1 == "alias" && $2 == a {print $3}' "$mdir/modules.alias" | grep -m1 generic || true)
            [ -n "$target" ] || target=$(awk -v a="$s" '$1 == "alias" && $2 == a {print $3; exit}' "$mdir/modules.alias")
            target=${target:-$s}
            target=${target//-/_}
            if [ -n "${path_of[$target]:-}" ]; then add_module "$target"; fi
        done
        order+=("${path_of[$n]}")
    }
    for m in $modules; do add_module "$m"; done
    root=$(mktemp -d /tmp/cni-rs-vm-base.XXXXXX)
    trap 'rm -rf "$root"' EXIT
    mkdir -p "$root"/{bin,dev,proc,sys,run,tmp,root,lib/modules,opt/cni/bin,etc/cni/net.d,var/lib}
    ln -s /run "$root/var/run"
    cp "$bb" "$root/bin/busybox"
    for f in "$(command -v bash)" "$(command -v ip)" "$(command -v bridge)"; do
        cp "$f" "$root/bin/"
        for lib in $(ldd "$f" | grep -o '/[^ ]*'); do
            mkdir -p "$root${lib%/*}"
            cp -L "$lib" "$root$lib"
        done
    done
    # No stray dummy0/bond0: the tests create every link they use.
    for p in "${order[@]}"; do
        f=${p##*/}
        case $f in
            *.ko.xz) xz -dc "$mdir/$p" > "$root/lib/modules/${f%.xz}"; f=${f%.xz} ;;
            *) cp "$mdir/$p" "$root/lib/modules/$f" ;;
        esac
        case $f in dummy.ko) args=numdummies=0 ;; bonding.ko) args=max_bonds=0 ;; *) args= ;; esac
        echo "$f $args"
    done > "$root/lib/modules/order"
    cp "$here/init" "$root/init"
    chmod +x "$root/init"
    (cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$base.tmp"
    mv "$base.tmp" "$base"
    rm -rf "$root"
    trap - EXIT
fi
# Every run marks the base it uses (under the lock); bases of other module sets or older versions of
# this script that no run used for a day go.
touch "$base"
find "$cache" -maxdepth 1 -name 'base-*.cpio.gz' -mtime +0 -delete
flock -u 9

work=$(mktemp -d /tmp/cni-rs-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT
r=$work/root
mkdir -p "$r/bin" "$r/opt/cni/bin"
if [ -n "$plugin_bin" ]; then
    [ -f "$plugin_bin" ] || fail "--plugin-bin: no file $plugin_bin"
    cp "$plugin_bin" "$r/opt/cni/bin/cni-rs"
    for p in $plugins; do ln -s cni-rs "$r/opt/cni/bin/$p"; done
fi
for b in "${bins[@]}"; do
    [ -f "$b" ] || fail "--bin: no file $b"
    cp "$b" "$r/bin/"
    for lib in $(ldd "$b" 2>/dev/null | grep -o '/[^ ]*' || true); do
        mkdir -p "$r${lib%/*}"
        cp -L "$lib" "$r$lib"
    done
done
cp "$here/guest.sh" "$r/guest.sh"
cp "$script" "$r/test.sh"
(cd "$r" && find . -mindepth 1 | busybox cpio -o -H newc 2>/dev/null) > "$work/run.cpio"
# Uncompressed first: the kernel cannot always find where an archive starts after a gzip one.
cat "$work/run.cpio" "$base" > "$work/initrd"

accel=${CNI_RS_VM_ACCEL:-}
if [ -z "$accel" ]; then
    # A PVM host (kvm_pvm) has a /dev/kvm that runs only PVM guest kernels: Debian's hangs there.
    accel=tcg
    if [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ]; then accel=kvm; fi
fi
# One CPU: a second one only slows the boot under TCG. mitigations=off: in a throwaway guest the
# speculation mitigations only cost time (page-table switches on every syscall are dear under TCG).
timeout "$timeout" qemu-system-x86_64 -nodefaults -no-user-config -no-reboot -accel "$accel" -cpu max \
    -smp 1 -m "$mem" -display none -serial stdio -kernel "$kernel" -initrd "$work/initrd" \
    -append "console=ttyS0 $quiet panic=-1 rdinit=/init mitigations=off ${CNI_RS_VM_CMDLINE:-}" < /dev/null | tr -d '\r' | tee "$work/console" || true
status=$(sed -n 's/^CNI_RS_VM_EXIT=\([0-9]*\)$/\1/p' "$work/console" | tail -n1)
[ -n "$status" ] || fail "the guest reported no exit status (boot failure or timeout after ${timeout}s)"
exit "$status"
