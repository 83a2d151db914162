//! loopback's hostile-input table: its rows and the test that runs them, against the debug build in
//! `plugins/loopback/tests/hostile.rs` and against the shipped static binary in `tests/tests/hostile.rs`.

use super::{common_cases, netns_cases, run_table, Fixture};
use std::path::Path;

/// Every row of loopback's table through its binary in `bins`: each refused with its code, nothing left behind.
pub fn refuses_hostile_input(bins: &Path) {
    let f = Fixture::new(bins);
    let mut cases = common_cases(&f, "loopback");
    cases.extend(netns_cases(&f, "loopback"));
    run_table(&f, "loopback", &cases);
}
