//! The allocator of the multi-call binary: dlmalloc for small allocations, the system's for large.
//!
//! The node's binary is static musl (install/static-target.sh), whose start-up costs a fraction of
//! static glibc's (which probes the CPU with some 40 `cpuid` instructions, each a VM exit). musl's
//! own allocator maps and unmaps pages for small allocations, and those system calls and page
//! faults cost a plugin ADD more than glibc's start-up saved; dlmalloc takes memory in 64 KiB steps
//! and keeps it (docs/bench/README.md, "A plugin process starts fast"). But dlmalloc grows a large
//! block by copying it into a new one and keeps the old: reading a 16 MiB stdin peaked at 43 MiB.
//! Large blocks go to the system allocator, which maps each on its own and grows it with mremap, as
//! glibc's does, so that read peaks at about its size (tests/tests/memory.rs).

use std::alloc::{GlobalAlloc, Layout, System};

/// From this size on, an allocation is the system allocator's (glibc's default mmap threshold).
pub const LARGE: usize = 128 << 10;

pub struct Allocator;

fn is_large(size: usize) -> bool {
    size >= LARGE
}

// SAFETY: every block is freed, reallocated and sized by the allocator that made it, which is told
// apart by the size in its layout alone: the same size always picks the same allocator, and a
// reallocation that crosses `LARGE` moves the block to the other one.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract (a non-zero size) is passed on unchanged.
        unsafe {
            if is_large(layout.size()) {
                System.alloc(layout)
            } else {
                dlmalloc::GlobalDlmalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as alloc.
        unsafe {
            if is_large(layout.size()) {
                System.alloc_zeroed(layout)
            } else {
                dlmalloc::GlobalDlmalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator with `layout`, so from the one its size picks.
        unsafe {
            if is_large(layout.size()) {
                System.dealloc(ptr, layout)
            } else {
                dlmalloc::GlobalDlmalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match (is_large(layout.size()), is_large(new_size)) {
            // SAFETY: the block stays with the allocator that made it.
            (true, true) => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: as above.
            (false, false) => unsafe { dlmalloc::GlobalDlmalloc.realloc(ptr, layout, new_size) },
            _ => {
                // SAFETY: the caller guarantees new_size, rounded up to the alignment, fits isize.
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: a non-zero size (the caller's contract for new_size).
                let new = unsafe { self.alloc(new_layout) };
                if !new.is_null() {
                    // SAFETY: both blocks are live, distinct and at least this long.
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                }
                new
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn blocks_keep_their_bytes_across_the_threshold_both_ways() {
        let a = Allocator;
        let layout = Layout::from_size_align(1000, 8).unwrap();
        // SAFETY: sizes are non-zero; each block is used within its size and freed with its layout.
        unsafe {
            let p = a.alloc(layout);
            assert!(!p.is_null());
            for i in 0..1000 {
                *p.add(i) = (i % 251) as u8;
            }
            let sizes = [LARGE - 8, LARGE, 4 * LARGE, LARGE + 1, LARGE - 1, 2000, 5 * LARGE, 900];
            let (mut p, mut size) = (p, 1000);
            for new in sizes {
                p = a.realloc(p, Layout::from_size_align(size, 8).unwrap(), new);
                assert!(!p.is_null());
                for i in 0..size.min(new).min(900) {
                    assert_eq!(*p.add(i), (i % 251) as u8, "byte {i} after {size} -> {new}");
                }
                size = new;
            }
            a.dealloc(p, Layout::from_size_align(size, 8).unwrap());
            let z = a.alloc_zeroed(Layout::from_size_align(2 * LARGE, 64).unwrap());
            assert!(!z.is_null() && (z as usize) % 64 == 0);
            assert!((0..2 * LARGE).all(|i| *z.add(i) == 0));
            a.dealloc(z, Layout::from_size_align(2 * LARGE, 64).unwrap());
        }
    }
}
