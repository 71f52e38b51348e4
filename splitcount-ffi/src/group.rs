//! Groups: children, removal, limits, charges, usage, peak, events,
//! cooperative breaches and stat items.
//!
//! A handle on a removed group stays valid (except the one passed to
//! `splitcount_group_remove`, which is released): what would add to the
//! group — a charge, a child, a limit, a stat update, entering it — is
//! refused with `SPLITCOUNT_E_REMOVED`; uncharges (they reach the nearest
//! live ancestor, whose usage holds the group's) and reads still work.

use crate::error::{
    put, run, text, Error, Result, SPLITCOUNT_E_BUFFER, SPLITCOUNT_E_INVALID, SPLITCOUNT_E_LIMIT,
    SPLITCOUNT_E_NULL, SPLITCOUNT_E_OVER_LIMIT, SPLITCOUNT_E_REMOVED,
};
use crate::handle::{id, Registry};
use crate::hierarchy::HierarchyEntry;
use crate::splitcount_group;
use splitcount::charge::Enforcement;
use splitcount::group::Group;
use splitcount::stat::StatId;
use std::ffi::{c_char, c_int};
use std::sync::Arc;

/// No limit: the value of `max`, `high` and the ceiling of a group without
/// one.
pub const SPLITCOUNT_UNLIMITED: u64 = u64::MAX;

/// Over its hard limit, an allocation charged to the group fails (the
/// preload's `malloc` returns NULL with `errno = ENOMEM`).
///
/// **The default of every group made through the C API** — a
/// hierarchy's root (`splitcount_hierarchy_create*`) and every child
/// (`splitcount_group_child`), in the preload's hierarchy too — and of the
/// preload's root and its `/preload` group (unless
/// `SPLITCOUNT_PRELOAD_ENFORCE=cooperative`): a `max` set from C limits `malloc` without a
/// second call. (A group made in Rust starts cooperative, Rust's default;
/// `splitcount_group_set_enforcement` changes either.)
pub const SPLITCOUNT_ENFORCE_REFUSE: u32 = 0;
/// Over its hard limit, an allocation succeeds as a counted over-charge and
/// the group is marked breached until `splitcount_group_clear_breach`;
/// `splitcount_group_check` reports it. Set it with
/// `splitcount_group_set_enforcement` (groups made through the C API start
/// `SPLITCOUNT_ENFORCE_REFUSE`).
pub const SPLITCOUNT_ENFORCE_COOPERATIVE: u32 = 1;

/// Event counts of a group (Rust: `Events`, the same counters).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct splitcount_events {
    /// Charges that hit this group's `max`: refused, or let through over it
    /// (a cooperative limit's allocation, a `splitcount_group_charge`) —
    /// the kernel's meaning.
    pub max: u64,
    /// Crossings of `high` upwards: one per crossing, not one per charge
    /// above.
    pub high: u64,
    /// Charges refused here after reclaim, draining and the out-of-memory
    /// stage failed to make room.
    pub oom: u64,
    /// Uncharges of more than the group held (clamped at zero).
    pub underflow: u64,
    /// Episodes over `max` begun by a charge let through (a breach,
    /// reported by `splitcount_group_check`): one per episode, however many
    /// charges it let through.
    pub breaches: u64,
    /// Charges refused because of this group's `max` or ceiling: NULLs from
    /// the preload's `malloc`, `SPLITCOUNT_E_LIMIT` from
    /// `splitcount_group_try_charge`.
    pub refused: u64,
}

/// What a group handle holds.
pub(crate) struct GroupEntry {
    pub(crate) group: Group,
    pub(crate) stat_ids: Arc<[StatId]>,
    /// The hierarchy handle it came through (0: none — the preload's
    /// group); destroying that handle releases this one.
    pub(crate) owner: u64,
}

pub(crate) static GROUPS: Registry<GroupEntry> = Registry::new(2, "group");

impl GroupEntry {
    pub(crate) fn new(group: Group, h: &HierarchyEntry, owner: u64) -> GroupEntry {
        GroupEntry {
            group,
            stat_ids: h.stat_ids.clone(),
            owner,
        }
    }

    fn stat(&self, id: u32) -> Result<StatId> {
        self.stat_ids.get(id as usize).copied().ok_or_else(|| {
            Error::new(
                SPLITCOUNT_E_INVALID,
                format!(
                    "stat item {id} is not in the schema (it has {} items)",
                    self.stat_ids.len()
                ),
            )
        })
    }
}

/// The group a handle names, removed or not.
pub(crate) fn any(g: *mut splitcount_group) -> Result<&'static GroupEntry> {
    GROUPS.get(id(g))
}

/// The group a handle names, refused if it was removed.
pub(crate) fn live(g: *mut splitcount_group) -> Result<&'static GroupEntry> {
    let entry = any(g)?;
    if entry.group.is_removed() {
        return Err(Error::new(
            SPLITCOUNT_E_REMOVED,
            format!("group {} was removed", entry.group.path()),
        ));
    }
    Ok(entry)
}

/// Read a number of a group (removed or not) into `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn read(
    function: &str,
    g: *mut splitcount_group,
    out: *mut u64,
    f: impl FnOnce(&Group) -> u64,
) -> c_int {
    // SAFETY: the caller's contract.
    run(function, || unsafe { put(out, f(&any(g)?.group)) })
}

/// Read stat item `item` of a group (removed or not) into `*out`.
///
/// # Safety
/// `out` is null or valid for a write.
unsafe fn read_stat(
    function: &str,
    g: *mut splitcount_group,
    item: u32,
    out: *mut i64,
    f: impl FnOnce(&Group, StatId) -> std::result::Result<i64, splitcount::stat::StatError>,
) -> c_int {
    run(function, || {
        let entry = any(g)?;
        let v = f(&entry.group, entry.stat(item)?)
            .map_err(|e| Error::new(SPLITCOUNT_E_INVALID, e.to_string()))?;
        // SAFETY: the caller's contract.
        unsafe { put(out, v) }
    })
}

/// Create a child named `name` (not empty, at most 255 bytes of UTF-8, no
/// '/' and no control character such as a newline or a tab, not "." or
/// "..", unique among live siblings) of a live group; its handle in
/// `*out`.
///
/// Thread-safe.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_child(
    parent: *mut splitcount_group,
    name: *const c_char,
    out: *mut *mut splitcount_group,
) -> c_int {
    run("splitcount_group_child", || {
        let p = live(parent)?;
        // SAFETY: the caller's contract.
        let name = unsafe { text(name, "name") }?;
        // Checked before anything is made: a failed call changes nothing
        // (the group was made, its name taken, with no handle to it).
        if out.is_null() {
            return Err(Error::new(SPLITCOUNT_E_NULL, "the out-pointer is NULL"));
        }
        // The handle first, for the same reason: with the table full the
        // group is not made. (Made first and removed again on a full table,
        // it could not go once another thread had found it and made a
        // child under it: the call failed and left the group behind.)
        let handle = GROUPS.reserve()?;
        let group = p.group.child(name)?;
        // The C API's default (see `SPLITCOUNT_ENFORCE_REFUSE`).
        group.set_enforcement(Enforcement::Refuse);
        let entry = GroupEntry {
            group,
            stat_ids: p.stat_ids.clone(),
            owner: p.owner,
        };
        // SAFETY: `out` is not null (checked above) and valid by the
        // caller's contract.
        unsafe { handle.fill_out(entry, out) };
        Ok(())
    })
}

/// Remove a group (not the root, and without live children:
/// `SPLITCOUNT_E_BUSY`) and release this handle. Its usage stays counted at
/// its ancestors; later uncharges through other handles on it reach them.
///
/// Under the preload, `/preload` cannot be removed (`SPLITCOUNT_E_STATE`):
/// threads outside any group charge it, and `SPLITCOUNT_PRELOAD_MAX` is its
/// limit.
///
/// Must not run concurrently with other calls using this handle.
#[no_mangle]
pub extern "C" fn splitcount_group_remove(group: *mut splitcount_group) -> c_int {
    run("splitcount_group_remove", || {
        let entry = any(group)?;
        crate::preload::removal_allowed(&entry.group)?;
        entry.group.remove()?;
        GROUPS.remove(id(group)).map(drop)
    })
}

/// Release a group handle without removing the group. A second release is
/// `SPLITCOUNT_E_HANDLE`.
///
/// Must not run concurrently with other calls using this handle.
#[no_mangle]
pub extern "C" fn splitcount_group_release(group: *mut splitcount_group) -> c_int {
    run("splitcount_group_release", || {
        GROUPS.remove(id(group)).map(drop)
    })
}

/// Copy the group's path ("/" for the root, "/a/b") with its NUL into
/// `buf` of `len` bytes. `*needed` (may be NULL) receives the bytes the
/// path needs with its NUL; `SPLITCOUNT_E_BUFFER` if `len` is smaller
/// (nothing is written to `buf` then).
///
/// Thread-safe.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes; `needed` is NULL or valid for a
/// write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_path(
    group: *mut splitcount_group,
    buf: *mut c_char,
    len: usize,
    needed: *mut usize,
) -> c_int {
    run("splitcount_group_path", || {
        let path = any(group)?.group.path();
        let n = path.len() + 1;
        if !needed.is_null() {
            // SAFETY: the caller's contract.
            unsafe { put(needed, n) }?;
        }
        if buf.is_null() || len < n {
            let has = if buf.is_null() {
                "there is no buffer (NULL)".to_owned()
            } else {
                format!("the buffer has {len}")
            };
            return Err(Error::new(
                SPLITCOUNT_E_BUFFER,
                format!("the path {path} needs {n} bytes, {has}"),
            ));
        }
        // SAFETY: `buf` has at least `n` bytes (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(path.as_ptr(), buf.cast::<u8>(), path.len());
            buf.add(path.len()).write(0);
        }
        Ok(())
    })
}

/// Whether the group was removed, in `*out`.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_is_removed(
    group: *mut splitcount_group,
    out: *mut bool,
) -> c_int {
    // SAFETY: the caller's contract.
    run("splitcount_group_is_removed", || unsafe {
        put(out, any(group)?.group.is_removed())
    })
}

/// Set the hard limit (`SPLITCOUNT_UNLIMITED` for none). If the usage is
/// above it, the group's stocked units are drained and the limit tried
/// again; `SPLITCOUNT_E_BUSY` (with the usage) if still above.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_set_max(group: *mut splitcount_group, max: u64) -> c_int {
    run("splitcount_group_set_max", || {
        Ok(live(group)?.group.set_max(max)?)
    })
}

/// Set the soft limit: crossing it counts a `high` event, never refuses.
///
/// The usage it is compared with counts the units stocked on CPUs. A
/// refill of the stock (a batch whose surplus is stocked) is taken only if
/// it leaves the group at or below `high` — else the charge takes just what
/// it asks for —, so a refill's surplus does not cross `high` (except after
/// the group has been above `high` and come back, until a refill fits under
/// it again: hysteresis). Units
/// already stocked still count (stocked before the usage came near `high`,
/// or stashed by uncharges on their CPU), so a crossing (and the `over` a
/// pressure subscriber is told) can run ahead of what is in use by up to a
/// batch per CPU that charged the group (`splitcount_group_usage_exact`
/// says what is in use).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_set_high(group: *mut splitcount_group, high: u64) -> c_int {
    run("splitcount_group_set_high", || {
        live(group)?.group.set_high(high);
        Ok(())
    })
}

/// What an allocation over the group's hard limit does:
/// `SPLITCOUNT_ENFORCE_REFUSE` or `SPLITCOUNT_ENFORCE_COOPERATIVE`.
/// (`splitcount_group_try_charge` is refused either way.)
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_set_enforcement(
    group: *mut splitcount_group,
    enforcement: u32,
) -> c_int {
    run("splitcount_group_set_enforcement", || {
        let e = match enforcement {
            SPLITCOUNT_ENFORCE_REFUSE => Enforcement::Refuse,
            SPLITCOUNT_ENFORCE_COOPERATIVE => Enforcement::Cooperative,
            other => {
                return Err(Error::new(
                    SPLITCOUNT_E_INVALID,
                    format!(
                        "enforcement {other}: SPLITCOUNT_ENFORCE_REFUSE (0) or \
                         SPLITCOUNT_ENFORCE_COOPERATIVE (1)"
                    ),
                ))
            }
        };
        live(group)?.group.set_enforcement(e);
        Ok(())
    })
}

/// The group's enforcement in `*out`: `SPLITCOUNT_ENFORCE_REFUSE` (the
/// default of groups made through the C API) or
/// `SPLITCOUNT_ENFORCE_COOPERATIVE`.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_enforcement(
    group: *mut splitcount_group,
    out: *mut u32,
) -> c_int {
    run("splitcount_group_enforcement", || {
        let e = match any(group)?.group.enforcement() {
            Enforcement::Cooperative => SPLITCOUNT_ENFORCE_COOPERATIVE,
            // (`Enforcement` is non-exhaustive: a mode added later reads
            // as the stricter one until C gets a constant for it.)
            _ => SPLITCOUNT_ENFORCE_REFUSE,
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, e) }
    })
}

/// The usage past which even a cooperative group refuses allocations
/// (`SPLITCOUNT_UNLIMITED`, the default: none).
///
/// It bounds how far past `max` cooperative enforcement lets the
/// preload's `malloc` (or Rust's allocator) go, and is read only then: it
/// is not a limit of its own. A ceiling at or below `max` changes nothing
/// (allocations are refused at `max` first); `splitcount_group_try_charge`
/// refuses at `max` whatever the ceiling, `splitcount_group_charge` passes
/// it, and a ceiling below the usage is accepted (it refuses the next
/// allocation over `max`).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_set_ceiling(
    group: *mut splitcount_group,
    ceiling: u64,
) -> c_int {
    run("splitcount_group_set_ceiling", || {
        live(group)?.group.set_ceiling(ceiling);
        Ok(())
    })
}

/// The hard limit in `*out` (`SPLITCOUNT_UNLIMITED` when none).
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_max(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_group_max", group, out, Group::max) }
}

/// The soft limit in `*out` (`SPLITCOUNT_UNLIMITED` when none).
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_high(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_group_high", group, out, Group::high) }
}

/// Charge `n` units that must not fail (the kernel's forced charge; Rust:
/// `Group::over_charge`), at the group and every ancestor, without the
/// stock — and say so when they pass a limit: past the nearest `max` in
/// the way (after draining units stocked for its subtree, when they could
/// make room), the charge goes through, that limit counts a `max` event
/// and, the first time in an episode over it, a breach; every group from
/// this one up to it is breached, which `splitcount_group_check` reports
/// (and an event subscriber hears as `SPLITCOUNT_EVENT_BREACHED`) until
/// `splitcount_group_clear_breach`. Whatever the enforcement: this is what
/// the preload's `malloc` does over a cooperative limit. A caller that
/// wants the limit's verdict instead charges with
/// `splitcount_group_try_charge`. A request above 2^55 units is
/// `SPLITCOUNT_E_INVALID`, and so is one that would take the root's usage
/// past 2^56 − 1, the most a counter holds (nothing is charged).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_charge(group: *mut splitcount_group, n: u64) -> c_int {
    run("splitcount_group_charge", || {
        live(group)?
            .group
            .over_charge(n)
            .map_err(|e| Error::new(SPLITCOUNT_E_INVALID, e.to_string()))
    })
}

/// Charge `n` units within the limits of the group and its ancestors
/// (Rust: `Group::charge`): through this CPU's stock, then the usage
/// counters; refused after reclaim and draining with `SPLITCOUNT_E_LIMIT`,
/// the message naming the refusing group, its limit, usage and the request.
/// A request above 2^55 units is `SPLITCOUNT_E_INVALID` (as for
/// `splitcount_group_charge`), counted as no refusal.
///
/// Thread-safe; the hot path touches only this CPU's stock.
#[no_mangle]
pub extern "C" fn splitcount_group_try_charge(group: *mut splitcount_group, n: u64) -> c_int {
    run("splitcount_group_try_charge", || {
        live(group)?.group.charge(n).map_err(charge_error)
    })
}

/// The status of a refused `Group::charge`: `SPLITCOUNT_E_LIMIT`, or
/// `SPLITCOUNT_E_INVALID` for a request too large to be anything but a bug.
pub(crate) fn charge_error(e: splitcount::ChargeError) -> Error {
    let status = match e.kind() {
        splitcount::group::ChargeErrorKind::TooLarge
        | splitcount::group::ChargeErrorKind::Saturated => SPLITCOUNT_E_INVALID,
        _ => SPLITCOUNT_E_LIMIT,
    };
    Error::new(status, e.to_string())
}

/// Give back `n` units (to this CPU's stock, or the usage counters). More
/// than was charged is clamped at zero and counted as an `underflow`
/// event. Works on a removed group: the units come off what it still
/// holds (and so off its ancestors), clamped there — an excess is an
/// `underflow` of the removed group and never takes units its ancestors'
/// other descendants hold.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_uncharge(group: *mut splitcount_group, n: u64) -> c_int {
    run("splitcount_group_uncharge", || {
        any(group)?.group.uncharge(n);
        Ok(())
    })
}

/// The usage (this group and below, stocked units included) in `*out`:
/// what the limits compare. It runs ahead of what is in use by the units
/// stocked for the subtree — after a charge of 10 and its uncharge it reads
/// a batch (64 by default) on each CPU that charged — until
/// `splitcount_hierarchy_drain_stocks`; `splitcount_group_usage_exact`
/// reads it without them.
///
/// Thread-safe; a few loads.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_usage(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_group_usage", group, out, Group::usage) }
}

/// What is in use in this group and below in `*out`: the usage less the
/// units stocked for the subtree on every CPU (Rust: `Group::usage` −
/// `Group::stocked_subtree`), without draining anything. Exact while no
/// charge or uncharge of the subtree runs meanwhile (each that does may
/// show in it or not, and one in flight may move it by up to a batch).
/// Under the preload library the threads' reserves (at most 32 KiB per
/// thread, charged to the group a thread allocated in last) still count;
/// `splitcount_hierarchy_drain_stocks` returns the calling thread's.
///
/// Thread-safe; takes each CPU's stock lock in turn (as a drain does, but
/// leaves the stocks as they are).
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_usage_exact(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        read("splitcount_group_usage_exact", group, out, |g| {
            let usage = g.usage();
            usage.saturating_sub(g.stocked_subtree())
        })
    }
}

/// The units charged to this group (not its children) and held unused in
/// the per-CPU stocks, on all CPUs, in `*out` (Rust: `Group::stocked`; at
/// most the hierarchy's stock batch per CPU).
///
/// Thread-safe; takes each CPU's stock lock in turn.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_stocked(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_group_stocked", group, out, Group::stocked) }
}

/// The units charged to this group or any group below it and held unused
/// in the per-CPU stocks, on all CPUs, in `*out` (Rust:
/// `Group::stocked_subtree`): the part of `splitcount_group_usage` that
/// nothing uses.
///
/// Thread-safe; takes each CPU's stock lock in turn.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_stocked_subtree(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        read(
            "splitcount_group_stocked_subtree",
            group,
            out,
            Group::stocked_subtree,
        )
    }
}

/// The peak usage since creation or the last `splitcount_group_reset_peak`
/// in `*out`.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_peak(
    group: *mut splitcount_group,
    out: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read("splitcount_group_peak", group, out, Group::peak) }
}

/// Restart the peak from the current usage.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_reset_peak(group: *mut splitcount_group) -> c_int {
    run("splitcount_group_reset_peak", || {
        any(group)?.group.reset_peak();
        Ok(())
    })
}

/// The group's event counts in `*out`.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_events(
    group: *mut splitcount_group,
    out: *mut splitcount_events,
) -> c_int {
    run("splitcount_group_events", || {
        let e = any(group)?.group.events();
        let events = splitcount_events {
            max: e.max,
            high: e.high,
            oom: e.oom,
            underflow: e.underflow,
            breaches: e.breaches,
            refused: e.refused,
        };
        // SAFETY: the caller's contract.
        unsafe { put(out, events) }
    })
}

/// The checkpoint of cooperative enforcement (Rust: `Group::check`):
/// `SPLITCOUNT_OK`, or `SPLITCOUNT_E_OVER_LIMIT` with the numbers in the
/// message if a charge to this group (or below it) went over a limit and
/// was let through, until `splitcount_group_clear_breach`. One load when
/// nothing happened.
///
/// Breaches are recorded by charges let through past `max`: the preload
/// library's `malloc` (and a Rust program's `Accounted` allocator) over a
/// limit whose enforcement is `SPLITCOUNT_ENFORCE_COOPERATIVE`, and
/// `splitcount_group_charge` (which is never refused) under either
/// enforcement. `splitcount_group_try_charge` is refused at the limit
/// instead and records none.
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_check(group: *mut splitcount_group) -> c_int {
    run("splitcount_group_check", || {
        any(group)?
            .group
            .check()
            .map_err(|e| Error::new(SPLITCOUNT_E_OVER_LIMIT, e.to_string()))
    })
}

/// Forget a recorded breach (see `splitcount_group_check`).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_clear_breach(group: *mut splitcount_group) -> c_int {
    run("splitcount_group_clear_breach", || {
        any(group)?.group.clear_breach();
        Ok(())
    })
}

/// Add `delta` to stat item `item` of a live group on this CPU (a negative
/// delta to an event item is `SPLITCOUNT_E_INVALID`).
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn splitcount_group_mod_stat(
    group: *mut splitcount_group,
    item: u32,
    delta: i64,
) -> c_int {
    run("splitcount_group_mod_stat", || {
        let g = live(group)?;
        g.group
            .mod_stat(g.stat(item)?, delta)
            .map_err(|e| Error::new(SPLITCOUNT_E_INVALID, e.to_string()))
    })
}

/// The hierarchical value of stat item `item` (the group's subtree) in
/// `*out`, flushing first if enough changed (at most `2·64·ncpu` units of
/// updates may be missing otherwise).
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_stat(
    group: *mut splitcount_group,
    item: u32,
    out: *mut i64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { read_stat("splitcount_group_stat", group, item, out, Group::stat) }
}

/// The group's own value of stat item `item` (without its children) in
/// `*out`, flushing first if enough changed.
///
/// Thread-safe.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_stat_local(
    group: *mut splitcount_group,
    item: u32,
    out: *mut i64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        read_stat(
            "splitcount_group_stat_local",
            group,
            item,
            out,
            Group::stat_local,
        )
    }
}

/// Flush the group's subtree's statistics if `force` or if enough changed;
/// whether it flushed in `*flushed` (may be NULL).
///
/// Thread-safe (one flusher runs at a time; others wait).
///
/// # Safety
/// `flushed` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn splitcount_group_flush(
    group: *mut splitcount_group,
    force: bool,
    flushed: *mut bool,
) -> c_int {
    run("splitcount_group_flush", || {
        let done = any(group)?.group.flush(force);
        if !flushed.is_null() {
            // SAFETY: the caller's contract.
            unsafe { put(flushed, done) }?;
        }
        Ok(())
    })
}
