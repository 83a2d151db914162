//! cni-rs: every plugin of cni-rs in one binary (`libcni::registry` names them), dispatching on the
//! base name it was run under (argv[0]). Installed once with a hard link per plugin name, the plugins
//! share one copy of the code on disk and in the page cache. Run under another name with `--plugins`,
//! it prints the names, one a line: the image build installs what this prints.

use cni_rs::plugin;
use libcni::registry;
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
        None if args.get(1).map(String::as_str) == Some("--plugins") => {
            println!("{}", registry::NAMES.join("\n"));
        }
        None => {
            eprintln!(
                "cni-rs: run as one of {} (a hard link or symlink of that name to this binary), not as {name:?} \
                 (`--plugins` prints these names)",
                registry::NAMES.join(", ")
            );
            std::process::exit(1);
        }
    }
}
