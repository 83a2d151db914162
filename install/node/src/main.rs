//! cni-rs-node: the node agent. It leases this node's pod CIDRs from etcd, installs the plugins and
//! a conflist with those CIDRs, routes to every other node's pod CIDRs (host-gw or VXLAN) and
//! masquerades pod traffic leaving the cluster range.

// Tests may unwrap: a panic there is a failed assertion. The shipped binary is still checked.
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

mod conf;
mod etcd;
mod k8s;
mod metrics;
mod net;
mod netpol;
mod options;
mod policy;
mod sysctls;
mod trust;
mod wgkey;
mod wireguard;

use anyhow::{anyhow, Result};
use etcd::{Held, NodeRecord, Peers, Published};
use ipnetwork::IpNetwork;
use net::{Route, Underlay, Vtep};
use netkit::Family;
use options::{Backend, Datastore, Options, USAGE};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

fn main() -> ExitCode {
    let parsed = Options::parse(
        std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()),
        std::env::var("NODE_NAME").ok(),
    );
    let options = match cni_installer::cli::options_or_exit(parsed, USAGE) {
        Ok(options) => options,
        Err(code) => return code,
    };
    if options.sysctls_only {
        return sysctls::init_container(&node_sysctls(&options));
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(Arc::new(options))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The sysctls this node's pods need (see [`sysctls::needed`]).
fn node_sysctls(options: &Options) -> Vec<sysctls::Sysctl> {
    let ipv6 = options.cluster.iter().any(|(net, _)| net.is_ipv6());
    sysctls::needed(ipv6, enforces_policy(options))
}

/// Runs until SIGTERM or SIGINT. The lease is left to expire rather than revoked: a restarting
/// agent takes its block back, and the other nodes keep their routes to it meanwhile.
async fn run(options: Arc<Options>) -> Result<()> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| anyhow!("install SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| anyhow!("install SIGINT handler: {e}"))?;
    tokio::select! {
        result = agent(options) => result,
        _ = term.recv() => {
            eprintln!("received SIGTERM, exiting (lease left to expire, routes left in place)");
            Ok(())
        }
        _ = int.recv() => {
            eprintln!("received SIGINT, exiting (lease left to expire, routes left in place)");
            Ok(())
        }
    }
}

/// How often the whole state is reconciled even without a change in the datastore (repairs
/// routes removed by hand or by another program).
const RESYNC: Duration = Duration::from_secs(30);

/// What the agent learned about this node at start.
struct Local {
    handle: rtnetlink::Handle,
    v4: Option<Underlay>,
    v6: Option<Underlay>,
    /// Index and MAC of the VXLAN device (backends vxlan and auto with an IPv4 node address).
    vxlan: Option<(u32, [u8; 6])>,
    wireguard: Option<Wireguard>,
}

/// The WireGuard device (backend wireguard).
struct Wireguard {
    index: u32,
    genl: genetlink::GenetlinkHandle,
    public: [u8; 32],
    /// The underlay family: peers' endpoints are their node addresses of this family.
    family: Family,
    overhead: u32,
}

async fn agent(options: Arc<Options>) -> Result<()> {
    sysctls::ensure(&node_sysctls(&options));
    let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| anyhow!("open a netlink socket: {e}"))?;
    tokio::spawn(connection);
    let options =
        if options.node_ips.is_empty() { Arc::new(default_node_ips(&handle, &options).await?) } else { options };

    let mut local = Local { handle, v4: None, v6: None, vxlan: None, wireguard: None };
    for ip in &options.node_ips {
        let underlay = net::link_of_address(&local.handle, *ip).await?.ok_or_else(|| {
            anyhow!("--node-ip {ip} is not an address of any interface in this network namespace; give this node's own address")
        })?;
        if ip.is_ipv4() {
            local.v4 = Some(underlay);
        } else {
            local.v6 = Some(underlay);
        }
    }
    if options.backend == Backend::Wireguard {
        local.wireguard = Some(start_wireguard(&options, &local).await?);
    } else if options.backend != Backend::HostGw {
        if let (Some(IpAddr::V4(ip)), Some(under)) = (options.node_ip(Family::V4), local.v4) {
            let mtu = under.mtu.saturating_sub(net::VXLAN_OVERHEAD);
            local.vxlan = Some(net::ensure_vxlan(&local.handle, &options.vxlan_dev, ip, under.index, mtu).await?);
        } else if options.backend == Backend::Vxlan {
            return Err(anyhow!("--backend vxlan needs an IPv4 --node-ip (VXLAN runs over IPv4)"));
        }
    }

    let published = Published {
        vtep_mac: local.vxlan.map(|(_, mac)| net::format_mac(&mac)),
        wireguard_key: local.wireguard.as_ref().map(|wg| wgkey::encode(&wg.public)),
        wireguard_port: local.wireguard.as_ref().map(|_| options.wireguard_port),
    };
    let (held_rx, peers_rx) = match options.datastore {
        Datastore::Etcd => start_etcd(&options, published).await?,
        Datastore::Kubernetes => start_kubernetes(&options, published).await?,
    };
    if let Some(src) = &options.src {
        install_plugins(src, &options.bin_dir)?;
    }

    let stats = metrics::Shared::default();
    if enforces_policy(&options) {
        let client = k8s::client(&options).await?;
        tokio::spawn(netpol::run(client, options.clone(), held_rx.clone(), stats.clone()));
    } else {
        // Policies off, or a datastore without them: no table, nothing filtered.
        netpol::remove();
    }
    let listener = tokio::net::TcpListener::bind(options.metrics_addr)
        .await
        .map_err(|e| anyhow!("listen on --metrics-addr {}: {e}", options.metrics_addr))?;
    if let Ok(addr) = listener.local_addr() {
        eprintln!("serving /healthz and /metrics on http://{addr}");
    }
    tokio::spawn(metrics::serve(listener, stats.clone(), RESYNC * 3));
    let addresses = net::watch_addresses()?;
    reconcile_loop(options, local, held_rx, peers_rx, addresses, stats).await
}

/// The key pair (made once, kept in --state-dir), the device over the IPv4 underlay when this
/// node has an IPv4 address (else IPv6), its private key and port. Peers already on a device
/// kept from an earlier run stay until the first sync has read the datastore.
async fn start_wireguard(options: &Options, local: &Local) -> Result<Wireguard> {
    let (keys, made) = wgkey::load_or_create(&options.state_dir)?;
    let path = wgkey::key_path(&options.state_dir);
    let how = if made { "made" } else { "kept" };
    eprintln!("WireGuard key {how} in {}: public key {}", path.display(), keys.public_base64());
    let (under, family, overhead) = match (local.v4, local.v6) {
        (Some(under), _) => (under, Family::V4, wireguard::OVERHEAD_V4),
        (None, Some(under)) => (under, Family::V6, wireguard::OVERHEAD_V6),
        (None, None) => return Err(anyhow!("--backend wireguard needs a --node-ip")),
    };
    let mtu = under.mtu.saturating_sub(overhead);
    let index = wireguard::ensure_device(&local.handle, &options.wireguard_dev, mtu).await?;
    let mut genl = wireguard::connect()?;
    wireguard::configure(&mut genl, index, &options.wireguard_dev, keys.private.to_bytes(), options.wireguard_port)
        .await?;
    Ok(Wireguard { index, genl, public: keys.public, family, overhead })
}

type Channels = (watch::Receiver<Arc<Held>>, watch::Receiver<Arc<Peers>>);

/// Leases a block in etcd and keeps it; watches the other nodes' blocks.
async fn start_etcd(options: &Arc<Options>, published: Published) -> Result<Channels> {
    let mut client = loop {
        match etcd::connect(options).await {
            Ok(client) => break client,
            Err(e) => {
                eprintln!("warning: {e}; retrying in 2s");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let lease = client
        .lease_grant(options.lease_ttl, None)
        .await
        .map_err(|e| anyhow!("etcd: grant a {}s lease: {e}", options.lease_ttl))?
        .id();
    let previous = conf::previous_cidrs(&options.conf_dir, &options.conf_name);
    let held = etcd::acquire(&mut client, options, lease, &published, Some(&previous)).await?;
    log_held(&held);
    let (held_tx, held_rx) = watch::channel(Arc::new(held));
    tokio::spawn(hold(client.clone(), options.clone(), published, held_tx));
    let (peers_tx, peers_rx) = watch::channel(Arc::new(Peers::default()));
    tokio::spawn(etcd::watch_peers(client, options.clone(), peers_tx));
    Ok((held_rx, peers_rx))
}

/// Watches the Nodes; returns once this node has pod CIDRs.
async fn start_kubernetes(options: &Arc<Options>, published: Published) -> Result<Channels> {
    let client = k8s::client(options).await?;
    let (own_tx, mut own_rx) = watch::channel(None);
    let (peers_tx, peers_rx) = watch::channel(Arc::new(Peers::default()));
    tokio::spawn(k8s::watch_nodes(client, options.clone(), published, own_tx, peers_tx));
    let first = loop {
        if let Some(held) = own_rx.borrow_and_update().clone() {
            break held;
        }
        own_rx.changed().await.map_err(|_| anyhow!("the Kubernetes node watch stopped"))?;
    };
    log_held(&first);
    let (held_tx, held_rx) = watch::channel(first);
    tokio::spawn(async move {
        while own_rx.changed().await.is_ok() {
            let next = own_rx.borrow_and_update().clone();
            if let Some(held) = next {
                log_held(&held);
                held_tx.send_replace(held);
            }
        }
    });
    Ok((held_rx, peers_rx))
}

/// `--node-ip` left out: per family of `--cluster-cidr`, the address on the interface of that
/// family's default route.
async fn default_node_ips(handle: &rtnetlink::Handle, options: &Options) -> Result<Options> {
    let mut options = options.clone();
    for family in [Family::V4, Family::V6] {
        if !options.cluster.iter().any(|(net, _)| Family::of_net(net) == family) {
            continue;
        }
        if let Some(ip) = net::default_route_address(handle, family).await? {
            eprintln!("node address {ip} (on the interface of the default route; set --node-ip to choose)");
            options.node_ips.push(ip);
        }
    }
    if options.node_ips.is_empty() {
        return Err(anyhow!("no --node-ip, and no default route with an address to take it from: give --node-ip"));
    }
    Ok(options)
}

fn install_plugins(src: &std::path::Path, bin_dir: &std::path::Path) -> Result<()> {
    use cni_installer::install;
    std::fs::create_dir_all(bin_dir).map_err(|e| anyhow!("create {}: {e}", bin_dir.display()))?;
    let source = install::Source::read(src)?;
    install::remove_stale_temps(bin_dir, &source.names());
    let report = install::install_dir(src, bin_dir)?;
    if let Some(err) = &report.link_error {
        eprintln!("warning: {err}; each plugin name is a full copy of {} instead of a hard link", install::MULTI_CALL);
    }
    let changed = report.outcomes.iter().filter(|(_, o)| !matches!(o, install::Placement::Unchanged)).count();
    eprintln!("plugins in {}: {} names, {changed} changed", bin_dir.display(), report.outcomes.len());
    Ok(())
}

fn enforces_policy(options: &Options) -> bool {
    options.network_policy && options.datastore == Datastore::Kubernetes
}

/// The routes and VXLAN entries this node needs for `peers`, and what it refused.
struct Plan {
    routes: Vec<Route>,
    vteps: Vec<Vtep>,
    vxlan_peers: BTreeSet<String>,
    wireguard_peers: Vec<wireguard::Peer>,
    believed: usize,
    findings: Vec<trust::Finding>,
    /// Peers believed but not reachable with this node's backend and addresses.
    unroutable: Vec<String>,
}

/// Every value that reaches netlink from here was screened by [`trust::screen`] or checked
/// against this node's own links: no record can turn into a failed netlink request.
fn plan(options: &Options, local: &Local, own: &Held, me: &trust::Me, peers: &Peers) -> Plan {
    let (believed, findings) = trust::screen(options, (&own.key, &own.record), me, &peers.nodes);
    let mut plan = Plan {
        routes: Vec::new(),
        vteps: Vec::new(),
        vxlan_peers: BTreeSet::new(),
        wireguard_peers: Vec::new(),
        believed: believed.len(),
        findings,
        unroutable: Vec::new(),
    };
    for trust::Peer { record: peer, mac, wireguard: wg_key } in believed {
        if let Some(wg) = &local.wireguard {
            let endpoint = wg_key.and_then(|(key, port)| {
                wireguard::endpoint(&peer.node_ips, wg.family, port).map(|endpoint| (key, endpoint))
            });
            let Some((key, endpoint)) = endpoint else {
                plan.unroutable.push(format!(
                    "no route to {} of node {}: it records no usable WireGuard key, or no node address of this \
                     node's underlay family",
                    peer.pod_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
                    peer.node
                ));
                continue;
            };
            let mut allowed = peer.pod_cidrs.clone();
            allowed.sort();
            for cidr in &allowed {
                plan.routes.push(Route { dst: *cidr, gw: None, oif: Some(wg.index), onlink: false });
            }
            plan.wireguard_peers.push(wireguard::Peer { key, node: peer.node.clone(), endpoint, allowed });
            continue;
        }
        for cidr in &peer.pod_cidrs {
            let family = Family::of_net(cidr);
            let under = family.pick(local.v4, local.v6);
            let peer_ip = peer.node_ips.iter().copied().find(|ip| Family::of(ip) == family);
            // A gateway off this node's subnet is one the kernel refuses: host-gw routes only
            // to nodes on it.
            let on_link = match (under, peer_ip) {
                (Some(under), Some(peer_ip)) => under.subnet.contains(peer_ip).then_some(peer_ip),
                _ => None,
            };
            let host_gw = match options.backend {
                Backend::HostGw | Backend::Auto => on_link,
                Backend::Vxlan | Backend::Wireguard => None,
            };
            if let Some(gw) = host_gw {
                plan.routes.push(Route { dst: *cidr, gw: Some(gw), oif: None, onlink: false });
                continue;
            }
            if options.backend == Backend::HostGw {
                plan.unroutable.push(format!(
                    "no route to {cidr} of node {}: host-gw needs a node address of its family on this node's subnet",
                    peer.node
                ));
                continue;
            }
            // VXLAN runs over IPv4 and carries both families.
            let peer_v4 = peer.node_ips.iter().find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(*v4),
                IpAddr::V6(_) => None,
            });
            let (Some(peer_v4), Some((index, _))) = (peer_v4, local.vxlan) else {
                plan.unroutable.push(format!(
                    "no route to {cidr} of node {}: not on this node's subnet, and VXLAN needs an IPv4 node address on both ends",
                    peer.node
                ));
                continue;
            };
            let Some(mac) = mac else {
                plan.unroutable.push(format!(
                    "no route to {cidr} of node {}: it records no usable VTEP MAC (none, or one refused)",
                    peer.node
                ));
                continue;
            };
            let vtep = cidr.network();
            plan.routes.push(Route { dst: *cidr, gw: Some(vtep), oif: Some(index), onlink: true });
            plan.vteps.push(Vtep { vtep, mac, dst: peer_v4 });
            plan.vxlan_peers.insert(peer.node.clone());
        }
    }
    plan.routes.sort();
    plan.vteps.sort();
    plan.wireguard_peers.sort();
    plan
}

fn describe(record: &NodeRecord) -> String {
    let cidrs: Vec<String> = record.pod_cidrs.iter().map(|c| c.to_string()).collect();
    let ips: Vec<String> = record.node_ips.iter().map(|c| c.to_string()).collect();
    format!("{} ({} via {})", record.node, cidrs.join(","), ips.join(","))
}

async fn reconcile_loop(
    options: Arc<Options>,
    mut local: Local,
    mut held: watch::Receiver<Arc<Held>>,
    mut peers: watch::Receiver<Arc<Peers>>,
    mut addresses: watch::Receiver<u64>,
    stats: metrics::Shared,
) -> Result<()> {
    let template = match &options.template {
        Some(path) => std::fs::read_to_string(path).map_err(|e| anyhow!("read --template {}: {e}", path.display()))?,
        None => conf::TEMPLATE.to_string(),
    };
    let cluster: Vec<IpNetwork> = options.cluster.iter().map(|(net, _)| *net).collect();
    let mut known: BTreeMap<String, trust::Claim> = BTreeMap::new();
    // What the last reconcile refused: a finding is logged and counted when it appears, not
    // again on every reconcile while it lasts.
    let mut reported: BTreeSet<String> = BTreeSet::new();
    // The address-change count at which this node's addresses were last listed.
    let mut addresses_listed: Option<u64> = None;
    let mut me = trust::Me {
        addresses: options.node_ips.iter().copied().collect(),
        subnets: [local.v4, local.v6].iter().flatten().map(|u| u.subnet).collect(),
        vtep_mac: local.vxlan.map(|(_, mac)| mac),
        wireguard_key: local.wireguard.as_ref().map(|wg| wg.public),
    };
    let mut nft_applied = String::new();
    // The routes and VXLAN entries the last sync left in the kernel. A datastore change then
    // applies only the difference: a node joining or leaving costs a few messages, not a
    // listing of every route. The full reconcile (which lists what is there and repairs it)
    // runs at the first sync, every RESYNC and after any netlink error.
    let mut programmed: Option<(Vec<Route>, Vec<Vtep>, Vec<wireguard::Peer>)> = None;
    let mut last_full: Option<std::time::Instant> = None;
    loop {
        let snapshot = peers.borrow_and_update().clone();
        let own = held.borrow_and_update().clone();
        let mut errors = 0;

        // Joins and leaves, one line each.
        if snapshot.synced {
            for (key, claim) in &snapshot.nodes {
                if known.get(key) != Some(claim) {
                    let verb = if known.contains_key(key) { "changed" } else { "joined" };
                    eprintln!("node {verb}: {}", describe(&claim.record));
                }
            }
            for (key, claim) in &known {
                if !snapshot.nodes.contains_key(key) {
                    eprintln!("node left: {}", describe(&claim.record));
                }
            }
            known = snapshot.nodes.clone();
        }

        // Every address of this node, not only --node-ip: a record naming any of them would
        // route pod traffic back to this node.
        let address_changes = *addresses.borrow_and_update();
        if addresses_listed != Some(address_changes) {
            match net::local_addresses(&local.handle).await {
                Ok(mut list) => {
                    list.extend(options.node_ips.iter().copied());
                    me.addresses = list;
                    addresses_listed = Some(address_changes);
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    errors += 1;
                }
            }
        }
        let plan = plan(&options, &local, &own, &me, &snapshot);
        let mut conflicts = 0;
        let mut rejected = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for finding in &plan.findings {
            let line = format!("warning: {}", finding.message);
            if !reported.contains(&line) {
                eprintln!("{line}");
                match finding.reason {
                    Some(reason) => *rejected.entry(reason).or_insert(0u64) += 1,
                    None => conflicts += 1,
                }
            }
            seen.insert(line);
        }
        for text in &plan.unroutable {
            let line = format!("warning: {text}");
            if !reported.contains(&line) {
                eprintln!("{line}");
            }
            seen.insert(line);
        }
        reported = seen;
        if let (Some((index, _)), Some(IpNetwork::V4(block))) =
            (local.vxlan, own.record.pod_cidrs.iter().find(|c| c.is_ipv4()))
        {
            if let Err(e) = net::ensure_only_v4_address(&local.handle, index, block.network()).await {
                eprintln!("error: {e}");
                errors += 1;
            }
        }
        // Nothing changes before the first full list: a restarted agent that removed what it has
        // not read yet would drop routes to live nodes.
        if snapshot.synced {
            let started = std::time::Instant::now();
            let full_due = last_full.is_none_or(|at| at.elapsed() >= RESYNC);
            let previous = if full_due { None } else { programmed.take() };
            if previous.is_none() {
                last_full = Some(started);
            }
            // Peers and VXLAN entries go first: a route is only used once they are there.
            let peer_changes = match &mut local.wireguard {
                Some(wg) => {
                    let before = previous.as_ref().map(|(_, _, peers)| peers.as_slice());
                    let name = &options.wireguard_dev;
                    let keepalive = options.wireguard_keepalive;
                    wireguard::sync_peers(&mut wg.genl, wg.index, name, &plan.wireguard_peers, before, keepalive).await
                }
                None => net::Changes::default(),
            };
            if peer_changes.added + peer_changes.removed + peer_changes.errors > 0 {
                eprintln!(
                    "WireGuard peers synced: {} wanted, {} set, {} removed, {} errors",
                    plan.wireguard_peers.len(),
                    peer_changes.added,
                    peer_changes.removed,
                    peer_changes.errors
                );
            }
            let (how, vtep_changes, changes) = match &previous {
                Some((routes, vteps, _)) => (
                    "delta",
                    match local.vxlan {
                        Some((index, _)) => net::apply_vtep_delta(&local.handle, index, vteps, &plan.vteps).await,
                        None => net::Changes::default(),
                    },
                    net::apply_route_delta(&local.handle, routes, &plan.routes).await,
                ),
                None => (
                    "full",
                    match local.vxlan {
                        Some((index, _)) => net::reconcile_vteps(&local.handle, index, &plan.vteps).await,
                        None => net::Changes::default(),
                    },
                    net::reconcile_routes(&local.handle, &plan.routes).await,
                ),
            };
            if changes.added + changes.removed + changes.errors > 0 {
                eprintln!(
                    "routes synced in {:.1} ms: {} wanted, {} added, {} removed, {} errors ({how})",
                    started.elapsed().as_secs_f64() * 1000.0,
                    plan.routes.len(),
                    changes.added,
                    changes.removed,
                    changes.errors
                );
            }
            let failed = changes.errors + vtep_changes.errors + peer_changes.errors;
            errors += failed;
            programmed = (failed == 0).then(|| (plan.routes.clone(), plan.vteps.clone(), plan.wireguard_peers.clone()));

            let base = local.v4.or(local.v6).map(|u| u.mtu).unwrap_or(1500);
            let vxlan_mtu = options.backend == Backend::Vxlan || !plan.vxlan_peers.is_empty();
            let mtu = match &local.wireguard {
                Some(wg) => base.saturating_sub(wg.overhead),
                None if vxlan_mtu => base.saturating_sub(net::VXLAN_OVERHEAD),
                None => base,
            };
            match conf::render(&template, &own.record.pod_cidrs, mtu)
                .and_then(|text| conf::write(&options.conf_dir, &options.conf_name, &text))
            {
                Ok(true) => eprintln!(
                    "wrote {} (pod CIDRs {:?}, mtu {mtu})",
                    options.conf_dir.join(&options.conf_name).display(),
                    own.record.pod_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>()
                ),
                Ok(false) => {}
                Err(e) => {
                    eprintln!("error: conflist: {e}");
                    errors += 1;
                }
            }
            let ruleset = conf::nft_ruleset(&own.record.pod_cidrs, &cluster);
            if ruleset != nft_applied {
                match conf::apply_masquerade(&own.record.pod_cidrs, &cluster) {
                    Ok(()) => {
                        eprintln!("masquerading pod traffic leaving {cluster:?} (table inet {})", conf::NFT_TABLE);
                        nft_applied = ruleset;
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        errors += 1;
                    }
                }
            }
        }

        if let Ok(mut s) = stats.lock() {
            s.nodes_known = plan.believed;
            s.record_conflicts += conflicts;
            for (reason, count) in rejected {
                *s.records_rejected.entry(reason).or_insert(0) += count;
            }
            s.routes_programmed = plan.routes.len();
            s.vxlan_peers = plan.vxlan_peers.len();
            s.wireguard = local.wireguard.as_ref().map(|wg| metrics::WireguardSource {
                genl: wg.genl.clone(),
                index: wg.index,
                name: options.wireguard_dev.clone(),
                nodes: plan.wireguard_peers.iter().map(|p| (p.key, p.node.clone())).collect(),
            });
            s.reconciles += 1;
            s.reconcile_errors += errors as u64;
            if errors == 0 && snapshot.synced {
                s.last_sync = Some(metrics::now());
            }
        }

        let wait = if errors > 0 { Duration::from_secs(2) } else { RESYNC };
        tokio::select! {
            r = peers.changed() => r.map_err(|_| anyhow!("the datastore watch stopped"))?,
            r = held.changed() => r.map_err(|_| anyhow!("the lease keeper stopped"))?,
            r = addresses.changed() => r.map_err(|_| anyhow!("the address watch stopped"))?,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

fn log_held(held: &Held) {
    let cidrs: Vec<String> = held.record.pod_cidrs.iter().map(|c| c.to_string()).collect();
    eprintln!("holding {} ({}) with lease {:x}", cidrs.join(","), held.key, held.lease);
}

/// Keeps the lease alive; when it is lost, takes a new lease and a block again (the same one if
/// it is still free).
async fn hold(
    mut client: etcd_client::Client,
    options: Arc<Options>,
    published: Published,
    out: watch::Sender<Arc<Held>>,
) {
    loop {
        let current = out.borrow().clone();
        let why = etcd::keep_alive(&mut client, current.lease, options.lease_ttl).await;
        eprintln!("warning: {why}; taking a block again");
        loop {
            let attempt = async {
                let lease = client
                    .lease_grant(options.lease_ttl, None)
                    .await
                    .map_err(|e| anyhow!("etcd: grant a {}s lease: {e}", options.lease_ttl))?
                    .id();
                etcd::acquire(&mut client, &options, lease, &published, Some(&current.record.pod_cidrs)).await
            };
            match attempt.await {
                Ok(held) => {
                    log_held(&held);
                    out.send_replace(Arc::new(held));
                    break;
                }
                Err(e) => {
                    eprintln!("warning: {e}; retrying in 2s");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }
}
