//! `/healthz` and Prometheus `/metrics` over a minimal HTTP/1.1 server (GET only, one response per
//! connection): the agent serves a few numbers, which needs no web framework.

use crate::trust::Reason;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Other nodes whose records the agent believes.
    pub nodes_known: usize,
    pub routes_programmed: usize,
    pub vxlan_peers: usize,
    pub reconciles: u64,
    pub reconcile_errors: u64,
    /// Unix time of the last reconcile that ended without errors.
    pub last_sync: Option<f64>,
    /// Records that lost a claim (pod CIDRs) to an older holder or to this node.
    pub record_conflicts: u64,
    /// Records (or their VTEP MACs) refused, by reason.
    pub records_rejected: BTreeMap<Reason, u64>,
    /// The WireGuard device, read at each scrape (handshakes and bytes change between syncs).
    pub wireguard: Option<WireguardSource>,
    /// NetworkPolicy enforcement, when on.
    pub policy: Option<PolicyStats>,
}

#[derive(Debug, Default, Clone)]
pub struct PolicyStats {
    /// NetworkPolicies the agent enforces.
    pub policies: usize,
    /// Unix time of the last successful apply.
    pub last_sync: Option<f64>,
    pub apply_errors: u64,
    /// Seconds from a watch event to the kernel having applied it.
    pub apply_seconds: Histogram,
    /// Packets dropped (ingress, egress) by tables swapped out since the start; the current
    /// table's counters are read at each scrape.
    pub dropped_before: (u64, u64),
}

/// A Prometheus histogram with fixed buckets (seconds).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        const BOUNDS: &[f64] = &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0];
        Histogram { bounds: BOUNDS, counts: vec![0; BOUNDS.len()], sum: 0.0, count: 0 }
    }
}

impl Histogram {
    pub fn observe(&mut self, v: f64) {
        for (bound, count) in self.bounds.iter().zip(self.counts.iter_mut()) {
            if v <= *bound {
                *count += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str) -> String {
        let mut out = format!("# HELP {name} {help}\n# TYPE {name} histogram\n");
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            out.push_str(&format!("{name}_bucket{{le=\"{bound}\"}} {count}\n"));
        }
        out.push_str(&format!("{name}_bucket{{le=\"+Inf\"}} {}\n", self.count));
        out.push_str(&format!("{name}_sum {:.6}\n{name}_count {}\n", self.sum, self.count));
        out
    }
}

/// `dropped`: what the current table has dropped (ingress, egress).
fn render_policy(p: &PolicyStats, dropped: (u64, u64)) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| one(&mut out, name, kind, help, value);
    metric("cni_rs_node_network_policies", "gauge", "NetworkPolicies enforced.", p.policies.to_string());
    metric(
        "cni_rs_node_policy_last_sync_seconds",
        "gauge",
        "Unix time of the last successful NetworkPolicy apply (0: none yet).",
        format!("{:.3}", p.last_sync.unwrap_or(0.0)),
    );
    metric(
        "cni_rs_node_policy_apply_errors_total",
        "counter",
        "NetworkPolicy changes the kernel refused (nothing of them applied; retried).",
        p.apply_errors.to_string(),
    );
    out.push_str(&p.apply_seconds.render(
        "cni_rs_node_policy_apply_seconds",
        "Seconds from a namespace, pod or policy watch event to the kernel enforcing it.",
    ));
    let name = "cni_rs_node_policy_dropped_packets_total";
    out.push_str(&format!(
        "# HELP {name} Packets to or from this node's isolated pods that no policy allowed, by direction.\n\
         # TYPE {name} counter\n{name}{{direction=\"ingress\"}} {}\n{name}{{direction=\"egress\"}} {}\n",
        p.dropped_before.0 + dropped.0,
        p.dropped_before.1 + dropped.1
    ));
    out
}

#[derive(Debug, Clone)]
pub struct WireguardSource {
    pub genl: genetlink::GenetlinkHandle,
    pub index: u32,
    pub name: String,
    /// Public key to node name, for the peers the agent set.
    pub nodes: BTreeMap<[u8; 32], String>,
}

/// Per peer of the device: seconds since its last handshake (+Inf before the first) and bytes
/// received and sent; the peer is labelled with its node's name and public key.
fn render_wireguard(
    peers: &BTreeMap<[u8; 32], crate::wireguard::PeerState>,
    nodes: &BTreeMap<[u8; 32], String>,
    now: f64,
) -> String {
    let mut out = format!(
        "# HELP cni_rs_node_wireguard_peers Peers on the WireGuard device.\n\
         # TYPE cni_rs_node_wireguard_peers gauge\ncni_rs_node_wireguard_peers {}\n",
        peers.len()
    );
    let families = [
        ("cni_rs_node_wireguard_last_handshake_age_seconds", "gauge", "Seconds since the peer's last handshake."),
        ("cni_rs_node_wireguard_received_bytes_total", "counter", "Bytes received from the peer."),
        ("cni_rs_node_wireguard_sent_bytes_total", "counter", "Bytes sent to the peer."),
    ];
    for (i, (name, kind, help)) in families.iter().enumerate() {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (key, state) in peers {
            let node = nodes.get(key).map_or("", String::as_str);
            let value = match i {
                0 if state.last_handshake == 0 => "+Inf".to_string(),
                0 => format!("{:.0}", (now - state.last_handshake as f64).max(0.0)),
                1 => state.rx_bytes.to_string(),
                _ => state.tx_bytes.to_string(),
            };
            let key = crate::wgkey::encode(key);
            out.push_str(&format!("{name}{{node=\"{node}\",public_key=\"{key}\"}} {value}\n"));
        }
    }
    out
}

pub type Shared = Arc<Mutex<Stats>>;

pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Healthy when a reconcile succeeded within `max_age`.
fn healthy(stats: &Stats, max_age: Duration) -> bool {
    stats.last_sync.is_some_and(|t| now() - t <= max_age.as_secs_f64())
}

/// One metric with one value, with its HELP and TYPE lines.
fn one(out: &mut String, name: &str, kind: &str, help: &str, value: String) {
    out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n"));
}

fn render(stats: &Stats) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: String| one(&mut out, name, kind, help, value);
    metric(
        "cni_rs_node_nodes_known",
        "gauge",
        "Other nodes holding a block in the datastore whose records the agent believes.",
        stats.nodes_known.to_string(),
    );
    metric(
        "cni_rs_node_routes_programmed",
        "gauge",
        "Routes to other nodes' pod CIDRs the agent keeps.",
        stats.routes_programmed.to_string(),
    );
    metric("cni_rs_node_vxlan_peers", "gauge", "Other nodes reached over VXLAN.", stats.vxlan_peers.to_string());
    metric("cni_rs_node_reconciles_total", "counter", "Reconciles run.", stats.reconciles.to_string());
    metric(
        "cni_rs_node_reconcile_errors_total",
        "counter",
        "Failed operations during reconciles (netlink, conflist, nftables).",
        stats.reconcile_errors.to_string(),
    );
    metric(
        "cni_rs_node_last_sync_timestamp_seconds",
        "gauge",
        "Unix time of the last reconcile without errors (0: none yet).",
        format!("{:.3}", stats.last_sync.unwrap_or(0.0)),
    );
    metric(
        "cni_rs_node_record_conflicts_total",
        "counter",
        "Datastore records ignored because an older holder (or this node) holds pod CIDRs they claim.",
        stats.record_conflicts.to_string(),
    );
    let name = "cni_rs_node_records_rejected_total";
    out.push_str(&format!(
        "# HELP {name} Datastore records (or their VTEP MACs) ignored, by reason.\n# TYPE {name} counter\n"
    ));
    for reason in Reason::ALL {
        let count = stats.records_rejected.get(&reason).copied().unwrap_or(0);
        out.push_str(&format!("{name}{{reason=\"{}\"}} {count}\n", reason.label()));
    }
    out
}

pub async fn serve(listener: TcpListener, stats: Shared, max_age: Duration) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), answer(stream, stats, max_age)).await;
        });
    }
}

async fn answer(mut stream: TcpStream, stats: Shared, max_age: Duration) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let request = String::from_utf8_lossy(&buf);
    let mut words = request.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let snapshot = stats.lock().map(|s| s.clone()).unwrap_or_default();
    let (status, kind, body) = match (method, path.split('?').next().unwrap_or("")) {
        ("GET", "/metrics") => {
            let mut body = render(&snapshot);
            if let Some(p) = &snapshot.policy {
                let dropped = netkit::firewall::netpol::dropped(crate::netpol::TABLE).unwrap_or_else(|e| {
                    eprintln!("warning: metrics: {e}");
                    (0, 0)
                });
                body.push_str(&render_policy(p, dropped));
            }
            if let Some(mut wg) = snapshot.wireguard {
                match crate::wireguard::dump(&mut wg.genl, wg.index, &wg.name).await {
                    Ok((_, _, peers)) => body.push_str(&render_wireguard(&peers, &wg.nodes, now())),
                    Err(e) => eprintln!("warning: metrics: {e}"),
                }
            }
            ("200 OK", "text/plain; version=0.0.4", body)
        }
        ("GET", "/healthz") if healthy(&snapshot, max_age) => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/healthz") => (
            "503 Service Unavailable",
            "text/plain",
            format!("no reconcile without errors in the last {}s\n", max_age.as_secs()),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found: use /healthz or /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".to_string()),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let stats = Stats {
            nodes_known: 2,
            routes_programmed: 3,
            reconcile_errors: 1,
            last_sync: Some(5.0),
            ..Stats::default()
        };
        let text = render(&stats);
        assert!(text.contains("# TYPE cni_rs_node_nodes_known gauge\ncni_rs_node_nodes_known 2\n"), "{text}");
        assert!(text.contains("cni_rs_node_routes_programmed 3\n"));
        assert!(text.contains("cni_rs_node_reconcile_errors_total 1\n"));
        assert!(text.contains("cni_rs_node_last_sync_timestamp_seconds 5.000\n"));
        assert!(text.contains("cni_rs_node_record_conflicts_total 0\n"));
        assert!(text.contains("cni_rs_node_records_rejected_total{reason=\"key_mismatch\"} 0\n"), "{text}");
        assert!(!healthy(&stats, Duration::from_secs(60)));
        let a = crate::wireguard::PeerState { last_handshake: 90, rx_bytes: 7, tx_bytes: 9, ..Default::default() };
        let peers = BTreeMap::from([([1; 32], a), ([2; 32], crate::wireguard::PeerState::default())]);
        let text = render_wireguard(&peers, &BTreeMap::from([([1; 32], "n2".to_string())]), 100.0);
        let k1 = crate::wgkey::encode(&[1; 32]);
        let k2 = crate::wgkey::encode(&[2; 32]);
        assert!(text.contains("cni_rs_node_wireguard_peers 2\n"), "{text}");
        for line in [
            format!("cni_rs_node_wireguard_last_handshake_age_seconds{{node=\"n2\",public_key=\"{k1}\"}} 10\n"),
            format!("cni_rs_node_wireguard_last_handshake_age_seconds{{node=\"\",public_key=\"{k2}\"}} +Inf\n"),
            format!("cni_rs_node_wireguard_received_bytes_total{{node=\"n2\",public_key=\"{k1}\"}} 7\n"),
            format!("cni_rs_node_wireguard_sent_bytes_total{{node=\"n2\",public_key=\"{k1}\"}} 9\n"),
        ] {
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(healthy(&Stats { last_sync: Some(now()), ..stats }, Duration::from_secs(60)));
    }

    #[test]
    fn renders_the_policy_histogram() {
        let mut p = PolicyStats { policies: 3, last_sync: Some(7.0), ..PolicyStats::default() };
        p.apply_seconds.observe(0.004);
        p.apply_seconds.observe(0.3);
        p.dropped_before = (5, 1);
        let text = render_policy(&p, (2, 0));
        for line in [
            "cni_rs_node_network_policies 3\n",
            "cni_rs_node_policy_last_sync_seconds 7.000\n",
            "cni_rs_node_policy_apply_errors_total 0\n",
            "# TYPE cni_rs_node_policy_apply_seconds histogram\n",
            "cni_rs_node_policy_apply_seconds_bucket{le=\"0.0025\"} 0\n",
            "cni_rs_node_policy_apply_seconds_bucket{le=\"0.005\"} 1\n",
            "cni_rs_node_policy_apply_seconds_bucket{le=\"0.5\"} 2\n",
            "cni_rs_node_policy_apply_seconds_bucket{le=\"+Inf\"} 2\n",
            "cni_rs_node_policy_apply_seconds_count 2\n",
            "cni_rs_node_policy_dropped_packets_total{direction=\"ingress\"} 7\n",
            "cni_rs_node_policy_dropped_packets_total{direction=\"egress\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
