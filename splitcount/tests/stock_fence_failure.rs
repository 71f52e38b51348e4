//! A process whose `membarrier` starts failing after its stocks were made —
//! it entered a seccomp sandbox, say. The rseq stock can no longer fence
//! other CPUs' sequences, so it must leave rseq mode rather than drain
//! unfenced: each block whose fence fails is sealed (its lock word keeps
//! the sequences out for good; operations take the lock instead). Workers
//! charge and uncharge through the stock, moved between CPUs from another
//! thread, while a drainer empties every CPU's stock; halfway through, a
//! seccomp filter makes `membarrier` fail with `EPERM` for every thread.
//! At the end the usage is exactly what the workers hold (zero), no
//! uncharge found too little, and the stock says it left rseq mode.
//!
//! A test binary of its own: the filter cannot be taken back, and applies
//! to the whole process.

#![cfg(all(not(loom), target_os = "linux", target_arch = "x86_64"))]

mod common;

use common::{Migrator, Rng};
use splitcount::group::{Hierarchy, HierarchyConfig};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const MOVES: u64 = 2_000;
const LIMIT: Duration = Duration::from_secs(6);

/// Make `membarrier` fail with `EPERM` in every thread of the process
/// (`seccomp` with `SECCOMP_FILTER_FLAG_TSYNC`). `false` where the kernel
/// refuses the filter.
fn forbid_membarrier() -> bool {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    let stmt = |code, k| libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    };
    let mut filter = [
        // The syscall number: `seccomp_data.nr`, at offset 0.
        stmt(LD_W_ABS, 0),
        libc::sock_filter {
            code: JEQ_K,
            jt: 0,
            jf: 1,
            k: libc::SYS_membarrier as u32,
        },
        stmt(RET_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(RET_K, libc::SECCOMP_RET_ALLOW),
    ];
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filter`, both alive for the calls; the
    // kernel copies the program.
    unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_TSYNC,
                &prog as *const libc::sock_fprog,
            ) == 0
    }
}

fn membarrier_works() -> bool {
    // MEMBARRIER_CMD_QUERY: 0 arguments, a bit mask of the commands.
    // SAFETY: no pointers.
    unsafe { libc::syscall(libc::SYS_membarrier, 0, 0, 0) >= 0 }
}

#[test]
fn a_stock_whose_fences_start_failing_falls_back_to_locks_and_loses_nothing() {
    if common::online_cpu_ids().len() < 2 {
        eprintln!("skipped: one CPU, no other CPU's sequences to fence");
        return;
    }
    let h = Hierarchy::new(HierarchyConfig::default().stock_batch(16).stock_slots(2)).unwrap();
    let g = h.root().child("g").unwrap();
    g.charge(1).unwrap();
    g.uncharge(1);
    if !h.uses_rseq_stock() {
        eprintln!("skipped: the stock is not in rseq mode on this host");
        return;
    }
    let migrator = Migrator::start();
    let done = AtomicBool::new(false);
    let forbidden = AtomicBool::new(false);
    let drains = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !done.load(Relaxed) {
                h.drain_stocks();
                n += 1;
                if n == 200 {
                    assert!(membarrier_works());
                    assert!(forbid_membarrier(), "seccomp refused the filter");
                    assert!(!membarrier_works());
                    forbidden.store(true, Relaxed);
                }
                drains.store(n, Relaxed);
            }
        });
        let workers: Vec<_> = (0..3u64)
            .map(|t| {
                let (g, migrator) = (&g, &migrator);
                s.spawn(move || {
                    let _moved = migrator.register();
                    let mut rng = Rng::new(t + 1);
                    let mut held = 0u64;
                    while migrator.keep_going(MOVES, start, LIMIT) {
                        common::churn(g, &mut rng, &mut held);
                    }
                    g.uncharge(held);
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        done.store(true, Relaxed);
    });
    let moves = migrator.stop();
    h.drain_stocks();
    assert!(forbidden.load(Relaxed), "the filter was never installed");
    assert_eq!(g.events().underflow, 0, "an uncharge found too little");
    assert_eq!(g.usage(), 0, "units were lost or counted twice");
    assert!(moves > 100, "only {moves} moves");
    let activity = h.stock_activity();
    assert!(
        activity.sealed > 0,
        "no block left rseq mode after the fences failed: {activity:?}"
    );
    assert!(!h.uses_rseq_stock(), "the stock still says rseq");
    // A stock made now starts in lock mode.
    let fresh = Hierarchy::default();
    assert!(!fresh.uses_rseq_stock());
    let f = fresh.root().child("f").unwrap();
    f.charge(5).unwrap();
    f.uncharge(5);
    fresh.drain_stocks();
    assert_eq!(f.usage(), 0);
}
