//! [`Accounted`]: the `GlobalAlloc` wrapper.

#![allow(unsafe_code)]

use super::reserve::{RESERVE, RESERVE_BATCH};
use super::scope::{current, in_hook, without_accounting};
use crate::charge::{
    ByteAccount, Consumed, Refusal, RefusalHook, Stock, UsageCounter, MAX_STOCK_SLOTS,
};
use crate::cpu::{self, Machine};
use crate::group::Hierarchy;
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{
    AtomicPtr,
    Ordering::{AcqRel, Acquire},
};

/// Bytes a stock miss charges at once to a group's usage counter.
pub const BYTE_BATCH: u64 = 64 << 10;

/// Bytes in front of every allocation: the charged group's account (a
/// pointer). Alignments above 8 take a header of their own size, so that
/// the user pointer stays aligned.
const MIN_HEADER: usize = std::mem::size_of::<*const ByteAccount>();

thread_local! {
    static LAST_REFUSAL: Cell<Option<Refusal>> = const { Cell::new(None) };
}

/// The last allocation refused on this thread, if any (cleared by reading).
pub fn take_last_refusal() -> Option<Refusal> {
    LAST_REFUSAL.with(|r| r.take())
}

/// What `attach` sets up: the byte stock and the root account.
struct Attached {
    stock: Stock,
    root: &'static ByteAccount,
    machine: Machine,
    hook: Option<RefusalHook>,
}

/// Why `attach` failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachError {
    /// This allocator is attached to a hierarchy already.
    AlreadyAttached,
    /// The byte stock could not be built for the hierarchy's machine.
    Stock(crate::charge::StockError),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::AlreadyAttached => {
                f.write_str("this allocator is attached to a hierarchy already")
            }
            AttachError::Stock(e) => write!(f, "cannot build the allocator's byte stock: {e}"),
        }
    }
}

impl std::error::Error for AttachError {}

/// A `GlobalAlloc` that charges every allocation's size to the current
/// thread's group. See the module docs of [`crate::alloc`].
pub struct Accounted<A> {
    inner: A,
    state: AtomicPtr<Attached>,
}

impl<A> Accounted<A> {
    /// Wrap `inner`. Until [`Accounted::attach`], allocations pass through
    /// unaccounted (they still carry the header, so they can be freed after).
    pub const fn new(inner: A) -> Accounted<A> {
        Accounted {
            inner,
            state: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Start accounting into `hierarchy` (threads outside any scope charge
    /// its root). `hook` runs when an allocation is refused (after the
    /// charged group's own hook, see `Group::on_alloc_refusal`). Once per
    /// allocator.
    pub fn attach(
        &self,
        hierarchy: &Hierarchy,
        hook: Option<RefusalHook>,
    ) -> Result<(), AttachError> {
        if !self.state.load(Acquire).is_null() {
            return Err(AttachError::AlreadyAttached);
        }
        // Everything the charge path touches that initializes lazily (and
        // could allocate) is initialized here, outside the allocator.
        let machine = hierarchy.config().machine.clone();
        let _ = (
            cpu::cpu_id_source(),
            cpu::current_cpu(),
            machine.current_cpu(),
        );
        let stock =
            Stock::new(machine.cpus(), MAX_STOCK_SLOTS, BYTE_BATCH).map_err(AttachError::Stock)?;
        let attached = Box::into_raw(Box::new(Attached {
            stock,
            root: hierarchy.root().byte_account(),
            machine,
            hook,
        }));
        // AcqRel: publishes the initialized state to every allocating thread.
        match self
            .state
            .compare_exchange(std::ptr::null_mut(), attached, AcqRel, Acquire)
        {
            Ok(_) => Ok(()),
            Err(_) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(attached) });
                Err(AttachError::AlreadyAttached)
            }
        }
    }

    fn attached(&self) -> Option<&Attached> {
        // SAFETY: once published, the state is never freed or changed.
        unsafe { self.state.load(Acquire).as_ref() }
    }

    /// Return the calling thread's reserve and every byte held in the
    /// allocator's per-CPU stocks to the groups' usage counters. Other
    /// threads' reserves (at most `2 · RESERVE_BATCH` bytes each) are
    /// returned when those threads exit or call `drain`; once they have,
    /// usage equals live bytes.
    pub fn drain(&self) -> u64 {
        let Some(st) = self.attached() else { return 0 };
        let (acc, bytes) = RESERVE
            .try_with(|r| r.take_all())
            .unwrap_or((std::ptr::null(), 0));
        if !acc.is_null() && bytes > 0 {
            // SAFETY: accounts are leaked: valid forever.
            unsafe { &*acc }.counter.uncharge(bytes);
        }
        bytes + st.stock.drain_all(&|_| true)
    }

    /// Charge `n` bytes to the current account; the account charged (null:
    /// nothing was, before `attach` or inside a hook), or `Err` if refused.
    /// Never allocates.
    #[inline]
    fn charge(&self, n: u64) -> Result<*const ByteAccount, ()> {
        let Some(st) = self.attached() else {
            return Ok(std::ptr::null());
        };
        if in_hook() {
            return Ok(std::ptr::null());
        }
        let acc: *const ByteAccount = match current() {
            p if p.is_null() => st.root,
            p => p,
        };
        self.charge_account(st, acc, n, true).map(|_| acc)
    }

    /// Charge `n` bytes to `acc` (not null): from the thread's reserve, else
    /// with a refill of it, else exactly. `hooks`: on refusal, record it and
    /// run the refusal hooks (false inside a hook, which must not recurse).
    #[inline]
    fn charge_account(
        &self,
        st: &Attached,
        acc: *const ByteAccount,
        n: u64,
        hooks: bool,
    ) -> Result<(), ()> {
        if RESERVE.try_with(|r| r.take(acc, n)) == Ok(true) {
            return Ok(());
        }
        // SAFETY: accounts are leaked: valid forever.
        let account = unsafe { &*acc };
        // Charge this allocation and a refill of the thread's reserve at
        // once; if that does not fit, just this allocation.
        if self
            .charge_shared(st, account, n + RESERVE_BATCH, false)
            .is_ok()
        {
            match RESERVE.try_with(|r| r.refill(acc, RESERVE_BATCH)) {
                Ok((old, bytes)) => self.uncharge_shared(st, old, bytes),
                Err(_) => self.uncharge_shared(st, acc, RESERVE_BATCH),
            }
            return Ok(());
        }
        self.charge_shared(st, account, n, hooks)
    }

    /// Charge `n` bytes through the per-CPU stock and the usage counters,
    /// draining the refusing group's stocked bytes and calling the hook
    /// before giving up (`report`: record the refusal and run the hook).
    fn charge_shared(
        &self,
        st: &Attached,
        acc: &ByteAccount,
        n: u64,
        report: bool,
    ) -> Result<(), ()> {
        let counter = &acc.counter;
        let cpu = st.machine.current_cpu();
        if st.stock.consume(cpu, counter, n) == Consumed::Hit {
            return Ok(());
        }
        let batch = st.stock.batch();
        if n < batch && counter.try_charge_quiet(batch).is_ok() {
            let _ = st.stock.stash(cpu, counter, batch - n).uncharge();
            return Ok(());
        }
        for attempt in 0..2 {
            let refuser = match counter.try_charge_quiet(n) {
                Ok(_) => return Ok(()),
                Err(r) => r,
            };
            // Stocked bytes of the refuser's subtree may be exactly what
            // its limit needs.
            st.stock.drain_all(&|c: &UsageCounter| c.is_within(refuser));
            if counter.try_charge_quiet(n).is_ok() {
                return Ok(());
            }
            if !report || attempt == 1 {
                break;
            }
            refuser.record_max();
            let refusal = Refusal {
                request: n,
                limit: refuser.max(),
                usage: refuser.usage(),
            };
            LAST_REFUSAL.with(|r| r.set(Some(refusal)));
            // The charged group's own hook first, then the allocator's. A
            // hook that panics has declined: the unwind stops here (it must
            // never leave `GlobalAlloc::alloc`), the panic hook has already
            // reported it, and the flag is restored by its guard.
            let own = acc.hook();
            let freed = [own, st.hook].into_iter().flatten().any(|hook| {
                without_accounting(|| std::panic::catch_unwind(|| hook(&refusal)).unwrap_or(false))
            });
            if !freed {
                break;
            }
        }
        Err(())
    }

    #[inline]
    fn uncharge(&self, acc: *const ByteAccount, n: u64) {
        if acc.is_null() {
            return;
        }
        let Some(st) = self.attached() else {
            // SAFETY: a non-null header account is leaked: valid forever.
            unsafe { &*acc }.counter.uncharge(n);
            return;
        };
        match RESERVE.try_with(|r| r.give(acc, n)) {
            Ok(Some(0)) => {}
            Ok(Some(excess)) => self.uncharge_shared(st, acc, excess),
            _ => self.uncharge_shared(st, acc, n),
        }
    }

    /// Return bytes through the per-CPU stock.
    fn uncharge_shared(&self, st: &Attached, acc: *const ByteAccount, n: u64) {
        if acc.is_null() || n == 0 {
            return;
        }
        // SAFETY: accounts are leaked: valid forever.
        let acc = unsafe { &*acc };
        let cpu = st.machine.current_cpu();
        let _ = st.stock.stash(cpu, &acc.counter, n).uncharge();
    }
}

/// The header size for an alignment: 8 bytes, or the alignment when larger
/// (a multiple of it either way).
#[inline]
fn header(align: usize) -> usize {
    align.max(MIN_HEADER)
}

/// The layout actually requested from the inner allocator.
#[inline]
fn extended(layout: Layout) -> Option<Layout> {
    let size = layout.size().checked_add(header(layout.align()))?;
    Layout::from_size_align(size, layout.align().max(MIN_HEADER)).ok()
}

/// # Safety
/// `user` must be a pointer returned by `Accounted::alloc` (a header lies
/// before it).
#[inline]
unsafe fn header_slot(user: *mut u8) -> *mut *const ByteAccount {
    // SAFETY: the header's last 8 bytes are just before the user pointer.
    unsafe { (user as *mut *const ByteAccount).sub(1) }
}

// SAFETY: every method forwards to `inner` with a layout that keeps the
// caller's alignment and adds a header; the pointer returned is `base +
// header(align)`, which is aligned to `align` and lies inside the block.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Accounted<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, |l| self.inner.alloc(l)) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded contract.
        unsafe { self.alloc_with(layout, |l| self.inner.alloc_zeroed(l)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let h = header(layout.align());
        // SAFETY: `ptr` came from `alloc` with this layout: the header is
        // there and the block starts `h` bytes earlier.
        let acc = unsafe { *header_slot(ptr) };
        // SAFETY: `layout` is the one the block was allocated with (the
        // `GlobalAlloc` contract), for which `extended` succeeded then.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // SAFETY: the block was allocated by `inner` with `ext`.
        unsafe { self.inner.dealloc(ptr.sub(h), ext) };
        self.uncharge(acc, layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let h = header(layout.align());
        // The new block's layout must be valid (size + header, rounded up to
        // the alignment, at most `isize::MAX`) before anything is charged.
        let Some(new_ext) = new_size
            .checked_add(h)
            .and_then(|total| Layout::from_size_align(total, layout.align().max(MIN_HEADER)).ok())
        else {
            return std::ptr::null_mut();
        };
        // SAFETY: as in `dealloc`.
        let acc = unsafe { *header_slot(ptr) };
        let (old, new) = (layout.size() as u64, new_size as u64);
        if new > old && !acc.is_null() {
            // Grow within the block's own account: its header names it, and
            // its free will uncharge the new size. Inside a refusal hook the
            // growth is still charged (and may be refused), only without
            // running hooks again.
            let Some(st) = self.attached() else {
                return std::ptr::null_mut();
            };
            if self.charge_account(st, acc, new - old, !in_hook()).is_err() {
                return std::ptr::null_mut();
            }
        }
        let new_total = new_ext.size();
        // SAFETY: as in `dealloc`.
        let ext = unsafe { extended(layout).unwrap_unchecked() };
        // SAFETY: the block was allocated by `inner` with `ext`; the header
        // is copied along with the contents.
        let base = unsafe { self.inner.realloc(ptr.sub(h), ext, new_total) };
        if base.is_null() {
            if new > old {
                self.uncharge(acc, new - old);
            }
            return std::ptr::null_mut();
        }
        if new < old {
            self.uncharge(acc, old - new);
        }
        // SAFETY: `base` is a block of `new_total` bytes.
        unsafe { base.add(h) }
    }
}

impl<A> Accounted<A> {
    /// # Safety
    /// `layout` has a non-zero size (the `GlobalAlloc::alloc` contract).
    unsafe fn alloc_with(&self, layout: Layout, inner: impl FnOnce(Layout) -> *mut u8) -> *mut u8 {
        let Some(ext) = extended(layout) else {
            return std::ptr::null_mut();
        };
        let size = layout.size() as u64;
        let Ok(acc) = self.charge(size) else {
            return std::ptr::null_mut();
        };
        let base = inner(ext);
        if base.is_null() {
            self.uncharge(acc, size);
            return base;
        }
        // SAFETY: the block has `header + size` bytes; the user part starts
        // at `base + header`, aligned to `layout.align()`.
        unsafe {
            let user = base.add(header(layout.align()));
            header_slot(user).write(acc);
            user
        }
    }
}

impl<A> fmt::Debug for Accounted<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accounted")
            .field("attached", &self.attached().is_some())
            .finish()
    }
}
