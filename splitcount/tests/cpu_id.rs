//! The current-CPU id: always in range, equal to the scheduler's answer when
//! the thread is pinned, and each fallback source reports itself.

mod common;

use common::{online_cpu_ids, pin_to, unpin};
use splitcount::cpu::{self, CpuIdSource, Topology};
use splitcount::raw::cpu_id::{self, RseqOwner};
use std::process::Command;

#[test]
fn the_cpu_index_is_always_below_the_possible_cpu_count() {
    let cpus = Topology::host().cpus();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..100_000 {
                    assert!(cpu::current_cpu() < cpus);
                }
            });
        }
    });
}

#[test]
fn a_pinned_thread_reads_the_cpu_it_is_pinned_to() {
    let online = online_cpu_ids();
    std::thread::spawn(move || {
        let mut pinned_any = false;
        for &id in &online {
            if !pin_to(id) {
                continue;
            }
            pinned_any = true;
            assert_eq!(
                cpu_id::current_cpu_id(),
                id,
                "source {:?}",
                cpu_id::cpu_id_source()
            );
            assert_eq!(cpu_id::sched_getcpu(), Some(id));
            assert_eq!(cpu_id::getcpu_syscall(), Some(id));
            let dense = Topology::host().dense_index(id).unwrap();
            assert_eq!(cpu::current_cpu(), dense);
        }
        unpin(&online);
        assert!(pinned_any, "could pin to none of {online:?}");
    })
    .join()
    .unwrap();
}

#[test]
fn the_concurrency_id_is_below_the_cpu_count_when_the_kernel_provides_it() {
    if !cpu_id::mm_cid_available() {
        assert_eq!(cpu_id::mm_cid(), None);
        return;
    }
    let cpus = Topology::host().cpus() as u32;
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..10_000 {
                    assert!(cpu_id::mm_cid().unwrap() < cpus);
                }
            });
        }
    });
}

/// Run this test binary again, only `child_prints_its_cpu_id_source`, with
/// extra environment, and return what the child reported.
fn source_in_child(env: &[(&str, &str)]) -> (String, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_prints_its_cpu_id_source",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SPLITCOUNT_TEST_CHILD", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("SOURCE ").map(|(_, rest)| rest))
        .expect("child printed its source")
        .to_owned();
    let (source, owner) = line.split_once(' ').unwrap();
    (source.to_owned(), owner.to_owned())
}

#[test]
fn child_prints_its_cpu_id_source() {
    if std::env::var_os("SPLITCOUNT_TEST_CHILD").is_none() {
        return; // only meaningful when run by `source_in_child`
    }
    let source = cpu_id::cpu_id_source();
    // Whatever the source, the id must agree with the scheduler when pinned.
    let online = online_cpu_ids();
    if pin_to(online[0]) {
        assert_eq!(cpu_id::current_cpu_id(), online[0]);
    }
    // Threads that register an area (own-rseq) and exit must unregister it
    // cleanly: the kernel would otherwise write into freed TLS.
    for _ in 0..4 {
        let handles: Vec<_> = (0..8)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| cpu::current_cpu()).max()))
            .collect();
        for h in handles {
            assert!(h.join().unwrap().unwrap() < splitcount::cpu::Topology::host().cpus());
        }
    }
    println!("SOURCE {} {:?}", source.name(), cpu_id::rseq_owner());
}

#[test]
fn without_glibc_rseq_we_register_our_own_area_or_fall_back() {
    let (source, owner) = source_in_child(&[("GLIBC_TUNABLES", "glibc.pthread.rseq=0")]);
    // Where the kernel supports rseq (this machine's does) we register; the
    // test states which happened so a CI log shows it.
    println!("glibc rseq disabled: source {source}, area registered by {owner}");
    match source.as_str() {
        "own-rseq" => assert_eq!(owner, format!("{:?}", RseqOwner::Splitcount)),
        "sched-getcpu" => assert_eq!(owner, format!("{:?}", RseqOwner::None)),
        other => panic!("unexpected source {other} with glibc's rseq disabled"),
    }
    if cpu_id::cpu_id_source() == CpuIdSource::GlibcRseq {
        assert_eq!(
            source, "own-rseq",
            "the kernel has rseq, so registration must work"
        );
    }
}

#[test]
fn forcing_sched_getcpu_and_thread_index_is_honoured() {
    let (source, owner) = source_in_child(&[("SPLITCOUNT_CPU_ID_SOURCE", "sched-getcpu")]);
    assert_eq!((source.as_str(), owner.as_str()), ("sched-getcpu", "None"));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_thread_index_is_stable", "--nocapture"])
        .env("SPLITCOUNT_TEST_CHILD", "1")
        .env("SPLITCOUNT_CPU_ID_SOURCE", "thread-index")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("THREAD-INDEX OK"));
}

#[test]
fn child_thread_index_is_stable() {
    if std::env::var_os("SPLITCOUNT_TEST_CHILD").is_none() {
        return;
    }
    assert_eq!(cpu_id::cpu_id_source(), CpuIdSource::ThreadIndex);
    let first = cpu::current_cpu();
    for _ in 0..1000 {
        assert_eq!(cpu::current_cpu(), first, "a thread keeps its index");
    }
    println!("THREAD-INDEX OK");
}
