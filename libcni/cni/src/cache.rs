//! The result cache, in upstream libcni's on-disk format so a node can switch runtimes (or libcni
//! implementations) without losing track of attachments:
//! `<cacheDir>/results/<network>-<containerID>-<ifname>` holding compact JSON
//! `{"kind":"cniCacheV1","containerId","config","ifName","networkName","netns"?,"cniArgs"?,"capabilityArgs"?,"result"?}`
//! where `config` is the base64 of the list's bytes. A file without `kind` is a legacy bare result.

use crate::conf::valid_name;
use crate::durable;
use crate::error::{Error, Result};
use crate::skel::validate_ifname;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cni";
pub const KIND_V1: &str = "cniCacheV1";

/// One cached attachment.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CacheEntry {
    pub container_id: String,
    /// The network configuration list's bytes (empty for a legacy entry).
    pub config: Vec<u8>,
    pub ifname: String,
    pub network_name: String,
    pub netns: String,
    pub cni_args: Vec<(String, String)>,
    pub capability_args: Map<String, Value>,
    /// The final ADD result as the last plugin returned it (not converted).
    pub result: Option<Value>,
    /// True when the file held only a bare result (written by libcni before the cniCacheV1 format).
    pub legacy: bool,
}

/// The file's JSON, field order as upstream writes it.
#[derive(Serialize, Deserialize)]
struct Wire {
    kind: String,
    #[serde(rename = "containerId", default)]
    container_id: String,
    #[serde(default)]
    config: String,
    #[serde(rename = "ifName", default)]
    ifname: String,
    #[serde(rename = "networkName", default)]
    network_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    netns: String,
    #[serde(rename = "cniArgs", default, skip_serializing_if = "Vec::is_empty")]
    cni_args: Vec<(String, String)>,
    #[serde(rename = "capabilityArgs", default, skip_serializing_if = "Map::is_empty")]
    capability_args: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
}

fn results_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("results")
}

/// `<cacheDir>/results/<net>-<containerID>-<ifname>`. The three names are checked so none of them
/// can climb out of the cache directory (code 4 for the container id and ifname, 7 for the network).
pub fn result_path(cache_dir: &Path, network: &str, container_id: &str, ifname: &str) -> Result<PathBuf> {
    if !valid_name(network) {
        return Err(Error::config(format!("invalid network name {network:?} for the result cache")));
    }
    if !valid_name(container_id) {
        return Err(Error::env(format!(
            "invalid container id {container_id:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
        )));
    }
    validate_ifname(ifname)?;
    Ok(results_dir(cache_dir).join(format!("{network}-{container_id}-{ifname}")))
}

/// Removes the temporary files that writers killed between creating and renaming them left in the
/// results directory (`durable::remove_stale_temp_files`). How many were removed.
pub fn remove_stale_temp_files(cache_dir: &Path) -> Result<usize> {
    durable::remove_stale_temp_files(&results_dir(cache_dir), "result cache")
}

/// Write (or replace) an entry whole or not at all, mode 0600, not synced (`durable::write_unsynced`,
/// as upstream libcni).
pub fn write(cache_dir: &Path, entry: &CacheEntry) -> Result<PathBuf> {
    let path = result_path(cache_dir, &entry.network_name, &entry.container_id, &entry.ifname)?;
    let wire = Wire {
        kind: KIND_V1.to_string(),
        container_id: entry.container_id.clone(),
        config: base64::engine::general_purpose::STANDARD.encode(&entry.config),
        ifname: entry.ifname.clone(),
        network_name: entry.network_name.clone(),
        netns: entry.netns.clone(),
        cni_args: entry.cni_args.clone(),
        capability_args: entry.capability_args.clone(),
        result: entry.result.clone(),
    };
    let data =
        serde_json::to_vec(&wire).map_err(|e| Error::new(crate::code::INTERNAL, format!("encode cache entry: {e}")))?;
    durable::write_unsynced(&path, &data, "result cache")?;
    Ok(path)
}

/// Decode a cache file's bytes; `names` (network, container id, ifname) fill in a legacy entry.
pub fn parse(data: &[u8], names: (&str, &str, &str)) -> Result<CacheEntry> {
    let value: Value =
        serde_json::from_slice(data).map_err(|e| Error::decode(format!("cache file is not valid JSON: {e}")))?;
    let Value::Object(obj) = &value else {
        return Err(Error::decode("cache file does not hold a JSON object"));
    };
    if !obj.contains_key("kind") {
        let (network, container_id, ifname) = names;
        return Ok(CacheEntry {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            network_name: network.to_string(),
            result: Some(value),
            legacy: true,
            ..CacheEntry::default()
        });
    }
    let wire: Wire =
        crate::gojson::from_value(&value).map_err(|e| Error::decode(format!("cache file has a bad shape: {e}")))?;
    if wire.kind != KIND_V1 {
        return Err(Error::decode(format!("cache file has unknown kind {:?}", wire.kind)));
    }
    let config = base64::engine::general_purpose::STANDARD
        .decode(wire.config.as_bytes())
        .map_err(|e| Error::decode(format!("cache file \"config\" is not base64: {e}")))?;
    Ok(CacheEntry {
        container_id: wire.container_id,
        config,
        ifname: wire.ifname,
        network_name: wire.network_name,
        netns: wire.netns,
        cni_args: wire.cni_args,
        capability_args: wire.capability_args,
        result: wire.result,
        legacy: false,
    })
}

/// The entry for one attachment; None when there is no cache file.
pub fn read(cache_dir: &Path, network: &str, container_id: &str, ifname: &str) -> Result<Option<CacheEntry>> {
    let path = result_path(cache_dir, network, container_id, ifname)?;
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("read cache file {}", path.display()), &e)),
    };
    parse(&data, (network, container_id, ifname)).map(Some).map_err(|e| e.context(path.display()))
}

/// Remove one attachment's entry; a missing file is fine.
pub fn delete(cache_dir: &Path, network: &str, container_id: &str, ifname: &str) -> Result<()> {
    let path = result_path(cache_dir, network, container_id, ifname)?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(format!("remove cache file {}", path.display()), &e)),
    }
}

/// Every cniCacheV1 entry (of `container_id`, or all when it is empty), as upstream's
/// GetCachedAttachments: legacy and unreadable files are skipped. Sorted by file name.
pub fn attachments(cache_dir: &Path, container_id: &str) -> Result<Vec<CacheEntry>> {
    let dir = results_dir(cache_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("read cache directory {}", dir.display()), &e)),
    };
    let needle = format!("-{container_id}-");
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            !name.starts_with('.') && (container_id.is_empty() || name.contains(&needle))
        })
        .collect();
    files.sort();
    let mut found = Vec::new();
    for file in files {
        let Ok(data) = std::fs::read(&file) else { continue };
        let Ok(entry) = parse(&data, ("", "", "")) else { continue };
        if entry.legacy || (!container_id.is_empty() && entry.container_id != container_id) {
            continue;
        }
        found.push(entry);
    }
    Ok(found)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cni-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The cache file upstream libcni wrote after an ADD of testdata's goldnet.conflist.
    #[test]
    fn reads_the_upstream_written_file() {
        // Kept in the repository: tests/testdata/README.md says where it came from.
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testdata/libcni-cache");
        let data = std::fs::read(dir.join("goldnet-0123456789abcdef-eth0"))
            .unwrap_or_else(|e| panic!("upstream cache file missing under {} ({e})", dir.display()));
        let entry = parse(&data, ("goldnet", "0123456789abcdef", "eth0")).unwrap();
        assert!(!entry.legacy);
        assert_eq!(entry.config, std::fs::read(dir.join("goldnet.conflist")).unwrap());
        assert_eq!(
            (entry.container_id.as_str(), entry.ifname.as_str(), entry.network_name.as_str()),
            ("0123456789abcdef", "eth0", "goldnet")
        );
        assert!(entry.cni_args.is_empty() && entry.netns.is_empty());
        assert_eq!(entry.capability_args["portMappings"][0]["containerPort"], 80);
        let result = entry.result.clone().unwrap();
        assert_eq!(result["ips"][0]["address"], "10.77.1.2/24");

        // Written back by us, it reads the same and keeps upstream's key order.
        let d = tempdir("gold");
        let path = write(&d, &entry).unwrap();
        let ours = std::fs::read(&path).unwrap();
        assert_eq!(parse(&ours, ("", "", "")).unwrap(), entry);
        let keys = |b: &[u8]| -> Vec<String> {
            let v: Value = serde_json::from_slice(b).unwrap();
            let obj = v.as_object().unwrap();
            let mut ks: Vec<(usize, String)> = obj
                .keys()
                .map(|k| (std::str::from_utf8(b).unwrap().find(&format!("\"{k}\":")).unwrap(), k.clone()))
                .collect();
            ks.sort();
            ks.into_iter().map(|(_, k)| k).collect()
        };
        assert_eq!(keys(&ours), keys(&data));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn names_cannot_escape() {
        let d = Path::new("/var/lib/cni");
        assert!(result_path(d, "net", "../../etc", "eth0").is_err());
        assert!(result_path(d, "../net", "abc", "eth0").is_err());
        assert!(result_path(d, "net", "abc", "../x").is_err());
        assert!(result_path(d, "net", "abc", "a/b").is_err());
        assert!(result_path(d, "net", "", "eth0").is_err());
        assert_eq!(result_path(d, "net", "abc", "eth0").unwrap(), Path::new("/var/lib/cni/results/net-abc-eth0"));
    }

    #[test]
    fn round_trip_modes_and_legacy() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempdir("rt");
        let entry = CacheEntry {
            container_id: "c1".into(),
            config: b"{\"name\":\"n\"}".to_vec(),
            ifname: "eth0".into(),
            network_name: "n".into(),
            netns: "/run/netns/x".into(),
            cni_args: vec![("K".into(), "V".into())],
            result: Some(serde_json::json!({"cniVersion":"1.0.0"})),
            ..CacheEntry::default()
        };
        let path = write(&d, &entry).unwrap();
        assert_eq!(read(&d, "n", "c1", "eth0").unwrap().unwrap(), entry);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(d.join("results")).unwrap().permissions().mode() & 0o777, 0o700);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with(r#"{"kind":"cniCacheV1","containerId":"c1","config":"eyJuYW1lIjoibiJ9","ifName":"eth0""#)
        );
        assert!(text.contains(r#""cniArgs":[["K","V"]]"#) && !text.contains("capabilityArgs"));
        assert_eq!(attachments(&d, "c1").unwrap().len(), 1);
        assert_eq!(attachments(&d, "").unwrap().len(), 1);
        assert!(attachments(&d, "c").unwrap().is_empty());
        std::fs::write(d.join("results/n-c2-eth0"), br#"{"cniVersion":"0.3.1","ips":[]}"#).unwrap();
        let legacy = read(&d, "n", "c2", "eth0").unwrap().unwrap();
        assert!(legacy.legacy && legacy.result.unwrap()["cniVersion"] == "0.3.1");
        assert_eq!(attachments(&d, "").unwrap().len(), 1);
        delete(&d, "n", "c1", "eth0").unwrap();
        delete(&d, "n", "c1", "eth0").unwrap();
        assert!(read(&d, "n", "c1", "eth0").unwrap().is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    fn entry(cid: &str, payload: usize) -> CacheEntry {
        CacheEntry {
            container_id: cid.into(),
            ifname: "eth0".into(),
            network_name: "n".into(),
            result: Some(serde_json::json!({"cniVersion": "1.0.0", "pad": "x".repeat(payload)})),
            ..CacheEntry::default()
        }
    }

    fn names(d: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(d.join("results"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A pid that no process holds now: a child that has been reaped.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn stale_temp_files_are_removed_and_only_those() {
        let d = tempdir("stale");
        write(&d, &entry("c1", 10)).unwrap();
        let results = d.join("results");
        let me = std::process::id();
        // What kill -9 between create and rename leaves: an empty file named by the dead writer's pid.
        let killed = format!(".tmp-n-c2-eth0-{}-0", dead_pid());
        // A live writer's (ours) fresh file, and one so old its pid must have been reused.
        let writing = format!(".tmp-n-c3-eth0-{me}-7");
        let old = format!(".tmp-n-c4-eth0-{me}-8");
        // Names that are not ours: never touched.
        let foreign = [".tmp-n-c5-eth0", ".tmp-unrelated", ".tmpx-n-1-2", "n-c6-eth0-1-2"];
        for name in [killed.as_str(), &writing, &old].into_iter().chain(foreign) {
            std::fs::write(results.join(name), "").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        std::fs::File::options().write(true).open(results.join(&old)).unwrap().set_modified(long_ago).unwrap();
        assert_eq!(remove_stale_temp_files(&d).unwrap(), 2);
        let mut want: Vec<String> = foreign.iter().map(|n| n.to_string()).collect();
        want.extend([writing.clone(), "n-c1-eth0".to_string()]);
        want.sort();
        assert_eq!(names(&d), want);
        assert_eq!(remove_stale_temp_files(&tempdir("stale-missing")).unwrap(), 0);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let d = tempdir("failed");
        write(&d, &entry("c1", 10)).unwrap();
        // rename(2) cannot replace a non-empty directory.
        std::fs::create_dir_all(d.join("results/n-c2-eth0/x")).unwrap();
        let e = write(&d, &entry("c2", 10)).unwrap_err();
        assert_eq!(e.code, crate::code::IO, "{e}");
        assert_eq!(names(&d), ["n-c1-eth0", "n-c2-eth0"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Entries are replaced while another thread reads them: every read sees a whole entry.
    #[test]
    fn a_reader_never_sees_a_partial_entry() {
        let d = tempdir("torn");
        write(&d, &entry("c1", 1)).unwrap();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (d, done) = (d.clone(), done.clone());
            std::thread::spawn(move || {
                for i in 0..100 {
                    write(&d, &entry("c1", (i % 4) * 20_000)).unwrap();
                }
                done.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        };
        let mut reads = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            let got = read(&d, "n", "c1", "eth0").unwrap().unwrap();
            let pad = got.result.unwrap()["pad"].as_str().unwrap().len();
            assert!(pad == 1 || pad.is_multiple_of(20_000), "{pad}");
            reads += 1;
        }
        writer.join().unwrap();
        assert!(reads > 0);
        assert_eq!(names(&d), ["n-c1-eth0"]);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
