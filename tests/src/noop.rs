//! Fixtures for tests that exec the cni-noop plugin through libcni: a temp directory with a bin dir
//! holding the plugin under any type names, a cache dir, debug files and the command log.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The built cni-noop plugin (src/bin/noop.rs of this crate).
pub fn noop_bin() -> PathBuf {
    crate::bin_dir().join("cni-noop")
}

pub struct Fixture {
    pub root: PathBuf,
    pub bin: PathBuf,
    pub cache: PathBuf,
    pub conf: PathBuf,
    pub log: PathBuf,
}

impl Fixture {
    pub fn new(tag: &str) -> Fixture {
        let root = std::env::temp_dir().join(format!(
            "cni-rt-{tag}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let f = Fixture {
            bin: root.join("bin"),
            cache: root.join("cache"),
            conf: root.join("net.d"),
            log: root.join("commands.log"),
            root,
        };
        for d in [&f.bin, &f.cache, &f.conf] {
            std::fs::create_dir_all(d).unwrap();
        }
        f.install("noop");
        f
    }

    /// Make the noop plugin available as type `name` (a hard link, so no write races exec).
    pub fn install(&self, name: &str) -> PathBuf {
        let dst = self.bin.join(name);
        let noop = noop_bin();
        if std::fs::hard_link(&noop, &dst).is_err() {
            std::fs::copy(&noop, &dst).unwrap();
        }
        dst
    }

    /// A debug file that logs to the shared command log, with `extra` keys.
    pub fn debug(&self, name: &str, extra: Value) -> PathBuf {
        let mut v = json!({"commandLog": self.log});
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        let p = self.root.join(format!("{name}.debug.json"));
        std::fs::write(&p, v.to_string()).unwrap();
        p
    }

    /// A noop plugin object tagged `tag`, logging, with `extra` debug keys.
    pub fn plugin(&self, tag: &str, extra: Value) -> Value {
        json!({"type": "noop", "tag": tag, "debugFile": self.debug(tag, extra)})
    }

    pub fn list(&self, name: &str, version: &str, plugins: Vec<Value>) -> libcni::conflist::NetworkConfigList {
        let v = json!({"cniVersion": version, "name": name, "plugins": plugins});
        libcni::conflist::NetworkConfigList::from_bytes(v.to_string().as_bytes()).unwrap()
    }

    pub fn config(&self) -> libcni::runtime::CniConfig {
        libcni::runtime::CniConfig::with_cache_dir(vec![self.bin.clone()], self.cache.clone())
    }

    /// Every logged invocation, in order.
    pub fn calls(&self) -> Vec<Value> {
        match std::fs::read_to_string(&self.log) {
            Ok(s) => s.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// `COMMAND:tag` of every logged invocation.
    pub fn trace(&self) -> Vec<String> {
        self.calls()
            .iter()
            .map(|c| format!("{}:{}", c["command"].as_str().unwrap(), c["stdin"]["tag"].as_str().unwrap_or("-")))
            .collect()
    }

    pub fn clear_log(&self) {
        let _ = std::fs::remove_file(&self.log);
    }

    pub fn cache_file(&self, net: &str, cid: &str, ifname: &str) -> PathBuf {
        self.cache.join("results").join(format!("{net}-{cid}-{ifname}"))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

pub fn rt(cid: &str, ifname: &str) -> libcni::runtime::RuntimeConf {
    libcni::runtime::RuntimeConf {
        container_id: cid.to_string(),
        netns: "/var/run/netns/test".to_string(),
        ifname: ifname.to_string(),
        ..Default::default()
    }
}
