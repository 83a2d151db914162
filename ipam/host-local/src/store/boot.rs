//! Which boot of the kernel the store last allocated in, so that the first allocation after a reboot can
//! release the reservations of attachments that vanished with it (the runtime never DELs those).
//!
//! The boot is recorded as the name of an empty hidden file, `.cni-rs-boot.<boot id>`: the listing every
//! verb makes under the lock already sees it, so knowing the recorded boot costs no read, and checking it
//! costs one read of `/proc/sys/kernel/random/boot_id` per ADD. The name never parses as an address, and an
//! empty file never matches a container ID in the reference's DEL, so the reference ignores it.
//!
//! A reservation was made in an earlier boot when its file last changed before this boot started
//! (wall clock now minus `CLOCK_BOOTTIME`): ours and the reference's alike, and a reservation the reference
//! made in this boot, before our first allocation, is kept. This trusts the wall clock across the reboot:
//! a node whose clock starts behind the time of its last boot's reservations keeps those until a later
//! reboot.

use libcni::{Error, Result};
use std::io::Read;
use std::time::{Duration, SystemTime};

/// The marker's name, before the boot id.
pub(super) const MARKER_PREFIX: &str = ".cni-rs-boot.";

/// Where the kernel gives the id of the running boot (a random UUID made at boot).
const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

/// Test hook, honoured only in debug builds (the test binaries; never a release build): `<boot id>,<boot
/// start in nanoseconds since the epoch>` stands for the running boot. It is a value, not a path: whoever
/// sets it can only make the plugin believe in another boot, never read or write elsewhere (the id must be
/// a UUID, as the kernel writes it, before it becomes part of a file name). A network configuration cannot
/// set it.
pub const TEST_BOOT_ENV: &str = "CNI_RS_TEST_BOOT";

/// The running boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// The kernel's boot id, a UUID in lower case.
    pub id: String,
    /// When it started, by the wall clock.
    pub started: SystemTime,
}

impl Boot {
    /// The running boot, or `None` when the kernel does not say (no /proc): reservations are then kept.
    pub fn current() -> Result<Option<Boot>> {
        if cfg!(debug_assertions) {
            if let Ok(fake) = std::env::var(TEST_BOOT_ENV) {
                return Boot::parse_test_hook(&fake).map(Some);
            }
        }
        // One read: the kernel hands the whole 37 bytes at once (read_to_string would stat and read thrice).
        let mut buf = [0u8; 64];
        let Ok(len) = std::fs::File::open(BOOT_ID_FILE).and_then(|mut f| f.read(&mut buf)) else { return Ok(None) };
        let id = std::str::from_utf8(&buf[..len]).unwrap_or_default().trim();
        if !is_uuid(id) {
            return Err(Error::new(
                libcni::code::IO,
                format!("{BOOT_ID_FILE} holds {id:?}, not a boot id; host-local cannot tell boots apart"),
            ));
        }
        let since_boot = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(|t| Duration::new(u64::try_from(t.tv_sec()).unwrap_or(0), u32::try_from(t.tv_nsec()).unwrap_or(0)))
            .unwrap_or_default();
        let started = SystemTime::now().checked_sub(since_boot).unwrap_or(SystemTime::UNIX_EPOCH);
        Ok(Some(Boot { id: id.to_ascii_lowercase(), started }))
    }

    fn parse_test_hook(value: &str) -> Result<Boot> {
        let bad =
            || Error::env(format!("{TEST_BOOT_ENV}={value:?}: expected <boot id (a UUID)>,<nanoseconds since 1970>"));
        let (id, nanos) = value.split_once(',').ok_or_else(bad)?;
        let nanos: u64 = nanos.parse().map_err(|_| bad())?;
        if !is_uuid(id) {
            return Err(bad());
        }
        Ok(Boot { id: id.to_ascii_lowercase(), started: SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos) })
    }

    /// The name of the marker that records this boot.
    pub(super) fn marker(&self) -> String {
        format!("{MARKER_PREFIX}{}", self.id)
    }
}

/// `8-4-4-4-12` hex digits, as the kernel writes a boot id: safe as part of a file name.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_gives_a_boot_id_and_a_start_in_the_past() {
        // The test binary is a debug build: make sure the hook is not set from outside.
        if std::env::var_os(TEST_BOOT_ENV).is_some() {
            return;
        }
        let boot = Boot::current().unwrap().unwrap();
        assert!(is_uuid(&boot.id), "{}", boot.id);
        assert!(boot.started < SystemTime::now());
        assert_eq!(boot.marker(), format!(".cni-rs-boot.{}", boot.id));
    }

    #[test]
    fn the_test_hook_takes_only_a_uuid_and_a_time() {
        let boot = Boot::parse_test_hook("0E8B1E4C-36B5-4C5A-9A55-2E0B8A6C1F00,1500000000").unwrap();
        assert_eq!(boot.id, "0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00");
        assert_eq!(boot.started, SystemTime::UNIX_EPOCH + Duration::from_nanos(1_500_000_000));
        for bad in [
            "",
            "0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00",
            "../../etc/passwd,1",
            "0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f0/,1",
            "0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00,-1",
            "0e8b1e4c-36b5-4c5a-9a55-2e0b8a6c1f00,soon",
            "0e8b1e4c36b54c5a9a552e0b8a6c1f00,1",
        ] {
            assert!(Boot::parse_test_hook(bad).is_err(), "{bad:?}");
        }
    }
}
