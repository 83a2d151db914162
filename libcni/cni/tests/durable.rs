//! `libcni::durable::write` on a full disk (a small tmpfs, privileged): a CNI I/O error naming the
//! path, the file as it was before, and no temporary file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cni_tests::{require_root, Mount, TempDir};
use libcni::durable;

#[test]
fn a_full_disk_is_an_io_error_and_leaves_the_old_file_whole() {
    require_root();
    let dir = TempDir::new("cnidur");
    let mount = Mount::tmpfs(dir.path(), "16k");
    let path = dir.path().join("state/c1_eth0.json");
    durable::write(&path, b"{\"alias\":\"orig\"}", "test: save").expect("write on an empty disk");
    mount.fill();

    let e = durable::write(&path, &[b'x'; 8192], "test: save").expect_err("write on a full disk");
    assert_eq!(e.code, libcni::code::IO, "{e}");
    let want = format!("test: save: write {}: No space left on device", path.display());
    assert!(e.msg.starts_with(&want), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"{\"alias\":\"orig\"}", "the old file is not whole");
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["c1_eth0.json"], "a temporary file stays");

    // A new file that does not fit: nothing at its name.
    let other = dir.path().join("state/c2_eth0.json");
    let e = durable::write(&other, &[b'x'; 8192], "test: save").expect_err("a new file on a full disk");
    assert_eq!(e.code, libcni::code::IO, "{e}");
    assert!(!other.exists(), "a half-written file");
    drop(mount);
}
