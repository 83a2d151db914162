//! Running a plugin binary (ours or the reference) as a runtime would: env and stdin in, JSON out.

use serde_json::{json, Value};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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
    let (netns, ifname) = if cid.is_empty() { ("", "") } else { ("/var/run/netns/host-local-test", ifname) };
    let mut c = Command::new(bin);
    c.env_clear().envs(extra.iter().copied());
    out_of(Call::new(cmd, cid, netns).ifname(ifname).args(cni_args).run(c, conf))
}

/// `bin` run inside the network namespace `node` (`ip netns exec`), as the runtime of a node that is a
/// namespace runs it: the pod's namespace `netns`, interface eth0, `CNI_PATH` = `cni_path`.
pub fn exec_in(node: &str, bin: &Path, cmd: &str, conf: &Value, cid: &str, netns: &str, cni_path: &Path) -> Out {
    out_of(Call::new(cmd, cid, netns).path(cni_path).run(netns_exec(node, bin), conf))
}

/// `call` of `bin` with an otherwise clean environment.
pub fn exec_call(bin: impl AsRef<OsStr>, call: &Call, conf: &Value) -> Out {
    let mut c = Command::new(bin);
    c.env_clear();
    out_of(call.run(c, conf))
}

/// What a test reads of a finished call; the plugin's stderr goes to the test's own.
fn out_of(out: Output) -> Out {
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    Out { rc: out.status.code().unwrap_or(-1), json: json_of(&out.stdout), stdout }
}

/// The variables a runtime sets for one plugin call. An empty value leaves its variable unset (a
/// plugin reads unset and empty alike): GC and STATUS have no container, DEL may have no netns.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// CNI_COMMAND.
    pub command: &'a str,
    /// CNI_CONTAINERID.
    pub container: &'a str,
    /// CNI_NETNS.
    pub netns: &'a str,
    /// CNI_IFNAME.
    pub ifname: &'a str,
    /// CNI_PATH.
    pub path: PathBuf,
    /// CNI_ARGS.
    pub args: &'a str,
}

impl<'a> Call<'a> {
    /// A call for `eth0`, with CNI_PATH the reference plugins' directory (/usr/lib/cni) and no
    /// CNI_ARGS.
    pub fn new(command: &'a str, container: &'a str, netns: &'a str) -> Call<'a> {
        Call { command, container, netns, ifname: "eth0", path: PathBuf::from("/usr/lib/cni"), args: "" }
    }
    pub fn ifname(mut self, ifname: &'a str) -> Self {
        self.ifname = ifname;
        self
    }
    pub fn path(mut self, path: impl Into<PathBuf>) -> Self {
        self.path = path.into();
        self
    }
    pub fn args(mut self, args: &'a str) -> Self {
        self.args = args;
        self
    }

    /// Runs `plugin` (the binary, or a wrapper such as [`netns_exec`] that runs it; with whatever
    /// else of the environment the test sets) with these variables and `conf` on stdin; stdout and
    /// stderr are captured.
    pub fn run(&self, mut plugin: Command, conf: &Value) -> Output {
        plugin.env("CNI_COMMAND", self.command).env("CNI_PATH", &self.path);
        for (key, value) in [
            ("CNI_CONTAINERID", self.container),
            ("CNI_NETNS", self.netns),
            ("CNI_IFNAME", self.ifname),
            ("CNI_ARGS", self.args),
        ] {
            if !value.is_empty() {
                plugin.env(key, value);
            }
        }
        let mut child = plugin
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", plugin.get_program()));
        child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    }
}

/// `ip netns exec <ns> <bin>`: a plugin run inside a namespace, as a runtime on that node would.
pub fn netns_exec(ns: &str, bin: impl AsRef<OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(bin);
    c
}

/// A plugin's stdout as JSON; Null when it is empty or not JSON.
pub fn json_of(stdout: &[u8]) -> Value {
    serde_json::from_slice(stdout).unwrap_or(Value::Null)
}

pub fn netconf(version: &str, name: &str, ipam: Value) -> Value {
    json!({"cniVersion": version, "name": name, "type": "bridge", "ipam": ipam})
}
