//! The plugins cni-rs ships, by type name and role: the one list that the multi-call binary
//! (`cni-rs`, which pairs each name with its code and checks in a test that the two agree), invoke's
//! refusal of a non-IPAM plugin as `ipam.type`, the image build (`cni-rs --plugins` prints the
//! names) and the tests read. Names and roles only: libcni stays free of the plugins' code.

/// What a plugin does in a network configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Creates or moves the pod's interface (the first plugin of a conflist; the reference's "main").
    Interface,
    /// Hands out addresses to an interface plugin that delegates to it (`ipam.type`).
    Ipam,
    /// Works on a previous plugin's result later in a chain (the reference's "meta" plugins).
    Chained,
}

/// One plugin of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// The CNI type name, the file name it is installed under.
    pub name: &'static str,
    pub role: Role,
}

const fn entry(name: &'static str, role: Role) -> Registered {
    Registered { name, role }
}

/// Every plugin cni-rs ships, sorted by name.
pub const PLUGINS: [Registered; 18] = [
    entry("bandwidth", Role::Chained),
    entry("bridge", Role::Interface),
    entry("dhcp", Role::Ipam),
    entry("dummy", Role::Interface),
    entry("firewall", Role::Chained),
    entry("host-device", Role::Interface),
    entry("host-local", Role::Ipam),
    entry("ipvlan", Role::Interface),
    entry("loopback", Role::Interface),
    entry("macvlan", Role::Interface),
    entry("portmap", Role::Chained),
    entry("ptp", Role::Interface),
    entry("sbr", Role::Chained),
    entry("static", Role::Ipam),
    entry("tap", Role::Interface),
    entry("tuning", Role::Chained),
    entry("vlan", Role::Interface),
    entry("vrf", Role::Chained),
];

/// The names of [`PLUGINS`], in its order.
pub const NAMES: [&str; PLUGINS.len()] = {
    let mut names = [""; PLUGINS.len()];
    let mut i = 0;
    while i < PLUGINS.len() {
        names[i] = PLUGINS[i].name;
        i += 1;
    }
    names
};

/// The multi-call binary's own name: run under it, it is none of the plugins.
pub const MULTI_CALL: &str = "cni-rs";

/// The role of the plugin named `name`; None when cni-rs ships no plugin of that name.
pub fn role(name: &str) -> Option<Role> {
    PLUGINS.iter().find(|p| p.name == name).map(|p| p.role)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_unique_and_named_as_installed() {
        assert!(NAMES.windows(2).all(|w| w[0] < w[1]), "sorted, no name twice: {NAMES:?}");
        assert!(NAMES.iter().all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')));
        assert!(!NAMES.contains(&MULTI_CALL));
    }

    #[test]
    fn roles() {
        assert_eq!(role("host-local"), Some(Role::Ipam));
        assert_eq!(role("bridge"), Some(Role::Interface));
        assert_eq!(role("portmap"), Some(Role::Chained));
        assert_eq!(role("cni-rs"), None);
        assert_eq!(role("flannel"), None);
        let ipam: Vec<&str> = PLUGINS.iter().filter(|p| p.role == Role::Ipam).map(|p| p.name).collect();
        assert_eq!(ipam, ["dhcp", "host-local", "static"]);
    }
}
