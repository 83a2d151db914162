#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, Netns};
use netkit::sysctl;
use netkit::Family;
use netkit::{NetNs, Netlink};
use std::io::{Read, Seek};

const KEY: &str = "net/ipv4/conf/lo/route_localnet";

fn flip(v: &str) -> &'static str {
    if v == "1" {
        "0"
    } else {
        "1"
    }
}

#[test]
fn sysctl_follows_the_namespace_of_the_opening_thread() {
    require_root();
    let tns = Netns::new("cnk-");
    let ns = NetNs::open(&tns.path).unwrap();
    let host_value = sysctl::get(KEY).unwrap();
    let inside_before = sysctl::get_in(&ns, KEY).unwrap();
    assert_eq!(inside_before, "0");
    let want = flip(&host_value);

    // Written on this thread while it is in the namespace: lands in the namespace only.
    {
        let _g = ns.enter().unwrap();
        sysctl::set(KEY, want).unwrap();
        assert_eq!(sysctl::get(KEY).unwrap(), want);
    }
    assert_eq!(sysctl::get(KEY).unwrap(), host_value, "host value must not change");
    assert_eq!(tns.sh("cat", &[&format!("/proc/sys/{KEY}")]).trim(), want);
    assert_eq!(sysctl::get_in(&ns, KEY).unwrap(), want);

    // The namespace is fixed when the file is opened: a file opened on the host keeps reading the
    // host's value after the thread enters the namespace, and one opened inside keeps the
    // namespace's after it leaves.
    let mut host_file = std::fs::File::open(format!("/proc/sys/{KEY}")).unwrap();
    let inside_file = {
        let _g = ns.enter().unwrap();
        let mut s = String::new();
        host_file.read_to_string(&mut s).unwrap();
        assert_eq!(s.trim(), host_value, "file opened on the host reads the host");
        std::fs::File::open(format!("/proc/sys/{KEY}")).unwrap()
    };
    let mut s = String::new();
    (&inside_file).rewind().unwrap();
    (&inside_file).read_to_string(&mut s).unwrap();
    assert_eq!(s.trim(), want, "file opened inside reads the namespace");

    // Another thread of the same process, never in the namespace, sees the host.
    let other = std::thread::spawn(|| sysctl::get(KEY).unwrap()).join().unwrap();
    assert_eq!(other, host_value);

    sysctl::set_in(&ns, KEY, "0").unwrap();
    assert_eq!(sysctl::get_in(&ns, KEY).unwrap(), "0");
}

#[test]
fn per_interface_sysctls_inside_a_namespace() {
    require_root();
    let tns = Netns::new("cnk-");
    let ns = NetNs::open(&tns.path).unwrap();
    let nl = Netlink::open_in(&ns).unwrap();
    nl.create_veth("cnksys0", "cnksys1", &ns, None, None).unwrap();
    {
        let _g = ns.enter().unwrap();
        assert!(!sysctl::ipv6_disabled());
        sysctl::set_if("cnksys1", Family::V6, "accept_dad", "0").unwrap();
        sysctl::set_if("cnksys1", Family::V6, "accept_ra", "0").unwrap();
        sysctl::set_if("cnksys1", Family::V4, "arp_notify", "1").unwrap();
        assert_eq!(sysctl::get_if("cnksys1", Family::V6, "accept_dad").unwrap(), "0");
        sysctl::enable_forwarding(Family::V4).unwrap();
        assert_eq!(sysctl::get("net/ipv4/ip_forward").unwrap(), "1");
        // An interface that is not there: not found, naming the key.
        let e = sysctl::set_if("cnknone0", Family::V4, "arp_notify", "1").unwrap_err();
        assert!(netkit::is_not_found(&e), "{e}");
        assert!(e.msg.contains("net/ipv4/conf/cnknone0/arp_notify"), "{e}");
    }
    assert_eq!(tns.sh("sysctl", &["-n", "net.ipv6.conf.cnksys1.accept_dad"]).trim(), "0");
    assert_eq!(tns.sh("sysctl", &["-n", "net.ipv4.conf.cnksys1.arp_notify"]).trim(), "1");
    // The host has no such interface.
    assert!(netkit::is_not_found(&sysctl::get_if("cnksys1", Family::V6, "accept_dad").unwrap_err()));
}
