//! rseq per-CPU adds under everything that aborts a critical section:
//! migration (re-pinning), preemption (8 threads on 2 cores), signals (whose
//! handler adds too), and threads that start and exit during the run. The
//! sums after join are exact, for CPU-id and concurrency-id arenas.

#![cfg(not(loom))]

mod common;

use common::{online_cpu_ids, pin_to, unpin, Migrator, Rng};
use splitcount::counter::{Config, Design, SplitCounter};
use splitcount::cpu::Machine;
use splitcount::raw::percpu::{rseq_available, AddPath, Arena, ArenaOptions, PerCpu, SlotIndex};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

const HANDLER_DELTA: i64 = 1_000;
/// Forced migrations each stress run aims for, and the most time it takes.
const MIGRATIONS: u64 = 20_000;
const STRESS_LIMIT: std::time::Duration = std::time::Duration::from_secs(4);

/// What the signal handler adds to: one per-CPU slot and two counters.
struct Targets {
    slots: PerCpu,
    tree: Box<dyn SplitCounter>,
    batched: Box<dyn SplitCounter>,
    handled: AtomicI64,
}

static TARGETS: OnceLock<Mutex<Option<Arc<Targets>>>> = OnceLock::new();
static CURRENT: OnceLock<AtomicPtrTargets> = OnceLock::new();

/// The handler cannot take a lock: it reads a raw pointer published before
/// any signal is sent and retracted after the last one.
struct AtomicPtrTargets(std::sync::atomic::AtomicPtr<Targets>);

extern "C" fn on_signal(_: libc::c_int) {
    let Some(cur) = CURRENT.get() else { return };
    let p = cur.0.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: the pointer is published (Release) while the Arc it came from
    // is alive, and retracted before that Arc is dropped.
    if let Some(t) = unsafe { p.as_ref() } {
        t.slots.add(0, HANDLER_DELTA).unwrap();
        t.tree.add(HANDLER_DELTA);
        t.batched.add(HANDLER_DELTA);
        t.handled.fetch_add(1, Relaxed);
    }
}

fn install_handler() {
    // SAFETY: a plain handler for SIGUSR1 with SA_RESTART; it only does
    // atomic and rseq operations.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
    }
}

fn hammer(options: ArenaOptions) {
    let _serial = TARGETS
        .get_or_init(|| Mutex::new(None))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    install_handler();
    let arena = Arena::with_options(&Machine::host(), &options).unwrap();
    if options.add_path != AddPath::Atomic && rseq_available(options.index) {
        assert_eq!(arena.add_path(), AddPath::Rseq);
    }
    let counters = Arena::with_options(
        &Machine::host(),
        &ArenaOptions {
            add_path: options.add_path,
            ..Default::default()
        },
    )
    .unwrap();
    let t = Arc::new(Targets {
        slots: arena.alloc(1).unwrap(),
        tree: Config::new(Design::Tree)
            .batch(8)
            .arena(&counters)
            .build()
            .unwrap(),
        batched: Config::new(Design::Batched)
            .batch(8)
            .arena(&counters)
            .build()
            .unwrap(),
        handled: AtomicI64::new(0),
    });
    let cur = CURRENT.get_or_init(|| AtomicPtrTargets(Default::default()));
    cur.0.store(
        Arc::as_ptr(&t) as *mut Targets,
        std::sync::atomic::Ordering::Release,
    );

    let online = Arc::new(online_cpu_ids());
    let alive: Arc<Mutex<Vec<libc::pthread_t>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));

    // The signaller: SIGUSR1 to every live adder, continuously.
    let signaller = {
        let (alive, stop) = (alive.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut sent = 0u64;
            while !stop.load(Relaxed) {
                let a = alive.lock().unwrap();
                for &tid in a.iter() {
                    // SAFETY: `tid` is a live thread: adders leave `alive`
                    // (under this lock) before they exit.
                    unsafe { libc::pthread_kill(tid, libc::SIGUSR1) };
                    sent += 1;
                }
                drop(a);
                std::thread::yield_now();
            }
            sent
        })
    };

    let adder = |seed: u64, adds: usize| {
        let (t, online, alive) = (t.clone(), online.clone(), alive.clone());
        std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            let me = unsafe { libc::pthread_self() };
            // The thread's first per-CPU add may register its rseq area
            // (where glibc did not), which arms a TLS destructor — and glibc
            // allocates for that: done in the handler while this thread was
            // inside malloc, it deadlocked on malloc's lock (and every thread
            // of the process that allocated after). Register before any
            // signal can come.
            t.slots.add(0, 0).unwrap();
            alive.lock().unwrap().push(me);
            let mut rng = Rng::new(seed);
            let mut sum = 0i64;
            for i in 0..adds {
                if i % 2_000 == 0 {
                    pin_to(online[rng.below(online.len() as u64) as usize]);
                }
                let d = rng.delta(50);
                t.slots.add(0, d).unwrap();
                t.tree.add(d);
                t.batched.add(d);
                sum += d;
            }
            unpin(&online);
            alive.lock().unwrap().retain(|&x| x != me);
            sum
        })
    };

    // 8 long-lived adders, and waves of short-lived ones starting and exiting.
    let long: Vec<_> = (0..8).map(|i| adder(i, 300_000)).collect();
    let mut expected = 0i64;
    for wave in 0..20u64 {
        let short: Vec<_> = (0..4).map(|i| adder(1000 + wave * 4 + i, 5_000)).collect();
        expected += short.into_iter().map(|h| h.join().unwrap()).sum::<i64>();
    }
    expected += long.into_iter().map(|h| h.join().unwrap()).sum::<i64>();
    stop.store(true, Relaxed);
    let sent = signaller.join().unwrap();
    cur.0
        .store(std::ptr::null_mut(), std::sync::atomic::Ordering::Release);

    let handled = t.handled.load(Relaxed);
    let want = expected + handled * HANDLER_DELTA;
    println!(
        "{options:?}: {sent} signals sent, {handled} handled, path {:?}",
        arena.add_path()
    );
    assert!(handled > 0, "the handler must have run during adds");
    assert_eq!(t.slots.sum(0), Some(want), "per-CPU slot");
    assert_eq!(t.tree.precise(), want, "tree");
    assert_eq!(t.batched.precise(), want, "batched");
    assert!(t.tree.accuracy().admits(t.tree.approximate(), want));
    assert!(t.batched.accuracy().admits(t.batched.approximate(), want));
}

#[test]
fn no_update_is_lost_under_migration_preemption_signals_and_thread_churn_cpu_id() {
    hammer(ArenaOptions::default());
}

#[test]
fn no_update_is_lost_under_migration_preemption_signals_and_thread_churn_mm_cid() {
    hammer(ArenaOptions {
        index: SlotIndex::MmCid,
        ..Default::default()
    });
}

#[test]
fn no_update_is_lost_when_concurrency_ids_exceed_the_regions() {
    hammer(ArenaOptions {
        index: SlotIndex::MmCid,
        regions: Some(1),
        ..Default::default()
    });
}

#[test]
fn the_atomic_path_survives_the_same_abuse() {
    hammer(ArenaOptions {
        add_path: AddPath::Atomic,
        ..Default::default()
    });
}

#[test]
fn rseq_and_atomic_paths_give_identical_results_on_one_sequence() {
    let online = online_cpu_ids();
    std::thread::spawn(move || {
        assert!(pin_to(online[online.len() - 1]), "pin");
        let make = |add_path| {
            let arena = Arena::with_options(
                &Machine::host(),
                &ArenaOptions {
                    add_path,
                    ..Default::default()
                },
            )
            .unwrap();
            let slots = arena.alloc(3).unwrap();
            let tree = Config::new(Design::Tree)
                .batch(4)
                .arena(&arena)
                .build()
                .unwrap();
            let batched = Config::new(Design::Batched)
                .batch(16)
                .arena(&arena)
                .build()
                .unwrap();
            (arena, slots, tree, batched)
        };
        let (ra, rs, rt, rb) = make(AddPath::Rseq);
        let (aa, as_, at, ab) = make(AddPath::Atomic);
        assert_eq!(aa.add_path(), AddPath::Atomic);
        if rseq_available(SlotIndex::CpuId) {
            assert_eq!(ra.add_path(), AddPath::Rseq);
        }
        let mut rng = Rng::new(42);
        for _ in 0..50_000 {
            let i = rng.below(3) as usize;
            let d = rng.delta(40);
            assert_eq!(rs.add(i, d).unwrap(), as_.add(i, d).unwrap());
            rt.add(d);
            at.add(d);
            rb.add(d);
            ab.add(d);
            assert_eq!(
                (rt.approximate(), rt.precise()),
                (at.approximate(), at.precise())
            );
            assert_eq!(
                (rb.approximate(), rb.precise()),
                (ab.approximate(), ab.precise())
            );
        }
        for i in 0..3 {
            for c in 0..rs.cpus() {
                assert_eq!(rs.get(c, i), as_.get(c, i), "slot {i} of CPU {c}");
            }
            assert_eq!(rs.overflow(i), Some(0));
        }
    })
    .join()
    .unwrap();
}

#[test]
fn remote_updates_in_an_rseq_arena_land_in_the_overflow_copy() {
    let arena = Arena::host();
    let p = arena.alloc(1).unwrap();
    p.add_on(0, 0, 7).unwrap();
    assert_eq!(p.sum(0), Some(7));
    if arena.add_path() == AddPath::Rseq {
        assert_eq!(p.overflow(0), Some(7));
        assert_eq!(p.get(0, 0), Some(0), "CPU 0's own copy belongs to CPU 0");
    } else {
        assert_eq!(p.get(0, 0), Some(7));
    }
}

#[test]
fn child_reports_its_percpu_path() {
    if std::env::var_os("SPLITCOUNT_TEST_CHILD").is_none() {
        return;
    }
    let arena = Arena::host();
    let p = arena.alloc(1).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..100_000 {
                    p.add(0, 1).unwrap();
                }
            });
        }
    });
    assert_eq!(p.sum(0), Some(400_000));
    println!(
        "\nPATH {:?} {:?}",
        arena.add_path(),
        splitcount::raw::cpu_id::rseq_owner()
    );
}

#[test]
fn without_glibc_rseq_we_register_our_own_and_still_use_rseq_adds() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reports_its_percpu_path", "--nocapture"])
        .env("SPLITCOUNT_TEST_CHILD", "1")
        .env("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PATH "))
        .expect("child printed its path");
    println!("glibc rseq disabled: {line}");
    if rseq_available(SlotIndex::CpuId) {
        // The kernel has rseq, so our own registration must take over.
        assert_eq!(line, "Rseq Splitcount");
    } else {
        assert!(line.starts_with("Atomic"));
    }
}

#[test]
fn forcing_the_atomic_path_process_wide() {
    if std::env::var_os("SPLITCOUNT_TEST_CHILD").is_some() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_reports_its_percpu_path", "--nocapture"])
        .env("SPLITCOUNT_TEST_CHILD", "1")
        .env("SPLITCOUNT_PERCPU_ADD", "atomic")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("PATH Atomic"), "{stdout}");
}

/// Adders moved between CPUs by *another* thread (so a move can land between
/// any two instructions of a critical section, not only where the adder
/// re-pins itself), more adders than CPUs (so they preempt each other on
/// every CPU): per-CPU slots and the counters built on them stay exact. A
/// sequence that read the CPU id before it was armed would store into the
/// copy of a CPU it had left, racing that CPU's own adders, and lose adds.
#[test]
fn adds_stay_exact_while_another_thread_migrates_the_adders() {
    for index in [SlotIndex::CpuId, SlotIndex::MmCid] {
        let options = ArenaOptions {
            index,
            ..Default::default()
        };
        let arena = Arena::with_options(&Machine::host(), &options).unwrap();
        let slots = arena.alloc(1).unwrap();
        let tree = Config::new(Design::Tree).batch(4).build().unwrap();
        let batched = Config::new(Design::Batched).batch(8).build().unwrap();
        let migrator = Migrator::start();
        let start = std::time::Instant::now();
        let expected: i64 = std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|seed| {
                    let (slots, tree, batched, migrator) = (&slots, &tree, &batched, &migrator);
                    s.spawn(move || {
                        let _moved = migrator.register();
                        let mut rng = Rng::new(seed + 77);
                        let mut sum = 0i64;
                        while migrator.keep_going(MIGRATIONS, start, STRESS_LIMIT) {
                            for _ in 0..1_000 {
                                let d = rng.delta(9);
                                slots.add(0, d).unwrap();
                                tree.add(d);
                                batched.add(d);
                                sum += d;
                            }
                        }
                        sum
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        });
        let moves = migrator.stop();
        println!(
            "{index:?}: {moves} migrations forced, path {:?}",
            arena.add_path()
        );
        assert!(moves > 0, "the migrator must have moved the adders");
        assert_eq!(slots.sum(0), Some(expected), "per-CPU slot ({index:?})");
        assert_eq!(tree.precise(), expected, "tree");
        assert_eq!(batched.precise(), expected, "batched");
    }
}

/// glibc's rseq area of the calling thread (x86_64), if glibc registered
/// one: `(area, size glibc registered it with)`.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn glibc_rseq_area() -> Option<(*mut u8, u32)> {
    // SAFETY: dlsym only reads symbol tables; the symbols are glibc's
    // `const ptrdiff_t __rseq_offset` and `const unsigned int __rseq_size`.
    unsafe {
        let off = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_offset".as_ptr());
        let size = libc::dlsym(libc::RTLD_DEFAULT, c"__rseq_size".as_ptr());
        if off.is_null() || size.is_null() || *(size as *const u32) == 0 {
            return None;
        }
        let tp: usize;
        std::arch::asm!("mov {}, fs:0", out(reg) tp, options(nostack, readonly, preserves_flags));
        Some((
            tp.wrapping_add_signed(*(off as *const isize)) as *mut u8,
            *(size as *const u32),
        ))
    }
}

/// Unregister glibc's rseq area for the calling thread (threads it creates
/// then start unregistered too: glibc copies the state). True on success.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn unregister_glibc_rseq() -> bool {
    let Some((area, size)) = glibc_rseq_area() else {
        return false;
    };
    // glibc registers 32 bytes (older releases) or its feature size; the
    // kernel wants the registered length back.
    [32, size].into_iter().any(|len| {
        // SAFETY: unregistering this thread's own area with glibc's
        // signature; the area stays valid (it is in the thread's TCB).
        unsafe { libc::syscall(libc::SYS_rseq, area, len, 1, 0x5305_3053u32) == 0 }
    })
}

/// A thread that unregistered its rseq area still reads an `mm_cid` of 0
/// (the kernel resets `cpu_id` to −1 but leaves `mm_cid`), and its critical
/// sections are never restarted: every add must check registration and take
/// the atomic path. The threads it creates inherit the unregistered state.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn unregistered_threads_never_lose_adds_in_concurrency_id_arenas() {
    if !rseq_available(SlotIndex::MmCid) || glibc_rseq_area().is_none() {
        println!("skipped: needs glibc's rseq registration and mm_cid");
        return;
    }
    let arena = Arena::with_options(
        &Machine::host(),
        &ArenaOptions {
            index: SlotIndex::MmCid,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(arena.add_path(), AddPath::Rseq);
    let slots = Arc::new(arena.alloc(1).unwrap());
    const ADDS: i64 = 2_000_000;
    let parent = {
        let slots = slots.clone();
        std::thread::spawn(move || {
            if !unregister_glibc_rseq() {
                return None;
            }
            // SAFETY: a volatile read of this thread's area (cpu_id field).
            let cpu_id = unsafe {
                std::ptr::read_volatile(glibc_rseq_area().unwrap().0.add(4) as *const u32)
            };
            assert_eq!(cpu_id, u32::MAX, "the kernel marks the area uninitialized");
            let children: Vec<_> = (0..3)
                .map(|_| {
                    let slots = slots.clone();
                    std::thread::spawn(move || {
                        for _ in 0..ADDS {
                            slots.add(0, 1).unwrap();
                        }
                    })
                })
                .collect();
            for _ in 0..ADDS {
                slots.add(0, 1).unwrap();
            }
            for c in children {
                c.join().unwrap();
            }
            Some(())
        })
    };
    if parent.join().unwrap().is_none() {
        println!("skipped: could not unregister glibc's rseq area");
        return;
    }
    assert_eq!(slots.sum(0), Some(4 * ADDS), "no add may be lost");
}
