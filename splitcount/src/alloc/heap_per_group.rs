//! [`HeapPerGroup`]: accounting without a tag on the blocks of the groups
//! given a heap — their blocks in a heap of their own, the heap telling
//! whose a block is.
//!
//! [`Accounted`] writes the charged account in an 8-byte header in front of
//! every block. Where the inner allocator's size class has no room for it —
//! every size that is a multiple of 16 on jemalloc and mimalloc — the
//! header moves the block up a class: a 16-byte block takes 32. Here the
//! account is found from the block's address instead: a group given a
//! heap ([`HeapPerGroup::give_heap`]) has one of the inner allocator's
//! ([`InnerHeaps`]: a first-class mimalloc heap, or a jemalloc arena whose
//! pages lie in an address range of its own), its blocks are made there,
//! and a free asks the inner allocator which heap the block lies in (for
//! mimalloc, `mi_heap_of`: its page map and the page's heap field; for
//! jemalloc, the block's address range: see `jemalloc_arenas.rs`) and a
//! small table which account owns that heap. A block occupies what the
//! inner allocator alone gives it.
//!
//! ```text
//!   alloc(layout)                              dealloc(block, layout)
//!   reserve of the thread's account  ──┐        heap = inner.heap_of(block)
//!   account.heap (one load)            │        account = TABLE[hash(heap)]
//!   inner.alloc_in(heap, layout)  ◀────┘        uncharge footprint, inner free
//! ```
//!
//! **Heaps are given, few and reused.** A heap costs memory of its own
//! (each thread allocating in it takes pages of its own there: a few
//! hundred KiB per thread and heap, measured), so groups get one only when
//! asked, [`HeapPerGroup::give_heap`]: the tenants that hold many blocks.
//! At most [`MAX_HEAPS`] heaps are made, each bound to one account at a
//! time. An account holds its heap until it ends — its group removed and
//! every handle on it dropped (a `Group`, an open scope, a child group all
//! hold it), every byte charged through it given back, its last block
//! freed — and the heap then goes to the next group given one. Groups without a heap have
//! their blocks made with a header in the inner allocator's default heap,
//! exactly as [`Accounted`] does (their frees find no owner for the
//! default heap and read the header).
//!
//! What a block charges is fixed by the second type parameter, as for
//! `Accounted`: its footprint ([`Footprint`], the default: the inner
//! allocator's usable size, with no header in it) or its requested size
//! ([`Requested`](super::Requested)).

#![allow(unsafe_code)]

use super::charging::{Charging, Footprint, InnerFootprint};
use super::reconcile::Reconciliation;
use super::scope::without_accounting;
use super::wrapper::{Accounted, AttachError};
use crate::group::{AccountKey, Group, Hierarchy};
use std::alloc::{GlobalAlloc, Layout};
use std::fmt;
use std::sync::atomic::{
    AtomicPtr, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::Mutex;

/// The most heaps a process makes for [`HeapPerGroup`] (each bound to one
/// account at a time; accounts beyond them get headers).
pub const MAX_HEAPS: usize = 256;

/// Entries of the heap table: a power of two, twice [`MAX_HEAPS`], so that
/// a look-up probes about one entry and always finds an empty one.
const TABLE_LEN: usize = 2 * MAX_HEAPS;

/// An inner allocator that can keep blocks apart in heaps and say which
/// heap a block lies in: what [`HeapPerGroup`] needs. Implemented for
/// `mimalloc::MiMalloc` (feature `mimalloc`; mimalloc 3's first-class
/// heaps, which any thread may allocate from) and for
/// `tikv_jemallocator::Jemalloc` (feature `jemalloc`; an arena per heap,
/// whose memory lies in an address range of its own).
///
/// # Safety
/// - A block from [`InnerHeaps::alloc_in`] is freed by
///   [`InnerHeaps::dealloc_in`] with the same layout, from any thread, and
///   meets [`InnerFootprint`]'s contract: [`InnerFootprint::footprint`] of
///   it (and [`InnerFootprint::layout_footprint`] of its layout, where
///   `Some`) is what it occupies, at least the size asked for, and the
///   same at its allocation and its free.
/// - [`InnerHeaps::heap_of`] of a pointer into a live block from
///   `alloc_in(heap, …)` returns `heap`; of a block from the allocator's
///   own `GlobalAlloc` methods, a value that no `new_heap` returned.
/// - Where [`InnerFootprint::layout_footprint`] of a layout is `None`,
///   [`InnerFootprint::footprint`] of a block from `alloc_in` is the
///   block's usable size under any such layout (a `realloc` that leaves the
///   block in place charges it under the new layout).
/// - Heaps are never destroyed: a heap from `new_heap` stays valid for the
///   process's life.
pub unsafe trait InnerHeaps: InnerFootprint {
    /// A new heap, or null if none can be made.
    fn new_heap(&self) -> *mut u8;

    /// The heap the block `block` points into.
    ///
    /// # Safety
    /// `block` points into a live block of this allocator.
    unsafe fn heap_of(&self, block: *const u8) -> *mut u8;

    /// A block of `layout` (non-zero size) from `heap`, zeroed if asked;
    /// null on failure.
    ///
    /// # Safety
    /// `heap` came from [`InnerHeaps::new_heap`].
    unsafe fn alloc_in(&self, heap: *mut u8, layout: Layout, zeroed: bool) -> *mut u8;

    /// Free a block from [`InnerHeaps::alloc_in`]. The default: the
    /// allocator's `GlobalAlloc::dealloc`.
    ///
    /// # Safety
    /// `block` is live, made by `alloc_in` with `layout`.
    #[inline]
    unsafe fn dealloc_in(&self, block: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { self.dealloc(block, layout) }
    }

    /// Whether [`InnerFootprint::footprint`] of a block is a function of
    /// its layout alone (jemalloc's class of it, `nallocx`), not of the
    /// block (mimalloc's `mi_usable_size`): a `realloc` then keeps a block
    /// in place only where the new layout's footprint is the block's own.
    /// The default: `false`.
    const FOOTPRINT_OF_LAYOUT: bool = false;

    /// What a block of `layout` from `alloc_in` will occupy, as near as
    /// can be told before it exists, and at most that: charged before the
    /// block is made (so a limit can refuse it), corrected after. The
    /// default is the size asked for.
    fn footprint_estimate(&self, layout: Layout) -> usize {
        layout.size()
    }
}

/// One heap and the account that owns it (null: none).
struct Entry {
    heap: AtomicPtr<u8>,
    account: AtomicPtr<u8>,
}

/// Every heap made, at a slot chosen by its address (open addressing,
/// linear probing). Entries are never removed: a heap lives as long as the
/// process, its owner changes.
static TABLE: [Entry; TABLE_LEN] = [const {
    Entry {
        heap: AtomicPtr::new(std::ptr::null_mut()),
        account: AtomicPtr::new(std::ptr::null_mut()),
    }
}; TABLE_LEN];

/// Heaps made so far.
static MADE: AtomicUsize = AtomicUsize::new(0);

/// Serialises binds (once per account: a slow path).
static BIND: Mutex<()> = Mutex::new(());

/// The table slot a heap's probe starts at (Fibonacci hashing of its
/// address).
#[inline(always)]
fn slot_of(heap: *mut u8) -> usize {
    const SHIFT: u32 = usize::BITS - TABLE_LEN.trailing_zeros();
    ((heap as usize >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> SHIFT
}

/// The account that owns `heap`, or null when `heap` is no heap of the
/// table (the inner allocator's default heap: a block with a header).
#[inline(always)]
fn owner_of(heap: *mut u8) -> *const u8 {
    let mut i = slot_of(heap);
    loop {
        let entry = &TABLE[i];
        // Acquire (both): a block of this heap was made after its entry
        // was written and its owner bound (the maker read the account's
        // heap with acquire after `bind`'s releases), and handed to this
        // thread after that.
        let h = entry.heap.load(Acquire);
        if h == heap {
            return entry.account.load(Acquire);
        }
        if h.is_null() {
            return std::ptr::null();
        }
        i = (i + 1) & (TABLE_LEN - 1);
    }
}

/// Give `account` a heap: the one it has, else one no live account owns,
/// else a new one while fewer than [`MAX_HEAPS`] exist; an error if every
/// heap is owned or the inner allocator made none.
fn bind<A: InnerHeaps>(inner: &A, account: AccountKey) -> Result<*mut u8, HeapError> {
    let _serial = BIND.lock().unwrap_or_else(|e| e.into_inner());
    let bound = account.heap();
    if !bound.is_null() {
        return Ok(bound);
    }
    let owner = account.as_ptr() as *mut u8;
    // A heap whose owner has ended. Acquire: pairs with the release that
    // cleared the owner, after all of that owner's blocks were uncharged.
    // Only binds (serialised here) set an owner, so a null read stays null.
    for entry in TABLE.iter() {
        let heap = entry.heap.load(Relaxed);
        if !heap.is_null() && entry.account.load(Acquire).is_null() {
            entry.account.store(owner, Relaxed);
            account.bind_heap(heap, &entry.account);
            return Ok(heap);
        }
    }
    if MADE.load(Relaxed) >= MAX_HEAPS {
        return Err(HeapError::AllTaken);
    }
    let heap = inner.new_heap();
    if heap.is_null() {
        return Err(HeapError::Unavailable);
    }
    MADE.fetch_add(1, Relaxed);
    let mut i = slot_of(heap);
    while !TABLE[i].heap.load(Relaxed).is_null() {
        i = (i + 1) & (TABLE_LEN - 1);
    }
    let entry = &TABLE[i];
    entry.account.store(owner, Relaxed);
    // Release: the owner is written before the heap is found.
    entry.heap.store(heap, Release);
    account.bind_heap(heap, &entry.account);
    Ok(heap)
}

/// Why [`HeapPerGroup::give_heap`] gave none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeapError {
    /// Every one of the [`MAX_HEAPS`] heaps is owned by a group that has
    /// not ended: live, or removed with a handle, a child, a block or some
    /// thread's reserve of its bytes still live.
    AllTaken,
    /// The group is removed: it takes no new charges.
    Removed,
    /// The inner allocator made no new heap: mimalloc's `mi_heap_new`
    /// failed, or, on jemalloc, the heaps' address space (4 TiB, no memory)
    /// could not be reserved — a small `ulimit -v` — or jemalloc made no
    /// arena. The group's blocks keep their headers.
    Unavailable,
}

impl fmt::Display for HeapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeapError::AllTaken => write!(
                f,
                "every one of the {MAX_HEAPS} heaps is owned by a group that has not ended (live, or removed with handles, blocks or reserves left); this group's blocks keep their headers"
            ),
            HeapError::Removed => f.write_str("the group is removed: no heap is given to it"),
            HeapError::Unavailable => f.write_str(
                "the inner allocator made no new heap (mimalloc's mi_heap_new failed, or jemalloc's heaps could not reserve their 4 TiB of address space or make an arena); this group's blocks keep their headers",
            ),
        }
    }
}

impl std::error::Error for HeapError {}

/// How the process's heaps are used: see [`HeapPerGroup::heaps`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapCount {
    /// Heaps made (at most [`MAX_HEAPS`]; never destroyed).
    pub made: usize,
    /// Heaps an account owns now.
    pub owned: usize,
}

/// A `GlobalAlloc` that charges every allocation to the current thread's
/// group, as [`Accounted`] does, with **no tag on the blocks of the groups
/// given a heap** ([`HeapPerGroup::give_heap`]): their blocks are made in a
/// heap of their own, and a free finds the group from the heap the block
/// lies in. Other groups' blocks carry `Accounted`'s header.
///
/// Usage is the sum of the live blocks' footprints (the inner allocator's
/// usable size: [`Footprint`], the default) or requested sizes
/// ([`HeapPerGroup::with_charging`] with [`Requested`](super::Requested)),
/// and a block occupies exactly what the inner allocator alone would give it — a 16-byte `Box` takes mimalloc's 16-byte
/// class, where `Accounted<MiMalloc, Footprint>`'s header moves it to 32.
/// Everything else — scopes, limits and enforcement, the reserve and the
/// byte stock, hooks, [`HeapPerGroup::max_slack`] — is `Accounted`'s: the
/// charging is the same code.
///
/// ```no_run
/// use splitcount::alloc::HeapPerGroup;
/// use splitcount::group::Hierarchy;
///
/// #[global_allocator]
/// static ALLOC: HeapPerGroup = HeapPerGroup::new(mimalloc::MiMalloc);
///
/// fn main() {
///     let memory = Hierarchy::default();
///     ALLOC.attach(&memory).unwrap();
///     let tenant = memory.root().child("tenant-a").unwrap();
///     ALLOC.give_heap(&tenant).unwrap();
///     let boxes: Vec<Box<[u8; 16]>> = tenant.scope(|| (0..1000).map(|_| Box::new([0; 16])).collect());
///     memory.drain_stocks();
///     // 1,000 boxes of 16 bytes in mimalloc's 16-byte class, and the vector.
///     assert!(tenant.usage() >= 16_000);
///     drop(boxes);
/// }
/// ```
///
/// **On jemalloc** (`HeapPerGroup<tikv_jemallocator::Jemalloc>`, feature
/// `jemalloc`) a heap is an arena whose pages all lie in one 16 GiB region
/// of 4 TiB of address space reserved at the first heap (`PROT_NONE`: no
/// memory until used), so a free finds the heap with a subtraction and a
/// mask. Each thread keeps a jemalloc cache per heap it uses (given back
/// at its exit). Per block it costs nothing (+0.1% resident memory over
/// jemalloc alone for 1,000,000 blocks of 8 to 128 B); in time about
/// ×2.6–2.9 of jemalloc alone on small-block rings (×1.3 for
/// `Accounted<Jemalloc>`): jemalloc's calls with an explicit arena and
/// cache take its general path. A group holds at most 16 GiB in its
/// arena at once (less with blocks of a GiB and more: jemalloc grows an
/// arena's memory geometrically); past it, new and reallocated blocks get
/// headers. Each cache costs about 12 KiB, and keeps free blocks of its
/// heap (up to a cache's worth per size class) until its thread exits:
/// jemalloc's cache GC does not visit explicit caches.
///
/// **The cost** (mimalloc). A free asks the inner allocator for the block's heap
/// (`mi_heap_of`: about 30 instructions, a page-map look-up) and probes a
/// table; an allocation reads the account's heap. In all, about ×1.3 the
/// time of `Accounted`'s header on small blocks. **The memory of a heap.**
/// Each thread that allocates in a heap gets mimalloc's thread-local part
/// of it and its own partly filled page (64 KiB) per size class it uses
/// there: measured with blocks of three size classes and one thread,
/// +208 KiB for one heap and +198 KiB per heap in 64 (with headers
/// instead: +12 and +13 KiB). Where transparent huge pages are on
/// (mimalloc asks for them; a kernel in `madvise` or `always` mode grants
/// them), a heap's first blocks fault in a 2 MiB huge page of their own:
/// +2,048 KiB for one heap, +416 KiB per heap in 64
/// (`MIMALLOC_ALLOW_THP=0` turns them off). A heap pays where its
/// group holds many small blocks — tens of thousands per thread allocating
/// in it — not for short-lived groups. **The limits.** At most
/// [`MAX_HEAPS`] groups own a heap at once ([`HeapError::AllTaken`]
/// beyond). A heap is held until its account ends: its group removed and
/// every handle on it dropped (a `Group`, an open scope, a child group),
/// its last block freed, and every thread's reserve of its bytes returned
/// (call [`drain_thread`](super::drain_thread) where workers park). A
/// removed group whose blocks stay live, or whose handle a map still
/// holds, keeps its heap. On mimalloc, requires mimalloc 3 (the `mimalloc` crate's default; its `v2`
/// feature has no `mi_heap_of` and heaps owned by one thread).
#[cfg(feature = "mimalloc")]
pub struct HeapPerGroup<A = mimalloc::MiMalloc, C = Footprint> {
    accounted: Accounted<A, C>,
}

/// A `GlobalAlloc` that charges every allocation to the current thread's
/// group with no tag on the blocks of the groups given a heap: see the
/// docs with the `mimalloc` feature on (this build has only `jemalloc`).
#[cfg(not(feature = "mimalloc"))]
pub struct HeapPerGroup<A, C = Footprint> {
    accounted: Accounted<A, C>,
}

impl<A: InnerHeaps> HeapPerGroup<A> {
    /// Wrap `inner`, charging footprints. Until [`HeapPerGroup::attach`],
    /// allocations pass through unaccounted (with a header, in the inner
    /// allocator's default heap).
    pub const fn new(inner: A) -> HeapPerGroup<A> {
        HeapPerGroup::with_charging(inner, Footprint)
    }
}

impl<A: InnerHeaps, C: Charging> HeapPerGroup<A, C>
where
    Accounted<A, C>: GlobalAlloc,
{
    /// Wrap `inner`, charging what `charging` says: [`Footprint`] (as
    /// [`HeapPerGroup::new`]: the inner allocator's usable size of each
    /// block) or [`Requested`](super::Requested) (the size asked for).
    ///
    /// ```
    /// use splitcount::alloc::{HeapPerGroup, Requested};
    ///
    /// static REQUESTED: HeapPerGroup<mimalloc::MiMalloc, Requested> =
    ///     HeapPerGroup::with_charging(mimalloc::MiMalloc, Requested);
    /// ```
    pub const fn with_charging(inner: A, charging: C) -> HeapPerGroup<A, C> {
        HeapPerGroup {
            accounted: Accounted::with_charging(inner, charging),
        }
    }

    /// The same allocator with strict limits: see
    /// [`Accounted::without_reporting_grace`].
    pub const fn without_reporting_grace(mut self) -> HeapPerGroup<A, C> {
        self.accounted.reporting_grace = false;
        self
    }

    /// Whether a refusal grants the reporting grace: see
    /// [`Accounted::has_reporting_grace`].
    pub const fn has_reporting_grace(&self) -> bool {
        self.accounted.has_reporting_grace()
    }

    /// Start accounting into `hierarchy`: see [`Accounted::attach`].
    pub fn attach(&self, hierarchy: &Hierarchy) -> Result<(), AttachError> {
        self.accounted.attach(hierarchy)
    }

    /// Return every stocked byte and this thread's reserve: see
    /// [`Accounted::drain`].
    pub fn drain(&self) -> u64 {
        self.accounted.drain()
    }

    /// The most usage can run ahead of live footprints: see
    /// [`Accounted::max_slack`] (the same stocks and reserves).
    pub fn max_slack(&self, threads: usize) -> u64 {
        self.accounted.max_slack(threads)
    }

    /// The groups' books beside the process: see [`Accounted::reconcile`]
    /// (headers counted there are those of the groups without a heap).
    pub fn reconcile(&self) -> Option<Reconciliation> {
        self.accounted.reconcile()
    }

    /// Make `group`'s blocks from now on in a heap of their own, with no
    /// tag: a heap no live group owns, or a new one while fewer than
    /// [`MAX_HEAPS`] exist. Its blocks made before keep their headers (a
    /// free tells the two apart). The group holds the heap until it ends —
    /// removed and every handle on it dropped (a `Group`, an open scope, a
    /// child group), its last block freed and every thread's reserve of its
    /// bytes returned ([`drain_thread`](super::drain_thread)) — and the
    /// next group given one takes it. Giving a heap again is `Ok` and
    /// changes nothing. Groups given none (the default, the root included)
    /// have `Accounted`'s header blocks.
    ///
    /// A heap costs memory of its own: on mimalloc, each thread that
    /// allocates in it gets mimalloc's thread-local part of it and partly
    /// filled pages of each size class it uses — measured here, a few
    /// hundred KiB per thread and heap; on jemalloc, each thread that
    /// allocates or frees in it a cache of about 12 KiB and the free blocks
    /// it keeps, up to a cache's worth per size class (see the type's docs). Give heaps to the groups
    /// that hold many blocks (tenants), not to every short-lived one.
    ///
    /// ```no_run
    /// use splitcount::alloc::HeapPerGroup;
    /// use splitcount::group::Hierarchy;
    ///
    /// #[global_allocator]
    /// static ALLOC: HeapPerGroup = HeapPerGroup::new(mimalloc::MiMalloc);
    ///
    /// let memory = Hierarchy::default();
    /// ALLOC.attach(&memory).unwrap();
    /// let tenant = memory.root().child("tenant-a").unwrap();
    /// ALLOC.give_heap(&tenant).unwrap();
    /// let cache: Vec<Box<[u8; 16]>> = tenant.scope(|| (0..1_000_000).map(|_| Box::new([0; 16])).collect());
    /// ```
    pub fn give_heap(&self, group: &Group) -> Result<(), HeapError> {
        if group.is_removed() {
            return Err(HeapError::Removed);
        }
        let account = group.account();
        bind(&self.accounted.inner, account).map(|_| ())
    }

    /// How many heaps exist and how many an account owns now.
    pub fn heaps(&self) -> HeapCount {
        HeapCount {
            made: MADE.load(Relaxed),
            owned: TABLE
                .iter()
                .filter(|e| !e.heap.load(Relaxed).is_null() && !e.account.load(Relaxed).is_null())
                .count(),
        }
    }

    /// What a block of `layout` charges, where the layout alone tells:
    /// its size ([`Requested`](super::Requested)), or its class from the
    /// inner allocator's table ([`Footprint`]).
    #[inline(always)]
    fn charge_known(&self, layout: Layout) -> Option<usize> {
        if C::FOOTPRINT {
            self.accounted.inner.layout_footprint(layout)
        } else {
            Some(layout.size())
        }
    }

    /// What a block of `layout` is charged before it exists: the known
    /// charge, or the inner allocator's estimate (at most the footprint).
    #[inline(always)]
    fn charge_before(&self, layout: Layout) -> u64 {
        self.charge_known(layout)
            .unwrap_or_else(|| self.accounted.inner.footprint_estimate(layout)) as u64
    }

    /// What the live `block` of `layout` charges.
    ///
    /// # Safety
    /// `block` is live, made by `alloc_in` with `layout`.
    #[inline(always)]
    unsafe fn charge_of(&self, block: *mut u8, layout: Layout) -> u64 {
        match self.charge_known(layout) {
            Some(n) => n as u64,
            // SAFETY: forwarded contract.
            None => unsafe { self.accounted.inner.footprint(block, layout) as u64 },
        }
    }

    /// An allocation: charged to the thread's account, made in its heap.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline(always)]
    unsafe fn alloc_with(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let inner = &self.accounted.inner;
        if let Some(n) = self.charge_known(layout) {
            // Taken only for an account with a heap: one without makes a
            // header block, charged by `Accounted` (through `alloc_general`),
            // not taken here to be given back.
            let mut heap = std::ptr::null_mut();
            let acc = self.accounted.take_reserved_if(n as u64, |acc| {
                // SAFETY: the reserve holds bytes of it, which keep it alive.
                heap = unsafe { AccountKey::from_ptr(acc) }.map_or(heap, |k| k.heap());
                !heap.is_null()
            });
            if !acc.is_null() {
                // SAFETY: a heap from `new_heap`; a non-zero size.
                let block = unsafe { inner.alloc_in(heap, layout, zeroed) };
                if block.is_null() {
                    self.accounted.uncharge(acc, n as u64);
                    // The heap made none (a jemalloc arena's region is
                    // full): a header block, charged as `Accounted` charges.
                    // SAFETY: forwarded contract.
                    return unsafe { self.header_block(layout, zeroed) };
                }
                return block;
            }
        }
        // SAFETY: forwarded contract.
        unsafe { self.alloc_general(layout, zeroed) }
    }

    /// [`HeapPerGroup::alloc_with`] past its fast path: the charge's slow
    /// path, a footprint not known from the layout, a header block.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline(never)]
    unsafe fn alloc_general(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let inner = &self.accounted.inner;
        // The account about to be charged: without a heap, its block is
        // `Accounted`'s, charged there once (not charged here, given back
        // and charged again).
        if let Some(account) = self.accounted.charging_account() {
            if account.heap().is_null() {
                // SAFETY: forwarded contract.
                return unsafe { self.header_block(layout, zeroed) };
            }
        }
        let estimate = self.charge_before(layout);
        let key = match self.accounted.charge(estimate) {
            Err(()) => return std::ptr::null_mut(),
            // Not accounted (the reporting grace; not attached, in a hook):
            // a header block charged nothing, made with accounting off so
            // that the grace is not drawn on twice.
            // SAFETY: forwarded contract.
            Ok(None) => return without_accounting(|| unsafe { self.header_block(layout, zeroed) }),
            Ok(Some(key)) => key,
        };
        let heap = key.heap();
        if heap.is_null() {
            // Charged to another account than the one looked at above (a
            // removed group's nearest live ancestor), which has no heap.
            self.accounted.uncharge(key.as_ptr(), estimate);
            // SAFETY: forwarded contract.
            return unsafe { self.header_block(layout, zeroed) };
        }
        // SAFETY: a heap from `new_heap`; a non-zero size.
        let block = unsafe { inner.alloc_in(heap, layout, zeroed) };
        if block.is_null() {
            self.accounted.uncharge(key.as_ptr(), estimate);
            // SAFETY: forwarded contract.
            return unsafe { self.header_block(layout, zeroed) };
        }
        // The rest of its footprint within the limits too (mimalloc rounds
        // a large block by up to 64 KiB more than `mi_good_size` says):
        // refused, the block goes again.
        // SAFETY: live, just made by `alloc_in` with `layout`.
        let exact = unsafe { self.charge_of(block, layout) };
        if !self.recharge(key, estimate, exact) {
            self.accounted.uncharge(key.as_ptr(), estimate);
            // SAFETY: just made by `alloc_in` with `layout`, never handed out.
            unsafe { inner.dealloc_in(block, layout) };
            return std::ptr::null_mut();
        }
        block
    }

    /// A block with a header in the inner allocator's default heap:
    /// [`Accounted`]'s, charged as it charges.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline(never)]
    unsafe fn header_block(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe {
            if zeroed {
                self.accounted.alloc_zeroed(layout)
            } else {
                self.accounted.alloc(layout)
            }
        }
    }

    /// A `realloc` whose heap made no block (a jemalloc arena's region is
    /// full): the contents move to a header block charged to the block's
    /// own account `key` (made in its scope, as `Accounted` charges), and
    /// the heap block is freed. Null (the block kept) if refused.
    ///
    /// # Safety
    /// `ptr` is a live heap block of `layout` whose account is `key`;
    /// `new_layout` has a non-zero size.
    #[cold]
    #[inline(never)]
    unsafe fn realloc_to_header_block(
        &self,
        key: AccountKey,
        ptr: *mut u8,
        layout: Layout,
        new_layout: Layout,
    ) -> *mut u8 {
        let moved = {
            // The live block holds a charge on `key`, which keeps it alive
            // while it is current here.
            let _in = super::scope::enter_held(key);
            // SAFETY: forwarded contract.
            unsafe { self.header_block(new_layout, false) }
        };
        if !moved.is_null() {
            // SAFETY: both live and distinct, each at least this long;
            // `ptr` is freed with its own layout (uncharging `key`) and not
            // used again.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_layout.size()));
                GlobalAlloc::dealloc(self, ptr, layout);
            }
        }
        moved
    }

    /// Make `key`, charged `from` bytes for a block, hold `to`: the rest
    /// charged within the limits (a growth, refusable as `realloc`'s), or
    /// the excess given back. Whether it holds `to`; if refused, nothing
    /// changed.
    fn recharge(&self, key: AccountKey, from: u64, to: u64) -> bool {
        if to > from {
            return self.accounted.charge_growth(key, to - from);
        }
        if to < from {
            self.accounted.uncharge(key.as_ptr(), from - to);
        }
        true
    }
}

// SAFETY: a block is made by the inner allocator — in the heap of the
// account it is charged to (`alloc_in`), or with a header by `Accounted`
// when no heap is its account's — and freed by `InnerHeaps::dealloc_in`
// with the caller's layout or by `Accounted`'s, which the heap it lies in
// tells apart: only blocks charged to a heap's owner are made in
// it (`InnerHeaps`' contract: `heap_of` names it; the default heap is in no
// entry). A heap's owner cannot change while a block of it is live: the
// block's bytes keep its account alive, and the owner is cleared only when
// the account ends. `alloc` and `dealloc` are not inlined into their
// callers, for the reason given in wrapper.rs.
unsafe impl<A: InnerHeaps, C: Charging> GlobalAlloc for HeapPerGroup<A, C>
where
    Accounted<A, C>: GlobalAlloc,
{
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, false) }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, true) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let inner = &self.accounted.inner;
        // SAFETY: `ptr` is a live block of ours.
        let acc = owner_of(unsafe { inner.heap_of(ptr) });
        if acc.is_null() {
            // SAFETY: a block with a header, made by `Accounted`.
            return unsafe { self.accounted.dealloc(ptr, layout) };
        }
        // SAFETY: live, made by `alloc_in` with this layout.
        let n = unsafe { self.charge_of(ptr, layout) };
        self.accounted.uncharge(acc, n);
        // SAFETY: made by `alloc_in` with this layout.
        unsafe { inner.dealloc_in(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let inner = &self.accounted.inner;
        // SAFETY: `ptr` is a live block of ours.
        let heap = unsafe { inner.heap_of(ptr) };
        let acc = owner_of(heap);
        // SAFETY: a live block's owner, kept alive by its bytes.
        let Some(key) = (unsafe { AccountKey::from_ptr(acc) }) else {
            // SAFETY: a block with a header, made by `Accounted`.
            return unsafe { self.accounted.realloc(ptr, layout, new_size) };
        };
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: live, made with `layout`.
        let (old, occupies) =
            unsafe { (self.charge_of(ptr, layout), inner.footprint(ptr, layout)) };
        // In place where the block's footprint under the new layout is what
        // it occupies: the new size's class (from the table, which the first
        // `footprint` checks) is the block's own; or neither layout is in
        // the table (the footprint is the block's usable size) and the new
        // size fits it without wasting half (mimalloc's own rule). Requested
        // sizes move by the change of size.
        // Where the footprint is the layout's alone (jemalloc's class), in
        // place only if the new layout's is the same.
        let new_class = inner.layout_footprint(new_layout);
        let fits = if A::FOOTPRINT_OF_LAYOUT {
            // SAFETY: live; a footprint computed from the layout alone.
            unsafe { inner.footprint(ptr, new_layout) == occupies }
        } else {
            new_class.is_none()
                && inner.layout_footprint(layout).is_none()
                && new_size <= occupies
                && new_size >= occupies / 2
        };
        if new_class == Some(occupies) || fits {
            // SAFETY: live; its footprint under `new_layout` is `occupies`.
            let new = unsafe { self.charge_of(ptr, new_layout) };
            return if self.recharge(key, old, new) {
                ptr
            } else {
                std::ptr::null_mut()
            };
        }
        // Otherwise a new block in the same heap (the same account), so
        // that the footprint is always that of the block's own layout:
        // charged before as far as known, the rest once it is made.
        let charged = old.max(self.charge_before(new_layout));
        if !self.recharge(key, old, charged) {
            return std::ptr::null_mut();
        }
        // SAFETY: the account's heap; a non-zero size.
        let moved = unsafe { inner.alloc_in(heap, new_layout, false) };
        if moved.is_null() {
            self.recharge(key, charged, old);
            // SAFETY: forwarded contract; `key` is the live block's account.
            return unsafe { self.realloc_to_header_block(key, ptr, layout, new_layout) };
        }
        // SAFETY: live, just made with `new_layout`.
        let exact = unsafe { self.charge_of(moved, new_layout) };
        if !self.recharge(key, charged, exact) {
            // SAFETY: just made by `alloc_in` with `new_layout`, never
            // handed out.
            unsafe { inner.dealloc_in(moved, new_layout) };
            self.recharge(key, charged, old);
            return std::ptr::null_mut();
        }
        // SAFETY: both live, distinct, each at least this long; `ptr` is
        // freed with its own layout and not used again.
        unsafe {
            std::ptr::copy_nonoverlapping(ptr, moved, layout.size().min(new_size));
            inner.dealloc_in(ptr, layout);
        }
        moved
    }
}

impl<A, C: Charging> fmt::Debug for HeapPerGroup<A, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeapPerGroup")
            .field("charging", &C::NAME)
            .field("heaps_made", &MADE.load(Relaxed))
            .field("max_heaps", &MAX_HEAPS)
            .finish()
    }
}

// SAFETY: mimalloc 3's heaps are first-class: `mi_heap_malloc` and
// `mi_heap_malloc_aligned` may be called from any thread, a block is freed
// by `mi_free` from any thread, and `mi_heap_of` reads the heap of the page
// a pointer lies in (blocks from `MiMalloc`'s own methods lie in the main
// heap, which `new_heap` never returns). Word-aligned blocks come from
// `mi_heap_malloc`, whose class is `mi_good_size` of the size — the class
// `layout_footprint` reads from its checked table — and are never resized
// in place by `HeapPerGroup` unless the class stays; others are measured
// with `mi_usable_size`. Every method is `#[inline]`: made only in the crate
// that uses `MiMalloc` (see `jemalloc_size_class_out_of_line`).
#[cfg(feature = "mimalloc")]
unsafe impl InnerHeaps for mimalloc::MiMalloc {
    #[inline]
    fn new_heap(&self) -> *mut u8 {
        // SAFETY: no precondition.
        unsafe { libmimalloc_sys::mi_heap_new().cast() }
    }

    #[inline]
    unsafe fn heap_of(&self, block: *const u8) -> *mut u8 {
        extern "C" {
            // mimalloc 3's; not among `libmimalloc-sys`'s declarations.
            fn mi_heap_of(p: *const std::ffi::c_void) -> *mut libmimalloc_sys::mi_heap_t;
        }
        // SAFETY: any pointer; mimalloc reads its page map.
        unsafe { mi_heap_of(block.cast()).cast() }
    }

    #[inline]
    unsafe fn alloc_in(&self, heap: *mut u8, layout: Layout, zeroed: bool) -> *mut u8 {
        use libmimalloc_sys as mi;
        let (heap, size, align) = (heap.cast(), layout.size(), layout.align());
        // An over-aligned block asks for its size rounded up to the
        // alignment, whose class has every block aligned (see
        // `mimalloc_aligned`: 100 bytes at 4,096 took 5,131 bytes, 4,096 do).
        let rounded = super::charging::mimalloc_aligned(layout).size();
        // SAFETY: a heap from `mi_heap_new`.
        unsafe {
            match (align <= std::mem::size_of::<usize>(), zeroed) {
                (true, false) => mi::mi_heap_malloc(heap, size).cast(),
                (true, true) => mi::mi_heap_zalloc(heap, size).cast(),
                (false, false) => mi::mi_heap_malloc_aligned(heap, rounded, align).cast(),
                (false, true) => mi::mi_heap_zalloc_aligned(heap, rounded, align).cast(),
            }
        }
    }

    #[inline]
    fn footprint_estimate(&self, layout: Layout) -> usize {
        if layout.align() <= std::mem::size_of::<usize>() {
            // SAFETY: allocates nothing.
            unsafe { libmimalloc_sys::mi_good_size(layout.size()) }
        } else {
            // `alloc_in` asks for that much at least.
            super::charging::mimalloc_aligned(layout).size()
        }
    }
}

// SAFETY: a heap is a jemalloc arena whose pages lie only in its own
// region of a reservation no other memory shares (`jemalloc_arenas`), so
// `heap_of` of a block of it is that region's start, which `new_heap`
// returned for it, and of any other block of jemalloc's (its own arenas,
// outside the reservation) null, which `new_heap` never returns. Blocks
// are made with `Jemalloc`'s alignment flags, so their class is `nallocx`'s
// for the layout — the footprint `InnerFootprint` computes from the
// layout alone —, and are made and freed through the calling thread's
// explicit cache for their region only (or none), which refills from that
// region's arena only, so a block of one arena never comes back from
// another's allocation. Arenas are never destroyed. Every method is `#[inline]` (made only in the crate
// that uses `Jemalloc`).
#[cfg(feature = "jemalloc")]
unsafe impl InnerHeaps for tikv_jemallocator::Jemalloc {
    const FOOTPRINT_OF_LAYOUT: bool = true;

    #[inline]
    fn new_heap(&self) -> *mut u8 {
        super::jemalloc_arenas::new_arena()
    }

    #[inline]
    unsafe fn heap_of(&self, block: *const u8) -> *mut u8 {
        super::jemalloc_arenas::heap_of(block)
    }

    #[inline]
    unsafe fn alloc_in(&self, heap: *mut u8, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { super::jemalloc_arenas::alloc_in(heap, layout, zeroed) }
    }

    #[inline]
    unsafe fn dealloc_in(&self, block: *mut u8, layout: Layout) {
        // SAFETY: forwarded contract.
        unsafe { super::jemalloc_arenas::dealloc_in(block, layout) }
    }

    #[inline]
    fn footprint_estimate(&self, layout: Layout) -> usize {
        // SAFETY: any block of `layout`; the footprint is the layout's.
        unsafe { self.footprint(std::ptr::null_mut(), layout) }
    }
}
