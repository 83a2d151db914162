//! Command-line flags of `cni-rs-node`.

use anyhow::{anyhow, Result};
use ipnetwork::IpNetwork;
use netkit::Family;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

pub const USAGE: &str = "\
usage: cni-rs-node [options]
  --node-name NAME        this node's name                  (default $NODE_NAME)
  --datastore MODE        kubernetes (Node.spec.podCIDRs) or etcd (leased blocks)
                          (default: etcd when --etcd-endpoints is given, else kubernetes)
  --kubeconfig PATH       kubernetes: a kubeconfig instead of the in-cluster service account
  --etcd-endpoints LIST   etcd client URLs, comma-separated (e.g. http://10.95.0.1:2379)
  --etcd-cafile FILE      TLS to etcd: the CA certificate (PEM) that signed etcd's server
                          certificate, the only one trusted (there is no system trust store);
                          needed by https:// endpoints, and every endpoint must be https://
  --etcd-certfile FILE    client certificate (PEM) for an etcd with --client-cert-auth, with
  --etcd-keyfile FILE     its private key (PEM): both or neither, and with --etcd-cafile
  --etcd-username USER    etcd user, for an etcd with auth enabled; with --etcd-password-file
  --etcd-password-file FILE
                          file holding that user's password (one trailing newline is dropped);
                          never a flag's value, since any process on the host can read a
                          command line (/proc/PID/cmdline)
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
  --network-policy BOOL   kubernetes: enforce NetworkPolicies (default true); false removes the
                          agent's policy table and filters nothing
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
    /// TLS to etcd (--etcd-cafile, --etcd-certfile, --etcd-keyfile), read while parsing.
    pub etcd_tls: Option<EtcdTls>,
    /// etcd's user/password authentication (--etcd-username, --etcd-password-file).
    pub etcd_user: Option<EtcdUser>,
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
    /// Enforce NetworkPolicies (Kubernetes datastore only).
    pub network_policy: bool,
    /// Set the sysctls and exit (the init container); no node name needed.
    pub sysctls_only: bool,
}

fn list(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn interface_name(flag: &str, value: String) -> Result<String> {
    if value.is_empty()
        || value.len() > 15
        || value == "."
        || value == ".."
        || value.contains('/')
        || value.contains(char::is_whitespace)
    {
        return Err(anyhow!("{flag} {value:?} is not a valid interface name (1-15 characters, no '/' or spaces)"));
    }
    Ok(value)
}

/// A network with no host bits set.
pub fn parse_network(flag: &str, text: &str) -> Result<IpNetwork> {
    let net: IpNetwork = text.parse().map_err(|e| anyhow!("{flag}: {text:?} is not a CIDR: {e}"))?;
    if net.network() != net.ip() {
        return Err(anyhow!("{flag}: {text} has host bits set (use {}/{})", net.network(), net.prefix()));
    }
    Ok(net)
}

/// The PEM files of --etcd-cafile and, for a client certificate, --etcd-certfile and
/// --etcd-keyfile. Debug names the files, never the key.
#[derive(Clone)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub ca: Vec<u8>,
    /// (certificate, private key)
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_file", &self.ca_file)
            .field("client_certificate", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

/// An etcd user and the password read from --etcd-password-file. Debug leaves the password out.
#[derive(Clone)]
pub struct EtcdUser {
    pub name: String,
    pub password: String,
}

impl fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdUser").field("name", &self.name).finish_non_exhaustive()
    }
}

/// The contents of `flag`'s file, which must hold a PEM block whose label ends in `label`
/// (`CERTIFICATE`, `PRIVATE KEY`).
fn read_pem(flag: &str, path: &Path, label: &str) -> Result<Vec<u8>> {
    let pem = std::fs::read(path).map_err(|e| anyhow!("{flag} {}: cannot read it: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&pem);
    let found = text.lines().any(|l| l.starts_with("-----BEGIN ") && l.trim_end().ends_with(&format!("{label}-----")));
    if !found {
        return Err(anyhow!("{flag} {}: holds no PEM {label} (a \"-----BEGIN ...{label}-----\" line)", path.display()));
    }
    Ok(pem)
}

/// Checks the etcd TLS and authentication flags against the endpoints and reads their files.
fn etcd_security(
    datastore: Datastore,
    endpoints: &[String],
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    username: Option<String>,
    password_file: Option<PathBuf>,
) -> Result<(Option<EtcdTls>, Option<EtcdUser>)> {
    let given = [
        ("--etcd-cafile", ca_file.is_some()),
        ("--etcd-certfile", cert_file.is_some()),
        ("--etcd-keyfile", key_file.is_some()),
        ("--etcd-username", username.is_some()),
        ("--etcd-password-file", password_file.is_some()),
    ];
    if datastore != Datastore::Etcd {
        if let Some((flag, _)) = given.iter().find(|(_, set)| *set) {
            return Err(anyhow!("{flag} is for the etcd datastore; --datastore kubernetes does not use it"));
        }
        return Ok((None, None));
    }
    let tls = match (ca_file, cert_file, key_file) {
        (_, Some(_), None) => {
            return Err(anyhow!("--etcd-certfile needs --etcd-keyfile (the client certificate's private key)"))
        }
        (_, None, Some(_)) => {
            return Err(anyhow!("--etcd-keyfile needs --etcd-certfile (the client certificate of that key)"))
        }
        (None, Some(_), Some(_)) => {
            return Err(anyhow!(
                "--etcd-certfile needs --etcd-cafile too (the CA that signed etcd's server certificate)"
            ))
        }
        (None, None, None) => None,
        (Some(ca_file), cert_file, key_file) => {
            let ca = read_pem("--etcd-cafile", &ca_file, "CERTIFICATE")?;
            let client = match (cert_file, key_file) {
                (Some(cert), Some(key)) => Some((
                    read_pem("--etcd-certfile", &cert, "CERTIFICATE")?,
                    read_pem("--etcd-keyfile", &key, "PRIVATE KEY")?,
                )),
                _ => None,
            };
            Some(EtcdTls { ca_file, ca, client })
        }
    };
    for endpoint in endpoints {
        let https = endpoint.starts_with("https://");
        if tls.is_some() && !https {
            let host = endpoint.strip_prefix("http://").unwrap_or(endpoint);
            return Err(anyhow!(
                "--etcd-endpoints {endpoint}: --etcd-cafile means TLS, which needs https:// endpoints \
                 (write https://{host}, the URL etcd's --listen-client-urls serves TLS on)"
            ));
        }
        if tls.is_none() && https {
            return Err(anyhow!(
                "--etcd-endpoints {endpoint} needs --etcd-cafile FILE: the CA certificate that signed etcd's \
                 server certificate (kubeadm's is /etc/kubernetes/pki/etcd/ca.crt); no other CA is trusted"
            ));
        }
    }
    let user = match (username, password_file) {
        (None, None) => None,
        (Some(_), None) => {
            return Err(anyhow!("--etcd-username needs --etcd-password-file (a file holding the user's password)"))
        }
        (None, Some(_)) => return Err(anyhow!("--etcd-password-file needs --etcd-username (the user it is for)")),
        (Some(name), Some(path)) => {
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(anyhow!("--etcd-username {name:?}: give a user name without spaces"));
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|e| anyhow!("--etcd-password-file {}: cannot read it: {e}", path.display()))?;
            let password = text.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p)).unwrap_or(&text);
            if password.is_empty() {
                return Err(anyhow!(
                    "--etcd-password-file {} is empty; write the password of {name} in it",
                    path.display()
                ));
            }
            Some(EtcdUser { name, password: password.to_string() })
        }
    };
    Ok((tls, user))
}

impl Options {
    pub fn parse(args: impl IntoIterator<Item = String>, node_name_env: Option<String>) -> Result<Option<Options>> {
        let mut node_name = node_name_env.filter(|n| !n.is_empty());
        let mut endpoints = Vec::new();
        let mut datastore = None;
        let mut kubeconfig = None;
        let (mut etcd_ca_file, mut etcd_cert_file, mut etcd_key_file) = (None, None, None);
        let (mut etcd_username, mut etcd_password_file) = (None, None);
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
        let mut network_policy = true;
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
                None => args.next().ok_or_else(|| anyhow!("{flag} needs a value"))?,
            };
            match flag.as_str() {
                "--node-name" => node_name = Some(value),
                "--datastore" => {
                    datastore = Some(match value.as_str() {
                        "etcd" => Datastore::Etcd,
                        "kubernetes" => Datastore::Kubernetes,
                        _ => return Err(anyhow!("--datastore {value:?}: use kubernetes or etcd")),
                    })
                }
                "--kubeconfig" => kubeconfig = Some(PathBuf::from(value)),
                "--etcd-endpoints" => endpoints = list(&value).map(String::from).collect(),
                "--etcd-cafile" => etcd_ca_file = Some(PathBuf::from(value)),
                "--etcd-certfile" => etcd_cert_file = Some(PathBuf::from(value)),
                "--etcd-keyfile" => etcd_key_file = Some(PathBuf::from(value)),
                "--etcd-username" => etcd_username = Some(value),
                "--etcd-password-file" => etcd_password_file = Some(PathBuf::from(value)),
                "--prefix" => prefix = value.trim_end_matches('/').to_string(),
                "--cluster-cidr" => cluster_text = Some(value),
                "--node-cidr-size" => sizes_text = Some(value),
                "--node-ip" => {
                    node_ips = list(&value)
                        .map(|ip| ip.parse::<IpAddr>().map_err(|e| anyhow!("--node-ip: {ip:?}: {e}")))
                        .collect::<Result<_, _>>()?
                }
                "--lease-ttl" => {
                    lease_ttl = value
                        .parse::<i64>()
                        .ok()
                        .filter(|t| (5..=86400).contains(t))
                        .ok_or_else(|| anyhow!("--lease-ttl {value:?}: give whole seconds from 5 to 86400"))?
                }
                "--backend" => {
                    backend = match value.as_str() {
                        "host-gw" => Backend::HostGw,
                        "vxlan" => Backend::Vxlan,
                        "wireguard" => Backend::Wireguard,
                        "auto" => Backend::Auto,
                        _ => return Err(anyhow!("--backend {value:?}: use host-gw, vxlan, wireguard or auto")),
                    }
                }
                "--vxlan-dev" => vxlan_dev = interface_name("--vxlan-dev", value)?,
                "--wireguard-dev" => wireguard_dev = interface_name("--wireguard-dev", value)?,
                "--wireguard-keepalive" => {
                    wireguard_keepalive = value.parse::<u16>().map_err(|_| {
                        anyhow!("--wireguard-keepalive {value:?}: give whole seconds from 0 (off) to 65535")
                    })?
                }
                "--wireguard-port" => {
                    wireguard_port = value
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0)
                        .ok_or_else(|| anyhow!("--wireguard-port {value:?}: give a UDP port from 1 to 65535"))?
                }
                "--state-dir" => {
                    if !value.starts_with('/') {
                        return Err(anyhow!("--state-dir {value:?} must be an absolute path"));
                    }
                    state_dir = value.into()
                }
                "--metrics-addr" => {
                    metrics_addr =
                        value.parse().map_err(|e| anyhow!("--metrics-addr {value:?}: {e} (use ADDRESS:PORT)"))?
                }
                "--network-policy" => {
                    network_policy = match value.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(anyhow!("--network-policy {value:?}: use true or false")),
                    }
                }
                "--src" => src = Some(value.into()),
                "--bin-dir" => bin_dir = value.into(),
                "--conf-dir" => conf_dir = value.into(),
                "--template" => template = Some(value.into()),
                "--conf-name" => {
                    if value.is_empty() || value == "." || value == ".." || value.contains('/') {
                        return Err(anyhow!("--conf-name {value:?} is not a plain file name"));
                    }
                    conf_name = value
                }
                _ => return Err(anyhow!("unknown argument {arg:?}")),
            }
        }

        let node_name = match node_name {
            Some(name) => name,
            None if sysctls_only => String::new(),
            None => return Err(anyhow!("no node name: give --node-name or set NODE_NAME")),
        };
        if node_name.contains('/') || node_name.contains(char::is_whitespace) {
            return Err(anyhow!("--node-name {node_name:?} may not contain '/' or spaces"));
        }
        let datastore = datastore.unwrap_or(if endpoints.is_empty() { Datastore::Kubernetes } else { Datastore::Etcd });
        if datastore == Datastore::Etcd && endpoints.is_empty() {
            return Err(anyhow!("--datastore etcd needs --etcd-endpoints (e.g. http://10.95.0.1:2379)"));
        }
        let (etcd_tls, etcd_user) = etcd_security(
            datastore,
            &endpoints,
            etcd_ca_file,
            etcd_cert_file,
            etcd_key_file,
            etcd_username,
            etcd_password_file,
        )?;
        if !prefix.starts_with('/') {
            return Err(anyhow!("--prefix {prefix:?} must start with '/'"));
        }
        let cluster_text = cluster_text.ok_or_else(|| anyhow!("--cluster-cidr is required (e.g. 10.244.0.0/16)"))?;
        let nets: Vec<IpNetwork> =
            list(&cluster_text).map(|t| parse_network("--cluster-cidr", t)).collect::<Result<_, _>>()?;
        if nets.is_empty() || nets.len() > 2 || (nets.len() == 2 && nets[0].is_ipv4() == nets[1].is_ipv4()) {
            return Err(anyhow!("--cluster-cidr {cluster_text:?}: give one range, or one IPv4 and one IPv6"));
        }
        let sizes: Vec<u8> = match &sizes_text {
            Some(text) => list(text)
                .map(|s| s.parse::<u8>().map_err(|e| anyhow!("--node-cidr-size {s:?}: {e}")))
                .collect::<Result<_, _>>()?,
            None => nets.iter().map(|n| if n.is_ipv4() { 24 } else { 64 }).collect(),
        };
        if sizes.len() != nets.len() {
            return Err(anyhow!("--node-cidr-size gives {} sizes for {} cluster CIDRs", sizes.len(), nets.len()));
        }
        let mut cluster = Vec::new();
        for (net, size) in nets.into_iter().zip(sizes) {
            let max = if net.is_ipv4() { 30 } else { 126 };
            if size < net.prefix() || size > max {
                return Err(anyhow!("--node-cidr-size {size} for {net}: must be between {} and {max}", net.prefix()));
            }
            cluster.push((net, size));
        }
        if backend == Backend::Wireguard && wireguard_dev == vxlan_dev {
            return Err(anyhow!("--wireguard-dev {wireguard_dev:?} is also --vxlan-dev; give them different names"));
        }
        if node_ips.len() > 2 || (node_ips.len() == 2 && node_ips[0].is_ipv4() == node_ips[1].is_ipv4()) {
            return Err(anyhow!("--node-ip: give one address, or one IPv4 and one IPv6"));
        }
        Ok(Some(Options {
            node_name,
            datastore,
            kubeconfig,
            etcd_endpoints: endpoints,
            etcd_tls,
            etcd_user,
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
            network_policy,
            sysctls_only,
        }))
    }

    /// The node address of `family`, if it has one.
    pub fn node_ip(&self, family: Family) -> Option<IpAddr> {
        self.node_ips.iter().copied().find(|ip| Family::of(ip) == family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<Option<Options>> {
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
        assert!(o.network_policy);
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
            "--network-policy=false",
        ]);
        let o = parse(&args).unwrap().unwrap();
        assert_eq!(o.backend, Backend::Wireguard);
        assert_eq!((o.wireguard_dev.as_str(), o.wireguard_port, o.wireguard_keepalive), ("wg0", 51999, 25));
        assert_eq!(o.state_dir, PathBuf::from("/run/x"));
        assert!(!o.network_policy);
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
            (&["--network-policy", "yes"][..], "use true or false"),
        ] {
            let mut args = BASE.to_vec();
            args.extend_from_slice(extra);
            let err = parse(&args).unwrap_err();
            assert!(err.to_string().contains(why), "{extra:?}: {err}");
        }
        assert!(parse(&BASE[2..]).unwrap_err().to_string().contains("no node name"));
        let init = parse(&["--sysctls-only", "--cluster-cidr=10.244.0.0/16"]).unwrap().unwrap();
        assert!(init.sysctls_only && init.node_name.is_empty());
    }

    /// A directory of PEM-looking files and a password file for the etcd TLS and auth flags.
    struct Files(PathBuf);

    impl Files {
        fn new(label: &str) -> Files {
            let dir = std::env::temp_dir().join(format!("cni-rs-node-options-{label}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
            std::fs::write(dir.join("ca.pem"), cert).unwrap();
            std::fs::write(dir.join("client.pem"), cert).unwrap();
            std::fs::write(
                dir.join("client-key.pem"),
                "-----BEGIN EC PRIVATE KEY-----\nMHc\n-----END EC PRIVATE KEY-----\n",
            )
            .unwrap();
            std::fs::write(dir.join("password"), "s3cret pass\r\n").unwrap();
            std::fs::write(dir.join("empty"), "\n").unwrap();
            Files(dir)
        }

        fn path(&self, name: &str) -> String {
            self.0.join(name).to_str().unwrap().to_string()
        }

        /// BASE with `endpoint` and `extra`, each `@name` (also in `--flag=@name`) replaced by the
        /// path of file `name`.
        fn parse(&self, endpoint: &str, extra: &[&str]) -> Result<Option<Options>> {
            let mut args: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
            args[3] = endpoint.to_string();
            args.extend(extra.iter().map(|a| match a.split_once('@') {
                Some((flag, name)) => format!("{flag}{}", self.path(name)),
                None => a.to_string(),
            }));
            Options::parse(args, None)
        }
    }

    impl Drop for Files {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn etcd_tls_and_auth_flags_read_their_files() {
        let files = Files::new("ok");
        let o = files.parse("https://10.95.0.1:2379", &["--etcd-cafile", "@ca.pem"]).unwrap().unwrap();
        let tls = o.etcd_tls.unwrap();
        assert_eq!(tls.ca_file, files.0.join("ca.pem"));
        assert!(tls.ca.starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert!(tls.client.is_none() && o.etcd_user.is_none());
        let o = files
            .parse(
                "https://10.95.0.1:2379,https://10.95.0.2:2379",
                &[
                    "--etcd-cafile=@ca.pem",
                    "--etcd-certfile",
                    "@client.pem",
                    "--etcd-keyfile",
                    "@client-key.pem",
                    "--etcd-username",
                    "node-agent",
                    "--etcd-password-file",
                    "@password",
                ],
            )
            .unwrap()
            .unwrap();
        let (cert, key) = o.etcd_tls.as_ref().unwrap().client.clone().unwrap();
        assert!(cert.starts_with(b"-----BEGIN CERTIFICATE-----") && key.starts_with(b"-----BEGIN EC PRIVATE KEY-----"));
        let user = o.etcd_user.as_ref().unwrap();
        assert_eq!((user.name.as_str(), user.password.as_str()), ("node-agent", "s3cret pass"));
        // Neither the key nor the password is in what Debug shows.
        let shown = format!("{o:?}");
        assert!(!shown.contains("s3cret") && !shown.contains("MHc") && shown.contains("node-agent"), "{shown}");
        // A password with a space only, and no newline, is kept as it is.
        std::fs::write(files.0.join("password"), " ").unwrap();
        let o = files
            .parse("http://10.95.0.1:2379", &["--etcd-username", "u", "--etcd-password-file", "@password"])
            .unwrap()
            .unwrap();
        assert_eq!(o.etcd_user.unwrap().password, " ");
    }

    #[test]
    fn rejects_bad_etcd_tls_and_auth_flags() {
        let files = Files::new("bad");
        let https = "https://10.95.0.1:2379";
        let http = "http://10.95.0.1:2379";
        for (endpoint, extra, why) in [
            (
                https,
                &["--etcd-cafile", "@ca.pem", "--etcd-certfile", "@client.pem"][..],
                "--etcd-certfile needs --etcd-keyfile",
            ),
            (
                https,
                &["--etcd-cafile", "@ca.pem", "--etcd-keyfile", "@client-key.pem"][..],
                "--etcd-keyfile needs --etcd-certfile",
            ),
            (
                https,
                &["--etcd-certfile", "@client.pem", "--etcd-keyfile", "@client-key.pem"][..],
                "--etcd-certfile needs --etcd-cafile",
            ),
            (https, &["--etcd-cafile", "@missing.pem"][..], "missing.pem: cannot read it: No such file"),
            (https, &["--etcd-cafile", "@password"][..], "password: holds no PEM CERTIFICATE"),
            (
                https,
                &["--etcd-cafile", "@ca.pem", "--etcd-certfile", "@client.pem", "--etcd-keyfile", "@client.pem"][..],
                "--etcd-keyfile",
            ),
            (
                https,
                &[
                    "--etcd-cafile",
                    "@ca.pem",
                    "--etcd-certfile",
                    "@client-key.pem",
                    "--etcd-keyfile",
                    "@client-key.pem",
                ][..],
                "client-key.pem: holds no PEM CERTIFICATE",
            ),
            (https, &[][..], "https://10.95.0.1:2379 needs --etcd-cafile FILE"),
            (http, &["--etcd-cafile", "@ca.pem"][..], "needs https:// endpoints (write https://10.95.0.1:2379"),
            ("10.95.0.1:2379", &["--etcd-cafile", "@ca.pem"][..], "(write https://10.95.0.1:2379"),
            (http, &["--etcd-username", "u"][..], "--etcd-username needs --etcd-password-file"),
            (http, &["--etcd-password-file", "@password"][..], "--etcd-password-file needs --etcd-username"),
            (
                http,
                &["--etcd-username", "u", "--etcd-password-file", "@empty"][..],
                "is empty; write the password of u",
            ),
            (http, &["--etcd-username", "u", "--etcd-password-file", "@nope"][..], "nope: cannot read it"),
            (http, &["--etcd-username", "a b", "--etcd-password-file", "@password"][..], "without spaces"),
            (
                http,
                &["--datastore", "kubernetes", "--etcd-cafile", "@ca.pem"][..],
                "--etcd-cafile is for the etcd datastore",
            ),
        ] {
            let err = files.parse(endpoint, extra).unwrap_err();
            assert!(err.to_string().contains(why), "{endpoint} {extra:?}: {err}");
        }
        let err = files
            .parse(
                https,
                &["--etcd-cafile", "@ca.pem", "--etcd-certfile", "@client.pem", "--etcd-keyfile", "@client.pem"],
            )
            .unwrap_err();
        assert!(err.to_string().contains("holds no PEM PRIVATE KEY"), "{err}");
    }
}
