//! The etcd datastore: each node leases one block of the cluster range under `<prefix>/subnets/`.
//!
//! A block is a key `<prefix>/subnets/<first block with '/' as '-'>` (e.g.
//! `/cni-rs/subnets/10.244.3.0-24`) attached to the node's lease, so it disappears when the node
//! stops renewing. Block `i` is the `i`-th block of every configured family (IPv4 and IPv6 together),
//! so one key owns both. A block is taken with a transaction that puts the key only if its
//! `create_revision` is 0 (it does not exist): two nodes racing for one block cannot both win, and
//! the loser moves on to the next free block. A restarted node takes back the key whose value names
//! it only when that key is the block key of the value's blocks and no other believed record
//! overlaps them (a transaction on that key's `mod_revision`): a record anyone wrote naming this node
//! never makes it hand out another node's range.

use crate::options::Options;
use crate::trust::{self, Claim};
use anyhow::{anyhow, Result};
use etcd_client::{
    Certificate, Client, Compare, CompareOp, EventType, GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp,
    WatchOptions,
};
use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// What a node records in its block's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRecord {
    pub node: String,
    #[serde(rename = "nodeIPs")]
    pub node_ips: Vec<IpAddr>,
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Vec<IpNetwork>,
    /// The MAC of the node's VXLAN device, when it has one; its VTEP address is the network
    /// address of its IPv4 pod CIDR.
    #[serde(default, rename = "vtepMAC", skip_serializing_if = "Option::is_none")]
    pub vtep_mac: Option<String>,
    /// The node's WireGuard public key (base64) and UDP port, when it runs the WireGuard backend;
    /// its endpoint is its node address of the underlay's family with that port.
    #[serde(default, rename = "wireguardPublicKey", skip_serializing_if = "Option::is_none")]
    pub wireguard_key: Option<String>,
    #[serde(default, rename = "wireguardPort", skip_serializing_if = "Option::is_none")]
    pub wireguard_port: Option<u16>,
}

/// What this node tells the others beside its pod CIDRs and addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    pub vtep_mac: Option<String>,
    pub wireguard_key: Option<String>,
    pub wireguard_port: Option<u16>,
}

impl Published {
    pub fn record(&self, options: &Options, pod_cidrs: Vec<IpNetwork>) -> NodeRecord {
        NodeRecord {
            node: options.node_name.clone(),
            node_ips: options.node_ips.clone(),
            pod_cidrs,
            vtep_mac: self.vtep_mac.clone(),
            wireguard_key: self.wireguard_key.clone(),
            wireguard_port: self.wireguard_port,
        }
    }

    /// Whether `record` already says all of this.
    pub fn is_in(&self, record: &NodeRecord) -> bool {
        record.vtep_mac == self.vtep_mac
            && record.wireguard_key == self.wireguard_key
            && record.wireguard_port == self.wireguard_port
    }
}

/// The other nodes' records, by key, as last read from the datastore (not yet screened: see
/// [`trust::screen`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Peers {
    pub nodes: BTreeMap<String, Claim>,
    /// False until the first full list arrived.
    pub synced: bool,
}

/// The block this node holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: String,
    pub lease: i64,
    pub record: NodeRecord,
}

pub fn subnets_prefix(options: &Options) -> String {
    format!("{}/subnets/", options.prefix)
}

/// Number of blocks: the smallest count over the families (a block holds one of each).
pub fn block_count(options: &Options) -> u128 {
    options.cluster.iter().map(|(net, size)| 1u128 << u32::from(size - net.prefix()).min(100)).min().unwrap_or(0)
}

/// The `index`-th block of every family.
pub fn blocks(options: &Options, index: u128) -> Option<Vec<IpNetwork>> {
    options
        .cluster
        .iter()
        .map(|(net, size)| match net {
            IpNetwork::V4(v4) => {
                let step = 1u128 << (32 - u32::from(*size));
                let base = u128::from(u32::from(v4.network()));
                let addr = u32::try_from(base + index.checked_mul(step)?).ok()?;
                IpNetwork::new(IpAddr::V4(addr.into()), *size).ok()
            }
            IpNetwork::V6(v6) => {
                let step = 1u128.checked_shl(128 - u32::from(*size))?;
                let base = u128::from(v6.network());
                let addr = base.checked_add(index.checked_mul(step)?)?;
                IpNetwork::new(IpAddr::V6(addr.into()), *size).ok()
            }
        })
        .collect()
}

pub fn block_key(options: &Options, block: &IpNetwork) -> String {
    format!("{}{}-{}", subnets_prefix(options), block.network(), block.prefix())
}

/// A client for `--etcd-endpoints` with the TLS and user of the options, checked by counting
/// the keys under `<prefix>/subnets/` (the client connects lazily, and this is a read the agent
/// needs anyway): a certificate etcd refuses, an untrusted server or a wrong password is an error
/// here that says which flag to fix.
pub async fn connect(options: &Options) -> Result<Client> {
    let mut connect = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(10))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
    if let Some(tls) = &options.etcd_tls {
        let mut config = TlsOptions::new().ca_certificate(Certificate::from_pem(&tls.ca));
        if let Some((cert, key)) = &tls.client {
            config = config.identity(Identity::from_pem(cert, key));
        }
        connect = connect.with_tls(config);
    }
    if let Some(user) = &options.etcd_user {
        // etcd's tokens expire (--auth-token-ttl, 5 minutes by default); the agent runs for months.
        connect = connect.with_user(user.name.as_str(), user.password.as_str()).with_auto_token_refresh(true);
    }
    let endpoints = options.etcd_endpoints.join(",");
    let failed = |e: etcd_client::Error| anyhow!("connect to etcd {endpoints}: {}", explain(options, &e));
    let mut client = Client::connect(&options.etcd_endpoints, Some(connect)).await.map_err(failed)?;
    let prefix = subnets_prefix(options);
    client.get(prefix.as_str(), Some(GetOptions::new().with_prefix().with_count_only())).await.map_err(failed)?;
    Ok(client)
}

/// `error` with the errors under it (a TLS alert is three levels below "transport error"), and
/// what to do when it is one a flag fixes.
fn explain(options: &Options, error: &etcd_client::Error) -> String {
    let mut text = match error {
        etcd_client::Error::GRpcStatus(status) => format!("etcd: {}", status.message()),
        _ => error.to_string(),
    };
    let mut source: Option<&dyn std::error::Error> = match error {
        etcd_client::Error::TransportError(e) => std::error::Error::source(e),
        etcd_client::Error::GRpcStatus(status) => std::error::Error::source(status),
        _ => None,
    };
    while let Some(e) = source {
        let part = e.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = e.source();
    }
    let lower = text.to_ascii_lowercase();
    let ca = || options.etcd_tls.as_ref().map_or("(none)".to_string(), |t| t.ca_file.display().to_string());
    let with_client_cert = options.etcd_tls.as_ref().is_some_and(|t| t.client.is_some());
    let refused = ["certificaterequired", "certificate required", "badcertificate", "bad certificate"]
        .iter()
        .any(|alert| lower.contains(alert));
    let closed = lower.contains("broken pipe") || lower.contains("connection closed");
    let hint = if refused && !with_client_cert {
        Some("etcd asks for a client certificate (--client-cert-auth): give --etcd-certfile and --etcd-keyfile".into())
    } else if closed && options.etcd_tls.is_some() {
        // In TLS 1.3 the server checks the client certificate after the client has finished its
        // handshake, so a refusal can also arrive as a closed connection under the first request.
        Some(if with_client_cert {
            "etcd closed the connection: if it runs with --client-cert-auth, --etcd-certfile must be signed by the \
             CA of its --trusted-ca-file"
        } else {
            "etcd closed the connection: if it runs with --client-cert-auth, give --etcd-certfile and --etcd-keyfile"
        }
        .into())
    } else if lower.contains("unknownissuer") || lower.contains("unknown issuer") {
        Some(format!("etcd's server certificate is not signed by --etcd-cafile {}: give the CA that signed it", ca()))
    } else if lower.contains("notvalidforname") || lower.contains("not valid for name") {
        Some(
            "etcd's server certificate does not name the host of --etcd-endpoints: use a name or address its \
              subjectAltName lists"
                .into(),
        )
    } else if refused || lower.contains("unknownca") || lower.contains("unknown ca") {
        Some("etcd refused --etcd-certfile: it must be signed by the CA of etcd's --trusted-ca-file".into())
    } else if lower.contains("invalid user id or password") || lower.contains("authentication failed") {
        Some("etcd refused the user: check --etcd-username and the password in --etcd-password-file".into())
    } else if lower.contains("user name is empty") || lower.contains("permission denied") {
        let prefix = subnets_prefix(options);
        Some(match &options.etcd_user {
            Some(user) => format!("etcd user {} needs a role with readwrite on the prefix {prefix}", user.name),
            None => format!(
                "etcd's auth is on: give --etcd-username and --etcd-password-file (or a client certificate whose CN \
                 is the user) for a user with readwrite on the prefix {prefix}"
            ),
        })
    } else {
        None
    };
    match hint {
        Some(hint) => format!("{text} ({hint})"),
        None => text,
    }
}

/// An etcd request's error, with [`explain`]'s hint (a user with read but not write permission on
/// the prefix is refused only at its first write).
fn etcd_err<'a>(
    options: &'a Options,
    what: impl std::fmt::Display + 'a,
) -> impl FnOnce(etcd_client::Error) -> anyhow::Error + 'a {
    move |e| anyhow!("{what}: {}", explain(options, &e))
}

/// Takes this node's block: its own key after a restart (see the module comment), else `preferred`
/// if it is free (the block it held before its lease was lost), else the first free one. A block
/// that a believed record at another key overlaps is never taken.
pub async fn acquire(
    client: &mut Client,
    options: &Options,
    lease: i64,
    published: &Published,
    preferred: Option<&[IpNetwork]>,
) -> Result<Held> {
    let prefix = subnets_prefix(options);
    let count = block_count(options);
    let record_for = |cidrs: Vec<IpNetwork>| published.record(options, cidrs);
    let put = |key: &str, record: &NodeRecord| -> Result<TxnOp> {
        let value = serde_json::to_vec(record).map_err(|e| anyhow!("encode node record: {e}"))?;
        Ok(TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))))
    };
    for _attempt in 0..1000 {
        let listing = client
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(etcd_err(options, format_args!("etcd list {prefix}")))?;
        let mut taken = BTreeSet::new();
        let mut claims = BTreeMap::new();
        let mut revisions = BTreeMap::new();
        for kv in listing.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if let Ok(record) = serde_json::from_slice::<NodeRecord>(kv.value()) {
                if trust::check_claim(options, &key, &record).is_ok() {
                    revisions.insert(key.clone(), kv.mod_revision());
                    claims.insert(key.clone(), Claim { record, age: kv.create_revision() });
                }
            }
            taken.insert(key);
        }
        let (believed, _) = trust::resolve(None, claims.iter().map(|(k, c)| (k.as_str(), c)).collect());
        let claimed = |key: &str, cidrs: &[IpNetwork]| {
            believed.iter().any(|(k, c)| *k != key && trust::any_overlap(&c.record.pod_cidrs, cidrs))
        };
        let mine = believed
            .iter()
            .find(|(key, c)| c.record.node == options.node_name && !claimed(key, &c.record.pod_cidrs))
            .map(|(key, c)| (key.to_string(), revisions.get(*key).copied().unwrap_or(0), c.record.pod_cidrs.clone()));
        if let Some((key, revision, cidrs)) = mine {
            let record = record_for(cidrs);
            let txn = Txn::new()
                .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)])
                .and_then([put(&key, &record)?]);
            if client.txn(txn).await.map_err(etcd_err(options, format_args!("etcd retake {key}")))?.succeeded() {
                return Ok(Held { key, lease, record });
            }
            continue;
        }
        let preferred =
            preferred.filter(|cidrs| trust::block_index(options, cidrs).is_some()).map(|cidrs| cidrs.to_vec());
        let candidates = preferred.into_iter().chain((0..count).filter_map(|i| blocks(options, i)));
        let mut lost_race = false;
        for cidrs in candidates {
            let key = block_key(options, &cidrs[0]);
            if taken.contains(&key) || claimed(&key, &cidrs) {
                continue;
            }
            let record = record_for(cidrs);
            let txn = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([put(&key, &record)?]);
            if client.txn(txn).await.map_err(etcd_err(options, format_args!("etcd take {key}")))?.succeeded() {
                return Ok(Held { key, lease, record });
            }
            // Another node took it between the list and the transaction: try the next one.
            taken.insert(key);
            lost_race = true;
        }
        if !lost_race {
            let ranges: Vec<String> = options.cluster.iter().map(|(n, s)| format!("{n} in /{s} blocks")).collect();
            return Err(anyhow!(
                "no free block left in {} ({count} blocks, all held by live nodes under {prefix})",
                ranges.join(" and ")
            ));
        }
    }
    Err(anyhow!("could not take a block under {prefix}: every attempt lost a race"))
}

/// Keeps `lease` alive until it is lost (expired, revoked, or etcd unreachable past the TTL);
/// returns why.
pub async fn keep_alive(client: &mut Client, lease: i64, ttl: i64) -> String {
    let interval = Duration::from_secs((ttl / 3).max(1) as u64);
    let deadline_after = Duration::from_secs(ttl.max(1) as u64);
    let mut last_ok = tokio::time::Instant::now();
    loop {
        match client.lease_keep_alive(lease).await {
            Ok((mut keeper, mut stream)) => loop {
                if let Err(e) = keeper.keep_alive().await {
                    eprintln!("warning: etcd: renew lease {lease:x}: {e}");
                    break;
                }
                match stream.message().await {
                    Ok(Some(reply)) if reply.ttl() > 0 => last_ok = tokio::time::Instant::now(),
                    Ok(Some(_)) => return format!("lease {lease:x} expired"),
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("warning: etcd: renew lease {lease:x}: {e}");
                        break;
                    }
                }
                tokio::time::sleep(interval).await;
            },
            Err(e) => eprintln!("warning: etcd: renew lease {lease:x}: {e}"),
        }
        if last_ok.elapsed() >= deadline_after {
            return format!("lease {lease:x} not renewed for {}s", deadline_after.as_secs());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Lists and watches `<prefix>/subnets/` forever, publishing every node but `own_node`; lists
/// again after any watch failure (including compaction).
pub async fn watch_peers(mut client: Client, options: Arc<Options>, out: watch::Sender<Arc<Peers>>) {
    let prefix = subnets_prefix(&options);
    loop {
        if let Err(e) = watch_once(&mut client, &options, &prefix, &out).await {
            eprintln!("warning: {e}; listing {prefix} again in 1s");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn decode(options: &Options, kv: &etcd_client::KeyValue) -> Option<(String, Claim)> {
    let key = String::from_utf8_lossy(kv.key()).into_owned();
    match serde_json::from_slice::<NodeRecord>(kv.value()) {
        Ok(record) if record.node != options.node_name => Some((key, Claim { record, age: kv.create_revision() })),
        Ok(_) => None,
        Err(e) => {
            eprintln!("warning: etcd: {key}: not a node record ({e}); ignored");
            None
        }
    }
}

async fn watch_once(
    client: &mut Client,
    options: &Options,
    prefix: &str,
    out: &watch::Sender<Arc<Peers>>,
) -> Result<()> {
    let listing = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(etcd_err(options, format_args!("etcd list {prefix}")))?;
    let revision = listing.header().map(|h| h.revision()).unwrap_or(0);
    let mut peers = Peers { nodes: BTreeMap::new(), synced: true };
    for kv in listing.kvs() {
        if let Some((key, record)) = decode(options, kv) {
            peers.nodes.insert(key, record);
        }
    }
    publish(out, &peers);
    let mut stream = client
        .watch(prefix, Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1)))
        .await
        .map_err(etcd_err(options, format_args!("etcd watch {prefix}")))?;
    while let Some(reply) = stream.message().await.map_err(etcd_err(options, format_args!("etcd watch {prefix}")))? {
        if reply.canceled() {
            return Err(anyhow!("etcd: watch {prefix} canceled: {}", reply.cancel_reason()));
        }
        for event in reply.events() {
            let Some(kv) = event.kv() else { continue };
            match event.event_type() {
                EventType::Put => {
                    if let Some((key, record)) = decode(options, kv) {
                        peers.nodes.insert(key, record);
                    }
                }
                EventType::Delete => {
                    peers.nodes.remove(String::from_utf8_lossy(kv.key()).as_ref());
                }
            }
        }
        publish(out, &peers);
    }
    Err(anyhow!("etcd: watch {prefix} ended"))
}

fn publish(out: &watch::Sender<Arc<Peers>>, peers: &Peers) {
    out.send_if_modified(|current| {
        if **current == *peers {
            return false;
        }
        *current = Arc::new(peers.clone());
        true
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_carries_the_wireguard_key_and_port_only_when_published() {
        let o = options("10.244.0.0/16", "24");
        let cidrs = vec!["10.244.3.0/24".parse().unwrap()];
        let plain = Published::default().record(&o, cidrs.clone());
        let text = serde_json::to_string(&plain).unwrap();
        assert!(!text.contains("wireguard"), "{text}");
        let published = Published {
            vtep_mac: None,
            wireguard_key: Some("AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=".into()),
            wireguard_port: Some(51820),
        };
        let record = published.record(&o, cidrs);
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["wireguardPublicKey"], "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=");
        assert_eq!(value["wireguardPort"], 51820);
        assert_eq!(serde_json::from_value::<NodeRecord>(value).unwrap(), record);
        assert!(published.is_in(&record) && !published.is_in(&plain));
    }

    fn options(cluster: &str, sizes: &str) -> Options {
        let args = [
            "--node-name",
            "n1",
            "--etcd-endpoints",
            "http://127.0.0.1:1",
            "--cluster-cidr",
            cluster,
            "--node-cidr-size",
            sizes,
            "--node-ip",
            "10.0.0.1",
        ];
        Options::parse(args.iter().map(|s| s.to_string()), None).unwrap().unwrap()
    }

    #[test]
    fn connection_errors_name_the_flag_to_fix() {
        let mut o = options("10.244.0.0/16", "24");
        // The integration tests (etcd_tls) see the real errors; these are their texts.
        let status = |message: &str| etcd_client::Error::Internal(message.to_string());
        let plain = explain(&o, &status("tcp connect error: Connection refused (os error 111)"));
        assert_eq!(plain, "internal error: tcp connect error: Connection refused (os error 111)");
        let auth = explain(&o, &status("etcdserver: user name is empty"));
        assert!(auth.ends_with("give --etcd-username and --etcd-password-file (or a client certificate whose CN is the user) for a user with readwrite on the prefix /cni-rs/subnets/)"), "{auth}");
        o.etcd_tls = Some(crate::options::EtcdTls { ca_file: "/etc/ca.pem".into(), ca: Vec::new(), client: None });
        for (message, hint) in [
            ("invalid peer certificate: NotValidForName", "does not name the host of --etcd-endpoints"),
            ("invalid peer certificate: UnknownIssuer", "not signed by --etcd-cafile /etc/ca.pem: give the CA"),
            ("received fatal alert: CertificateRequired", "give --etcd-certfile and --etcd-keyfile"),
            ("connection closed", "if it runs with --client-cert-auth, give --etcd-certfile and --etcd-keyfile"),
        ] {
            let text = explain(&o, &status(message));
            assert!(text.starts_with(&format!("internal error: {message} (")) && text.contains(hint), "{text}");
        }
        o.etcd_tls = Some(crate::options::EtcdTls {
            ca_file: "/etc/ca.pem".into(),
            ca: Vec::new(),
            client: Some((Vec::new(), Vec::new())),
        });
        let text = explain(&o, &status("received fatal alert: BadCertificate"));
        assert!(
            text.contains("etcd refused --etcd-certfile: it must be signed by the CA of etcd's --trusted-ca-file"),
            "{text}"
        );
    }

    #[test]
    fn blocks_pair_families_by_index() {
        let o = options("10.244.0.0/16,fd00:10:244::/56", "24,64");
        assert_eq!(block_count(&o), 256);
        let b = blocks(&o, 3).unwrap();
        assert_eq!(b[0].to_string(), "10.244.3.0/24");
        assert_eq!(b[1].to_string(), "fd00:10:244:3::/64");
        assert_eq!(block_key(&o, &b[0]), "/cni-rs/subnets/10.244.3.0-24");
        assert_eq!(trust::block_index(&o, &b), Some(3));
        assert_eq!(trust::block_index(&o, &b[..1]), None);
        let last = blocks(&o, 255).unwrap();
        assert_eq!(last[0].to_string(), "10.244.255.0/24");
        let o = options("10.244.0.0/22", "26");
        assert_eq!(block_count(&o), 16);
        assert_eq!(blocks(&o, 5).unwrap()[0].to_string(), "10.244.1.64/26");
    }
}
