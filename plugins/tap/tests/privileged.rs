#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! tap on this host's kernel (it has tun/tap), with real namespaces and real frames: the pod gets
//! a persistent tap `eth0` with IPAM's address, the configured MAC, MTU, owner and group; a reader
//! attached to it (as a VM would) sees the pod's ARP request, answers it, and then receives the
//! pod's ICMP echo request addressed to the MAC it answered with. `multiQueue`, `bridge` (layer 2
//! only), `selinuxContext` ignored without SELinux; CHECK sees drift; failures leave nothing; DEL
//! twice and with the namespace gone; every spec version. Subnets 10.211.x.

use cni_tests::{bin_dir, require_root, Netns, TempDir};
use netkit::NetNs;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Ran {
    code: Option<i32>,
    stdout: String,
}

fn exec(command: &str, id: &str, netns: &str, conf: &Value) -> Ran {
    let mut child = Command::new(bin_dir().join("tap"))
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", bin_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    Ran { code: out.status.code(), stdout: String::from_utf8_lossy(&out.stdout).into_owned() }
}

fn ok(ran: Ran, what: &str) -> Value {
    assert_eq!(ran.code, Some(0), "{what}: {}", ran.stdout);
    serde_json::from_str(&ran.stdout).unwrap_or(Value::Null)
}

fn code(ran: &Ran) -> Option<u64> {
    serde_json::from_str::<Value>(&ran.stdout).ok()?["code"].as_u64()
}

fn conf(version: &str, data: &Path, extra: Value) -> Value {
    let mut c = json!({"cniVersion": version, "name": "tapnet", "type": "tap",
        "ipam": {"type": "host-local", "dataDir": data.display().to_string(),
                 "ranges": [[{"subnet": "10.211.7.0/24"}]]}});
    cni_tests::merge(&mut c, extra);
    c
}

/// CHECK and DEL get ADD's result as prevResult from 0.4.0 on, as a runtime sends it.
fn with_prev(c: &Value, result: &Value) -> Value {
    let mut c = c.clone();
    if c["cniVersion"].as_str().unwrap() >= "0.4.0" {
        c["prevResult"] = result.clone();
    }
    c
}

fn sysfs(pod: &Netns, file: &str) -> String {
    pod.sh("cat", &[&format!("/sys/class/net/eth0/{file}")]).trim().to_string()
}

fn links_in(pod: &Netns) -> usize {
    pod.ip(&["-o", "link", "show"]).lines().filter(|l| !l.contains(": lo:")).count()
}

fn reservations(data: &Path) -> usize {
    std::fs::read_dir(data.join("tapnet"))
        .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().parse::<std::net::IpAddr>().is_ok()).count())
        .unwrap_or(0)
}

/// Attaches to the pod's tap as a VM's device would (IFF_TAP | IFF_NO_PI), non-blocking.
fn attach(pod: &Netns, multi_queue: bool) -> std::fs::File {
    let ns = NetNs::open(&pod.path).unwrap();
    let guard = ns.enter().unwrap();
    let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
    if multi_queue {
        flags |= libc::IFF_MULTI_QUEUE;
    }
    let file = netkit::tuntap::open_tap("eth0", flags as libc::c_short);
    guard.leave().unwrap();
    let file = file.unwrap();
    // SAFETY: F_SETFL with O_NONBLOCK on a file descriptor we own.
    assert!(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } == 0);
    file
}

/// The next frame read from `tap` that `want` accepts, within `timeout`.
fn frame(tap: &mut std::fs::File, timeout: Duration, want: impl Fn(&[u8]) -> bool) -> Option<Vec<u8>> {
    let start = Instant::now();
    let mut buf = [0u8; 2048];
    while start.elapsed() < timeout {
        match tap.read(&mut buf) {
            Ok(n) if want(&buf[..n]) => return Some(buf[..n].to_vec()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("read tap: {e}"),
        }
    }
    None
}

fn arp_reply(pod_mac: [u8; 6], pod_ip: [u8; 4], our_mac: [u8; 6], our_ip: [u8; 4]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(pod_mac);
    f.extend(our_mac);
    f.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
    f.extend(our_mac);
    f.extend(our_ip);
    f.extend(pod_mac);
    f.extend(pod_ip);
    f
}

#[test]
fn a_reader_on_the_tap_exchanges_frames_with_the_pod() {
    require_root();
    let data = TempDir::new("tapd");
    let pod = Netns::new("tapp");
    let mac = [0x0a, 0x58, 0x0a, 0xd3, 0x07, 0x02];
    let c = conf(
        "1.1.0",
        data.path(),
        json!({"mac": "0a:58:0a:d3:07:02", "mtu": 1400, "owner": 1000, "group": 1001,
            "selinuxContext": "system_u:system_r:container_t:s0"}),
    );
    let result = ok(exec("ADD", "tap-a", &pod.path, &c), "ADD");
    assert_eq!(result["interfaces"][0]["name"], "eth0", "{result}");
    assert_eq!(result["interfaces"][0]["mac"], "0a:58:0a:d3:07:02", "{result}");
    assert_eq!(result["interfaces"][0]["sandbox"], pod.path.as_str(), "{result}");
    assert_eq!(result["ips"][0]["address"], "10.211.7.2/24", "{result}");
    assert_eq!(result["ips"][0]["interface"], 0, "{result}");
    let details = pod.ip(&["-d", "link", "show", "eth0"]);
    assert!(details.contains("tun type tap"), "{details}");
    assert_eq!(sysfs(&pod, "address"), "0a:58:0a:d3:07:02");
    assert_eq!(sysfs(&pod, "mtu"), "1400");
    assert_eq!(sysfs(&pod, "owner"), "1000");
    assert_eq!(sysfs(&pod, "group"), "1001");
    let flags = u32::from_str_radix(sysfs(&pod, "tun_flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 0x0002, 0x0002, "IFF_TAP: {flags:#x}");
    assert_eq!(flags & 0x0100, 0, "no IFF_MULTI_QUEUE: {flags:#x}");
    assert!(pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"]).contains(" 10.211.7.2/24 "));

    // Real frames: the pod asks for 10.211.7.9, we answer as it, and its echo request comes to us.
    let mut tap = attach(&pod, false);
    let mut ping = Command::new("ip")
        .args(["netns", "exec", &pod.name, "busybox", "ping", "-c", "3", "-W", "1", "10.211.7.9"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let request = frame(&mut tap, Duration::from_secs(3), |f| {
        f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] && f[38..42] == [10, 211, 7, 9]
    });
    let request = request.expect("the pod's ARP request for 10.211.7.9 on the tap");
    assert_eq!(request[6..12], mac, "the ARP request comes from the configured MAC");
    assert_eq!(request[28..32], [10, 211, 7, 2], "the ARP request comes from the pod's address");
    let ours = [0x0a, 0, 0, 0, 0, 0x09];
    tap.write_all(&arp_reply(mac, [10, 211, 7, 2], ours, [10, 211, 7, 9])).unwrap();
    let echo = frame(&mut tap, Duration::from_secs(3), |f| {
        f.len() >= 34 && f[0..6] == ours && f[12..14] == [0x08, 0] && f[23] == 1 && f[30..34] == [10, 211, 7, 9]
    });
    let _ = ping.kill();
    let _ = ping.wait();
    assert!(echo.is_some(), "the pod's echo request to the MAC we answered with");
    let neigh = pod.ip(&["neigh", "show", "10.211.7.9"]);
    assert!(neigh.contains("lladdr 0a:00:00:00:00:09"), "{neigh}");
    drop(tap);

    ok(exec("CHECK", "tap-a", &pod.path, &with_prev(&c, &result)), "CHECK");
    pod.ip(&["addr", "del", "10.211.7.2/24", "dev", "eth0"]);
    let drift = exec("CHECK", "tap-a", &pod.path, &with_prev(&c, &result));
    assert_eq!(code(&drift), Some(103), "CHECK without the address: {}", drift.stdout);

    ok(exec("DEL", "tap-a", &pod.path, &with_prev(&c, &result)), "DEL");
    assert_eq!(links_in(&pod), 0, "DEL removes the tap");
    assert_eq!(reservations(data.path()), 0, "DEL releases the address");
    ok(exec("DEL", "tap-a", &pod.path, &with_prev(&c, &result)), "DEL again");
}

#[test]
fn multi_queue_bridge_and_layer_2_only() {
    require_root();
    let data = TempDir::new("tapd");
    let pod = Netns::new("tapq");
    pod.ip(&["link", "add", "brp", "type", "bridge"]);
    let c = conf("1.1.0", data.path(), json!({"multiQueue": true, "bridge": "brp", "ipam": null}));
    let result = ok(exec("ADD", "tap-q", &pod.path, &c), "ADD");
    assert!(result["ips"].as_array().is_none_or(|i| i.is_empty()), "layer 2 only: {result}");
    let flags = u32::from_str_radix(sysfs(&pod, "tun_flags").trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 0x0100, 0x0100, "IFF_MULTI_QUEUE: {flags:#x}");
    let link = pod.ip(&["-o", "link", "show", "eth0"]);
    assert!(link.contains(" master brp "), "{link}");
    assert!(link.contains(",UP"), "{link}");
    assert!(pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"]).is_empty());
    // A multi-queue tap takes a multi-queue reader.
    drop(attach(&pod, true));
    ok(exec("CHECK", "tap-q", &pod.path, &with_prev(&c, &result)), "CHECK");
    ok(exec("DEL", "tap-q", &pod.path, &with_prev(&c, &result)), "DEL");
    assert_eq!(pod.ip(&["-o", "link", "show", "master", "brp"]).lines().count(), 0, "the port is gone");
    ok(exec("STATUS", "", "", &c), "STATUS without ipam");
}

#[test]
fn failed_add_leaves_nothing_and_del_survives_a_gone_netns() {
    require_root();
    let data = TempDir::new("tapd");
    let pod = Netns::new("tapf");
    let missing_bridge = exec("ADD", "tap-f", &pod.path, &conf("1.1.0", data.path(), json!({"bridge": "nosuch"})));
    assert_eq!(code(&missing_bridge), Some(7), "{}", missing_bridge.stdout);
    assert!(missing_bridge.stdout.contains("bridge: nosuch not found"), "{}", missing_bridge.stdout);
    assert_eq!(links_in(&pod), 0);
    assert_eq!(reservations(data.path()), 0);
    // Fails after the tap exists and the address is reserved: IPAM's route is unreachable.
    let mut bad = conf("1.1.0", data.path(), json!({}));
    bad["ipam"]["routes"] = json!([{"dst": "192.168.9.0/24", "gw": "10.99.0.1"}]);
    let failed = exec("ADD", "tap-f", &pod.path, &bad);
    assert_ne!(failed.code, Some(0), "{}", failed.stdout);
    assert_eq!(links_in(&pod), 0, "the failed ADD deleted its tap");
    assert_eq!(reservations(data.path()), 0, "the failed ADD released its address");
    let bad_mac = exec("ADD", "tap-f", &pod.path, &conf("1.1.0", data.path(), json!({"mac": "nope"})));
    assert_eq!(code(&bad_mac), Some(7), "{}", bad_mac.stdout);

    let mut gone = Netns::new("tapg");
    let c = conf("1.1.0", data.path(), json!({}));
    let result = ok(exec("ADD", "tap-g", &gone.path, &c), "ADD");
    assert_eq!(reservations(data.path()), 1);
    gone.delete();
    ok(exec("DEL", "tap-g", &gone.path, &with_prev(&c, &result)), "DEL with the netns gone");
    assert_eq!(reservations(data.path()), 0, "DEL with the netns gone releases the address");
}

#[test]
fn every_spec_version() {
    require_root();
    let data = TempDir::new("tapd");
    for version in ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let pod = Netns::new("tapv");
        let c = conf(version, data.path(), json!({}));
        let result = ok(exec("ADD", "tap-v", &pod.path, &c), &format!("ADD {version}"));
        // host-local hands out the addresses round robin: whichever it gave is on the tap.
        let address = result["ips"][0]["address"].as_str().or(result["ip4"]["ip"].as_str()).unwrap_or_default();
        assert!(address.starts_with("10.211.7."), "{version}: {result}");
        let addrs = pod.ip(&["-4", "-o", "addr", "show", "dev", "eth0"]);
        assert!(addrs.contains(&format!(" {address} ")), "{version}: {address} not in {addrs}");
        let check = exec("CHECK", "tap-v", &pod.path, &with_prev(&c, &result));
        if version < "0.4.0" {
            assert_eq!(code(&check), Some(1), "{version}: CHECK is refused: {}", check.stdout);
        } else {
            assert_eq!(check.code, Some(0), "{version}: CHECK: {}", check.stdout);
        }
        ok(exec("DEL", "tap-v", &pod.path, &with_prev(&c, &result)), &format!("DEL {version}"));
        assert_eq!(links_in(&pod), 0, "{version}");
        ok(exec("DEL", "tap-v", &pod.path, &with_prev(&c, &result)), &format!("DEL {version} again"));
    }
}
