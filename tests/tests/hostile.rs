//! Hostile input for every plugin binary and for cnitool: each bad input gets the right CNI error
//! code, a non-zero exit, the error JSON on stdout (never a panic, code 110, or a signal), and leaves
//! nothing behind (no bridge, no port, no pod interface, nothing in or beside the dataDir).
//! Privileged (a real pod netns for the cases that get that far); subnets 10.210.x (each table its own /24).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, bridge_ports, require_root, run, unique, LinkGuard, Netns, TempDir};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

const SYNTAX: u32 = 6;
const ENV: u32 = 4;
const VERSION: u32 = 1;
const CONFIG: u32 = 7;
const IO: u32 = 5;

/// What one run of a binary produced.
struct Ran {
    exit: Option<i32>,
    stdout: String,
    stderr: String,
}

fn exec(bin: &Path, args: &[&str], env: &BTreeMap<String, String>, stdin: &[u8]) -> Ran {
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
const HANG: std::time::Duration = std::time::Duration::from_secs(20);

/// 10.210.100-179.0/24 in this process, 10.210.180-254.0/24 in the shipped binary's child run.
fn fixture_subnet() -> String {
    static N: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
    let (base, span) = if cni_tests::in_shipped_run() { (180, 75) } else { (100, 80) };
    format!("10.210.{}.0/24", base + N.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span)
}

/// The shared state of one plugin's table: a pod netns, a scratch dir holding the dataDir, and names.
struct Fixture {
    pod: Netns,
    scratch: TempDir,
    network: String,
    bridge: String,
    _bridge_guard: LinkGuard,
    /// The IPAM subnet, one per table: bridge and ptp refuse a gateway another link of the node
    /// holds, and the tables run at once (and again in a child process for the shipped binary).
    subnet: String,
}

impl Fixture {
    fn new() -> Fixture {
        require_root();
        let scratch = TempDir::new("cnh");
        std::fs::create_dir_all(scratch.path().join("data")).expect("data dir");
        let bridge = unique("cnhb");
        Fixture {
            pod: Netns::new("cnhp"),
            scratch,
            network: unique("neth"),
            _bridge_guard: LinkGuard(bridge.clone()),
            bridge,
            subnet: fixture_subnet(),
        }
    }
    fn data_dir(&self) -> String {
        self.scratch.path().join("data").display().to_string()
    }
    fn env(&self, command: &str) -> BTreeMap<String, String> {
        [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", unique("ctrh")),
            ("CNI_NETNS", self.pod.path.clone()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", bin_dir().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
    fn ipam(&self) -> Value {
        json!({ "type": "host-local", "ranges": [[{ "subnet": self.subnet }]], "dataDir": self.data_dir() })
    }
    fn prev_result(&self) -> Value {
        json!({
            "cniVersion": "1.0.0",
            "interfaces": [{ "name": "eth0", "sandbox": self.pod.path }],
            "ips": [{ "address": "10.210.3.2/24", "gateway": "10.210.3.1", "interface": 0 }]
        })
    }
    /// The master link of the macvlan and ipvlan tables.
    fn master(&self) -> String {
        format!("{}m", self.bridge)
    }
    /// A valid netconf for `plugin`.
    fn base(&self, plugin: &str) -> Value {
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
    fn assert_nothing_left(&self, what: &str) {
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
fn list_tree(dir: &Path) -> Vec<String> {
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
struct Case {
    label: String,
    stdin: Vec<u8>,
    env: Vec<(&'static str, Option<String>)>,
    want: u32,
}

fn case(label: impl Into<String>, stdin: impl Into<Vec<u8>>, want: u32) -> Case {
    Case { label: label.into(), stdin: stdin.into(), env: Vec::new(), want }
}

fn env_case(label: impl Into<String>, stdin: &Value, env: Vec<(&'static str, Option<String>)>, want: u32) -> Case {
    Case { label: label.into(), stdin: stdin.to_string().into_bytes(), env, want }
}

/// `base` with `path` (dot-separated object keys) set to `v`.
fn with(base: &Value, path: &str, v: Value) -> Vec<u8> {
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
fn with_top(base: &Value, key: &str, v: Value) -> Vec<u8> {
    let mut out = base.clone();
    out[key] = v;
    out.to_string().into_bytes()
}

fn without(base: &Value, key: &str) -> Vec<u8> {
    let mut out = base.clone();
    out.as_object_mut().expect("object").remove(key);
    out.to_string().into_bytes()
}

/// A deterministic xorshift stream, so a failing case is reproducible.
fn random_bytes(len: usize, mut seed: u64) -> Vec<u8> {
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
fn common_cases(f: &Fixture, plugin: &str) -> Vec<Case> {
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

const BAD_CNI_ARGS: [(&str, &str); 5] = [
    ("CNI_ARGS unknown key", "NOSUCHKEY=1"),
    ("CNI_ARGS not K=V", "justtext"),
    ("CNI_ARGS K=V=V", "A=b=c"),
    ("CNI_ARGS trailing ;", "K8S_POD_NAME=a;"),
    ("CNI_ARGS unknown key, IgnoreUnknown=0", "IgnoreUnknown=0;NOSUCHKEY=1"),
];

fn reads_cni_args(plugin: &str) -> bool {
    matches!(plugin, "bridge" | "host-local" | "tuning" | "static" | "ptp" | "host-device" | "dummy" | "vlan" | "tap")
}

/// Rows for plugins that open CNI_NETNS on ADD.
fn netns_cases(f: &Fixture, plugin: &str) -> Vec<Case> {
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

fn bridge_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("bridge");
    let mut cases = Vec::new();
    for key in [
        "isGateway",
        "isDefaultGateway",
        "forceAddress",
        "ipMasq",
        "hairpinMode",
        "promiscMode",
        "preserveDefaultVlan",
        "macspoofchk",
        "enabledad",
        "disableContainerInterface",
        "portIsolation",
    ] {
        cases.push(case(format!("{key} a number"), with(&b, key, json!(1)), CONFIG));
        cases.push(case(format!("{key} \"yes\""), with(&b, key, json!("yes")), CONFIG));
        cases.push(case(format!("{key} an object"), with(&b, key, json!({})), CONFIG));
    }
    for (key, bad) in [
        ("bridge", json!(5)),
        ("bridge", json!(["cni0"])),
        ("ipMasqBackend", json!(5)),
        ("mtu", json!("1500")),
        ("mtu", json!(1500.5)),
        ("mtu", json!(true)),
        ("vlan", json!("10")),
        ("vlanTrunk", json!(5)),
        ("vlanTrunk", json!([5])),
        ("vlanTrunk", json!([{ "id": "5" }])),
        ("vlanTrunk", json!([[10, 20, null]])),
    ] {
        cases.push(case(format!("{key} = {bad}"), with(&b, key, bad), CONFIG));
    }
    cases.extend([
        case("bridge name 16 bytes", with(&b, "bridge", json!("br0123456789abcd")), CONFIG),
        case("bridge name with /", with(&b, "bridge", json!("br/0")), CONFIG),
        case("bridge name ..", with(&b, "bridge", json!("..")), CONFIG),
        case("bridge name with a space", with(&b, "bridge", json!("br 0")), CONFIG),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 67", with(&b, "mtu", json!(67)), CONFIG),
        case("mtu 65536", with(&b, "mtu", json!(65536)), CONFIG),
        case("mtu huge", with(&b, "mtu", json!(9_007_199_254_740_993_i64)), CONFIG),
        case("mtu beyond i64", with(&b, "mtu", json!(1e30)), CONFIG),
        case("vlan -1", with(&b, "vlan", json!(-1)), CONFIG),
        case("vlan 4095", with(&b, "vlan", json!(4095)), CONFIG),
        case("vlanTrunk min > max", with(&b, "vlanTrunk", json!([{ "minID": 20, "maxID": 10 }])), CONFIG),
        case("vlanTrunk half a range", with(&b, "vlanTrunk", json!([{ "minID": 20 }])), CONFIG),
        case("ipMasqBackend unknown", with(&b, "ipMasqBackend", json!("pf")), CONFIG),
        case("macspoofchk a number", with(&b, "macspoofchk", json!(1)), CONFIG),
        case("hairpin with promisc", [with(&b, "hairpinMode", json!(true))].concat(), 0),
        case("runtimeConfig.mac not a MAC", with(&b, "runtimeConfig", json!({ "mac": "zz:zz" })), CONFIG),
        case("runtimeConfig.mac multicast", with(&b, "runtimeConfig", json!({ "mac": "01:00:5e:00:00:01" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        case("args.cni.mac a number", with(&b, "args", json!({ "cni": { "mac": 5 } })), CONFIG),
        case("ipam.type with /", with(&b, "ipam", json!({ "type": "../../bin/sh" })), CONFIG),
        case("ipam.type ..", with(&b, "ipam", json!({ "type": ".." })), CONFIG),
        case(
            "isDefaultGateway without ipam",
            without(&with_value(&b, "isDefaultGateway", json!(true)), "ipam"),
            CONFIG,
        ),
        case("disableContainerInterface with ipam", with(&b, "disableContainerInterface", json!(true)), CONFIG),
        case(
            "ipam subnet not a CIDR (delegated)",
            with(&b, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
            CONFIG,
        ),
        case("ipam plugin missing", with(&b, "ipam", json!({ "type": "no-such-ipam" })), CONFIG),
        case("ipam.type bridge (itself: a cycle)", with(&b, "ipam", json!({ "type": "bridge" })), CONFIG),
        case("ipam.type portmap (not IPAM)", with(&b, "ipam", json!({ "type": "portmap" })), CONFIG),
        case("ipam.type loopback (not IPAM)", with(&b, "ipam", json!({ "type": "loopback" })), CONFIG),
        env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=nope".into()))], CONFIG),
        env_case("CNI_ARGS IP not an IP (delegated)", &b, vec![("CNI_ARGS", Some("IP=10.210.1.300".into()))], ENV),
        case(
            "isGateway vlan: bridge name too long for <bridge>.<vlan>",
            with(
                &with_value(&with_value(&b, "bridge", json!("br0123456789a")), "isGateway", json!(true)),
                "vlan",
                json!(100),
            ),
            CONFIG,
        ),
    ]);
    // The hairpin-with-promisc row is built here, since both keys must be set.
    let last = cases.iter_mut().find(|c| c.label == "hairpin with promisc").expect("row");
    last.stdin = with(&with_value(&b, "hairpinMode", json!(true)), "promiscMode", json!(true));
    last.want = CONFIG;
    cases
}

fn with_value(base: &Value, key: &str, v: Value) -> Value {
    serde_json::from_slice(&with(base, key, v)).expect("json")
}

fn host_local_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("host-local");
    let dd = f.data_dir();
    let ipam = |extra: Value| {
        let mut i = json!({ "type": "host-local", "dataDir": dd });
        for (k, v) in extra.as_object().expect("object") {
            i[k] = v.clone();
        }
        with(&b, "ipam", i)
    };
    let file_parent = f.scratch.path().join("data").join("a-file");
    std::fs::write(&file_parent, "").expect("write file");
    vec![
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without ranges", ipam(json!({})), CONFIG),
        case("subnet a number", ipam(json!({ "subnet": 5 })), CONFIG),
        case("subnet not a CIDR", ipam(json!({ "subnet": "banana" })), CONFIG),
        case("subnet a bare address", ipam(json!({ "subnet": "10.210.1.0" })), CONFIG),
        case("subnet prefix 33", ipam(json!({ "subnet": "10.210.1.0/33" })), CONFIG),
        case("subnet prefix -1", ipam(json!({ "subnet": "10.210.1.0/-1" })), CONFIG),
        case("subnet /32", ipam(json!({ "subnet": "10.210.1.7/32" })), CONFIG),
        case("subnet /31", ipam(json!({ "subnet": "10.210.1.6/31" })), CONFIG),
        case("subnet /128", ipam(json!({ "ranges": [[{ "subnet": "fd00:210::1/128" }]] })), CONFIG),
        case("subnet /127", ipam(json!({ "ranges": [[{ "subnet": "fd00:210::/127" }]] })), CONFIG),
        case("subnet with host bits", ipam(json!({ "subnet": "10.210.1.5/24" })), CONFIG),
        case(
            "rangeStart outside the subnet",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "10.210.2.10" }]] })),
            CONFIG,
        ),
        case(
            "rangeEnd outside the subnet",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeEnd": "10.210.9.10" }]] })),
            CONFIG,
        ),
        case(
            "rangeStart after rangeEnd",
            ipam(
                json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "10.210.1.90", "rangeEnd": "10.210.1.10" }]] }),
            ),
            CONFIG,
        ),
        case(
            "rangeStart of the other family",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "fd00::5" }]] })),
            CONFIG,
        ),
        case(
            "rangeStart a number",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": 5 }]] })),
            CONFIG,
        ),
        case(
            "gateway not an IP",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "gateway": "gw" }]] })),
            CONFIG,
        ),
        case(
            "overlapping ranges in a set",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }, { "subnet": "10.210.1.128/25" }]] })),
            CONFIG,
        ),
        case(
            "overlapping range sets",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }], [{ "subnet": "10.210.0.0/16" }]] })),
            CONFIG,
        ),
        case(
            "mixed families in a set",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }, { "subnet": "fd00:210::/64" }]] })),
            CONFIG,
        ),
        case("ranges a string", ipam(json!({ "ranges": "10.210.1.0/24" })), CONFIG),
        case("ranges of numbers", ipam(json!({ "ranges": [[5]] })), CONFIG),
        case("an empty range set", ipam(json!({ "ranges": [[]] })), CONFIG),
        case("routes a string", ipam(json!({ "subnet": "10.210.1.0/24", "routes": "0.0.0.0/0" })), CONFIG),
        case(
            "route dst not a CIDR",
            ipam(json!({ "subnet": "10.210.1.0/24", "routes": [{ "dst": "nowhere" }] })),
            CONFIG,
        ),
        case(
            "route gw not an IP",
            ipam(json!({ "subnet": "10.210.1.0/24", "routes": [{ "dst": "0.0.0.0/0", "gw": 5 }] })),
            CONFIG,
        ),
        case("dataDir a number", ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": 5 })), CONFIG),
        case("dataDir relative", ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": "var/lib/cni" })), CONFIG),
        case(
            "dataDir under a regular file (cannot be written)",
            ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": file_parent.join("sub").display().to_string() })),
            IO,
        ),
        case(
            "dataDir in /proc (cannot be written)",
            ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": "/proc/cni-rs-hostile" })),
            IO,
        ),
        case("resolvConf a number", ipam(json!({ "subnet": "10.210.1.0/24", "resolvConf": 5 })), CONFIG),
        case(
            "resolvConf missing file",
            ipam(json!({ "subnet": "10.210.1.0/24", "resolvConf": "/nonexistent/resolv.conf" })),
            IO,
        ),
        case(
            "runtimeConfig.ips a string",
            with(
                &with_value(&b, "ipam", json!({ "type": "host-local", "subnet": "10.210.1.0/24", "dataDir": dd })),
                "runtimeConfig",
                json!({ "ips": "10.210.1.5" }),
            ),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips not IPs",
            with(
                &with_value(&b, "ipam", json!({ "type": "host-local", "subnet": "10.210.1.0/24", "dataDir": dd })),
                "runtimeConfig",
                json!({ "ips": ["x"] }),
            ),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips outside every range",
            with(&b, "runtimeConfig", json!({ "ips": ["10.219.9.9"] })),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips the network address",
            with(&b, "runtimeConfig", json!({ "ips": [f.subnet.trim_end_matches("/24")] })),
            CONFIG,
        ),
        case(
            "runtimeConfig.ipRanges garbage",
            with(&b, "runtimeConfig", json!({ "ipRanges": [[{ "subnet": "x" }]] })),
            CONFIG,
        ),
        case("args.cni.ips numbers", with(&b, "args", json!({ "cni": { "ips": [5] } })), CONFIG),
        case("args.cni a string", with(&b, "args", json!({ "cni": "x" })), CONFIG),
        env_case("CNI_ARGS IP not an IP", &b, vec![("CNI_ARGS", Some("IP=10.210.1.300".into()))], ENV),
        env_case("CNI_ARGS IP outside the range", &b, vec![("CNI_ARGS", Some("IP=10.219.0.5".into()))], CONFIG),
        case(
            "keepReservationsOnReboot a number",
            ipam(json!({ "subnet": "10.210.1.0/24", "keepReservationsOnReboot": 1 })),
            CONFIG,
        ),
        // The test hook that fakes the boot takes a UUID, never a path.
        env_case("CNI_RS_TEST_BOOT a path", &b, vec![("CNI_RS_TEST_BOOT", Some("../../etc/passwd,1".into()))], ENV),
        env_case(
            "CNI_RS_TEST_BOOT without a start",
            &b,
            vec![("CNI_RS_TEST_BOOT", Some("0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00".into()))],
            ENV,
        ),
    ]
}

fn bandwidth_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("bandwidth");
    let rt = |v: Value| {
        with(
            &without_keys(&b, &["ingressRate", "ingressBurst", "egressRate", "egressBurst"]),
            "runtimeConfig",
            json!({ "bandwidth": v }),
        )
    };
    vec![
        case("ingressRate without ingressBurst", with(&b, "ingressBurst", json!(0)), CONFIG),
        case("egressBurst without egressRate", with(&b, "egressRate", json!(0)), CONFIG),
        case("ingressRate negative", with(&b, "ingressRate", json!(-8000)), CONFIG),
        case("ingressRate a string", with(&b, "ingressRate", json!("8Mbit")), CONFIG),
        case("ingressRate a float", with(&b, "ingressRate", json!(8.5)), CONFIG),
        case("ingressRate beyond u64", with(&b, "ingressRate", json!(1e30)), CONFIG),
        case("egressBurst of 4 GB", with(&b, "egressBurst", json!(40_000_000_000u64)), CONFIG),
        case("egressRate below 8 bits/s", with(&b, "egressRate", json!(7)), CONFIG),
        case("a bucket longer than the kernel's ticks", with(&b, "egressRate", json!(8)), CONFIG),
        case("unshapedSubnets (reverted upstream)", with(&b, "unshapedSubnets", json!(["10.0.0.0/8"])), CONFIG),
        case("shapedSubnets a string", with(&b, "shapedSubnets", json!("10.0.0.0/8")), CONFIG),
        case("runtimeConfig.bandwidth a string", rt(json!("8Mbit")), CONFIG),
        case("runtimeConfig.bandwidth rate without burst", rt(json!({ "IngressRate": 8000 })), CONFIG),
        case("runtimeConfig.bandwidth negative", rt(json!({ "egressRate": -1, "egressBurst": 8 })), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "cniVersion 0.2.0 (the reference starts at 0.3.0)",
            with(&without_keys(&b, &["prevResult"]), "cniVersion", json!("0.2.0")),
            VERSION,
        ),
    ]
}

fn without_keys(base: &Value, keys: &[&str]) -> Value {
    let mut v = base.clone();
    for k in keys {
        v.as_object_mut().expect("object").remove(*k);
    }
    v
}

fn portmap_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("portmap");
    let maps = |m: Value| with(&b, "runtimeConfig", json!({ "portMappings": m }));
    let one = |k: &str, v: Value| {
        let mut m = json!({ "hostPort": 18080, "containerPort": 80, "protocol": "tcp" });
        m[k] = v;
        maps(json!([m]))
    };
    vec![
        case("hostPort 0", one("hostPort", json!(0)), CONFIG),
        case("hostPort 65536", one("hostPort", json!(65536)), CONFIG),
        case("hostPort -1", one("hostPort", json!(-1)), CONFIG),
        case("hostPort huge", one("hostPort", json!(1e20)), CONFIG),
        case("hostPort a string", one("hostPort", json!("80")), CONFIG),
        case("containerPort 0", one("containerPort", json!(0)), CONFIG),
        case("containerPort 70000", one("containerPort", json!(70000)), CONFIG),
        case("protocol unknown", one("protocol", json!("icmp")), CONFIG),
        case("protocol with shell text", one("protocol", json!("tcp;reboot")), CONFIG),
        case("protocol a number", one("protocol", json!(6)), CONFIG),
        case("hostIP not an IP", one("hostIP", json!("example.com")), CONFIG),
        case("hostIP a number", one("hostIP", json!(5)), CONFIG),
        case("portMappings a string", maps(json!("8080:80")), CONFIG),
        case("portMappings of numbers", maps(json!([8080])), CONFIG),
        case("a mapping as an array of its fields", maps(json!([[18080, 80, "tcp", ""]])), CONFIG),
        case("snat a number", with(&b, "snat", json!(2)), CONFIG),
        case("masqAll a string", with(&b, "masqAll", json!("yes")), CONFIG),
        case("markMasqBit 32", with(&b, "markMasqBit", json!(32)), CONFIG),
        case("markMasqBit -1", with(&b, "markMasqBit", json!(-1)), CONFIG),
        case("markMasqBit a string", with(&b, "markMasqBit", json!("13")), CONFIG),
        case("backend unknown", with(&b, "backend", json!("pf")), CONFIG),
        case("backend a number", with(&b, "backend", json!(5)), CONFIG),
        case("externalSetMarkChain a number", with(&b, "externalSetMarkChain", json!(5)), CONFIG),
        case("conditionsV4 a string", with(&b, "conditionsV4", json!("ip saddr 1.2.3.4")), CONFIG),
        case("conditionsV4 with ;", with(&b, "conditionsV4", json!(["ip saddr 1.2.3.4; flush ruleset"])), CONFIG),
        case("conditionsV6 with a newline", with(&b, "conditionsV6", json!(["ip6 saddr ::1\nflush ruleset"])), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
    ]
}

fn tuning_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("tuning");
    let sysctl = |k: &str| with(&b, "sysctl", json!({ k: "1" }));
    let mut cases = vec![
        case("sysctl kernel.hostname", sysctl("kernel.hostname"), CONFIG),
        case("sysctl kernel/core_pattern", sysctl("kernel/core_pattern"), CONFIG),
        case("sysctl net/../kernel/hostname", sysctl("net/../kernel/hostname"), CONFIG),
        case("sysctl net.ipv4.conf.IFNAME.../../../..", sysctl("net.ipv4.conf.IFNAME.../../../.."), CONFIG),
        case("sysctl net/core/../../vm/swappiness", sysctl("net/core/../../vm/swappiness"), CONFIG),
        case("sysctl /proc/sys/net/core/somaxconn", sysctl("/proc/sys/net/core/somaxconn"), CONFIG),
        case("sysctl net//core", sysctl("net//core"), CONFIG),
        case("sysctl net alone", sysctl("net"), CONFIG),
        case("sysctl empty key", sysctl(""), CONFIG),
        case("sysctl key with NUL", sysctl("net.core\u{0}x"), CONFIG),
        case("sysctl value a number", with(&b, "sysctl", json!({ "net.core.somaxconn": 5 })), CONFIG),
        case("sysctl value with NUL", with(&b, "sysctl", json!({ "net.core.somaxconn": "5\u{0}1" })), CONFIG),
        case("sysctl an array", with(&b, "sysctl", json!(["net.core.somaxconn=5"])), CONFIG),
        case(
            "sysctl key given twice",
            format!(
                r#"{{"cniVersion":"1.0.0","name":"{}","type":"tuning","dataDir":"{}","sysctl":{{"net.core.somaxconn":"1","net.core.somaxconn":"2"}},"prevResult":{}}}"#,
                f.network,
                f.data_dir(),
                f.prev_result()
            ),
            CONFIG,
        ),
        case(
            "args.cni.sysctl kernel.hostname",
            with(&b, "args", json!({ "cni": { "sysctl": { "kernel.hostname": "x" } } })),
            CONFIG,
        ),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 2^32", with(&b, "mtu", json!(4_294_967_296u64)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1400")), CONFIG),
        case("txQLen -1", with(&b, "txQLen", json!(-1)), CONFIG),
        case("txQLen a string", with(&b, "txQLen", json!("5")), CONFIG),
        case("mac not a MAC", with(&b, "mac", json!("zz:zz:zz:zz:zz:zz")), CONFIG),
        case("mac multicast", with(&b, "mac", json!("01:00:5e:00:00:01")), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        case("args.cni.mac garbage", with(&b, "args", json!({ "cni": { "mac": "x;reboot" } })), CONFIG),
        case("promisc a string", with(&b, "promisc", json!("yes")), CONFIG),
        case("allmulti a number", with(&b, "allmulti", json!(1)), CONFIG),
        case("dataDir relative", with(&b, "dataDir", json!("../escape")), CONFIG),
        case("dataDir a number", with(&b, "dataDir", json!(5)), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
    ];
    cases.push(env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=zz".into()))], CONFIG));
    cases
}

fn static_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("static");
    let addr = |a: Value| with(&b, "ipam", json!({ "type": "static", "addresses": [a] }));
    let ipam = |k: &str, v: Value| with(&b, &format!("ipam.{k}"), v);
    let args_env = |v: &str| vec![("CNI_ARGS", Some(v.to_string()))];
    vec![
        case("address without a prefix", addr(json!({ "address": "10.210.5.2" })), CONFIG),
        case("address not an IP", addr(json!({ "address": "banana/24" })), CONFIG),
        case("address prefix 33", addr(json!({ "address": "10.210.5.2/33" })), CONFIG),
        case("address a number", addr(json!({ "address": 5 })), CONFIG),
        case("address missing", addr(json!({ "gateway": "10.210.5.1" })), CONFIG),
        case("gateway not an IP", addr(json!({ "address": "10.210.5.2/24", "gateway": "x" })), CONFIG),
        case("gateway of the other family", addr(json!({ "address": "10.210.5.2/24", "gateway": "fd00::1" })), CONFIG),
        case(
            "the same address twice",
            ipam("addresses", json!([{ "address": "10.210.5.2/24" }, { "address": "10.210.5.2/16" }])),
            CONFIG,
        ),
        case("addresses an object", ipam("addresses", json!({ "address": "10.210.5.2/24" })), CONFIG),
        case("routes a string", ipam("routes", json!("0.0.0.0/0")), CONFIG),
        case("route dst not a CIDR", ipam("routes", json!([{ "dst": "banana" }])), CONFIG),
        case("route gw not an IP", ipam("routes", json!([{ "dst": "0.0.0.0/0", "gw": "x" }])), CONFIG),
        case("ipam.dns a number", ipam("dns", json!(5)), CONFIG),
        case("runtimeConfig.ips not CIDRs", with(&b, "runtimeConfig", json!({ "ips": ["10.210.5.9"] })), CONFIG),
        case("runtimeConfig.ips a string", with(&b, "runtimeConfig", json!({ "ips": "10.210.5.9/24" })), CONFIG),
        case("args.cni.ips of numbers", with(&b, "args", json!({ "cni": { "ips": [5] } })), CONFIG),
        case(
            "two IPv4 addresses on 0.2.0",
            with(
                &with_value(&b, "cniVersion", json!("0.2.0")),
                "ipam.addresses",
                json!([{ "address": "10.210.5.2/24" }, { "address": "10.210.6.2/24" }]),
            ),
            CONFIG,
        ),
        env_case("CNI_ARGS IP without a prefix", &b, args_env("IP=10.210.5.9"), ENV),
        env_case("CNI_ARGS GATEWAY not an IP", &b, args_env("IP=10.210.5.9/24;GATEWAY=x"), ENV),
    ]
}

fn sbr_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("sbr");
    vec![
        case("table 0", with(&b, "table", json!(0)), CONFIG),
        case("table 254 (main)", with(&b, "table", json!(254)), CONFIG),
        case("table 255 (local)", with(&b, "table", json!(255)), CONFIG),
        case("table -1", with(&b, "table", json!(-1)), CONFIG),
        case("table 2^32", with(&b, "table", json!(4_294_967_296u64)), CONFIG),
        case("table a string", with(&b, "table", json!("100")), CONFIG),
        case("gateways a string", with(&b, "gateways", json!("10.210.3.1")), CONFIG),
        case("gateways not IPs", with(&b, "gateways", json!(["gw.example.com"])), CONFIG),
        case("gateways two IPv4", with(&b, "gateways", json!(["10.210.3.1", "10.210.3.254"])), CONFIG),
        case("gateways three", with(&b, "gateways", json!(["10.210.3.1", "fd00::1", "fd00::2"])), CONFIG),
        case("addSourceHints a number", with(&b, "addSourceHints", json!(1)), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "prevResult without addresses for the interface",
            with(
                &b,
                "prevResult",
                json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "eth9" }],
                        "ips": [{ "address": "10.210.3.2/24", "interface": 0 }] }),
            ),
            CONFIG,
        ),
    ]
}

/// The keys macvlan and ipvlan share (`master`, `mode`, `mtu`, `linkInContainer`), with a real
/// master of MTU 1500 in the base config.
fn sublink_cases(f: &Fixture, plugin: &str) -> Vec<Case> {
    let b = f.base(plugin);
    vec![
        case("mode unknown", with(&b, "mode", json!("l4-bridge")), CONFIG),
        case("mode in upper case", with(&b, "mode", json!("BRIDGE")), CONFIG),
        case("mode a number", with(&b, "mode", json!(1)), CONFIG),
        case("master with /", with(&b, "master", json!("a/b")), CONFIG),
        case("master over 15 bytes", with(&b, "master", json!("0123456789abcdef")), CONFIG),
        case("master with a space", with(&b, "master", json!("eth 0")), CONFIG),
        case("master a number", with(&b, "master", json!(5)), CONFIG),
        case("master that does not exist", with(&b, "master", json!("nosuchmaster0")), CONFIG),
        case("mtu -1", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu 67", with(&b, "mtu", json!(67)), CONFIG),
        case("mtu 65536", with(&b, "mtu", json!(65536)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1500")), CONFIG),
        case("mtu above the master's 1500", with(&b, "mtu", json!(9000)), CONFIG),
        case("linkInContainer a number", with(&b, "linkInContainer", json!(1)), CONFIG),
        case("linkInContainer with the master on the host", with(&b, "linkInContainer", json!(true)), CONFIG),
    ]
}

fn macvlan_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("macvlan");
    let mut cases = sublink_cases(f, "macvlan");
    cases.extend([
        case(
            "mode passthrough (the kernel's word, not the reference's)",
            with(&b, "mode", json!("passthrough")),
            CONFIG,
        ),
        case("bcqueuelen -1", with(&b, "bcqueuelen", json!(-1)), CONFIG),
        case("bcqueuelen 2^32", with(&b, "bcqueuelen", json!(4_294_967_296u64)), CONFIG),
        case("bcqueuelen a string", with(&b, "bcqueuelen", json!("10")), CONFIG),
        case("mac malformed", with(&b, "mac", json!("0a:58:0a")), CONFIG),
        case("mac multicast", with(&b, "mac", json!("01:00:5e:00:00:01")), CONFIG),
        case("mac a number", with(&b, "mac", json!(5)), CONFIG),
        case("runtimeConfig.mac malformed", with(&b, "runtimeConfig", json!({ "mac": "zz" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        env_case("CNI_ARGS MAC malformed", &b, vec![("CNI_ARGS", Some("MAC=0a:58".into()))], CONFIG),
        case(
            "no ipam on 0.2.0 (a result without addresses)",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("ipam");
                v["cniVersion"] = json!("0.2.0");
                v.to_string().into_bytes()
            },
            VERSION,
        ),
    ]);
    cases
}

fn ipvlan_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("ipvlan");
    let mut cases = sublink_cases(f, "ipvlan");
    cases.extend([
        case("mode l2 in upper case", with(&b, "mode", json!("L2")), CONFIG),
        case("no ipam and no prevResult", without(&b, "ipam"), CONFIG),
        case(
            "no master and a prevResult with two interfaces",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("master");
                v["prevResult"] = json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "a" }, { "name": "b" }] });
                v.to_string().into_bytes()
            },
            CONFIG,
        ),
        case(
            "no master and prevResult's interface not a valid name",
            {
                let mut v = b.clone();
                v.as_object_mut().unwrap().remove("master");
                v["prevResult"] = json!({ "cniVersion": "1.0.0", "interfaces": [{ "name": "../x" }] });
                v.to_string().into_bytes()
            },
            CONFIG,
        ),
    ]);
    cases
}

/// Runs the macvlan or ipvlan table with its master made for it.
fn sublink_table(plugin: &str, cases: fn(&Fixture) -> Vec<Case>) {
    let f = Fixture::new();
    let master = f.master();
    let peer = format!("{master}p");
    let out = run("ip", &["link", "add", &master, "type", "veth", "peer", "name", &peer]);
    assert!(out.status.success(), "create master {master}: {}", String::from_utf8_lossy(&out.stderr));
    let _master = LinkGuard(master.clone());
    for l in [&master, &peer] {
        assert!(run("ip", &["link", "set", l, "up"]).status.success());
    }
    let mut all = common_cases(&f, plugin);
    all.extend(netns_cases(&f, plugin));
    all.extend(cases(&f));
    run_table(&f, plugin, &all);
    let uppers = String::from_utf8_lossy(&run("ip", &["-o", "link", "show", "type", plugin]).stdout).into_owned();
    assert!(!uppers.contains(&format!("@{master}")), "{plugin} left a link on the master:\n{uppers}");
}

#[test]
fn macvlan_refuses_hostile_input() {
    sublink_table("macvlan", macvlan_cases);
}

#[test]
fn ipvlan_refuses_hostile_input() {
    sublink_table("ipvlan", ipvlan_cases);
}

fn dhcp_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("dhcp");
    let ipam = |k: &str, v: Value| with(&b, &format!("ipam.{k}"), v);
    vec![
        case("daemonSocketPath relative", ipam("daemonSocketPath", json!("run/dhcp.sock")), CONFIG),
        case("daemonSocketPath a number", ipam("daemonSocketPath", json!(5)), CONFIG),
        case("request a string", ipam("request", json!("routers")), CONFIG),
        case("request an object", ipam("request", json!({ "option": "routers" })), CONFIG),
        case("request option unknown", ipam("request", json!([{ "option": "nosuch-option" }])), CONFIG),
        case("request option 256", ipam("request", json!([{ "option": "256" }])), CONFIG),
        case("request option -1", ipam("request", json!([{ "option": "-1" }])), CONFIG),
        case("request option a number", ipam("request", json!([{ "option": 3 }])), CONFIG),
        case("request skipDefault a string", ipam("request", json!([{ "skipDefault": "true" }])), CONFIG),
        case("provide without option", ipam("provide", json!([{ "value": "x" }])), CONFIG),
        case(
            "provide value of 256 bytes",
            ipam("provide", json!([{ "option": "host-name", "value": "x".repeat(256) }])),
            CONFIG,
        ),
        case("provide value a number", ipam("provide", json!([{ "option": "host-name", "value": 5 }])), CONFIG),
        case("provide fromArg a list", ipam("provide", json!([{ "option": "host-name", "fromArg": ["A"] }])), CONFIG),
        env_case(
            "provide fromArg naming a CNI_ARGS value of 256 bytes",
            &with_value(&b, "ipam", json!({ "type": "dhcp", "provide": [{ "option": "12", "fromArg": "HOST" }] })),
            vec![("CNI_ARGS", Some(format!("HOST={}", "h".repeat(256))))],
            ENV,
        ),
        case("suppress unknown", ipam("suppress", json!(["dns"])), CONFIG),
        case("suppress a string", ipam("suppress", json!("gateway")), CONFIG),
    ]
}

fn env_for(f: &Fixture, c: &Case, command: &str) -> BTreeMap<String, String> {
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
fn run_table(f: &Fixture, plugin: &str, cases: &[Case]) {
    std::fs::write(f.scratch.path().join("data").join("netns-file"), "not a netns").expect("write");
    std::fs::write(f.scratch.path().join("data").join("netns-empty"), "").expect("write");
    std::fs::create_dir_all(f.scratch.path().join("data").join("netns-dir")).expect("mkdir");
    let fifo = f.scratch.path().join("data").join("netns-fifo");
    if !fifo.exists() {
        let path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0, "mkfifo {}", fifo.display());
    }
    let bin = bin_dir().join(plugin);
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
fn check_error(ran: &Ran, want: u32) -> Result<(), String> {
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

/// A person who runs a plugin by hand (no CNI_COMMAND, an empty one, or `--help`) is told on
/// stderr what it is and which spec versions it speaks, with exit 0 and nothing on stdout, as the
/// reference plugins do; a runtime's call with CNI_COMMAND set still gets the CNI error JSON.
#[test]
fn a_plugin_run_by_hand_says_what_it_is() {
    let f = Fixture::new();
    let no_command: BTreeMap<String, String> = BTreeMap::new();
    let empty_command: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), String::new())].into();
    let with_command = f.env("ADD");
    for plugin in libcni::registry::NAMES {
        let bin = bin_dir().join(plugin);
        for (how, args, env) in [
            ("no CNI_COMMAND", &[][..], &no_command),
            ("an empty CNI_COMMAND", &[][..], &empty_command),
            ("--help", &["--help"][..], &no_command),
            ("--help with CNI_COMMAND set", &["--help"][..], &with_command),
        ] {
            let ran = exec(&bin, args, env, b"");
            assert_eq!(ran.exit, Some(0), "{plugin}, {how}: {}{}", ran.stdout, ran.stderr);
            assert_eq!(ran.stdout, "", "{plugin}, {how}: stdout");
            let first = ran.stderr.lines().next().unwrap_or_default();
            assert!(first.starts_with(&format!("CNI {plugin} plugin, cni-rs v")), "{plugin}, {how}: {}", ran.stderr);
            assert!(ran.stderr.contains("CNI protocol versions supported: "), "{plugin}, {how}: {}", ran.stderr);
        }
        // An argument that is not UTF-8 is read, not a panic (std::env::args would panic on it).
        let out = Command::new(&bin)
            .arg(std::ffi::OsStr::from_bytes(b"\xff"))
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{plugin}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{plugin}, a non-UTF-8 argument: {stderr}");
        assert!(stderr.starts_with(&format!("CNI {plugin} plugin")), "{plugin}, a non-UTF-8 argument: {stderr}");
        // The spec versions listed are the ones VERSION reports.
        let ran = exec(&bin, &[], &no_command, b"");
        let listed = ran.stderr.lines().find_map(|l| l.strip_prefix("CNI protocol versions supported: ")).unwrap_or("");
        let version_env: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "VERSION".to_string())].into();
        let reply: Value = serde_json::from_str(&exec(&bin, &[], &version_env, b"").stdout).expect("VERSION reply");
        let spoken: Vec<&str> =
            reply["supportedVersions"].as_array().expect("versions").iter().filter_map(Value::as_str).collect();
        assert_eq!(listed, spoken.join(", "), "{plugin}");
        // A runtime's call (CNI_COMMAND set) with the rest missing is still refused as JSON.
        let only_command: BTreeMap<String, String> = [("CNI_COMMAND".to_string(), "ADD".to_string())].into();
        let ran = exec(&bin, &[], &only_command, b"{}");
        assert_ne!(ran.exit, Some(0), "{plugin}: ADD with no CNI_CONTAINERID");
        let v: Value = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{plugin}: {e}: {}", ran.stdout));
        assert_eq!(v["code"], ENV, "{plugin}: {}", ran.stdout);
    }
}

/// Every table holds for what a node runs too, the static multi-call binary under every plugin
/// name: on musl, std's `OpenOptions` dropped `O_PATH`, and a FIFO as CNI_NETNS hung it.
#[test]
fn every_table_holds_for_the_shipped_static_binary() {
    if cni_tests::in_shipped_run() {
        return;
    }
    cni_tests::holds_for_the_shipped_binary(&libcni::registry::NAMES, &["cnitool", "cni-noop"], 20);
}

#[test]
fn bridge_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "bridge");
    cases.extend(netns_cases(&f, "bridge"));
    cases.extend(bridge_cases(&f));
    run_table(&f, "bridge", &cases);
}

#[test]
fn host_local_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "host-local");
    cases.extend(host_local_cases(&f));
    run_table(&f, "host-local", &cases);
}

/// What a symbolic link planted in host-local's data directory may do: nothing outside it. Each row plants
/// a link (to a file outside, and dangling) where a store file should be, then runs ADD, STATUS, GC, DEL;
/// each answers the code given (None: success) with the planted path in the message, and the file outside
/// is never modified, the dangling target never created.
#[test]
fn host_local_never_follows_a_link_in_its_data_directory() {
    let f = Fixture::new();
    let outside = TempDir::new("cnho");
    let precious = outside.path().join("precious");
    let nowhere = outside.path().join("created-through-a-link");
    let outside_dir = outside.path().join("dir");
    std::fs::create_dir(&outside_dir).expect("mkdir");
    const NA: u32 = 50;
    type Want = [Option<u32>; 4];
    // (where, ADD, STATUS, GC, DEL); `<net>` is the network directory itself.
    let next_free = f.subnet.replace(".0/24", ".2");
    let rows: [(&str, Want); 7] = [
        ("lock", [Some(IO), Some(NA), Some(IO), Some(IO)]),
        (".cni-rs-index", [Some(IO), Some(NA), Some(IO), Some(IO)]),
        ("last_reserved_ip.0", [Some(IO), None, None, None]),
        // The next free address: not a reservation, never written through, skipped.
        (&next_free, [None, None, None, None]),
        // What a kill between writing and linking leaves, as a link: unlinked by the next lock.
        (".host-local-tmp.1.2.3", [None, None, None, None]),
        // Another boot's record: removed as a name by the first ADD of this boot.
        (".cni-rs-boot.00000000-0000-4000-8000-000000000000", [None, None, None, None]),
        ("<net>", [Some(IO), Some(NA), Some(IO), Some(IO)]),
    ];
    let mut failures = Vec::new();
    for (at, want) in rows {
        for dangling in [false, true] {
            std::fs::write(&precious, "precious").expect("write");
            let network = unique("nethl");
            let net_dir = f.scratch.path().join("data").join(&network);
            let (planted, target) = if at == "<net>" {
                (net_dir.clone(), if dangling { nowhere.clone() } else { outside_dir.clone() })
            } else {
                std::fs::create_dir_all(&net_dir).expect("mkdir");
                (net_dir.join(at), if dangling { nowhere.clone() } else { precious.clone() })
            };
            std::os::unix::fs::symlink(&target, &planted).expect("symlink");
            let mut conf = f.base("host-local");
            conf["cniVersion"] = json!("1.1.0");
            conf["name"] = json!(network);
            let mut env = f.env("ADD");
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{ "containerID": env["CNI_CONTAINERID"], "ifname": "eth0" }]);
            for (verb, want) in ["ADD", "STATUS", "GC", "DEL"].into_iter().zip(want) {
                env.insert("CNI_COMMAND".into(), verb.into());
                let stdin = if verb == "GC" { &gc } else { &conf };
                let ran = exec(&bin_dir().join("host-local"), &[], &env, stdin.to_string().as_bytes());
                let what = format!("{at} (dangling: {dangling}) {verb}");
                match want {
                    None if ran.exit != Some(0) => failures.push(format!("{what}: failed: {}", ran.stdout)),
                    None => {}
                    Some(code) => match check_error(&ran, code) {
                        Err(why) => failures.push(format!("{what}: {why}")),
                        Ok(()) if !ran.stdout.contains(&planted.display().to_string()) => {
                            failures.push(format!("{what}: the message does not name the link: {}", ran.stdout))
                        }
                        Ok(()) => {}
                    },
                }
                if std::fs::read_to_string(&precious).ok().as_deref() != Some("precious") {
                    failures.push(format!("{what}: the file outside was modified"));
                }
                if std::fs::symlink_metadata(&nowhere).is_ok() {
                    failures.push(format!("{what}: a file was created through the dangling link"));
                    let _ = std::fs::remove_file(&nowhere);
                }
                if std::fs::read_dir(&outside_dir).map(|d| d.count()).unwrap_or(1) != 0 {
                    failures.push(format!("{what}: something was written into the directory outside"));
                }
            }
            if at == "<net>" {
                std::fs::remove_file(&net_dir).expect("remove link");
            } else {
                std::fs::remove_dir_all(&net_dir).expect("remove network dir");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn sbr_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "sbr");
    cases.extend(netns_cases(&f, "sbr"));
    cases.extend(sbr_cases(&f));
    run_table(&f, "sbr", &cases);
    let rules = String::from_utf8_lossy(&f.pod.exec("ip", &["rule"]).stdout).into_owned();
    assert!(!rules.contains("10.210.3.2"), "sbr left a rule in the pod:\n{rules}");
}

#[test]
fn static_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "static");
    cases.extend(static_cases(&f));
    run_table(&f, "static", &cases);
    // DEL has nothing to release: it succeeds on every row that names an attachment.
    let mut failures = Vec::new();
    for c in static_cases(&f) {
        let ran = exec(&bin_dir().join("static"), &[], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("static DEL: {}: {} {}", c.label, ran.stdout, ran.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn dhcp_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "dhcp");
    cases.extend(dhcp_cases(&f));
    run_table(&f, "dhcp", &cases);
    // DEL releases through the daemon; with none running nothing is held, and DEL succeeds on
    // every row that names an attachment.
    let mut failures = Vec::new();
    for c in dhcp_cases(&f) {
        let ran = exec(&bin_dir().join("dhcp"), &[], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("dhcp DEL: {}: {} {}", c.label, ran.stdout, ran.stderr));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // STATUS without a daemon: code 50, naming the socket.
    let status = with_value(&f.base("dhcp"), "cniVersion", json!("1.1.0"));
    let ran = exec(&bin_dir().join("dhcp"), &[], &f.env("STATUS"), status.to_string().as_bytes());
    check_error(&ran, 50).unwrap();
    assert!(ran.stdout.contains("no-daemon.sock"), "{}", ran.stdout);
}

#[test]
fn loopback_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "loopback");
    cases.extend(netns_cases(&f, "loopback"));
    run_table(&f, "loopback", &cases);
}

#[test]
fn portmap_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "portmap");
    cases.extend(portmap_cases(&f));
    run_table(&f, "portmap", &cases);
    let nft = String::from_utf8_lossy(&run("nft", &["list", "ruleset"]).stdout).into_owned();
    assert!(!nft.contains("10.210.3.2"), "portmap left a rule for the pod:\n{nft}");
}

#[test]
fn tuning_refuses_hostile_input() {
    let f = Fixture::new();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let mut cases = common_cases(&f, "tuning");
    cases.extend(netns_cases(&f, "tuning"));
    cases.extend(tuning_cases(&f));
    run_table(&f, "tuning", &cases);
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname"), hostname);
    let arp_ignore = f.pod.sh("cat", &["/proc/sys/net/ipv4/conf/all/arp_ignore"]);
    assert_eq!(arp_ignore.trim(), "0", "a refused ADD wrote a sysctl in the pod");
}

#[test]
fn bandwidth_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "bandwidth");
    cases.extend(bandwidth_cases(&f));
    run_table(&f, "bandwidth", &cases);
    let links = String::from_utf8_lossy(&run("ip", &["-o", "-d", "link", "show", "type", "ifb"]).stdout).into_owned();
    assert!(!links.contains(&f.network), "bandwidth left an ifb of the network:\n{links}");
}

fn firewall_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("firewall");
    let bridge_named = |name: &str| {
        let mut prev = f.prev_result();
        prev["interfaces"] = json!([{ "name": name }, { "name": "eth0", "sandbox": f.pod.path }]);
        prev["ips"][0]["interface"] = json!(1);
        with(&with_value(&b, "ingressPolicy", json!("same-bridge")), "prevResult", prev)
    };
    vec![
        case("backend firewalld (not built)", with(&b, "backend", json!("firewalld")), CONFIG),
        case("backend unknown", with(&b, "backend", json!("pf")), CONFIG),
        case("backend a number", with(&b, "backend", json!(1)), CONFIG),
        case("iptablesAdminChainName with shell text", with(&b, "iptablesAdminChainName", json!("X;reboot")), CONFIG),
        case(
            "iptablesAdminChainName a restore line",
            with(&b, "iptablesAdminChainName", json!("X\n-F FORWARD")),
            CONFIG,
        ),
        case("iptablesAdminChainName an option", with(&b, "iptablesAdminChainName", json!("-j")), CONFIG),
        case("iptablesAdminChainName FORWARD", with(&b, "iptablesAdminChainName", json!("FORWARD")), CONFIG),
        case("iptablesAdminChainName PREROUTING", with(&b, "iptablesAdminChainName", json!("PREROUTING")), CONFIG),
        case("iptablesAdminChainName a verdict", with(&b, "iptablesAdminChainName", json!("QUEUE")), CONFIG),
        case("iptablesAdminChainName a target", with(&b, "iptablesAdminChainName", json!("REJECT")), CONFIG),
        case("iptablesAdminChainName NFQUEUE", with(&b, "iptablesAdminChainName", json!("NFQUEUE")), CONFIG),
        case("iptablesAdminChainName an IPv6 target", with(&b, "iptablesAdminChainName", json!("HL")), CONFIG),
        case(
            "iptablesAdminChainName the plugin's own chain",
            with(&b, "iptablesAdminChainName", json!("CNI-ISOLATION-STAGE-1")),
            CONFIG,
        ),
        case("iptablesAdminChainName starting with '!'", with(&b, "iptablesAdminChainName", json!("!X")), CONFIG),
        case("iptablesAdminChainName 29 characters", with(&b, "iptablesAdminChainName", json!("A".repeat(29))), CONFIG),
        case("iptablesAdminChainName a number", with(&b, "iptablesAdminChainName", json!(5)), CONFIG),
        case("ingressPolicy unknown", with(&b, "ingressPolicy", json!("closed")), CONFIG),
        case("ingressPolicy a boolean", with(&b, "ingressPolicy", json!(true)), CONFIG),
        case(
            "same-bridge with no interface",
            {
                let mut prev = f.prev_result();
                prev["interfaces"] = json!([]);
                prev["ips"][0].as_object_mut().expect("ip").remove("interface");
                with(&with_value(&b, "ingressPolicy", json!("same-bridge")), "prevResult", prev)
            },
            CONFIG,
        ),
        case("same-bridge with a bridge name holding rule text", bridge_named("br0 -j ACCEPT"), CONFIG),
        case("same-bridge with a bridge name of 16 bytes", bridge_named("b123456789abcdef"), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case(
            "cniVersion 0.3.1 (the reference speaks 0.4.0 and later)",
            with(&b, "cniVersion", json!("0.3.1")),
            VERSION,
        ),
    ]
}

/// firewall's rows run in a namespace standing in for the node, so a row that wrongly succeeded
/// would not touch the host's FORWARD chain; none may leave a rule there either. DEL with keys that
/// no longer validate still succeeds.
#[test]
fn firewall_refuses_hostile_input() {
    let f = Fixture::new();
    let node = Netns::new("cnhf");
    let bin = bin_dir().join("firewall").display().to_string();
    let mut cases = common_cases(&f, "firewall");
    cases.extend(firewall_cases(&f));
    let mut failures = Vec::new();
    for c in &cases {
        let ran = exec(Path::new("ip"), &["netns", "exec", &node.name, &bin], &env_for(&f, c, "ADD"), &c.stdin);
        if let Err(why) = check_error(&ran, c.want) {
            failures.push(format!("firewall: {}: {why}", c.label));
        }
    }
    let base = f.base("firewall");
    for (label, stdin) in [
        ("backend unknown", with(&base, "backend", json!("pf"))),
        ("ingressPolicy unknown", with(&base, "ingressPolicy", json!("closed"))),
        ("iptablesAdminChainName with shell text", with(&base, "iptablesAdminChainName", json!("X;reboot"))),
        ("no prevResult", without(&base, "prevResult")),
    ] {
        let c = case(label, stdin, 0);
        let ran = exec(Path::new("ip"), &["netns", "exec", &node.name, &bin], &env_for(&f, &c, "DEL"), &c.stdin);
        if ran.exit != Some(0) {
            failures.push(format!("firewall DEL: {label}: failed: {} {}", ran.stdout, ran.stderr));
        }
    }
    let rules = node.sh("iptables-save", &[]);
    assert!(!rules.contains("10.210.3.2"), "firewall left a rule for the pod:\n{rules}");
    assert!(failures.is_empty(), "{} of {} rows failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// A host port another container holds is refused on both backends: code 100 naming the port,
/// and the refused ADD adds no rule. The plugin runs in a namespace of its own (the "node"), so
/// the host's rulesets are not touched.
#[test]
fn portmap_refuses_a_held_host_port() {
    let f = Fixture::new();
    let node = Netns::new("cnhn");
    let ruleset = || {
        let out = run("sh", &["-c", &format!("ip netns exec {} nft -s list ruleset", node.name)]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    for backend in ["nftables", "iptables"] {
        let mut conf = f.base("portmap");
        conf["backend"] = json!(backend);
        let conf = conf.to_string();
        let (holder, other) = (f.env("ADD"), f.env("ADD"));
        let portmap = bin_dir().join("portmap").display().to_string();
        let in_node = |env: &BTreeMap<String, String>| {
            exec(Path::new("ip"), &["netns", "exec", &node.name, &portmap], env, conf.as_bytes())
        };
        let ran = in_node(&holder);
        assert_eq!(ran.exit, Some(0), "{backend}: the holder's ADD: {} {}", ran.stdout, ran.stderr);
        let before = ruleset();
        let ran = in_node(&other);
        if let Err(why) = check_error(&ran, 100) {
            panic!("{backend}: a held host port: {why}");
        }
        assert!(ran.stdout.contains("host port 18080/tcp"), "{backend}: {}", ran.stdout);
        assert_eq!(ruleset(), before, "{backend}: the refused ADD left rules");
        let mut del = holder.clone();
        del.insert("CNI_COMMAND".into(), "DEL".into());
        let ran = in_node(&del);
        assert_eq!(ran.exit, Some(0), "{backend}: the holder's DEL: {} {}", ran.stdout, ran.stderr);
    }
}

/// DEL and CHECK get the same treatment as ADD for input that is bad on every verb.
#[test]
fn del_and_check_refuse_hostile_input_too() {
    let f = Fixture::new();
    let mut failures = Vec::new();
    for plugin in ["bridge", "host-local", "loopback", "portmap", "tuning", "bandwidth"] {
        let base = f.base(plugin);
        let rows = [
            case("truncated", &base.to_string().as_bytes()[..10], SYNTAX),
            case("nested 300000 deep", "[".repeat(300_000), SYNTAX),
            case("unknown version", with(&base, "cniVersion", json!("2.0.0")), VERSION),
            case("name with /", with(&base, "name", json!("../x")), CONFIG),
            env_case("container id with /", &base, vec![("CNI_CONTAINERID", Some("../x".into()))], ENV),
            env_case("ifname over 15 bytes", &base, vec![("CNI_IFNAME", Some("x".repeat(16)))], ENV),
        ];
        for command in ["DEL", "CHECK"] {
            for c in &rows {
                let ran = exec(&bin_dir().join(plugin), &[], &env_for(&f, c, command), &c.stdin);
                if let Err(why) = check_error(&ran, c.want) {
                    failures.push(format!("{plugin} {command}: {}: {why}", c.label));
                }
            }
        }
    }
    f.assert_nothing_left("DEL/CHECK");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A missing prevResult is code 7 and says what to fix, which differs by verb: on CHECK the
/// runtime did not send ADD's result; on ADD a plugin that needs one is not chained after the
/// plugin that made the pod's interface.
#[test]
fn a_missing_prev_result_says_what_to_fix() {
    let f = Fixture::new();
    let check = |p: &str| format!("{p} CHECK needs prevResult: the runtime must send the result of ADD");
    let chained = |p: &str| {
        format!(
            "{p} must be called as a chained plugin, after the plugin that made the pod's interface: the \
             configuration has no prevResult"
        )
    };
    let mut failures = Vec::new();
    let mut rows = vec![("bridge", "bridge", "CHECK"), ("ptp", "ptp", "CHECK"), ("static", "static", "CHECK")];
    for p in ["portmap", "tuning", "bandwidth", "sbr", "firewall", "vrf"] {
        rows.extend([(p, p, "ADD"), (p, p, "CHECK")]);
    }
    for (plugin, binary, command) in rows {
        let stdin = without(&f.base(plugin), "prevResult");
        let ran = exec(&bin_dir().join(binary), &[], &f.env(command), &stdin);
        let want = if command == "CHECK" { check(plugin) } else { chained(plugin) };
        let msg = serde_json::from_str::<Value>(&ran.stdout).ok().and_then(|v| v["msg"].as_str().map(String::from));
        if let Err(why) = check_error(&ran, CONFIG) {
            failures.push(format!("{plugin} {command}: {why}"));
        } else if msg.as_deref() != Some(want.as_str()) {
            failures.push(format!("{plugin} {command}: {msg:?}, wanted {want:?}"));
        }
    }
    f.assert_nothing_left("no prevResult");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// DEL is best effort: what would refuse ADD but does not say which attachment to remove lets DEL
/// succeed (an unknown or malformed CNI_ARGS, a plugin key that no longer validates, a broken
/// prevResult or runtimeConfig, a netns path left as an empty file), and it leaves nothing behind.
#[test]
fn del_succeeds_where_add_refuses() {
    let f = Fixture::new();
    std::fs::write(f.scratch.path().join("data").join("netns-empty"), "").expect("write");
    let empty_netns = f.scratch.path().join("data").join("netns-empty").display().to_string();
    let mut failures = Vec::new();
    for plugin in ["bridge", "host-local", "loopback", "portmap", "tuning", "bandwidth", "ptp", "host-device"] {
        let base = f.base(plugin);
        let mut rows: Vec<Case> = BAD_CNI_ARGS
            .iter()
            .map(|(label, args)| env_case(*label, &base, vec![("CNI_ARGS", Some(args.to_string()))], 0))
            .collect();
        rows.extend([
            case("prevResult garbage", with(&base, "prevResult", json!("garbage")), 0),
            case("prevResult of an unknown version", with(&base, "prevResult", json!({ "cniVersion": "0.0.7" })), 0),
            case("runtimeConfig a number", with(&base, "runtimeConfig", json!(5)), 0),
            case("args a string", with(&base, "args", json!("x")), 0),
            case("dns a number", with(&base, "dns", json!(5)), 0),
            env_case("CNI_NETNS an empty file", &base, vec![("CNI_NETNS", Some(empty_netns.clone()))], 0),
        ]);
        match plugin {
            "bridge" => rows.extend([
                case("mtu 67", with(&base, "mtu", json!(67)), 0),
                case("ipMasqBackend unknown", with(&base, "ipMasqBackend", json!("pf")), 0),
                case("vlan 4095", with(&base, "vlan", json!(4095)), 0),
                case("runtimeConfig.mac not a MAC", with(&base, "runtimeConfig", json!({ "mac": "zz:zz" })), 0),
                case(
                    "ipam subnet not a CIDR",
                    with(&base, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
                    0,
                ),
                // An IPAM type it will not run: everything else is removed, and DEL says so.
                case(
                    "ipam.type with / and a bad mtu",
                    with(&with_value(&base, "mtu", json!(67)), "ipam", json!({ "type": "../../bin/sh" })),
                    CONFIG,
                ),
            ]),
            "host-local" => rows.push(case(
                "ipam subnet not a CIDR",
                with(&base, "ipam", json!({ "type": "host-local", "subnet": "banana", "dataDir": f.data_dir() })),
                0,
            )),
            "portmap" => {
                let maps = |m: Value| with(&base, "runtimeConfig", json!({ "portMappings": m }));
                rows.extend([
                    case("hostPort 0", maps(json!([{ "hostPort": 0, "containerPort": 80 }])), 0),
                    case("hostIP not an IP", maps(json!([{ "hostPort": 1, "containerPort": 80, "hostIP": "x" }])), 0),
                    case("portMappings a string", maps(json!("8080:80")), 0),
                    case("backend unknown", with(&base, "backend", json!("pf")), 0),
                    case("markMasqBit a string", with(&base, "markMasqBit", json!("13")), 0),
                ]);
            }
            "tuning" => rows.extend([
                case("sysctl kernel.hostname", with(&base, "sysctl", json!({ "kernel.hostname": "x" })), 0),
                case("mtu -1", with(&base, "mtu", json!(-1)), 0),
                case("mac not a MAC", with(&base, "mac", json!("zz")), 0),
            ]),
            "bandwidth" => rows.extend([
                case("ingressRate without ingressBurst", with(&base, "ingressBurst", json!(0)), 0),
                case("egressRate a string", with(&base, "egressRate", json!("8Mbit")), 0),
                case("unshapedSubnets", with(&base, "unshapedSubnets", json!(["10.0.0.0/8"])), 0),
            ]),
            "ptp" => rows.extend([
                case("mtu 67", with(&base, "mtu", json!(67)), 0),
                case("ipMasqBackend unknown", with(&base, "ipMasqBackend", json!("pf")), 0),
                case("no ipam type", with(&base, "ipam", json!({})), 0),
            ]),
            "host-device" => rows.extend([
                case("no device key", without(&base, "device"), 0),
                case("hwaddr not a MAC", with(&without_keys(&base, &["device"]), "hwaddr", json!("zz")), 0),
            ]),
            _ => {}
        }
        for c in &rows {
            let ran = exec(&bin_dir().join(plugin), &[], &env_for(&f, c, "DEL"), &c.stdin);
            let outcome = if c.want == 0 {
                if ran.exit == Some(0) {
                    Ok(())
                } else {
                    Err(format!("failed: {} {}", ran.stdout, ran.stderr))
                }
            } else {
                check_error(&ran, c.want)
            };
            if let Err(why) = outcome {
                failures.push(format!("{plugin} DEL: {}: {why}", c.label));
            }
        }
    }
    f.assert_nothing_left("DEL");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// portmap and loopback read no CNI_ARGS: unknown keys and malformed pairs are ignored on ADD and
/// DEL alike (as the reference plugins, which never load them), and the plugin really works.
#[test]
fn ignores_cni_args_it_does_not_read() {
    let f = Fixture::new();
    for plugin in ["loopback", "portmap"] {
        let conf = f.base(plugin).to_string();
        for (label, args) in BAD_CNI_ARGS {
            let mut env = f.env("ADD");
            env.insert("CNI_ARGS".into(), args.into());
            let ran = exec(&bin_dir().join(plugin), &[], &env, conf.as_bytes());
            assert_eq!(ran.exit, Some(0), "{plugin} ADD with {label}: {} {}", ran.stdout, ran.stderr);
            env.insert("CNI_COMMAND".into(), "DEL".into());
            let ran = exec(&bin_dir().join(plugin), &[], &env, conf.as_bytes());
            assert_eq!(ran.exit, Some(0), "{plugin} DEL with {label}: {} {}", ran.stdout, ran.stderr);
        }
    }
    f.assert_nothing_left("after DEL");
}

/// Unknown CNI_ARGS keys pass with IgnoreUnknown, and the plugin then really works (and DEL undoes it).
#[test]
fn ignore_unknown_lets_unknown_args_through() {
    let f = Fixture::new();
    for plugin in ["host-local", "loopback", "bridge"] {
        let conf = f.base(plugin).to_string();
        let mut env = f.env("ADD");
        env.insert("CNI_ARGS".into(), "IgnoreUnknown=1;NOSUCHKEY=1;K8S_POD_NAME=web".into());
        let ran = exec(&bin_dir().join(plugin), &[], &env, conf.as_bytes());
        assert_eq!(ran.exit, Some(0), "{plugin}: ADD with IgnoreUnknown: {} {}", ran.stdout, ran.stderr);
        let result: Value = serde_json::from_str(&ran.stdout).expect("result JSON");
        assert_eq!(result["cniVersion"], "1.0.0");
        env.insert("CNI_COMMAND".into(), "DEL".into());
        let ran = exec(&bin_dir().join(plugin), &[], &env, conf.as_bytes());
        assert_eq!(ran.exit, Some(0), "{plugin}: DEL: {} {}", ran.stdout, ran.stderr);
    }
    f.assert_nothing_left("after DEL");
}

/// cnitool: bad arguments, environment and configuration files are refused with the code, as JSON.
#[test]
fn cnitool_refuses_hostile_input() {
    let f = Fixture::new();
    let confdir = TempDir::new("cnhc");
    let cache = TempDir::new("cnhk");
    let good = json!({ "cniVersion": "1.0.0", "name": f.network, "plugins": [{ "type": "loopback" }] });
    std::fs::write(confdir.path().join("10-good.conflist"), good.to_string()).expect("write");
    std::fs::write(confdir.path().join("20-random.conflist"), random_bytes(1 << 20, 7)).expect("write");
    std::fs::write(confdir.path().join("30-deep.conflist"), "[".repeat(300_000)).expect("write");
    let bad_ifname = json!({ "cniVersion": "9.9.9", "name": "badver", "plugins": [{ "type": "loopback" }] });
    std::fs::write(confdir.path().join("40-badver.conflist"), bad_ifname.to_string()).expect("write");
    let env = |extra: &[(&str, &str)]| -> BTreeMap<String, String> {
        let mut e: BTreeMap<String, String> = [
            ("NETCONFPATH", confdir.path().display().to_string()),
            ("CNI_PATH", bin_dir().display().to_string()),
            ("CNI_CACHE_DIR", cache.path().display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            e.insert(k.to_string(), v.to_string());
        }
        e
    };
    let netns_file = f.scratch.path().join("data").join("netns-file");
    std::fs::write(&netns_file, "x").expect("write");
    let file = netns_file.display().to_string();
    let pod = f.pod.path.as_str();
    let net = f.network.as_str();
    // Under the kernel's 128 KiB limit on one environment string, far over serde's depth limit.
    let deep_caps = "[".repeat(100_000);
    type Row<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>, u32);
    let rows: Vec<Row> = vec![
        ("unknown command", vec!["attach", net, pod], vec![], ENV),
        ("unknown option", vec!["add", "--frobnicate", net, pod], vec![], ENV),
        // Arguments after <network> <netns> are ignored, as upstream's cnitool does.
        ("no arguments to add", vec!["add"], vec![], ENV),
        ("missing netns", vec!["add", net], vec![], ENV),
        ("network that does not exist", vec!["add", "nosuchnet", pod], vec![], CONFIG),
        ("network name with /", vec!["add", "../../etc", pod], vec![], CONFIG),
        ("network name with shell text", vec!["add", "$(reboot)", pod], vec![], CONFIG),
        ("network with an unknown cniVersion", vec!["add", "badver", pod], vec![], VERSION),
        ("ifname over 15 bytes", vec!["add", net, pod, "-i", "eth0123456789abc"], vec![], ENV),
        ("ifname with /", vec!["add", net, pod, "--ifname", "a/b"], vec![], ENV),
        ("netns a regular file", vec!["add", net, &file], vec![], ENV),
        ("netns a directory", vec!["add", net, "/tmp"], vec![], ENV),
        ("netns missing", vec!["add", net, "/run/netns/cni-rs-no-such-ns"], vec![], ENV),
        ("CNI_PATH empty", vec!["add", net, pod], vec![("CNI_PATH", "")], ENV),
        ("CNI_ARGS malformed", vec!["add", net, pod], vec![("CNI_ARGS", "a=b=c")], ENV),
        ("CAP_ARGS not JSON", vec!["add", net, pod], vec![("CAP_ARGS", "{portMappings")], ENV),
        ("CAP_ARGS an array", vec!["add", net, pod], vec![("CAP_ARGS", "[]")], ENV),
        ("CAP_ARGS nested 100000 deep", vec!["add", net, pod], vec![("CAP_ARGS", &deep_caps)], ENV),
        ("gc --keep malformed", vec!["gc", net, "--keep", "nocolon"], vec![], ENV),
    ];
    let mut failures = Vec::new();
    for (label, mut args, extra, want) in rows {
        args.push("--json");
        let ran = exec(&bin_dir().join("cnitool"), &args, &env(&extra), b"");
        let check = || -> Result<(), String> {
            let Some(exit) = ran.exit else { return Err(format!("killed by a signal: {}", ran.stderr)) };
            if exit == 0 {
                return Err(format!("succeeded: {}", ran.stdout));
            }
            let line = ran.stdout.lines().last().unwrap_or_default();
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("stdout not JSON ({e}): {:?}", ran.stdout))?;
            let code = v["code"].as_u64().ok_or_else(|| format!("no code: {v}"))?;
            if code == 110 || ran.stderr.contains("panicked") || !v["msg"].is_string() {
                return Err(format!("bad error: {v} {}", ran.stderr));
            }
            if code != u64::from(want) {
                return Err(format!("code {code}, wanted {want}: {}", v["msg"]));
            }
            Ok(())
        };
        if let Err(why) = check() {
            failures.push(format!("cnitool {label}: {why}"));
        }
    }
    f.assert_nothing_left("cnitool");
    assert!(list_tree(&cache.path().join("results")).is_empty(), "cnitool cached a failed ADD");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn ptp_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("ptp");
    vec![
        case("mtu 40", with(&b, "mtu", json!(40)), CONFIG),
        case("mtu 70000", with(&b, "mtu", json!(70000)), CONFIG),
        case("mtu negative", with(&b, "mtu", json!(-1)), CONFIG),
        case("mtu a string", with(&b, "mtu", json!("1500")), CONFIG),
        case("ipMasq a number", with(&b, "ipMasq", json!(1)), CONFIG),
        case("ipMasqBackend unknown", with(&b, "ipMasqBackend", json!("pf")), CONFIG),
        case("ipMasqBackend a number", with(&b, "ipMasqBackend", json!(1)), CONFIG),
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without a type", with(&b, "ipam", json!({ "dataDir": f.data_dir() })), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../../bin/sh" })), CONFIG),
        case("ipam.type a main plugin", with(&b, "ipam", json!({ "type": "ptp" })), CONFIG),
        case("ipam.type not in CNI_PATH", with(&b, "ipam", json!({ "type": "no-such-ipam" })), CONFIG),
    ]
}

#[test]
fn ptp_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "ptp");
    cases.extend(netns_cases(&f, "ptp"));
    cases.extend(ptp_cases(&f));
    run_table(&f, "ptp", &cases);
}

fn host_device_cases(f: &Fixture) -> Vec<Case> {
    let b = without_keys(&f.base("host-device"), &["device"]);
    let set = |k: &str, v: Value| with(&b, k, v);
    vec![
        case("no device key of any kind", b.to_string(), CONFIG),
        case("device a number", set("device", json!(5)), CONFIG),
        case("device with /", set("device", json!("a/b")), CONFIG),
        case("device ..", set("device", json!("..")), CONFIG),
        case("device 16 bytes", set("device", json!("eth0123456789abc")), CONFIG),
        case("hwaddr malformed", set("hwaddr", json!("zz:zz")), CONFIG),
        case("hwaddr a number", set("hwaddr", json!(5)), CONFIG),
        case("kernelpath outside /sys/devices", set("kernelpath", json!("/etc")), CONFIG),
        case("kernelpath escaping with ..", set("kernelpath", json!("/sys/devices/../../etc")), CONFIG),
        case("kernelpath relative", set("kernelpath", json!("sys/devices/pci0000:00")), CONFIG),
        case("pciBusID a path", set("pciBusID", json!("../../../../etc")), CONFIG),
        case("pciBusID function 8", set("pciBusID", json!("0000:03:00.8")), CONFIG),
        case("runtimeConfig.deviceID a path", set("runtimeConfig", json!({ "deviceID": "../x/y" })), CONFIG),
        case("runtimeConfig.deviceID a number", set("runtimeConfig", json!({ "deviceID": 7 })), CONFIG),
        case("ipam.type a path", with(&f.base("host-device"), "ipam", json!({ "type": "/bin/sh" })), CONFIG),
        // A device the host does not have: nothing moved, no address taken.
        case("device not on the host", f.base("host-device").to_string(), 100),
        case("dataDir relative", with(&f.base("host-device"), "dataDir", json!("run/hd")), CONFIG),
        case("dataDir a number", with(&f.base("host-device"), "dataDir", json!(5)), CONFIG),
    ]
}

#[test]
fn host_device_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "host-device");
    cases.extend(netns_cases(&f, "host-device"));
    cases.extend(host_device_cases(&f));
    run_table(&f, "host-device", &cases);
}

fn dummy_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("dummy");
    vec![
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without a type", with(&b, "ipam", json!({})), CONFIG),
        case("ipam.type empty", with(&b, "ipam", json!({ "type": "" })), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
    ]
}

fn vlan_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("vlan");
    let mut cases = vec![
        case("no master", without(&b, "master"), CONFIG),
        case("master names no interface", with(&b, "master", json!("nosuch0")), CONFIG),
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
    ];
    for (key, bad) in [
        ("master", json!("")),
        ("master", json!(5)),
        ("master", json!("a/b")),
        ("master", json!("0123456789abcdef")),
        ("vlanId", json!(-1)),
        ("vlanId", json!(4095)),
        ("vlanId", json!("10")),
        ("vlanId", json!(1.5)),
        ("mtu", json!(-1)),
        ("mtu", json!(67)),
        ("mtu", json!(70000)),
        ("mtu", json!("1500")),
        ("linkInContainer", json!(1)),
        ("linkInContainer", json!("yes")),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

fn vrf_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("vrf");
    let mut cases = vec![
        case("no vrfname", without(&b, "vrfname"), CONFIG),
        case("no prevResult", without(&b, "prevResult"), CONFIG),
        case("cniVersion 0.3.0 (vrf speaks 0.3.1 and later)", with(&b, "cniVersion", json!("0.3.0")), VERSION),
    ];
    for (key, bad) in [
        ("vrfname", json!("")),
        ("vrfname", json!(5)),
        ("vrfname", json!("a/b")),
        ("vrfname", json!("0123456789abcdef")),
        ("table", json!(-1)),
        ("table", json!(254)),
        ("table", json!(255)),
        ("table", json!(4_294_967_296u64)),
        ("table", json!("10")),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

#[test]
fn dummy_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "dummy");
    cases.extend(netns_cases(&f, "dummy"));
    cases.extend(dummy_cases(&f));
    run_table(&f, "dummy", &cases);
}

#[test]
fn vlan_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "vlan");
    cases.extend(netns_cases(&f, "vlan"));
    cases.extend(vlan_cases(&f));
    run_table(&f, "vlan", &cases);
}

#[test]
fn vrf_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "vrf");
    cases.extend(netns_cases(&f, "vrf"));
    cases.extend(vrf_cases(&f));
    run_table(&f, "vrf", &cases);
}

fn tap_cases(f: &Fixture) -> Vec<Case> {
    let b = f.base("tap");
    let mut cases = vec![
        case("bridge names no bridge in the pod", with(&b, "bridge", json!("nosuch0")), CONFIG),
        case("ipam.type a path", with(&b, "ipam", json!({ "type": "../host-local" })), CONFIG),
        case("runtimeConfig.mac not a MAC", with(&b, "runtimeConfig", json!({ "mac": "nope" })), CONFIG),
        case("runtimeConfig.mac a number", with(&b, "runtimeConfig", json!({ "mac": 5 })), CONFIG),
        env_case("CNI_ARGS MAC not a MAC", &b, vec![("CNI_ARGS", Some("MAC=zz".to_string()))], CONFIG),
    ];
    for (key, bad) in [
        ("mac", json!("0a:58")),
        ("mac", json!("01:00:5e:00:00:01")),
        ("mac", json!(5)),
        ("mtu", json!(-1)),
        ("mtu", json!(67)),
        ("mtu", json!(70000)),
        ("mtu", json!("1500")),
        ("multiQueue", json!(1)),
        ("owner", json!(-1)),
        ("owner", json!("root")),
        ("group", json!(4_294_967_296u64)),
        ("bridge", json!("a/b")),
        ("bridge", json!(5)),
        ("selinuxContext", json!(5)),
    ] {
        cases.push(case(format!("{key} {bad}"), with(&b, key, bad), CONFIG));
    }
    cases
}

#[test]
fn tap_refuses_hostile_input() {
    let f = Fixture::new();
    let mut cases = common_cases(&f, "tap");
    cases.extend(netns_cases(&f, "tap"));
    cases.extend(tap_cases(&f));
    run_table(&f, "tap", &cases);
}
