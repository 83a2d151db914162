//! The etcd datastore over TLS, against a real etcd (Debian's etcd-server 3.4) that serves clients
//! on https only, with a CA and certificates made by openssl: agents with a client certificate
//! lease their blocks and route to each other; an agent without one, with the wrong CA, or with a
//! certificate another CA signed is refused with a log line naming the flag to fix; a user and
//! password (etcd auth) work over server-only TLS, also after the token expired, and a missing or
//! wrong password is named too, and so is a user that may only read the prefix.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use std::time::Duration;

struct Fixture {
    // Field order is drop order: agents, then etcd, then the namespaces and files.
    agents: Vec<Agent>,
    etcd: Etcd,
    nodes: Vec<Netns>,
    _segment: Segment,
    pki: Pki,
    dir: TempDir,
}

/// etcd on https://10.95.0.1:2379 in the segment, `nodes` node namespaces at 10.95.0.(11+i).
fn fixture(nodes: usize, client_cert_auth: bool, etcd_args: &[&str]) -> Fixture {
    let t = tag();
    let dir = TempDir::new("etcd-tls");
    let pki = Pki::new("cluster-ca");
    let segment = Segment::new(format!("cnseg{t}"), "10.95.0.1/24");
    let etcd = Etcd::start_tls(&segment.ns.0, "10.95.0.1", &pki, client_cert_auth, etcd_args);
    let mut list = Vec::new();
    for i in 0..nodes {
        let ns = Netns::new(format!("cnt{t}-{i}"));
        segment.attach(&ns, &format!("p{i}"), &format!("10.95.0.{}/24", 11 + i));
        std::fs::create_dir_all(dir.0.join(format!("n{i}"))).unwrap();
        list.push(ns);
    }
    Fixture { agents: Vec::new(), etcd, nodes: list, _segment: segment, pki, dir }
}

impl Fixture {
    /// Starts node `i`'s agent with `security` (the TLS and auth flags) after the usual ones.
    fn start(&mut self, i: usize, security: &[&str]) -> usize {
        let conf = self.dir.0.join(format!("n{i}"));
        let ip = format!("10.95.0.{}", 11 + i);
        let mut args = etcd_agent_args(&self.etcd.url, &format!("n{i}"), "10.244.0.0/16", &ip, 10, &conf);
        args.extend(security.iter().map(|s| s.to_string()));
        self.agents.push(Agent::start(&self.nodes[i].0, &conf, args));
        self.agents.len() - 1
    }

    /// Node name -> its block's key and IPv4 pod CIDR, as etcdctl reads them.
    fn block_of(&self, node: &str) -> Option<(String, String)> {
        self.etcd.get_prefix("/cni-rs/subnets/").into_iter().find_map(|(key, value)| {
            let value: serde_json::Value = serde_json::from_str(&value).ok()?;
            (value["node"] == node).then(|| (key, value["podCIDRs"][0].as_str().unwrap_or_default().to_string()))
        })
    }

    /// Waits until agent `a`'s log has a line containing every one of `wanted`; returns it.
    fn log_line(&self, a: usize, wanted: &[&str]) -> String {
        let agent = &self.agents[a];
        wait_for(&format!("{wanted:?} in agent {a}'s log"), Duration::from_secs(20), || {
            agent.proc.log().lines().find(|l| wanted.iter().all(|w| l.contains(w))).map(String::from)
        })
    }
}

#[test]
fn agents_with_client_certificates_lease_their_blocks_and_route_over_tls() {
    require(&["etcd", "etcdctl", "openssl"]);
    let mut f = fixture(2, true, &[]);
    // etcd really demands a client certificate: etcdctl with the CA alone gets nothing.
    let (ok, text) = try_in(
        &f.etcd.ns,
        &["etcdctl", "--endpoints", &f.etcd.url, "--cacert", &f.pki.ca(), "get", "--prefix", "/", "--dial-timeout=3s"],
    );
    assert!(!ok, "etcd answered a client without a certificate: {text}");
    for i in 0..2 {
        let (cert, key) = f.pki.client(&format!("n{i}"));
        let ca = f.pki.ca();
        f.start(i, &["--etcd-cafile", &ca, "--etcd-certfile", &cert, "--etcd-keyfile", &key]);
        // One at a time: n0 holds block 0, n1 block 1.
        wait_for(&format!("n{i}'s block"), Duration::from_secs(20), || f.block_of(&format!("n{i}")));
    }
    assert_eq!(f.block_of("n0").unwrap(), ("/cni-rs/subnets/10.244.0.0-24".into(), "10.244.0.0/24".into()));
    assert_eq!(f.block_of("n1").unwrap(), ("/cni-rs/subnets/10.244.1.0-24".into(), "10.244.1.0/24".into()));
    let lease = f.etcd.etcdctl(&["get", "/cni-rs/subnets/10.244.0.0-24", "-w", "fields"]);
    assert!(lease.contains("\"Lease\" : ") && !lease.contains("\"Lease\" : 0\n"), "{lease}");
    for (i, peer) in [(0, "10.244.1.0/24 via 10.95.0.12 dev eth0"), (1, "10.244.0.0/24 via 10.95.0.11 dev eth0")] {
        let ns = f.nodes[i].0.clone();
        let routes = wait_for(&format!("n{i}'s route to the other"), Duration::from_secs(20), || {
            let r = run_in(&ns, &["ip", "-4", "route", "show", "proto", "210"]);
            r.contains(peer).then_some(r)
        });
        assert_eq!(routes.lines().count(), 1, "n{i}: {routes}");
        let conflist = std::fs::read_to_string(f.dir.0.join(format!("n{i}/10-cni-rs.conflist"))).unwrap();
        let conflist: serde_json::Value = serde_json::from_str(&conflist).unwrap();
        let subnet = &conflist["plugins"][0]["ipam"]["ranges"][0][0]["subnet"];
        assert_eq!(subnet, &format!("10.244.{i}.0/24"), "n{i}: {conflist}");
    }
    for agent in &mut f.agents {
        assert!(agent.proc.running(), "agent exited: {}", agent.proc.log());
        assert!(!agent.proc.log().contains("warning: connect to etcd"), "{}", agent.proc.log());
    }
}

#[test]
fn refused_tls_connections_name_the_flag_to_fix() {
    require(&["etcd", "etcdctl", "openssl"]);
    let mut f = fixture(3, true, &[]);
    let other = Pki::new("other-ca");
    let (cert, key) = f.pki.client("n-good");
    let (foreign_cert, foreign_key) = other.client("n-foreign");
    let (ca, other_ca) = (f.pki.ca(), other.ca());
    // No client certificate.
    let a = f.start(0, &["--etcd-cafile", &ca]);
    // A CA that did not sign etcd's server certificate.
    let b = f.start(1, &["--etcd-cafile", &other_ca, "--etcd-certfile", &cert, "--etcd-keyfile", &key]);
    // A client certificate signed by a CA etcd does not trust.
    let c = f.start(2, &["--etcd-cafile", &ca, "--etcd-certfile", &foreign_cert, "--etcd-keyfile", &foreign_key]);
    // TLS 1.3 lets the client finish its handshake before the server checks its certificate, so
    // etcd's refusal reaches the agent as its alert or as a closed connection, and both say it.
    let line =
        f.log_line(a, &["warning: connect to etcd https://10.95.0.1:2379", "give --etcd-certfile and --etcd-keyfile"]);
    assert!(line.contains("--client-cert-auth"), "{line}");
    f.log_line(
        b,
        &[&format!("etcd's server certificate is not signed by --etcd-cafile {other_ca}: give the CA that signed it")],
    );
    f.log_line(c, &["--etcd-certfile", "signed by the CA of", "--trusted-ca-file"]);
    assert!(f.etcd.get_prefix("/cni-rs/").is_empty(), "a refused agent wrote to etcd");
    for agent in &mut f.agents {
        assert!(agent.proc.running(), "a refused agent keeps retrying: {}", agent.proc.log());
        assert!(!agent.proc.log().contains("holding"), "{}", agent.proc.log());
    }

    // TLS flags with a plain-HTTP endpoint: a usage error before anything starts.
    let out = std::process::Command::new(AGENT)
        .args(["--node-name", "n9", "--etcd-endpoints", "http://10.95.0.1:2379", "--cluster-cidr", "10.244.0.0/16"])
        .args(["--etcd-cafile", &ca])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--etcd-endpoints http://10.95.0.1:2379: --etcd-cafile means TLS, which needs https:// endpoints (write https://10.95.0.1:2379"), "{stderr}");
}

#[test]
fn a_user_and_password_file_over_server_only_tls() {
    require(&["etcd", "etcdctl", "openssl"]);
    // Tokens live 1 s (etcd's default is 300 s): the agent's requests after a lost lease come
    // long after its token expired.
    let mut f = fixture(1, false, &["--auth-token-ttl", "1"]);
    let password = f.dir.0.join("password");
    std::fs::write(&password, "agent-secret\n").unwrap();
    let wrong = f.dir.0.join("wrong-password");
    std::fs::write(&wrong, "not-it\n").unwrap();
    for args in [
        &["user", "add", "root:root-secret"][..],
        &["role", "add", "cni-rs-node"],
        &["role", "grant-permission", "cni-rs-node", "--prefix=true", "readwrite", "/cni-rs/subnets/"],
        &["user", "add", "node-agent:agent-secret"],
        &["user", "grant-role", "node-agent", "cni-rs-node"],
        &["role", "add", "reader"],
        &["role", "grant-permission", "reader", "--prefix=true", "read", "/cni-rs/subnets/"],
        &["user", "add", "viewer:agent-secret"],
        &["user", "grant-role", "viewer", "reader"],
        &["auth", "enable"],
    ] {
        f.etcd.etcdctl(args);
    }
    f.etcd.ctl.push("--user=root:root-secret".into());
    let ca = f.pki.ca();
    let (password, wrong) = (password.to_str().unwrap(), wrong.to_str().unwrap());

    let a = f.start(0, &["--etcd-cafile", &ca]);
    f.log_line(a, &["etcd's auth is on: give --etcd-username and --etcd-password-file", "/cni-rs/subnets/"]);
    f.agents[a].proc.stop(SIGTERM, Duration::from_secs(5));
    let b = f.start(0, &["--etcd-cafile", &ca, "--etcd-username", "node-agent", "--etcd-password-file", wrong]);
    f.log_line(b, &["invalid user ID or password", "check --etcd-username and the password in --etcd-password-file"]);
    f.agents[b].proc.stop(SIGTERM, Duration::from_secs(5));
    // A user that may read the prefix but not write it is refused at its first write.
    let r = f.start(0, &["--etcd-cafile", &ca, "--etcd-username", "viewer", "--etcd-password-file", password]);
    f.log_line(
        r,
        &["permission denied", "etcd user viewer needs a role with readwrite on the prefix /cni-rs/subnets/"],
    );
    f.agents[r].proc.stop(SIGTERM, Duration::from_secs(5));
    assert!(f.etcd.get_prefix("/cni-rs/").is_empty(), "a refused agent wrote to etcd");

    let c = f.start(0, &["--etcd-cafile", &ca, "--etcd-username", "node-agent", "--etcd-password-file", password]);
    let (key, cidr) = wait_for("n0's block", Duration::from_secs(20), || f.block_of("n0"));
    assert_eq!((key.as_str(), cidr.as_str()), ("/cni-rs/subnets/10.244.0.0-24", "10.244.0.0/24"));
    assert!(f.agents[c].proc.running(), "{}", f.agents[c].proc.log());

    // Revoking the lease makes the agent grant a new one and take its block again, seconds
    // after its token expired: it authenticates again by itself.
    std::thread::sleep(Duration::from_secs(3));
    // Every lease: the refused agent's (granted before its first write, left to expire) is listed
    // too; the log line below shows that the agent's own was among them.
    let leases = f.etcd.etcdctl(&["lease", "list"]);
    let ids: Vec<&str> = leases.lines().skip(1).map(str::trim).filter(|l| !l.is_empty()).collect();
    assert!(!ids.is_empty(), "no lease in {leases:?}");
    for id in ids {
        f.etcd.try_etcdctl(&["lease", "revoke", id]);
    }
    f.log_line(c, &["taking a block again"]);
    wait_for("n0's block again", Duration::from_secs(20), || {
        let log = f.agents[c].proc.log();
        (log.matches("holding 10.244.0.0/24").count() == 2).then_some(())
    });
    assert_eq!(f.block_of("n0").unwrap().0, "/cni-rs/subnets/10.244.0.0-24");
    let log = f.agents[c].proc.log();
    assert!(!log.contains("warning: etcd") && !log.contains("invalid auth token"), "{log}");
}
