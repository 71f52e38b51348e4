//! The flusher's state and one *pass* of a flush: the updates one CPU made
//! within the flushed subtree, folded.
//!
//! Everything here runs under the flush lock of [`super::Stats`], one
//! thread at a time. The buffers are kept from one flush to the next, so a
//! flush allocates nothing once they have grown to the work it sees.
//!
//! A pass on CPU `c` for the subtree of `X`:
//!
//! 1. *Drain.* `c`'s list is taken with one exchange and walked. Each
//!    drained group is tested for being within `X` (one comparison when
//!    `X` is a root), and the lines its fold will write are prefetched:
//!    they arrive while the pass goes on.
//! 2. *Marks.* The marks of the drained groups within `X` are cleared,
//!    then one `fence(SeqCst)`, then their values are read (the ordering
//!    argument is at [`Flusher::pass`]).
//! 3. *Fold.* Each such group's delta on `c` since the last flush goes into
//!    its local value and, climbing, into the hierarchical values of the
//!    group and of every ancestor up to `X`; what crosses `X`
//!    goes to the `pending` of `X`'s parent, which is *carried* on `c` to a
//!    later flush of an ancestor (which folds it then). A climb costs what
//!    the threshold climb of one update of that group already cost the
//!    updater.
//! 4. *Carry* the drained groups outside `X` (their marks stay set) to a
//!    later flush; give back the other references the list held.
//!
//! Carried entries exist only after flushes below a root, or of another
//! tree's root: a flush of a root folds everything of its tree on its CPUs
//! and leaves nothing of that tree behind. Why the raw
//! pointers stay valid is at [`Flusher`].

use super::group::{StatGroup, UpdateNode, NOT_KEPT};
use crate::sync::{
    fence, AtomicPtr,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use crossbeam_utils::CachePadded;
use std::ptr::NonNull;
use std::sync::Arc;

/// A group kept in a CPU's carried set. A holder's entry owns a strong
/// reference; a drained group's owns the list's, unless the flusher keeps
/// the node's reference (`kept_at`), which it settles when it folds it.
#[derive(Clone, Copy)]
struct Carried {
    group: NonNull<StatGroup>,
    /// Carried for its `pending` (a flush of a child passed deltas up to
    /// it), not as a drained group outside the flushed subtree.
    holder: bool,
}

/// A group to fold in this pass.
#[derive(Clone, Copy)]
struct Fold {
    group: NonNull<StatGroup>,
    /// Its deltas are `deltas[previous fold's end..end]`.
    end: usize,
    /// Fold its `pending` (a carried holder) rather than its values on
    /// this CPU (a drained group).
    holder: bool,
    /// The entry owns a strong reference, given back at the end of the
    /// pass (a holder's; a drained group's unless the flusher keeps it).
    release: bool,
}

/// The flusher's state: what each CPU carries to a later flush, and the
/// scratch of a pass. Only ever used under the flush lock.
///
/// **Why the raw pointers are valid.** Every group pointer of a pass is:
///
/// - a drained group: the list held a strong reference for its node
///   (taken by the pusher with `Arc::into_raw`, or kept by the flusher in
///   `kept`); the pass gives it back only at its end, after the last use
///   of any pointer of the pass, or keeps it for the group's carried
///   entry, or in `kept` (*Kept references* below);
/// - a carried group: its entry owns a strong reference, taken when it was
///   carried and, once the group is folded, given back at the end of the
///   pass likewise;
/// - an ancestor of one of those: a group holds an `Arc` of its parent,
///   which never changes before the group is dropped;
/// - the flushed group `X`, borrowed by the caller, or its parent.
///
/// **Kept references.** For a group made by `Stats::kept_group` (every
/// group of a hierarchy), the fold of a drained node does not give the
/// list's reference back: it moves it to the CPU's `kept` set and writes
/// its index in the node's `kept_at`, before the `Release` store that
/// clears the node's mark. The next push — whose CAS on the mark reads
/// that store — finds `kept_at` set and takes no reference: a group
/// updated between two flushes costs neither the push's increment nor the
/// fold's decrement (a locked instruction each, about a fifth of a small
/// flush). `kept_at` changes only under the flush lock; it goes from
/// `NOT_KEPT` to an index or back only while the mark is held by the list
/// (set and drained, or carried), so a pusher (which reads it only after
/// winning the mark) sees that change or not at all. (An entry moved by
/// another's `swap_remove` gets its new index at any time, but an index
/// for an index: a pusher reading either decides the same.) Once the group is retired (`Stats::retire`, which pushes its kept
/// nodes once more and flushes), a fold takes the reference out of `kept`
/// again and gives it back; pushes after that take their own.
pub(crate) struct Flusher {
    carried: Box<[Vec<Carried>]>,
    /// Per CPU, the groups whose node's reference the flusher keeps for
    /// its next push; each entry owns one strong reference.
    kept: Box<[Vec<NonNull<StatGroup>>]>,
    fold: Vec<Fold>,
    /// The nonzero deltas of the groups in `fold`, `(item, delta)`.
    deltas: Vec<(usize, i64)>,
    /// Their sum per item: what reaches `X` (and its parent's `pending`).
    sum: Vec<i64>,
}

// SAFETY: the pointers are to `StatGroup`s (which are `Send + Sync`), kept
// alive as the type's docs say; the flusher is only used under the flush
// lock.
unsafe impl Send for Flusher {}

/// Hint the processor to fetch the line at `p` (no effect on results).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(all(target_arch = "x86_64", not(loom)))]
    // SAFETY: a prefetch never faults nor changes memory, whatever the
    // address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom))))]
    let _ = p;
}

/// Whether `g` is `x` or below it; prefetches the folded values a fold of
/// `g` within `x` writes.
///
/// When `x` is a root the test is one comparison (`g`'s root), and the
/// prefetch covers `g` and its parent — the groups near the root are the
/// ones every flush writes, and stay cached. Otherwise a climb to `x`'s
/// depth prefetches every group it passes.
#[inline]
fn within_prefetching(g: &StatGroup, x: &StatGroup) -> bool {
    prefetch(g.folded_line());
    if x.parent.is_none() {
        if let Some(p) = g.parent.as_deref() {
            prefetch(p.folded_line());
        }
        return std::ptr::eq(g.root, x);
    }
    let mut at = g;
    while at.depth > x.depth {
        match at.parent.as_deref() {
            Some(p) => at = p,
            None => return false,
        }
        prefetch(at.folded_line());
    }
    std::ptr::eq(at, x)
}

/// `g`'s parent if `g` is below `x` (which `g` is within).
#[inline(always)]
fn below<'a>(g: &'a StatGroup, x: &StatGroup) -> Option<&'a StatGroup> {
    if std::ptr::eq(g, x) {
        None
    } else {
        g.parent.as_deref()
    }
}

impl Flusher {
    pub(crate) fn new(cpus: usize) -> Flusher {
        Flusher {
            carried: (0..cpus).map(|_| Vec::new()).collect(),
            kept: (0..cpus).map(|_| Vec::new()).collect(),
            fold: Vec::new(),
            deltas: Vec::new(),
            sum: Vec::new(),
        }
    }

    /// Fold CPU `cpu`'s updates within `x`'s subtree; `list` is that CPU's
    /// update list and `k` the item count. Carries the rest to a later
    /// flush.
    ///
    /// **Ordering.** Updater: SeqCst add to its value, then SeqCst load of
    /// its node's mark. Flusher: clear the marks of the drained groups
    /// about to be folded (relaxed stores), one `fence(SeqCst)`, then load
    /// their values. Either the updater's load of the mark follows the
    /// fence in the SeqCst order — it sees the mark cleared and pushes the
    /// group again — or it precedes the fence, and then so does its add,
    /// which the flusher's load after the fence sees. A group drained but
    /// not folded keeps its mark set (so it cannot be pushed twice) and is
    /// carried.
    pub(crate) fn pass(
        &mut self,
        cpu: usize,
        list: &AtomicPtr<UpdateNode>,
        x: &StatGroup,
        k: usize,
    ) {
        // Speculative: an empty list and nothing carried cost one plain
        // load, no locked instruction.
        let list_empty = list.load(Relaxed).is_null();
        if list_empty && self.carried[cpu].is_empty() {
            return;
        }
        let Flusher {
            carried,
            kept,
            fold,
            deltas,
            sum,
        } = self;
        let carried = &mut carried[cpu];
        let kept = &mut kept[cpu];
        if !carried.is_empty() {
            take_carried_within(carried, kept, cpu, x, fold);
        }
        if !list_empty {
            // Acquire: pairs with the pushers' Release (their `next`).
            let mut p = list.swap(std::ptr::null_mut(), Acquire);
            while !p.is_null() {
                // SAFETY: a node on the list belongs to a group the list
                // holds a strong reference to.
                let node = unsafe { &*p };
                // Read `next` while the node's mark is still set: until the
                // mark is cleared no updater can push the node again, so
                // `next` cannot change under us. Once it is read, a push
                // again (which rewrites `next`) no longer matters here.
                let next = node.next.load(Relaxed);
                // SAFETY: `owner` is the node's group, kept alive by the
                // strong reference the list holds for this node (now the
                // pass's: see `Flusher`).
                let group = unsafe { &*node.owner };
                // The entries keep the node's pointer to its group, not one
                // made from `group`: they may give the reference back (and
                // drop the group through them), which a pointer made from a
                // shared reference may not do.
                // SAFETY: `owner` is never null (see `StatGroup::new`).
                let owner = unsafe { NonNull::new_unchecked(node.owner.cast_mut()) };
                let within = within_prefetching(group, x);
                if within {
                    let release = settle(kept, owner, cpu);
                    // Clear the mark of a group about to be folded (before
                    // the fence below, which comes before its values are
                    // read: see above). Release: the next push's CAS sees
                    // `kept_at` as `settle` left it.
                    node.on_list.store(false, Release);
                    fold.push(Fold {
                        group: owner,
                        end: 0,
                        holder: false,
                        release,
                    });
                } else {
                    // Its mark stays set; the list's reference becomes the
                    // entry's.
                    carried.push(Carried {
                        group: owner,
                        holder: false,
                    });
                }
                p = next;
            }
        }
        // One fence between clearing the marks and reading the values.
        if fold.iter().any(|f| !f.holder) {
            fence(SeqCst);
        }
        // Take each group's deltas — its values on this CPU (on lines the
        // updater just wrote) or a holder's pending — and add them to its
        // ancestors above its parent and below `x`: groups shared by many
        // climbs, which stay cached. The groups' own folded lines and their
        // parents' come last: those are the lines the drain prefetched, the
        // farthest from the cache, and every step before gives them time to
        // arrive. `x` gets the sum of all deltas, once.
        deltas.clear();
        sum.clear();
        sum.resize(k, 0);
        for f in fold.iter_mut() {
            // SAFETY: valid for the pass (and so are its ancestors); `cpu`
            // is a CPU of the group's `Stats` and `k` its item count.
            let g = unsafe { f.group.as_ref() };
            let start = deltas.len();
            if f.holder {
                g.take_pending(deltas);
            } else {
                // SAFETY: as above.
                unsafe { g.take_own_deltas(cpu, k, deltas) };
            }
            f.end = deltas.len();
            let ds = &deltas[start..];
            for &(item, d) in ds {
                sum[item] = sum[item].wrapping_add(d);
            }
            if let Some(mut at) = below(g, x).and_then(|p| below(p, x)) {
                while !std::ptr::eq(at, x) {
                    at.add_hier(ds);
                    // `g` is within `x`: the climb meets it before the top.
                    at = at.parent.as_deref().expect("within x");
                }
            }
        }
        let mut start = 0;
        for f in fold.iter() {
            let ds = &deltas[start..f.end];
            start = f.end;
            // SAFETY: as above.
            let g = unsafe { f.group.as_ref() };
            if let Some(parent) = below(g, x) {
                if !std::ptr::eq(parent, x) {
                    parent.add_hier(ds);
                }
                g.add_hier(ds);
            }
            if !f.holder {
                g.add_local(ds);
            }
        }
        x.add_hier_sums(sum);
        if let Some(parent) = &x.parent {
            if sum.iter().any(|&d| d != 0) {
                parent.add_pending(sum);
                carry_holder(carried, parent, cpu);
            }
        }
        for f in fold.drain(..) {
            if f.release {
                // SAFETY: the reference this fold owned (a list's or a
                // carried entry's), given back once; no pointer of the
                // pass is used after this.
                unsafe { Arc::decrement_strong_count(f.group.as_ptr()) };
            }
        }
    }

    /// Give back every reference the lists and the carried sets hold (when
    /// the `Stats` goes away), folding nothing.
    pub(crate) fn release_all(&mut self, lists: &[CachePadded<AtomicPtr<UpdateNode>>]) {
        let sets = lists.iter().zip(self.carried.iter_mut());
        for (cpu, ((list, carried), kept)) in sets.zip(self.kept.iter_mut()).enumerate() {
            let mut p = list.swap(std::ptr::null_mut(), Acquire);
            while !p.is_null() {
                // SAFETY: as in `pass`.
                let node = unsafe { &*p };
                p = node.next.load(Relaxed);
                if node.kept_at.load(Relaxed) == NOT_KEPT {
                    // SAFETY: the list's reference, given back once; `next`
                    // was read before.
                    unsafe { Arc::decrement_strong_count(node.owner) };
                }
            }
            for c in carried.drain(..) {
                // SAFETY: an entry's group is alive (as in `pass`).
                let g = unsafe { c.group.as_ref() };
                // A holder's entry owns a reference; a drained group's owns
                // the list's unless the node's is kept (given back below).
                if c.holder || g.nodes[cpu].kept_at.load(Relaxed) == NOT_KEPT {
                    // SAFETY: the carried entry's own reference.
                    unsafe { Arc::decrement_strong_count(c.group.as_ptr()) };
                }
            }
            for g in kept.drain(..) {
                // SAFETY: an entry of the set owns a reference.
                unsafe { g.as_ref() }.nodes[cpu]
                    .kept_at
                    .store(NOT_KEPT, Relaxed);
                // SAFETY: the kept reference, given back once (the `Stats`
                // is going: no push follows).
                unsafe { Arc::decrement_strong_count(g.as_ptr()) };
            }
        }
    }
}

/// Move the carried entries within `x` to `fold` (their references with
/// them); keep the others.
fn take_carried_within(
    carried: &mut Vec<Carried>,
    kept: &mut Vec<NonNull<StatGroup>>,
    cpu: usize,
    x: &StatGroup,
    fold: &mut Vec<Fold>,
) {
    carried.retain(|c| {
        // SAFETY: a carried entry owns a reference.
        let g = unsafe { c.group.as_ref() };
        if !within_prefetching(g, x) {
            return true;
        }
        let release = if c.holder {
            g.nodes[cpu].queued.store(false, Relaxed);
            true
        } else {
            let release = settle(kept, c.group, cpu);
            // A drained group's mark, set since: cleared before the fence
            // (Release: as in `pass`).
            g.nodes[cpu].on_list.store(false, Release);
            release
        };
        fold.push(Fold {
            group: c.group,
            end: 0,
            holder: c.holder,
            release,
        });
        false
    });
}

/// Settle the reference of `group`'s node on `cpu`, about to be folded (its
/// mark is still set): keep it in `kept` for the next push if the group is
/// kept and not retired, else take it out of `kept` (if there). Returns
/// whether the fold owns the reference and gives it back.
///
/// `group` is the pointer the node's reference was counted through (the
/// node's `owner` or a carried entry's copy of it): the set keeps it, to
/// give the reference back through it one day.
#[inline]
fn settle(kept: &mut Vec<NonNull<StatGroup>>, group: NonNull<StatGroup>, cpu: usize) -> bool {
    // SAFETY: the caller's reference keeps the group alive.
    let g = unsafe { group.as_ref() };
    let node = &g.nodes[cpu];
    let at = node.kept_at.load(Relaxed);
    // SeqCst: see `Stats::retire`, which may find the marks clear and
    // leave without the flush lock (a plain load on x86).
    if g.keep && !g.retired.load(SeqCst) {
        if at == NOT_KEPT {
            // The push's reference moves to the set.
            node.kept_at.store(kept.len(), Relaxed);
            kept.push(group);
        }
        false
    } else {
        if at != NOT_KEPT {
            // The set's reference moves to the fold; the entry moved into
            // its place gets its new index.
            kept.swap_remove(at);
            if let Some(moved) = kept.get(at) {
                // SAFETY: an entry of the set owns a reference.
                unsafe { moved.as_ref() }.nodes[cpu]
                    .kept_at
                    .store(at, Relaxed);
            }
            node.kept_at.store(NOT_KEPT, Relaxed);
        }
        true
    }
}

/// Carry `parent` (whose `pending` just grew) on `cpu` unless it is
/// carried there as a holder already.
fn carry_holder(carried: &mut Vec<Carried>, parent: &Arc<StatGroup>, cpu: usize) {
    let node = &parent.nodes[cpu];
    if node.queued.load(Relaxed) {
        return;
    }
    node.queued.store(true, Relaxed);
    // From the `Arc`, not from a reference to the group: the entry gives
    // its reference back through this pointer, which may drop the group.
    // SAFETY: an `Arc`'s pointer is never null.
    let group = unsafe { NonNull::new_unchecked(Arc::as_ptr(parent).cast_mut()) };
    // SAFETY: `parent` is alive (the flushed group holds it); the entry
    // owns this new reference until it is folded.
    unsafe { Arc::increment_strong_count(group.as_ptr()) };
    carried.push(Carried {
        group,
        holder: true,
    });
}
