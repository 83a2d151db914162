//! cni-rs: the bridge, host-local, loopback and portmap plugins in one binary, dispatching on the
//! base name it was run under (argv[0]). Installed once with a hard link per plugin name, the four
//! plugins share one copy of the code on disk and in the page cache.

use std::path::Path;

/// The plugins this binary can be, by type name.
pub const PLUGINS: [&str; 4] = ["bridge", "host-local", "loopback", "portmap"];

/// Runs one of our plugins in this process, for a delegate call that found this same binary on
/// CNI_PATH (bridge's IPAM call to host-local): see `libcni::invoke::set_in_process_runner`.
fn run_in_process(
    plugin_type: &str,
    env: &std::collections::HashMap<String, String>,
    mut stdin: &[u8],
) -> Option<libcni::skel::Outcome> {
    use libcni::skel::execute;
    Some(match plugin_type {
        "bridge" => execute(&bridge::Bridge, env, &mut stdin),
        "host-local" => execute(&host_local::HostLocal, env, &mut stdin),
        "loopback" => execute(&loopback::Loopback, env, &mut stdin),
        "portmap" => execute(&portmap::PortMap, env, &mut stdin),
        _ => return None,
    })
}

fn main() {
    libcni::invoke::set_in_process_runner(run_in_process);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    match name.as_str() {
        "bridge" => libcni::skel::run(&bridge::Bridge),
        "host-local" => libcni::skel::run(&host_local::HostLocal),
        "loopback" => libcni::skel::run(&loopback::Loopback),
        "portmap" => libcni::skel::run(&portmap::PortMap),
        _ => {
            eprintln!(
                "cni-rs: run as one of {} (a hard link or symlink of that name to this binary), not as {name:?}",
                PLUGINS.join(", ")
            );
            std::process::exit(1);
        }
    }
}
