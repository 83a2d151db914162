//! Network configuration lists (`.conflist`) and loading them from a directory such as
//! `/etc/cni/net.d`, following upstream libcni, except that one malformed file never hides the
//! other networks: it is reported instead (see [`DirScan::failures`]).

use crate::conf::{kind, lenient_bool_value, valid_name};
use crate::error::{Error, Result};
use crate::version;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One plugin of a list: its type and capabilities, and the whole object as written (unknown
/// keys included), which is what the plugin receives on stdin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConf {
    pub plugin_type: String,
    /// The plugin object's own `name`, if it has one (only used in error messages, as upstream).
    pub name: Option<String>,
    pub capabilities: BTreeMap<String, bool>,
    pub raw: Map<String, Value>,
}

/// A parsed configuration list.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfigList {
    pub name: String,
    /// The version in effect after `cniVersions` negotiation ("" if none was given).
    pub cni_version: String,
    pub disable_check: bool,
    pub disable_gc: bool,
    pub load_only_inlined_plugins: bool,
    pub plugins: Vec<PluginConf>,
    /// The list's bytes, as cached with every ADD (`config` in the cache file).
    pub bytes: Vec<u8>,
}

/// Look a key up as Go's decoder does for struct fields ([`crate::gojson::get`]).
fn get_ci<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    crate::gojson::get(obj, key).map(|(_, v)| v)
}

fn list_bool(obj: &Map<String, Value>, key: &str) -> Result<bool> {
    match obj.get(key) {
        None => Ok(false),
        Some(v) => lenient_bool_value(v).ok_or_else(|| {
            Error::config(format!("invalid {key:?}: expected true or false (or the strings), got {}", kind(v)))
        }),
    }
}

impl PluginConf {
    /// One plugin object: `type` must be a non-empty string without a path separator.
    pub fn from_value(value: &Value) -> Result<PluginConf> {
        let Value::Object(raw) = value else {
            return Err(Error::config(format!("a plugin configuration must be a JSON object, got {}", kind(value))));
        };
        let plugin_type = match get_ci(raw, "type") {
            Some(Value::String(t)) if !t.is_empty() => t.clone(),
            None | Some(Value::Null) => return Err(Error::config("plugin configuration is missing \"type\"")),
            Some(Value::String(_)) => return Err(Error::config("plugin configuration has an empty \"type\"")),
            Some(other) => {
                return Err(Error::config(format!("plugin \"type\" must be a string, got {}", kind(other))));
            }
        };
        if plugin_type.contains('/') || plugin_type.contains('\\') || plugin_type == ".." {
            return Err(Error::config(format!(
                "invalid plugin type {plugin_type:?}: it names a binary in CNI_PATH and cannot contain a path separator"
            )));
        }
        let name = match get_ci(raw, "name") {
            Some(Value::String(n)) if !n.is_empty() => Some(n.clone()),
            _ => None,
        };
        let mut capabilities = BTreeMap::new();
        match get_ci(raw, "capabilities") {
            None | Some(Value::Null) => {}
            Some(Value::Object(caps)) => {
                for (k, v) in caps {
                    let on = v.as_bool().ok_or_else(|| {
                        Error::config(format!(
                            "plugin {plugin_type:?}: capability {k:?} must be true or false, got {}",
                            kind(v)
                        ))
                    })?;
                    capabilities.insert(k.clone(), on);
                }
            }
            Some(other) => {
                return Err(Error::config(format!(
                    "plugin {plugin_type:?}: \"capabilities\" must be an object, got {}",
                    kind(other)
                )));
            }
        }
        Ok(PluginConf { plugin_type, name, capabilities, raw: raw.clone() })
    }

    /// `plugin type="x" name="y"`, as upstream names a plugin in errors.
    pub fn description(&self) -> String {
        match &self.name {
            Some(n) => format!("plugin type={:?} name={n:?}", self.plugin_type),
            None => format!("plugin type={:?}", self.plugin_type),
        }
    }
}

/// The version a list runs at: `cniVersion`, or with `cniVersions` the highest entry no newer than
/// we implement (cniVersion merged in), as upstream. Without `cniVersions`, `cniVersion` is used as-is.
fn negotiate_version(obj: &Map<String, Value>) -> Result<String> {
    let cni_version = match obj.get("cniVersion") {
        None => String::new(),
        Some(Value::String(v)) => v.clone(),
        Some(other) => return Err(Error::config(format!("\"cniVersion\" must be a string, got {}", kind(other)))),
    };
    let Some(raw_versions) = obj.get("cniVersions") else { return Ok(cni_version) };
    let Value::Array(entries) = raw_versions else {
        return Err(Error::config(format!("\"cniVersions\" must be an array, got {}", kind(raw_versions))));
    };
    let current = version::Version::parse(version::CURRENT)?;
    let mut candidates = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let Value::String(v) = entry else {
            return Err(Error::config(format!("\"cniVersions\"[{i}] must be a string, got {}", kind(entry))));
        };
        let parsed =
            version::Version::parse(v).map_err(|e| Error::config(format!("\"cniVersions\"[{i}]: {}", e.msg)))?;
        if parsed <= current {
            candidates.push((parsed, v.clone()));
        }
    }
    if !cni_version.is_empty() {
        let parsed =
            version::Version::parse(&cni_version).map_err(|e| Error::config(format!("\"cniVersion\": {}", e.msg)))?;
        if parsed <= current {
            candidates.push((parsed, cni_version.clone()));
        }
    }
    // Upstream keeps cniVersion unchanged when nothing is left to pick from.
    Ok(candidates.into_iter().max_by(|a, b| a.0.cmp(&b.0)).map(|(_, v)| v).unwrap_or(cni_version))
}

impl NetworkConfigList {
    /// Parse a `.conflist`. Plugins may be absent here when they come from `<dir>/<name>/*.conf`
    /// (see [`load_conflist_file`]); an empty `plugins` array is always an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<NetworkConfigList> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::decode(format!("configuration list is not valid JSON: {e}")))?;
        let Value::Object(obj) = &value else {
            return Err(Error::decode(format!("configuration list must be a JSON object, got {}", kind(&value))));
        };
        let name = match obj.get("name") {
            Some(Value::String(n)) => n.clone(),
            None => return Err(Error::config("configuration list has no \"name\"")),
            Some(other) => return Err(Error::config(format!("\"name\" must be a string, got {}", kind(other)))),
        };
        if !valid_name(&name) {
            return Err(Error::config(format!(
                "invalid network name {name:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit"
            )));
        }
        let cni_version = negotiate_version(obj)?;
        let disable_check = list_bool(obj, "disableCheck")?;
        let disable_gc = list_bool(obj, "disableGC")?;
        let load_only_inlined_plugins = list_bool(obj, "loadOnlyInlinedPlugins")?;
        let plugins = match obj.get("plugins") {
            None if load_only_inlined_plugins => {
                return Err(Error::config(format!(
                    "network {name:?} has no \"plugins\" but loadOnlyInlinedPlugins is true"
                )));
            }
            None => Vec::new(),
            Some(Value::Array(ps)) if ps.is_empty() => {
                return Err(Error::config(format!("network {name:?} has an empty \"plugins\" list")));
            }
            Some(Value::Array(ps)) => ps
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    PluginConf::from_value(p).map_err(|e| e.context(format!("network {name:?} plugins[{i}]")))
                })
                .collect::<Result<Vec<_>>>()?,
            Some(other) => {
                return Err(Error::config(format!(
                    "network {name:?}: \"plugins\" must be an array, got {}",
                    kind(other)
                )));
            }
        };
        Ok(NetworkConfigList {
            name,
            cni_version,
            disable_check,
            disable_gc,
            load_only_inlined_plugins,
            plugins,
            bytes: bytes.to_vec(),
        })
    }

    /// Wrap a single-plugin `.conf` as upstream's ConfListFromConf does: `{name, cniVersion, plugins:[conf]}`.
    pub fn from_single_conf(bytes: &[u8]) -> Result<NetworkConfigList> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::decode(format!("network configuration is not valid JSON: {e}")))?;
        let Value::Object(obj) = &value else {
            return Err(Error::decode(format!("network configuration must be a JSON object, got {}", kind(&value))));
        };
        if obj.contains_key("plugins") && get_ci(obj, "type").is_none() {
            return Err(Error::config(
                "this is a configuration list (it has \"plugins\"): give the file the .conflist extension",
            ));
        }
        let plugin = PluginConf::from_value(&value)?;
        let name = match get_ci(obj, "name") {
            Some(Value::String(n)) => n.clone(),
            _ => String::new(),
        };
        let cni_version = match get_ci(obj, "cniVersion") {
            Some(Value::String(v)) => v.clone(),
            _ => String::new(),
        };
        let list = serde_json::json!({"name": name, "cniVersion": cni_version, "plugins": [value]});
        let mut parsed = NetworkConfigList::from_bytes(list.to_string().as_bytes())?;
        parsed.plugins = vec![plugin];
        Ok(parsed)
    }

    /// Re-render the list with its current plugins (after plugins were appended from a directory).
    fn refresh_bytes(&mut self) -> Result<()> {
        let mut obj: Map<String, Value> = serde_json::from_slice(&self.bytes)
            .map_err(|e| Error::decode(format!("configuration list is not valid JSON: {e}")))?;
        obj.insert("plugins".into(), Value::Array(self.plugins.iter().map(|p| Value::Object(p.raw.clone())).collect()));
        self.bytes = Value::Object(obj).to_string().into_bytes();
        Ok(())
    }
}

/// One plugin configuration on its own, as a `.conf` file holds it (upstream's `NetworkConfig` /
/// `PluginConfig`): what the single-plugin calls of the runtime API run
/// ([`crate::runtime::CniConfig::add_network`] and the others).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConfig {
    /// The network name (`name`; may be empty here, ADD refuses it).
    pub name: String,
    /// `cniVersion` as written ("" if none).
    pub cni_version: String,
    pub plugin: PluginConf,
    /// The configuration's bytes, as cached with an ADD.
    pub bytes: Vec<u8>,
}

impl NetworkConfig {
    /// Upstream's `ConfFromBytes`: one plugin object with a non-empty `type`.
    pub fn from_bytes(bytes: &[u8]) -> Result<NetworkConfig> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| Error::decode(format!("network configuration is not valid JSON: {e}")))?;
        let Value::Object(obj) = &value else {
            return Err(Error::decode(format!("network configuration must be a JSON object, got {}", kind(&value))));
        };
        let plugin = PluginConf::from_value(&value)?;
        let string = |key: &str| -> Result<String> {
            match get_ci(obj, key) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(v)) => Ok(v.clone()),
                Some(other) => Err(Error::config(format!("{key:?} must be a string, got {}", kind(other)))),
            }
        };
        Ok(NetworkConfig { name: string("name")?, cni_version: string("cniVersion")?, plugin, bytes: bytes.to_vec() })
    }

    /// This configuration as a list of one plugin (upstream's `ConfListFromConf`).
    pub fn to_list(&self) -> Result<NetworkConfigList> {
        NetworkConfigList::from_single_conf(&self.bytes)
    }
}

/// Upstream's `ConfFromBytes`.
pub fn conf_from_bytes(bytes: &[u8]) -> Result<NetworkConfig> {
    NetworkConfig::from_bytes(bytes)
}

/// Upstream's `ConfFromFile`: a `.conf` file holding one plugin configuration.
pub fn conf_from_file(path: &Path) -> Result<NetworkConfig> {
    NetworkConfig::from_bytes(&read_file(path)?).map_err(|e| e.context(path.display()))
}

/// Upstream's `ConfListFromBytes`.
pub fn conf_list_from_bytes(bytes: &[u8]) -> Result<NetworkConfigList> {
    NetworkConfigList::from_bytes(bytes)
}

/// Upstream's `ConfListFromFile`: a `.conflist`, with `<dir>/<name>/*.conf` appended unless
/// `loadOnlyInlinedPlugins` (see [`load_conflist_file`]).
pub fn conf_list_from_file(path: &Path) -> Result<NetworkConfigList> {
    load_conflist_file(path)
}

/// Upstream's `InjectConf`: `conf` with every key of `values` set at its top level (replacing any
/// value it had). An empty key or a null value is refused (code 7), as upstream does.
pub fn inject_conf(conf: &NetworkConfig, values: &Map<String, Value>) -> Result<NetworkConfig> {
    let mut obj: Map<String, Value> = serde_json::from_slice(&conf.bytes)
        .map_err(|e| Error::decode(format!("network configuration is not a JSON object: {e}")))?;
    for (key, value) in values {
        if key.is_empty() {
            return Err(Error::config("inject into a network configuration: keys cannot be empty"));
        }
        if value.is_null() {
            return Err(Error::config(format!(
                "inject into a network configuration: key {key:?} value must not be null"
            )));
        }
        obj.insert(key.clone(), value.clone());
    }
    NetworkConfig::from_bytes(Value::Object(obj).to_string().as_bytes())
}

/// Files in `dir` (not recursive) whose extension is one of `extensions` (without the dot), sorted.
/// A missing directory has no files.
pub fn conf_files(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("read configuration directory {}", dir.display()), &e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("read configuration directory {}", dir.display()), &e))?;
        let path = entry.path();
        let is_file = std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false);
        let ext_ok = path.extension().and_then(|e| e.to_str()).is_some_and(|e| extensions.contains(&e));
        if is_file && ext_ok {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// A configuration file, within the limits every configuration has (see [`crate::limits`]).
fn read_file(path: &Path) -> Result<Vec<u8>> {
    crate::limits::read_config_file(path)
}

/// A `.conflist` file, with `<dir>/<name>/*.conf` appended unless `loadOnlyInlinedPlugins`.
pub fn load_conflist_file(path: &Path) -> Result<NetworkConfigList> {
    let mut list = NetworkConfigList::from_bytes(&read_file(path)?)?;
    if !list.load_only_inlined_plugins {
        if let Some(dir) = path.parent() {
            let extra_dir = dir.join(&list.name);
            let mut extra = Vec::new();
            for file in conf_files(&extra_dir, &["conf"])? {
                let bytes = read_file(&file)?;
                let value: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| Error::decode(format!("{}: not valid JSON: {e}", file.display())))?;
                extra.push(PluginConf::from_value(&value).map_err(|e| e.context(file.display()))?);
            }
            if !extra.is_empty() {
                list.plugins.extend(extra);
                list.refresh_bytes()?;
            }
        }
    }
    if list.plugins.is_empty() {
        return Err(Error::config(format!("network {:?}: no plugin configs found", list.name)));
    }
    Ok(list)
}

/// A single-plugin `.conf`/`.json` file, wrapped into a list.
pub fn load_single_conf_file(path: &Path) -> Result<NetworkConfigList> {
    NetworkConfigList::from_single_conf(&read_file(path)?)
}

/// One network found in a directory.
#[derive(Debug, Clone)]
pub struct FoundNetwork {
    pub file: PathBuf,
    pub list: NetworkConfigList,
}

/// Everything a directory holds: the networks in load order (a name appears once, from the file
/// that wins), files that failed to parse, and files shadowed by an earlier one with the same name.
#[derive(Debug, Default)]
pub struct DirScan {
    pub networks: Vec<FoundNetwork>,
    pub failures: Vec<(PathBuf, Error)>,
    pub shadowed: Vec<(PathBuf, String)>,
}

impl DirScan {
    pub fn get(&self, name: &str) -> Option<&FoundNetwork> {
        self.networks.iter().find(|n| n.list.name == name)
    }
}

/// Read every configuration in `dir`: sorted `.conflist` files first, then sorted `.conf`/`.json`.
pub fn scan_dir(dir: &Path) -> Result<DirScan> {
    let mut scan = DirScan::default();
    let lists = conf_files(dir, &["conflist"])?;
    let singles = conf_files(dir, &["conf", "json"])?;
    type Loader = fn(&Path) -> Result<NetworkConfigList>;
    let loaders: [(Vec<PathBuf>, Loader); 2] = [(lists, load_conflist_file), (singles, load_single_conf_file)];
    for (files, load) in loaders {
        for file in files {
            match load(&file) {
                Ok(list) => {
                    if scan.get(&list.name).is_some() {
                        scan.shadowed.push((file, list.name));
                    } else {
                        scan.networks.push(FoundNetwork { file, list });
                    }
                }
                Err(e) => scan.failures.push((file, e)),
            }
        }
    }
    Ok(scan)
}

/// No configuration in `dir` is called `name` (upstream's `NotFoundError`). `failed` lists the
/// files that could not be loaded, since one of them may be the one meant.
#[derive(Debug, Clone, PartialEq)]
pub struct NotFoundError {
    pub dir: PathBuf,
    pub name: String,
    pub failed: Vec<(PathBuf, Error)>,
}

/// `dir` holds no configuration at all (upstream's `NoConfigsFoundError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoConfigsFoundError {
    pub dir: PathBuf,
}

/// Why loading a network by name failed, so a caller can tell "not there" from "broken".
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    NotFound(NotFoundError),
    NoConfigsFound(NoConfigsFoundError),
    /// The directory could not be read.
    Other(Error),
}

impl std::fmt::Display for NotFoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no net configuration with name {:?} in {}", self.name, self.dir.display())?;
        if !self.failed.is_empty() {
            let failed: Vec<String> = self.failed.iter().map(|(p, e)| format!("{}: {}", p.display(), e.msg)).collect();
            write!(f, " (files that failed to load: {})", failed.join("; "))?;
        }
        Ok(())
    }
}

impl std::fmt::Display for NoConfigsFoundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no net configurations found in {}", self.dir.display())
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound(e) => e.fmt(f),
            LoadError::NoConfigsFound(e) => e.fmt(f),
            LoadError::Other(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for NotFoundError {}
impl std::error::Error for NoConfigsFoundError {}
impl std::error::Error for LoadError {}

/// Not found and no configs are code 7: it is the configuration that names a network we do not have.
impl From<LoadError> for Error {
    fn from(e: LoadError) -> Error {
        match e {
            LoadError::Other(e) => e,
            other => Error::config(other.to_string()),
        }
    }
}

fn not_found(dir: &Path, name: &str, scan: DirScan) -> LoadError {
    if scan.networks.is_empty() && scan.failures.is_empty() && scan.shadowed.is_empty() {
        LoadError::NoConfigsFound(NoConfigsFoundError { dir: dir.to_path_buf() })
    } else {
        LoadError::NotFound(NotFoundError { dir: dir.to_path_buf(), name: name.to_string(), failed: scan.failures })
    }
}

/// Upstream's LoadNetworkConf (and LoadConfList): the network called `name` in `dir`, with typed
/// errors for "not there". Unlike upstream, a malformed file for another network does not stop this
/// one from loading; when `name` is not found, the files that failed are named in the error.
pub fn load_network_conf(dir: &Path, name: &str) -> Result<NetworkConfigList, LoadError> {
    let scan = scan_dir(dir).map_err(LoadError::Other)?;
    if let Some(found) = scan.get(name) {
        return Ok(found.list.clone());
    }
    Err(not_found(dir, name, scan))
}

/// [`load_network_conf`] with its error as a CNI error (code 7 when not found).
pub fn load_network(dir: &Path, name: &str) -> Result<NetworkConfigList> {
    load_network_conf(dir, name).map_err(Error::from)
}

/// Upstream's LoadConf: the single-plugin `.conf`/`.json` configuration called `name` in `dir`
/// (files sorted; one that fails to parse is skipped and named if `name` is not found).
pub fn load_conf(dir: &Path, name: &str) -> Result<NetworkConfig, LoadError> {
    let files = conf_files(dir, &["conf", "json"]).map_err(LoadError::Other)?;
    if files.is_empty() {
        return Err(LoadError::NoConfigsFound(NoConfigsFoundError { dir: dir.to_path_buf() }));
    }
    let mut failed = Vec::new();
    for file in files {
        match conf_from_file(&file) {
            Ok(conf) if conf.name == name => return Ok(conf),
            Ok(_) => {}
            Err(e) => failed.push((file, e)),
        }
    }
    Err(LoadError::NotFound(NotFoundError { dir: dir.to_path_buf(), name: name.to_string(), failed }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<NetworkConfigList> {
        NetworkConfigList::from_bytes(s.as_bytes())
    }

    #[test]
    fn version_selection() {
        let v = |s: &str| parse(s).unwrap().cni_version;
        assert_eq!(v(r#"{"name":"n","cniVersion":"1.0.0","plugins":[{"type":"a"}]}"#), "1.0.0");
        assert_eq!(v(r#"{"name":"n","cniVersion":"1.2.3","plugins":[{"type":"a"}]}"#), "1.2.3");
        assert_eq!(
            v(
                r#"{"name":"n","cniVersion":"0.4.0","cniVersions":["1.0.0","1.1.0","1.2.0","0.3.1"],"plugins":[{"type":"a"}]}"#
            ),
            "1.1.0"
        );
        assert_eq!(v(r#"{"name":"n","cniVersion":"1.0.0","cniVersions":["0.4.0"],"plugins":[{"type":"a"}]}"#), "1.0.0");
        assert_eq!(v(r#"{"name":"n","cniVersions":[],"plugins":[{"type":"a"}]}"#), "");
        assert_eq!(v(r#"{"name":"n","cniVersion":"1.2.0","cniVersions":[],"plugins":[{"type":"a"}]}"#), "1.2.0");
        assert_eq!(v(r#"{"name":"n","cniVersions":["0.10.0","0.4.0"],"plugins":[{"type":"a"}]}"#), "0.10.0");
        assert!(parse(r#"{"name":"n","cniVersions":"1.0.0","plugins":[{"type":"a"}]}"#).is_err());
        assert!(parse(r#"{"name":"n","cniVersions":[1],"plugins":[{"type":"a"}]}"#).is_err());
        assert!(parse(r#"{"name":"n","cniVersions":["1.0.0.0"],"plugins":[{"type":"a"}]}"#).is_err());
        assert!(parse(r#"{"name":"n","cniVersion":1,"plugins":[{"type":"a"}]}"#).is_err());
    }

    #[test]
    fn flags_and_plugins() {
        let l = parse(
            r#"{"name":"n","cniVersion":"1.1.0","disableCheck":"TRUE","disableGC":true,"loadOnlyInlinedPlugins":"false",
                "extra":1,"plugins":[{"Type":"bridge","capabilities":{"portMappings":true,"ips":false},"mystery":{"k":[1]}}]}"#,
        )
        .unwrap();
        assert!(l.disable_check && l.disable_gc && !l.load_only_inlined_plugins);
        assert_eq!(l.plugins[0].plugin_type, "bridge");
        assert_eq!(l.plugins[0].capabilities.get("ips"), Some(&false));
        assert_eq!(l.plugins[0].raw["mystery"], serde_json::json!({"k":[1]}));
        assert_eq!(l.plugins[0].description(), "plugin type=\"bridge\"");
        for bad in [
            r#"{"name":"n","plugins":[]}"#,
            r#"{"name":"n","loadOnlyInlinedPlugins":true}"#,
            r#"{"name":"n","disableCheck":"yes","plugins":[{"type":"a"}]}"#,
            r#"{"name":"n","plugins":[{"type":"../a"}]}"#,
            r#"{"name":"n","plugins":[{"type":"a/b"}]}"#,
            r#"{"name":"n","plugins":[{"type":3}]}"#,
            r#"{"name":"n","plugins":[{}]}"#,
            r#"{"name":"n","plugins":{}}"#,
            r#"{"name":3,"plugins":[{"type":"a"}]}"#,
            r#"{"plugins":[{"type":"a"}]}"#,
            r#"{"name":"../etc","plugins":[{"type":"a"}]}"#,
        ] {
            assert_eq!(parse(bad).unwrap_err().code, 7, "{bad}");
        }
        assert_eq!(parse("{").unwrap_err().code, 6);
        assert_eq!(parse("[]").unwrap_err().code, 6);
        // Plugins may come from <dir>/<name>/ later.
        assert!(parse(r#"{"name":"n"}"#).unwrap().plugins.is_empty());
    }

    #[test]
    fn single_conf_wrapped() {
        let l =
            NetworkConfigList::from_single_conf(br#"{"cniVersion":"0.4.0","name":"s","type":"bridge","x":1}"#).unwrap();
        assert_eq!((l.name.as_str(), l.cni_version.as_str(), l.plugins.len()), ("s", "0.4.0", 1));
        assert_eq!(l.plugins[0].raw["x"], 1);
        let bytes: Value = serde_json::from_slice(&l.bytes).unwrap();
        assert_eq!(bytes["plugins"][0]["type"], "bridge");
        let e = NetworkConfigList::from_single_conf(br#"{"name":"s","plugins":[{"type":"a"}]}"#).unwrap_err();
        assert!(e.msg.contains(".conflist"));
    }
}
