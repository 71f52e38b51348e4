//! `bench cpu-id`: what it costs to ask "which CPU am I on?" with each source
//! available here, against the raw `getcpu` system call.

use super::{measure, set_ratios, Record};
use splitcount::cpu;
use std::hint::black_box;
use std::time::Duration;

/// The baseline every case is divided by.
pub const BASELINE: &str = "getcpu-syscall";

/// Measure every id source available on this machine at each thread count.
pub fn run(threads: &[usize], duration: Duration) -> Vec<Record> {
    type Source = fn() -> Option<u32>;
    let mut cases: Vec<(&str, Source)> = Vec::new();
    if cpu::rseq_cpu_id().is_some() {
        cases.push(("rseq-area", cpu::rseq_cpu_id));
    }
    if cpu::sched_getcpu().is_some() {
        cases.push(("sched-getcpu", cpu::sched_getcpu));
    }
    if cpu::getcpu_syscall().is_some() {
        cases.push((BASELINE, cpu::getcpu_syscall));
    }
    cases.push(("current-cpu", || Some(cpu::current_cpu() as u32)));

    let mut records = Vec::new();
    for &t in threads {
        for &(name, source) in &cases {
            records.push(measure("cpu-id", name, t, duration, |_| {
                move || {
                    black_box(source());
                }
            }));
        }
    }
    set_ratios(&mut records, BASELINE);
    records
}
