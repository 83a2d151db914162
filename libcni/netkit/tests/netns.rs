#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, sh, unique, Netns};
use libcni::code;
use netkit::NetNs;
use std::os::unix::fs::MetadataExt;

fn thread_netns_inode() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino()
}

#[test]
fn open_rejects_a_regular_file_and_a_directory() {
    let dir = std::env::temp_dir().join(unique("cnk-notns-"));
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("file");
    std::fs::write(&file, "x").unwrap();

    let e = NetNs::open(&file).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");
    assert_eq!(e.msg, format!("CNI_NETNS {} is not a network namespace (it is a regular file)", file.display()));
    assert!(!netkit::is_not_found(&e));

    let e = NetNs::open(&dir).unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");
    assert!(e.msg.ends_with("is not a network namespace (it is a directory)"), "{e}");

    // A namespace, but not a network one.
    let e = NetNs::open("/proc/self/ns/uts").unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");
    assert!(e.msg.contains("of another type, uts"), "{e}");

    // A file under /proc that is not a namespace.
    let e = NetNs::open("/proc/self/status").unwrap_err();
    assert_eq!(e.code, code::INVALID_ENV, "{e}");

    // What it names is never opened: a FIFO (whose open would wait for a writer forever) and a
    // character device are refused at once, for ADD and DEL alike.
    let fifo = dir.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send((NetNs::open(&probe).map(drop), NetNs::open_for_del(&probe).map(drop)));
    });
    let (add, del) = rx.recv_timeout(std::time::Duration::from_secs(5)).expect("opening a FIFO as a netns hangs");
    for e in [add.unwrap_err(), del.unwrap_err()] {
        assert_eq!(e.code, code::INVALID_ENV, "{e}");
        assert!(e.msg.ends_with("is not a network namespace (it is a pipe)"), "{e}");
    }
    let e = NetNs::open("/dev/null").unwrap_err();
    assert!(e.msg.ends_with("is not a network namespace (it is a character device)"), "{e}");

    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_missing_path_is_distinguishable() {
    let path = format!("/run/netns/{}", unique("cnk-missing-"));
    let e = NetNs::open(&path).unwrap_err();
    assert!(netkit::is_not_found(&e), "{e}");
    assert!(e.msg.contains(&path), "{e}");
    assert!(NetNs::open_if_exists(&path).unwrap().is_none());
    // A path through a regular file is just as missing.
    assert!(NetNs::open_if_exists("/etc/hostname/x").unwrap().is_none());
    // But not a path that exists and is wrong.
    assert!(NetNs::open_if_exists("/etc/hostname").is_err());
}

#[test]
fn current_namespace_is_itself() {
    let cur = NetNs::current().unwrap();
    assert!(cur.same_as_current().unwrap());
    let by_proc = NetNs::open(format!("/proc/{}/task/{}/ns/net", std::process::id(), nix::unistd::gettid())).unwrap();
    assert!(by_proc.same_as(&cur).unwrap());
}

#[test]
fn guard_enters_and_restores_the_original_namespace() {
    require_root();
    let tns = Netns::new("cnk-");
    let ns = NetNs::open(&tns.path).unwrap();
    assert!(!ns.same_as_current().unwrap());
    let before = thread_netns_inode();
    let target = std::fs::metadata(&tns.path).unwrap().ino();
    assert_ne!(before, target);
    {
        let guard = ns.enter().unwrap();
        assert_eq!(thread_netns_inode(), target);
        assert!(ns.same_as_current().unwrap());
        assert_eq!(guard.original().id().unwrap().1, before);
    }
    assert_eq!(thread_netns_inode(), before);

    // Explicit leave, and run().
    let guard = ns.enter().unwrap();
    assert_eq!(thread_netns_inode(), target);
    guard.leave().unwrap();
    assert_eq!(thread_netns_inode(), before);
    assert_eq!(ns.run(thread_netns_inode).unwrap(), target);
    assert_eq!(thread_netns_inode(), before);

    // Nested guards unwind in order.
    let other = Netns::new("cnk-");
    let other_ns = NetNs::open(&other.path).unwrap();
    {
        let _a = ns.enter().unwrap();
        {
            let _b = other_ns.enter().unwrap();
            assert_eq!(thread_netns_inode(), std::fs::metadata(&other.path).unwrap().ino());
        }
        assert_eq!(thread_netns_inode(), target);
    }
    assert_eq!(thread_netns_inode(), before);
}

#[test]
fn handle_survives_the_path_being_removed() {
    require_root();
    let tns = Netns::new("cnk-");
    let ns = NetNs::open(&tns.path).unwrap();
    let id = ns.id().unwrap();
    drop(tns); // ip netns del: unmounts the path
    assert!(NetNs::open_if_exists(ns.path()).unwrap().is_none());
    // The fd keeps the namespace alive and usable.
    assert_eq!(ns.id().unwrap(), id);
    let nl = netkit::Netlink::open_in(&ns).unwrap();
    let links = nl.links().unwrap();
    assert_eq!(links.iter().map(|l| l.name.as_str()).collect::<Vec<_>>(), vec!["lo"]);
}

/// DEL's view: a path that is gone, or left as an empty file by an unmount, is `None`; a file
/// with content, a directory or another namespace type is still an error; a namespace opens.
#[test]
fn open_for_del_treats_an_unmounted_mount_point_as_gone() {
    let dir = std::env::temp_dir().join(unique("cnk-del-"));
    std::fs::create_dir(&dir).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, "").unwrap();
    let full = dir.join("full");
    std::fs::write(&full, "x").unwrap();
    assert!(NetNs::open_for_del(&empty).unwrap().is_none());
    assert!(NetNs::open_for_del(dir.join("missing")).unwrap().is_none());
    assert!(NetNs::open_for_del(empty.join("below-a-file")).unwrap().is_none());
    for wrong in [&full, &dir] {
        assert_eq!(NetNs::open_for_del(wrong).unwrap_err().code, code::INVALID_ENV, "{}", wrong.display());
    }
    assert_eq!(NetNs::open_for_del("/proc/self/ns/uts").unwrap_err().code, code::INVALID_ENV);
    // ADD's view of the same file is unchanged: not a namespace.
    assert_eq!(NetNs::open(&empty).unwrap_err().code, code::INVALID_ENV);
    assert!(NetNs::open_for_del("/proc/self/ns/net").unwrap().is_some());
    std::fs::remove_dir_all(&dir).unwrap();

    require_root();
    let tns = Netns::new("cnk-");
    assert!(NetNs::open_for_del(&tns.path).unwrap().is_some());
    sh("umount", &[&tns.path]);
    assert!(NetNs::open_for_del(&tns.path).unwrap().is_none(), "the mount point left by umount");
}
