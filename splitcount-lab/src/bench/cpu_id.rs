//! `bench cpu-id`: what it costs to ask "which CPU am I on?" with each source
//! available here, against the raw `getcpu` system call.

use super::{Bench, Entry};
use crate::timing::{measure, Plan};
use splitcount::cpu;
use splitcount::raw::cpu_id;
use std::hint::black_box;

/// The baseline every case is divided by.
pub const BASELINE: &str = "getcpu-syscall";

/// Measure every id source available on this machine at each thread count.
pub fn run(threads: &[usize], plan: &Plan) -> Result<Bench, String> {
    type Source = fn() -> Option<u32>;
    let mut cases: Vec<(&str, Source)> = Vec::new();
    if cpu_id::rseq_cpu_id().is_some() {
        cases.push(("rseq-area", cpu_id::rseq_cpu_id));
    }
    if cpu_id::sched_getcpu().is_some() {
        cases.push(("sched-getcpu", cpu_id::sched_getcpu));
    }
    if cpu_id::getcpu_syscall().is_some() {
        cases.push((BASELINE, cpu_id::getcpu_syscall));
    }
    cases.push(("current-cpu", || Some(cpu::current_cpu() as u32)));

    let mut entries = Vec::new();
    for &t in threads {
        for &(name, source) in &cases {
            entries.push(Entry::new(name, t, move |_| {
                move || {
                    black_box(source());
                }
            }));
        }
    }
    let measured = measure("cpu-id", plan, entries)?;
    Ok(Bench::new(measured, |_| Some(BASELINE.to_owned())))
}
