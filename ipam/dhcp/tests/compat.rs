//! The reference's dhcp (Debian's /usr/lib/cni/dhcp) and ours speak different protocols on the
//! daemon's socket (Go net/rpc with gob, and JSON lines): a mixed pair fails with a message that
//! says so, on either side, instead of hanging or a decode error. No root needed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::exec::{exec_call, Call, Out};
use cni_tests::{bin_dir, prerequisite, wait_for, TempDir};
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

fn plugin(bin: &Path, command: &str, conf: &str) -> Out {
    let conf: serde_json::Value = serde_json::from_str(conf).unwrap();
    exec_call(bin, &Call::new(command, "compat", "/proc/self/ns/net").path("/nonexistent"), &conf)
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
    let out = plugin(Path::new(REFERENCE), "ADD", &conf("1.0.0", &sock));
    out.err_code();
    assert!(out.msg().contains("cni-rs dhcp daemon"), "{}", out.stdout);
}

#[test]
fn our_plugin_against_the_reference_daemon_says_which_daemon_it_reached() {
    if !prerequisite(Path::new(REFERENCE).exists(), "the reference dhcp daemon (containernetworking-plugins)") {
        return;
    }
    let dir = TempDir::new("dhcp-compat");
    let sock = dir.path().join("reference.sock");
    let _d = daemon(Path::new(REFERENCE), &sock);
    let out = plugin(&bin_dir().join("dhcp"), "STATUS", &conf("1.1.0", &sock));
    assert_eq!((out.rc, out.err_code()), (1, 102), "{}", out.stdout);
    assert!(out.msg().contains("reference's dhcp daemon"), "{}", out.stdout);
}
