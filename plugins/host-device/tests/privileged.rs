#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! host-device with real namespaces: a test "host" namespace owns a veth end (`hd0`) that stands
//! for the host's device, its peer sits in a "wire" namespace on the far side. The plugin runs
//! inside the test host namespace, as it runs in the node's on a real host. Traffic crosses the
//! moved device on IPv4 and IPv6; every spec version, DEL twice, DEL with the pod gone, a failed
//! ADD, each way of naming the device, and the reference plugin on the same device.

use cni_tests::{bin_dir, pings, run, Netns, TempDir};
use libcni::version::{at_least, SUPPORTED};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const REFERENCE: &str = "/usr/lib/cni";

/// The test host with its device `hd0` (MTU 1300, up, alias `orig`), wired to a far side holding
/// 10.203.<n>.1/24 and fd00:203:<n>::1/64.
struct Rig {
    host: Netns,
    wire: Netns,
    pod: Netns,
    n: u8,
    /// The configuration's `dataDir`: where ADD keeps the device's alias.
    data: TempDir,
}

impl Rig {
    fn new(n: u8) -> Rig {
        let (host, wire, pod) = (Netns::new("cnhh"), Netns::new("cnhw"), Netns::new("cnhp"));
        host.ip(&["link", "add", "hd0", "mtu", "1300", "type", "veth", "peer", "name", "far", "netns", &wire.name]);
        host.ip(&["link", "set", "hd0", "alias", "orig", "up"]);
        wire.ip(&["addr", "add", &format!("10.203.{n}.1/24"), "dev", "far"]);
        wire.ip(&["addr", "add", &format!("fd00:203:{n}::1/64"), "dev", "far", "nodad"]);
        wire.ip(&["link", "set", "far", "up"]);
        Rig { host, wire, pod, n, data: TempDir::new("cnhd") }
    }

    fn conf(&self, version: &str, extra: Value) -> Value {
        let n = self.n;
        let mut c = json!({
            "cniVersion": version, "name": "hdnet", "type": "host-device", "device": "hd0",
            "dataDir": self.data.path(),
            "ipam": { "type": "static", "addresses": [
                { "address": format!("10.203.{n}.2/24") }, { "address": format!("fd00:203:{n}::2/64") }
            ]}
        });
        cni_tests::merge(&mut c, extra);
        c
    }

    /// Runs `plugin` (ours unless `dir` says otherwise) inside the test host namespace.
    fn call(&self, dir: &Path, cmd: &str, netns: &str, conf: &Value) -> (bool, Value) {
        self.call_as("hd-ctr", dir, cmd, netns, conf)
    }

    /// `call` for container `id`.
    fn call_as(&self, id: &str, dir: &Path, cmd: &str, netns: &str, conf: &Value) -> (bool, Value) {
        let (ok, v, _) = self.exec(id, &dir.join("host-device"), &dir.display().to_string(), &[], cmd, netns, conf);
        (ok, v)
    }

    /// Runs the host-device binary `plugin` with CNI_PATH `path` and the variables `env`.
    #[allow(clippy::too_many_arguments)]
    fn exec(
        &self,
        id: &str,
        plugin: &Path,
        path: &str,
        env: &[(&str, &str)],
        cmd: &str,
        netns: &str,
        conf: &Value,
    ) -> (bool, Value, String) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host.name])
            .arg(plugin)
            .envs(env.iter().copied())
            .env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "net1")
            .env("CNI_PATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run host-device");
        child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.success(), v, String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn ours(&self, cmd: &str, conf: &Value) -> Value {
        let (ok, v) = self.call(&bin_dir(), cmd, &self.pod.path, conf);
        assert!(ok, "{cmd}: {v}");
        v
    }

    fn host_link(&self, name: &str) -> Option<String> {
        let out = run("ip", &["-n", &self.host.name, "-d", "link", "show", name]);
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn pod_has(&self, name: &str) -> bool {
        self.pod.exec("ip", &["link", "show", name]).status.success()
    }

    /// What the host has set on `hd0`, beyond the test rig's: two IPv4 addresses (one labelled),
    /// an IPv6 one, and routes through it in two tables, one of them through a gateway that only
    /// another of these routes reaches.
    fn configure_hd0(&self) {
        let n = self.n;
        self.host.ip(&["addr", "add", &format!("10.203.{n}.7/24"), "dev", "hd0"]);
        self.host.ip(&["addr", "add", &format!("10.203.{n}.8/24"), "dev", "hd0", "label", "hd0:x"]);
        self.host.ip(&["addr", "add", &format!("fd00:203:{n}::7/64"), "dev", "hd0", "nodad"]);
        self.host.ip(&["route", "add", "10.88.0.0/16", "via", &format!("10.203.{n}.1"), "dev", "hd0", "metric", "50"]);
        self.host.ip(&["route", "add", "10.89.0.0/16", "dev", "hd0", "table", "100", "proto", "static"]);
        self.host.ip(&["route", "add", "10.95.0.0/24", "dev", "hd0", "scope", "link"]);
        self.host.ip(&["route", "add", "10.85.0.0/16", "via", "10.95.0.5", "dev", "hd0"]);
        self.host.ip(&["-6", "route", "add", "fd00:99::/64", "via", &format!("fd00:203:{n}::1"), "dev", "hd0"]);
    }

    /// `hd0` on the host as `ip` shows it: name, MTU, flags, alias and MAC, its addresses and the
    /// routes through it that are not the kernel's own.
    fn hd0_state(&self) -> Value {
        let json = |args: &[&str]| -> Value {
            let mut all = vec!["-j"];
            all.extend_from_slice(args);
            serde_json::from_str(&self.host.ip(&all)).unwrap()
        };
        let link = &json(&["link", "show", "hd0"])[0];
        let mut flags: Vec<String> =
            link["flags"].as_array().unwrap().iter().map(|f| f.as_str().unwrap().to_string()).collect();
        // Carrier comes and goes with the move; the admin state (UP) is what must come back.
        flags.retain(|f| f != "LOWER_UP" && f != "NO-CARRIER");
        let addrs: Vec<String> = json(&["addr", "show", "dev", "hd0"])[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| format!("{}/{} {} {}", a["local"], a["prefixlen"], a["scope"], a["label"]))
            .collect();
        let mut routes = Vec::new();
        for family in ["-4", "-6"] {
            for r in json(&[family, "route", "show", "table", "all", "dev", "hd0"]).as_array().unwrap() {
                if r["protocol"] != "kernel" && r["type"] != "multicast" && r["type"] != "local" {
                    routes.push(format!(
                        "{} via {} table {} metric {} {}",
                        r["dst"], r["gateway"], r["table"], r["metric"], r["protocol"]
                    ));
                }
            }
        }
        routes.sort();
        json!({ "name": link["ifname"], "mtu": link["mtu"], "flags": flags, "alias": link["ifalias"],
                "mac": link["address"], "addresses": addrs, "routes": routes })
    }
}

fn with_prev(mut conf: Value, prev: &Value) -> Value {
    conf["prevResult"] = prev.clone();
    conf
}

fn ours() -> PathBuf {
    bin_dir()
}

fn records(rig: &Rig) -> usize {
    std::fs::read_dir(rig.data.path()).unwrap().count()
}

/// Every fault point of host-device's ADD, in order (IPAM runs before the device moves).
const ADD_STEPS: [&str; 7] =
    ["ipam-done", "device-saved", "device-down", "alias-set", "device-moved", "device-up", "container-configured"];

fn fault_bin_dir() -> &'static Path {
    cni_tests::fault_injection_bin_dir()
}

#[test]
fn host_device_on_every_version() {
    for (i, version) in SUPPORTED.iter().enumerate() {
        let rig = Rig::new(10 + i as u8);
        let n = rig.n;
        let mac = rig.host.sh("cat", &["/sys/class/net/hd0/address"]).trim().to_string();
        let conf = rig.conf(version, json!({}));
        let r = rig.ours("ADD", &conf);

        // Moved, renamed, the same device (its MAC), its host name in the alias, up, addressed.
        assert!(rig.host_link("hd0").is_none(), "{version}: hd0 is still on the host");
        let link = rig.pod.sh("ip", &["-d", "link", "show", "net1"]);
        assert!(link.contains(&mac) && link.contains("alias hd0") && link.contains(",UP"), "{version}: {link}");
        if at_least(version, "0.3.0") {
            assert_eq!(r["interfaces"][0]["name"], "net1", "{version}: {r}");
            assert_eq!(r["interfaces"][0]["mac"], mac.as_str(), "{version}: {r}");
            assert_eq!(r["interfaces"][0]["sandbox"], rig.pod.path.as_str(), "{version}: {r}");
            assert_eq!(r["ips"][0]["interface"], 0, "{version}: {r}");
        }
        if at_least(version, "1.0.0") {
            assert_eq!(r["interfaces"][0]["mtu"], 1300, "{version}: {r}");
        }
        // Real traffic across the moved device, both families.
        assert!(pings(&rig.pod, &format!("10.203.{n}.1")), "{version}: no IPv4 across the device");
        assert!(pings(&rig.pod, &format!("fd00:203:{n}::1")), "{version}: no IPv6 across the device");
        if at_least(version, "0.4.0") {
            rig.ours("CHECK", &with_prev(conf.clone(), &r));
        }

        // The pod changes its MTU; DEL brings the device home under its name and with its MTU;
        // a second DEL succeeds.
        rig.pod.sh("ip", &["link", "set", "net1", "mtu", "1400"]);
        rig.ours("DEL", &with_prev(conf.clone(), &r));
        assert!(!rig.pod_has("net1"), "{version}: net1 is still in the pod");
        let home = rig.host_link("hd0").unwrap_or_else(|| panic!("{version}: hd0 did not come back"));
        assert!(home.contains(&mac), "{version}: {home}");
        // ADD's record keeps the MTU whatever the result's version.
        assert!(home.contains("mtu 1300"), "{version}: want mtu 1300: {home}");
        // Its own alias back (the reference leaves the host name there), and nothing kept on disk.
        assert!(home.contains("alias orig"), "{version}: alias not restored: {home}");
        assert_eq!(std::fs::read_dir(rig.data.path()).unwrap().count(), 0, "{version}: the saved alias stays");
        rig.ours("DEL", &with_prev(conf.clone(), &r));
        assert!(rig.host_link("hd0").is_some(), "{version}: the second DEL lost hd0");
        drop(rig.wire);
    }
}

/// An IPAM failure after the move puts the device back as it was: on the host, up, its alias.
#[test]
fn failed_add_returns_the_device() {
    let rig = Rig::new(30);
    let conf = rig.conf(
        "1.0.0",
        json!({ "ipam": { "type": "static", "addresses": [{ "address": "10.203.30.2/24" }],
        "routes": [{ "dst": "10.99.0.0/16", "gw": "10.77.0.1" }] } }),
    );
    let (ok, v) = rig.call(&ours(), "ADD", &rig.pod.path, &conf);
    assert!(!ok, "ADD with a route through an unreachable gateway succeeded: {v}");
    assert!(!rig.pod_has("net1"), "net1 left in the pod");
    let home = rig.host_link("hd0").expect("hd0 back on the host");
    assert!(home.contains(",UP") && home.contains("alias orig"), "hd0 not restored: {home}");
    assert_eq!(std::fs::read_dir(rig.data.path()).unwrap().count(), 0, "the failed ADD left its saved alias");
}

/// DEL after the pod's namespace is gone. A virtual device goes with the namespace and DEL
/// succeeds. A physical device comes back to the initial namespace under the pod's name: DEL
/// gives it back its host name (simulated with a link named as the kernel leaves it).
#[test]
fn del_with_the_pod_gone() {
    let mut rig = Rig::new(31);
    let conf = rig.conf("1.1.0", json!({}));
    let r = rig.ours("ADD", &conf);
    let mac = r["interfaces"][0]["mac"].as_str().unwrap().to_string();
    rig.pod.delete();
    rig.ours("DEL", &with_prev(conf.clone(), &r));

    // The kernel's return of a physical device: net1, down, our alias, the MAC of prevResult.
    rig.host.ip(&["link", "add", "net1", "mtu", "1400", "type", "veth", "peer", "name", "other"]);
    rig.host.ip(&["link", "set", "net1", "address", &mac, "alias", "hd9"]);
    rig.ours("DEL", &with_prev(conf.clone(), &r));
    let home = rig.host_link("hd9").expect("the returned device got its name back");
    assert!(home.contains("mtu 1300"), "MTU not restored: {home}");
    assert!(rig.host_link("net1").is_none());
    // A link that merely has the MAC but no alias of ours, or is up, is left alone.
    rig.host.ip(&["link", "set", "hd9", "name", "net1", "alias", "", "up"]);
    rig.ours("DEL", &with_prev(conf, &r));
    assert!(rig.host_link("net1").is_some(), "DEL renamed a link it did not move");
}

/// `hwaddr` and `kernelpath` find the device; no `ipam` moves it with no addresses.
#[test]
fn hwaddr_kernelpath_and_no_ipam() {
    let rig = Rig::new(32);
    // A device without an alias (the common case) has none again after DEL.
    rig.host.ip(&["link", "set", "hd0", "address", "0a:58:0a:cb:20:05", "alias", ""]);
    for (extra, what) in [
        (json!({ "device": null, "hwaddr": "0A:58:0A:CB:20:05" }), "hwaddr"),
        // Under `ip netns exec`, /sys is the test host's: its virtual devices are hd0 and lo.
        (json!({ "device": null, "kernelpath": "/sys/devices/virtual" }), "kernelpath"),
        (json!({ "ipam": null }), "no ipam"),
    ] {
        let conf = rig.conf("1.0.0", extra);
        let r = rig.ours("ADD", &conf);
        assert!(rig.pod.sh("ip", &["link", "show", "net1"]).contains("0a:58:0a:cb:20:05"), "{what}: {r}");
        let addrs = rig.pod.sh("ip", &["-4", "addr", "show", "net1"]);
        assert_eq!(addrs.contains("10.203.32.2"), what != "no ipam", "{what}: {addrs}");
        rig.ours("DEL", &with_prev(conf, &r));
        let home = rig.host_link("hd0").unwrap_or_else(|| panic!("{what}: hd0 not back"));
        assert!(!home.contains("alias"), "{what}: DEL left an alias: {home}");
    }
    let (ok, v) = rig.call(&ours(), "ADD", &rig.pod.path, &rig.conf("1.0.0", json!({ "device": "nope0" })));
    assert!(!ok && v["msg"].as_str().unwrap_or("").contains("nope0"), "{v}");
}

/// The reference and ours on one device: each DELs what the other ADDed (the host name travels
/// in the alias either way).
#[test]
fn compatible_with_the_reference_host_device() {
    assert!(Path::new(REFERENCE).join("host-device").exists(), "the reference host-device is missing");
    let rig = Rig::new(33);
    let conf = rig.conf("1.0.0", json!({}));
    let (ok, r) = rig.call(Path::new(REFERENCE), "ADD", &rig.pod.path, &conf);
    assert!(ok, "reference ADD: {r}");
    assert!(pings(&rig.pod, "10.203.33.1"));
    rig.ours("DEL", &with_prev(conf.clone(), &r));
    assert!(!rig.pod_has("net1"), "our DEL of the reference's device left it in the pod");
    // The reference's ADD put the host name in the alias and kept no other: it stays, as the
    // reference's own DEL leaves it.
    let home = rig.host_link("hd0").expect("our DEL of the reference's device: hd0 back");
    assert!(home.contains("alias hd0"), "{home}");

    rig.host.ip(&["link", "set", "hd0", "alias", "orig"]);
    let r = rig.ours("ADD", &conf);
    let (ok, v) = rig.call(Path::new(REFERENCE), "DEL", &rig.pod.path, &with_prev(conf.clone(), &r));
    assert!(ok, "reference DEL: {v}");
    assert!(rig.host_link("hd0").is_some() && !rig.pod_has("net1"), "the reference's DEL of our device");

    // The reference's DEL of our device leaves our saved file: the next ADD of ours reclaims it.
    rig.host.ip(&["link", "set", "hd0", "alias", "orig"]);
    let r = rig.ours("ADD", &conf);
    rig.ours("DEL", &with_prev(conf, &r));
    assert!(rig.host_link("hd0").unwrap().contains("alias orig"), "alias after an ADD over a stale saved file");
}

/// The reference's DEL of a device ours moved in leaves our saved record (the reference knows
/// nothing of it) and the host name as the device's alias. Our next ADD of that device, for any
/// container, or our GC of an attachment the runtime no longer lists, gives the device its own
/// alias back and removes the record.
#[test]
fn a_record_the_reference_orphaned_is_reclaimed() {
    assert!(Path::new(REFERENCE).join("host-device").exists(), "the reference host-device is missing");
    let rig = Rig::new(35);
    // The reference speaks up to 1.0.0; GC needs 1.1.0.
    let conf = rig.conf("1.0.0", json!({}));
    let files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(rig.data.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let orphan = |id: &str| {
        let (ok, r) = rig.call_as(id, &ours(), "ADD", &rig.pod.path, &conf);
        assert!(ok, "{id}: ADD: {r}");
        let (ok, v) = rig.call_as(id, Path::new(REFERENCE), "DEL", &rig.pod.path, &with_prev(conf.clone(), &r));
        assert!(ok, "{id}: reference DEL: {v}");
        assert!(rig.host_link("hd0").unwrap().contains("alias hd0"), "{id}: the reference's DEL");
        assert_eq!(files(), [format!("{id}_net1.json")], "{id}: our record");
    };

    // Our next ADD, for another container.
    orphan("hd-old");
    let (ok, r) = rig.call_as("hd-new", &ours(), "ADD", &rig.pod.path, &conf);
    assert!(ok, "ADD over a stale record: {r}");
    assert_eq!(files(), ["hd-new_net1.json"], "the stale record stays");
    let (ok, v) = rig.call_as("hd-new", &ours(), "DEL", &rig.pod.path, &with_prev(conf.clone(), &r));
    assert!(ok, "DEL: {v}");
    let home = rig.host_link("hd0").unwrap();
    assert!(home.contains("alias orig"), "the device's own alias is lost: {home}");
    assert!(files().is_empty(), "{:?}", files());

    // Our GC: a record whose attachment is still listed stays, the others go.
    orphan("hd-gone");
    std::fs::write(rig.data.path().join("hd-live_net1.json"), r#"{"name":"x9","alias":"","index":1,"mac":null}"#)
        .unwrap();
    let mut gc = rig.conf("1.1.0", json!({}));
    let (ok, v) = rig.call_as("hd-gc", &ours(), "GC", &rig.pod.path, &gc);
    assert!(ok, "GC without a list: {v}");
    assert_eq!(files(), ["hd-gone_net1.json", "hd-live_net1.json"], "GC without a list of attachments");
    gc["cni.dev/valid-attachments"] = json!([{ "containerID": "hd-live", "ifname": "net1" }]);
    let (ok, v) = rig.call_as("hd-gc", &ours(), "GC", &rig.pod.path, &gc);
    assert!(ok, "GC: {v}");
    assert_eq!(files(), ["hd-live_net1.json"], "GC");
    let home = rig.host_link("hd0").unwrap();
    assert!(home.contains("alias orig"), "GC did not give the alias back: {home}");
}

/// No `ipam` at 0.1.0/0.2.0: those results cannot hold an attachment without addresses. Ours
/// fails as the reference does, the same code and message, and then gives the device back as it
/// was (the reference leaves it in the pod).
#[test]
fn no_addresses_at_0_2_0_is_the_references_error() {
    assert!(Path::new(REFERENCE).join("host-device").exists(), "the reference host-device is missing");
    let rig = Rig::new(34);
    for version in ["0.1.0", "0.2.0"] {
        let conf = rig.conf(version, json!({ "ipam": null }));
        let (ok, theirs) = rig.call(Path::new(REFERENCE), "ADD", &rig.pod.path, &conf);
        assert!(!ok, "{version}: reference ADD: {theirs}");
        assert!(rig.pod_has("net1"), "{version}: the reference's failed ADD no longer leaves the device in the pod");
        rig.call(Path::new(REFERENCE), "DEL", &rig.pod.path, &conf);
        rig.host.ip(&["link", "set", "hd0", "alias", "orig", "up"]);

        let (ok, mine) = rig.call(&ours(), "ADD", &rig.pod.path, &conf);
        assert!(!ok, "{version}: ADD: {mine}");
        assert_eq!(mine["code"], theirs["code"], "{version}: ours {mine}, the reference {theirs}");
        assert_eq!(mine["msg"], theirs["msg"], "{version}: ours {mine}, the reference {theirs}");
        assert_eq!(mine["code"], 999, "{version}: {mine}");
        assert!(!rig.pod_has("net1"), "{version}: our failed ADD left the device in the pod");
        let home = rig.host_link("hd0").unwrap_or_else(|| panic!("{version}: hd0 not back"));
        assert!(home.contains("alias orig"), "{version}: {home}");
        assert_eq!(std::fs::read_dir(rig.data.path()).unwrap().count(), 0, "{version}: the saved alias stays");
    }
}

/// The pod renames and re-aliases the device, and puts impostors where a DEL trusting names
/// would look: a veth end called net1 with the device's MAC and the host name as alias, and a
/// macvlan called hd0. DEL moves out only the device ADD moved in (its index), under its host
/// name, with its alias and MTU; the impostors stay in the pod, through a second DEL too.
#[test]
fn del_moves_out_only_the_device_it_moved_in() {
    let rig = Rig::new(36);
    let index = rig.host.sh("cat", &["/sys/class/net/hd0/ifindex"]).trim().to_string();
    let mac = rig.host.sh("cat", &["/sys/class/net/hd0/address"]).trim().to_string();
    let conf = rig.conf("1.0.0", json!({}));
    let prev = with_prev(conf.clone(), &rig.ours("ADD", &conf));
    rig.pod.ip(&["link", "set", "net1", "down"]);
    rig.pod.ip(&["link", "set", "net1", "name", "mine0", "alias", "net1", "mtu", "1400"]);
    rig.pod.ip(&["link", "add", "net1", "type", "veth", "peer", "name", "imp1"]);
    rig.pod.ip(&["link", "set", "net1", "address", &mac, "alias", "hd0"]);
    rig.pod.ip(&["link", "add", "hd0", "link", "imp1", "type", "macvlan", "mode", "bridge"]);
    rig.pod.ip(&["link", "set", "hd0", "alias", "hd0"]);

    rig.ours("DEL", &prev);
    assert!(!rig.pod_has("mine0"), "the device stays in the pod");
    for impostor in ["net1", "imp1", "hd0"] {
        assert!(rig.pod_has(impostor), "{impostor} left the pod");
    }
    let home = rig.host_link("hd0").expect("hd0 back on the host");
    assert!(home.starts_with(&format!("{index}: hd0@")), "not the device ADD moved in: {home}");
    assert!(home.contains("mtu 1300") && home.contains("alias orig") && home.contains(&mac), "{home}");
    assert_eq!(records(&rig), 0, "the record stays");

    rig.ours("DEL", &prev);
    assert!(rig.pod_has("net1") && rig.pod_has("hd0"), "the second DEL moved an impostor");
    assert!(rig.host_link("hd0").unwrap().starts_with(&format!("{index}: hd0@")));
}

/// A device without a permanent MAC is known by its MAC and index together: once the pod changes
/// its MAC, DEL cannot tell it from a link the pod made at that index, so it fails, says which
/// device it looked for and how to go on, and leaves the link in the pod. With the MAC back, DEL
/// returns it. A device the pod deleted is nowhere: DEL succeeds and says so in its log.
#[test]
fn del_of_a_device_the_pod_changed_or_deleted() {
    let rig = Rig::new(37);
    let mac = rig.host.sh("cat", &["/sys/class/net/hd0/address"]).trim().to_string();
    let conf = rig.conf("1.0.0", json!({}));
    let prev = with_prev(conf.clone(), &rig.ours("ADD", &conf));
    rig.pod.ip(&["link", "set", "net1", "address", "0a:58:0a:cb:25:99"]);
    let (ok, v) = rig.call(&ours(), "DEL", &rig.pod.path, &prev);
    let msg = v["msg"].as_str().unwrap_or_default();
    assert!(!ok, "DEL returned a link it cannot identify: {v}");
    assert!(msg.contains("host device hd0") && msg.contains(&format!("give it MAC {mac}")), "{msg}");
    assert!(rig.pod_has("net1") && rig.host_link("hd0").is_none(), "the link left the pod");

    rig.pod.ip(&["link", "set", "net1", "address", &mac]);
    rig.ours("DEL", &prev);
    assert!(rig.host_link("hd0").unwrap().contains("alias orig"));
    assert_eq!(records(&rig), 0);

    let prev = with_prev(conf.clone(), &rig.ours("ADD", &conf));
    rig.pod.ip(&["link", "del", "net1"]);
    let (ok, v, log) = rig.exec(
        "hd-ctr",
        &ours().join("host-device"),
        &ours().display().to_string(),
        &[],
        "DEL",
        &rig.pod.path,
        &prev,
    );
    assert!(ok, "DEL of a device the pod deleted: {v}");
    assert!(log.contains("host device hd0 neither in") && log.contains("looked for index"), "{log}");
    assert_eq!(records(&rig), 0);
}

/// DEL after the pod's namespace is gone, with ADD's record: the kernel returns a physical device
/// to the initial namespace with the index it had and a name of its own (simulated: a link made
/// with that index and MAC, another MTU and alias). DEL gives that one back its name, MTU and
/// alias, and leaves a link that only copies the MAC and carries the host name as alias.
#[test]
fn del_with_the_pod_gone_returns_the_recorded_device() {
    let mut rig = Rig::new(38);
    let index = rig.host.sh("cat", &["/sys/class/net/hd0/ifindex"]).trim().to_string();
    let mac = rig.host.sh("cat", &["/sys/class/net/hd0/address"]).trim().to_string();
    let conf = rig.conf("1.1.0", json!({}));
    let prev = with_prev(conf.clone(), &rig.ours("ADD", &conf));
    rig.pod.delete();
    rig.host.ip(&[
        "link", "add", "dev7", "index", &index, "mtu", "1400", "address", &mac, "type", "veth", "peer", "name", "o1",
    ]);
    rig.host.ip(&["link", "set", "dev7", "alias", "junk"]);
    rig.host.ip(&["link", "add", "net1", "address", &mac, "type", "veth", "peer", "name", "o2"]);
    rig.host.ip(&["link", "set", "net1", "alias", "hd0"]);
    rig.ours("DEL", &prev);
    let home = rig.host_link("hd0").expect("the returned device got its name back");
    assert!(home.starts_with(&format!("{index}: hd0@")), "{home}");
    assert!(home.contains("mtu 1300") && home.contains("alias orig"), "{home}");
    assert!(rig.host_link("net1").unwrap().contains("alias hd0"), "DEL touched a link it did not move");
    assert_eq!(records(&rig), 0);
}

/// ADD failing before or after the move leaves the device on the host exactly as it was: name,
/// MTU, state, alias, MAC, addresses and routes (IPAM runs before the move, the rest is undone).
/// Up with addresses and routes, then down with addresses.
#[test]
fn failed_add_leaves_the_device_as_it_was() {
    let rig = Rig::new(39);
    rig.configure_hd0();
    let ipam = |extra: Value| json!({ "ipam": extra });
    let failing = [
        ("an IPAM that fails", ipam(json!({ "type": "static", "addresses": [{ "address": "not-an-address" }] }))),
        (
            "a route that cannot be added",
            ipam(json!({ "type": "static", "addresses": [{ "address": "10.203.39.2/24" }],
                         "routes": [{ "dst": "10.99.0.0/16", "gw": "10.77.0.1" }] })),
        ),
        ("an address the kernel refuses", json!({})),
    ];
    for down in [false, true] {
        if down {
            rig.host.ip(&["link", "set", "hd0", "down"]);
        }
        let before = rig.hd0_state();
        for (what, extra) in &failing {
            // The pod refuses IPv6 addresses on a device that arrives.
            let refuse = if *what == "an address the kernel refuses" { "1" } else { "0" };
            rig.pod.sh("sysctl", &["-qw", &format!("net.ipv6.conf.default.disable_ipv6={refuse}")]);
            let (ok, v) = rig.call(&ours(), "ADD", &rig.pod.path, &rig.conf("1.0.0", extra.clone()));
            assert!(!ok, "{what}: ADD succeeded: {v}");
            assert_eq!(rig.hd0_state(), before, "{what} (down: {down}): {v}");
            assert!(!rig.pod_has("net1"), "{what}: the device stays in the pod");
            assert_eq!(records(&rig), 0, "{what}: the record stays");
        }
    }
}

/// A failure at each step of ADD (fault points) leaves the device as it was.
#[test]
fn a_failure_at_each_step_of_add_leaves_the_device_as_it_was() {
    let faulty = fault_bin_dir().join("host-device");
    let rig = Rig::new(40);
    rig.configure_hd0();
    let before = rig.hd0_state();
    let conf = rig.conf("1.0.0", json!({}));
    for step in ADD_STEPS {
        let path = ours().display().to_string();
        let (ok, v, _) = rig.exec("hd-ctr", &faulty, &path, &[("CNI_RS_FAIL_AT", step)], "ADD", &rig.pod.path, &conf);
        assert!(!ok && v["msg"].as_str().unwrap_or_default().contains(step), "{step}: {v}");
        assert_eq!(rig.hd0_state(), before, "{step}");
        assert!(!rig.pod_has("net1"), "{step}: the device stays in the pod");
        assert_eq!(records(&rig), 0, "{step}: the record stays");
    }
    // Without a fault the same binary moves the device in.
    let (ok, v, _) = rig.exec("hd-ctr", &faulty, &ours().display().to_string(), &[], "ADD", &rig.pod.path, &conf);
    assert!(ok && rig.pod_has("net1"), "{v}");
}
