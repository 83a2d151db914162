//! Tests on a kernel that has the links: runs a bash script as root inside a VM that boots Debian's
//! own kernel (tests/vm/vmtest.sh), with the static multi-call binary `cni-rs` installed in
//! `/opt/cni/bin` under the plugin names asked for. For link types the host kernel lacks (dummy,
//! 8021q, ipvlan, vrf, bonding, bridge VLAN filtering).
//!
//! The script runs under `bash -e` after tests/vm/guest.sh is sourced: `cni VERB TYPE CONF ID NETNS
//! IFNAME` drives a plugin as a runtime does, and `check NAME CMD...` / `refuse NAME CMD...` print a
//! `PASS NAME` line per case, which [`VmRun::assert_passed`] looks for. A boot costs ~4-5 s on an
//! idle core under TCG: put many cases in one script.
//!
//! ```ignore
//! let run = Vm::new().plugins(&["bridge", "host-local"]).run(&script);
//! run.assert_passed(&["pods on vlan 10 reach each other"]);
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The static `cni-rs` built from the current sources (tests/vm/build.sh), once per test process.
pub fn static_cni_rs() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Command::new(repo().join("tests/vm/build.sh"))
            .output()
            .unwrap_or_else(|e| panic!("run tests/vm/build.sh: {e}"));
        assert!(
            out.status.success(),
            "tests/vm/build.sh (static build of cni-rs) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(path.is_file(), "tests/vm/build.sh named {} but there is no such file", path.display());
        path
    })
    .clone()
}

/// A static build of the integration test `test` of `package` (`cargo test --no-run`), for the
/// target and with the flags tests/vm/build.sh uses (the dependencies are shared): for running a
/// crate's own netlink tests inside the guest, e.g. `Vm::new().bin(static_test_binary("netkit", "netlink"))`. Its
/// guest path is /bin/ plus its file name.
pub fn static_test_binary(package: &str, test: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let static_target = |arg: &str| {
        let out = Command::new(repo().join("install/static-target.sh"))
            .arg(arg)
            .output()
            .unwrap_or_else(|e| panic!("run install/static-target.sh: {e}"));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let target = static_target("--install");
    let out = Command::new(cargo)
        .current_dir(repo())
        .env("RUSTFLAGS", format!("{} -C debuginfo=0", static_target("--rustflags")))
        .args(["test", "--no-run", "-q", "--target", &target, "--message-format=json"])
        .args(["-p", package, "--test", test])
        .output()
        .unwrap_or_else(|e| panic!("run cargo test --no-run: {e}"));
    assert!(
        out.status.success(),
        "static build of {package}'s test {test} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == test)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo named no executable for {package}'s test {test}"))
}

/// One guest to boot: which plugins, binaries and extra modules it has.
#[derive(Debug, Clone, Default)]
pub struct Vm {
    plugins: Vec<String>,
    bins: Vec<PathBuf>,
    modules: Vec<String>,
    timeout: Option<u32>,
}

/// What a guest run gave back.
#[derive(Debug)]
pub struct VmRun {
    /// The script's exit status; 125 when the guest reported none (boot failure, timeout).
    pub status: i32,
    /// The guest console (the script's stdout and stderr) and the harness's own messages.
    pub output: String,
    /// Wall time of the whole run: image, boot, script, power-off.
    pub elapsed: Duration,
}

impl Vm {
    pub fn new() -> Vm {
        Vm::default()
    }

    /// Plugin names installed in /opt/cni/bin as links to the static `cni-rs`.
    pub fn plugins(mut self, names: &[&str]) -> Vm {
        self.plugins.extend(names.iter().map(|s| s.to_string()));
        self
    }

    /// A host binary copied to the guest's /bin (a dynamic one brings its libraries).
    pub fn bin(mut self, path: impl Into<PathBuf>) -> Vm {
        self.bins.push(path.into());
        self
    }

    /// Kernel modules to load besides dummy 8021q ipvlan vrf bonding bridge macvlan veth (e.g.
    /// "tun", "nf_tables"), dependencies included.
    pub fn modules(mut self, names: &[&str]) -> Vm {
        self.modules.extend(names.iter().map(|s| s.to_string()));
        self
    }

    /// Seconds before the guest is killed (default 300).
    pub fn timeout(mut self, secs: u32) -> Vm {
        self.timeout = Some(secs);
        self
    }

    /// Boots the guest and runs `script` in it.
    pub fn run(&self, script: &str) -> VmRun {
        crate::require_root();
        let dir = std::env::temp_dir().join(format!("cni-rs-vm-script-{}", crate::unique("")));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("test.sh");
        std::fs::write(&file, script).unwrap();
        let mut cmd = Command::new(repo().join("tests/vm/vmtest.sh"));
        if !self.plugins.is_empty() {
            cmd.arg("--plugin-bin").arg(static_cni_rs()).arg("--plugins").arg(self.plugins.join(" "));
        }
        for b in &self.bins {
            cmd.arg("--bin").arg(b);
        }
        if !self.modules.is_empty() {
            cmd.arg("--modules").arg(self.modules.join(" "));
        }
        if let Some(t) = self.timeout {
            cmd.arg("--timeout").arg(t.to_string());
        }
        cmd.arg(&file);
        let start = Instant::now();
        let out = cmd.output().unwrap_or_else(|e| panic!("run tests/vm/vmtest.sh: {e}"));
        let elapsed = start.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
        output.push_str(&String::from_utf8_lossy(&out.stderr));
        eprintln!("VM run: {:.1} s", elapsed.as_secs_f64());
        VmRun { status: out.status.code().unwrap_or(125), output, elapsed }
    }

    /// [`Vm::run`] of a script whose loop `for v in VERSIONS;` goes over `versions` (guest.sh's
    /// `version_round` in it makes the cases of [`version_round_cases`]).
    pub fn run_versions(&self, script: &str, versions: &[&str]) -> VmRun {
        self.run(&script.replace("for v in VERSIONS;", &format!("for v in {};", versions.join(" "))))
    }
}

impl VmRun {
    /// The names of the `PASS NAME` lines, in order.
    pub fn passed(&self) -> Vec<&str> {
        self.output.lines().filter_map(|l| l.strip_prefix("PASS ")).map(str::trim_end).collect()
    }

    /// Fails (with the whole console) unless the script exited 0 and printed `PASS` for every
    /// name in `cases`: a case the script skipped fails too.
    pub fn assert_passed(&self, cases: &[impl AsRef<str>]) {
        // Shown by `cargo test -- --nocapture`; libtest keeps it otherwise.
        eprintln!("{}", self.output);
        assert_eq!(self.status, 0, "the guest script failed (status {}):\n{}", self.status, self.output);
        let passed = self.passed();
        let missing: Vec<&str> = cases.iter().map(AsRef::as_ref).filter(|c| !passed.contains(c)).collect();
        assert!(missing.is_empty(), "cases without a PASS line: {missing:?}\n{}", self.output);
    }

    /// The lines between `BEGIN name` and `END name`, for output the host test inspects.
    pub fn section(&self, name: &str) -> String {
        let (begin, end) = (format!("BEGIN {name}"), format!("END {name}"));
        self.output
            .lines()
            .skip_while(|l| l.trim_end() != begin)
            .skip(1)
            .take_while(|l| l.trim_end() != end)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The case names of a script's loop over spec versions: each of `names` with `{v}` replaced by
/// the version, plus `check {v}` from 0.4.0 on and `check {v} refused` before (CHECK came in 0.4.0).
pub fn per_version_cases(versions: &[&str], names: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for v in versions {
        out.extend(names.iter().map(|n| n.replace("{v}", v)));
        out.push(if *v < "0.4.0" { format!("check {v} refused") } else { format!("check {v}") });
    }
    out
}

/// The case names guest.sh's `version_round` prints for each of `versions` ("add {v}", the CHECK
/// case, "del {v}", "del {v} again"), with the script's own `after_add` / `after_del` cases `names`.
pub fn version_round_cases(versions: &[&str], names: &[&str]) -> Vec<String> {
    let round = ["add {v}", "del {v}", "del {v} again"];
    per_version_cases(versions, &[&round[..], names].concat())
}
