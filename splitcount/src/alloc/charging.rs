//! What a block charges its group: the size the caller asked for
//! ([`Requested`], the default) or the memory the block really occupies in
//! the inner allocator ([`Footprint`]), and the `GlobalAlloc` of
//! `Accounted<A, Footprint>` (that of `Accounted<A, Requested>` is in
//! `wrapper.rs`).
//!
//! ```text
//!  one glibc chunk, as Accounted<System, _> gets it from malloc
//!  ┌──────────┬──────────────┬──────────────────────┬──────────────┐
//!  │ size (8) │ header (8…)  │ the caller's size    │ rounding     │
//!  └──────────┴──────────────┴──────────────────────┴──────────────┘
//!             ◀───────────── malloc_usable_size ──────────────────▶
//!  Requested                  ◀──────── charged ───▶
//!  Footprint  ◀──────────────────── charged: usable + 8 ──────────▶
//! ```
//!
//! **The mode is a type parameter**, `Accounted<A, C>`, not a field: the
//! default's fast path has no test of the mode (its `alloc` and `dealloc`
//! compile to what they were before the mode existed), and no call can
//! switch the mode while blocks are live.
//!
//! **Same bytes at the free.** A footprint is read from the inner
//! allocator ([`InnerFootprint`]) while the block is live: after `alloc`,
//! just before `dealloc`, and on both sides of a `realloc`, which charges
//! or uncharges the difference. The trait's contract is that the answer
//! does not change while the block is live, so what a block's account holds
//! for it is always its current footprint, and its free gives back exactly
//! that.

#![allow(unsafe_code)]

#[cfg(any(feature = "jemalloc", feature = "mimalloc"))]
use super::size_class;
use super::thread::STATE;
use super::wrapper::{
    extended, front, moved_tag, resized, tag_slot, tagged, word_aligned, Accounted, TAG,
};
use crate::group::AccountKey;
use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt;

mod sealed {
    /// Only this module's modes implement [`super::Charging`].
    pub trait Sealed {}
    impl Sealed for super::Requested {}
    impl Sealed for super::Footprint {}
}

/// What an [`Accounted`] allocator charges for a block (its second type
/// parameter): [`Requested`] or [`Footprint`]. See the module docs of
/// [`crate::alloc`].
pub trait Charging: sealed::Sealed + fmt::Debug + Copy + Send + Sync + 'static {
    /// The mode's name (`"requested"` or `"footprint"`), for messages.
    const NAME: &'static str;
    /// Whether usage counts footprints — headers and the inner allocator's
    /// rounding included — rather than requested sizes.
    const FOOTPRINT: bool;
}

/// Charge the size the caller asked for (`Layout::size`): the default of
/// [`Accounted`]. A group's `usage()` is the sum of its live blocks'
/// requested sizes, plus the stock and reserve slack
/// ([`Accounted::max_slack`]); the wrapper's header and the inner
/// allocator's rounding are not counted (see [`Accounted::reconcile`] for
/// how far they take the process from it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requested;

impl Charging for Requested {
    const NAME: &'static str = "requested";
    const FOOTPRINT: bool = false;
}

/// Charge what a block really occupies: the caller's size, the wrapper's
/// header, and the inner allocator's rounding and per-block overhead, as
/// its [`InnerFootprint`] says. A group's `usage()` is the sum of its live
/// blocks' footprints, plus the stock and reserve slack
/// ([`Accounted::max_slack`]).
///
/// With [`System`] on glibc (`linux-gnu`) a block's footprint is
/// `malloc_usable_size(block) + 8` — its whole chunk, for a block glibc
/// serves from its heap: a 24-byte `Box` asks glibc for 32 bytes with the
/// header and gets a 48-byte chunk (usable 40, plus the chunk's size
/// field), so it charges 48, or more when glibc hands out a larger free
/// chunk whole. For a block glibc maps on its own (from 128 KiB by default)
/// it is the mapping less 8 bytes (and less any alignment padding in
/// front). With `System` elsewhere, and with inner allocators that cannot
/// say, a footprint is the size the wrapper asked for: the caller's size
/// plus the header.
///
/// **Cost.** A `malloc_usable_size` call per allocation and per free (two
/// per `realloc`); the default mode's paths are untouched.
///
/// **Order.** A footprint is known only once the block exists: the block
/// is allocated first and charged after, and freed again if the charge is
/// refused (so an allocation the inner allocator itself cannot make fails
/// without a [`Refusal`](super::Refusal) recorded).
///
/// **`realloc`.** The growth the caller asked for (`new_size − old size`)
/// passes the limits before the block changes, as under [`Requested`];
/// after it, the block is charged or uncharged the rest of the difference
/// between its new and old footprints. That rest — the new block's rounding
/// beyond the old one's — is charged without a check (the block is there):
/// a limit may be passed by that much, under glibc less than 64 bytes for a
/// block in its heap and less than a page plus 16 bytes for one it maps on
/// its own.
///
/// ```no_run
/// use splitcount::alloc::{Accounted, Footprint};
/// use std::alloc::System;
///
/// #[global_allocator]
/// static ALLOC: Accounted<System, Footprint> = Accounted::with_charging(System, Footprint);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint;

impl Charging for Footprint {
    const NAME: &'static str = "footprint";
    const FOOTPRINT: bool = true;
}

/// What an inner allocator tells [`Accounted<A, Footprint>`](Footprint)
/// about the memory a block really occupies.
///
/// Implemented for [`System`]: on glibc, `malloc_usable_size` + 8 (the
/// chunk's size field); elsewhere the default. With the `jemalloc` feature,
/// for `tikv_jemallocator::Jemalloc`: jemalloc's usable size (the block's
/// size class, which jemalloc derives from the size and alignment alone,
/// computed here from the layout without looking the block up; jemalloc
/// keeps its metadata per slab, not per block). With
/// the `mimalloc` feature, for `mimalloc::MiMalloc`: `mi_usable_size` (the
/// size class; no per-block header either), computed from the layout for
/// the blocks the wrapper makes with `mi_malloc` (word-aligned ones, see
/// [`InnerFootprint::alloc_for_footprint`]). In every case the block is the
/// wrapper's whole allocation, its header included. Another allocator
/// implements it with its own figure, or with no body to get the default:
/// the size the wrapper asked for (the caller's size plus the header),
/// without the allocator's rounding.
///
/// ```
/// # #[cfg(feature = "jemalloc")] {
/// use splitcount::alloc::{Accounted, Footprint};
/// use tikv_jemallocator::Jemalloc;
///
/// #[global_allocator]
/// static ALLOC: Accounted<Jemalloc, Footprint> = Accounted::with_charging(Jemalloc, Footprint);
/// # }
/// ```
///
/// # Safety
///
/// For a block this allocator returned (from `alloc`, `alloc_zeroed` or
/// `realloc`, or the `*_for_footprint` methods below, which the wrapper
/// uses in their place), [`InnerFootprint::footprint`] must return the same value
/// from then until the block is freed or reallocated, and at least the
/// `layout.size()` it was asked for: the wrapper uncharges at the free what
/// it reads then, and a group's account lives as long as bytes are charged
/// through it. [`InnerFootprint::layout_footprint`], where it answers, must
/// give the same number as `footprint` for every block of that layout (the
/// wrapper uses either, at the allocation and at the free). A block made by
/// [`InnerFootprint::alloc_for_footprint`],
/// [`InnerFootprint::alloc_zeroed_for_footprint`] or
/// [`InnerFootprint::realloc_for_footprint`] must be one that
/// [`GlobalAlloc::dealloc`] frees and `realloc_for_footprint` resizes, with
/// the layout it was made for; `realloc_for_footprint` must leave the block
/// as it was when it returns null.
pub unsafe trait InnerFootprint: GlobalAlloc {
    /// The bytes `block`, allocated with `layout`, occupies. The default:
    /// `layout.size()`.
    ///
    /// # Safety
    ///
    /// `block` is live and was returned by this allocator for `layout`.
    #[inline]
    unsafe fn footprint(&self, block: *mut u8, layout: Layout) -> usize {
        let _ = block;
        layout.size()
    }

    /// The footprint of every block this allocator returns for `layout`,
    /// when it can tell it from the layout alone — jemalloc's size class —
    /// and cheaply; `None` (the default) sends the wrapper to
    /// [`InnerFootprint::footprint`]. With an answer, `dealloc` needs no
    /// call before the free: no register is saved on its fast path.
    ///
    /// A `Some(n)` must equal `footprint(block, layout)` for every block
    /// this allocator returns for `layout`. Keep it to a few instructions
    /// without calls: answer `None` where it would take more. Set
    /// [`InnerFootprint::FOOTPRINT_FROM_LAYOUT`] with it, or it is not
    /// asked.
    #[inline]
    fn layout_footprint(&self, layout: Layout) -> Option<usize> {
        let _ = layout;
        None
    }

    /// Whether [`InnerFootprint::layout_footprint`] can answer: `false`
    /// (the default) and the free reads the footprint with `footprint`
    /// inline; `true` and it asks `layout_footprint` first and leaves
    /// `footprint` to a function of its own (one more jump when it answers
    /// `None`).
    const FOOTPRINT_FROM_LAYOUT: bool = false;

    /// Allocate the wrapper's block for `layout` (its header included).
    /// The default: [`GlobalAlloc::alloc`].
    ///
    /// An allocator whose `alloc` may serve one layout from different
    /// size classes can allocate here through an entry point whose class
    /// is a function of the layout, so that
    /// [`InnerFootprint::layout_footprint`] can answer: `MiMalloc`'s
    /// `alloc` is `mi_malloc_aligned`, which sometimes takes a larger class,
    /// and its implementation here calls `mi_malloc` for alignments up to 8.
    /// Blocks made here are freed with [`GlobalAlloc::dealloc`] and resized
    /// with [`InnerFootprint::realloc_for_footprint`].
    ///
    /// # Safety
    ///
    /// As [`GlobalAlloc::alloc`].
    #[inline(always)]
    unsafe fn alloc_for_footprint(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc(layout) }
    }

    /// [`InnerFootprint::alloc_for_footprint`], zeroed. The default:
    /// [`GlobalAlloc::alloc_zeroed`].
    ///
    /// # Safety
    ///
    /// As [`GlobalAlloc::alloc_zeroed`].
    #[inline(always)]
    unsafe fn alloc_zeroed_for_footprint(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_zeroed(layout) }
    }

    /// Resize a block made by [`InnerFootprint::alloc_for_footprint`] (or
    /// by this method). The default: [`GlobalAlloc::realloc`]. An
    /// allocator that answers [`InnerFootprint::layout_footprint`] must
    /// return a block whose footprint is the new layout's answer: one that
    /// shrinks a block in place, keeping its class, must move it instead
    /// where the class of the new size differs.
    ///
    /// # Safety
    ///
    /// As [`GlobalAlloc::realloc`], for a block made by this allocator's
    /// `alloc_for_footprint`, `alloc_zeroed_for_footprint` or
    /// `realloc_for_footprint` with `layout`.
    #[inline(always)]
    unsafe fn realloc_for_footprint(
        &self,
        block: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.realloc(block, layout, new_size) }
    }
}

/// `block`'s footprint: the allocator's answer from the layout where it
/// has one, else from the block.
///
/// # Safety
/// `block` is live and was returned by `inner` for `layout`.
#[inline(always)]
unsafe fn footprint_of<A: InnerFootprint>(inner: &A, block: *mut u8, layout: Layout) -> usize {
    match A::FOOTPRINT_FROM_LAYOUT.then(|| inner.layout_footprint(layout)) {
        Some(Some(n)) => n,
        // SAFETY: forwarded contract.
        _ => unsafe { inner.footprint(block, layout) },
    }
}

/// glibc's per-chunk overhead outside `malloc_usable_size`: the chunk's
/// size field (`SIZE_SZ`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const GLIBC_SIZE_FIELD: usize = std::mem::size_of::<usize>();

// SAFETY: on glibc, `System` allocates with malloc, calloc,
// posix_memalign and realloc, and a live chunk's usable size changes only
// through realloc and free; it is at least the size asked for. Elsewhere
// the default, `layout.size()`, a function of the block's layout.
unsafe impl InnerFootprint for System {
    #[inline]
    unsafe fn footprint(&self, block: *mut u8, layout: Layout) -> usize {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let _ = layout;
            // SAFETY: `block` is live and came from glibc's malloc family.
            unsafe { libc::malloc_usable_size(block.cast()) + GLIBC_SIZE_FIELD }
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        {
            let _ = block;
            layout.size()
        }
    }
}

// SAFETY: the footprint is a function of the layout alone (its size class
// as `nallocx` computes it, or the table that agreed with `nallocx`), so
// the free of a block (with the layout of its allocation or last realloc)
// reads what its allocation charged; a class is at least the size.
#[cfg(feature = "jemalloc")]
unsafe impl InnerFootprint for tikv_jemallocator::Jemalloc {
    // The rare path (the table not yet checked, large or over-aligned
    // blocks), a call to jemalloc anyway: out of line, in the crate that
    // uses it (see `jemalloc_size_class_out_of_line`).
    #[inline]
    unsafe fn footprint(&self, block: *mut u8, layout: Layout) -> usize {
        let _ = block;
        jemalloc_size_class_out_of_line(self, layout)
    }

    const FOOTPRINT_FROM_LAYOUT: bool = true;

    #[inline(always)]
    fn layout_footprint(&self, layout: Layout) -> Option<usize> {
        if in_jemalloc_table(layout) {
            JEMALLOC_CLASSES.class(layout.size())
        } else {
            None
        }
    }
}

// SAFETY: `mi_usable_size` of a live block is its size class, fixed until
// it is freed or reallocated, at least the size asked for. The layout's
// answer is used only for blocks of at most `INLINE_MAX` bytes and
// alignment at most 8, which `alloc_for_footprint` and
// `alloc_zeroed_for_footprint` make with `mi_malloc`/`mi_zalloc`, whose
// class is `mi_good_size` of the size (the table, once checked against
// it), and which `realloc_for_footprint` leaves with exactly that class:
// in place only where the block's class is already the new size's.
#[cfg(feature = "mimalloc")]
unsafe impl InnerFootprint for mimalloc::MiMalloc {
    #[inline]
    unsafe fn footprint(&self, block: *mut u8, layout: Layout) -> usize {
        if in_mimalloc_table(layout) && mimalloc_table_holds() {
            return size_class::class(layout.size());
        }
        // SAFETY: `block` is live and came from mimalloc.
        unsafe { self.usable_size(block) }
    }

    const FOOTPRINT_FROM_LAYOUT: bool = true;

    #[inline(always)]
    fn layout_footprint(&self, layout: Layout) -> Option<usize> {
        if in_mimalloc_table(layout) {
            MIMALLOC_CLASSES.class(layout.size())
        } else {
            None
        }
    }

    #[inline(always)]
    unsafe fn alloc_for_footprint(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIMALLOC_MIN_ALIGN {
            // SAFETY: any size; the block is at least 8-aligned.
            unsafe { libmimalloc_sys::mi_malloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded contract.
            unsafe { self.alloc(mimalloc_aligned(layout)) }
        }
    }

    #[inline(always)]
    unsafe fn alloc_zeroed_for_footprint(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= MIMALLOC_MIN_ALIGN {
            // SAFETY: as above.
            unsafe { libmimalloc_sys::mi_zalloc(layout.size()).cast() }
        } else {
            // SAFETY: forwarded contract.
            unsafe { self.alloc_zeroed(mimalloc_aligned(layout)) }
        }
    }

    // `#[inline]`, as every method here: made only in the crate that uses
    // `MiMalloc`, so that no library built with the feature on and not
    // using it links a copy of mimalloc (see `jemalloc_size_class_out_of_line`).
    #[inline]
    unsafe fn realloc_for_footprint(
        &self,
        block: *mut u8,
        layout: Layout,
        new_size: usize,
    ) -> *mut u8 {
        if layout.align() > MIMALLOC_MIN_ALIGN {
            // SAFETY: forwarded contract (an over-aligned block, made by
            // `alloc`; its footprint is read from the block).
            return unsafe { self.realloc(block, layout, new_size) };
        }
        // Footprints read from the block — a new size past the table, or a
        // build whose classes differ from the table's (a padded one) —
        // take mimalloc's realloc, in place where it can be (`mi_realloc`
        // keeps alignment 8). The check runs here if no block of the
        // table's sizes has run it yet, so that a block shrunk in place is
        // never charged the table's class later.
        let new = Layout::from_size_align(new_size, layout.align());
        if !new.is_ok_and(in_mimalloc_table) || !mimalloc_table_holds() {
            // SAFETY: a live block of mimalloc's.
            return unsafe { libmimalloc_sys::mi_realloc(block.cast(), new_size).cast() };
        }
        // The new block's class must be the new size's (the table's, which
        // holds): `mi_realloc` would keep a block shrunk by up to half in
        // its larger class.
        // SAFETY: a live block of mimalloc's.
        unsafe {
            if libmimalloc_sys::mi_usable_size(block.cast()) == size_class::class(new_size) {
                return block;
            }
            let moved: *mut u8 = libmimalloc_sys::mi_malloc(new_size).cast();
            if !moved.is_null() {
                std::ptr::copy_nonoverlapping(block, moved, layout.size().min(new_size));
                libmimalloc_sys::mi_free(block.cast());
            }
            moved
        }
    }
}

/// The alignment of every block of mimalloc's (a machine word).
#[cfg(feature = "mimalloc")]
const MIMALLOC_MIN_ALIGN: usize = std::mem::size_of::<usize>();

/// The inline size classes: checked once against mimalloc's `mi_good_size`.
#[cfg(feature = "mimalloc")]
static MIMALLOC_CLASSES: size_class::Checked = size_class::Checked::new();

/// Whether the inline classes agree with `mi_good_size` (checked at the
/// first call).
#[cfg(feature = "mimalloc")]
#[inline(always)]
fn mimalloc_table_holds() -> bool {
    // SAFETY: `mi_good_size` allocates nothing.
    MIMALLOC_CLASSES.holds(|s| unsafe { libmimalloc_sys::mi_good_size(s) } == size_class::class(s))
}

/// An over-aligned block's layout as asked of mimalloc: the size rounded up
/// to the alignment. `mi_malloc_aligned` serves a size whose class is a
/// multiple of the alignment from that class, every block of which is
/// aligned; another size, when the first free block of its class is not
/// aligned, takes `size + align − 1` from a larger class — a 64-aligned
/// block of 72 bytes (a cache line and `Accounted`'s trailing tag) took 160
/// bytes, where 128 do.
#[cfg(feature = "mimalloc")]
#[inline(always)]
pub(super) fn mimalloc_aligned(layout: Layout) -> Layout {
    // A layout's size rounded up to its alignment is at most `isize::MAX`
    // (the `Layout` invariant): the rounding cannot overflow.
    let size = layout.size().next_multiple_of(layout.align());
    // SAFETY: a power-of-two alignment; the size, a multiple of it, is at
    // most `isize::MAX` (above).
    unsafe { Layout::from_size_align_unchecked(size, layout.align()) }
}

/// Whether the inline table serves `layout` for mimalloc (once checked): a
/// small block that `alloc_for_footprint` makes with `mi_malloc`.
#[cfg(feature = "mimalloc")]
#[inline(always)]
fn in_mimalloc_table(layout: Layout) -> bool {
    layout.align() <= MIMALLOC_MIN_ALIGN && layout.size() <= size_class::INLINE_MAX
}

// SAFETY: as for `Accounted<A, Requested>` (wrapper.rs): every method
// forwards to `inner` with the caller's layout extended by the tag, and
// returns `block + front(align)`. What a block charges is its footprint,
// read while it is live — after `alloc`, before `dealloc`, on both sides of
// a `realloc` — so the bytes uncharged at its free are those charged for
// it (the `InnerFootprint` contract). `alloc` and `dealloc` are never
// inlined into their callers, for the reason given in wrapper.rs.
unsafe impl<A: InnerFootprint> GlobalAlloc for Accounted<A, Footprint> {
    #[inline(never)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(word) = word_aligned(layout) {
            // SAFETY: forwarded contract (the same block as for `layout`).
            return unsafe { self.alloc_footprint(word, |l| self.inner.alloc_for_footprint(l)) };
        }
        // SAFETY: forwarded contract.
        unsafe { self.alloc_footprint_over_aligned(layout) }
    }

    #[inline(never)]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if let Some(word) = word_aligned(layout) {
            // SAFETY: forwarded contract (the same block as for `layout`).
            return unsafe {
                self.alloc_footprint(word, |l| self.inner.alloc_zeroed_for_footprint(l))
            };
        }
        // SAFETY: forwarded contract.
        unsafe { self.alloc_footprint(layout, |l| self.inner.alloc_zeroed_for_footprint(l)) }
    }

    #[inline(never)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match word_aligned(layout) {
            // SAFETY (both): forwarded contract; `alloc` made the block
            // with the same choice of layout.
            Some(word) => unsafe { self.dealloc_footprint(ptr, word) },
            None => unsafe { self.dealloc_footprint(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        // The new layout must be valid before anything is charged.
        let Some(new_ext) = resized(layout, new_size) else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`.
        let acc = unsafe { *tag_slot(ptr, align, layout.size()) };
        let block = ptr.wrapping_sub(front(align));
        // SAFETY: as in `dealloc`.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // SAFETY: a header holds null or the account its block was charged
        // to, which the block's bytes keep alive.
        let Some(key) = (unsafe { AccountKey::from_ptr(acc) }) else {
            // Unaccounted, and stays so.
            // SAFETY: the block was allocated by `inner` with `ext`.
            let base = unsafe { self.inner.realloc_for_footprint(block, ext, new_ext.size()) };
            // SAFETY: `base` is null or a block made for the new size.
            return if base.is_null() {
                base
            } else {
                unsafe { moved_tag(base, align, new_size, acc) }
            };
        };
        // SAFETY: live, from `inner` with `ext`.
        let held = unsafe { footprint_of(&self.inner, block, ext) } as u64;
        // The growth asked for passes the limits before the block changes.
        let grow = (new_size as u64).saturating_sub(layout.size() as u64);
        if grow > 0 && !self.charge_growth(key, grow) {
            return std::ptr::null_mut();
        }
        // SAFETY: the block was allocated by `inner` with `ext`; a header
        // is copied along with the contents (a trailer is written again).
        let base = unsafe { self.inner.realloc_for_footprint(block, ext, new_ext.size()) };
        if base.is_null() {
            self.uncharge(acc, grow);
            return std::ptr::null_mut();
        }
        // SAFETY: `base` is live, from `inner` with `new_ext`.
        let now = unsafe { footprint_of(&self.inner, base, new_ext) } as u64;
        let charged = held + grow;
        if now > charged {
            self.charge_unrefused(key, now - charged);
            self.after_unrefused(key);
        } else if now < charged {
            self.uncharge(acc, charged - now);
        }
        // SAFETY: `base` is a block made for the new size.
        unsafe { moved_tag(base, align, new_size, acc) }
    }
}

impl<A: InnerFootprint> Accounted<A, Footprint> {
    /// `alloc` of a layout that is not [`word_aligned`], in a function of
    /// its own: inline, its registers would be saved on every `alloc`.
    ///
    /// # Safety
    /// As `GlobalAlloc::alloc`.
    #[inline(never)]
    unsafe fn alloc_footprint_over_aligned(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_footprint(layout, |l| self.inner.alloc_for_footprint(l)) }
    }

    /// `dealloc`'s body, for `layout` or its [`word_aligned`] form.
    ///
    /// # Safety
    /// As `GlobalAlloc::dealloc`.
    #[inline(always)]
    unsafe fn dealloc_footprint(&self, ptr: *mut u8, layout: Layout) {
        let h = TAG;
        // SAFETY: `ptr` came from `alloc` with this layout: the tag is
        // there and the block starts `front` bytes earlier.
        let acc = unsafe { *tag_slot(ptr, layout.align(), layout.size()) };
        let block = ptr.wrapping_sub(front(layout.align()));
        // SAFETY: `layout` is the one the block was allocated with, for
        // which `extended` succeeded then.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // Measured before the free: the bytes its allocation (or last
        // realloc) charged. An unaccounted block (null) charged nothing.
        let n = if acc.is_null() {
            0
        } else if A::FOOTPRINT_FROM_LAYOUT {
            match self.inner.layout_footprint(ext) {
                Some(n) => n as u64,
                // Measured from the block in a function of its own, reached
                // by a tail call: the call it makes does not give this one
                // a frame.
                // SAFETY: as below.
                None => return unsafe { self.dealloc_measured(acc, block, ext, h) },
            }
        } else {
            // SAFETY: live, from `inner` with `ext`.
            unsafe { self.inner.footprint(block, ext) as u64 }
        };
        // SAFETY: the block was allocated by `inner` with `ext`.
        unsafe { self.uncharge_and_free(acc, n, block, ext, h) }
    }

    /// The rest of `dealloc` for a block whose footprint the allocator
    /// reads from the block: read it, uncharge it, free the block.
    ///
    /// # Safety
    /// `block` is live, from `inner` with `ext`, its header holds `acc`
    /// (not null) and is `h` bytes; it is not used again.
    #[inline(never)]
    unsafe fn dealloc_measured(&self, acc: *const u8, block: *mut u8, ext: Layout, h: usize) {
        // SAFETY: live, from `inner` with `ext`.
        let n = unsafe { self.inner.footprint(block, ext) } as u64;
        // SAFETY: forwarded contract.
        unsafe { self.uncharge_and_free(acc, n, block, ext, h) }
    }

    /// Allocate with `inner`, then charge the block's footprint; free it
    /// again if the charge is refused.
    ///
    /// # Safety
    /// `layout` has a non-zero size (the `GlobalAlloc::alloc` contract).
    #[inline(always)]
    unsafe fn alloc_footprint(
        &self,
        layout: Layout,
        inner: impl FnOnce(Layout) -> *mut u8,
    ) -> *mut u8 {
        let Some(ext) = extended(layout) else {
            return std::ptr::null_mut();
        };
        let block = inner(ext);
        if block.is_null() {
            return block;
        }
        // SAFETY: live, from `inner` with `ext`.
        let n = unsafe { footprint_of(&self.inner, block, ext) } as u64;
        let acc = self.take_reserved(n);
        if acc.is_null() {
            // SAFETY: forwarded.
            return unsafe { self.alloc_footprint_missed(block, n, layout, ext) };
        }
        // SAFETY: forwarded; `acc` holds the block's bytes.
        unsafe { with_header(acc, block, layout) }
    }

    /// [`Accounted::alloc_footprint`] when the reserve missed: the
    /// charge's slow path for the block's `n` bytes; the block freed
    /// again if it is refused.
    ///
    /// # Safety
    /// `block` is new, from `inner` with `ext = extended(layout)`.
    #[cold]
    #[inline(never)]
    unsafe fn alloc_footprint_missed(
        &self,
        block: *mut u8,
        n: u64,
        layout: Layout,
        ext: Layout,
    ) -> *mut u8 {
        let Ok(acc) = self.charge_miss(n) else {
            // SAFETY: from `inner` with `ext`, never handed out.
            unsafe { self.inner.dealloc(block, ext) };
            return std::ptr::null_mut();
        };
        let acc = acc.map_or(std::ptr::null(), AccountKey::as_ptr);
        // SAFETY: forwarded; `acc` holds the block's bytes or is null.
        unsafe { with_header(acc, block, layout) }
    }
}

/// Write `acc` in the tag of `block` (made for `extended(layout)`), count
/// the tag; the user pointer.
///
/// # Safety
/// `block` is live, made for `extended(layout)`.
#[inline(always)]
unsafe fn with_header(acc: *const u8, block: *mut u8, layout: Layout) -> *mut u8 {
    STATE.with(|t| t.headers.set(t.headers.get() + TAG as i64));
    // SAFETY: forwarded contract.
    unsafe { tagged(block, layout, acc) }
}

/// `Jemalloc`'s flags for `layout` (as `tikv_jemallocator` computes them):
/// none when `malloc`'s alignment serves it, else the alignment.
#[cfg(feature = "jemalloc")]
#[inline(always)]
pub(super) fn jemalloc_flags(layout: Layout) -> std::os::raw::c_int {
    /// `_Alignof(max_align_t)` on the 64-bit targets jemalloc builds for.
    const MAX_ALIGN_T: usize = 16;
    if layout.align() <= MAX_ALIGN_T && layout.align() <= layout.size() {
        0
    } else {
        tikv_jemalloc_sys::MALLOCX_ALIGN(layout.align())
    }
}

/// The inline size classes: checked once against jemalloc's.
#[cfg(feature = "jemalloc")]
static JEMALLOC_CLASSES: size_class::Checked = size_class::Checked::new();

/// The usable size of the block `Jemalloc` allocates for `layout`: its size
/// class, a function of the size and flags alone — inline for a small
/// block without alignment flags once the scheme agreed with jemalloc,
/// else jemalloc's `nallocx` (the computation `mallocx` makes).
#[cfg(feature = "jemalloc")]
#[inline(always)]
fn jemalloc_size_class(layout: Layout) -> usize {
    // SAFETY (both calls): `nallocx` allocates nothing and takes any size
    // but 0 (the checked sizes start at 1; a layout the wrapper extended
    // by its header is never empty).
    let nallocx = |size, flags| unsafe { tikv_jemalloc_sys::nallocx(size, flags) };
    if in_jemalloc_table(layout)
        && JEMALLOC_CLASSES.holds(|s| nallocx(s, 0) == size_class::class(s))
    {
        size_class::class(layout.size())
    } else {
        nallocx(layout.size(), jemalloc_flags(layout))
    }
}

/// Whether the inline table serves `layout` (once it is checked): a small
/// block without alignment flags.
/// [`jemalloc_size_class`] out of line. Generic only so that it is made in
/// the crate that uses it, as `footprint` (`#[inline]`) is: nothing in
/// this crate's own object code then calls jemalloc, and a library built
/// with the feature on that never uses `Jemalloc` — the C ABI library and
/// the preload, built in one workspace with the lab, which turns the
/// feature on — links no copy of jemalloc (whose constructor would run,
/// and whose initial-exec TLS would keep the library from being loaded
/// with `dlopen`).
#[cfg(feature = "jemalloc")]
#[inline(never)]
fn jemalloc_size_class_out_of_line<A>(_inner: &A, layout: Layout) -> usize {
    jemalloc_size_class(layout)
}

#[cfg(feature = "jemalloc")]
#[inline(always)]
fn in_jemalloc_table(layout: Layout) -> bool {
    jemalloc_flags(layout) == 0 && layout.size() <= size_class::INLINE_MAX
}
