//! NetworkPolicy enforcement: Namespaces, Pods and NetworkPolicies read by list + watch, compiled
//! ([`crate::policy`]) and kept in the node's `inet cni-rs-netpol` table.
//!
//! - Nothing is changed before all three lists are complete: a restarted agent leaves the table
//!   the last one made in place (it keeps enforcing what was true then) and swaps it for the new
//!   one in one transaction, so no connection the policies deny passes meanwhile.
//! - A change that leaves the rules as they are (a pod added, deleted or relabelled, a namespace
//!   relabelled) is applied as set elements; a policy change swaps the whole table, atomically.
//!   Either way the kernel applies all of it or none; a failure is logged, counted in
//!   `cni_rs_node_policy_apply_errors_total`, and retried with a whole-table swap.
//! - The table is swapped again every [`RESYNC`] from what the agent knows, which repairs
//!   anything changed by hand.
//! - A pod that starts before the agent has seen its Pod object with its address is not yet in
//!   any set: it is unprotected, and not anyone's allowed peer, until the watch event arrives
//!   (typically milliseconds after the kubelet reports the address). Kubernetes allows exactly this
//!   (a pod may start before the network plugin has handled the policies that select it).

use crate::etcd::Held;
use crate::metrics;
use crate::options::Options;
use crate::policy::{self, Cluster, Compiled, PodInfo};
use anyhow::anyhow;
use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Resource};
use netkit::firewall::netpol::{self, Element, Elements, Ruleset};
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// The table (`nft list table inet cni-rs-netpol`).
pub const TABLE: &str = "cni-rs-netpol";
/// How often the whole table is swapped from what the agent knows.
const RESYNC: Duration = Duration::from_secs(30);
/// Events arriving within this much of each other are applied together.
const COALESCE: Duration = Duration::from_millis(5);
/// After a failed apply.
const RETRY: Duration = Duration::from_secs(1);

/// Namespaces, Pods, NetworkPolicies.
const KINDS: usize = 3;

#[derive(Default)]
struct Known {
    cluster: Cluster,
    /// Which of the three lists is complete.
    synced: [bool; KINDS],
    /// What changed since the last apply.
    changes: Changes,
    /// When the oldest change not yet applied arrived.
    pending_since: Option<Instant>,
}

#[derive(Default)]
struct Changes {
    /// A namespace or policy changed, or a list was read: compile everything.
    all: bool,
    /// Pods that changed, each (before, after): only their elements move.
    pods: Vec<(Option<PodInfo>, Option<PodInfo>)>,
}

type Shared = Arc<(Mutex<Known>, Notify)>;

/// Removes the table (`--network-policy=false`, or a datastore without policies).
pub fn remove() {
    match netpol::remove(TABLE) {
        Ok(()) => {}
        Err(e) => eprintln!("warning: {e}"),
    }
}

/// Follows the cluster and keeps the table; runs forever.
pub async fn run(client: Client, options: Arc<Options>, mut held: watch::Receiver<Arc<Held>>, stats: metrics::Shared) {
    let shared: Shared = Arc::new((Mutex::new(Known::default()), Notify::new()));
    tokio::spawn(follow::<Namespace>(Api::all(client.clone()), 0, shared.clone(), |k, o, gone| {
        if gone {
            k.cluster.delete_namespace(o)
        } else {
            k.cluster.apply_namespace(o)
        }
        k.changes.all = true;
    }));
    tokio::spawn(follow::<Pod>(Api::all(client.clone()), 1, shared.clone(), |k, o, gone| {
        let key = policy::pod_key(o);
        let before = k.cluster.pods.get(&key).cloned();
        if gone {
            k.cluster.delete_pod(o)
        } else {
            k.cluster.apply_pod(o)
        }
        let after = k.cluster.pods.get(&key).cloned();
        if before != after {
            k.changes.pods.push((before, after));
        }
    }));
    tokio::spawn(follow::<NetworkPolicy>(Api::all(client), 2, shared.clone(), |k, o, gone| {
        if gone {
            k.cluster.delete_policy(o)
        } else {
            k.cluster.apply_policy(o)
        }
        k.changes.all = true;
    }));
    let cluster_range: Vec<IpNetwork> = options.cluster.iter().map(|(net, _)| *net).collect();
    // What the table holds (when the last apply succeeded), and when to swap it whole again.
    let mut compiled: Option<Compiled> = None;
    let mut next_full = Instant::now();
    let mut logged_waiting = false;
    let mut applied_once = false;
    // The pod CIDRs the compiled state used: this node's pods are believed only inside them.
    let mut compiled_for: Vec<IpNetwork> = Vec::new();
    loop {
        tokio::select! {
            _ = shared.1.notified() => tokio::time::sleep(COALESCE).await,
            r = held.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep_until(next_full.into()) => {}
        }
        let pod_cidrs = held.borrow_and_update().record.pod_cidrs.clone();
        let node = policy::Node { name: &options.node_name, pod_cidrs: &pod_cidrs, cluster: &cluster_range };
        let (plan, pending_since, count, why) = {
            let Ok(mut known) = shared.0.lock() else { return };
            if known.synced.iter().any(|s| !s) {
                if !logged_waiting {
                    eprintln!("NetworkPolicy: waiting for the first lists of namespaces, pods and policies");
                    logged_waiting = true;
                }
                continue;
            }
            let changes = std::mem::take(&mut known.changes);
            let since = known.pending_since.take();
            let count = known.cluster.policies.len();
            let swap = Instant::now() >= next_full;
            let all = changes.all || compiled_for != pod_cidrs;
            compiled_for.clone_from(&pod_cidrs);
            // Why the table is swapped, when it is and that is worth a line in the log.
            let mut why = None;
            let plan = match compiled.as_mut() {
                Some(c) if !swap && !all => {
                    // Netted over the batch: an element that came and went again is not sent.
                    let mut net: BTreeMap<(String, Element), i32> = BTreeMap::new();
                    for (old, new) in &changes.pods {
                        for (key, d) in c.pod_changed(&known.cluster, &node, old.as_ref(), new.as_ref()) {
                            *net.entry(key).or_insert(0) += d;
                        }
                    }
                    let (mut del, mut add) = (Elements::new(), Elements::new());
                    for ((set, e), d) in net {
                        match d {
                            1 => add.entry(set).or_default().insert(e),
                            -1 => del.entry(set).or_default().insert(e),
                            _ => continue,
                        };
                    }
                    Plan::Elements((del, add))
                }
                Some(c) if !swap => {
                    let new = policy::compile(&known.cluster, &node);
                    let plan = if new.rules == c.rules {
                        Plan::Elements(diff(&c.elements(), &new.elements()))
                    } else {
                        why = Some("the policies changed");
                        Plan::Replace(new.rules.clone(), new.elements())
                    };
                    *c = new;
                    plan
                }
                _ => {
                    if compiled.is_none() {
                        why = Some(if applied_once { "after a failure" } else { "first sync" });
                    }
                    let new = policy::compile(&known.cluster, &node);
                    let plan = Plan::Replace(new.rules.clone(), new.elements());
                    compiled = Some(new);
                    plan
                }
            };
            (plan, since, count, why)
        };
        if matches!(&plan, Plan::Elements((del, add)) if del.is_empty() && add.is_empty()) {
            continue;
        }
        let started = Instant::now();
        let what = match &plan {
            Plan::Replace(rules, _) => format!("table swapped, {} rules", rules.ingress.len() + rules.egress.len()),
            Plan::Elements((del, add)) => format!("{} elements added, {} deleted", size(add), size(del)),
        };
        let swapped = matches!(plan, Plan::Replace(..));
        // A swap starts the drop counters again: what they held is carried over in the metrics.
        let result = tokio::task::spawn_blocking(move || match plan {
            Plan::Replace(rules, elements) => {
                let dropped = netpol::dropped(TABLE).unwrap_or_default();
                netpol::replace(TABLE, &rules, &elements).map(|()| dropped)
            }
            Plan::Elements((del, add)) => netpol::update(TABLE, &del, &add).map(|()| (0, 0)),
        })
        .await;
        let result = match result {
            Ok(r) => r.map_err(anyhow::Error::from),
            Err(e) => Err(anyhow!("apply task: {e}")),
        };
        let latency = pending_since.map_or(started.elapsed(), |t| t.elapsed());
        match result {
            Ok(carried) => {
                if let Some(why) = why {
                    eprintln!("NetworkPolicy: enforcing {count} policies in table inet {TABLE} ({why}: {what})");
                }
                applied_once = true;
                if swapped {
                    next_full = Instant::now() + RESYNC;
                }
                if let Ok(mut s) = stats.lock() {
                    let p = s.policy.get_or_insert_with(Default::default);
                    p.policies = count;
                    p.last_sync = Some(metrics::now());
                    p.dropped_before.0 += carried.0;
                    p.dropped_before.1 += carried.1;
                    if pending_since.is_some() {
                        p.apply_seconds.observe(latency.as_secs_f64());
                    }
                }
            }
            Err(e) => {
                eprintln!("error: NetworkPolicy: {e} (nothing of this change applied; retrying with the whole table)");
                // The next round compiles everything and swaps the table.
                compiled = None;
                next_full = Instant::now() + RETRY;
                if let Ok(mut s) = stats.lock() {
                    s.policy.get_or_insert_with(Default::default).apply_errors += 1;
                }
                if let Ok(mut known) = shared.0.lock() {
                    known.pending_since = known.pending_since.min(pending_since).or(pending_since);
                }
            }
        }
    }
}

enum Plan {
    Replace(Ruleset, Elements),
    Elements((Elements, Elements)),
}

/// (to delete, to add) to go from `old` to `new`.
fn diff(old: &Elements, new: &Elements) -> (Elements, Elements) {
    let mut del = Elements::new();
    let mut add = Elements::new();
    for (set, elems) in new {
        let before = old.get(set);
        let added: std::collections::BTreeSet<_> =
            elems.iter().filter(|e| !before.is_some_and(|b| b.contains(e))).copied().collect();
        if !added.is_empty() {
            add.insert(set.clone(), added);
        }
        if let Some(before) = before {
            let gone: std::collections::BTreeSet<_> = before.difference(elems).copied().collect();
            if !gone.is_empty() {
                del.insert(set.clone(), gone);
            }
        }
    }
    (del, add)
}

fn size(e: &Elements) -> usize {
    e.values().map(|s| s.len()).sum()
}

/// Lists and watches one kind forever, keeping `shared` up to date and waking the applier.
async fn follow<K>(api: Api<K>, kind: usize, shared: Shared, change: fn(&mut Known, &K, bool))
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let what = ["namespaces", "pods", "networkpolicies"][kind];
    let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut listing: Option<Vec<K>> = None;
    let mut last_error = String::new();
    while let Some(event) = stream.next().await {
        let changed = match event {
            Ok(Event::Init) => {
                listing = Some(Vec::new());
                false
            }
            Ok(Event::InitApply(o)) => {
                listing.get_or_insert_with(Vec::new).push(o);
                false
            }
            Ok(Event::InitDone) => {
                let objects = listing.take().unwrap_or_default();
                let Ok(mut known) = shared.0.lock() else { return };
                match kind {
                    0 => known.cluster.namespaces.clear(),
                    1 => known.cluster.pods.clear(),
                    _ => known.cluster.policies.clear(),
                }
                for o in &objects {
                    change(&mut known, o, false);
                }
                known.changes = Changes { all: true, pods: Vec::new() };
                known.synced[kind] = true;
                known.pending_since.get_or_insert_with(Instant::now);
                last_error.clear();
                true
            }
            Ok(Event::Apply(o)) | Ok(Event::Delete(o)) if listing.is_some() => {
                // Not expected between Init and InitDone; keep the object for the listing.
                listing.get_or_insert_with(Vec::new).push(o);
                false
            }
            Ok(Event::Apply(o)) => update(&shared, |k| change(k, &o, false)),
            Ok(Event::Delete(o)) => update(&shared, |k| change(k, &o, true)),
            Err(e) => {
                let text = e.to_string();
                if text != last_error {
                    eprintln!("warning: kubernetes: watch {what}: {text}; retrying");
                    last_error = text;
                }
                false
            }
        };
        if changed {
            shared.1.notify_one();
        }
    }
}

fn update(shared: &Shared, f: impl FnOnce(&mut Known)) -> bool {
    let Ok(mut known) = shared.0.lock() else { return false };
    f(&mut known);
    known.pending_since.get_or_insert_with(Instant::now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use netkit::firewall::netpol::Element;

    #[test]
    fn diff_names_only_what_changed() {
        let a = |s: &str| Element::Addr(s.parse().unwrap());
        let old: Elements = [("s".to_string(), [a("10.0.0.1"), a("10.0.0.2")].into())].into();
        let new: Elements =
            [("s".to_string(), [a("10.0.0.2"), a("10.0.0.3")].into()), ("t".to_string(), [a("10.0.0.9")].into())]
                .into();
        let (del, add) = diff(&old, &new);
        assert_eq!(del, [("s".to_string(), [a("10.0.0.1")].into())].into());
        assert_eq!(add, [("s".to_string(), [a("10.0.0.3")].into()), ("t".to_string(), [a("10.0.0.9")].into())].into());
        assert_eq!(diff(&new, &new), (Elements::new(), Elements::new()));
    }
}
