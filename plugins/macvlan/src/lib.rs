//! macvlan: the pod's interface is a macvlan on a master link (`master`, else the interface of the
//! default route), in bridge, private, vepa or passthru mode, with addresses from IPAM or, without
//! IPAM, layer 2 only. The verbs are the ones every link-on-a-master plugin shares
//! ([`netkit::iface::sublink`]); what is macvlan's own is its configuration.

pub mod config;

use netkit::iface::sublink::SubLinkPlugin;

/// The plugin. `CNI_ARGS`: `MAC`, and `IP` for host-local and static, which get our CNI_ARGS.
pub const PLUGIN: SubLinkPlugin = SubLinkPlugin { parse: config::parse, known_args: &["MAC", "IP"] };
