//! Hierarchies: create (with the stock's batch and slots), destroy, the
//! root, lookup by path, stat item ids, draining the stocks.

use crate::error::{
    put, run, text, Error, Result, SPLITCOUNT_E_INVALID, SPLITCOUNT_E_NOT_FOUND, SPLITCOUNT_E_NULL,
};
use crate::group::{GroupEntry, GROUPS};
use crate::handle::{id, Registry};
use crate::{splitcount_group, splitcount_hierarchy};
use splitcount::group::{Hierarchy, HierarchyConfig};
use splitcount::stat::{StatId, StatItem};
use std::ffi::{c_char, c_int};
use std::sync::Arc;

/// A stat item of a hierarchy's schema: every group carries one value of
/// each.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct splitcount_stat_item {
    /// The item's name (validated like a group name, and no whitespace;
    /// not `usage`, `stocked` or a name beginning with `local_`, which
    /// `memory.stat` dumps print of their own).
    pub name: *const c_char,
    /// `SPLITCOUNT_STAT_GAUGE` (goes up and down) or `SPLITCOUNT_STAT_EVENT`
    /// (a count: negative deltas are refused).
    pub kind: u32,
}

/// A stat item that goes up and down (bytes in use).
pub const SPLITCOUNT_STAT_GAUGE: u32 = 0;
/// A stat item that only counts up (events). Like a gauge, its value is
/// an `int64_t` that wraps past `INT64_MAX` (each update is one per-CPU add,
/// which cannot check the total): a count that reaches 2^63 reads negative.
pub const SPLITCOUNT_STAT_EVENT: u32 = 1;

/// The stock batch of `splitcount_hierarchy_create` (Rust's
/// `HierarchyConfig::default()`): right for units counted one by one
/// (pages, objects, requests). A charge larger than the batch never comes
/// from the stock, so for bytes use `SPLITCOUNT_STOCK_BATCH_BYTES`.
pub const SPLITCOUNT_STOCK_BATCH_DEFAULT: u64 = 64;
/// The stock batch recommended for a hierarchy charged in bytes: 64 KiB,
/// so that charges of typical allocation sizes (100 B to 4 KiB, anything
/// under 64 KiB) are served from the CPU's stock, and what is stocked per
/// group and CPU stays at most 64 KiB (as the preload's byte stock).
pub const SPLITCOUNT_STOCK_BATCH_BYTES: u64 = 65536;
/// The largest stock batch (a stock slot keeps its units in 32 bits).
// A literal, not `u32::MAX as u64`: cbindgen writes the cast into the
// header as a C cast, which C++'s -Wold-style-cast rejects. (The header's
// `4294967295` is a `long` in C; compared with a `uint64_t` batch it draws
// no -Wsign-compare, being a non-negative constant: checked with gcc.)
pub const SPLITCOUNT_STOCK_BATCH_MAX: u64 = 4_294_967_295;
/// The most groups a CPU's stock holds at once (one 1 KiB block); the
/// slots of `splitcount_hierarchy_create`.
pub const SPLITCOUNT_STOCK_SLOTS_MAX: u32 = 63;

const _: () = assert!(SPLITCOUNT_STOCK_BATCH_MAX == splitcount::raw::MAX_STOCK_BATCH);
const _: () = assert!(SPLITCOUNT_STOCK_SLOTS_MAX as usize == splitcount::raw::MAX_STOCK_SLOTS);

/// What a hierarchy handle holds.
pub(crate) struct HierarchyEntry {
    pub(crate) hierarchy: Hierarchy,
    pub(crate) stat_ids: Arc<[StatId]>,
}

pub(crate) static HIERARCHIES: Registry<HierarchyEntry> = Registry::new(1, "hierarchy");

impl HierarchyEntry {
    pub(crate) fn new(hierarchy: Hierarchy) -> HierarchyEntry {
        let stat_ids = hierarchy
            .stats()
            .items()
            .iter()
            .filter_map(|i| hierarchy.stat_id(&i.name))
            .collect();
        HierarchyEntry {
            hierarchy,
            stat_ids,
        }
    }
}

pub(crate) fn hierarchy(h: *mut splitcount_hierarchy) -> Result<&'static HierarchyEntry> {
    HIERARCHIES.get(id(h))
}

/// Create a hierarchy with only a root group, whose groups carry the
/// `count` stat items of `items` (`items` may be NULL when `count` is 0).
/// Stock: `SPLITCOUNT_STOCK_SLOTS_MAX` (63) groups per CPU, batch
/// `SPLITCOUNT_STOCK_BATCH_DEFAULT` (64 units), at most 7 batches stocked
/// per CPU in all — for units counted one by
/// one; a hierarchy charged in bytes wants
/// `splitcount_hierarchy_create_with` and `SPLITCOUNT_STOCK_BATCH_BYTES`.
/// On success `*out` is its handle; destroy it with
/// `splitcount_hierarchy_destroy`.
///
/// Thread-safe.
///
/// # Safety
/// `items` points to `count` items whose names are NUL-terminated strings;
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_hierarchy_create(
    items: *const splitcount_stat_item,
    count: usize,
    out: *mut *mut splitcount_hierarchy,
) -> c_int {
    run("splitcount_hierarchy_create", || {
        // SAFETY: the caller's contract.
        unsafe { create(items, count, HierarchyConfig::default(), out) }
    })
}

/// `splitcount_hierarchy_create` with the per-CPU stock's shape: a charge
/// that misses its CPU's stock charges `stock_batch` units to the usage
/// counters at once and keeps the surplus there, for the next charges on
/// that CPU (the kernel's `MEMCG_CHARGE_BATCH`); each CPU's stock holds the
/// units of up to `stock_slots` groups at once, and at most 7 batches of
/// units in all (its budget): with more groups charging on a CPU than
/// that, each is granted a share of the budget and its misses charge the
/// share instead of a batch.
///
/// - `stock_batch`: 1 to `SPLITCOUNT_STOCK_BATCH_MAX`. A charge larger
///   than the batch never comes from the stock, and one of at least the
///   batch that misses it is charged exactly, through the usage counters,
///   leaving nothing stocked; so the batch should be well above the usual
///   charge: `SPLITCOUNT_STOCK_BATCH_BYTES` (64 KiB) for bytes,
///   `SPLITCOUNT_STOCK_BATCH_DEFAULT` (64) for pages or objects.
/// - `stock_slots`: 1 to `SPLITCOUNT_STOCK_SLOTS_MAX` (63); more groups
///   charged from one CPU than slots evict each other.
///
/// Other values are `SPLITCOUNT_E_INVALID` (nothing is created).
///
/// **Slack.** Stocked units are charged, so no limit is passed because of
/// them, but usage runs ahead of what is in use: by at most `stock_batch`
/// units per CPU for one group (`splitcount_group_stocked`), and at most
/// `stock_batch × 7 × CPUs` for the whole hierarchy, whatever the number
/// of groups and slots — with 64 KiB and 64 CPUs, 4 MiB for a group and
/// 28 MiB in all. A charge
/// refused by a limit drains the stocked units of the refusing group's
/// subtree first; `splitcount_group_usage_exact` reads the usage without
/// them.
///
/// Thread-safe.
///
/// # Safety
/// As `splitcount_hierarchy_create`.
#[no_mangle]
pub unsafe extern "C" fn splitcount_hierarchy_create_with(
    items: *const splitcount_stat_item,
    count: usize,
    stock_batch: u64,
    stock_slots: u32,
    out: *mut *mut splitcount_hierarchy,
) -> c_int {
    run("splitcount_hierarchy_create_with", || {
        let config = HierarchyConfig::default()
            .stock_batch(stock_batch)
            .stock_slots(stock_slots as usize);
        // SAFETY: the caller's contract.
        unsafe { create(items, count, config, out) }
    })
}

/// The body of the `create` functions: `config` with the stat items of
/// `items`.
///
/// # Safety
/// As `splitcount_hierarchy_create`.
unsafe fn create(
    items: *const splitcount_stat_item,
    count: usize,
    config: HierarchyConfig,
    out: *mut *mut splitcount_hierarchy,
) -> Result<()> {
    let items: &[splitcount_stat_item] = match (items.is_null(), count) {
        (_, 0) => &[],
        (true, _) => return Err(Error::new(SPLITCOUNT_E_NULL, "items is NULL")),
        // SAFETY: `count` items by the caller's contract.
        (false, n) => unsafe { std::slice::from_raw_parts(items, n) },
    };
    let mut schema = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        // SAFETY: NUL-terminated by the caller's contract.
        let name = unsafe { text(item.name, &format!("items[{i}].name")) }?;
        schema.push(match item.kind {
            SPLITCOUNT_STAT_GAUGE => StatItem::gauge(name),
            SPLITCOUNT_STAT_EVENT => StatItem::event(name),
            k => {
                return Err(Error::new(
                    SPLITCOUNT_E_INVALID,
                    format!(
                        "items[{i}].kind is {k}: SPLITCOUNT_STAT_GAUGE (0) or \
                         SPLITCOUNT_STAT_EVENT (1)"
                    ),
                ))
            }
        });
    }
    let h = Hierarchy::new(config.stats(schema))?;
    // The C API's default enforcement (see `SPLITCOUNT_ENFORCE_REFUSE`).
    h.root().set_enforcement(splitcount::Enforcement::Refuse);
    // SAFETY: the caller's contract.
    unsafe { HIERARCHIES.hand_out(HierarchyEntry::new(h), out) }
}

/// Destroy a hierarchy handle and every group handle obtained through it
/// (from `splitcount_hierarchy_root`, `_lookup`, and their children): each
/// becomes invalid (`SPLITCOUNT_E_HANDLE`). The groups' memory goes when
/// nothing uses it any more (an allocator's blocks charged to them keep
/// their accounts). A second destroy of the same handle is
/// `SPLITCOUNT_E_HANDLE`.
///
/// Must not run concurrently with other calls using this hierarchy or its
/// group handles.
#[no_mangle]
pub extern "C" fn splitcount_hierarchy_destroy(hierarchy: *mut splitcount_hierarchy) -> c_int {
    run("splitcount_hierarchy_destroy", || {
        let id = id(hierarchy);
        let entry = HIERARCHIES.remove(id)?;
        drop(GROUPS.remove_where(|g: &GroupEntry| g.owner == id));
        drop(entry);
        Ok(())
    })
}

/// A new handle on the root group (path "/") in `*out`.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_hierarchy_root(
    hierarchy: *mut splitcount_hierarchy,
    out: *mut *mut splitcount_group,
) -> c_int {
    run("splitcount_hierarchy_root", || {
        let h = self::hierarchy(hierarchy)?;
        let entry = GroupEntry::new(h.hierarchy.root(), h, id(hierarchy));
        // SAFETY: the caller's contract.
        unsafe { GROUPS.hand_out(entry, out) }
    })
}

/// A new handle on the live group at `path` ("a/b", "/a/b"; "" or "/" is
/// the root) in `*out`; `SPLITCOUNT_E_NOT_FOUND` if there is none.
///
/// Thread-safe.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_hierarchy_lookup(
    hierarchy: *mut splitcount_hierarchy,
    path: *const c_char,
    out: *mut *mut splitcount_group,
) -> c_int {
    run("splitcount_hierarchy_lookup", || {
        let h = self::hierarchy(hierarchy)?;
        // SAFETY: the caller's contract.
        let path = unsafe { text(path, "path") }?;
        let group = h.hierarchy.lookup(path)?;
        // SAFETY: the caller's contract.
        unsafe { GROUPS.hand_out(GroupEntry::new(group, h, id(hierarchy)), out) }
    })
}

/// The id of the stat item named `name` in `*out` (its position in the
/// schema given at creation); `SPLITCOUNT_E_NOT_FOUND` if there is none.
///
/// Thread-safe.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_stat_id(
    hierarchy: *mut splitcount_hierarchy,
    name: *const c_char,
    out: *mut u32,
) -> c_int {
    run("splitcount_stat_id", || {
        let h = self::hierarchy(hierarchy)?;
        // SAFETY: the caller's contract.
        let name = unsafe { text(name, "name") }?;
        let id = h.hierarchy.stat_id(name).ok_or_else(|| {
            Error::new(
                SPLITCOUNT_E_NOT_FOUND,
                format!(
                    "no stat item named {:?} in this hierarchy's schema",
                    // Cut as a group name is: no item's name is longer
                    // than 255 bytes.
                    name.chars().take(64).collect::<String>()
                ),
            )
        })?;
        // SAFETY: the caller's contract.
        unsafe { put(out, id.index() as u32) }
    })
}

/// Return every stocked unit of every group to the usage counters (the
/// per-CPU stocks and, under the preload, its byte stock and the calling
/// thread's reserve); the units returned in `*units` (may be NULL).
///
/// Thread-safe.
///
/// # Safety
/// `units` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_hierarchy_drain_stocks(
    hierarchy: *mut splitcount_hierarchy,
    units: *mut u64,
) -> c_int {
    run("splitcount_hierarchy_drain_stocks", || {
        let drained = self::hierarchy(hierarchy)?.hierarchy.drain_stocks();
        if !units.is_null() {
            // SAFETY: the caller's contract.
            unsafe { put(units, drained) }?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_batch_is_the_rust_default() {
        assert_eq!(
            SPLITCOUNT_STOCK_BATCH_DEFAULT,
            HierarchyConfig::default().stock_batch
        );
        assert_eq!(
            SPLITCOUNT_STOCK_SLOTS_MAX as usize,
            HierarchyConfig::default().stock_slots
        );
    }
}
