# guest.sh: sourced in the guest before the test script. Drives CNI plugins with plain environment
# variables and stdin, as a runtime would, and reports results in lines the host test reads.
#
#   cni VERB TYPE CONF_FILE CONTAINER_ID NETNS_NAME IFNAME
#       runs /opt/cni/bin/TYPE; prints its stdout (stderr goes to the console). ADD's result is
#       kept, and CHECK and DEL at spec 0.4.0 and later get it spliced in as prevResult.
#       Returns the plugin's exit status.
#   pod NETNS_NAME CMD...      runs CMD in the named network namespace
#   pass NAME                  prints "PASS NAME": the host test expects one line per case
#   check NAME CMD...          runs CMD; "PASS NAME" when it succeeds, else "FAIL NAME": the script
#                              goes on (later cases still report) but its exit status becomes 1
#   refuse NAME CMD...         the opposite: passes when CMD fails
#   has FILE_OR_- PATTERN...   every extended regex PATTERN matches a line of the text (- = stdin)
#   is ACTUAL EXPECTED         the two strings are equal (else says what it got)
#   code_of                    the CNI error code in the JSON on stdin (empty when there is none)
#   links_of NETNS_NAME        how many links the namespace has besides lo
#   check_by_version V TYPE CONF ID NETNS IFNAME
#                              CHECK at spec version V: case "check V" from 0.4.0 on, and
#                              "check V refused" before (CHECK came in 0.4.0)
#   version_round V TYPE NAME  the round a script runs on each spec version, in a new netns NAME
#                              with /tmp/NAME.json as eth0: "add V", the script's own
#                              `after_add V NAME`, check_by_version, "del V", `after_del V NAME`,
#                              "del V again"

export CNI_PATH=/opt/cni/bin
mkdir -p /tmp/cni-results /run/netns

cni() {
    local verb=$1 type=$2 conf=$3 id=$4 netns=$5 ifname=$6 saved body version rc
    saved=/tmp/cni-results/$id-$ifname.json
    body=$(cat "$conf")
    version=$(printf '%s' "$body" | sed -n 's/.*"cniVersion" *: *"\([^"]*\)".*/\1/p' | head -n1)
    case $verb:$version in
        CHECK:0.[0-3].* | DEL:0.[0-3].* | ADD:*) ;;
        *)
            if [ -s "$saved" ]; then
                body="${body%\}},\"prevResult\":$(cat "$saved")}"
            fi
            ;;
    esac
    local out
    set +e
    out=$(printf '%s' "$body" | CNI_COMMAND=$verb CNI_CONTAINERID=$id CNI_NETNS=/run/netns/$netns \
        CNI_IFNAME=$ifname CNI_PATH=$CNI_PATH "$CNI_PATH/$type")
    rc=$?
    set -e
    printf '%s\n' "$out"
    if [ "$verb" = ADD ] && [ "$rc" = 0 ]; then printf '%s' "$out" > "$saved"; fi
    if [ "$verb" = DEL ] && [ "$rc" = 0 ]; then rm -f "$saved"; fi
    return "$rc"
}

pod() {
    local netns=$1
    shift
    ip netns exec "$netns" "$@"
}

pass() { echo "PASS $1"; }

check() {
    local name=$1
    shift
    if "$@"; then
        echo "PASS $name"
    else
        echo "FAIL $name: $*"
        touch /run/vmtest-failed
    fi
}

refuse() {
    local name=$1
    shift
    if "$@"; then
        echo "FAIL $name: succeeded but must not: $*"
        touch /run/vmtest-failed
    else
        echo "PASS $name"
    fi
}

has() {
    local text pat
    if [ "$1" = - ]; then text=$(cat); else text=$(cat "$1"); fi
    shift
    for pat in "$@"; do
        if ! printf '%s\n' "$text" | grep -Eq -- "$pat"; then
            printf 'no line matches /%s/ in:\n%s\n' "$pat" "$text"
            return 1
        fi
    done
}

is() {
    [ "$1" = "$2" ] || { echo "got '$1', want '$2'"; return 1; }
}

code_of() { sed -n 's/.*"code": *\([0-9]*\).*/\1/p' | head -n1; }

links_of() { pod "$1" ip -o link show | grep -vc ': lo:' || true; }

check_by_version() {
    local v=$1
    shift
    case $v in
        0.[0-3].*) refuse "check $v refused" cni CHECK "$@" ;;
        *) check "check $v" cni CHECK "$@" ;;
    esac
}

version_round() {
    local v=$1 type=$2 n=$3
    ip netns add "$n"
    check "add $v" cni ADD "$type" "/tmp/$n.json" "$n" "$n" eth0
    after_add "$v" "$n"
    check_by_version "$v" "$type" "/tmp/$n.json" "$n" "$n" eth0
    check "del $v" cni DEL "$type" "/tmp/$n.json" "$n" "$n" eth0
    after_del "$v" "$n"
    check "del $v again" cni DEL "$type" "/tmp/$n.json" "$n" "$n" eth0
}
