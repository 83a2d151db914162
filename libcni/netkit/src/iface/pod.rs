//! The pod an interface plugin's ADD works on: the request, the pod's namespace, a netlink socket
//! inside it, and one in the host's namespace for a plugin that makes or takes its link there.

use super::result::chained;
use super::Undo;
use crate::{NetNs, Netlink};
use libcni::types::CniResult;
use libcni::{code, Error, Request, Result};
use std::cell::OnceCell;

/// An ADD's pod: what every step of [`super`] needs to find the pod and the attachment.
pub struct Pod<'r> {
    /// The runtime's request: `container_id` and `ifname` name the attachment.
    pub req: &'r Request,
    /// The pod's namespace, CNI_NETNS (never the plugin's own: [`crate::container_netns`]).
    pub ns: NetNs,
    /// A netlink socket inside the pod's namespace.
    pub nl: Netlink,
    host: OnceCell<Netlink>,
}

impl<'r> Pod<'r> {
    /// Opens the pod's namespace and a netlink socket inside it, for a plugin whose creation of
    /// `ifname` fails by itself when the pod has one (a link created directly under that name).
    pub fn open(req: &'r Request) -> Result<Pod<'r>> {
        let ns = crate::container_netns(req)?;
        let nl = Netlink::open_in(&ns)?;
        Ok(Pod { req, ns, nl, host: OnceCell::new() })
    }

    /// [`Pod::open`], refused when `CNI_IFNAME` already exists in the pod: an ADD without a DEL in
    /// between.
    pub fn open_for_add(req: &'r Request) -> Result<Pod<'r>> {
        let pod = Pod::open(req)?;
        pod.ensure_absent()?;
        Ok(pod)
    }

    /// The pod with `host` as its host socket: one the plugin opened before the pod's, to check
    /// what it needs on the host before anything else.
    pub fn with_host(self, host: Netlink) -> Pod<'r> {
        Pod { host: OnceCell::from(host), ..self }
    }

    /// A netlink socket in the host's namespace, opened on first use in the calling thread's
    /// namespace: never ask first inside the pod's ([`NetNs::enter`], [`NetNs::run`]).
    pub fn host(&self) -> Result<&Netlink> {
        if let Some(host) = self.host.get() {
            return Ok(host);
        }
        let host = Netlink::open()?;
        Ok(self.host.get_or_init(|| host))
    }

    pub fn container_id(&self) -> &'r str {
        &self.req.container_id
    }

    pub fn ifname(&self) -> &'r str {
        &self.req.ifname
    }

    /// Fails when `ifname` already exists in the pod's namespace.
    pub(super) fn ensure_absent(&self) -> Result<()> {
        if self.nl.link(self.ifname())?.is_some() {
            return Err(Error::new(
                code::NETWORK,
                format!(
                    "interface {} already exists in {}: DEL the attachment first",
                    self.ifname(),
                    self.ns.path().display()
                ),
            ));
        }
        Ok(())
    }

    /// An interface plugin's ADD: runs `steps` with an [`Undo`] that runs when they fail; on
    /// success their result, chained after prevResult ([`chained`]).
    pub fn add_chained<'a>(&'a self, steps: impl FnOnce(&mut Undo<'a>) -> Result<CniResult>) -> Result<CniResult> {
        Undo::guarded(steps).map(|r| chained(self.req.conf.prev_result.as_ref(), r))
    }
}
