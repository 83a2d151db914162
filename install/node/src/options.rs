//! Command-line flags of `cni-rs-node`.

use ipnetwork::IpNetwork;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: cni-rs-node [options]
  --node-name NAME        this node's name                  (default $NODE_NAME)
  --datastore MODE        kubernetes (Node.spec.podCIDRs) or etcd (leased blocks)
                          (default: etcd when --etcd-endpoints is given, else kubernetes)
  --kubeconfig PATH       kubernetes: a kubeconfig instead of the in-cluster service account
  --etcd-endpoints LIST   etcd client URLs, comma-separated (e.g. http://10.95.0.1:2379)
  --prefix PREFIX         etcd key prefix                    (default /cni-rs)
  --cluster-cidr LIST     the cluster's pod range, one per family (e.g. 10.244.0.0/16,fd00:10:244::/56)
  --node-cidr-size LIST   prefix length of each node's block, by position (default 24 for IPv4, 64 for IPv6)
  --node-ip LIST          this node's address per family, as the other nodes reach it
                          (default: the address of the interface of that family's default route)
  --lease-ttl SECONDS     TTL of the node's lease on its block (default 60)
  --backend MODE          host-gw, vxlan, wireguard or auto  (default auto)
                          host-gw: routes via the other nodes' addresses (one subnet, pods' MTU
                          the underlay's); vxlan: IPv4 VXLAN carrying both families (MTU - 50);
                          wireguard: encrypted, one peer per node over UDP (MTU - 60 on an IPv4
                          underlay, - 80 on IPv6); auto: host-gw to nodes on this subnet, else vxlan
  --vxlan-dev NAME        the VXLAN device                   (default cni-rs.1)
  --wireguard-dev NAME    the WireGuard device               (default cni-rs.wg)
  --wireguard-port PORT   WireGuard's UDP port               (default 51820)
  --wireguard-keepalive SECONDS
                          persistent keepalive to each peer  (default 0: off)
  --state-dir DIR         where the WireGuard private key is kept (default /var/lib/cni-rs)
  --metrics-addr ADDR     /healthz and /metrics              (default 127.0.0.1:9901)
  --src DIR               plugin binaries to install         (default /opt/cni-rs/bin)
  --no-plugins            install no plugins, only write the conflist
  --bin-dir DIR           host CNI binary directory          (default /host/opt/cni/bin)
  --conf-dir DIR          host CNI configuration directory   (default /host/etc/cni/net.d)
  --template FILE         conflist template                  (default: built in)
  --conf-name NAME        conflist file name in conf-dir     (default 10-cni-rs.conflist)
  --sysctls-only          set the node's sysctls the pods need (forwarding, bridge netfilter) and
                          exit, failing when forwarding cannot be set: the DaemonSet's privileged
                          init container (needs only --cluster-cidr)";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Datastore {
    Etcd,
    Kubernetes,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    HostGw,
    Vxlan,
    Wireguard,
    Auto,
}

#[derive(Debug, Clone)]
pub struct Options {
    pub node_name: String,
    pub datastore: Datastore,
    pub kubeconfig: Option<PathBuf>,
    pub etcd_endpoints: Vec<String>,
    pub prefix: String,
    /// (cluster range, node block prefix length), one per family, in the order given.
    pub cluster: Vec<(IpNetwork, u8)>,
    pub node_ips: Vec<IpAddr>,
    pub lease_ttl: i64,
    pub backend: Backend,
    pub vxlan_dev: String,
    pub wireguard_dev: String,
    pub wireguard_port: u16,
    /// Seconds; 0 is off.
    pub wireguard_keepalive: u16,
    pub state_dir: PathBuf,
    pub metrics_addr: SocketAddr,
    pub src: Option<PathBuf>,
    pub bin_dir: PathBuf,
    pub conf_dir: PathBuf,
    pub template: Option<PathBuf>,
    pub conf_name: String,
    /// Set the sysctls and exit (the init container); no node name needed.
    pub sysctls_only: bool,
}

fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn interface_name(flag: &str, value: String) -> Result<String, String> {
    if value.is_empty()
        || value.len() > 15
        || value == "."
        || value == ".."
        || value.contains('/')
        || value.contains(char::is_whitespace)
    {
        return Err(format!("{flag} {value:?} is not a valid interface name (1-15 characters, no '/' or spaces)"));
    }
    Ok(value)
}

/// A network with no host bits set.
pub fn parse_network(flag: &str, text: &str) -> Result<IpNetwork, String> {
    let net: IpNetwork = text.parse().map_err(|e| format!("{flag}: {text:?} is not a CIDR: {e}"))?;
    if net.network() != net.ip() {
        return Err(format!("{flag}: {text} has host bits set (use {}/{})", net.network(), net.prefix()));
    }
    Ok(net)
}

impl Options {
    pub fn parse(
        args: impl IntoIterator<Item = String>,
        node_name_env: Option<String>,
    ) -> Result<Option<Options>, String> {
        let mut node_name = node_name_env.filter(|n| !n.is_empty());
        let mut endpoints = Vec::new();
        let mut datastore = None;
        let mut kubeconfig = None;
        let mut prefix = "/cni-rs".to_string();
        let mut cluster_text = None;
        let mut sizes_text = None;
        let mut node_ips = Vec::new();
        let mut lease_ttl = 60;
        let mut backend = Backend::Auto;
        let mut vxlan_dev = "cni-rs.1".to_string();
        let mut wireguard_dev = "cni-rs.wg".to_string();
        let mut wireguard_port = 51820;
        let mut wireguard_keepalive = 0;
        let mut state_dir = PathBuf::from("/var/lib/cni-rs");
        let mut metrics_addr: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 9901));
        let mut src = Some(PathBuf::from("/opt/cni-rs/bin"));
        let mut bin_dir = PathBuf::from("/host/opt/cni/bin");
        let mut conf_dir = PathBuf::from("/host/etc/cni/net.d");
        let mut template = None;
        let mut conf_name = "10-cni-rs.conflist".to_string();
        let mut sysctls_only = false;

        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value.to_string())),
                _ => (arg.clone(), None),
            };
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--no-plugins" if inline.is_none() => {
                    src = None;
                    continue;
                }
                "--sysctls-only" if inline.is_none() => {
                    sysctls_only = true;
                    continue;
                }
                _ => {}
            }
            let value = match inline {
                Some(value) => value,
                None => args.next().ok_or_else(|| format!("{flag} needs a value"))?,
            };
            match flag.as_str() {
                "--node-name" => node_name = Some(value),
                "--datastore" => {
                    datastore = Some(match value.as_str() {
                        "etcd" => Datastore::Etcd,
                        "kubernetes" => Datastore::Kubernetes,
                        _ => return Err(format!("--datastore {value:?}: use kubernetes or etcd")),
                    })
                }
                "--kubeconfig" => kubeconfig = Some(PathBuf::from(value)),
                "--etcd-endpoints" => endpoints = list(&value).map(String::from).collect(),
                "--prefix" => prefix = value.trim_end_matches('/').to_string(),
                "--cluster-cidr" => cluster_text = Some(value),
                "--node-cidr-size" => sizes_text = Some(value),
                "--node-ip" => {
                    node_ips = list(&value)
                        .map(|ip| ip.parse::<IpAddr>().map_err(|e| format!("--node-ip: {ip:?}: {e}")))
                        .collect::<Result<_, _>>()?
                }
                "--lease-ttl" => {
                    lease_ttl = value
                        .parse::<i64>()
                        .ok()
                        .filter(|t| (5..=86400).contains(t))
                        .ok_or_else(|| format!("--lease-ttl {value:?}: give whole seconds from 5 to 86400"))?
                }
                "--backend" => {
                    backend = match value.as_str() {
                        "host-gw" => Backend::HostGw,
                        "vxlan" => Backend::Vxlan,
                        "wireguard" => Backend::Wireguard,
                        "auto" => Backend::Auto,
                        _ => return Err(format!("--backend {value:?}: use host-gw, vxlan, wireguard or auto")),
                    }
                }
                "--vxlan-dev" => vxlan_dev = interface_name("--vxlan-dev", value)?,
                "--wireguard-dev" => wireguard_dev = interface_name("--wireguard-dev", value)?,
                "--wireguard-keepalive" => {
                    wireguard_keepalive = value.parse::<u16>().map_err(|_| {
                        format!("--wireguard-keepalive {value:?}: give whole seconds from 0 (off) to 65535")
                    })?
                }
                "--wireguard-port" => {
                    wireguard_port = value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| format!("--wireguard-port {value:?}: give a UDP port from 1 to 65535"))?
                }
                "--state-dir" => {
                    if !value.starts_with('/') {
                        return Err(format!("--state-dir {value:?} must be an absolute path"));
                    }
                    state_dir = value.into()
                }
                "--metrics-addr" => {
                    metrics_addr =
                        value.parse().map_err(|e| format!("--metrics-addr {value:?}: {e} (use ADDRESS:PORT)"))?
                }
                "--src" => src = Some(value.into()),
                "--bin-dir" => bin_dir = value.into(),
                "--conf-dir" => conf_dir = value.into(),
                "--template" => template = Some(value.into()),
                "--conf-name" => {
                    if value.is_empty() || value == "." || value == ".." || value.contains('/') {
                        return Err(format!("--conf-name {value:?} is not a plain file name"));
                    }
                    conf_name = value
                }
                _ => return Err(format!("unknown argument {arg:?}")),
            }
        }

        let node_name = match node_name {
            Some(name) => name,
            None if sysctls_only => String::new(),
            None => return Err("no node name: give --node-name or set NODE_NAME".into()),
        };
        if node_name.contains('/') || node_name.contains(char::is_whitespace) {
            return Err(format!("--node-name {node_name:?} may not contain '/' or spaces"));
        }
        let datastore = datastore.unwrap_or(if endpoints.is_empty() { Datastore::Kubernetes } else { Datastore::Etcd });
        if datastore == Datastore::Etcd && endpoints.is_empty() {
            return Err("--datastore etcd needs --etcd-endpoints (e.g. http://10.95.0.1:2379)".into());
        }
        if !prefix.starts_with('/') {
            return Err(format!("--prefix {prefix:?} must start with '/'"));
        }
        let cluster_text = cluster_text.ok_or("--cluster-cidr is required (e.g. 10.244.0.0/16)")?;
        let nets: Vec<IpNetwork> =
            list(&cluster_text).map(|t| parse_network("--cluster-cidr", t)).collect::<Result<_, _>>()?;
        if nets.is_empty() || nets.len() > 2 || (nets.len() == 2 && nets[0].is_ipv4() == nets[1].is_ipv4()) {
            return Err(format!("--cluster-cidr {cluster_text:?}: give one range, or one IPv4 and one IPv6"));
        }
        let sizes: Vec<u8> = match &sizes_text {
            Some(text) => list(text)
                .map(|s| s.parse::<u8>().map_err(|e| format!("--node-cidr-size {s:?}: {e}")))
                .collect::<Result<_, _>>()?,
            None => nets.iter().map(|n| if n.is_ipv4() { 24 } else { 64 }).collect(),
        };
        if sizes.len() != nets.len() {
            return Err(format!("--node-cidr-size gives {} sizes for {} cluster CIDRs", sizes.len(), nets.len()));
        }
        let mut cluster = Vec::new();
        for (net, size) in nets.into_iter().zip(sizes) {
            let max = if net.is_ipv4() { 30 } else { 126 };
            if size < net.prefix() || size > max {
                return Err(format!("--node-cidr-size {size} for {net}: must be between {} and {max}", net.prefix()));
            }
            cluster.push((net, size));
        }
        if backend == Backend::Wireguard && wireguard_dev == vxlan_dev {
            return Err(format!("--wireguard-dev {wireguard_dev:?} is also --vxlan-dev; give them different names"));
        }
        if node_ips.len() > 2 || (node_ips.len() == 2 && node_ips[0].is_ipv4() == node_ips[1].is_ipv4()) {
            return Err("--node-ip: give one address, or one IPv4 and one IPv6".into());
        }
        Ok(Some(Options {
            node_name,
            datastore,
            kubeconfig,
            etcd_endpoints: endpoints,
            prefix,
            cluster,
            node_ips,
            lease_ttl,
            backend,
            vxlan_dev,
            wireguard_dev,
            wireguard_port,
            wireguard_keepalive,
            state_dir,
            metrics_addr,
            src,
            bin_dir,
            conf_dir,
            template,
            conf_name,
            sysctls_only,
        }))
    }

    pub fn node_ip(&self, v4: bool) -> Option<IpAddr> {
        self.node_ips.iter().copied().find(|ip| ip.is_ipv4() == v4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Option<Options>, String> {
        Options::parse(list.iter().map(|s| s.to_string()), None)
    }

    const BASE: [&str; 8] = [
        "--node-name",
        "n1",
        "--etcd-endpoints",
        "http://127.0.0.1:2379",
        "--cluster-cidr",
        "10.244.0.0/16,fd00:10:244::/56",
        "--node-ip",
        "10.95.0.11",
    ];

    #[test]
    fn parses_and_defaults() {
        let o = parse(&BASE).unwrap().unwrap();
        assert_eq!(o.cluster[0], ("10.244.0.0/16".parse().unwrap(), 24));
        assert_eq!(o.cluster[1], ("fd00:10:244::/56".parse().unwrap(), 64));
        assert_eq!(o.prefix, "/cni-rs");
        assert_eq!(o.lease_ttl, 60);
        assert_eq!(o.backend, Backend::Auto);
        assert_eq!(o.metrics_addr.to_string(), "127.0.0.1:9901");
        assert_eq!(o.wireguard_port, 51820);
        assert_eq!((o.wireguard_dev.as_str(), o.wireguard_keepalive), ("cni-rs.wg", 0));
        assert_eq!(o.state_dir, PathBuf::from("/var/lib/cni-rs"));
        let mut args = BASE.to_vec();
        args.extend(["--node-cidr-size=26,80", "--backend", "vxlan", "--no-plugins", "--prefix", "/x/"]);
        let o = parse(&args).unwrap().unwrap();
        assert_eq!(o.cluster[0].1, 26);
        assert_eq!(o.cluster[1].1, 80);
        assert_eq!(o.backend, Backend::Vxlan);
        assert!(o.src.is_none());
        assert_eq!(o.prefix, "/x");
        let mut args = BASE.to_vec();
        args.extend([
            "--backend=wireguard",
            "--wireguard-port",
            "51999",
            "--wireguard-dev",
            "wg0",
            "--wireguard-keepalive=25",
            "--state-dir",
            "/run/x",
        ]);
        let o = parse(&args).unwrap().unwrap();
        assert_eq!(o.backend, Backend::Wireguard);
        assert_eq!((o.wireguard_dev.as_str(), o.wireguard_port, o.wireguard_keepalive), ("wg0", 51999, 25));
        assert_eq!(o.state_dir, PathBuf::from("/run/x"));
    }

    #[test]
    fn rejects_bad_flags() {
        for (extra, why) in [
            (&["--cluster-cidr", "10.244.0.1/16"][..], "host bits"),
            (&["--node-cidr-size", "8,64"][..], "must be between"),
            (&["--node-cidr-size", "24"][..], "gives 1 sizes for 2"),
            (&["--backend", "bgp"][..], "use host-gw"),
            (&["--lease-ttl", "1"][..], "from 5"),
            (&["--datastore", "consul"][..], "use kubernetes or etcd"),
            (&["--node-ip", "10.0.0.1,10.0.0.2"][..], "one IPv4 and one IPv6"),
            (&["--wireguard-port", "0"][..], "from 1 to 65535"),
            (&["--wireguard-port", "70000"][..], "from 1 to 65535"),
            (&["--vxlan-dev", "a/b"][..], "not a valid interface name"),
            (&["--vxlan-dev", ".."][..], "not a valid interface name"),
            (&["--wireguard-keepalive", "-1"][..], "from 0 (off)"),
            (&["--wireguard-dev", "a/b"][..], "not a valid interface name"),
            (&["--backend", "wireguard", "--wireguard-dev", "x", "--vxlan-dev", "x"][..], "different names"),
            (&["--state-dir", "var/lib"][..], "absolute path"),
        ] {
            let mut args = BASE.to_vec();
            args.extend_from_slice(extra);
            let err = parse(&args).unwrap_err();
            assert!(err.contains(why), "{extra:?}: {err}");
        }
        assert!(parse(&BASE[2..]).unwrap_err().contains("no node name"));
        let init = parse(&["--sysctls-only", "--cluster-cidr=10.244.0.0/16"]).unwrap().unwrap();
        assert!(init.sysctls_only && init.node_name.is_empty());
    }
}
