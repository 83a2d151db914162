//! The shipped configurations (conf/*.conflist) work with the plugins we build: every file loads,
//! every plugin it names is found and supports its cniVersion, and conf/demo.conflist does a real
//! ADD/CHECK/DEL through the cnitool binary with a mapped port answering HTTP from the host.
//! (tests/demo.sh does the same round trip for humans.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod e2e;

use cni_tests::{bin_dir, bridge_ports, require_root, run, Netns, TempDir};
use e2e::*;
use libcni::conflist;
use libcni::runtime::CniConfig;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

#[test]
fn every_shipped_conflist_loads_and_validates_against_our_plugins() {
    let dir = repo_root().join("conf");
    let files = conflist::conf_files(&dir, &["conflist"]).expect("list conf/");
    let scan = conflist::scan_dir(&dir).expect("scan conf/");
    let failures: Vec<String> = scan.failures.iter().map(|(f, e)| format!("{}: {e}", f.display())).collect();
    assert!(failures.is_empty(), "conf files that fail to load:\n{}", failures.join("\n"));
    assert!(scan.shadowed.is_empty(), "two conf files claim one network name: {:?}", scan.shadowed);
    assert_eq!(scan.networks.len(), files.len(), "every conf/*.conflist is one network: {files:?}");
    for name in ["cni-rs-demo", "k8s-pod-network", "cnirs-podman"] {
        assert!(scan.get(name).is_some(), "network {name} not found in {}", dir.display());
    }

    let cni = CniConfig::new(vec![bin_dir()]);
    for found in &scan.networks {
        let list = &found.list;
        let caps =
            cni.validate_network_list(list).unwrap_or_else(|e| panic!("{} ({}): {e}", found.file.display(), list.name));
        for plugin in &list.plugins {
            let path = cni.find_plugin(&plugin.plugin_type).expect("find plugin");
            assert!(
                path.starts_with(bin_dir()),
                "{} resolved outside our build: {}",
                plugin.plugin_type,
                path.display()
            );
        }
        // Those with portmap publish ports through it (the macvlan, ipvlan and vlan-vrf lists are
        // secondary networks on the node's LAN, with none).
        if list.plugins.iter().any(|p| p.plugin_type == "portmap") {
            assert!(caps.iter().any(|c| c == "portMappings"), "{}: capabilities {caps:?}", list.name);
        }
    }
}

const DEMO: &str = "cni-rs-demo";
const DEMO_BRIDGE: &str = "cnirs-demo0";
const DEMO_RUN_DIR: &str = "/run/cni-rs-demo";

/// cnitool on the repository's conf/ with our plugins and a private cache; everything the round
/// trip makes is undone on drop, even after a failed assertion.
struct Demo {
    ns: Netns,
    cache: TempDir,
    www: TempDir,
    httpd: Option<Child>,
    added: bool,
    bridge_was_there: bool,
    run_dir_was_there: bool,
    cap_args: String,
}

impl Demo {
    fn cnitool(&self, verb: &str) -> Output {
        Command::new(bin_dir().join("cnitool"))
            .args([verb, DEMO, &self.ns.path])
            .env("NETCONFPATH", repo_root().join("conf"))
            .env("CNI_PATH", bin_dir())
            .env("CNI_CACHE_DIR", self.cache.path())
            .env("CAP_ARGS", &self.cap_args)
            .env_remove("CNI_ARGS")
            .env_remove("CNI_IFNAME")
            .output()
            .expect("run cnitool")
    }

    fn cnitool_ok(&self, verb: &str) -> String {
        let out = self.cnitool(verb);
        assert!(
            out.status.success(),
            "cnitool {verb} {DEMO} {}: {}{}",
            self.ns.path,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn stop_httpd(&mut self) {
        if let Some(mut child) = self.httpd.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The container id cnitool used, from the name of its cache file.
    fn container_id(&self) -> String {
        let dir = self.cache.path().join("results");
        let prefix = format!("{DEMO}-");
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 1, "cache files: {names:?}");
        let id = names[0].strip_prefix(&prefix).and_then(|r| r.strip_suffix("-eth0"));
        id.unwrap_or_else(|| panic!("cache file name {}", names[0])).to_string()
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        self.stop_httpd();
        if self.added {
            let _ = self.cnitool("del");
        }
        if !self.bridge_was_there {
            let _ = run("ip", &["link", "del", DEMO_BRIDGE]);
        }
        if !self.run_dir_was_there {
            let _ = std::fs::remove_dir_all(DEMO_RUN_DIR);
        }
        // then the fields: the netns is deleted, the temp dirs removed
    }
}

fn demo_reservations() -> Vec<(String, String)> {
    reservation_owners(&Path::new(DEMO_RUN_DIR).join("ipam"), DEMO)
}

#[test]
fn demo_conflist_add_check_del_through_cnitool() {
    require_root();
    let started = Instant::now();
    let port = free_port();
    let www = TempDir::new("cnirs-www-");
    let page = "hello from the cni-rs demo pod\n";
    std::fs::write(www.path().join("index.html"), page).unwrap();
    let mut demo = Demo {
        bridge_was_there: link_exists(DEMO_BRIDGE),
        run_dir_was_there: Path::new(DEMO_RUN_DIR).exists(),
        ns: Netns::new("cnrd"),
        cache: TempDir::new("cnirs-cache-"),
        www,
        httpd: None,
        added: false,
        cap_args: json!({"portMappings": [{"hostPort": port, "containerPort": 80, "protocol": "tcp"}]}).to_string(),
    };

    // ADD: the result names an IPv4 and an IPv6 address from the demo's ranges.
    demo.added = true;
    let out = demo.cnitool_ok("add");
    let result: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("cnitool add output: {e}: {out}"));
    assert_eq!(result["cniVersion"], "1.1.0", "{result}");
    let addrs: Vec<IpAddr> = result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|ip| ip["address"].as_str().expect("address").split('/').next().unwrap().parse().expect("ip"))
        .collect();
    let v4 = addrs.iter().find_map(|a| match a {
        IpAddr::V4(a) => Some(*a),
        IpAddr::V6(_) => None,
    });
    let v4 = v4.unwrap_or_else(|| panic!("no IPv4 address in {result}"));
    let v6 = addrs.iter().find(|a| a.is_ipv6()).unwrap_or_else(|| panic!("no IPv6 address in {result}"));
    assert!(in_v4_subnet(v4, "10.88.77.0/24"), "{v4}");
    assert!(v6.to_string().starts_with("fd00:88:77:"), "{v6}");
    let id = demo.container_id();
    let mut held = demo_reservations();
    held.retain(|(_, owner)| *owner == id);
    let mut want = vec![(v4.to_string(), id.clone()), (v6.to_string(), id.clone())];
    want.sort();
    assert_eq!(held, want, "reservations in {DEMO_RUN_DIR}/ipam/{DEMO}");

    // CHECK agrees with what ADD did.
    demo.cnitool_ok("check");

    // httpd in the pod, reached from the host through the mapped port.
    let www_path = demo.www.path().to_string_lossy().into_owned();
    let child = Command::new("ip")
        .args(["netns", "exec", &demo.ns.name, "busybox", "httpd", "-f", "-p", "80", "-h", &www_path])
        .spawn()
        .expect("start httpd in the pod");
    demo.httpd = Some(child);
    let direct = http_get_retry(IpAddr::V4(v4), 80, Duration::from_secs(10));
    assert_eq!(direct.as_deref(), Some(page), "GET http://{v4}:80/ directly");
    let mapped = http_get_retry(IpAddr::V4(Ipv4Addr::LOCALHOST), port, Duration::from_secs(5));
    assert_eq!(mapped.as_deref(), Some(page), "GET http://127.0.0.1:{port}/ (hostPort -> 80)");
    let rules = firewall_dump();
    assert!(mentions(&rules, &v4.to_string()), "no rule names {v4} after ADD:\n{rules}");

    // DEL: no reservation, no rule, no port; the mapped port stops answering. A second DEL is fine.
    demo.stop_httpd();
    demo.cnitool_ok("del");
    demo.added = false;
    let left: Vec<_> =
        demo_reservations().into_iter().filter(|(a, o)| *o == id || want.iter().any(|(w, _)| w == a)).collect();
    assert!(left.is_empty(), "reservations left after DEL: {left:?}");
    let rules = firewall_dump();
    for needle in [v4.to_string(), v6.to_string(), id.clone()] {
        assert!(
            !mentions(&rules, &needle),
            "rules still name {needle} after DEL:\n{}",
            lines_mentioning(&rules, &needle)
        );
    }
    assert!(!demo.ns.exec("ip", &["link", "show", "eth0"]).status.success(), "eth0 left in the pod after DEL");
    let ports = bridge_ports(DEMO_BRIDGE);
    assert!(ports.is_empty(), "ports left on {DEMO_BRIDGE} after DEL: {ports:?}");
    assert_eq!(http_get(IpAddr::V4(Ipv4Addr::LOCALHOST), port), None, "127.0.0.1:{port} still answers after DEL");
    demo.cnitool_ok("del");
    let cache_left: Vec<PathBuf> = std::fs::read_dir(demo.cache.path().join("results"))
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(cache_left.is_empty(), "cache left after DEL: {cache_left:?}");
    eprintln!("demo round trip took {:.1}s", started.elapsed().as_secs_f64());
}
