//! The reference's dhcp (Debian's /usr/lib/cni/dhcp) and ours speak different protocols on the
//! daemon's socket (Go net/rpc with gob, and JSON lines): a mixed pair fails with a message that
//! says so, on either side, instead of hanging or a decode error. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{bin_dir, prerequisite, wait_for, TempDir};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const REFERENCE: &str = "/usr/lib/cni/dhcp";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn daemon(bin: &Path, sock: &Path) -> Killed {
    let child = Command::new(bin)
        .args(["daemon", "-socketpath", sock.to_str().unwrap()])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start daemon");
    assert!(wait_for(Duration::from_secs(5), || UnixStream::connect(sock).is_ok()), "{} daemon", bin.display());
    Killed(child)
}

fn plugin(bin: &Path, command: &str, conf: &str) -> (Option<i32>, String) {
    let mut child = Command::new(bin)
        .env_clear()
        .env("CNI_COMMAND", command)
        .env("CNI_CONTAINERID", "compat")
        .env("CNI_NETNS", "/proc/self/ns/net")
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", "/nonexistent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

fn conf(version: &str, sock: &Path) -> String {
    format!(
        r#"{{"cniVersion":"{version}","name":"compat","type":"bridge","ipam":{{"type":"dhcp","daemonSocketPath":"{}"}}}}"#,
        sock.display()
    )
}

#[test]
fn reference_plugin_against_our_daemon_says_which_daemon_it_reached() {
    if !prerequisite(Path::new(REFERENCE).exists(), "the reference dhcp plugin (containernetworking-plugins)") {
        return;
    }
    let dir = TempDir::new("dhcp-compat");
    let sock = dir.path().join("ours.sock");
    let _d = daemon(&bin_dir().join("dhcp"), &sock);
    let (code, out) = plugin(Path::new(REFERENCE), "ADD", &conf("1.0.0", &sock));
    assert_ne!(code, Some(0), "{out}");
    assert!(out.contains("cni-rs dhcp daemon"), "{out}");
}

#[test]
fn our_plugin_against_the_reference_daemon_says_which_daemon_it_reached() {
    if !prerequisite(Path::new(REFERENCE).exists(), "the reference dhcp daemon (containernetworking-plugins)") {
        return;
    }
    let dir = TempDir::new("dhcp-compat");
    let sock = dir.path().join("reference.sock");
    let _d = daemon(Path::new(REFERENCE), &sock);
    let (code, out) = plugin(&bin_dir().join("dhcp"), "STATUS", &conf("1.1.0", &sock));
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("reference's dhcp daemon") && out.contains("\"code\": 102"), "{out}");
}
