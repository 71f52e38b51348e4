//! `HeapPerGroup<tikv_jemallocator::Jemalloc>` (feature `jemalloc`): each
//! group given a heap has a jemalloc arena of its own whose pages lie in an
//! address range of its own, so no block of it carries a tag, a free finds
//! the group from the block's address, and a group's usage is still the
//! exact sum of its live blocks' usable sizes — through reallocs, frees on
//! other threads, removals and the reuse of heaps.

#![cfg(all(feature = "jemalloc", not(loom)))]
#![allow(unsafe_code)]

use splitcount::alloc::{drain_thread, HeapPerGroup};
use splitcount::group::{Group, Hierarchy};
use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
use std::ffi::c_void;
use std::sync::{Mutex, MutexGuard, OnceLock};
use tikv_jemalloc_sys as je;

mod common;
use common::{free_on_another_thread, Rng};
#[macro_use]
mod heap_per_group_tests;

#[global_allocator]
static ALLOC: HeapPerGroup<tikv_jemallocator::Jemalloc> =
    HeapPerGroup::new(tikv_jemallocator::Jemalloc);

/// The jemalloc arena the block at `p` belongs to (`arenas.lookup`).
fn arena_of(p: *mut u8) -> u32 {
    let mut index: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    let mut ptr = p.cast::<c_void>();
    // SAFETY: `arenas.lookup` reads a pointer and writes an `unsigned`.
    let r = unsafe {
        je::mallctl(
            c"arenas.lookup".as_ptr(),
            (&mut index as *mut u32).cast(),
            &mut len,
            (&mut ptr as *mut *mut c_void).cast(),
            std::mem::size_of::<*mut c_void>(),
        )
    };
    assert_eq!(r, 0, "arenas.lookup");
    index
}

/// jemalloc's automatic arenas (and the one for huge blocks after them):
/// the arenas `Jemalloc`'s own blocks come from.
fn automatic_arenas() -> u32 {
    let mut n: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    // SAFETY: `opt.narenas` is an `unsigned`.
    let r = unsafe {
        je::mallctl(
            c"opt.narenas".as_ptr(),
            (&mut n as *mut u32).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    assert_eq!(r, 0, "opt.narenas");
    n + 1
}

/// Whether the block at `p` lies in one of jemalloc's own arenas: made
/// with a header, not in a heap of a group.
fn in_main_heap(p: *mut u8) -> bool {
    arena_of(p) < automatic_arenas()
}

/// The footprint of the block at `p` of alignment `align`: jemalloc's
/// usable size of the block itself — or, for a block with a header, of the
/// allocation that starts a header before it.
fn footprint(p: *mut u8, align: usize) -> u64 {
    // SAFETY: `p` is live, from the allocator; a header block starts 8
    // bytes before `p`, or at `p` for an alignment above 8 (its tag trails).
    unsafe {
        let start = if in_main_heap(p) && align <= 8 {
            p.sub(8)
        } else {
            p
        };
        je::sallocx(start.cast(), 0) as u64
    }
}

/// jemalloc's class for `layout` (`nallocx`, with `Jemalloc`'s flags).
fn class(layout: Layout) -> usize {
    let flags = if layout.align() <= 16 && layout.align() <= layout.size() {
        0
    } else {
        je::MALLOCX_ALIGN(layout.align())
    };
    // SAFETY: allocates nothing; a non-zero size.
    unsafe { je::nallocx(layout.size(), flags) }
}

/// jemalloc's usable size of the live block at `p`.
///
/// # Safety
/// `p` is a live block of jemalloc's.
unsafe fn usable(p: *mut u8) -> usize {
    // SAFETY: forwarded contract.
    unsafe { je::sallocx(p.cast(), 0) }
}

heap_per_group_tests!();

/// Two groups' blocks lie in two arenas, and a block freed by one group
/// never comes back as the other's (no thread cache between them): made
/// and freed in turn on one thread, every block is in its own group's
/// arena and each usage is exact.
#[test]
fn a_freed_block_never_comes_back_in_another_groups_arena() {
    let _s = serial();
    let a = fresh("ping");
    let b = fresh("pong");
    let layout = Layout::from_size_align(48, 8).unwrap();
    let (mut arena_a, mut arena_b) = (None, None);
    for _ in 0..10_000 {
        // SAFETY: a non-zero size; each block freed at once.
        unsafe {
            let p = a.scope(|| alloc(layout));
            assert_eq!(*arena_a.get_or_insert(arena_of(p)), arena_of(p));
            dealloc(p, layout);
            let q = b.scope(|| alloc(layout));
            assert_eq!(*arena_b.get_or_insert(arena_of(q)), arena_of(q));
            dealloc(q, layout);
            // jemalloc's own blocks, freed into the thread's cache.
            let r = alloc(layout);
            assert!(in_main_heap(r));
            dealloc(r, layout);
        }
    }
    assert_ne!(arena_a, arena_b);
    assert_eq!((settled(&a), settled(&b)), (0, 0));
}

/// Heaps are given, not taken: a group's blocks carry headers (in
/// jemalloc's own arenas) until it is given a heap, and those made before
/// stay where they are; both kinds are freed exactly.
#[test]
fn only_groups_given_a_heap_have_blocks_without_tags() {
    let _s = serial();
    let g = memory().root().child("given-later").unwrap();
    let layout = Layout::from_size_align(48, 8).unwrap();
    let mut blocks = Vec::with_capacity(200);
    g.scope(|| {
        for _ in 0..100 {
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(in_main_heap(p), "a group given no heap has header blocks");
            blocks.push((p, layout));
        }
    });
    ALLOC.give_heap(&g).unwrap();
    g.scope(|| {
        for _ in 0..100 {
            // SAFETY: a non-zero size.
            let p = unsafe { alloc(layout) };
            assert!(!in_main_heap(p));
            // SAFETY: live.
            assert_eq!(unsafe { je::sallocx(p.cast(), 0) }, 48);
            blocks.push((p, layout));
        }
    });
    assert_eq!(settled(&g), total(&blocks));
    assert_eq!(
        total(&blocks),
        100 * 64 + 100 * 48,
        "48 B + 8 of header: 64"
    );
    free_all(blocks);
    assert_eq!(settled(&g), 0);
}

/// A block larger than a heap's region (16 GiB of address space) cannot be
/// made in the group's arena: it is made with a header in jemalloc's own
/// arenas instead (or refused, where the system will not map that much),
/// and charged exactly either way — made new, or by a `realloc` of a block
/// of the heap.
#[test]
fn a_block_larger_than_a_region_gets_a_header() {
    let _s = serial();
    let g = fresh("huge");
    let layout = Layout::from_size_align((17 << 30) + 1, 8).unwrap();
    // Whether jemalloc alone maps that much here.
    // SAFETY: a non-zero size; never touched, freed at once.
    let mappable = unsafe {
        let q = je::mallocx(layout.size() + 8, 0);
        !q.is_null() && {
            je::dallocx(q, 0);
            true
        }
    };
    // SAFETY: a non-zero size; never touched, freed below.
    let p = g.scope(|| unsafe { alloc(layout) });
    assert_eq!(
        !p.is_null(),
        mappable,
        "made wherever jemalloc alone makes it"
    );
    if !p.is_null() {
        assert!(in_main_heap(p), "a header block");
        assert_eq!(settled(&g), footprint(p, 8));
        // SAFETY: live, with this layout.
        unsafe { dealloc(p, layout) };
    }
    assert_eq!(settled(&g), 0);
    // A block of the heap grown past its region: moved to a header block,
    // still the group's (reallocated from another group's scope), its
    // contents kept.
    let other = fresh("huge-elsewhere");
    let small = Layout::from_size_align(100, 8).unwrap();
    // SAFETY: a non-zero size; grown below, freed at the end.
    let q = g.scope(|| unsafe { alloc(small) });
    assert!(!in_main_heap(q));
    // SAFETY: 100 bytes, live.
    unsafe { std::ptr::write_bytes(q, 0x5A, 100) };
    // SAFETY: live with `small`; a non-zero size.
    let r = other.scope(|| unsafe { realloc(q, small, layout.size()) });
    assert_eq!(
        !r.is_null(),
        mappable,
        "grown wherever jemalloc alone makes it"
    );
    if r.is_null() {
        // SAFETY: refused: `q` is still live with `small`.
        unsafe { dealloc(q, small) };
    } else {
        assert!(in_main_heap(r), "a header block");
        // SAFETY: the first 100 bytes were copied.
        assert!(unsafe { std::slice::from_raw_parts(r, 100) }
            .iter()
            .all(|&b| b == 0x5A));
        assert_eq!((settled(&g), settled(&other)), (footprint(r, 8), 0));
        // SAFETY: live, with the grown layout.
        unsafe { dealloc(r, layout) };
    }
    assert_eq!((settled(&g), settled(&other)), (0, 0));
}

/// Each thread keeps a jemalloc cache per heap it allocates or frees in,
/// and its caches go with it: 5,000 threads one after another, each
/// allocating in a group's heap and freeing half of it, leave jemalloc
/// able to make a cache (it allows 4,093 in a process), and every block —
/// those freed by their thread, those freed after it exited — is given
/// back exactly.
#[test]
fn threads_take_their_caches_with_them() {
    let _s = serial();
    let g = fresh("short-lived-threads");
    let mut kept: Vec<(usize, Layout)> = Vec::new();
    for t in 0..5_000u64 {
        let g = g.clone();
        let made = std::thread::spawn(move || {
            let layout = Layout::from_size_align(16 + (t as usize % 200), 8).unwrap();
            g.scope(|| {
                // SAFETY: non-zero sizes; the first block freed at once.
                unsafe {
                    let p = alloc(layout);
                    dealloc(p, layout);
                    (alloc(layout) as usize, layout)
                }
            })
        })
        .join()
        .unwrap();
        kept.push(made);
    }
    let live: Vec<(*mut u8, Layout)> = kept.iter().map(|&(p, l)| (p as *mut u8, l)).collect();
    assert!(live.iter().all(|&(p, _)| !p.is_null() && !in_main_heap(p)));
    assert_eq!(settled(&g), total(&live));
    free_all(live);
    assert_eq!(settled(&g), 0);
    assert_eq!(g.events().underflow, 0);
    assert!(
        a_cache_can_still_be_made(),
        "explicit caches left after 5,000 threads"
    );
}

/// Where the heaps' address space (4 TiB, no memory) cannot be reserved —
/// here a 1 TiB `RLIMIT_AS`, in a process of its own — `give_heap` says so
/// and the group's blocks keep their headers, charged exactly.
#[test]
fn without_address_space_for_heaps_give_heap_says_so() {
    const CHILD: &str = "SPLITCOUNT_TEST_SMALL_ADDRESS_SPACE";
    if std::env::var_os(CHILD).is_some() {
        let g = memory().root().child("no-room").unwrap();
        assert_eq!(
            ALLOC.give_heap(&g),
            Err(splitcount::alloc::HeapError::Unavailable)
        );
        let blocks = assorted(&g, 500, 17);
        assert!(blocks.iter().all(|&(p, _)| in_main_heap(p)));
        assert_eq!(settled(&g), total(&blocks));
        free_all(blocks);
        assert_eq!(settled(&g), 0);
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "without_address_space_for_heaps_give_heap_says_so",
        ])
        .env(CHILD, "1");
    // SAFETY: only `setrlimit`, async-signal-safe, between fork and exec.
    unsafe {
        child.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 40,
                rlim_max: 1 << 40,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    let out = child.output().unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A C library's per-thread data freed in a pthread key's destructor —
/// after the thread-locals' destructors have run — on threads that never
/// touched a heap before: their caches are destroyed too (4,500 such
/// threads would use up jemalloc's explicit caches otherwise).
#[test]
fn a_block_freed_in_a_pthread_key_destructor_leaves_no_cache_behind() {
    static mut KEY: libc::pthread_key_t = 0;
    unsafe extern "C" fn free_it(p: *mut std::ffi::c_void) {
        // SAFETY: a `Box<[u8; 64]>` handed over by `pthread_setspecific`.
        drop(unsafe { Box::from_raw(p.cast::<[u8; 64]>()) });
    }
    let _s = serial();
    let g = fresh("key-destructors");
    // SAFETY: a new key; its destructor takes what the threads set.
    assert_eq!(
        unsafe { libc::pthread_key_create(&raw mut KEY, Some(free_it)) },
        0
    );
    for _ in 0..4_500 {
        let b: Box<[u8; 64]> = g.scope(|| Box::new([9; 64]));
        let b = Box::into_raw(b) as usize;
        std::thread::spawn(move || {
            // SAFETY: the key made above; the box is freed at thread exit.
            unsafe { libc::pthread_setspecific(KEY, b as *const std::ffi::c_void) };
        })
        .join()
        .unwrap();
    }
    assert_eq!(settled(&g), 0);
    assert!(
        a_cache_can_still_be_made(),
        "explicit caches left after 4,500 threads"
    );
}

/// Whether jemalloc can still make an explicit cache (it allows about
/// 4,000 in a process): one is made and destroyed at once.
fn a_cache_can_still_be_made() -> bool {
    let mut index: u32 = 0;
    let mut len = std::mem::size_of::<u32>();
    // SAFETY: `tcache.create` writes an `unsigned`; `tcache.destroy` reads
    // the index just made.
    unsafe {
        let made = je::mallctl(
            c"tcache.create".as_ptr(),
            (&mut index as *mut u32).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        );
        if made != 0 {
            return false;
        }
        je::mallctl(
            c"tcache.destroy".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&mut index as *mut u32).cast(),
            std::mem::size_of::<u32>(),
        );
    }
    true
}
