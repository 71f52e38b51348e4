//! `bench ffi`: what the C ABI costs over the same call from Rust, and what
//! the `LD_PRELOAD` library costs a program's `malloc` and `free`.
//!
//! - `counter-add-c`: `splitcount_counter_add(c, 1)` on a tree counter,
//!   called through a C function pointer (as a C program calls a shared
//!   library, through its PLT) — the handle lookup, the panic guard and
//!   the status code; its baseline `counter-add-rust` is `Tree::add(1)`
//!   called from Rust.
//! - `group-charge-c`: `splitcount_group_try_charge(g, 1)` then
//!   `splitcount_group_uncharge(g, 1)` through C function pointers; its
//!   baseline `group-charge-rust` is `Group::charge(1)` then
//!   `Group::uncharge(1)` (both on the stock's hit path).
//! - `mixed-preload`: the allocator suite's `mixed` workload (free the
//!   oldest of 64 blocks, allocate 16 to 512 bytes) in a worker process on
//!   the system allocator started with
//!   `LD_PRELOAD=libsplitcount_preload.so`: every block goes through the
//!   preload's `malloc` and `free` to glibc; its baseline `mixed-glibc` is
//!   the same worker without the preload. Measured when the library is
//!   found beside the lab binary (`cargo build --release --workspace` puts
//!   it there).

use super::alloc::worker::{Request, Worker};
use super::alloc::Workload;
use super::{Bench, Entry};
use crate::alloc_switch::Allocator;
use crate::timing::{measure, Plan};
use splitcount::counter::{Config, Design, SplitCounter, Tree};
use splitcount::group::Hierarchy;
use splitcount_ffi::{splitcount_counter, splitcount_group};
use std::cell::RefCell;
use std::ffi::c_int;
use std::hint::black_box;
use std::path::{Path, PathBuf};

/// The C-ABI cases and their baselines (`{op}-c` ÷ `{op}-rust`).
pub const CASES: [&str; 4] = [
    "counter-add-rust",
    "counter-add-c",
    "group-charge-rust",
    "group-charge-c",
];

/// The preload's case and its baseline.
pub const PRELOAD_CASES: [&str; 2] = ["mixed-glibc", "mixed-preload"];

/// The preload library's file name.
pub const PRELOAD_SO: &str = "libsplitcount_preload.so";

/// The baseline of a case: `-c` → `-rust`, `-preload` → `-glibc`.
pub fn baseline_of(case: &str) -> Option<String> {
    if let Some(op) = case
        .strip_suffix("-c")
        .or_else(|| case.strip_suffix("-rust"))
    {
        return Some(format!("{op}-rust"));
    }
    let workload = case.rsplit_once('-')?.0;
    Some(format!("{workload}-glibc"))
}

/// The preload library beside the lab binary `exe` (or in `deps/` there).
pub fn find_preload(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    [dir.join(PRELOAD_SO), dir.join("deps").join(PRELOAD_SO)]
        .into_iter()
        .find(|p| p.exists())
}

type AddFn = unsafe extern "C" fn(*mut splitcount_counter, i64) -> c_int;
type ChargeFn = unsafe extern "C" fn(*mut splitcount_group, u64) -> c_int;

/// Handles of the C API, made through it and destroyed with the suite.
struct CHandles {
    counter: *mut splitcount_counter,
    hierarchy: *mut splitcount_ffi::splitcount_hierarchy,
    group: *mut splitcount_group,
}

impl CHandles {
    fn new() -> Result<CHandles, String> {
        let mut h = CHandles {
            counter: std::ptr::null_mut(),
            hierarchy: std::ptr::null_mut(),
            group: std::ptr::null_mut(),
        };
        let mut root = std::ptr::null_mut();
        // SAFETY: valid out-pointers; a NUL-terminated name.
        let codes = unsafe {
            [
                splitcount_ffi::splitcount_counter_create(
                    splitcount_ffi::SPLITCOUNT_DESIGN_TREE,
                    0,
                    &mut h.counter,
                ),
                splitcount_ffi::splitcount_hierarchy_create(std::ptr::null(), 0, &mut h.hierarchy),
                splitcount_ffi::splitcount_hierarchy_root(h.hierarchy, &mut root),
                splitcount_ffi::splitcount_group_child(root, c"bench".as_ptr(), &mut h.group),
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

/// Measure the C-ABI cases at each of `threads`, and the preload's case at
/// each of them when the library is found beside `exe`.
pub fn run(exe: &Path, threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    let tree = Tree::with_config(&Config::new(Design::Tree)).map_err(|e| e.to_string())?;
    let memory = Hierarchy::default();
    let group = memory.root().child("bench").map_err(|e| e.to_string())?;
    let c = CHandles::new()?;
    // Function pointers the optimizer cannot see through, as a C caller's.
    let add: AddFn = black_box(splitcount_ffi::splitcount_counter_add);
    let charge: ChargeFn = black_box(splitcount_ffi::splitcount_group_try_charge);
    let uncharge: ChargeFn = black_box(splitcount_ffi::splitcount_group_uncharge);
    let (counter, cgroup) = (c.counter as usize, c.group as usize);
    let workers = match find_preload(exe) {
        Some(so) => Some((
            RefCell::new(Worker::start(exe, Allocator::System)?),
            RefCell::new(Worker::start_with_env(
                exe,
                Allocator::System,
                &[("LD_PRELOAD", so.as_os_str())],
            )?),
        )),
        None => None,
    };
    let mut entries = Vec::new();
    for &t in threads {
        let (tree, group) = (&tree, &group);
        entries.push(Entry::new(CASES[0], t, move |_| {
            move || tree.add(black_box(1))
        }));
        entries.push(Entry::new(CASES[1], t, move |_| {
            // SAFETY: a live counter handle (the C contract).
            move || unsafe {
                black_box(add(counter as *mut splitcount_counter, black_box(1)));
            }
        }));
        entries.push(Entry::new(CASES[2], t, move |_| {
            move || {
                let _ = black_box(group.charge(black_box(1)));
                group.uncharge(black_box(1));
            }
        }));
        entries.push(Entry::new(CASES[3], t, move |_| {
            // SAFETY: a live group handle (the C contract).
            move || unsafe {
                let g = cgroup as *mut splitcount_group;
                black_box(charge(g, black_box(1)));
                black_box(uncharge(g, black_box(1)));
            }
        }));
        if let Some((glibc, preload)) = &workers {
            for (case, worker) in PRELOAD_CASES.iter().zip([glibc, preload]) {
                entries.push(Entry::from_fn(*case, t, move |spec| {
                    worker.borrow_mut().run(Request {
                        workload: Workload::Mixed,
                        threads: t,
                        spec,
                    })
                }));
            }
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
    fn each_c_case_is_compared_with_rust_and_the_preload_with_glibc() {
        assert_eq!(baseline_of("counter-add-c").unwrap(), "counter-add-rust");
        assert_eq!(
            baseline_of("group-charge-rust").unwrap(),
            "group-charge-rust"
        );
        assert_eq!(baseline_of("mixed-preload").unwrap(), "mixed-glibc");
    }
}
