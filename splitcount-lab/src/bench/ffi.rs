//! `bench ffi`: what the C ABI costs over the same operation from Rust.
//! (What the `LD_PRELOAD` library costs a program's `malloc` and `free` is
//! `bench preload`.)
//! The `-c-…` cases are loops written in C (`csrc/ffi_loops.c`, compiled
//! with `-O2` by build.rs), so a case measures what a C program's loop
//! does — not a Rust-to-C call per operation.
//!
//! - `counter-add-rust`: `Tree::add(1)` from Rust, the baseline of:
//!   - `counter-add-c-inline`: `splitcount_counter_fast_add(&fast, 1)`, the
//!     header's `static inline` rseq sequence (target ≤ ×1.2);
//!   - `counter-add-c`: `splitcount_counter_add(c, 1)`, the checked handle
//!     (a call, the handle lookup, the panic guard, the status);
//!   - `counter-add-c-atomic`: one shared atomic add in C (what a C program
//!     writes first), and `counter-add-c-tls`: a thread-local load, add and
//!     store in C — the floor of any per-thread or per-CPU add.
//! - `charge-{100,1000,4096}-rust`: `Group::charge(n)` then
//!   `Group::uncharge(n)` in a hierarchy with the byte batch (64 KiB: every
//!   size hits the stock), the baseline of `charge-{n}-c`: the same from C
//!   through `splitcount_group_fast_try_charge` / `_uncharge` (no handle
//!   check; target ≤ ×1.3), and `charge-{n}-c-checked`: through the
//!   handles (`splitcount_group_try_charge` / `_uncharge`).

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::counter::{Config, Design, SplitCounter, Tree};
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount_ffi::{
    splitcount_counter, splitcount_counter_fast, splitcount_group, splitcount_group_fast,
};
use std::ffi::c_void;
use std::hint::black_box;
use std::sync::atomic::AtomicI64;

/// The C-ABI cases, each beside its baseline (`{op}-c…` ÷ `{op}-rust`).
pub const CASES: [&str; 14] = [
    "counter-add-rust",
    "counter-add-c-inline",
    "counter-add-c",
    "counter-add-c-atomic",
    "counter-add-c-tls",
    "charge-100-rust",
    "charge-100-c",
    "charge-100-c-checked",
    "charge-1000-rust",
    "charge-1000-c",
    "charge-1000-c-checked",
    "charge-4096-rust",
    "charge-4096-c",
    "charge-4096-c-checked",
];

/// The byte sizes of the charge cases.
pub const CHARGE_BYTES: [u64; 3] = [100, 1000, 4096];

/// What a C case's name ends with after its operation.
const C_SUFFIXES: [&str; 5] = ["-c-inline", "-c-checked", "-c-atomic", "-c-tls", "-c"];

// The loops of `csrc/ffi_loops.c` (handles as `void *`: the C API's
// handle types are opaque Rust structs without a C layout).
extern "C" {
    fn lab_c_counter_add_inline(f: *const splitcount_counter_fast, n: u64);
    fn lab_c_counter_add_checked(c: *mut c_void, n: u64);
    fn lab_c_atomic_add(a: *const AtomicI64, n: u64);
    fn lab_c_tls_add(n: u64);
    fn lab_c_charge_fast(g: *const splitcount_group_fast, bytes: u64, n: u64);
    fn lab_c_charge_checked(g: *mut c_void, bytes: u64, n: u64);
}

/// The baseline of a case: `{op}-c…` → `{op}-rust`.
pub fn baseline_of(case: &str) -> Option<String> {
    let op = C_SUFFIXES
        .iter()
        .chain(&["-rust"])
        .find_map(|s| case.strip_suffix(s))?;
    Some(format!("{op}-rust"))
}

/// Handles of the C API, made through it and destroyed with the suite,
/// and their fast paths.
struct CHandles {
    counter: *mut splitcount_counter,
    hierarchy: *mut splitcount_ffi::splitcount_hierarchy,
    group: *mut splitcount_group,
    counter_fast: splitcount_counter_fast,
    group_fast: splitcount_group_fast,
}

impl CHandles {
    fn new() -> Result<CHandles, String> {
        let mut h = CHandles {
            counter: std::ptr::null_mut(),
            hierarchy: std::ptr::null_mut(),
            group: std::ptr::null_mut(),
            counter_fast: splitcount_counter_fast {
                slot0: std::ptr::null_mut(),
                regions: 0,
                rseq_offset: 0,
                batch: 0,
                counter: std::ptr::null(),
            },
            group_fast: splitcount_group_fast {
                group: std::ptr::null(),
            },
        };
        let mut root = std::ptr::null_mut();
        // SAFETY: valid out-pointers; a NUL-terminated name; each handle
        // made before it is used.
        let codes = unsafe {
            [
                splitcount_ffi::splitcount_counter_create(
                    splitcount_ffi::SPLITCOUNT_DESIGN_TREE,
                    0,
                    &mut h.counter,
                ),
                splitcount_ffi::splitcount_counter_fast_get(h.counter, &mut h.counter_fast),
                splitcount_ffi::splitcount_hierarchy_create_with(
                    std::ptr::null(),
                    0,
                    splitcount_ffi::SPLITCOUNT_STOCK_BATCH_BYTES,
                    splitcount_ffi::SPLITCOUNT_STOCK_SLOTS_MAX,
                    &mut h.hierarchy,
                ),
                splitcount_ffi::splitcount_hierarchy_root(h.hierarchy, &mut root),
                splitcount_ffi::splitcount_group_child(root, c"bench".as_ptr(), &mut h.group),
                splitcount_ffi::splitcount_group_fast_get(h.group, &mut h.group_fast),
            ]
        };
        match codes.iter().find(|&&c| c != splitcount_ffi::SPLITCOUNT_OK) {
            None => Ok(h),
            Some(&c) => Err(format!("the C API refused to set up the bench: status {c}")),
        }
    }
}

impl Drop for CHandles {
    fn drop(&mut self) {
        splitcount_ffi::splitcount_counter_destroy(self.counter);
        splitcount_ffi::splitcount_hierarchy_destroy(self.hierarchy);
    }
}

/// Measure the C-ABI cases at each of `threads`.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let tree = Tree::with_config(&Config::new(Design::Tree)).map_err(|e| e.to_string())?;
    let memory = Hierarchy::new(HierarchyConfig {
        stock_batch: splitcount_ffi::SPLITCOUNT_STOCK_BATCH_BYTES,
        ..HierarchyConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let group = memory.root().child("bench").map_err(|e| e.to_string())?;
    let c = CHandles::new()?;
    let shared = AtomicI64::new(0);
    // Addresses, for the closures (which must be `Sync`).
    let (counter, cgroup) = (c.counter as usize, c.group as usize);
    let (fast, gfast) = (
        &c.counter_fast as *const _ as usize,
        &c.group_fast as *const _ as usize,
    );
    let mut entries = Vec::new();
    for &t in threads {
        let (tree, group, shared) = (&tree, &group, &shared);
        entries.push(Entry::new("counter-add-rust", t, move |_| {
            move || tree.add(black_box(1))
        }));
        // SAFETY (the C loops): live handles and fast paths, kept until
        // the suite ends (`c` is dropped after `measure`).
        entries.push(Entry::looped("counter-add-c-inline", t, move |_| {
            move |n| unsafe { lab_c_counter_add_inline(fast as *const _, n) }
        }));
        entries.push(Entry::looped("counter-add-c", t, move |_| {
            move |n| unsafe { lab_c_counter_add_checked(counter as *mut _, n) }
        }));
        entries.push(Entry::looped("counter-add-c-atomic", t, move |_| {
            move |n| unsafe { lab_c_atomic_add(shared, n) }
        }));
        entries.push(Entry::looped("counter-add-c-tls", t, move |_| {
            move |n| unsafe { lab_c_tls_add(n) }
        }));
        for bytes in CHARGE_BYTES {
            entries.push(Entry::new(format!("charge-{bytes}-rust"), t, move |_| {
                move || {
                    let _ = black_box(group.charge(black_box(bytes)));
                    group.uncharge(black_box(bytes));
                }
            }));
            entries.push(Entry::looped(format!("charge-{bytes}-c"), t, move |_| {
                move |n| unsafe { lab_c_charge_fast(gfast as *const _, bytes, n) }
            }));
            entries.push(Entry::looped(
                format!("charge-{bytes}-c-checked"),
                t,
                move |_| move |n| unsafe { lab_c_charge_checked(cgroup as *mut _, bytes, n) },
            ));
        }
    }
    let measured = measure("ffi", plan, entries)?;
    drop(c);
    Ok(Bench::new(measured, baseline_of))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_c_case_is_compared_with_rust() {
        for case in CASES {
            let base = baseline_of(case).unwrap();
            assert!(CASES.contains(&base.as_str()), "{case} → {base}");
            assert!(base.ends_with("-rust"), "{case} → {base}");
        }
        assert_eq!(baseline_of("counter-add-c").unwrap(), "counter-add-rust");
        assert_eq!(
            baseline_of("charge-1000-c-checked").unwrap(),
            "charge-1000-rust"
        );
    }
}
