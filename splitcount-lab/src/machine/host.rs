//! What the machine is beyond its topology: the CPU model, whether it runs
//! under a hypervisor or in a container, whether hardware performance
//! counters can be read, and whether the CPUs two threads get pinned to
//! share a core. The report shows these first, because they decide how
//! far its figures carry: a 2-vCPU guest on a shared host is not a
//! 64-core server.

use crate::timing::pin;

/// The CPU's vendor and model, from `/proc/cpuinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuModel {
    /// `vendor_id` (x86: `GenuineIntel`, `AuthenticAMD`), or `CPU
    /// implementer` on Arm; "unknown" otherwise.
    pub vendor: String,
    /// `model name` with family and model numbers where given.
    pub model: String,
}

/// The first value of `key` in `/proc/cpuinfo`-style `text`.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// Vendor and model from the text of `/proc/cpuinfo`.
pub fn cpu_model_from(cpuinfo: &str) -> CpuModel {
    let vendor = field(cpuinfo, "vendor_id")
        .or_else(|| field(cpuinfo, "CPU implementer"))
        .unwrap_or("unknown")
        .to_owned();
    let name = field(cpuinfo, "model name")
        .or_else(|| field(cpuinfo, "Processor"))
        .unwrap_or("unknown");
    let model = match (field(cpuinfo, "cpu family"), field(cpuinfo, "model")) {
        (Some(f), Some(m)) => format!("{name} (family {f}, model {m})"),
        _ => name.to_owned(),
    };
    CpuModel { vendor, model }
}

/// This machine's CPU vendor and model.
pub fn cpu_model() -> CpuModel {
    cpu_model_from(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

/// Whether the lab runs virtualised, and under what, as far as it can
/// tell: the CPU's `hypervisor` flag, the hypervisor's CPUID signature,
/// DMI's system vendor, a container marker.
pub fn virtualization() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flagged =
        field(&cpuinfo, "flags").is_some_and(|f| f.split_whitespace().any(|x| x == "hypervisor"));
    let mut parts = Vec::new();
    if flagged {
        parts.push(match hypervisor_signature() {
            Some(sig) => format!("virtual machine (hypervisor signature {sig:?})"),
            None => "virtual machine (CPU flag `hypervisor`)".to_owned(),
        });
    }
    let dmi = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/dmi/id/{f}"))
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    if let (Some(vendor), product) = (dmi("sys_vendor"), dmi("product_name")) {
        parts.push(format!(
            "system {vendor}{}",
            product.map_or_else(String::new, |p| format!(" {p}"))
        ));
    }
    if std::path::Path::new("/.dockerenv").exists()
        || std::path::Path::new("/run/.containerenv").exists()
    {
        parts.push("in a container".to_owned());
    }
    if parts.is_empty() {
        "none detected".to_owned()
    } else {
        parts.join("; ")
    }
}

/// The hypervisor's vendor signature (CPUID leaf 0x40000000), e.g.
/// `KVMKVMKVM`, if there is one.
#[cfg(target_arch = "x86_64")]
fn hypervisor_signature() -> Option<String> {
    // SAFETY: CPUID exists on every x86_64 CPU; leaf 0x40000000 is reserved
    // for hypervisors and reads as zeros or garbage-free text otherwise.
    #[allow(unused_unsafe)]
    let r = unsafe { std::arch::x86_64::__cpuid(0x4000_0000) };
    let bytes: Vec<u8> = [r.ebx, r.ecx, r.edx]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let sig: String = bytes
        .iter()
        .take_while(|&&b| b != 0)
        .map(|&b| b as char)
        .collect();
    let sig = sig.trim().to_owned();
    (!sig.is_empty() && sig.chars().all(|c| c.is_ascii_graphic() || c == ' ')).then_some(sig)
}

#[cfg(not(target_arch = "x86_64"))]
fn hypervisor_signature() -> Option<String> {
    None
}

/// Whether a hardware performance counter (CPU cycles, this thread, user
/// space) can be opened, and if not, why.
pub fn perf_counters() -> String {
    match hardware_counter(0) {
        Ok(()) => "available (CPU cycles can be counted)".to_owned(),
        Err(why) => why,
    }
}

/// Open (and close) the hardware counter `config` (`PERF_COUNT_HW_*`:
/// 0 CPU cycles, 3 cache misses) for this thread in user space, or say in
/// words why it cannot be opened.
pub fn hardware_counter(config: u64) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    {
        // `struct perf_event_attr`, zeroed: type (u32) at byte 0, size
        // (u32) at 4, config (u64) at 8, flag bits at 40.
        let mut attr = [0u64; 16];
        const PERF_TYPE_HARDWARE: u64 = 0;
        const SIZE: u64 = 128;
        attr[0] = PERF_TYPE_HARDWARE | (SIZE << 32);
        attr[1] = config;
        // disabled (bit 0), exclude_kernel (5), exclude_hv (6)
        attr[5] = 1 | 1 << 5 | 1 << 6;
        // SAFETY: `attr` is a zeroed perf_event_attr of the size it states;
        // pid 0 / cpu -1: this thread on any CPU; no group, no flags.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                attr.as_ptr(),
                0 as libc::pid_t,
                -1 as libc::c_int,
                -1 as libc::c_int,
                0 as libc::c_ulong,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just opened by us and is closed once.
            unsafe { libc::close(fd as libc::c_int) };
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "?".into());
        Err(match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV) => {
                "not available (no hardware PMU exposed: common in virtual machines)".to_owned()
            }
            Some(libc::EACCES) | Some(libc::EPERM) => {
                format!("not permitted (perf_event_paranoid = {paranoid})")
            }
            Some(libc::ENOSYS) => "not available (no perf_event_open system call)".to_owned(),
            _ => format!("not available ({err})"),
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = config;
        Err("not available (not Linux)".to_owned())
    }
}

/// Where two threads of a measurement are pinned, and whether those CPUs
/// are hyperthread siblings (which decides the Tree target's bound).
pub fn two_thread_placement() -> String {
    match pin::placement(2) {
        Some(p) if p.shares_core == Some(false) => format!(
            "{}: distinct cores, as this system's thread_siblings_list says (a hypervisor \
             may still back two vCPUs with one core's hyperthreads)",
            p.cpus
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        Some(p) => p.describe(),
        None => "one CPU only: two threads cannot be pinned apart".to_owned(),
    }
}

/// How long a cache line takes to go from one pinned CPU to the other and
/// back, in ns: two threads on [`pin::placement`]`(2)` take turns
/// incrementing one atomic, each waiting to see the other's increment,
/// for about 20 ms in bursts of 256 round trips; the median burst. (A burst
/// during which a thread was preempted is slow; the median leaves it out.)
/// `None` with fewer than two CPUs.
///
/// On a virtual machine this depends on where the host runs the two vCPUs
/// (two hyperthreads of one core, two cores sharing a cache, two chiplets)
/// and can change while the lab runs; every contended figure (a shared
/// atomic at 2 threads, a Tree's carries) moves with it. The report
/// measures it at its start and at its end.
pub fn line_round_trip_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    const BURST: u64 = 256;
    let cpus = pin::placement(2)?.cpus;
    let (first, second) = (cpus[0], cpus[1]);
    let line = crossbeam_utils::CachePadded::new(AtomicU64::new(0));
    let done = AtomicBool::new(false);
    let bursts = std::thread::scope(|s| {
        let (line, done) = (&line, &done);
        let responder = s.spawn(move || {
            pin::pin_current(second);
            // Acquire/Release: each increment hands the turn over; no other
            // data rides on it, but the pairing keeps the hand-off a real
            // round trip on any architecture.
            loop {
                let v = line.load(Ordering::Acquire);
                if v % 2 == 1 {
                    line.store(v + 1, Ordering::Release);
                } else if done.load(Ordering::Relaxed) {
                    return;
                }
                std::hint::spin_loop();
            }
        });
        // The initiator runs on a thread of its own: pinning the caller
        // would pin the lab's main thread for good.
        let initiator = s.spawn(move || {
            pin::pin_current(first);
            let start = Instant::now();
            let mut bursts = Vec::new();
            let mut trips = 0u64;
            while start.elapsed() < Duration::from_millis(20) {
                let t = Instant::now();
                for _ in 0..BURST {
                    let v = 2 * trips;
                    line.store(v + 1, Ordering::Release);
                    while line.load(Ordering::Acquire) != v + 2 {
                        std::hint::spin_loop();
                    }
                    trips += 1;
                }
                bursts.push(t.elapsed().as_nanos() as f64 / BURST as f64);
            }
            // Relaxed: the joins order everything after them.
            done.store(true, Ordering::Relaxed);
            bursts
        });
        let bursts = initiator.join().expect("the initiator does not panic");
        responder.join().expect("the responder does not panic");
        bursts
    });
    Some(crate::timing::spread::median(&bursts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_and_model_come_from_cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n\
                    model\t\t: 17\nmodel name\t: AMD EPYC\nflags\t\t: fpu hypervisor\n";
        let m = cpu_model_from(text);
        assert_eq!(m.vendor, "AuthenticAMD");
        assert_eq!(m.model, "AMD EPYC (family 25, model 17)");
        assert_eq!(cpu_model_from("").vendor, "unknown");
    }

    #[test]
    fn a_round_trip_between_two_cpus_takes_some_nanoseconds() {
        if let Some(ns) = line_round_trip_ns() {
            assert!(ns > 1.0 && ns < 1e6, "{ns} ns");
        }
    }

    #[test]
    fn the_probes_always_say_something() {
        assert!(!virtualization().is_empty());
        assert!(!perf_counters().is_empty());
        assert!(!two_thread_placement().is_empty());
    }
}
