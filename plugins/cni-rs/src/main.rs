//! cni-rs: the bandwidth, bridge, dhcp, dummy, firewall, host-device, host-local, ipvlan, loopback, macvlan, portmap, ptp, sbr, static, tap, tuning, vlan and vrf plugins in one binary, dispatching
//! on the base name it was run under (argv[0]). Installed once with a hard link per plugin name, the
//! plugins share one copy of the code on disk and in the page cache.

use cni_rs::PLUGINS;
use libcni::Plugin;
use std::path::Path;

/// The plugin of type `plugin_type`; None when it is not one of ours.
fn plugin(plugin_type: &str) -> Option<&'static dyn Plugin> {
    Some(match plugin_type {
        "bridge" => &bridge::Bridge,
        "host-local" => &host_local::HostLocal,
        "loopback" => &loopback::Loopback,
        "portmap" => &portmap::PortMap,
        "tuning" => &tuning::Tuning,
        "sbr" => &sbr::Sbr,
        "static" => &static_ipam::Static,
        "bandwidth" => &bandwidth::Bandwidth,
        "firewall" => &firewall::Firewall,
        "ptp" => &ptp::Ptp,
        "host-device" => &host_device::HostDevice,
        "macvlan" => &macvlan::PLUGIN,
        "ipvlan" => &ipvlan::PLUGIN,
        "dummy" => &dummy::Dummy,
        "vlan" => &vlan::Vlan,
        "vrf" => &vrf::Vrf,
        "tap" => &tap::Tap,
        "dhcp" => &dhcp::Dhcp,
        _ => return None,
    })
}

/// Runs the plugin of type `plugin_type` on `env` and `stdin`; None when it is not one of ours. The
/// process's own entry point and the in-process delegate calls (bridge's IPAM call to host-local
/// when it finds this same binary on CNI_PATH: `libcni::invoke::set_in_process_runner`) both go
/// through here.
fn execute_named(
    plugin_type: &str,
    env: &std::collections::HashMap<String, String>,
    stdin: &mut dyn std::io::Read,
) -> Option<libcni::skel::PluginOutput> {
    plugin(plugin_type).map(|p| libcni::skel::execute(p, env, stdin))
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
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    if name == "dhcp" && args.get(1).map(String::as_str) == Some("daemon") {
        std::process::exit(dhcp::daemon::main(&args[2..]));
    }
    let env = libcni::skel::process_env();
    match plugin(&name) {
        Some(p) => {
            if let Some(text) = libcni::skel::about_for_a_person(&name, p, args.get(1..).unwrap_or_default(), &env) {
                eprint!("{text}");
                std::process::exit(0);
            }
            libcni::skel::finish(libcni::skel::execute(p, &env, &mut std::io::stdin().lock()))
        }
        None => {
            eprintln!(
                "cni-rs: run as one of {} (a hard link or symlink of that name to this binary), not as {name:?}",
                PLUGINS.join(", ")
            );
            std::process::exit(1);
        }
    }
}
