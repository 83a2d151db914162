//! The runtime side of CNI, as upstream's `CNIConfig`: run a network configuration list's plugins
//! for ADD, CHECK, DEL, GC and STATUS, keep the result cache, and validate a list against its plugins.

use crate::cache::{self, CacheEntry};
use crate::conf::{valid_name, Attachment};
use crate::conflist::{NetworkConfig, NetworkConfigList, PluginConf};
use crate::error::{code, Error, Errors, Result};
use crate::invoke::{self, CniEnv, PluginInfo};
use crate::skel::{validate_ifname, Command};
use crate::types::{self, CniResult};
use crate::version;
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// Where plugins live, where results are cached, and how long one plugin may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniConfig {
    pub path: Vec<PathBuf>,
    pub cache_dir: PathBuf,
    /// None: wait as long as the plugin takes.
    pub timeout: Option<Duration>,
}

/// One attachment as the runtime describes it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeConf {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    /// CNI_ARGS pairs.
    pub args: Vec<(String, String)>,
    /// Values for the capabilities plugins declare (`portMappings`, `ips`, ...).
    pub capability_args: Map<String, Value>,
}

impl CniConfig {
    pub fn new(path: Vec<PathBuf>) -> CniConfig {
        CniConfig { path, cache_dir: PathBuf::from(cache::DEFAULT_CACHE_DIR), timeout: None }
    }

    pub fn with_cache_dir(path: Vec<PathBuf>, cache_dir: PathBuf) -> CniConfig {
        CniConfig { path, cache_dir, timeout: None }
    }

    fn env(&self, command: Command, rt: &RuntimeConf) -> CniEnv {
        CniEnv {
            command: command.as_str().to_string(),
            container_id: rt.container_id.clone(),
            netns: rt.netns.clone(),
            ifname: rt.ifname.clone(),
            args: rt.args.clone(),
            path: self.path.clone(),
        }
    }

    /// GC and STATUS concern the network, not an attachment: only CNI_COMMAND and CNI_PATH.
    fn network_env(&self, command: Command) -> CniEnv {
        CniEnv { command: command.as_str().to_string(), path: self.path.clone(), ..CniEnv::default() }
    }

    /// The path of a plugin, found on `self.path`.
    pub fn find_plugin(&self, plugin_type: &str) -> Result<PathBuf> {
        invoke::find_plugin(plugin_type, &self.path)
    }

    /// Run ADD on every plugin in order, each getting the previous one's result as `prevResult`.
    /// The first failure stops it (code kept) and nothing is cached; after a full success the
    /// result is cached and returned (unconverted, as the last plugin gave it).
    pub fn add_network_list(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<CniResult> {
        validate_attachment(&list.name, rt)?;
        let mut prev: Option<CniResult> = None;
        for plugin in &list.plugins {
            let result = self
                .add_one(&list.name, &list.cni_version, plugin, prev.as_ref(), rt)
                .map_err(|e| e.context(format!("{} failed (add)", plugin.description())))?;
            prev = Some(result);
        }
        let result = prev.ok_or_else(|| Error::config(format!("network {:?} has no plugins to run", list.name)))?;
        self.cache_add(&list.name, &list.bytes, &result, rt)?;
        Ok(result)
    }

    /// ADD of one plugin of network `name`, with `prev` as its `prevResult`.
    fn add_one(
        &self,
        name: &str,
        cni_version: &str,
        plugin: &PluginConf,
        prev: Option<&CniResult>,
        rt: &RuntimeConf,
    ) -> Result<CniResult> {
        let path = self.find_plugin(&plugin.plugin_type)?;
        let prev_value = prev.map(|r| r.to_value(&r.cni_version)).transpose()?;
        let stdin = stdin_for(name, cni_version, plugin, prev_value, rt)?;
        invoke::exec_with_result(&path, &stdin, &self.env(Command::Add, rt), self.timeout, cni_version)
    }

    /// A verb without a result (CHECK, DEL) of one plugin of network `name`.
    fn run_one(
        &self,
        command: Command,
        name: &str,
        cni_version: &str,
        plugin: &PluginConf,
        prev: Option<Value>,
        rt: &RuntimeConf,
    ) -> Result<()> {
        let path = self.find_plugin(&plugin.plugin_type)?;
        let stdin = stdin_for(name, cni_version, plugin, prev, rt)?;
        invoke::exec_without_result(&path, &stdin, &self.env(command, rt), self.timeout)
    }

    /// Cache a successful ADD (only then, as upstream).
    fn cache_add(&self, network: &str, config: &[u8], result: &CniResult, rt: &RuntimeConf) -> Result<()> {
        let entry = CacheEntry {
            container_id: rt.container_id.clone(),
            config: config.to_vec(),
            ifname: rt.ifname.clone(),
            network_name: network.to_string(),
            netns: rt.netns.clone(),
            cni_args: rt.args.clone(),
            capability_args: rt.capability_args.clone(),
            result: Some(result.to_value(&result.cni_version)?),
            legacy: false,
        };
        cache::write(&self.cache_dir, &entry)
            .map_err(|e| e.context(format!("network {network:?}: cache the ADD result")))?;
        Ok(())
    }

    /// The cached result CHECK sends as `prevResult`. Refused (code 3) when there is none: the spec
    /// lets a runtime CHECK only an attachment it ADDed and has not DELed, and a plugin cannot check
    /// anything without the result. (Upstream libcni runs the plugins without `prevResult` instead.)
    fn check_prev_result(&self, network: &str, cni_version: &str, rt: &RuntimeConf) -> Result<Value> {
        self.cached_value(network, cni_version, rt)
            .map_err(|e| e.context(format!("failed to get network {network:?} cached result")))?
            .ok_or_else(|| {
                Error::new(
                    code::UNKNOWN_CONTAINER,
                    format!(
                        "network {network:?}: no cached result for container {:?} interface {:?} in {}: CHECK needs \
                         the result of its ADD (was it ADDed through this cache directory, or DELed since?)",
                        rt.container_id,
                        rt.ifname,
                        self.cache_dir.display()
                    ),
                )
            })
    }

    /// CHECK every plugin in order against the cached result. Refused below 0.4.0 (code 1); a no-op
    /// with `disableCheck`.
    pub fn check_network_list(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<()> {
        if !version::at_least(&list.cni_version, "0.4.0") {
            return Err(Error::version(format!(
                "configuration version {:?} does not support the CHECK command",
                list.cni_version
            )));
        }
        if list.disable_check {
            return Ok(());
        }
        let cached = self.check_prev_result(&list.name, &list.cni_version, rt)?;
        for plugin in &list.plugins {
            self.run_one(Command::Check, &list.name, &list.cni_version, plugin, Some(cached.clone()), rt)
                .map_err(|e| e.context(format!("{} failed (check)", plugin.description())))?;
        }
        Ok(())
    }

    /// DEL every plugin in reverse order. From 0.4.0 on each gets the cached result (converted to
    /// the list's version) as `prevResult`; an unreadable cache is deleted and none is sent. The
    /// first failure stops it and keeps the cache so DEL can be retried; success removes it.
    pub fn del_network_list(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<()> {
        let cached = self.del_prev_result(&list.name, &list.cni_version, rt);
        for plugin in list.plugins.iter().rev() {
            self.run_one(Command::Del, &list.name, &list.cni_version, plugin, cached.clone(), rt)
                .map_err(|e| e.context(format!("{} failed (delete)", plugin.description())))?;
        }
        // Names a runtime could never have ADDed have no cache file to remove.
        let _ = cache::delete(&self.cache_dir, &list.name, &rt.container_id, &rt.ifname);
        Ok(())
    }

    /// What DEL sends as `prevResult`: from 0.4.0 on the cached result; an unreadable cache is
    /// deleted and none is sent.
    fn del_prev_result(&self, network: &str, cni_version: &str, rt: &RuntimeConf) -> Option<Value> {
        if !version::at_least(cni_version, "0.4.0") {
            return None;
        }
        match self.cached_value(network, cni_version, rt) {
            Ok(v) => v,
            Err(_) => {
                let _ = cache::delete(&self.cache_dir, network, &rt.container_id, &rt.ifname);
                None
            }
        }
    }

    /// Upstream's `AddNetwork`: ADD of a single plugin configuration, cached like a list's.
    pub fn add_network(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<CniResult> {
        validate_attachment(&net.name, rt)?;
        let result = self.add_one(&net.name, &net.cni_version, &net.plugin, None, rt)?;
        self.cache_add(&net.name, &net.bytes, &result, rt)?;
        Ok(result)
    }

    /// Upstream's `CheckNetwork`: CHECK of a single plugin configuration against its cached result
    /// (refused below 0.4.0, code 1, and without a cached result, code 3).
    pub fn check_network(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<()> {
        if !version::at_least(&net.cni_version, "0.4.0") {
            return Err(Error::version(format!(
                "configuration version {:?} does not support the CHECK command",
                net.cni_version
            )));
        }
        let cached = self.check_prev_result(&net.name, &net.cni_version, rt)?;
        self.run_one(Command::Check, &net.name, &net.cni_version, &net.plugin, Some(cached), rt)
    }

    /// Upstream's `DelNetwork`: DEL of a single plugin configuration; the cache goes on success.
    pub fn del_network(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<()> {
        let cached = self.del_prev_result(&net.name, &net.cni_version, rt);
        self.run_one(Command::Del, &net.name, &net.cni_version, &net.plugin, cached, rt)?;
        let _ = cache::delete(&self.cache_dir, &net.name, &rt.container_id, &rt.ifname);
        Ok(())
    }

    /// Upstream's `ValidateNetwork`: the plugin speaks the configuration's version; returns the
    /// capabilities it enables, sorted.
    pub fn validate_network(&self, net: &NetworkConfig) -> Result<Vec<String>> {
        let info = self.get_version_info(&net.plugin.plugin_type)?;
        if !info.supports(&net.cni_version) {
            return Err(Error::version(format!(
                "plugin {} does not support config version {:?} (it supports [{}])",
                net.plugin.plugin_type,
                net.cni_version,
                info.supported_versions.join(", ")
            )));
        }
        Ok(net.plugin.capabilities.iter().filter(|(_, on)| **on).map(|(c, _)| c.clone()).collect())
    }

    /// Garbage-collect: DEL every cached attachment of this network that is not in `valid`
    /// (`None`: all of them), then, from 1.1.0 on, GC each plugin. Keeps going past failures and
    /// reports them all. Temporary cache files a killed writer left behind are removed first. A
    /// no-op with `disableGC`.
    pub fn gc_network_list(&self, list: &NetworkConfigList, valid: Option<&[Attachment]>) -> Result<()> {
        if list.disable_gc {
            return Ok(());
        }
        let mut errors = Errors::new();
        // Housekeeping of the cache itself: a directory that cannot be listed fails below too.
        let _ = cache::remove_stale_temp_files(&self.cache_dir);
        // As upstream, a cache that cannot be listed is no reason not to GC the plugins.
        let cached = cache::attachments(&self.cache_dir, "").unwrap_or_default();
        for entry in cached.into_iter().filter(|e| e.network_name == list.name) {
            let keep = valid
                .is_some_and(|v| v.iter().any(|a| a.container_id == entry.container_id && a.ifname == entry.ifname));
            if keep {
                continue;
            }
            let rt = RuntimeConf {
                container_id: entry.container_id.clone(),
                netns: entry.netns.clone(),
                ifname: entry.ifname.clone(),
                args: entry.cni_args.clone(),
                capability_args: entry.capability_args.clone(),
            };
            if let Err(e) = self.del_network_list(list, &rt) {
                errors.push(
                    e.context(format!("failed to delete stale attachment {} {}", entry.container_id, entry.ifname)),
                );
            }
        }
        if version::at_least(&list.cni_version, "1.1.0") {
            let mut inject = Map::new();
            inject.insert("name".into(), Value::String(list.name.clone()));
            inject.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
            if let Some(valid) = valid {
                let attachments = serde_json::to_value(valid)
                    .map_err(|e| Error::new(code::INTERNAL, format!("encode valid attachments: {e}")))?;
                inject.insert("cni.dev/valid-attachments".into(), attachments.clone());
                // The spec-v1.1.0 tag's name for it (cni#1101); plugins may know either.
                inject.insert("cni.dev/attachments".into(), attachments);
            }
            let env = self.network_env(Command::Gc);
            for plugin in &list.plugins {
                let run = || -> Result<()> {
                    let path = self.find_plugin(&plugin.plugin_type)?;
                    let stdin = injected(plugin, &inject)?;
                    invoke::exec_without_result(&path, &stdin, &env, self.timeout)
                };
                if let Err(e) = run() {
                    errors.push(e.context(format!("{} failed (gc)", plugin.description())));
                }
            }
        }
        errors.finish()
    }

    /// STATUS of every plugin in order (1.1.0 on; earlier lists are always ready). The first
    /// failure is returned with its code (50, 51, ...).
    pub fn status_network_list(&self, list: &NetworkConfigList) -> Result<()> {
        if !version::at_least(&list.cni_version, "1.1.0") {
            return Ok(());
        }
        let mut inject = Map::new();
        inject.insert("name".into(), Value::String(list.name.clone()));
        inject.insert("cniVersion".into(), Value::String(list.cni_version.clone()));
        let env = self.network_env(Command::Status);
        for plugin in &list.plugins {
            let run = || -> Result<()> {
                let path = self.find_plugin(&plugin.plugin_type)?;
                let stdin = injected(plugin, &inject)?;
                invoke::exec_without_result(&path, &stdin, &env, self.timeout)
            };
            run().map_err(|e| e.context(format!("{} failed (status)", plugin.description())))?;
        }
        Ok(())
    }

    /// Ask every plugin for its versions; each must support the list's version ("" = 0.1.0).
    /// Returns the capabilities enabled anywhere in the list, sorted.
    pub fn validate_network_list(&self, list: &NetworkConfigList) -> Result<Vec<String>> {
        let mut errors = Errors::new();
        let mut caps = BTreeSet::new();
        for plugin in &list.plugins {
            let check = || -> Result<()> {
                let info = self.get_version_info(&plugin.plugin_type)?;
                if !info.supports(&list.cni_version) {
                    return Err(Error::version(format!(
                        "plugin {} does not support config version {:?} (it supports [{}])",
                        plugin.plugin_type,
                        list.cni_version,
                        info.supported_versions.join(", ")
                    )));
                }
                Ok(())
            };
            errors.record(check());
            caps.extend(plugin.capabilities.iter().filter(|(_, on)| **on).map(|(c, _)| c.clone()));
        }
        errors.finish()?;
        Ok(caps.into_iter().collect())
    }

    /// VERSION of the plugin `plugin_type`.
    pub fn get_version_info(&self, plugin_type: &str) -> Result<PluginInfo> {
        invoke::get_version_info(&self.find_plugin(plugin_type)?, self.timeout)
    }

    /// The cached ADD result of an attachment, converted to the list's version; None if not cached.
    pub fn get_cached_result(&self, list: &NetworkConfigList, rt: &RuntimeConf) -> Result<Option<CniResult>> {
        self.cached_result(&list.name, &list.cni_version, rt)
    }

    /// Upstream's `GetNetworkCachedResult`: the cached ADD result of a single plugin configuration's
    /// attachment, converted to its version; None if not cached.
    pub fn get_network_cached_result(&self, net: &NetworkConfig, rt: &RuntimeConf) -> Result<Option<CniResult>> {
        self.cached_result(&net.name, &net.cni_version, rt)
    }

    /// Upstream's `GetNetworkListCachedConfig`: the configuration bytes cached with the ADD, and `rt`
    /// with the cached CNI_ARGS and capability arguments. None if not cached; a legacy cache file
    /// (a bare result, no configuration) is an error, as upstream.
    pub fn get_network_list_cached_config(
        &self,
        list: &NetworkConfigList,
        rt: &RuntimeConf,
    ) -> Result<Option<(Vec<u8>, RuntimeConf)>> {
        self.cached_config(&list.name, rt)
    }

    /// Upstream's `GetNetworkCachedConfig`, for a single plugin configuration.
    pub fn get_network_cached_config(
        &self,
        net: &NetworkConfig,
        rt: &RuntimeConf,
    ) -> Result<Option<(Vec<u8>, RuntimeConf)>> {
        self.cached_config(&net.name, rt)
    }

    fn cached_config(&self, network: &str, rt: &RuntimeConf) -> Result<Option<(Vec<u8>, RuntimeConf)>> {
        let Some(entry) = cache::read(&self.cache_dir, network, &rt.container_id, &rt.ifname)? else {
            return Ok(None);
        };
        if entry.legacy {
            return Err(Error::decode(format!(
                "cached network {network:?} config has wrong kind: the cache file holds only a result"
            )));
        }
        let mut cached_rt = rt.clone();
        if !entry.cni_args.is_empty() {
            cached_rt.args = entry.cni_args;
        }
        cached_rt.capability_args = entry.capability_args;
        Ok(Some((entry.config, cached_rt)))
    }

    fn cached_result(&self, network: &str, cni_version: &str, rt: &RuntimeConf) -> Result<Option<CniResult>> {
        let Some(value) = self.cached_value(network, cni_version, rt)? else { return Ok(None) };
        CniResult::parse(&value, cni_version).map(Some)
    }

    /// The whole cache entry of an attachment (config bytes, args, capability args, result).
    pub fn get_cached_entry(&self, network: &str, rt: &RuntimeConf) -> Result<Option<CacheEntry>> {
        cache::read(&self.cache_dir, network, &rt.container_id, &rt.ifname)
    }

    /// Every cached attachment of `container_id` (all, if empty), in any network.
    pub fn get_cached_attachments(&self, container_id: &str) -> Result<Vec<CacheEntry>> {
        cache::attachments(&self.cache_dir, container_id)
    }

    /// The cached result JSON converted to `cni_version`.
    fn cached_value(&self, network: &str, cni_version: &str, rt: &RuntimeConf) -> Result<Option<Value>> {
        let Some(entry) = cache::read(&self.cache_dir, network, &rt.container_id, &rt.ifname)? else {
            return Ok(None);
        };
        let Some(result) = entry.result else { return Ok(None) };
        types::convert(&result, cni_version).map(Some)
    }
}

/// libcni validates these on ADD: container id (empty 3, bad 4), network name (7), ifname (4).
fn validate_attachment(network: &str, rt: &RuntimeConf) -> Result<()> {
    if rt.container_id.is_empty() {
        return Err(Error::new(code::UNKNOWN_CONTAINER, "missing container ID"));
    }
    if !valid_name(&rt.container_id) {
        return Err(Error::env(format!(
            "invalid container ID {:?}: use letters, digits, '_', '.' and '-', starting with a letter or digit",
            rt.container_id
        )));
    }
    if network.is_empty() || !valid_name(network) {
        return Err(Error::config(format!("invalid network name {network:?}")));
    }
    validate_ifname(&rt.ifname)
}

/// A plugin object with `inject` keys set over it, as JSON bytes (keys sorted). `capabilities` is
/// the runtime's to read and never reaches the plugin (the spec: it must not be set in what a plugin
/// gets; upstream libcni forwards it). Go matches it in any case, so every spelling is removed.
fn injected(plugin: &PluginConf, inject: &Map<String, Value>) -> Result<Vec<u8>> {
    let mut obj = plugin.raw.clone();
    obj.retain(|k, _| !k.eq_ignore_ascii_case("capabilities"));
    for (k, v) in inject {
        obj.insert(k.clone(), v.clone());
    }
    serde_json::to_vec(&Value::Object(obj))
        .map_err(|e| Error::new(code::INTERNAL, format!("encode plugin configuration: {e}")))
}

/// What one plugin gets on ADD, CHECK and DEL: its object (without `capabilities`) plus the list's
/// `name` and `cniVersion`, `prevResult` when there is one, and `runtimeConfig` made of the capability
/// arguments for the capabilities it enables (replacing any `runtimeConfig` it had; left alone when
/// none apply).
pub fn plugin_stdin(
    list: &NetworkConfigList,
    plugin: &PluginConf,
    prev_result: Option<Value>,
    rt: &RuntimeConf,
) -> Result<Vec<u8>> {
    stdin_for(&list.name, &list.cni_version, plugin, prev_result, rt)
}

fn stdin_for(
    name: &str,
    cni_version: &str,
    plugin: &PluginConf,
    prev_result: Option<Value>,
    rt: &RuntimeConf,
) -> Result<Vec<u8>> {
    let mut inject = Map::new();
    inject.insert("name".into(), Value::String(name.to_string()));
    inject.insert("cniVersion".into(), Value::String(cni_version.to_string()));
    if let Some(prev) = prev_result {
        inject.insert("prevResult".into(), prev);
    }
    let runtime_config: Map<String, Value> = plugin
        .capabilities
        .iter()
        .filter(|(_, on)| **on)
        .filter_map(|(cap, _)| rt.capability_args.get(cap).map(|v| (cap.clone(), v.clone())))
        .collect();
    if !runtime_config.is_empty() {
        inject.insert("runtimeConfig".into(), Value::Object(runtime_config));
    }
    injected(plugin, &inject)
}
