//! The cnitool binary end to end, with small shell-script plugins that log what they get.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

use cni_tests::gojson;

static COUNTER: AtomicU32 = AtomicU32::new(0);

struct Env {
    root: PathBuf,
}

impl Env {
    fn new(tag: &str) -> Env {
        let root = std::env::temp_dir().join(format!(
            "cnitool-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["bin", "net.d", "cache"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        // Logs "<command> <containerid> <ifname> <netns> <args>" then stdin; answers ADD with a result.
        let log = root.join("log");
        let script = format!(
            r#"#!/bin/sh
stdin=$(cat)
printf '%s|%s|%s|%s|%s|%s\n' "$CNI_COMMAND" "$CNI_CONTAINERID" "$CNI_IFNAME" "$CNI_NETNS" "$CNI_ARGS" "$stdin" >> {log}
case "$CNI_COMMAND" in
  ADD) echo '{{"cniVersion":"1.0.0","interfaces":[{{"name":"'"$CNI_IFNAME"'"}}],"ips":[{{"address":"10.9.0.2/24","interface":0}}]}}' ;;
  VERSION) echo '{{"cniVersion":"1.1.0","supportedVersions":["0.4.0","1.0.0","1.1.0"]}}' ;;
esac
"#,
            log = log.display()
        );
        let plugin = root.join("bin/logger");
        std::fs::write(&plugin, script).unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        Env { root }
    }

    fn conf(&self, file: &str, body: &str) {
        std::fs::write(self.root.join("net.d").join(file), body).unwrap();
    }

    fn run(&self, args: &[&str], extra_env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cnitool"));
        cmd.args(args)
            .current_dir(&self.root)
            .env_remove("CNI_ARGS")
            .env_remove("CAP_ARGS")
            .env_remove("CNI_IFNAME")
            .env("NETCONFPATH", self.root.join("net.d"))
            .env("CNI_PATH", self.root.join("bin"))
            .env("CNI_CACHE_DIR", self.root.join("cache"));
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        cmd.output().unwrap()
    }

    fn log(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(self.root.join("log"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.splitn(6, '|').map(str::to_string).collect())
            .collect()
    }

    fn cache_files(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.root.join("cache/results"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const NET: &str =
    r#"{"cniVersion":"1.1.0","name":"demo","plugins":[{"type":"logger","capabilities":{"portMappings":true}}]}"#;

fn netns_id(root: &Path, rel: &str) -> (String, String) {
    let abs = root.join(rel).display().to_string();
    (abs.clone(), cnitool::container_id(&abs))
}

/// `cnitool add` prints what upstream's cnitool (libcni >= 1.2) prints, byte for byte, for every
/// result version of the upstream vectors: the plugin answers with a vector's input, the list is
/// of that version, and the text must be Go's `Print()` of it (no trailing newline).
#[test]
fn add_prints_upstream_text_for_the_vectors() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cni/tests/testdata/conversions.json");
    let gojson::Ordered::Array(vectors) = gojson::Ordered::parse(&std::fs::read_to_string(path).unwrap()) else {
        panic!("conversions.json is not an array");
    };
    let mut seen = 0;
    for v in vectors.iter().filter(|v| v.get("from") == v.get("to") && v.get("output").is_some()) {
        let version = v.get("from").and_then(|f| f.as_str()).unwrap();
        let e = Env::new("print");
        let input: Value = serde_json::from_str(&gojson::marshal_indent(v.get("input").unwrap())).unwrap();
        let answer = e.root.join("answer.json");
        std::fs::write(&answer, input.to_string()).unwrap();
        let plugin = e.root.join("bin/answer");
        std::fs::write(&plugin, format!("#!/bin/sh\ncat >/dev/null\ncat {}\n", answer.display())).unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        e.conf("10-p.conflist", &format!(r#"{{"cniVersion":"{version}","name":"p","plugins":[{{"type":"answer"}}]}}"#));
        let out = e.run(&["add", "p", "ns1"], &[]);
        assert!(out.status.success(), "{version}: {}", text(&out.stderr));
        let expected = gojson::go_1_2_print(v.get("output").unwrap(), version);
        assert_eq!(text(&out.stdout), expected, "{}", v.get("description").and_then(|d| d.as_str()).unwrap());
        seen += 1;
    }
    assert_eq!(seen, 9, "one vector per input result");
}

#[test]
fn add_check_del_round_trip() {
    let e = Env::new("round");
    e.conf("10-demo.conflist", NET);
    let caps = r#"{"portMappings":[{"hostPort":8080,"containerPort":80,"protocol":"tcp"}]}"#;
    let out = e.run(&["add", "demo", "ns1"], &[("CNI_ARGS", "A=1;B=2"), ("CAP_ARGS", caps)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("{\n    \"cniVersion\": \"1.0.0\",\n    \"interfaces\": ["), "{stdout}");
    let printed: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed["interfaces"][0]["name"], "eth0");
    let (netns, cid) = netns_id(&e.root, "ns1");
    let log = e.log();
    assert_eq!(log[0][..5], ["ADD".to_string(), cid.clone(), "eth0".into(), netns.clone(), "A=1;B=2".into()]);
    let stdin: Value = serde_json::from_str(&log[0][5]).unwrap();
    assert_eq!(stdin["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
    assert_eq!(e.cache_files(), [format!("demo-{cid}-eth0")]);

    let out = e.run(&["check", "demo", "ns1"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
    let stdin: Value = serde_json::from_str(&e.log()[1][5]).unwrap();
    assert_eq!(stdin["prevResult"]["ips"][0]["address"], "10.9.0.2/24");

    let out = e.run(&["del", "demo", "ns1"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(e.log()[2][0], "DEL");
    assert!(e.cache_files().is_empty());

    // Interface name: flag over env over eth0; --json prints compact JSON.
    let out = e.run(&["add", "demo", "ns2", "--json", "-i", "net5"], &[("CNI_IFNAME", "net9")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).lines().count(), 1);
    assert_eq!(e.log()[3][2], "net5");
    let out = e.run(&["add", "demo", "ns3"], &[("CNI_IFNAME", "net9")]);
    assert!(out.status.success());
    assert_eq!(e.log()[4][2], "net9");

    // Extra trailing arguments are ignored, as upstream's cnitool does.
    let out = e.run(&["del", "demo", "ns3", "trailing", "args"], &[("CNI_IFNAME", "net9")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        e.log()[5][..4],
        ["DEL".to_string(), netns_id(&e.root, "ns3").1, "net9".into(), netns_id(&e.root, "ns3").0]
    );
}

#[test]
fn gc_with_and_without_keep() {
    let e = Env::new("gc");
    e.conf("10-demo.conflist", NET);
    for ns in ["a", "b", "c"] {
        assert!(e.run(&["add", "demo", ns], &[]).status.success());
    }
    let (_, keep_cid) = netns_id(&e.root, "a");
    let out = e.run(&["gc", "demo", &format!("--keep={keep_cid}:eth0")], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(e.cache_files(), [format!("demo-{keep_cid}-eth0")]);
    let gc: Value = serde_json::from_str(&e.log().last().unwrap()[5]).unwrap();
    assert_eq!(gc["cni.dev/valid-attachments"], json!([{"containerID": keep_cid, "ifname": "eth0"}]));
    let out = e.run(&["gc", "demo"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(e.cache_files().is_empty());
    let gc: Value = serde_json::from_str(&e.log().last().unwrap()[5]).unwrap();
    assert!(gc.get("cni.dev/valid-attachments").is_none());
    assert!(e.run(&["status", "demo"], &[]).status.success());
}

#[test]
fn errors_say_what_to_fix() {
    let e = Env::new("errors");
    e.conf("10-demo.conflist", NET);
    e.conf("00-broken.conflist", "{\"name\": \"broken\",");
    let out = e.run(&["add", "nosuch", "ns1"], &[]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no net configuration with name \"nosuch\""), "{stderr}");
    assert!(stderr.contains("00-broken.conflist") && stderr.contains("cnitool list"), "{stderr}");

    // A broken file for another network does not stop this one.
    assert!(e.run(&["add", "demo", "ns1"], &[]).status.success());

    let out = e.run(&["add", "nosuch", "ns1", "--json"], &[]);
    let err: Value = serde_json::from_str(text(&out.stdout).trim()).unwrap();
    assert_eq!(err["code"], 7);
    assert!(err["msg"].as_str().unwrap().contains("nosuch"));

    let out = e.run(&["add", "demo", "ns1"], &[("CNI_ARGS", "A=1;")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("trailing"), "{}", text(&out.stderr));
    let out = e.run(&["add", "demo", "ns1"], &[("CAP_ARGS", "[]")]);
    assert!(text(&out.stderr).contains("CAP_ARGS"));
    let out = e.run(&["add", "demo", "ns1"], &[("CNI_PATH", "")]);
    assert!(text(&out.stderr).contains("set CNI_PATH"), "{}", text(&out.stderr));
    let out = e.run(&["add", "demo"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("usage: cnitool"));
    let out = e.run(&["frobnicate", "demo", "ns"], &[]);
    assert_eq!(out.status.code(), Some(1));
    e.conf("20-missing.conflist", r#"{"cniVersion":"1.0.0","name":"missing","plugins":[{"type":"absent"}]}"#);
    let out = e.run(&["add", "missing", "ns1"], &[]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("failed to find plugin \"absent\"") && stderr.contains("hint: install the plugin"),
        "{stderr}"
    );
}

#[test]
fn list_shows_networks_plugins_and_broken_files() {
    let e = Env::new("list");
    e.conf("10-demo.conflist", NET);
    e.conf("00-broken.conflist", "{\"name\": \"broken\",");
    e.conf("20-old.conf", r#"{"cniVersion":"0.3.1","name":"old","type":"logger"}"#);
    e.conf(
        "30-gone.conflist",
        r#"{"cniVersion":"1.0.0","name":"gone","plugins":[{"type":"absent","ipam":{"type":"no-such-ipam"}}]}"#,
    );
    let out = e.run(&["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("demo  cniVersion 1.1.0"), "{stdout}");
    assert!(stdout.contains("[0.4.0 1.0.0 1.1.0]"), "{stdout}");
    assert!(stdout.contains("does not support cniVersion \"0.3.1\""), "{stdout}");
    assert!(stdout.contains("failed to find plugin \"absent\""), "{stdout}");
    assert!(stdout.contains("        ipam no-such-ipam  ERROR: failed to find plugin \"no-such-ipam\""), "{stdout}");
    assert!(stdout.contains("files that failed to load:") && stdout.contains("00-broken.conflist"), "{stdout}");

    let out = e.run(&["list", "--json"], &[]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["networks"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["demo", "gone", "old"]);
    assert_eq!(v["failures"][0]["code"], 6);
    assert!(v["failures"][0]["file"].as_str().unwrap().ends_with("00-broken.conflist"));
    assert_eq!(v["networks"][0]["plugins"][0]["path"], e.root.join("bin/logger").display().to_string());
}

/// The undo hint of a failed ADD appears only when a plugin before the failing one ran.
#[test]
fn add_failure_hints_at_del_only_after_an_earlier_plugin_ran() {
    let e = Env::new("addfail");
    let failer = e.root.join("bin/failer");
    std::fs::write(
        &failer,
        "#!/bin/sh\ncat >/dev/null\necho '{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"busy\"}'\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&failer, std::fs::Permissions::from_mode(0o755)).unwrap();
    e.conf(
        "10-first.conflist",
        r#"{"cniVersion":"1.0.0","name":"first","plugins":[{"type":"failer"},{"type":"logger"}]}"#,
    );
    e.conf(
        "20-second.conflist",
        r#"{"cniVersion":"1.0.0","name":"second","plugins":[{"type":"logger"},{"type":"failer"}]}"#,
    );
    let out = e.run(&["add", "first", "ns1"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("plugin type=\"failer\" failed (add): busy"), "{stderr}");
    assert!(!stderr.contains("cnitool del"), "the first plugin failed, nothing ran before it: {stderr}");
    let out = e.run(&["add", "second", "ns1"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("hint: the plugins before the failing one ran") && stderr.contains("cnitool del"),
        "{stderr}"
    );
}

/// `--version` and `version` say what cnitool is; the README's usage block is `--help`'s.
#[test]
fn version_and_the_readme_agree_with_help() {
    let e = Env::new("version");
    for args in [&["--version"][..], &["version"]] {
        let out = e.run(args, &[]);
        assert!(out.status.success());
        let stdout = text(&out.stdout);
        assert!(stdout.starts_with(&format!("cnitool (cni-rs) v{}\n", env!("CARGO_PKG_VERSION"))), "{stdout}");
        assert!(stdout.contains("CNI protocol versions supported: 0.1.0, "), "{stdout}");
    }
    let help = text(&e.run(&["--help"], &[]).stdout);
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let start = help.find("commands:").unwrap();
    let end = help.find("environment:").unwrap();
    let block = help[start..end].trim_end();
    assert!(
        readme.contains(block),
        "README.md's cnitool section must show `cnitool --help`'s commands and options:\n{block}"
    );
}
