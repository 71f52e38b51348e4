//! The tests every `HeapPerGroup` inner allocator passes, as a macro:
//! `heap_per_group_tests!()` in a test binary that defines `ALLOC` (its
//! `HeapPerGroup`), `in_main_heap(p)` (a block with a header, not in a
//! heap of a group), `footprint(p, align)`, `usable(p)` (the inner
//! allocator's usable size of the block at `p`) and `class(layout)` (its
//! class for a block of `layout` in a heap). It defines `memory()`,
//! `serial()`, `fresh(name)`, `settled(g)`, `total`, `assorted` and
//! `free_all` for the binary's own tests too.

macro_rules! heap_per_group_tests {
    () => {
        fn memory() -> &'static Hierarchy {
            static H: OnceLock<Hierarchy> = OnceLock::new();
            H.get_or_init(|| {
                let h = Hierarchy::default();
                ALLOC.attach(&h).unwrap();
                h
            })
        }

        /// The tests count heaps: one at a time.
        fn serial() -> MutexGuard<'static, ()> {
            static SERIAL: Mutex<()> = Mutex::new(());
            SERIAL.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// A new group given a heap, with nothing charged.
        fn fresh(name: &str) -> Group {
            let g = memory().root().child(name).unwrap();
            ALLOC.give_heap(&g).unwrap();
            g.scope(|| ());
            assert_eq!(settled(&g), 0);
            g
        }

        /// The group's usage with nothing pre-charged.
        fn settled(g: &Group) -> u64 {
            drain_thread();
            memory().drain_stocks();
            g.usage()
        }

        fn total(blocks: &[(*mut u8, Layout)]) -> u64 {
            blocks.iter().map(|&(p, l)| footprint(p, l.align())).sum()
        }

        /// `n` blocks of 1 to 4096 bytes at alignments 1 to 4096 (a third of them
        /// zeroed), allocated in `g`, with their layouts.
        fn assorted(g: &Group, n: usize, seed: u64) -> Vec<(*mut u8, Layout)> {
            let mut blocks = Vec::with_capacity(n);
            let mut rng = Rng::new(seed);
            g.scope(|| {
                for i in 0..n {
                    let size = 1 + rng.below(4096) as usize;
                    let align = 1 << rng.below(13);
                    let layout = Layout::from_size_align(size, align).unwrap();
                    // SAFETY: a non-zero size.
                    let p = unsafe {
                        if i % 3 == 0 {
                            alloc_zeroed(layout)
                        } else {
                            alloc(layout)
                        }
                    };
                    assert!(!p.is_null());
                    if i % 3 == 0 {
                        // SAFETY: `size` bytes, just allocated.
                        assert!(unsafe { std::slice::from_raw_parts(p, size) }
                            .iter()
                            .all(|&b| b == 0));
                    }
                    blocks.push((p, layout));
                }
            });
            blocks
        }

        fn free_all(blocks: Vec<(*mut u8, Layout)>) {
            for (p, l) in blocks {
                // SAFETY: allocated with this layout, live.
                unsafe { dealloc(p, l) };
            }
        }

        #[test]
        fn a_groups_usage_is_the_usable_size_of_its_blocks() {
            let _s = serial();
            let g = fresh("assorted");
            let blocks = assorted(&g, 2_000, 7);
            assert!(blocks.iter().all(|&(p, _)| !in_main_heap(p)));
            assert_eq!(settled(&g), total(&blocks));
            free_all(blocks);
            assert_eq!(settled(&g), 0);
        }

        /// Reallocs keep the block in its account's heap — from a thread in
        /// another group, too — and move the usage by the change in usable size.
        #[test]
        fn reallocs_move_the_usage_by_the_change_in_usable_size() {
            let _s = serial();
            let g = fresh("reallocs");
            let other = fresh("reallocs-elsewhere");
            let mut blocks = assorted(&g, 600, 11);
            let mut rng = Rng::new(3);
            other.scope(|| {
                for (i, (p, l)) in blocks.iter_mut().enumerate() {
                    let size = match i % 3 {
                        0 => 1 + rng.below(8192) as usize,
                        // Within the class, and across the table's edge.
                        1 => l.size().div_ceil(2).max(1),
                        _ => 1000 + rng.below(100) as usize,
                    };
                    let keep = l.size().min(size);
                    // SAFETY: live; fill what must survive.
                    unsafe { std::ptr::write_bytes(*p, (i % 251) as u8, keep) };
                    // SAFETY: `p` is live with layout `l`; a non-zero size.
                    let q = unsafe { realloc(*p, *l, size) };
                    assert!(!q.is_null());
                    // SAFETY: `keep` bytes survive the move.
                    assert!(unsafe { std::slice::from_raw_parts(q, keep) }
                        .iter()
                        .all(|&b| b == (i % 251) as u8));
                    assert!(!in_main_heap(q));
                    // SAFETY: live.
                    let usable = unsafe { usable(q) };
                    assert!(usable >= size, "{size} B in a block of {usable}");
                    // SAFETY: the block has `size` bytes.
                    unsafe { std::ptr::write_bytes(q, 7, size) };
                    *p = q;
                    *l = Layout::from_size_align(size, l.align()).unwrap();
                }
            });
            assert_eq!(settled(&other), 0, "the blocks' account pays their growth");
            assert_eq!(settled(&g), total(&blocks));
            free_all(blocks);
            assert_eq!(settled(&g), 0);
        }

        #[test]
        fn blocks_freed_on_another_thread_are_given_back_exactly() {
            let _s = serial();
            let g = fresh("cross-thread");
            let blocks = assorted(&g, 2_000, 13);
            assert_eq!(settled(&g), total(&blocks));
            free_on_another_thread(&blocks);
            assert_eq!(settled(&g), 0);
            assert_eq!(g.events().underflow, 0);
        }

        /// A removed group keeps its heap while its blocks live (their frees
        /// uncharge it and its ancestors); once the last is freed its account
        /// ends and the heap goes to the next group — a stream of short-lived
        /// groups runs on the same few heaps.
        #[test]
        fn a_removed_groups_heap_goes_to_the_next_group() {
            let _s = serial();
            let parent = fresh("tenants");
            let first = parent.child("first").unwrap();
            ALLOC.give_heap(&first).unwrap();
            let blocks = assorted(&first, 300, 5);
            let owned = ALLOC.heaps().owned;
            first.remove().unwrap();
            drop(first);
            assert_eq!(settled(&parent), total(&blocks));
            assert_eq!(ALLOC.heaps().owned, owned, "held while its blocks live");
            free_all(blocks);
            assert_eq!(settled(&parent), 0);
            assert_eq!(
                ALLOC.heaps().owned,
                owned - 1,
                "given up with the last block"
            );

            let made = ALLOC.heaps().made;
            for i in 0..500 {
                let g = parent.child(&format!("request-{i}")).unwrap();
                ALLOC.give_heap(&g).unwrap();
                let blocks = assorted(&g, 20, i);
                assert_eq!(settled(&g), total(&blocks), "request {i}");
                free_all(blocks);
                g.remove().unwrap();
            }
            assert_eq!(settled(&parent), 0);
            assert!(
                ALLOC.heaps().made <= made + 1,
                "500 groups in turn made {} heaps",
                ALLOC.heaps().made - made
            );
        }

        /// Under a refusing limit allocations are refused (null) and usage still
        /// counts every block handed out, exactly.
        #[test]
        fn a_refusing_limit_refuses_and_counts_every_block() {
            let _s = serial();
            let g = fresh("limited");
            g.set_max(256 << 10).unwrap();
            g.set_enforcement(splitcount::Enforcement::Refuse);
            let layout = Layout::from_size_align(96, 8).unwrap();
            // Made outside the group: its growth would be refused too.
            let mut live = Vec::with_capacity(10_000);
            let refused = g.scope(|| {
                for _ in 0..10_000 {
                    // SAFETY: a non-zero size.
                    let p = unsafe { alloc(layout) };
                    if p.is_null() {
                        return true;
                    }
                    live.push((p, layout));
                }
                false
            });
            assert!(refused, "256 KiB holds fewer than 10,000 blocks of 96 B");
            assert!(live.len() * 96 <= 256 << 10);
            assert_eq!(settled(&g), total(&live));
            free_all(live);
            assert_eq!(settled(&g), 0);
        }

        /// Groups made and removed on four threads at once, each allocating in
        /// its own group and handing half of its blocks to the next thread to
        /// free: heaps pass from ended accounts to new ones while other threads
        /// free blocks of other heaps. Afterwards nothing stays charged, and no
        /// group was charged a block of another's (every group's usage is exactly
        /// zero once its blocks are freed).
        #[test]
        fn heaps_pass_between_groups_while_threads_free_each_others_blocks() {
            let _s = serial();
            let parent = fresh("churn");
            const THREADS: usize = 4;
            let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
                .map(|_| std::sync::mpsc::channel::<Vec<(usize, Layout)>>())
                .unzip();
            std::thread::scope(|s| {
                for (t, rx) in receivers.into_iter().enumerate() {
                    let next = senders[(t + 1) % THREADS].clone();
                    let parent = &parent;
                    s.spawn(move || {
                        let mut rng = Rng::new(t as u64 + 1);
                        for round in 0..300 {
                            let g = parent.child(&format!("t{t}-{round}")).unwrap();
                            // All taken when the threads run far apart: headers.
                            let _ = ALLOC.give_heap(&g);
                            let mut mine = Vec::with_capacity(64);
                            g.scope(|| {
                                for _ in 0..64 {
                                    let size = 1 + rng.below(700) as usize;
                                    let layout = Layout::from_size_align(size, 8).unwrap();
                                    // SAFETY: a non-zero size.
                                    let p = unsafe { alloc(layout) };
                                    assert!(!p.is_null());
                                    mine.push((p as usize, layout));
                                }
                            });
                            let theirs = mine.split_off(32);
                            next.send(theirs).unwrap();
                            for (p, l) in mine {
                                // SAFETY: live, with this layout.
                                unsafe { dealloc(p as *mut u8, l) };
                            }
                            while let Ok(blocks) = rx.try_recv() {
                                for (p, l) in blocks {
                                    // SAFETY: handed over whole by their maker.
                                    unsafe { dealloc(p as *mut u8, l) };
                                }
                            }
                            g.remove().unwrap();
                        }
                        drop(next);
                        for blocks in rx {
                            for (p, l) in blocks {
                                // SAFETY: as above.
                                unsafe { dealloc(p as *mut u8, l) };
                            }
                        }
                        drain_thread();
                    });
                }
                drop(senders);
            });
            // The threads' exit guards may run after `scope` returns: each drained
            // its reserve above.
            assert_eq!(settled(&parent), 0);
            assert_eq!(parent.events().underflow, 0);
            // 1,200 groups, at most `MAX_HEAPS`: those whose blocks were all freed
            // passed theirs on (how many were alive at once depends on how far the
            // threads ran apart; past the last, the rest had headers).
            assert!(ALLOC.heaps().made <= splitcount::alloc::MAX_HEAPS);
        }

        /// The point of the design: a block of every size to 1 KiB (and
        /// larger ones, up to 32 MiB) takes the inner allocator's own
        /// class for its size — a multiple of 16 takes that size, where an
        /// 8-byte header moves it up a class — and lies in the group's
        /// heap, not the allocator's default one.
        #[test]
        fn blocks_carry_no_tag_and_take_the_allocators_own_class() {
            let _s = serial();
            let g = fresh("untagged");
            let mut blocks = Vec::with_capacity(1030);
            g.scope(|| {
                for size in (1..=1024).chain([5000, 70_000, 32 << 20]) {
                    let layout = Layout::from_size_align(size, 8).unwrap();
                    // SAFETY: a non-zero size.
                    let p = unsafe { alloc(layout) };
                    assert!(!in_main_heap(p), "{size} B: made with a header");
                    // SAFETY: live.
                    assert_eq!(unsafe { usable(p) }, class(layout), "{size} B");
                    blocks.push((p, layout));
                }
            });
            assert_eq!(settled(&g), total(&blocks));
            free_all(blocks);
            assert_eq!(settled(&g), 0);
        }

        /// Over-aligned blocks lie in the group's heap, aligned, in the
        /// class `class` says.
        #[test]
        fn over_aligned_blocks_lie_in_the_groups_heap_in_their_class() {
            let _s = serial();
            let g = fresh("aligned-heap");
            let mut blocks = Vec::with_capacity(500);
            g.scope(|| {
                for (size, align) in [(100, 4096), (64, 64), (16, 16), (200, 64), (8, 32)] {
                    for _ in 0..100 {
                        let layout = Layout::from_size_align(size, align).unwrap();
                        // SAFETY: a non-zero size.
                        let p = unsafe { alloc(layout) };
                        assert!(!in_main_heap(p) && p as usize % align == 0);
                        // SAFETY: live.
                        assert_eq!(unsafe { usable(p) }, class(layout), "{size} B at {align}");
                        blocks.push((p, layout));
                    }
                }
            });
            assert_eq!(settled(&g), total(&blocks));
            free_all(blocks);
            assert_eq!(settled(&g), 0);
        }
    };
}
