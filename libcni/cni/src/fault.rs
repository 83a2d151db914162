//! Test-only fault injection: named points after each state-changing step of an ADD, where a test
//! can kill the plugin (`CNI_RS_FAULT_AT`, like kill -9) or make the step fail
//! (`CNI_RS_FAIL_AT`). A variable matches a point by its name, or by its 1-based position among
//! the points this process has passed.
//!
//! Only compiled in with the `fault-injection` cargo feature; without it [`fault_point`] is an
//! inlined `Ok(())` and the variables mean nothing.

use crate::error::Result;

/// Kills the process (`CNI_RS_FAULT_AT`) or returns an error (`CNI_RS_FAIL_AT`) when the
/// environment names this point; otherwise `Ok(())`.
#[cfg(feature = "fault-injection")]
pub fn fault_point(step: &str) -> Result<()> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static PASSED: AtomicUsize = AtomicUsize::new(0);
    let index = PASSED.fetch_add(1, Ordering::Relaxed) + 1;
    let named = |var: &str| {
        std::env::var(var).is_ok_and(|want| want == step || want.parse::<usize>().is_ok_and(|n| n == index))
    };
    if named("CNI_RS_FAULT_AT") {
        eprintln!("fault injection: killing the process at step {index} {step:?} (CNI_RS_FAULT_AT)");
        // SAFETY: getpid and kill have no preconditions; SIGKILL ends the process here.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    if named("CNI_RS_FAIL_AT") {
        return Err(crate::Error::new(
            crate::code::IO,
            format!("fault injection: step {index} {step:?} failed (CNI_RS_FAIL_AT)"),
        ));
    }
    Ok(())
}

/// Without the `fault-injection` feature: nothing.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub fn fault_point(_step: &str) -> Result<()> {
    Ok(())
}
