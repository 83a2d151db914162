//! The code behind each name the multi-call binary `cni-rs` answers to (the names and roles are
//! libcni's registry, `libcni::registry`), and its allocator.

pub mod alloc;

use libcni::registry;
use libcni::Plugin;

/// Each registered plugin's name with its code, in the registry's order (a test checks that the two
/// name the same plugins).
const RUNNERS: [(&str, &dyn Plugin); registry::PLUGINS.len()] = [
    ("bandwidth", &bandwidth::Bandwidth),
    ("bridge", &bridge::Bridge),
    ("dhcp", &dhcp::Dhcp),
    ("dummy", &dummy::Dummy),
    ("firewall", &firewall::Firewall),
    ("host-device", &host_device::HostDevice),
    ("host-local", &host_local::HostLocal),
    ("ipvlan", &ipvlan::PLUGIN),
    ("loopback", &loopback::Loopback),
    ("macvlan", &macvlan::PLUGIN),
    ("portmap", &portmap::PortMap),
    ("ptp", &ptp::Ptp),
    ("sbr", &sbr::Sbr),
    ("static", &static_ipam::Static),
    ("tap", &tap::Tap),
    ("tuning", &tuning::Tuning),
    ("vlan", &vlan::Vlan),
    ("vrf", &vrf::Vrf),
];

/// The plugin of type `plugin_type`; None when it is not one of ours.
pub fn plugin(plugin_type: &str) -> Option<&'static dyn Plugin> {
    RUNNERS.iter().find(|(name, _)| *name == plugin_type).map(|&(_, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runners_are_the_registry() {
        let runners: Vec<&str> = RUNNERS.iter().map(|(name, _)| *name).collect();
        assert_eq!(runners, registry::NAMES);
        for name in registry::NAMES {
            assert!(plugin(name).is_some(), "{name}");
        }
        assert!(plugin(registry::MULTI_CALL).is_none());
        assert!(plugin("flannel").is_none());
    }
}
