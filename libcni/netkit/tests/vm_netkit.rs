#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! netkit's own tests that need what the host kernel lacks, run inside the VM (tests/vm), in one
//! boot: the netlink tests that need VLAN filtering (without CONFIG_BRIDGE_VLAN_FILTERING they can
//! only check the error path) and the NetworkPolicy table's test with SCTP traffic (without SCTP
//! it runs only its TCP and UDP cases). The same boot checks the harness's extra modules (tun,
//! nftables with NAT) and a dynamic `--bin` (nft).

use cni_tests::vm::{static_test_binary, Vm};

#[test]
fn netkit_vlan_filtering_and_sctp_policy_in_the_guest_kernel() {
    let bin = static_test_binary("netkit", "netlink");
    let name = bin.file_name().unwrap().to_string_lossy().into_owned();
    let netpol = static_test_binary("netkit", "netpol");
    let netpol_name = netpol.file_name().unwrap().to_string_lossy().into_owned();
    let script = format!(
        r#"
cd /tmp
out=$(/bin/{name} --exact bridge_vlans bridge_is_created_reused_and_checked --test-threads=1 --nocapture 2>&1)
echo "$out"
check "netkit bridge_vlans passes" has - 'test bridge_vlans \.\.\. ok' <<< "$out"
check "netkit bridge reuse passes" has - 'test bridge_is_created_reused_and_checked \.\.\. ok' <<< "$out"
refuse "netkit took the vlan filtering path" grep -q 'lacks CONFIG_BRIDGE_VLAN_FILTERING' <<< "$out"
out=$(/bin/{netpol_name} --exact network_policy_table_filters_tcp_udp_and_sctp_traffic --nocapture 2>&1) || true
echo "$out"
check "netkit netpol passes" has - 'test network_policy_table_filters_tcp_udp_and_sctp_traffic \.\.\. ok' <<< "$out"
refuse "netkit netpol ran without SCTP" grep -q 'NOTE: this kernel has no SCTP' <<< "$out"
check "extra module: tun" ip tuntap add mode tap name tap0
nft add table ip t
nft add chain ip t c '{{ type nat hook postrouting priority 100; }}'
check "extra modules: nftables masquerade" nft add rule ip t c masquerade
"#
    );
    let run = Vm::new()
        .bin(&bin)
        .bin(&netpol)
        .bin("/usr/sbin/nft")
        .modules(&["tun", "nf_tables", "nft_chain_nat", "nft_masq", "nft_ct", "sctp"])
        .run(&script);
    run.assert_passed(&[
        "netkit bridge_vlans passes",
        "netkit bridge reuse passes",
        "netkit took the vlan filtering path",
        "netkit netpol passes",
        "netkit netpol ran without SCTP",
        "extra module: tun",
        "extra modules: nftables masquerade",
    ]);
}
