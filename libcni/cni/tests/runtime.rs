//! libcni's runtime API driven through real execs of the cni-noop plugin.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::bin_dir;
use cni_tests::noop::{rt, Fixture};
use libcni::cache;
use libcni::conf::Attachment;
use libcni::conflist::{self, NetworkConfigList};
use libcni::runtime::RuntimeConf;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

/// Upstream's test vectors, kept in the repository (tests/testdata/README.md says where they came
/// from).
fn testdata() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata")
}

fn result_with_iface(version: &str, iface: &str, ip: &str) -> Value {
    json!({"cniVersion": version, "interfaces":[{"name": iface}], "ips":[{"address": ip, "interface": 0}]})
}

#[test]
fn add_chains_prev_result_sets_env_and_caches() {
    let f = Fixture::new("add");
    let r1 = result_with_iface("1.0.0", "if1", "10.0.0.2/24");
    let r2 = result_with_iface("1.0.0", "if2", "10.0.0.3/24");
    let list = f.list(
        "chain",
        "1.0.0",
        vec![
            f.plugin("p1", json!({"reportResult": r1})),
            f.plugin("p2", json!({"reportResult": r2})),
            f.plugin("p3", json!({})),
        ],
    );
    let mut conf = rt("cid1", "eth0");
    conf.args = vec![("K8S_POD_NAME".into(), "web".into()), ("FOO".into(), "bar".into())];
    let result = f.config().add_network_list(&list, &conf).unwrap();
    assert_eq!(result.interfaces[0].name, "if2");
    assert_eq!(f.trace(), ["ADD:p1", "ADD:p2", "ADD:p3"]);
    let calls = f.calls();
    assert!(calls[0]["stdin"].get("prevResult").is_none());
    assert_eq!(calls[1]["stdin"]["prevResult"]["interfaces"][0]["name"], "if1");
    assert_eq!(calls[2]["stdin"]["prevResult"]["interfaces"][0]["name"], "if2");
    for c in &calls {
        assert_eq!(c["stdin"]["name"], "chain");
        assert_eq!(c["stdin"]["cniVersion"], "1.0.0");
        assert!(c["stdin"].get("runtimeConfig").is_none());
        let env = &c["env"];
        assert_eq!(env["CNI_COMMAND"], "ADD");
        assert_eq!(env["CNI_CONTAINERID"], "cid1");
        assert_eq!(env["CNI_NETNS"], "/var/run/netns/test");
        assert_eq!(env["CNI_IFNAME"], "eth0");
        assert_eq!(env["CNI_ARGS"], "K8S_POD_NAME=web;FOO=bar");
        assert_eq!(env["CNI_PATH"], f.bin.to_str().unwrap());
    }

    // The cache file: upstream's shape, 0600 in a 0700 directory.
    let path = f.cache_file("chain", "cid1", "eth0");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    let written: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(written["kind"], "cniCacheV1");
    assert_eq!(written["cniArgs"], json!([["K8S_POD_NAME", "web"], ["FOO", "bar"]]));
    assert_eq!(written["netns"], "/var/run/netns/test");
    assert_eq!(written["result"]["interfaces"][0]["name"], "if2");
    let entry = cache::read(&f.cache, "chain", "cid1", "eth0").unwrap().unwrap();
    assert_eq!(entry.config, list.bytes);
    let cached = f.config().get_cached_result(&list, &conf).unwrap().unwrap();
    assert_eq!(cached, result);
    let atts = f.config().get_cached_attachments("cid1").unwrap();
    assert_eq!((atts.len(), atts[0].ifname.as_str()), (1, "eth0"));
}

#[test]
fn written_cache_has_the_upstream_keys() {
    let f = Fixture::new("shape");
    let list = f.list(
        "shape",
        "1.0.0",
        vec![json!({"type":"noop","capabilities":{"portMappings":true},"debugFile": f.debug("s", json!({"reportResult": result_with_iface("1.0.0","eth0","10.1.0.2/24")}))})],
    );
    let mut conf = rt("0123456789abcdef", "eth0");
    conf.capability_args.insert("portMappings".into(), json!([{"containerPort":80,"hostPort":8080,"protocol":"tcp"}]));
    f.config().add_network_list(&list, &conf).unwrap();
    let ours: Value =
        serde_json::from_slice(&std::fs::read(f.cache_file("shape", "0123456789abcdef", "eth0")).unwrap()).unwrap();
    let gold_path = testdata().join("libcni-cache/goldnet-0123456789abcdef-eth0");
    let gold: Value = serde_json::from_slice(&std::fs::read(&gold_path).unwrap()).unwrap();
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<BTreeSet<_>>();
    let mut ours_keys = keys(&ours);
    // We also record the netns (newer upstream does too: it is what GC needs to DEL).
    assert!(ours_keys.remove("netns"));
    assert_eq!(ours_keys, keys(&gold));
    // And the key order is upstream's (compact, struct order).
    let text = std::fs::read_to_string(f.cache_file("shape", "0123456789abcdef", "eth0")).unwrap();
    let order = [
        "\"kind\"",
        "\"containerId\"",
        "\"config\"",
        "\"ifName\"",
        "\"networkName\"",
        "\"netns\"",
        "\"capabilityArgs\"",
        "\"result\"",
    ];
    let positions: Vec<usize> = order.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{text}");
    assert!(!text.contains('\n'));
}

#[test]
fn reads_the_upstream_cache_file_and_dels_with_it() {
    let gold_dir = testdata().join("libcni-cache");
    let gold_file = gold_dir.join("goldnet-0123456789abcdef-eth0");
    let gold_bytes =
        std::fs::read(&gold_file).unwrap_or_else(|e| panic!("test data {} missing ({e})", gold_file.display()));
    let conflist_bytes = std::fs::read(gold_dir.join("goldnet.conflist")).unwrap();
    let entry = cache::parse(&gold_bytes, ("goldnet", "0123456789abcdef", "eth0")).unwrap();
    assert!(!entry.legacy);
    assert_eq!(entry.container_id, "0123456789abcdef");
    assert_eq!((entry.ifname.as_str(), entry.network_name.as_str(), entry.netns.as_str()), ("eth0", "goldnet", ""));
    assert_eq!(entry.config, conflist_bytes);
    assert_eq!(entry.capability_args["portMappings"][0]["hostPort"], 8080);
    let result = libcni::CniResult::parse(entry.result.as_ref().unwrap(), "").unwrap();
    assert_eq!(result.ips[0].address.to_string(), "10.77.1.2/24");
    assert_eq!(result.interfaces[2].sandbox.as_deref(), Some("/var/run/netns/gold1"));

    // Put it where libcni looks, with the real plugin types backed by noop, and DEL through it.
    let f = Fixture::new("gold");
    for t in ["bridge", "portmap", "loopback"] {
        f.install(t);
    }
    std::fs::create_dir_all(f.cache.join("results")).unwrap();
    std::fs::copy(&gold_file, f.cache_file("goldnet", "0123456789abcdef", "eth0")).unwrap();
    let list = NetworkConfigList::from_bytes(&entry.config).unwrap();
    let attachments = f.config().get_cached_attachments("").unwrap();
    assert_eq!(attachments, vec![entry.clone()]);
    let mut conf = rt("0123456789abcdef", "eth0");
    let debug = f.debug("gold", json!({}));
    conf.args = vec![("DEBUG".into(), debug.to_str().unwrap().into())];
    assert_eq!(f.config().get_cached_result(&list, &conf).unwrap().unwrap(), result);
    f.config().del_network_list(&list, &conf).unwrap();
    let calls = f.calls();
    let types: Vec<&str> = calls.iter().map(|c| c["stdin"]["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["loopback", "portmap", "bridge"]);
    // The cached 1.0.0 result as libcni >= 1.2 sends it: its empty dns left out.
    let mut prev = entry.result.clone().unwrap();
    assert_eq!(prev.as_object_mut().unwrap().remove("dns"), Some(json!({})));
    for c in &calls {
        assert_eq!(c["command"], "DEL");
        assert_eq!(c["stdin"]["prevResult"], prev);
        assert_eq!(c["stdin"]["name"], "goldnet");
    }
    assert!(!f.cache_file("goldnet", "0123456789abcdef", "eth0").exists());
}

#[test]
fn capabilities_become_runtime_config() {
    let f = Fixture::new("caps");
    let mut with_caps = f.plugin("caps", json!({}));
    with_caps["capabilities"] = json!({"portMappings": true, "bandwidth": false, "ips": true, "mac": true});
    with_caps["runtimeConfig"] = json!({"stale": 1});
    let mut untouched = f.plugin("plain", json!({}));
    untouched["capabilities"] = json!({"dns": true});
    untouched["runtimeConfig"] = json!({"keep": true});
    let list = f.list("caps", "1.1.0", vec![with_caps, untouched]);
    let mut conf = rt("c", "eth0");
    conf.capability_args
        .insert("portMappings".into(), json!([{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}]));
    conf.capability_args.insert("bandwidth".into(), json!({"ingressRate": 1}));
    conf.capability_args.insert("ips".into(), json!(["10.0.0.9/24"]));
    f.config().add_network_list(&list, &conf).unwrap();
    let calls = f.calls();
    assert_eq!(
        calls[0]["stdin"]["runtimeConfig"],
        json!({"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}], "ips": ["10.0.0.9/24"]})
    );
    assert!(calls.iter().all(|c| c["stdin"].get("capabilities").is_none()), "capabilities reached a plugin");
    assert_eq!(calls[1]["stdin"]["runtimeConfig"], json!({"keep": true}));
    let union = f.config().validate_network_list(&list).unwrap();
    assert_eq!(union, ["dns", "ips", "mac", "portMappings"]);
}

#[test]
fn del_is_reversed_gets_cache_and_keeps_it_on_failure() {
    let f = Fixture::new("del");
    let r = result_with_iface("1.0.0", "eth0", "10.0.0.2/24");
    let fail_del = json!({"commands": {"DEL": {"reportError": "cannot", "reportErrorCode": 11}}});
    let list = f.list(
        "dnet",
        "1.0.0",
        vec![f.plugin("a", json!({"reportResult": r})), f.plugin("b", json!({})), f.plugin("c", json!({}))],
    );
    let conf = rt("c1", "eth0");
    f.config().add_network_list(&list, &conf).unwrap();
    f.clear_log();
    f.config().del_network_list(&list, &conf).unwrap();
    assert_eq!(f.trace(), ["DEL:c", "DEL:b", "DEL:a"]);
    for c in f.calls() {
        assert_eq!(c["stdin"]["prevResult"]["interfaces"][0]["name"], "eth0");
    }
    assert!(!f.cache_file("dnet", "c1", "eth0").exists());
    // DEL again: no cache, no prevResult, still fine.
    f.clear_log();
    f.config().del_network_list(&list, &conf).unwrap();
    assert!(f.calls().iter().all(|c| c["stdin"].get("prevResult").is_none()));

    // A failing DEL stops there (reverse order), keeps its code and keeps the cache.
    let failing = f.list(
        "dnet",
        "1.0.0",
        vec![f.plugin("a", json!({"reportResult": r})), f.plugin("bfail", fail_del), f.plugin("c", json!({}))],
    );
    f.config().add_network_list(&failing, &conf).unwrap();
    f.clear_log();
    let e = f.config().del_network_list(&failing, &conf).unwrap_err();
    assert_eq!(e.code, 11);
    assert_eq!(e.msg, "plugin type=\"noop\" failed (delete): cannot");
    assert_eq!(f.trace(), ["DEL:c", "DEL:bfail"]);
    assert!(f.cache_file("dnet", "c1", "eth0").exists());

    // A corrupt cache is removed and DEL runs without prevResult.
    std::fs::write(f.cache_file("dnet", "c1", "eth0"), b"{not json").unwrap();
    f.clear_log();
    f.config().del_network_list(&list, &conf).unwrap();
    assert!(f.calls().iter().all(|c| c["stdin"].get("prevResult").is_none()));
    assert!(!f.cache_file("dnet", "c1", "eth0").exists());

    // Below 0.4.0 DEL gets no prevResult even with a cache.
    let old = f.list(
        "dnet",
        "0.3.1",
        vec![f.plugin(
            "a",
            json!({"reportResult": {"cniVersion":"0.3.1","ips":[{"version":"4","address":"10.0.0.2/24"}]}}),
        )],
    );
    f.config().add_network_list(&old, &conf).unwrap();
    f.clear_log();
    f.config().del_network_list(&old, &conf).unwrap();
    assert!(f.calls()[0]["stdin"].get("prevResult").is_none());
}

#[test]
fn check_uses_cache_and_is_version_gated() {
    let f = Fixture::new("check");
    let r = result_with_iface("1.0.0", "eth0", "10.0.0.2/24");
    let list = f.list("cnet", "1.0.0", vec![f.plugin("a", json!({"reportResult": r})), f.plugin("b", json!({}))]);
    let conf = rt("c1", "eth0");
    f.config().add_network_list(&list, &conf).unwrap();
    f.clear_log();
    f.config().check_network_list(&list, &conf).unwrap();
    assert_eq!(f.trace(), ["CHECK:a", "CHECK:b"]);
    assert!(f.calls().iter().all(|c| c["stdin"]["prevResult"]["ips"][0]["address"] == "10.0.0.2/24"));

    let old = f.list("cnet", "0.3.1", vec![f.plugin("a", json!({}))]);
    f.clear_log();
    let e = f.config().check_network_list(&old, &conf).unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (1, "configuration version \"0.3.1\" does not support the CHECK command"));
    let mut disabled = list.clone();
    disabled.disable_check = true;
    f.config().check_network_list(&disabled, &conf).unwrap();
    assert!(f.calls().is_empty());

    let failing = f.list(
        "cnet",
        "1.0.0",
        vec![f.plugin("a", json!({"commands": {"CHECK": {"reportError": "drift", "reportErrorCode": 103}}}))],
    );
    assert_eq!(f.config().check_network_list(&failing, &conf).unwrap_err().code, 103);
}

#[test]
fn status_is_version_gated_and_keeps_codes() {
    let f = Fixture::new("status");
    let down = json!({"commands": {"STATUS": {"reportError": "no addresses left", "reportErrorCode": 50}}});
    let list =
        f.list("snet", "1.1.0", vec![f.plugin("a", json!({})), f.plugin("b", down.clone()), f.plugin("c", json!({}))]);
    let e = f.config().status_network_list(&list).unwrap_err();
    assert_eq!(e.code, 50);
    assert!(e.msg.ends_with("failed (status): no addresses left"), "{e}");
    assert_eq!(f.trace(), ["STATUS:a", "STATUS:b"]);
    let stdin = &f.calls()[0]["stdin"];
    assert_eq!((stdin["name"].as_str(), stdin["cniVersion"].as_str()), (Some("snet"), Some("1.1.0")));
    let env = &f.calls()[0]["env"];
    assert_eq!((env["CNI_CONTAINERID"].as_str(), env["CNI_IFNAME"].as_str()), (Some(""), Some("")));
    f.clear_log();
    let old = f.list("snet", "1.0.0", vec![f.plugin("b", down)]);
    f.config().status_network_list(&old).unwrap();
    assert!(f.calls().is_empty());
}

#[test]
fn gc_deletes_stale_attachments_and_keeps_valid_ones() {
    let f = Fixture::new("gc");
    let list = f.list("gnet", "1.1.0", vec![f.plugin("a", json!({})), f.plugin("b", json!({}))]);
    let other = f.list("othernet", "1.1.0", vec![f.plugin("o", json!({}))]);
    for (cid, ifname) in [("c1", "eth0"), ("c2", "eth0"), ("c3", "eth1")] {
        f.config().add_network_list(&list, &rt(cid, ifname)).unwrap();
    }
    f.config().add_network_list(&other, &rt("c2", "eth0")).unwrap();
    f.clear_log();
    let valid = [Attachment { container_id: "c1".into(), ifname: "eth0".into() }];
    f.config().gc_network_list(&list, Some(&valid)).unwrap();
    let calls = f.calls();
    let dels: Vec<String> = calls
        .iter()
        .filter(|c| c["command"] == "DEL")
        .map(|c| {
            format!(
                "{}/{}:{}",
                c["env"]["CNI_CONTAINERID"].as_str().unwrap(),
                c["env"]["CNI_IFNAME"].as_str().unwrap(),
                c["stdin"]["tag"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(dels, ["c2/eth0:b", "c2/eth0:a", "c3/eth1:b", "c3/eth1:a"]);
    let gcs: Vec<&Value> = calls.iter().filter(|c| c["command"] == "GC").collect();
    assert_eq!(gcs.len(), 2);
    for gc in &gcs {
        let expected = json!([{"containerID": "c1", "ifname": "eth0"}]);
        assert_eq!(gc["stdin"]["cni.dev/valid-attachments"], expected);
        assert_eq!(gc["stdin"]["cni.dev/attachments"], expected);
        assert_eq!(gc["stdin"]["name"], "gnet");
        assert!(gc["stdin"].get("prevResult").is_none());
    }
    assert!(f.cache_file("gnet", "c1", "eth0").exists());
    assert!(!f.cache_file("gnet", "c2", "eth0").exists());
    assert!(!f.cache_file("gnet", "c3", "eth1").exists());
    assert!(f.cache_file("othernet", "c2", "eth0").exists());

    // No valid list: everything of this network goes, and GC gets no attachment keys.
    f.clear_log();
    f.config().gc_network_list(&list, None).unwrap();
    assert!(!f.cache_file("gnet", "c1", "eth0").exists());
    assert!(f.cache_file("othernet", "c2", "eth0").exists());
    let gc = f.calls().into_iter().find(|c| c["command"] == "GC").unwrap();
    assert!(gc["stdin"].get("cni.dev/valid-attachments").is_none());

    // Before 1.1.0: stale attachments are still DELeted, but no GC is sent.
    let old = f.list("oldnet", "1.0.0", vec![f.plugin("x", json!({}))]);
    f.config().add_network_list(&old, &rt("c9", "eth0")).unwrap();
    f.clear_log();
    f.config().gc_network_list(&old, Some(&[])).unwrap();
    assert_eq!(f.trace(), ["DEL:x"]);
    // disableGC: nothing at all.
    let mut off = list.clone();
    off.disable_gc = true;
    f.config().add_network_list(&off, &rt("c1", "eth0")).unwrap();
    f.clear_log();
    f.config().gc_network_list(&off, None).unwrap();
    assert!(f.calls().is_empty());
}

/// What kill -9 of a runtime between creating and renaming a cache file leaves: GC removes it.
#[test]
fn gc_removes_temp_files_a_killed_writer_left() {
    let f = Fixture::new("gctmp");
    let list = f.list("gnet", "1.1.0", vec![f.plugin("a", json!({}))]);
    f.config().add_network_list(&list, &rt("c1", "eth0")).unwrap();
    let results = f.cache_file("gnet", "c1", "eth0").parent().unwrap().to_path_buf();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let left = results.join(format!(".tmp-gnet-c2-eth0-{dead}-0"));
    std::fs::write(&left, "").unwrap();
    let valid = [Attachment { container_id: "c1".into(), ifname: "eth0".into() }];
    f.config().gc_network_list(&list, Some(&valid)).unwrap();
    assert!(!left.exists(), "GC left {}", left.display());
    assert!(f.cache_file("gnet", "c1", "eth0").exists());
}

#[test]
fn gc_continues_past_errors_and_reports_all() {
    let f = Fixture::new("gcerr");
    let bad = json!({"commands": {"GC": {"reportError": "gc a broke", "reportErrorCode": 5}}});
    let bad_b = json!({"commands": {"GC": {"reportError": "gc b broke", "reportErrorCode": 7}}});
    let list = f.list("gnet", "1.1.0", vec![f.plugin("a", bad), f.plugin("b", bad_b), f.plugin("c", json!({}))]);
    let e = f.config().gc_network_list(&list, Some(&[])).unwrap_err();
    assert_eq!(e.code, 5);
    assert!(e.msg.contains("gc a broke") && e.msg.contains("gc b broke"), "{e}");
    assert_eq!(f.trace(), ["GC:a", "GC:b", "GC:c"]);
}

#[test]
fn plugin_error_code_passes_through_and_stops_add() {
    let f = Fixture::new("errcode");
    let list = f.list(
        "enet",
        "1.0.0",
        vec![
            f.plugin("a", json!({})),
            f.plugin(
                "b",
                json!({"reportError": "busy, try again", "reportErrorCode": 11, "reportErrorDetails": "lock held"}),
            ),
            f.plugin("c", json!({})),
        ],
    );
    let e = f.config().add_network_list(&list, &rt("c1", "eth0")).unwrap_err();
    assert_eq!(e.code, 11);
    assert_eq!(e.msg, "plugin type=\"noop\" failed (add): busy, try again");
    assert_eq!(e.details, "lock held");
    assert_eq!(f.trace(), ["ADD:a", "ADD:b"]);
    assert!(!f.cache_file("enet", "c1", "eth0").exists(), "a failed ADD is not cached");

    // A plugin with its own name is named, as upstream does.
    let mut named = f.plugin("n", json!({"reportError": "x", "reportErrorCode": 7}));
    named["name"] = json!("mine");
    let e = f.config().add_network_list(&f.list("enet", "1.0.0", vec![named]), &rt("c1", "eth0")).unwrap_err();
    assert_eq!(e.msg, "plugin type=\"noop\" name=\"mine\" failed (add): x");
}

#[test]
fn garbage_and_silent_failures_are_explained() {
    let f = Fixture::new("garbage");
    let conf = rt("c1", "eth0");
    let run = |extra: Value| {
        f.config().add_network_list(&f.list("gnet", "1.0.0", vec![f.plugin("g", extra)]), &conf).unwrap_err()
    };
    let e = run(json!({"reportStdout": "panic: runtime error", "exitWithCode": 2}));
    assert_eq!(e.code, libcni::code::PLUGIN_EXEC);
    assert!(e.msg.contains("netplugin noop failed but its error output is not JSON: \"panic: runtime error\""), "{e}");
    let e = run(json!({"reportStdout": "", "reportStderr": "segfault in module x", "exitWithCode": 139}));
    assert_eq!(e.code, libcni::code::PLUGIN_EXEC);
    assert!(e.msg.contains("segfault in module x") && e.msg.contains("exit status 139"), "{e}");
    let e = run(json!({"reportStdout": "", "exitWithCode": 3}));
    assert!(e.msg.contains("failed with no error message: exit status 3"), "{e}");
    let e = run(json!({"reportStdout": "all good!"}));
    assert_eq!(e.code, libcni::code::DECODE);
    assert!(e.msg.contains("plugin noop succeeded but its result is not JSON"), "{e}");
    let e = run(json!({"reportResult": {"cniVersion": "1.0.0", "ips": [{"address": "not-an-ip"}]}}));
    assert_eq!(e.code, libcni::code::DECODE);
    let e = run(json!({"reportResult": {"cniVersion": "7.7.7"}}));
    assert_eq!(e.code, libcni::code::INCOMPATIBLE_VERSION);
    let e =
        f.config().add_network_list(&f.list("gnet", "1.0.0", vec![json!({"type": "nonexistent"})]), &conf).unwrap_err();
    assert_eq!(e.code, 7);
    assert!(e.msg.contains(&format!("failed to find plugin \"nonexistent\" in path [{}]", f.bin.display())), "{e}");
}

#[test]
fn add_validates_names() {
    let f = Fixture::new("names");
    let list = f.list("vnet", "1.0.0", vec![f.plugin("a", json!({}))]);
    let code = |c: RuntimeConf| f.config().add_network_list(&list, &c).unwrap_err().code;
    assert_eq!(code(rt("", "eth0")), 3);
    assert_eq!(code(rt("../../etc", "eth0")), 4);
    assert_eq!(code(rt("c1", "")), 4);
    assert_eq!(code(rt("c1", "a-name-way-too-long")), 4);
    assert_eq!(code(rt("c1", "../x")), 4);
    assert!(f.calls().is_empty());
}

#[test]
fn timeout_kills_the_plugin() {
    let f = Fixture::new("timeout");
    let list = f.list("tnet", "1.0.0", vec![f.plugin("slow", json!({"sleepMs": 10_000}))]);
    let mut cfg = f.config();
    cfg.timeout = Some(Duration::from_millis(300));
    let start = Instant::now();
    let e = cfg.add_network_list(&list, &rt("c1", "eth0")).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert_eq!(e.code, libcni::code::PLUGIN_EXEC);
    assert!(e.msg.contains("plugin noop timed out after 0.3s"), "{e}");
}

#[test]
fn validate_checks_every_plugin_version() {
    let f = Fixture::new("validate");
    let old = f.install("oldplugin");
    let mut debug = old.clone().into_os_string();
    debug.push(".debug");
    std::fs::write(&debug, json!({"reportVersionSupport": ["0.3.0", "0.3.1"]}).to_string()).unwrap();
    let list = f.list(
        "vnet",
        "1.0.0",
        vec![json!({"type": "noop"}), json!({"type": "oldplugin", "capabilities": {"ips": true}})],
    );
    let e = f.config().validate_network_list(&list).unwrap_err();
    assert_eq!(e.code, 1);
    assert!(e.msg.contains("oldplugin does not support config version \"1.0.0\""), "{e}");
    let ok = f.list(
        "vnet",
        "0.3.1",
        vec![json!({"type": "noop"}), json!({"type": "oldplugin", "capabilities": {"ips": true}})],
    );
    assert_eq!(f.config().validate_network_list(&ok).unwrap(), ["ips"]);
    let info = f.config().get_version_info("oldplugin").unwrap();
    assert_eq!(info.cni_version, "1.1.0");
    let missing = f.list("vnet", "0.3.1", vec![json!({"type": "gone"})]);
    assert_eq!(f.config().validate_network_list(&missing).unwrap_err().code, 7);
}

#[test]
fn conflist_directory_loading() {
    let f = Fixture::new("confdir");
    let d = &f.conf;
    let empty = f.root.join("empty");
    let e = conflist::load_network(&empty, "x").unwrap_err();
    assert_eq!((e.code, e.msg.clone()), (7, format!("no net configurations found in {}", empty.display())));
    std::fs::write(d.join("00-broken.conflist"), b"{\"name\": \"broken\", \"plugins\": [").unwrap();
    std::fs::write(
        d.join("10-good.conflist"),
        json!({"cniVersion":"1.0.0","name":"good","plugins":[{"type":"noop"}]}).to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("20-dup.conflist"),
        json!({"cniVersion":"1.0.0","name":"good","plugins":[{"type":"other"}]}).to_string(),
    )
    .unwrap();
    std::fs::write(
        d.join("30-single.conf"),
        json!({"cniVersion":"0.4.0","name":"single","type":"noop","k":"v"}).to_string(),
    )
    .unwrap();
    std::fs::write(d.join("40-good.json"), json!({"cniVersion":"0.4.0","name":"good","type":"json"}).to_string())
        .unwrap();
    std::fs::write(d.join("README.md"), b"not a config").unwrap();
    std::fs::create_dir_all(d.join("good")).unwrap();
    std::fs::write(d.join("good/tuning.conf"), json!({"type":"tuning","sysctl":{}}).to_string()).unwrap();
    std::fs::write(d.join("good/ignored.json"), json!({"type":"ignored"}).to_string()).unwrap();

    let good = conflist::load_network(d, "good").unwrap();
    let types: Vec<&str> = good.plugins.iter().map(|p| p.plugin_type.as_str()).collect();
    assert_eq!(types, ["noop", "tuning"]);
    let bytes: Value = serde_json::from_slice(&good.bytes).unwrap();
    assert_eq!(bytes["plugins"][1]["type"], "tuning");
    let single = conflist::load_network(d, "single").unwrap();
    assert_eq!((single.cni_version.as_str(), single.plugins[0].raw["k"].as_str()), ("0.4.0", Some("v")));
    let e = conflist::load_network(d, "nope").unwrap_err();
    assert_eq!(e.code, 7);
    assert!(e.msg.starts_with(&format!("no net configuration with name \"nope\" in {}", d.display())), "{e}");
    assert!(e.msg.contains("00-broken.conflist"), "{e}");
    let scan = conflist::scan_dir(d).unwrap();
    assert_eq!(scan.networks.iter().map(|n| n.list.name.as_str()).collect::<Vec<_>>(), ["good", "single"]);
    assert_eq!(scan.failures.len(), 1);
    assert_eq!(scan.shadowed.len(), 2);

    // Inlined-only lists skip the directory.
    std::fs::write(
        d.join("10-good.conflist"),
        json!({"cniVersion":"1.0.0","name":"good","loadOnlyInlinedPlugins":"True","plugins":[{"type":"noop"}]})
            .to_string(),
    )
    .unwrap();
    assert_eq!(conflist::load_network(d, "good").unwrap().plugins.len(), 1);
    // Plugins only from the directory.
    std::fs::write(d.join("10-good.conflist"), json!({"cniVersion":"1.0.0","name":"good"}).to_string()).unwrap();
    assert_eq!(conflist::load_network(d, "good").unwrap().plugins[0].plugin_type, "tuning");
    std::fs::write(d.join("50-nothing.conflist"), json!({"cniVersion":"1.0.0","name":"nothing"}).to_string()).unwrap();
    assert!(conflist::load_network(d, "nothing").unwrap_err().msg.contains("no plugin configs found"));
}

#[test]
fn delegation_passes_env_and_stdin_through() {
    use libcni::invoke;
    let f = Fixture::new("delegate");
    let stdin = json!({
        "cniVersion": "0.4.0", "name": "dnet", "type": "bridge", "tag": "ipam",
        "ipam": {"type": "noop"}, "debugFile": f.debug("ipam", json!({"reportResult": {"ips": [{"version": "4", "address": "10.5.0.2/16"}]}}))
    })
    .to_string();
    let (conf, raw) = libcni::conf::parse_netconf(stdin.as_bytes()).unwrap();
    let req = libcni::Request {
        command: libcni::Command::Add,
        container_id: "ctr".into(),
        netns: Some("/run/netns/x".into()),
        ifname: "eth0".into(),
        args: libcni::args::CniArgs::parse("IgnoreUnknown=1;A=b").unwrap(),
        netns_override: false,
        cni_path: vec![f.root.join("nowhere"), f.bin.clone()],
        conf,
        raw,
        stdin: stdin.clone().into_bytes(),
    };
    // A result without cniVersion takes the config's (upstream #895).
    let result = invoke::delegate_add("noop", &req).unwrap();
    assert_eq!(result.cni_version, "0.4.0");
    assert_eq!(result.ips[0].address.to_string(), "10.5.0.2/16");
    invoke::delegate_check("noop", &req).unwrap();
    invoke::delegate_del("noop", &req).unwrap();
    invoke::delegate_status("noop", &req).unwrap();
    invoke::delegate_gc("noop", &req).unwrap();
    let calls = f.calls();
    let commands: Vec<&str> = calls.iter().map(|c| c["command"].as_str().unwrap()).collect();
    assert_eq!(commands, ["ADD", "CHECK", "DEL", "STATUS", "GC"]);
    for c in &calls {
        assert_eq!(c["stdin"], serde_json::from_str::<Value>(&stdin).unwrap());
        assert_eq!(c["env"]["CNI_CONTAINERID"], "ctr");
        assert_eq!(c["env"]["CNI_NETNS"], "/run/netns/x");
        assert_eq!(c["env"]["CNI_ARGS"], "IgnoreUnknown=1;A=b");
        assert_eq!(c["env"]["CNI_PATH"], format!("{}:{}", f.root.join("nowhere").display(), f.bin.display()));
    }
    let failing = f.debug("ipam", json!({"reportError": "pool exhausted", "reportErrorCode": 101}));
    assert!(failing.exists());
    let e = invoke::delegate_add("noop", &req).unwrap_err();
    assert_eq!((e.code, e.msg.as_str()), (101, "pool exhausted"));
    assert_eq!(invoke::delegate_add("../noop", &req).unwrap_err().code, 7);
    assert_eq!(invoke::delegate_del("absent", &req).unwrap_err().code, 7);
}

/// The spec: `capabilities` is the runtime's; a plugin never gets it, on any verb (only the
/// `runtimeConfig` built from it). Any spelling Go would match is removed.
#[test]
fn plugins_never_see_capabilities() {
    let f = Fixture::new("nocaps");
    let mut a = f.plugin("a", json!({"reportResult": result_with_iface("1.1.0", "eth0", "10.0.0.2/24")}));
    a["capabilities"] = json!({"portMappings": true});
    let mut b = f.plugin("b", json!({}));
    b["Capabilities"] = json!({"ips": true});
    let list = f.list("nocaps", "1.1.0", vec![a, b]);
    let mut conf = rt("c1", "eth0");
    conf.capability_args.insert("portMappings".into(), json!([{"hostPort": 80, "containerPort": 8080}]));
    conf.capability_args.insert("ips".into(), json!(["10.0.0.2/24"]));
    let cni = f.config();
    cni.add_network_list(&list, &conf).unwrap();
    cni.check_network_list(&list, &conf).unwrap();
    cni.status_network_list(&list).unwrap();
    cni.gc_network_list(&list, Some(&[Attachment { container_id: "c1".into(), ifname: "eth0".into() }])).unwrap();
    cni.del_network_list(&list, &conf).unwrap();
    let calls = f.calls();
    assert_eq!(calls.len(), 10, "{:?}", f.trace());
    for c in &calls {
        let stdin = c["stdin"].as_object().unwrap();
        assert!(!stdin.keys().any(|k| k.eq_ignore_ascii_case("capabilities")), "{}: {}", c["command"], c["stdin"]);
    }
    assert_eq!(calls[0]["stdin"]["runtimeConfig"]["portMappings"][0]["hostPort"], 80);
    assert_eq!(calls[1]["stdin"]["runtimeConfig"]["ips"][0], "10.0.0.2/24");
    // The cache keeps the list as written, capabilities included (it is the runtime's record).
    let single = json!({"cniVersion": "1.1.0", "name": "one", "type": "noop", "debugFile": f.debug("one", json!({})),
                        "capabilities": {"mac": true}});
    let single = conflist::conf_from_bytes(single.to_string().as_bytes()).unwrap();
    f.clear_log();
    cni.add_network(&single, &rt("c2", "eth0")).unwrap();
    assert!(f.calls()[0]["stdin"].get("capabilities").is_none());
    let (cached, _) = cni.get_network_cached_config(&single, &rt("c2", "eth0")).unwrap().unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&cached).unwrap()["capabilities"]["mac"], true);
}

/// CHECK of an attachment without a cached result is refused (code 3) before any plugin runs: the
/// spec forbids CHECK before ADD or after DEL, and a plugin cannot check without `prevResult`
/// (upstream libcni would run the plugins without it).
#[test]
fn check_without_a_cached_result_is_refused() {
    let f = Fixture::new("nocache");
    let r = result_with_iface("1.0.0", "eth0", "10.0.0.2/24");
    let list = f.list("ncnet", "1.0.0", vec![f.plugin("a", json!({"reportResult": r})), f.plugin("b", json!({}))]);
    let conf = rt("c1", "eth0");
    let cni = f.config();
    let e = cni.check_network_list(&list, &conf).unwrap_err();
    assert_eq!(e.code, libcni::code::UNKNOWN_CONTAINER, "{e}");
    assert!(e.msg.contains("no cached result") && e.msg.contains("\"c1\"") && e.msg.contains("ncnet"), "{e}");
    assert!(f.calls().is_empty(), "a plugin ran: {:?}", f.trace());

    cni.add_network_list(&list, &conf).unwrap();
    cni.check_network_list(&list, &conf).unwrap();
    cni.del_network_list(&list, &conf).unwrap();
    f.clear_log();
    assert_eq!(cni.check_network_list(&list, &conf).unwrap_err().code, libcni::code::UNKNOWN_CONTAINER);
    assert!(f.calls().is_empty(), "a plugin ran after DEL: {:?}", f.trace());

    // A cache entry without a result (possible in upstream's format) is no result either.
    let entry = cache::CacheEntry {
        container_id: "c1".into(),
        config: list.bytes.clone(),
        ifname: "eth0".into(),
        network_name: "ncnet".into(),
        ..Default::default()
    };
    cache::write(&f.cache, &entry).unwrap();
    assert_eq!(cni.check_network_list(&list, &conf).unwrap_err().code, libcni::code::UNKNOWN_CONTAINER);
    // The single-plugin CHECK too.
    let single = conflist::conf_from_bytes(br#"{"cniVersion":"1.0.0","name":"ncone","type":"noop"}"#).unwrap();
    assert_eq!(cni.check_network(&single, &conf).unwrap_err().code, libcni::code::UNKNOWN_CONTAINER);
    assert!(f.calls().is_empty(), "a plugin ran: {:?}", f.trace());
}

/// The single-plugin calls, conf loading and injection, and typed not-found errors, as Go's libcni.
#[test]
fn single_plugin_api_as_upstream() {
    use libcni::conflist::{LoadError, NoConfigsFoundError, NotFoundError};
    let f = Fixture::new("single");
    let r = result_with_iface("1.0.0", "eth0", "10.0.0.7/24");
    let debug = f.debug("one", json!({"reportResult": r}));
    let bytes =
        json!({"cniVersion": "1.0.0", "name": "one", "type": "noop", "tag": "one", "debugFile": debug}).to_string();
    let file = f.conf.join("10-one.conf");
    std::fs::write(&file, &bytes).unwrap();

    // ConfFromBytes / ConfFromFile.
    let net = conflist::conf_from_bytes(bytes.as_bytes()).unwrap();
    assert_eq!(
        (net.name.as_str(), net.cni_version.as_str(), net.plugin.plugin_type.as_str()),
        ("one", "1.0.0", "noop")
    );
    assert_eq!(net.bytes, bytes.as_bytes());
    assert_eq!(conflist::conf_from_file(&file).unwrap(), net);
    assert_eq!(conflist::conf_from_bytes(br#"{"name":"x"}"#).unwrap_err().code, 7, "no type");
    assert_eq!(conflist::conf_from_bytes(b"{").unwrap_err().code, 6);
    assert_eq!(conflist::conf_from_file(&f.conf.join("absent.conf")).unwrap_err().code, 5);

    // InjectConf: keys set over the conf; empty keys and null values refused.
    let mut values = serde_json::Map::new();
    values.insert("tag".into(), json!("injected"));
    values.insert("extra".into(), json!({"k": [1]}));
    let injected = conflist::inject_conf(&net, &values).unwrap();
    let v: Value = serde_json::from_slice(&injected.bytes).unwrap();
    assert_eq!(
        (v["tag"].clone(), v["extra"]["k"][0].clone(), v["name"].clone()),
        (json!("injected"), json!(1), json!("one"))
    );
    assert_eq!(injected.plugin.raw["tag"], "injected");
    for (k, bad) in [("", json!(1)), ("x", Value::Null)] {
        let mut m = serde_json::Map::new();
        m.insert(k.into(), bad);
        assert_eq!(conflist::inject_conf(&net, &m).unwrap_err().code, 7, "{k:?}");
    }

    // AddNetwork / GetNetworkCachedResult / GetNetworkCachedConfig / CheckNetwork / DelNetwork.
    let cni = f.config();
    let mut conf = rt("c1", "eth0");
    conf.args = vec![("K".into(), "V".into())];
    conf.capability_args.insert("mac".into(), json!("0a:58:00:00:00:01"));
    let result = cni.add_network(&net, &conf).unwrap();
    assert_eq!(result.ips[0].address.to_string(), "10.0.0.7/24");
    assert!(f.calls()[0]["stdin"].get("prevResult").is_none());
    assert!(f.cache_file("one", "c1", "eth0").exists());
    let cached = cni.get_network_cached_result(&net, &conf).unwrap().unwrap();
    assert_eq!(cached.ips[0].address.to_string(), "10.0.0.7/24");
    let (cached_bytes, cached_rt) = cni.get_network_cached_config(&net, &rt("c1", "eth0")).unwrap().unwrap();
    assert_eq!(cached_bytes, bytes.as_bytes());
    assert_eq!(cached_rt.args, conf.args);
    assert_eq!(cached_rt.capability_args, conf.capability_args);
    assert!(cni.get_network_cached_config(&net, &rt("c9", "eth0")).unwrap().is_none());
    f.clear_log();
    cni.check_network(&net, &conf).unwrap();
    assert_eq!(f.calls()[0]["stdin"]["prevResult"]["ips"][0]["address"], "10.0.0.7/24");
    assert_eq!(f.calls()[0]["command"], "CHECK");
    cni.del_network(&net, &conf).unwrap();
    assert_eq!(f.calls()[1]["command"], "DEL");
    assert_eq!(f.calls()[1]["stdin"]["prevResult"]["ips"][0]["address"], "10.0.0.7/24");
    assert!(!f.cache_file("one", "c1", "eth0").exists());
    assert!(cni.get_network_cached_result(&net, &conf).unwrap().is_none());
    assert_eq!(cni.validate_network(&net).unwrap(), Vec::<String>::new());
    let old = conflist::conf_from_bytes(br#"{"cniVersion":"0.3.1","name":"one","type":"noop"}"#).unwrap();
    assert_eq!(cni.check_network(&old, &conf).unwrap_err().code, 1);
    assert!(cni.add_network(&conflist::conf_from_bytes(br#"{"type":"noop"}"#).unwrap(), &conf).is_err(), "no name");

    // ConfListFromBytes / ConfListFromFile (with <dir>/<name>/*.conf appended).
    let list_bytes = json!({"cniVersion": "1.0.0", "name": "lst", "plugins": [{"type": "noop"}]}).to_string();
    assert_eq!(conflist::conf_list_from_bytes(list_bytes.as_bytes()).unwrap().plugins.len(), 1);
    let list_file = f.conf.join("20-lst.conflist");
    std::fs::write(&list_file, &list_bytes).unwrap();
    std::fs::create_dir_all(f.conf.join("lst")).unwrap();
    std::fs::write(f.conf.join("lst/extra.conf"), br#"{"type":"tuning"}"#).unwrap();
    let list = conflist::conf_list_from_file(&list_file).unwrap();
    assert_eq!(list.plugins.iter().map(|p| p.plugin_type.as_str()).collect::<Vec<_>>(), ["noop", "tuning"]);

    // Typed not-found errors a caller can match on.
    match conflist::load_network_conf(&f.conf, "nope") {
        Err(LoadError::NotFound(NotFoundError { dir, name, .. })) => {
            assert_eq!((dir, name.as_str()), (f.conf.clone(), "nope"))
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let empty = f.root.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    for missing in [empty.clone(), f.root.join("absent")] {
        match conflist::load_network_conf(&missing, "x") {
            Err(LoadError::NoConfigsFound(NoConfigsFoundError { dir })) => assert_eq!(dir, missing),
            other => panic!("expected NoConfigsFound, got {other:?}"),
        }
        assert!(matches!(conflist::load_conf(&missing, "x"), Err(LoadError::NoConfigsFound(_))));
    }
    let e = libcni::Error::from(conflist::load_network_conf(&f.conf, "nope").unwrap_err());
    assert_eq!(
        (e.code, e.msg.clone()),
        (7, format!("no net configuration with name \"nope\" in {}", f.conf.display()))
    );
    assert_eq!(conflist::load_conf(&f.conf, "one").unwrap(), net);
    assert!(matches!(conflist::load_conf(&f.conf, "lst"), Err(LoadError::NotFound(_))));
    assert_eq!(conflist::load_network_conf(&f.conf, "one").unwrap().plugins[0].plugin_type, "noop");
}

/// A delegate that fails writes its diagnostics to stderr; they reach the delegating plugin's stderr
/// (what the runtime logs), not only its error JSON. bridge's STATUS delegates to its IPAM first.
#[test]
fn failing_delegate_stderr_reaches_ours() {
    let f = Fixture::new("stderr");
    let ipam = f.bin.join("chatty-ipam");
    std::fs::write(
        &ipam,
        "#!/bin/sh\ncat >/dev/null\necho \"chatty-ipam: the lease database is locked by pid 4242\" >&2\n\
         echo '{\"cniVersion\":\"1.1.0\",\"code\":11,\"msg\":\"try again\"}'\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&ipam, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bridge = bin_dir().join("bridge");
    let stdin = json!({"cniVersion": "1.1.0", "name": "n", "type": "bridge", "bridge": "cnistderr0",
                       "ipam": {"type": "chatty-ipam"}});
    let mut child = std::process::Command::new(&bridge)
        .env("CNI_COMMAND", "STATUS")
        .env("CNI_PATH", &f.bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e} (cargo build --bins first)", bridge.display()));
    use std::io::Write;
    child.stdin.take().unwrap().write_all(stdin.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((out.status.code(), stdout["code"].clone()), (Some(1), json!(11)), "{stdout}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("chatty-ipam: the lease database is locked by pid 4242"), "stderr: {stderr:?}");
}

/// Run a plugin binary (as `argv0`) with `env` and `stdin`: exit code, stdout as JSON (null if
/// empty), stderr.
fn run_plugin(
    bin: &std::path::Path,
    argv0: &str,
    env: &[(&str, String)],
    stdin: &Value,
) -> (Option<i32>, Value, String) {
    use std::io::Write;
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(bin);
    cmd.arg0(argv0)
        .env_remove(libcni::invoke::DELEGATION_DEPTH_ENV)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("run {}: {e} (cargo build --bins first)", bin.display()));
    child.stdin.take().unwrap().write_all(stdin.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = if out.stdout.is_empty() { Value::Null } else { serde_json::from_slice(&out.stdout).unwrap() };
    (out.status.code(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A wrapper delegate that logs each run, then runs `bin` as `argv0`; past 20 runs it answers an
/// error instead, so a cycle that is not cut cannot run away.
fn logging_wrapper(dir: &std::path::Path, name: &str, bin: &std::path::Path, argv0: &str, log: &std::path::Path) {
    let script = format!(
        "#!/bin/bash\necho \"$CNI_COMMAND ${{CNI_RS_DELEGATION_DEPTH:-unset}}\" >> {log}\n\
         if [ \"$(wc -l < {log})\" -gt 20 ]; then echo '{{\"code\":99,\"msg\":\"runaway\"}}'; exit 1; fi\n\
         exec -a {argv0} {bin}\n",
        log = log.display(),
        bin = bin.display()
    );
    let p = dir.join(name);
    std::fs::write(&p, script).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn log_lines(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log).unwrap_or_default().lines().map(str::to_string).collect()
}

/// `"ipam": {"type": "bridge"}` (or any main plugin) is refused with code 7 before anything runs, by
/// the separate binaries and by the multi-call binary (which runs delegates in process, where a
/// cycle would recurse until the stack overflows); a cycle through a name we cannot know (a copy of bridge under another name) stops at
/// the delegation depth bound. DEL of such an attachment succeeds: nothing was ever held there.
#[test]
fn ipam_type_cycles_are_cut() {
    let f = Fixture::new("cycle");
    let target = bin_dir();
    let bridge = target.join("bridge");
    let multi = target.join("cni-rs");
    let conf = |ipam: &str| {
        json!({"cniVersion": "1.1.0", "name": "cyc", "type": "bridge", "bridge": "cnicyc0",
                                   "ipam": {"type": ipam}})
    };
    let env = |path: &std::path::Path, command: &str| {
        vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", "cyc1".to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", path.display().to_string()),
        ]
    };

    // Separate binaries: the bridge on CNI_PATH (and a copy named mybr) are logging wrappers.
    let log = f.root.join("runs.log");
    logging_wrapper(&f.bin, "bridge", &bridge, "bridge", &log);
    logging_wrapper(&f.bin, "mybr", &bridge, "bridge", &log);
    // A multi-call install: cni-rs hard-linked as bridge and host-local (delegates to either run in
    // process), and mybr, a wrapper that runs cni-rs as bridge.
    let multi_dir = target.join(cni_tests_unique("cycle-multi"));
    std::fs::create_dir_all(&multi_dir).unwrap();
    for name in ["bridge", "host-local"] {
        std::fs::hard_link(&multi, multi_dir.join(name)).unwrap();
    }
    let multi_log = f.root.join("multi-runs.log");
    logging_wrapper(&multi_dir, "mybr", &multi, "bridge", &multi_log);

    for (what, bin, path) in [("separate", &bridge, &f.bin), ("multi-call", &multi, &multi_dir)] {
        for verb in ["STATUS", "CHECK", "ADD"] {
            let mut stdin = conf("bridge");
            if verb == "CHECK" {
                stdin["prevResult"] = result_with_iface("1.1.0", "eth0", "10.0.0.2/24");
            }
            let mut e = env(path, verb);
            e.push(("CNI_NETNS", "/proc/self/ns/net".to_string()));
            let (code, out, stderr) = run_plugin(bin, "bridge", &e, &stdin);
            let msg = out["msg"].as_str().unwrap_or_default().to_string();
            if verb == "STATUS" {
                assert_eq!((code, out["code"].clone()), (Some(1), json!(7)), "{what} {verb}: {out} {stderr}");
                assert!(
                    msg.contains("ipam type \"bridge\" is not an IPAM plugin") && msg.contains("host-local"),
                    "{msg}"
                );
            } else {
                // ADD and CHECK may stop earlier (the netns is the plugin's own): never run the delegate.
                assert_eq!(code, Some(1), "{what} {verb}: {out} {stderr}");
                assert_ne!(out["code"], json!(110), "{what} {verb}: {out}");
            }
        }
        let (code, out, stderr) = run_plugin(bin, "bridge", &env(path, "DEL"), &conf("bridge"));
        assert_eq!(code, Some(0), "{what} DEL: {out} {stderr}");

        // A cycle through a name we cannot know: cut at the depth bound.
        let (code, out, stderr) = run_plugin(bin, "bridge", &env(path, "STATUS"), &conf("mybr"));
        assert_eq!((code, out["code"].clone()), (Some(1), json!(7)), "{what}: {out} {stderr}");
        assert!(out["msg"].as_str().unwrap().contains("would nest delegations 5 deep (at most 4)"), "{out}");
        let (code, out, stderr) = run_plugin(bin, "bridge", &env(path, "DEL"), &conf("mybr"));
        assert_eq!(code, Some(0), "{what} cyclic DEL: {out} {stderr}");
    }
    // Nothing ran the "bridge" wrapper; each cut cycle ran mybr 4 times (depths 1-4), for STATUS and DEL.
    let expected: Vec<String> =
        ["STATUS", "DEL"].iter().flat_map(|v| (1..=4).map(move |d| format!("{v} {d}"))).collect();
    assert_eq!(log_lines(&log), expected);
    assert_eq!(log_lines(&multi_log), expected);
    let _ = std::fs::remove_dir_all(&multi_dir);
}

fn cni_tests_unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    )
}
