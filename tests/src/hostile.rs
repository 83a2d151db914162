//! The hostile-input harness: a plugin binary gets each bad input of a table and must answer with
//! the right CNI error code, a non-zero exit and the error JSON on stdout (never a panic, code 110, or a
//! signal), and leave nothing behind (no bridge port, no pod interface, nothing in or beside the
//! dataDir). Privileged (a real pod netns for the rows that get that far); subnets 10.210.x, each
//! table its own /24 ([`Fixture`]).
//!
//! Each plugin's table is the module named after it (`hostile::bridge` in `hostile/bridge.rs`): its
//! rows and the test body that runs them against the binaries in a directory. The plugin's crate runs
//! it against the debug build (`plugins/<name>/tests/hostile.rs`, `ipam/<name>/tests/hostile.rs`), and
//! `tests/tests/hostile.rs` runs every one of [`TABLES`] against the shipped static binary, so a table
//! is written once and lives under its plugin's name.

use crate::{bridge_ports, require_root, run, unique, LinkGuard, Netns, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub mod bandwidth;
pub mod bridge;
pub mod dhcp;
pub mod dummy;
pub mod firewall;
pub mod host_device;
pub mod host_local;
pub mod ipvlan;
pub mod loopback;
pub mod macvlan;
pub mod portmap;
pub mod ptp;
pub mod sbr;
pub mod r#static;
mod sublink;
pub mod tap;
pub mod tuning;
pub mod vlan;
pub mod vrf;

/// A hostile-input test, run against the plugin binaries in a directory.
pub type Test = fn(&Path);

/// Every single-plugin hostile test, by its test name: what `tests/tests/hostile.rs` runs against
/// the shipped static binary.
pub const TABLES: &[(&str, Test)] = &[
    ("bandwidth_refuses_hostile_input", bandwidth::refuses_hostile_input),
    ("bridge_refuses_hostile_input", bridge::refuses_hostile_input),
    ("dhcp_refuses_hostile_input", dhcp::refuses_hostile_input),
    ("dummy_refuses_hostile_input", dummy::refuses_hostile_input),
    ("firewall_refuses_hostile_input", firewall::refuses_hostile_input),
    ("host_device_refuses_hostile_input", host_device::refuses_hostile_input),
    ("host_local_refuses_hostile_input", host_local::refuses_hostile_input),
    ("host_local_never_follows_a_link_in_its_data_directory", host_local::never_follows_a_link_in_its_data_directory),
    ("ipvlan_refuses_hostile_input", ipvlan::refuses_hostile_input),
    ("loopback_refuses_hostile_input", loopback::refuses_hostile_input),
    ("macvlan_refuses_hostile_input", macvlan::refuses_hostile_input),
    ("portmap_refuses_hostile_input", portmap::refuses_hostile_input),
    ("portmap_refuses_a_held_host_port", portmap::refuses_a_held_host_port),
    ("ptp_refuses_hostile_input", ptp::refuses_hostile_input),
    ("sbr_refuses_hostile_input", sbr::refuses_hostile_input),
    ("static_refuses_hostile_input", r#static::refuses_hostile_input),
    ("tap_refuses_hostile_input", tap::refuses_hostile_input),
    ("tuning_refuses_hostile_input", tuning::refuses_hostile_input),
    ("vlan_refuses_hostile_input", vlan::refuses_hostile_input),
    ("vrf_refuses_hostile_input", vrf::refuses_hostile_input),
];

pub const SYNTAX: u32 = 6;
pub const ENV: u32 = 4;
pub const VERSION: u32 = 1;
pub const CONFIG: u32 = 7;
pub const IO: u32 = 5;

/// What one run of a binary produced.
pub struct Ran {
    pub exit: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub fn exec(bin: &Path, args: &[&str], env: &BTreeMap<String, String>, stdin: &[u8]) -> Ran {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_clear().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
    let mut pipe = child.stdin.take().expect("stdin");
    let input = stdin.to_vec();
    // A plugin may refuse its environment before reading stdin: a broken pipe here is fine.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(&input);
    });
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("stderr")));
    // A plugin that blocks (on a FIFO given as CNI_NETNS, say) fails its row instead of hanging the run.
    let deadline = std::time::Instant::now() + HANG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    let _ = writer.join();
    let (stdout, mut stderr) = (stdout.join().expect("stdout"), stderr.join().expect("stderr"));
    if status.is_none() {
        stderr.push_str(&format!("\n(killed: still running after {} s)", HANG.as_secs()));
    }
    Ran { exit: status.and_then(|s| s.code()), stdout, stderr }
}

/// How long a plugin may take on one row before it counts as hung.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(20);

/// A /24 of 10.210.100-254.0 that no other fixture holds, in this process or any other on the
/// machine: the tables run at once in the test binaries of several crates (each plugin's
/// `tests/hostile.rs`, and `tests/tests/hostile.rs` against the shipped binary), so a counter per
/// process would hand two of them the same subnet. The claim on 10.210.N is an abstract unix socket
/// named `cni-rs-hostile-10.210.N` bound in the node's network namespace: a second bind fails, and
/// the kernel releases it when the listener is dropped or the process dies, leaving no file behind.
fn fixture_subnet() -> (String, UnixListener) {
    for n in 100..=254u8 {
        let name = format!("cni-rs-hostile-10.210.{n}");
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract socket name");
        if let Ok(lock) = UnixListener::bind_addr(&addr) {
            return (format!("10.210.{n}.0/24"), lock);
        }
    }
    panic!("no free fixture subnet: every 10.210.100-254.0/24 is held by a running hostile-input table")
}

/// The shared state of one plugin's table: a pod netns, a scratch dir holding the dataDir, and names.
pub struct Fixture {
    /// Where the plugin binaries are: the debug builds, or the shipped binary under every name.
    pub bins: PathBuf,
    pub pod: Netns,
    pub scratch: TempDir,
    pub network: String,
    pub bridge: String,
    _bridge_guard: LinkGuard,
    _subnet_lock: UnixListener,
    /// The IPAM subnet, one per table: bridge and ptp refuse a gateway another link of the node
    /// holds, and the tables run at once, in the test binaries of several crates and against the shipped binary.
    pub subnet: String,
}

impl Fixture {
    /// A fixture whose plugins are the binaries in `bins`.
    pub fn new(bins: &Path) -> Fixture {
        require_root();
        let (subnet, subnet_lock) = fixture_subnet();
        let scratch = TempDir::new("cnh");
        std::fs::create_dir_all(scratch.path().join("data")).expect("data dir");
        let bridge = unique("cnhb");
        Fixture {
            bins: bins.to_path_buf(),
            pod: Netns::new("cnhp"),
            scratch,
            network: unique("neth"),
            _bridge_guard: LinkGuard(bridge.clone()),
            bridge,
            subnet,
            _subnet_lock: subnet_lock,
        }
    }
    pub fn data_dir(&self) -> String {
        self.scratch.path().join("data").display().to_string()
    }
    pub fn env(&self, command: &str) -> BTreeMap<String, String> {
        [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", unique("ctrh")),
            ("CNI_NETNS", self.pod.path.clone()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", self.bins.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
    pub fn ipam(&self) -> Value {
        json!({ "type": "host-local", "ranges": [[{ "subnet": self.subnet }]], "dataDir": self.data_dir() })
    }
    pub fn prev_result(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{ "name": "eth0", "sandbox": self.pod.path }],
            "ips": [{ "address": "10.210.3.2/24", "gateway": "10.210.3.1", "interface": 0 }]
        })
    }
    /// The master link of the macvlan and ipvlan tables.
    pub fn master(&self) -> String {
        format!("{}m", self.bridge)
    }
    /// A valid netconf for `plugin`.
    pub fn base(&self, plugin: &str) -> Value {
        match plugin {
            "bridge" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "bridge", "bridge": self.bridge,
                "isGateway": true, "ipMasq": true, "ipam": self.ipam()
            }),
            "host-local" => {
                json!({ "cniVersion": "1.0.0", "name": self.network, "type": "bridge", "ipam": self.ipam() })
            }
            "loopback" => json!({ "cniVersion": "1.0.0", "name": self.network, "type": "loopback" }),
            "portmap" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "portmap", "backend": "nftables",
                "capabilities": { "portMappings": true },
                "runtimeConfig": { "portMappings": [{ "hostPort": 18080, "containerPort": 80, "protocol": "tcp" }] },
                "prevResult": self.prev_result()
            }),
            "tuning" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "tuning", "dataDir": self.data_dir(),
                "mtu": 1400, "sysctl": { "net.ipv4.conf.IFNAME.arp_ignore": "1" },
                "prevResult": self.prev_result()
            }),
            "sbr" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "sbr", "prevResult": self.prev_result()
            }),
            "static" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "bridge",
                "ipam": { "type": "static", "addresses": [{ "address": "10.210.5.2/24", "gateway": "10.210.5.1" }] }
            }),
            "bandwidth" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "bandwidth",
                "ingressRate": 8_000_000, "ingressBurst": 400_000, "egressRate": 8_000_000, "egressBurst": 400_000,
                "prevResult": self.prev_result()
            }),
            "firewall" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "firewall", "prevResult": self.prev_result()
            }),
            "ptp" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "ptp", "ipMasq": true, "ipam": self.ipam()
            }),
            "host-device" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "host-device", "device": "cnhdnone0",
                "ipam": self.ipam()
            }),
            // The master is `<bridge>m`, which the macvlan and ipvlan tables create (a veth, MTU 1500).
            "macvlan" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "macvlan", "master": self.master(),
                "ipam": self.ipam()
            }),
            "ipvlan" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "ipvlan", "master": self.master(),
                "ipam": self.ipam()
            }),
            "dummy" => json!({ "cniVersion": "1.0.0", "name": self.network, "type": "dummy", "ipam": self.ipam() }),
            "vlan" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "vlan", "master": "lo", "vlanId": 10,
                "ipam": self.ipam()
            }),
            "tap" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "tap", "mtu": 1400, "ipam": self.ipam()
            }),
            "vrf" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "vrf", "vrfname": "blue",
                "prevResult": self.prev_result()
            }),
            // No daemon listens at this socket: a row that got past validation would fail with
            // code 11 (daemon unreachable), not the row's code.
            "dhcp" => json!({
                "cniVersion": "1.0.0", "name": self.network, "type": "bridge",
                "ipam": { "type": "dhcp",
                          "daemonSocketPath": self.scratch.path().join("no-daemon.sock").display().to_string() }
            }),
            other => panic!("no base config for {other}"),
        }
    }

    /// Everything a failed invocation must not leave: a port on the bridge (the bridge itself is
    /// shared and stays, as the reference's does), a pod interface, a reservation in the dataDir,
    /// any file beside it.
    pub fn assert_nothing_left(&self, what: &str) {
        let ports = bridge_ports(&self.bridge);
        assert!(ports.is_empty(), "{what}: ports left on {}: {ports:?}", self.bridge);
        let links = self.pod.sh("ip", &["-o", "link", "show"]);
        assert_eq!(links.lines().count(), 1, "{what}: pod netns has more than lo:\n{links}");
        let beside: Vec<String> = std::fs::read_dir(self.scratch.path())
            .expect("scratch")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(beside, ["data"], "{what}: files written beside the dataDir");
        let inside = list_tree(&self.scratch.path().join("data"));
        assert!(inside.iter().all(|f| !is_reservation(f)), "{what}: reservation left in the dataDir: {inside:?}");
        // Our chains carry the network name in their comments (bridge's masquerade, portmap).
        let rules = run("nft", &["list", "ruleset"]);
        let rules = String::from_utf8_lossy(&rules.stdout);
        assert!(!rules.contains(&format!("net={}", self.network)), "{what}: firewall rules left:\n{rules}");
    }
}

fn is_reservation(path: &str) -> bool {
    path.rsplit('/').next().is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok())
}

/// Every file below `dir`, relative.
pub fn list_tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(list_tree(&p).into_iter().map(|f| format!("{}/{f}", e.file_name().to_string_lossy())));
        } else {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// One row: what to feed a plugin and the code it must answer with.
pub struct Case {
    pub label: String,
    pub stdin: Vec<u8>,
    pub env: Vec<(&'static str, Option<String>)>,
    pub want: u32,
}

pub fn case(label: impl Into<String>, stdin: impl Into<Vec<u8>>, want: u32) -> Case {
    Case { label: label.into(), stdin: stdin.into(), env: Vec::new(), want }
}

pub fn env_case(label: impl Into<String>, stdin: &Value, env: Vec<(&'static str, Option<String>)>, want: u32) -> Case {
    Case { label: label.into(), stdin: stdin.to_string().into_bytes(), env, want }
}

/// `base` with `path` (dot-separated object keys) set to `v`.
pub fn with(base: &Value, path: &str, v: Value) -> Vec<u8> {
    let mut out = base.clone();
    let mut cur = &mut out;
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        if cur.get(*k).is_none() {
            cur[*k] = json!({});
        }
        cur = &mut cur[*k];
    }
    cur[keys[keys.len() - 1]] = v;
    out.to_string().into_bytes()
}

/// `base` with the top-level `key` (which may hold dots) set to `v`.
pub fn with_top(base: &Value, key: &str, v: Value) -> Vec<u8> {
    let mut out = base.clone();
    out[key] = v;
    out.to_string().into_bytes()
}

pub fn without(base: &Value, key: &str) -> Vec<u8> {
    let mut out = base.clone();
    out.as_object_mut().expect("object").remove(key);
    out.to_string().into_bytes()
}

pub fn with_value(base: &Value, key: &str, v: Value) -> Value {
    serde_json::from_slice(&with(base, key, v)).expect("json")
}

pub fn without_keys(base: &Value, keys: &[&str]) -> Value {
    let mut v = base.clone();
    for k in keys {
        v.as_object_mut().expect("object").remove(*k);
    }
    v
}

/// A deterministic xorshift stream, so a failing case is reproducible.
pub fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The rows every plugin shares: syntax, size, depth, versions, names, ids, interface names, env.
pub fn common_cases(f: &Fixture, plugin: &str) -> Vec<Case> {
    let base = f.base(plugin);
    let text = base.to_string();
    let mut cases = vec![
        case("truncated JSON", &text.as_bytes()[..text.len() / 2], SYNTAX),
        case("not JSON", "cniVersion=1.0.0 name=x", SYNTAX),
        case("empty stdin", "", SYNTAX),
        case("whitespace stdin", " \n\t ", SYNTAX),
        case("a JSON array", "[1,2,3]", SYNTAX),
        case("a JSON string", "\"bridge\"", SYNTAX),
        case("NUL bytes", vec![0u8; 4096], SYNTAX),
        case("invalid UTF-8 in a string", [&b"{\"cniVersion\":\"1.0.0\",\"name\":\"\xff\xfe\"}"[..]].concat(), SYNTAX),
        case("24 MB of random bytes", random_bytes(24 << 20, 0x9e37_79b9_7f4a_7c15), SYNTAX),
        case("arrays nested 400000 deep", "[".repeat(400_000), SYNTAX),
        case("objects nested 200000 deep", "{\"a\":".repeat(200_000), SYNTAX),
        case(
            "a key nested 300000 deep",
            format!(
                "{{\"cniVersion\":\"1.0.0\",\"name\":\"n\",\"ipam\":{}{}}}",
                "[".repeat(300_000),
                "]".repeat(300_000)
            ),
            SYNTAX,
        ),
        case("duplicate garbage after the object", format!("{text} {{"), SYNTAX),
        case(
            "valid JSON one byte over the 16 MiB limit",
            {
                let mut over = text.clone().into_bytes();
                over.resize((16 << 20) + 1, b' ');
                over
            },
            SYNTAX,
        ),
        case("a million numbers", with(&base, "pad", json!(vec![1; 1_000_000])), SYNTAX),
        case(
            "300 000 port mappings",
            with(
                &base,
                "pad",
                json!(vec![json!({ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }); 300_000]),
            ),
            SYNTAX,
        ),
        case("unknown cniVersion", with(&base, "cniVersion", json!("9.9.9")), VERSION),
        case("four-part cniVersion", with(&base, "cniVersion", json!("1.0.0.0")), VERSION),
        case("cniVersion not a number", with(&base, "cniVersion", json!("one")), VERSION),
        case("cniVersion a number", with(&base, "cniVersion", json!(1.0)), CONFIG),
        case("cniVersion an object", with(&base, "cniVersion", json!({})), CONFIG),
        case("no name", without(&base, "name"), CONFIG),
        case("name a number", with(&base, "name", json!(5)), CONFIG),
        case("name with /", with(&base, "name", json!("a/b")), CONFIG),
        case("name ..", with(&base, "name", json!("..")), CONFIG),
        case("name ../escape", with(&base, "name", json!("../escape")), CONFIG),
        case("name with shell text", with(&base, "name", json!("n;rm -rf /tmp/x")), CONFIG),
        case("name $(…)", with(&base, "name", json!("$(touch /tmp/pwn)")), CONFIG),
        case("name non-ASCII", with(&base, "name", json!("réseau")), CONFIG),
        case("name with a newline", with(&base, "name", json!("n\nx")), CONFIG),
        case("type a number", with(&base, "type", json!(5)), CONFIG),
        case("ipam a string", with(&base, "ipam", json!("host-local")), CONFIG),
        case("ipam.type a number", with(&base, "ipam", json!({ "type": 5 })), CONFIG),
        case("dns a number", with(&base, "dns", json!(5)), CONFIG),
        case("dns.nameservers a string", with(&base, "dns", json!({ "nameservers": "8.8.8.8" })), CONFIG),
        // Go decodes a struct from an object only (serde_json alone took an array, field by field).
        case("dns an array of its fields", with(&base, "dns", json!([["8.8.8.8"], "", [], []])), CONFIG),
        case("capabilities an array", with(&base, "capabilities", json!([])), CONFIG),
        case("capability a number", with(&base, "capabilities", json!({ "portMappings": 1 })), CONFIG),
        case("runtimeConfig a number", with(&base, "runtimeConfig", json!(5)), CONFIG),
        case("args a string", with(&base, "args", json!("x")), CONFIG),
        case("prevResult garbage", with(&base, "prevResult", json!("garbage")), CONFIG),
        case(
            "prevResult ips garbage",
            with(&base, "prevResult", json!({ "cniVersion": "1.0.0", "ips": [{ "address": "x" }] })),
            CONFIG,
        ),
        case("prevResult of an unknown version", with(&base, "prevResult", json!({ "cniVersion": "0.0.7" })), VERSION),
        case(
            "prevResult 0.2.0-shaped with a bad ip4",
            with(&base, "prevResult", json!({ "cniVersion": "0.2.0", "ip4": { "ip": "10.210.3.2" } })),
            CONFIG,
        ),
        case("valid-attachments a string", with_top(&base, "cni.dev/valid-attachments", json!("x")), CONFIG),
    ];
    let v = &base;
    let set = |k: &'static str, val: &str| vec![(k, Some(val.to_string()))];
    for (label, env) in [
        ("CNI_COMMAND unknown", set("CNI_COMMAND", "ATTACH")),
        ("CNI_COMMAND lower case", set("CNI_COMMAND", "add")),
        ("CNI_CONTAINERID missing", vec![("CNI_CONTAINERID", None)]),
        ("CNI_CONTAINERID with /", set("CNI_CONTAINERID", "a/b")),
        ("CNI_CONTAINERID ..", set("CNI_CONTAINERID", "..")),
        ("CNI_CONTAINERID ../../etc/passwd", set("CNI_CONTAINERID", "../../etc/passwd")),
        ("CNI_CONTAINERID shell text", set("CNI_CONTAINERID", "x;reboot")),
        ("CNI_CONTAINERID non-ASCII", set("CNI_CONTAINERID", "contenedor-ñ")),
        ("CNI_CONTAINERID with CR LF", set("CNI_CONTAINERID", "a\r\nb")),
        ("CNI_IFNAME missing", vec![("CNI_IFNAME", None)]),
        ("CNI_IFNAME 16 bytes", set("CNI_IFNAME", "eth0123456789abc")),
        ("CNI_IFNAME with /", set("CNI_IFNAME", "et/h0")),
        ("CNI_IFNAME ..", set("CNI_IFNAME", "..")),
        ("CNI_IFNAME with a space", set("CNI_IFNAME", "eth 0")),
        ("CNI_IFNAME with :", set("CNI_IFNAME", "eth0:1")),
        ("CNI_PATH missing", vec![("CNI_PATH", None)]),
    ] {
        cases.push(env_case(label, v, env, ENV));
    }
    // Plugins that read CNI_ARGS refuse what they cannot read on ADD; portmap and loopback read
    // none and ignore them (ignores_cni_args_it_does_not_read).
    if reads_cni_args(plugin) {
        for (label, args) in BAD_CNI_ARGS {
            cases.push(env_case(label, v, set("CNI_ARGS", args), ENV));
        }
    }
    cases
}

pub const BAD_CNI_ARGS: [(&str, &str); 5] = [
    ("CNI_ARGS unknown key", "NOSUCHKEY=1"),
    ("CNI_ARGS not K=V", "justtext"),
    ("CNI_ARGS K=V=V", "A=b=c"),
    ("CNI_ARGS trailing ;", "K8S_POD_NAME=a;"),
    ("CNI_ARGS unknown key, IgnoreUnknown=0", "IgnoreUnknown=0;NOSUCHKEY=1"),
];

pub fn reads_cni_args(plugin: &str) -> bool {
    matches!(plugin, "bridge" | "host-local" | "tuning" | "static" | "ptp" | "host-device" | "dummy" | "vlan" | "tap")
}

/// Rows for plugins that open CNI_NETNS on ADD.
pub fn netns_cases(f: &Fixture, plugin: &str) -> Vec<Case> {
    let base = f.base(plugin);
    let file = f.scratch.path().join("data").join("netns-file");
    let dir = f.scratch.path().join("data").join("netns-dir");
    let missing = f.scratch.path().join("data").join("no-such-netns");
    let fifo = f.scratch.path().join("data").join("netns-fifo");
    vec![
        env_case("CNI_NETNS missing on ADD", &base, vec![("CNI_NETNS", None)], ENV),
        env_case("CNI_NETNS a regular file", &base, vec![("CNI_NETNS", Some(file.display().to_string()))], ENV),
        env_case("CNI_NETNS a directory", &base, vec![("CNI_NETNS", Some(dir.display().to_string()))], ENV),
        // Refused without being opened: opening a FIFO would wait for a writer for good.
        env_case("CNI_NETNS a FIFO", &base, vec![("CNI_NETNS", Some(fifo.display().to_string()))], ENV),
        env_case("CNI_NETNS does not exist", &base, vec![("CNI_NETNS", Some(missing.display().to_string()))], ENV),
        env_case(
            "CNI_NETNS not a netns (/proc/self/ns/uts)",
            &base,
            vec![("CNI_NETNS", Some("/proc/self/ns/uts".into()))],
            ENV,
        ),
        env_case("CNI_NETNS relative garbage", &base, vec![("CNI_NETNS", Some("../../../../etc/passwd".into()))], ENV),
        env_case(
            "CNI_NETNS an empty file (an unmounted netns)",
            &base,
            vec![("CNI_NETNS", Some(f.scratch.path().join("data").join("netns-empty").display().to_string()))],
            ENV,
        ),
        // ADD only here: DEL and CHECK in the plugin's own namespace are tested in a namespace
        // standing in for the node (plugins/bridge/tests/del.rs), as a regression there would delete node links.
        env_case("CNI_NETNS the plugin's own", &base, vec![("CNI_NETNS", Some("/proc/self/ns/net".into()))], ENV),
    ]
}

pub fn env_for(f: &Fixture, c: &Case, command: &str) -> BTreeMap<String, String> {
    let mut env = f.env(command);
    for (k, v) in &c.env {
        match v {
            Some(v) => env.insert(k.to_string(), v.clone()),
            None => env.remove(*k),
        };
    }
    env
}

/// Run every row through `plugin`; collect every mismatch, so one run shows all of them.
pub fn run_table(f: &Fixture, plugin: &str, cases: &[Case]) {
    std::fs::write(f.scratch.path().join("data").join("netns-file"), "not a netns").expect("write");
    std::fs::write(f.scratch.path().join("data").join("netns-empty"), "").expect("write");
    std::fs::create_dir_all(f.scratch.path().join("data").join("netns-dir")).expect("mkdir");
    let fifo = f.scratch.path().join("data").join("netns-fifo");
    if !fifo.exists() {
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo {}", fifo.display());
    }
    let bin = f.bins.join(plugin);
    let mut failures = Vec::new();
    for c in cases {
        let env = env_for(f, c, "ADD");
        let ran = exec(&bin, &[], &env, &c.stdin);
        let what = format!("{plugin}: {}", c.label);
        if let Err(why) = check_error(&ran, c.want) {
            failures.push(format!("{what}: {why}"));
        }
        f.assert_nothing_left(&what);
    }
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// A plugin's failure as the spec wants it: exit 1, error JSON on stdout with the code, no panic.
pub fn check_error(ran: &Ran, want: u32) -> Result<(), String> {
    let Some(exit) = ran.exit else { return Err(format!("killed by a signal; stderr: {}", ran.stderr)) };
    if exit == 0 {
        return Err(format!("succeeded, wanted code {want}: {}", ran.stdout));
    }
    let v: Value =
        serde_json::from_str(&ran.stdout).map_err(|e| format!("stdout is not JSON ({e}): {:?}", ran.stdout))?;
    let code = v["code"].as_u64().ok_or_else(|| format!("no code: {v}"))?;
    if !v["cniVersion"].is_string() || v["msg"].as_str().is_none_or(str::is_empty) {
        return Err(format!("error JSON lacks cniVersion or msg: {v}"));
    }
    if code == 110 || ran.stderr.contains("panicked") {
        return Err(format!("internal error (a panic): {v} {}", ran.stderr));
    }
    if code != u64::from(want) {
        return Err(format!("code {code}, wanted {want}: {}", v["msg"]));
    }
    Ok(())
}
