//! Running a plugin binary (ours or the reference) as a runtime would: env and stdin in, JSON out.

use serde_json::{json, Value};
use std::io::Write;
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
    let mut env = vec![("CNI_COMMAND", cmd), ("CNI_PATH", "/usr/lib/cni")];
    if !cid.is_empty() {
        env.extend([("CNI_CONTAINERID", cid), ("CNI_IFNAME", ifname), ("CNI_NETNS", "/var/run/netns/host-local-test")]);
    }
    if !cni_args.is_empty() {
        env.push(("CNI_ARGS", cni_args));
    }
    exec_env(bin, conf, &env)
}

/// One invocation of `bin` with exactly the environment `env` and `conf` on stdin.
pub fn exec_env(bin: impl AsRef<std::path::Path>, conf: &Value, env: &[(&str, &str)]) -> Out {
    let bin = bin.as_ref();
    let mut c = Command::new(bin);
    c.env_clear().envs(env.iter().copied()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
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
