//! A link created straight into the pod under its `ifname` (macvlan, ipvlan, vlan), from the
//! namespace where its parent lives; and DEL of a link that lives only in the pod (the kernel
//! removes it with the namespace).

use super::naming::{temp_link_name, HOST_NAME_ATTEMPTS};
use super::Pod;
use crate::{Link, NetNs, Netlink};
use libcni::{Error, Request, Result};

/// Creates the pod's `ifname` directly under that name with a request sent from `creator` (where
/// the link's parent lives: the host, or the pod itself); `create(name)` sends the request for a
/// link called `name` placed in the pod's namespace. Returns the link as the pod sees it; on
/// failure nothing is left.
///
/// A rename costs the kernel an RCU grace period, so the name is given at creation. EEXIST means
/// the pod already has `ifname` (refused as [`Pod::open_for_add`] does: the caller need not ask
/// first), or the kernel is one that looks the name up in `creator`'s namespace, which has a link
/// so named (before Linux 6.14; see [`create_renamed`], which ADD then falls back to).
pub fn create(creator: &Netlink, pod: &Pod, create: impl Fn(&str) -> Result<()>) -> Result<Link> {
    match create(pod.ifname()) {
        Ok(()) => created(pod, pod.ifname()),
        Err(e) if crate::is_exists(&e) => {
            pod.ensure_absent()?;
            create_renamed(creator, pod, create)
        }
        Err(e) => Err(e),
    }
}

/// The link `name` the pod has just been given.
fn created(pod: &Pod, name: &str) -> Result<Link> {
    pod.nl.link(name)?.ok_or_else(|| {
        Error::network(format!("link {name} is missing in {} right after creation", pod.ns.path().display()))
    })
}

/// Creates the pod's `ifname` with a request sent from another namespace (`creator`, where the
/// link's parent lives: a VLAN's master on the host), then renames it inside the pod.
/// `create(name)` sends the request for a link called `name` placed in the pod's namespace.
///
/// Older kernels (Debian 12's 6.1 among them; 6.18 no longer does) look a new link's name up in the
/// namespace the request comes from before creating it, so creating `eth0` for the pod from a host
/// that has its own `eth0` fails with EEXIST there: the link is made under a temporary name free on
/// the host ([`temp_link_name`]), as the reference plugins do (`plugins/vlan/tests/vm_vlan.rs`).
/// Returns the pod's link; on failure nothing is left.
pub fn create_renamed(creator: &Netlink, pod: &Pod, create: impl Fn(&str) -> Result<()>) -> Result<Link> {
    let (container_id, ifname) = (pod.container_id(), pod.ifname());
    // Whether either namespace has a link named `name`.
    let taken = |name: &str| -> Result<bool> { Ok(creator.link(name)?.is_some() || pod.nl.link(name)?.is_some()) };
    let mut made = None;
    for attempt in 0..HOST_NAME_ATTEMPTS {
        let temp = temp_link_name(container_id, ifname, attempt);
        if taken(&temp)? {
            continue;
        }
        match create(&temp) {
            Ok(()) => {
                made = Some(temp);
                break;
            }
            // Another ADD took the name between the lookup and the create; EEXIST for another
            // reason (a VLAN id already used on the master) is the error.
            Err(e) if crate::is_exists(&e) && taken(&temp)? => continue,
            Err(e) => return Err(e),
        }
    }
    let temp = made.ok_or_else(|| {
        Error::network(format!(
            "no free temporary link name for {container_id}:{ifname} after {HOST_NAME_ATTEMPTS} tries"
        ))
    })?;
    let link = created(pod, &temp)?;
    if let Err(e) = pod.nl.set_name(link.index, ifname) {
        let _ = pod.nl.delete_link(link.index);
        return Err(e.context(format_args!("rename {temp} to {ifname} in {}", pod.ns.path().display())));
    }
    Ok(Link { name: ifname.to_string(), ..link })
}

/// Deletes `CNI_IFNAME` in the pod's namespace, for a plugin whose link lives only there (macvlan,
/// ipvlan: the kernel removes it with the namespace, so a namespace that is gone, or CNI_NETNS
/// unset, leaves nothing to do). A missing link is success. The plugin's own namespace is refused.
pub fn del(req: &Request) -> Result<()> {
    match crate::container_netns_for_del(req)? {
        Some(ns) => delete_in(&ns, &req.ifname, || {}),
        None => Ok(()),
    }
}

/// Deletes `ifname` in `ns`, calling `started` as the request goes out.
pub(super) fn delete_in(ns: &NetNs, ifname: &str, started: impl FnOnce()) -> Result<()> {
    let nl = Netlink::open_in(ns)?;
    started();
    nl.delete_link_by_name(ifname).map(|_| ())
}
