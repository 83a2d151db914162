//! Running a plugin binary (ours or the reference) as a runtime would: env and stdin in, JSON out.

use serde_json::{json, Value};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Every CNI spec version, oldest first.
pub const VERSIONS: [&str; 7] = ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

#[derive(Debug, Clone)]
pub struct Out {
    pub rc: i32,
    pub stdout: String,
    pub json: Value,
}

impl Out {
    pub fn ok(&self) -> &Value {
        assert_eq!(self.rc, 0, "plugin failed: {}", self.stdout);
        &self.json
    }
    pub fn err_code(&self) -> u64 {
        assert_ne!(self.rc, 0, "plugin unexpectedly succeeded: {}", self.stdout);
        self.json["code"].as_u64().unwrap_or_else(|| panic!("no error code in {}", self.stdout))
    }
    pub fn msg(&self) -> String {
        self.json["msg"].as_str().unwrap_or_default().to_string()
    }
    /// The addresses of an ADD result, whatever its version's shape.
    pub fn ips(&self) -> Vec<String> {
        let v = self.ok();
        let mut out: Vec<String> = v["ips"]
            .as_array()
            .map(|a| a.iter().map(|i| i["address"].as_str().unwrap().to_string()).collect())
            .unwrap_or_default();
        for key in ["ip4", "ip6"] {
            if let Some(ip) = v[key]["ip"].as_str() {
                out.push(ip.to_string());
            }
        }
        out
    }
    /// The bare address of the first IP in an ADD result.
    pub fn first_ip(&self) -> String {
        let ips = self.ips();
        assert!(!ips.is_empty(), "no IP in {}", self.stdout);
        ips[0].split('/').next().unwrap().to_string()
    }
}

/// One invocation of `bin` with a clean environment.
pub fn exec(bin: &str, cmd: &str, conf: &Value, cid: &str, ifname: &str, cni_args: &str) -> Out {
    exec_with_env(bin, cmd, conf, cid, ifname, cni_args, &[])
}

/// [`exec`] with `extra` variables in the otherwise clean environment.
pub fn exec_with_env(
    bin: &str,
    cmd: &str,
    conf: &Value,
    cid: &str,
    ifname: &str,
    cni_args: &str,
    extra: &[(&str, &str)],
) -> Out {
    let mut c = Command::new(bin);
    c.env_clear()
        .envs(extra.iter().copied())
        .env("CNI_COMMAND", cmd)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if !cid.is_empty() {
        c.env("CNI_CONTAINERID", cid).env("CNI_IFNAME", ifname).env("CNI_NETNS", "/var/run/netns/host-local-test");
    }
    if !cni_args.is_empty() {
        c.env("CNI_ARGS", cni_args);
    }
    feed(c, bin, conf)
}

/// `bin` run inside the network namespace `node` (`ip netns exec`), as the runtime of a node that is a
/// namespace runs it: the pod's namespace `netns`, interface eth0, `CNI_PATH` = `cni_path`.
pub fn exec_in(node: &str, bin: &Path, cmd: &str, conf: &Value, cid: &str, netns: &str, cni_path: &Path) -> Out {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", node])
        .arg(bin)
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", cid)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    feed(c, &bin.display().to_string(), conf)
}

/// Spawns `c` (which runs `bin`), writes `conf` to its stdin and collects what it answers.
fn feed(mut c: Command, bin: &str, conf: &Value) -> Out {
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let json =
        if stdout.trim().is_empty() { Value::Null } else { serde_json::from_str(&stdout).unwrap_or(Value::Null) };
    Out { rc: out.status.code().unwrap_or(-1), stdout, json }
}

pub fn netconf(version: &str, name: &str, ipam: Value) -> Value {
    json!({"cniVersion": version, "name": name, "type": "bridge", "ipam": ipam})
}
