//! Fixtures for privileged tests: throwaway network namespaces and host links, removed on drop
//! even when the test fails.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// True when the test may run. As non-root it fails loudly, unless CNI_RS_UNPRIVILEGED=1 says
/// skipping is intended.
pub fn privileged() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CNI_RS_UNPRIVILEGED").as_deref() == Ok("1") {
        eprintln!("skipping privileged test: not root and CNI_RS_UNPRIVILEGED=1");
        return false;
    }
    panic!("this test needs root (network namespaces, links); run as root or set CNI_RS_UNPRIVILEGED=1 to skip");
}

/// 8 random hex characters.
pub fn suffix() -> String {
    let mut b = [0u8; 4];
    let f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut &f, &mut b).unwrap();
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Runs a command, panicking with its stderr if it fails; returns stdout.
pub fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A named netns from `ip netns add cnk-<random>`, deleted on drop.
pub struct TestNs {
    pub name: String,
    pub path: String,
}

impl TestNs {
    pub fn new() -> TestNs {
        let name = format!("cnk-{}", suffix());
        run("ip", &["netns", "add", &name]);
        let path = format!("/run/netns/{name}");
        TestNs { name, path }
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    pub fn exec(&self, cmd: &[&str]) -> String {
        let mut all = vec!["netns", "exec", self.name.as_str()];
        all.extend_from_slice(cmd);
        run("ip", &all)
    }
}

impl Drop for TestNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// Host links deleted on drop (veths in a deleted netns go with it, but their host ends and any
/// bridge stay behind otherwise).
pub struct HostLinks(pub Vec<String>);

impl HostLinks {
    pub fn new() -> HostLinks {
        HostLinks(Vec::new())
    }
    /// A unique name `<prefix><random>` (at most 15 bytes) registered for deletion.
    pub fn name(&mut self, prefix: &str) -> String {
        let n = format!("{prefix}{}", suffix());
        self.0.push(n.clone());
        n
    }
}

impl Drop for HostLinks {
    fn drop(&mut self) {
        for n in &self.0 {
            let _ = Command::new("ip").args(["link", "del", n]).stderr(std::process::Stdio::null()).status();
        }
    }
}
