//! A released handle stays refused while its slot is reused, through the
//! public API: one group handle slot taken and released over and over
//! (`splitcount_hierarchy_root` + `splitcount_group_release`), the first
//! handle tried after every reuse. In release builds (the CI's) the slot is
//! reused 2^23 + 1 times (about 5 s): one past the 2^23 reuses after which
//! the former 24-bit generation, going up by 2, named the slot's new object
//! with the first handle. The edges beyond, up to a slot's last life
//! (2^31 − 1 reuses), are `handle::tests`'s, which set the generation
//! directly.
//!
//! The only test of this binary: nothing else takes group handles, so every
//! handle lands in the same slot.

use splitcount_ffi::*;
use std::ptr::null_mut;

/// The slot a handle names (its low 24 bits; see `handle.rs`).
fn slot(g: *mut splitcount_group) -> usize {
    g as usize & 0xFF_FFFF
}

#[test]
fn a_released_group_handle_is_refused_while_its_slot_is_reused() {
    let reuses: u32 = if cfg!(debug_assertions) {
        1 << 16
    } else {
        (1 << 23) + 1
    };
    let mut h = null_mut();
    // SAFETY: `h` is valid for a write.
    assert_eq!(
        unsafe { splitcount_hierarchy_create(std::ptr::null(), 0, &mut h) },
        SPLITCOUNT_OK
    );
    let mut first = null_mut();
    // SAFETY: `first` is valid for a write.
    assert_eq!(
        unsafe { splitcount_hierarchy_root(h, &mut first) },
        SPLITCOUNT_OK
    );
    assert_eq!(splitcount_group_release(first), SPLITCOUNT_OK);
    let mut usage = 0;
    for reuse in 1..=reuses {
        let mut now = null_mut();
        // SAFETY: `now` is valid for a write.
        assert_eq!(
            unsafe { splitcount_hierarchy_root(h, &mut now) },
            SPLITCOUNT_OK
        );
        assert_eq!(slot(now), slot(first), "reuse {reuse}: another slot");
        // SAFETY: `usage` is valid for a write.
        let read = unsafe { splitcount_group_usage(first, &mut usage) };
        assert_eq!(
            read, SPLITCOUNT_E_HANDLE,
            "reuse {reuse}: the first handle is live again"
        );
        assert_eq!(splitcount_group_release(now), SPLITCOUNT_OK);
    }
    assert_eq!(splitcount_group_charge(first, 1), SPLITCOUNT_E_HANDLE);
    assert_eq!(splitcount_hierarchy_destroy(h), SPLITCOUNT_OK);
}
