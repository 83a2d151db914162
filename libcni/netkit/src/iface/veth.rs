//! A veth pair from the host into the pod (bridge, ptp): `<host name>` on the host, `ifname` in
//! the pod, made in one request, the host end named after the attachment ([`host_veth_name`]).
//! Deleting either end removes the pair, and the kernel removes it with the pod's namespace: DEL
//! deletes the pod's end, or the host end when a process still holds a namespace gone from its path.

use super::inpod::delete_in;
use super::naming::{host_veth_name, HOST_NAME_ATTEMPTS};
use super::Pod;
use crate::{Link, Mac, Netlink};
use libcni::{Error, Request, Result};

/// Creates the pair `<host name>` (on the host) - the pod's `ifname` in one request; the host
/// end's name and link. The pod has no `ifname` ([`Pod::open_for_add`]) and the pair dies with
/// the pod's namespace, so a host link holding a candidate name is another pod's: the next is tried.
pub fn create(pod: &Pod, mtu: Option<u32>, mac: Option<Mac>) -> Result<(String, Link)> {
    let (host, container_id, ifname) = (pod.host()?, pod.container_id(), pod.ifname());
    for attempt in 0..HOST_NAME_ATTEMPTS {
        let candidate = host_veth_name(container_id, ifname, attempt);
        if host.link(&candidate)?.is_some() {
            continue;
        }
        match host.create_veth(&candidate, ifname, &pod.ns, mtu, mac) {
            Ok(link) => return Ok((candidate, link)),
            // Another ADD took the name between the lookup and the create.
            Err(e) if crate::is_exists(&e) && host.link(&candidate)?.is_some() => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::network(format!("no free host veth name for {container_id}:{ifname} after {HOST_NAME_ATTEMPTS} tries")))
}

/// DEL's link removal; the errors, in order. `started` is called as the deletion request goes out
/// (not at all when there is nothing to delete). Deleting the pod's end removes the pair. The
/// plugin's own namespace is refused: deleting CNI_IFNAME there would take a node interface.
pub fn del(req: &Request, started: impl FnOnce()) -> Vec<Error> {
    let mut errs = Vec::new();
    match crate::container_netns_for_del(req) {
        Ok(Some(ns)) => errs.extend(delete_in(&ns, &req.ifname, started).err()),
        Ok(None) => errs.extend(del_stranded_host_end(req, started).err()),
        Err(e) => errs.push(e),
    }
    errs
}

/// DEL when the pod's namespace is gone from its path (or CNI_NETNS is unset). The kernel removed
/// the pair with the namespace, unless a process still holds the namespace: then the host end is
/// still there. It is deleted only when it is certainly ours: prevResult lists it under one of the
/// names ADD picks for this attachment, and it is a veth with the MAC prevResult records (a host
/// link that merely has our name may be another pod's, after a hash collision).
fn del_stranded_host_end(req: &Request, started: impl FnOnce()) -> Result<()> {
    let Some(prev) = &req.conf.prev_result else { return Ok(()) };
    let names: Vec<String> =
        (0..HOST_NAME_ATTEMPTS).map(|attempt| host_veth_name(&req.container_id, &req.ifname, attempt)).collect();
    let Some((name, mac)) = prev
        .interfaces
        .iter()
        .filter(|i| i.sandbox.as_deref().is_none_or(str::is_empty) && names.contains(&i.name))
        .find_map(|i| Some((i.name.clone(), i.mac.clone()?)))
    else {
        return Ok(());
    };
    let host = Netlink::open()?;
    let Some(link) = host.link(&name)? else { return Ok(()) };
    let same_mac = link.mac_string().is_some_and(|have| have.eq_ignore_ascii_case(&mac));
    if link.kind.as_deref() != Some("veth") || !same_mac {
        return Ok(());
    }
    started();
    match host.delete_link_by_name(&name) {
        Err(e) if !crate::is_not_found(&e) => Err(e),
        _ => Ok(()),
    }
}
