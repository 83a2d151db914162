//! cni-rs: the bandwidth, bridge, dhcp, dummy, firewall, host-device, host-local, ipvlan, loopback, macvlan, portmap, ptp, sbr, static, tap, tuning, vlan and vrf plugins in one binary, dispatching
//! on the base name it was run under (argv[0]). Installed once with a hard link per plugin name, the
//! plugins share one copy of the code on disk and in the page cache.

use cni_rs::PLUGINS;
use std::path::Path;

/// Runs the plugin of type `plugin_type` on `env` and `stdin`; None when it is not one of ours. The
/// process's own entry point and the in-process delegate calls (bridge's IPAM call to host-local
/// when it finds this same binary on CNI_PATH: `libcni::invoke::set_in_process_runner`) both go
/// through here.
fn execute_named(
    plugin_type: &str,
    env: &std::collections::HashMap<String, String>,
    stdin: &mut dyn std::io::Read,
) -> Option<libcni::skel::PluginOutput> {
    use libcni::skel::execute;
    Some(match plugin_type {
        "bridge" => execute(&bridge::Bridge, env, stdin),
        "host-local" => execute(&host_local::HostLocal, env, stdin),
        "loopback" => execute(&loopback::Loopback, env, stdin),
        "portmap" => execute(&portmap::PortMap, env, stdin),
        "tuning" => execute(&tuning::Tuning, env, stdin),
        "sbr" => execute(&sbr::Sbr, env, stdin),
        "static" => execute(&static_ipam::Static, env, stdin),
        "bandwidth" => execute(&bandwidth::Bandwidth, env, stdin),
        "firewall" => execute(&firewall::Firewall, env, stdin),
        "ptp" => execute(&ptp::Ptp, env, stdin),
        "host-device" => execute(&host_device::HostDevice, env, stdin),
        "macvlan" => execute(&macvlan::PLUGIN, env, stdin),
        "ipvlan" => execute(&ipvlan::PLUGIN, env, stdin),
        "dummy" => execute(&dummy::Dummy, env, stdin),
        "vlan" => execute(&vlan::Vlan, env, stdin),
        "vrf" => execute(&vrf::Vrf, env, stdin),
        "tap" => execute(&tap::Tap, env, stdin),
        "dhcp" => execute(&dhcp::Dhcp, env, stdin),
        _ => return None,
    })
}

fn run_in_process(
    plugin_type: &str,
    env: &std::collections::HashMap<String, String>,
    mut stdin: &[u8],
) -> Option<libcni::skel::PluginOutput> {
    execute_named(plugin_type, env, &mut stdin)
}

#[global_allocator]
static ALLOCATOR: cni_rs::alloc::Allocator = cni_rs::alloc::Allocator;

fn main() {
    libcni::invoke::set_in_process_runner(run_in_process);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // `dhcp daemon ...`: the long-running lease holder, not a CNI call.
    let args: Vec<String> = std::env::args().collect();
    if name == "dhcp" && args.get(1).map(String::as_str) == Some("daemon") {
        std::process::exit(dhcp::daemon::main(&args[2..]));
    }
    match execute_named(&name, &libcni::skel::process_env(), &mut std::io::stdin().lock()) {
        Some(outcome) => libcni::skel::finish(outcome),
        None => {
            eprintln!(
                "cni-rs: run as one of {} (a hard link or symlink of that name to this binary), not as {name:?}",
                PLUGINS.join(", ")
            );
            std::process::exit(1);
        }
    }
}
