//! The macvlan chain: macvlan (bridge mode, on a master made for the run) + host-local + loopback,
//! ours against the reference in the same run, through the same client, with the same conflist,
//! samples interleaved as for the bridge chain. IPv4 only: an IPv6 address would add both sides'
//! duplicate address detection wait (about a second), which is the kernel's, not the plugins'.

use super::{latency, Latency, Res, Side, PREFIX, STATE};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The plugins of this chain that the bridge chain does not use.
pub const PLUGINS: [&str; 1] = ["macvlan"];

/// A veth pair, both ends up, so the master has a carrier; removed with the side (its `bridge`).
fn master(name: &str) -> Res<()> {
    let _ = Command::new("ip").args(["link", "del", name]).stderr(Stdio::null()).status();
    let peer = format!("{name}p");
    for args in [
        vec!["link", "add", name, "type", "veth", "peer", "name", &peer],
        vec!["link", "set", &peer, "up"],
        vec!["link", "set", name, "up"],
    ] {
        let ok = Command::new("ip").args(&args).status().map_err(|e| format!("ip: {e}"))?.success();
        if !ok {
            return Err(format!("ip {} failed", args.join(" ")));
        }
    }
    Ok(())
}

/// A side running the macvlan chain with the plugins in `bin`; pods in 10.<octet>.0.0/16.
fn side(key: &'static str, label: &'static str, tag: char, bin: &Path, octet: u8) -> Res<Side> {
    let dir = PathBuf::from(STATE).join(key);
    let master = format!("{PREFIX}{tag}0");
    let plugins = json!([
        {"type": "macvlan", "master": master, "mode": "bridge",
         "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.{octet}.0.0/16")}]],
                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": dir.join("ipam")}},
        {"type": "loopback"}
    ]);
    // `master` is the side's link, which its cleanup deletes.
    Side::with_plugins(key, label, tag, bin, octet, 0, plugins)
}

/// Per-pod latency of the macvlan chain, ours then the reference: everything made is removed
/// before returning, on error too.
pub fn run(ours: &Path, reference: &Path, samples: usize) -> Res<(Latency, Latency)> {
    let o = side("macvlan-ours", "cni-rs", 'm', ours, 232)?;
    let r = side("macvlan-reference", "reference (Go)", 'n', reference, 233)?;
    let sides = [&o, &r];
    for s in sides {
        s.cleanup();
    }
    let result = (|| {
        for s in sides {
            master(&s.bridge)?;
        }
        latency(&sides, samples, None)
    })();
    for s in sides {
        s.cleanup();
    }
    let lat = result?;
    Ok((lat[0].clone(), lat[1].clone()))
}

/// Adds this chain's plugins to the directory of links to the multi-call binary
/// (`installed_shape`); a directory of separate binaries must already hold them.
pub fn install(dir: &Path) -> Res<()> {
    let multi = dir.join("cni-rs");
    for p in PLUGINS {
        let link = dir.join(p);
        if multi.is_file() && !link.exists() {
            std::fs::hard_link(&multi, &link).map_err(|e| format!("link {p}: {e}"))?;
        }
        if !link.is_file() {
            return Err(format!("{} has no {p}", dir.display()));
        }
    }
    Ok(())
}
