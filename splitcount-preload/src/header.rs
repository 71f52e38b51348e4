//! The header in front of every block this library hands out, and how a
//! block is recognized as one of ours.
//!
//! ```text
//!  base (glibc's block)       user pointer p (16-aligned)
//!  │                          │
//!  ▼                          ▼
//!  ┌────────────┬────────────┬──────────────────────────────┐
//!  │ tag (8)    │ account (8)│ the program's bytes …        │
//!  └────────────┴────────────┴──────────────────────────────┘
//!  ◀──── header: 16 bytes ──▶
//!  tag = cookie ⊕ p ⊕ (4 << 56)
//! ```
//!
//! **The account** is the Rust wrapper's: the group's account object,
//! whose bytes keep it alive (null: the block is charged to nothing — made
//! before the accounting was ready, or by the accounting itself). On a
//! block of the inner allocator made by the fast path, the word carries
//! the block's usable size too (see [`PACKED`]), which its `free` then
//! need not ask the allocator for.
//!
//! **The size** is not stored, but for that packed usable size: a block
//! is charged its usable size, `malloc_usable_size(base) − header`, which
//! the heap can tell again at `free` (it does not change while the block
//! is live).
//!
//! **Foreign blocks.** A program may free a block glibc made without us
//! (allocated before this library took over, or by code calling
//! `__libc_malloc`). Its 16 bytes before `p` are glibc's chunk header
//! (`prev_size`, which belongs to the previous chunk's data while that one
//! is in use, and the chunk size). `find` accepts `p` only if the word at
//! `p − 16` equals `cookie ⊕ p ⊕ (4 << 56)`: `cookie`
//! is 64 random bits from the kernel (`AT_RANDOM`), unknown to the
//! program, so a word that is not ours matches with probability 2⁻⁶⁴
//! per free. A stale tag cannot match either: `free` clears the tag before
//! the block goes back to glibc, and `realloc` clears it before glibc may
//! move the block (glibc may merge a freed chunk into the top chunk without
//! writing over it, and a later foreign block may start at the same
//! address). Unrecognized pointers go to glibc untouched.
//!
//! **Over-aligned blocks carry a trailer instead.** A header in front of a
//! block aligned to `a` > 16 would take a whole alignment unit (so that
//! the user pointer stays aligned): `posix_memalign(4096, 100)` would cost
//! 8 KiB of heap instead of 4 KiB. Such a block is glibc's aligned block
//! itself (`p` = glibc's pointer), 16 bytes longer, with the tag and the
//! account in its last 16 usable bytes:
//!
//! ```text
//!  p = glibc's block, aligned to a          p + usable(p) − 16
//!  │                                        │
//!  ▼                                        ▼
//!  ┌────────────────────────────────────────┬───────────┬────────────┐
//!  │ the program's bytes (usable(p) − 16) … │ tag (8)   │ account (8)│
//!  └────────────────────────────────────────┴───────────┴────────────┘
//!  tag = cookie ⊕ p ⊕ (48 << 56)
//! ```
//!
//! `find` looks there only when the word before `p` is not a header's tag:
//! a block with a trailer is 32-aligned or more, and glibc can tell its
//! usable size (every pointer a program frees is ours or glibc's). The
//! word before `p` is glibc's `prev_size`, i.e. the previous chunk's last
//! bytes: they may hold that chunk's trailer account, never a tag made
//! for `p`. The tag's top byte (48, a header's is 4) keeps a header's tag
//! from ever reading as a trailer's or back.

use crate::heap::Heap;
use crate::libc_heap::real_usable;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};

/// The header of an ordinary block: tag and account.
pub(crate) const HEADER: usize = 16;

/// The trailer of an over-aligned block: tag and account.
pub(crate) const TRAILER: usize = 16;

/// The top byte of a header's tag on a block of glibc's (`log2(HEADER)`;
/// it was the header's size when over-aligned blocks had larger headers).
const HEADER_K: u32 = 4;

/// The top byte of a header's tag on a block of the inner allocator's.
const INNER_HEADER_K: u32 = 5;

/// The top byte of a trailer's tag.
const TRAILER_K: u32 = 48;

/// The process's cookie (0 until first read).
static COOKIE: AtomicU64 = AtomicU64::new(0);

/// 64 random bits the kernel gave the process (`AT_RANDOM`), available
/// before any allocation; inherited by `fork` children, like the blocks.
#[inline]
fn cookie() -> u64 {
    // Relaxed: every thread computes the same value from AT_RANDOM.
    match COOKIE.load(Ordering::Relaxed) {
        0 => first_cookie(),
        c => c,
    }
}

/// [`cookie`] the first time (out of line: the fast paths inline only the
/// load).
#[cold]
#[inline(never)]
fn first_cookie() -> u64 {
    // SAFETY: AT_RANDOM is the address of 16 random bytes that live for the
    // whole process (or 0 without it).
    let random = unsafe { libc::getauxval(libc::AT_RANDOM) } as *const u64;
    let c = if random.is_null() {
        0x9e37_79b9_7f4a_7c15
    } else {
        // SAFETY: 16 readable bytes; read unaligned to be safe.
        (unsafe { random.read_unaligned() }) | 1
    };
    COOKIE.store(c, Ordering::Relaxed);
    c
}

#[inline]
fn tag(user: *mut u8, k: u32) -> u64 {
    tag_with(cookie(), user, k)
}

/// The tag of `user` for header or trailer kind `k`, with `cookie`.
#[inline(always)]
fn tag_with(cookie: u64, user: *mut u8, k: u32) -> u64 {
    cookie ^ (user as u64) ^ ((k as u64) << 56)
}

/// Make the cookie now (the fast path's set-up: [`header_account`] and
/// [`Block::write_made`] read it without making it).
pub(crate) fn make_cookie() {
    cookie();
}

/// The cookie, made before: a load, no test and no call.
///
/// # Safety
/// [`make_cookie`] happens before this call (the fast path's switch is
/// turned on after it, with Release, and read with Acquire).
#[inline(always)]
unsafe fn made_cookie() -> u64 {
    // Relaxed: see the contract.
    let cookie = COOKIE.load(Ordering::Relaxed);
    debug_assert_ne!(cookie, 0, "make_cookie has not run");
    cookie
}

/// An inner heap's block whose header was written by the fast path has its
/// usable size in the account word too, so that its `free` need not ask
/// the heap (jemalloc's `malloc_usable_size` looks the block up in its
/// radix tree: about a quarter of a `malloc`+`free` pair's time under the
/// preload). The word is then `account | PACKED | (usable / 8) << 48`: the
/// account's address fits in 47 bits (a user-space address: bits 47–63
/// clear; any other address is written as it is, unpacked), and bit 63 —
/// never set in a user-space address — says the size is there. Unpacked
/// (glibc's blocks, whose usable size is read from glibc's size word
/// without a call; blocks the general path or `realloc` wrote; sizes of
/// 256 KiB and more), the word is the account's address alone.
const PACKED: u64 = 1 << 63;

/// Where the packed size starts in the account word.
const SIZE_SHIFT: u32 = 48;

/// The largest packed size, in 8-byte units (15 bits).
const SIZE_UNITS_MAX: u64 = (1 << 15) - 1;

/// The account word for `account` with `usable` packed where it can be (0:
/// not known).
#[inline(always)]
fn account_word(account: *const u8, usable: usize) -> u64 {
    let address = account as u64;
    let units = (usable / 8) as u64;
    if usable % 8 == 0 && units != 0 && units <= SIZE_UNITS_MAX && address >> 47 == 0 {
        address | PACKED | units << SIZE_SHIFT
    } else {
        address
    }
}

/// The account, and the usable size if packed, of an account word.
#[inline(always)]
fn split_account_word(word: u64) -> (*const u8, Option<usize>) {
    if word & PACKED == 0 {
        return (word as *const u8, None);
    }
    let units = (word >> SIZE_SHIFT) & SIZE_UNITS_MAX;
    (
        (word & ((1 << SIZE_SHIFT) - 1)) as *const u8,
        Some((units * 8) as usize),
    )
}

/// The account in the header of `user` when `user` is a block of ours
/// with a header from `heap`, and the block's usable size when its header
/// has it (see [`PACKED`]) — [`Block::find`]'s common case, inline, for
/// the fast path (a trailer, a block of the other heap, a block not ours:
/// `None`; ask `Block::find`).
///
/// # Safety
/// As [`Block::find`], and [`make_cookie`] has run.
#[inline(always)]
pub(crate) unsafe fn header_account(
    user: *mut u8,
    heap: Heap,
) -> Option<(*const u8, Option<usize>)> {
    if (user as usize) < 4096 || (user as usize) % HEADER != 0 {
        return None;
    }
    let k = match heap {
        Heap::Glibc => HEADER_K,
        Heap::Inner => INNER_HEADER_K,
    };
    let words = user.cast::<u64>().wrapping_sub(2);
    // SAFETY: the caller's contract.
    let cookie = unsafe { made_cookie() };
    // SAFETY: every glibc block and ours has 16 readable bytes before it.
    if unsafe { words.read() } != tag_with(cookie, user, k) {
        return None;
    }
    // SAFETY: ours: the word after the tag is the account.
    Some(split_account_word(unsafe { words.add(1).read() }))
}

/// Give back the block at `user` that [`header_account`] found, its tag
/// cleared first.
///
/// # Safety
/// [`header_account`] found `user` in `heap`; the block is not used again.
#[inline(always)]
pub(crate) unsafe fn free_with_header(user: *mut u8, heap: Heap) {
    // SAFETY: the caller's contract: a live block of ours with a header.
    unsafe {
        user.cast::<u64>().sub(2).write(0);
        heap.free(user.sub(HEADER));
    }
}

/// One of our blocks, found from its user pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Block {
    user: *mut u8,
    /// The header's size; 0 for a block with a trailer.
    header: usize,
    /// The heap it came from (a trailer's: glibc).
    heap: Heap,
    /// The account its bytes were charged to (null: none).
    pub(crate) account: *const u8,
}

/// The trailer's two words in the block at `base`.
///
/// # Safety
/// `base` is a live glibc block.
#[inline]
unsafe fn trailer_words(base: *mut u8) -> *mut u64 {
    // SAFETY: the caller's contract: `real_usable` bytes from `base`.
    unsafe { base.add(real_usable(base) - TRAILER).cast() }
}

impl Block {
    /// Write the header of a new block at `base`; the user pointer.
    ///
    /// # Safety
    /// `base` is a live block of `heap` of at least [`HEADER`] bytes,
    /// 16-aligned.
    #[inline(always)]
    pub(crate) unsafe fn write(base: *mut u8, account: *const u8, heap: Heap) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { Block::write_with(cookie(), base, account, heap, 0) }
    }

    /// [`Block::write`] for the fast path, with the cookie made before;
    /// `usable`, the heap's usable size of the block (0: not known), is
    /// packed into the header where it fits (see [`PACKED`]).
    ///
    /// # Safety
    /// As [`Block::write`], and as [`made_cookie`]; `usable` is 0 or the
    /// block's usable size, which stays so while it is live.
    #[inline(always)]
    pub(crate) unsafe fn write_made(
        base: *mut u8,
        account: *const u8,
        heap: Heap,
        usable: usize,
    ) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe { Block::write_with(made_cookie(), base, account, heap, usable) }
    }

    /// # Safety
    /// As [`Block::write_made`]; `cookie` is the process's.
    #[inline(always)]
    unsafe fn write_with(
        cookie: u64,
        base: *mut u8,
        account: *const u8,
        heap: Heap,
        usable: usize,
    ) -> *mut u8 {
        let k = match heap {
            Heap::Glibc => HEADER_K,
            Heap::Inner => INNER_HEADER_K,
        };
        // SAFETY: the block's first 16 bytes precede the user pointer.
        unsafe {
            let user = base.add(HEADER);
            let words = user.cast::<u64>().sub(2);
            words.write(tag_with(cookie, user, k));
            words.add(1).write(account_word(account, usable));
            user
        }
    }

    /// Write the trailer of a new over-aligned block at `base` (the user
    /// pointer too); `base`.
    ///
    /// # Safety
    /// `base` is a live glibc block of at least [`TRAILER`] usable bytes,
    /// aligned to 32 or more.
    pub(crate) unsafe fn write_trailer(base: *mut u8, account: *const u8) -> *mut u8 {
        // SAFETY: the last 16 of the block's usable bytes; glibc's usable
        // sizes are multiples of 8, so the words are aligned.
        unsafe {
            let words = trailer_words(base);
            words.write(tag(base, TRAILER_K));
            words.add(1).write(account as u64);
        }
        base
    }

    /// The block at `user`, if it is one of ours (see the module docs).
    ///
    /// # Safety
    /// `user` was returned by an allocation function (ours or glibc's), or
    /// is at least a pointer with 16 readable bytes before it; and a
    /// pointer 32-aligned or more is a live block of ours or of glibc's.
    #[inline]
    pub(crate) unsafe fn find(user: *mut u8) -> Option<Block> {
        if (user as usize) < 4096 || (user as usize) % HEADER != 0 {
            return None;
        }
        let words = user.cast::<u64>().wrapping_sub(2);
        // SAFETY: every glibc block and ours has 16 readable bytes before it.
        let x = unsafe { words.read() } ^ cookie() ^ (user as u64);
        let heap = if x == (HEADER_K as u64) << 56 {
            Heap::Glibc
        } else if x == (INNER_HEADER_K as u64) << 56 {
            Heap::Inner
        } else {
            // SAFETY: the caller's contract.
            return unsafe { Self::find_trailer(user) };
        };
        Some(Block {
            user,
            header: HEADER,
            heap,
            // SAFETY: ours: the word after the tag is the account.
            account: split_account_word(unsafe { words.add(1).read() }).0,
        })
    }

    /// The over-aligned block at `user`, if it is one of ours.
    ///
    /// # Safety
    /// As [`Block::find`].
    #[cold]
    unsafe fn find_trailer(user: *mut u8) -> Option<Block> {
        if (user as usize) % (2 * HEADER) != 0 {
            return None;
        }
        // SAFETY: a live glibc block (ours or not): its usable bytes are
        // readable, and there are at least 24 of them.
        let words = unsafe { trailer_words(user) };
        // SAFETY: as above.
        let x = unsafe { words.read() } ^ cookie() ^ (user as u64);
        if x != (TRAILER_K as u64) << 56 {
            return None;
        }
        Some(Block {
            user,
            header: 0,
            heap: Heap::Glibc,
            // SAFETY: ours: the word after the tag is the account.
            account: unsafe { words.add(1).read() } as *const u8,
        })
    }

    fn base(&self) -> *mut u8 {
        self.user.wrapping_sub(self.header)
    }

    /// The bytes the program may use, and is charged for.
    ///
    /// # Safety
    /// The block is live.
    #[inline]
    pub(crate) unsafe fn usable(&self) -> usize {
        // SAFETY: the caller's contract; the heap's block starts at `base`.
        unsafe { self.heap.usable(self.base()) }.saturating_sub(self.ours())
    }

    /// Our bytes in the block: the header, or the trailer.
    fn ours(&self) -> usize {
        if self.header == 0 {
            TRAILER
        } else {
            self.header
        }
    }

    /// What the block is charged: its usable size, or under
    /// `SPLITCOUNT_PRELOAD_CHARGE=footprint` what it takes from the heap.
    ///
    /// # Safety
    /// The block is live.
    #[inline]
    pub(crate) unsafe fn charged(&self) -> usize {
        // SAFETY: the caller's contract.
        unsafe { crate::charged_size(self.heap, self.base(), self.ours()) }
    }

    /// Clear the tag. The caller's contract: the block is live.
    fn clear_tag(&self) {
        if self.header == 0 {
            // SAFETY: the trailer of a live block of ours.
            unsafe { trailer_words(self.user).write(0) };
        } else {
            // SAFETY: the tag word of a live block of ours.
            unsafe { self.user.cast::<u64>().sub(2).write(0) };
        }
    }

    /// Give the block back to glibc, its tag cleared first.
    ///
    /// # Safety
    /// The block is live; it is not used after.
    #[inline(always)]
    pub(crate) unsafe fn free(self) {
        self.clear_tag();
        // SAFETY: the heap's block.
        unsafe { self.heap.free(self.base()) };
    }

    /// `realloc` of one of our blocks. Growth is charged to the block's
    /// account before glibc moves anything: what is asked for plus the most
    /// glibc may round it up by (under 64 bytes; a page more from 128 KiB on: [`crate::heap::Heap::most_usable`]), the excess given
    /// back once the new usable size is known — so a refusal leaves the
    /// block untouched, and usage never misses a byte of the new block.
    ///
    /// # Safety
    /// The block is live; `size` > 0.
    pub(crate) unsafe fn realloc(self, size: usize) -> *mut c_void {
        let Some(total) = crate::with_header(size, HEADER) else {
            crate::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        };
        // SAFETY: live.
        let usable = unsafe { self.usable() };
        if self.header != HEADER || (size > usable && !self.heap.grows_in_place()) {
            // SAFETY: live.
            unsafe { return self.move_to_new_block(total, size) };
        }
        let old = if crate::charging_footprints() {
            // SAFETY: live.
            unsafe { self.charged() }
        } else {
            usable
        };
        let account = self.account;
        let prepaid = if size > usable {
            // SAFETY: the live block's base, of this heap.
            let most = unsafe {
                if crate::charging_footprints() {
                    self.heap.most_footprint(total, self.base())
                } else {
                    self.heap.most_usable(total, self.base()) - HEADER
                }
            };
            most.saturating_sub(old)
        } else {
            0
        };
        if !crate::grow(account, prepaid) {
            crate::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        self.clear_tag();
        // SAFETY: the heap's block of `HEADER + old` bytes or more.
        let base = unsafe { self.heap.realloc(self.base(), total) };
        if base.is_null() {
            // The old block is as it was: its tag back, the growth returned.
            // SAFETY: still live, the header's place unchanged.
            unsafe { Block::write(self.base(), account, self.heap) };
            crate::uncharge(account, prepaid);
            return std::ptr::null_mut();
        }
        // SAFETY: the heap's new block, with a header.
        let new = unsafe { crate::charged_size(self.heap, base, HEADER) };
        let charged = old + prepaid;
        if new <= charged {
            crate::uncharge(account, charged - new);
        } else {
            // Beyond the heap's bound (`most_usable`): glibc mapped a block
            // below 128 KiB (the program lowered its mmap threshold). The
            // block is made: charged, past the limit if need be (a page).
            crate::grow_unrefused(account, new - charged);
        }
        // SAFETY: the new block, 16-aligned, with the header's room.
        unsafe { Block::write(base, account, self.heap) }.cast()
    }

    /// `realloc` of an aligned block (realloc need not keep the alignment,
    /// glibc's does not), or growth on a heap that never grows a block in
    /// place (mimalloc, see `Heap::grows_in_place`): a new ordinary block of
    /// `total` bytes, charged to the same account what it is, the bytes
    /// copied, the old one freed.
    ///
    /// # Safety
    /// The block is live; `total` is `size` plus [`HEADER`].
    unsafe fn move_to_new_block(self, total: usize, size: usize) -> *mut c_void {
        let heap = Heap::current();
        // SAFETY: the heap's allocator.
        let base = unsafe { heap.malloc(total) };
        if base.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: a live block of the heap, with a header.
        if !crate::grow(self.account, unsafe {
            crate::charged_size(heap, base, HEADER)
        }) {
            // SAFETY: ours, never handed out.
            unsafe { heap.free(base) };
            crate::set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        // SAFETY: the new block has `size` bytes after its header, the old
        // one `usable`; then the old one goes (uncharged) as in `free`.
        unsafe {
            let new = Block::write(base, self.account, heap);
            std::ptr::copy_nonoverlapping(self.user, new, self.usable().min(size));
            crate::free(self.user.cast());
            new.cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An account's address with a usable size packed in comes back as
    /// both, at every edge; what cannot be packed comes back as the
    /// address alone.
    #[test]
    fn a_usable_size_packs_into_the_account_word_where_it_fits() {
        let account = 0x7fff_ffff_fff0 as *const u8; // the highest 47-bit address
        for usable in [8, 16, 24, 4096, SIZE_UNITS_MAX as usize * 8] {
            let word = account_word(account, usable);
            assert_ne!(word & PACKED, 0, "{usable}");
            assert_eq!(split_account_word(word), (account, Some(usable)));
        }
        let null = std::ptr::null::<u8>();
        assert_eq!(
            split_account_word(account_word(null, 64)),
            (null, Some(64)),
            "charged to nothing"
        );
        for usable in [0, 12, SIZE_UNITS_MAX as usize * 8 + 8, 1 << 30] {
            assert_eq!(
                account_word(account, usable),
                account as u64,
                "{usable}: not packed"
            );
        }
        // An address beyond 47 bits (never a user-space one on x86-64's
        // four-level tables) is written as it is.
        let high = 0x8000_0000_0000 as *const u8;
        assert_eq!(account_word(high, 64), high as u64);
        assert_eq!(split_account_word(high as u64), (high, None));
    }
}
