//! host-local's hostile-input table: its rows and the test that runs them, against the debug build in
//! `ipam/host-local/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{
    case, check_error, common_cases, env_case, exec, run_table, with, with_value, without, Case, Fixture, CONFIG, ENV,
    IO,
};
use crate::{unique, TempDir};
use serde_json::json;
use serde_json::Value;
use std::path::Path;

/// The rows of host-local's own keys, run after the rows every plugin gets.
pub fn rows(f: &Fixture) -> Vec<Case> {
    let b = f.base("host-local");
    let dd = f.data_dir();
    let ipam = |extra: Value| {
        let mut i = json!({ "type": "host-local", "dataDir": dd });
        for (k, v) in extra.as_object().expect("object") {
            i[k] = v.clone();
        }
        with(&b, "ipam", i)
    };
    let file_parent = f.scratch.path().join("data").join("a-file");
    std::fs::write(&file_parent, "").expect("write file");
    vec![
        case("no ipam", without(&b, "ipam"), CONFIG),
        case("ipam without ranges", ipam(json!({})), CONFIG),
        case("subnet a number", ipam(json!({ "subnet": 5 })), CONFIG),
        case("subnet not a CIDR", ipam(json!({ "subnet": "banana" })), CONFIG),
        case("subnet a bare address", ipam(json!({ "subnet": "10.210.1.0" })), CONFIG),
        case("subnet prefix 33", ipam(json!({ "subnet": "10.210.1.0/33" })), CONFIG),
        case("subnet prefix -1", ipam(json!({ "subnet": "10.210.1.0/-1" })), CONFIG),
        case("subnet /32", ipam(json!({ "subnet": "10.210.1.7/32" })), CONFIG),
        case("subnet /31", ipam(json!({ "subnet": "10.210.1.6/31" })), CONFIG),
        case("subnet /128", ipam(json!({ "ranges": [[{ "subnet": "fd00:210::1/128" }]] })), CONFIG),
        case("subnet /127", ipam(json!({ "ranges": [[{ "subnet": "fd00:210::/127" }]] })), CONFIG),
        case("subnet with host bits", ipam(json!({ "subnet": "10.210.1.5/24" })), CONFIG),
        case(
            "rangeStart outside the subnet",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "10.210.2.10" }]] })),
            CONFIG,
        ),
        case(
            "rangeEnd outside the subnet",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeEnd": "10.210.9.10" }]] })),
            CONFIG,
        ),
        case(
            "rangeStart after rangeEnd",
            ipam(
                json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "10.210.1.90", "rangeEnd": "10.210.1.10" }]] }),
            ),
            CONFIG,
        ),
        case(
            "rangeStart of the other family",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": "fd00::5" }]] })),
            CONFIG,
        ),
        case(
            "rangeStart a number",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "rangeStart": 5 }]] })),
            CONFIG,
        ),
        case(
            "gateway not an IP",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24", "gateway": "gw" }]] })),
            CONFIG,
        ),
        case(
            "overlapping ranges in a set",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }, { "subnet": "10.210.1.128/25" }]] })),
            CONFIG,
        ),
        case(
            "overlapping range sets",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }], [{ "subnet": "10.210.0.0/16" }]] })),
            CONFIG,
        ),
        case(
            "mixed families in a set",
            ipam(json!({ "ranges": [[{ "subnet": "10.210.1.0/24" }, { "subnet": "fd00:210::/64" }]] })),
            CONFIG,
        ),
        case("ranges a string", ipam(json!({ "ranges": "10.210.1.0/24" })), CONFIG),
        case("ranges of numbers", ipam(json!({ "ranges": [[5]] })), CONFIG),
        case("an empty range set", ipam(json!({ "ranges": [[]] })), CONFIG),
        case("routes a string", ipam(json!({ "subnet": "10.210.1.0/24", "routes": "0.0.0.0/0" })), CONFIG),
        case(
            "route dst not a CIDR",
            ipam(json!({ "subnet": "10.210.1.0/24", "routes": [{ "dst": "nowhere" }] })),
            CONFIG,
        ),
        case(
            "route gw not an IP",
            ipam(json!({ "subnet": "10.210.1.0/24", "routes": [{ "dst": "0.0.0.0/0", "gw": 5 }] })),
            CONFIG,
        ),
        case("dataDir a number", ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": 5 })), CONFIG),
        case("dataDir relative", ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": "var/lib/cni" })), CONFIG),
        case(
            "dataDir under a regular file (cannot be written)",
            ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": file_parent.join("sub").display().to_string() })),
            IO,
        ),
        case(
            "dataDir in /proc (cannot be written)",
            ipam(json!({ "subnet": "10.210.1.0/24", "dataDir": "/proc/cni-rs-hostile" })),
            IO,
        ),
        case("resolvConf a number", ipam(json!({ "subnet": "10.210.1.0/24", "resolvConf": 5 })), CONFIG),
        case(
            "resolvConf missing file",
            ipam(json!({ "subnet": "10.210.1.0/24", "resolvConf": "/nonexistent/resolv.conf" })),
            IO,
        ),
        case(
            "runtimeConfig.ips a string",
            with(
                &with_value(&b, "ipam", json!({ "type": "host-local", "subnet": "10.210.1.0/24", "dataDir": dd })),
                "runtimeConfig",
                json!({ "ips": "10.210.1.5" }),
            ),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips not IPs",
            with(
                &with_value(&b, "ipam", json!({ "type": "host-local", "subnet": "10.210.1.0/24", "dataDir": dd })),
                "runtimeConfig",
                json!({ "ips": ["x"] }),
            ),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips outside every range",
            with(&b, "runtimeConfig", json!({ "ips": ["10.219.9.9"] })),
            CONFIG,
        ),
        case(
            "runtimeConfig.ips the network address",
            with(&b, "runtimeConfig", json!({ "ips": [f.subnet.trim_end_matches("/24")] })),
            CONFIG,
        ),
        case(
            "runtimeConfig.ipRanges garbage",
            with(&b, "runtimeConfig", json!({ "ipRanges": [[{ "subnet": "x" }]] })),
            CONFIG,
        ),
        case("args.cni.ips numbers", with(&b, "args", json!({ "cni": { "ips": [5] } })), CONFIG),
        case("args.cni a string", with(&b, "args", json!({ "cni": "x" })), CONFIG),
        env_case("CNI_ARGS IP not an IP", &b, vec![("CNI_ARGS", Some("IP=10.210.1.300".into()))], ENV),
        env_case("CNI_ARGS IP outside the range", &b, vec![("CNI_ARGS", Some("IP=10.219.0.5".into()))], CONFIG),
        case(
            "keepReservationsOnReboot a number",
            ipam(json!({ "subnet": "10.210.1.0/24", "keepReservationsOnReboot": 1 })),
            CONFIG,
        ),
        // The test hook that fakes the boot takes a UUID, never a path.
        env_case("CNI_RS_TEST_BOOT a path", &b, vec![("CNI_RS_TEST_BOOT", Some("../../etc/passwd,1".into()))], ENV),
        env_case(
            "CNI_RS_TEST_BOOT without a start",
            &b,
            vec![("CNI_RS_TEST_BOOT", Some("0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00".into()))],
            ENV,
        ),
    ]
}

/// Every row of host-local's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "host-local");
    cases.extend(rows(&f));
    run_table(&f, "host-local", &cases);
}

/// What a symbolic link planted in host-local's data directory may do: nothing outside it. Each row plants
/// a link (to a file outside, and dangling) where a store file should be, then runs ADD, STATUS, GC, DEL;
/// each answers the code given (None: success) with the planted path in the message, and the file outside
/// is never modified, the dangling target never created.
pub fn never_follows_a_link_in_its_data_directory(bins: &Path) {
    let f = Fixture::new(bins);
    let outside = TempDir::new("cnho");
    let precious = outside.path().join("precious");
    let nowhere = outside.path().join("created-through-a-link");
    let outside_dir = outside.path().join("dir");
    std::fs::create_dir(&outside_dir).expect("mkdir");
    const NA: u32 = 50;
    type Want = [Option<u32>; 4];
    // (where, ADD, STATUS, GC, DEL); `<net>` is the network directory itself.
    let next_free = f.subnet.replace(".0/24", ".2");
    let rows: [(&str, Want); 7] = [
        ("lock", [Some(IO), Some(NA), Some(IO), Some(IO)]),
        (".cni-rs-index", [Some(IO), Some(NA), Some(IO), Some(IO)]),
        ("last_reserved_ip.0", [Some(IO), None, None, None]),
        // The next free address: not a reservation, never written through, skipped.
        (&next_free, [None, None, None, None]),
        // What a kill between writing and linking leaves, as a link: unlinked by the next lock.
        (".host-local-tmp.1.2.3", [None, None, None, None]),
        // Another boot's record: removed as a name by the first ADD of this boot.
        (".cni-rs-boot.00000000-0000-4000-8000-000000000000", [None, None, None, None]),
        ("<net>", [Some(IO), Some(NA), Some(IO), Some(IO)]),
    ];
    let mut failures = Vec::new();
    for (at, want) in rows {
        for dangling in [false, true] {
            std::fs::write(&precious, "precious").expect("write");
            let network = unique("nethl");
            let net_dir = f.scratch.path().join("data").join(&network);
            let (planted, target) = if at == "<net>" {
                (net_dir.clone(), if dangling { nowhere.clone() } else { outside_dir.clone() })
            } else {
                std::fs::create_dir_all(&net_dir).expect("mkdir");
                (net_dir.join(at), if dangling { nowhere.clone() } else { precious.clone() })
            };
            std::os::unix::fs::symlink(&target, &planted).expect("symlink");
            let mut conf = f.base("host-local");
            conf["cniVersion"] = json!("1.1.0");
            conf["name"] = json!(network);
            let mut env = f.env("ADD");
            let mut gc = conf.clone();
            gc["cni.dev/valid-attachments"] = json!([{ "containerID": env["CNI_CONTAINERID"], "ifname": "eth0" }]);
            for (verb, want) in ["ADD", "STATUS", "GC", "DEL"].into_iter().zip(want) {
                env.insert("CNI_COMMAND".into(), verb.into());
                let stdin = if verb == "GC" { &gc } else { &conf };
                let ran = exec(&f.bins.join("host-local"), &[], &env, stdin.to_string().as_bytes());
                let what = format!("{at} (dangling: {dangling}) {verb}");
                match want {
                    None if ran.exit != Some(0) => failures.push(format!("{what}: failed: {}", ran.stdout)),
                    None => {}
                    Some(code) => match check_error(&ran, code) {
                        Err(why) => failures.push(format!("{what}: {why}")),
                        Ok(()) if !ran.stdout.contains(&planted.display().to_string()) => {
                            failures.push(format!("{what}: the message does not name the link: {}", ran.stdout))
                        }
                        Ok(()) => {}
                    },
                }
                if std::fs::read_to_string(&precious).ok().as_deref() != Some("precious") {
                    failures.push(format!("{what}: the file outside was modified"));
                }
                if std::fs::symlink_metadata(&nowhere).is_ok() {
                    failures.push(format!("{what}: a file was created through the dangling link"));
                    let _ = std::fs::remove_file(&nowhere);
                }
                if std::fs::read_dir(&outside_dir).map(|d| d.count()).unwrap_or(1) != 0 {
                    failures.push(format!("{what}: something was written into the directory outside"));
                }
            }
            if at == "<net>" {
                std::fs::remove_file(&net_dir).expect("remove link");
            } else {
                std::fs::remove_dir_all(&net_dir).expect("remove network dir");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
