//! Helpers shared by the integration tests: pinning threads and a small
//! deterministic random number generator.

#![allow(dead_code, unsafe_code)]

/// Make `Accounted<System>` this test binary's global allocator (`ALLOC`)
/// and define `memory()`: the hierarchy it is attached to, made on first
/// use; `fresh(name)`: a new child of its root; `live_bytes(g)`: `g`'s
/// usage once the allocator's stocked bytes are returned. Use it with
/// `#[macro_use] mod common;`.
#[allow(unused_macros)]
macro_rules! accounted_heap {
    () => {
        #[global_allocator]
        static ALLOC: splitcount::alloc::Accounted<std::alloc::System> =
            splitcount::alloc::Accounted::new(std::alloc::System);

        fn memory() -> &'static splitcount::group::Hierarchy {
            static H: std::sync::OnceLock<splitcount::group::Hierarchy> =
                std::sync::OnceLock::new();
            H.get_or_init(|| {
                let h = splitcount::group::Hierarchy::default();
                ALLOC.attach(&h).unwrap();
                h
            })
        }

        /// A new child of the root, named `name`.
        #[allow(dead_code)]
        fn fresh(name: &str) -> splitcount::group::Group {
            memory().root().child(name).unwrap()
        }

        /// `g`'s usage once the allocator's stocked bytes are returned.
        #[allow(dead_code)]
        fn live_bytes(g: &splitcount::group::Group) -> u64 {
            ALLOC.drain();
            g.usage()
        }
    };
}

/// Pin the calling thread to kernel CPU `cpu`. Returns false where the
/// system refuses (e.g. the CPU is not in our cpuset).
pub fn pin_to(cpu: u32) -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes inside
        // it; sched_setaffinity reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// Let the calling thread run on every CPU again.
pub fn unpin(online: &[u32]) {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `pin_to`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in online {
            libc::CPU_SET(cpu as usize, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = online;
}

/// Kernel ids of the online CPUs.
pub fn online_cpu_ids() -> Vec<u32> {
    let t = splitcount::cpu::Topology::host();
    t.online().iter().filter_map(|&d| t.cpu_id(d)).collect()
}

/// xorshift64*: deterministic, fast, good enough to pick objects and deltas.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A delta in `-range..=range`.
    pub fn delta(&mut self, range: i64) -> i64 {
        (self.below(2 * range as u64 + 1) as i64) - range
    }
}

/// Forces migrations from *outside* the threads it moves: a thread that,
/// in a loop, pins every registered worker (by kernel tid, with
/// `sched_setaffinity`) to a random online CPU. A worker is then moved
/// wherever it happens to be — between any two instructions, inside rseq
/// critical sections and between the steps of lock-free protocols — which a
/// thread re-pinning itself never is.
pub struct Migrator {
    tids: std::sync::Arc<std::sync::Mutex<Vec<i32>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    moves: std::sync::Arc<std::sync::atomic::AtomicU64>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

/// A worker's registration with a [`Migrator`]; dropping it (before the
/// thread exits) stops the moves.
pub struct Registered {
    tids: std::sync::Arc<std::sync::Mutex<Vec<i32>>>,
    tid: i32,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Under the lock the migrator holds while it moves a thread, so no
        // move can target this tid once it is gone (and maybe reused).
        self.tids.lock().unwrap().retain(|&t| t != self.tid);
        unpin(&online_cpu_ids());
    }
}

impl Migrator {
    /// Start moving registered threads across the online CPUs.
    pub fn start() -> Migrator {
        let tids: std::sync::Arc<std::sync::Mutex<Vec<i32>>> = Default::default();
        let stop: std::sync::Arc<std::sync::atomic::AtomicBool> = Default::default();
        let counted: std::sync::Arc<std::sync::atomic::AtomicU64> = Default::default();
        let online = online_cpu_ids();
        let thread = {
            let (tids, stop, counted) = (tids.clone(), stop.clone(), counted.clone());
            std::thread::spawn(move || {
                let mut rng = Rng::new(0x5eed);
                let mut moves = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    {
                        let tids = tids.lock().unwrap();
                        for &tid in tids.iter() {
                            let cpu = online[rng.below(online.len() as u64) as usize];
                            if set_affinity(tid, &[cpu]) {
                                moves += 1;
                                counted.store(moves, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                    }
                    std::thread::yield_now();
                }
                moves
            })
        };
        Migrator {
            tids,
            stop,
            moves: counted,
            thread: Some(thread),
        }
    }

    /// Moves made so far.
    pub fn moves(&self) -> u64 {
        self.moves.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a worker should go on: until `moves` moves were made, for at
    /// most `limit` since `start` (a bounded run on a slow machine).
    pub fn keep_going(
        &self,
        moves: u64,
        start: std::time::Instant,
        limit: std::time::Duration,
    ) -> bool {
        self.moves() < moves && start.elapsed() < limit
    }

    /// Register the calling thread: it is moved until the guard drops.
    pub fn register(&self) -> Registered {
        let tid = gettid();
        self.tids.lock().unwrap().push(tid);
        Registered {
            tids: self.tids.clone(),
            tid,
        }
    }

    /// Stop, and say how many moves were made.
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Migrator {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid has no preconditions.
    return unsafe { libc::syscall(libc::SYS_gettid) as i32 };
    #[cfg(not(target_os = "linux"))]
    0
}

/// Let thread `tid` run only on `cpus`; false where the system refuses.
pub fn set_affinity(tid: i32, cpus: &[u32]) -> bool {
    #[cfg(target_os = "linux")]
    // SAFETY: as in `pin_to`, for another thread of this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu as usize, &mut set);
        }
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (tid, cpus);
        false
    }
}

/// A barrier for a few threads that spins (yielding now and then) instead
/// of sleeping, so rounds of a race start within nanoseconds of each other.
pub struct SpinBarrier {
    parties: usize,
    arrived: std::sync::atomic::AtomicUsize,
    generation: std::sync::atomic::AtomicUsize,
}

impl SpinBarrier {
    pub fn new(parties: usize) -> SpinBarrier {
        SpinBarrier {
            parties,
            arrived: Default::default(),
            generation: Default::default(),
        }
    }

    pub fn wait(&self) {
        use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
        let generation = self.generation.load(Acquire);
        if self.arrived.fetch_add(1, AcqRel) + 1 == self.parties {
            self.arrived.store(0, Relaxed);
            self.generation.fetch_add(1, Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Acquire) == generation {
            spins += 1;
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// Run `f` on its own thread; panic (instead of hanging the suite) if it
/// does not finish within `limit` — the symptom of a deadlock.
pub fn finishes_within<R: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("did not finish within {limit:?}: deadlocked?"),
    }
}

/// 64 random charges and uncharges of 1–9 units on `g`, keeping what is
/// held (`held`, at most about 200) — a stock worker's round: hits,
/// misses, stashes past the batch.
pub fn churn(g: &splitcount::group::Group, rng: &mut Rng, held: &mut u64) {
    for _ in 0..64 {
        let n = 1 + rng.below(9);
        if *held < 200 && rng.below(2) == 0 {
            g.charge(n).unwrap();
            *held += n;
        } else if *held >= n {
            g.uncharge(n);
            *held -= n;
        }
    }
}

/// Free `blocks` (made by this binary's global allocator with those
/// layouts, none used again) on a thread of their own, and wait for it:
/// frees of blocks another thread charged.
pub fn free_on_another_thread(blocks: &[(*mut u8, std::alloc::Layout)]) {
    let handed: Vec<(usize, std::alloc::Layout)> =
        blocks.iter().map(|&(p, l)| (p as usize, l)).collect();
    std::thread::spawn(move || {
        for (p, l) in handed {
            // SAFETY: the caller's contract: live, made with `l`, handed
            // over whole.
            unsafe { std::alloc::dealloc(p as *mut u8, l) };
        }
    })
    .join()
    .unwrap();
}

/// A preemption a test can force: [`parker::park`] stops another thread
/// of the process at whatever point it is (a `SIGUSR1` handler that spins),
/// and [`parker::release`] lets it go on. One parked thread at a time per
/// test binary.
#[cfg(target_os = "linux")]
pub mod parker {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

    static PARKED: AtomicBool = AtomicBool::new(false);
    static RELEASE: AtomicBool = AtomicBool::new(false);

    /// The handler: spins until [`release`].
    extern "C" fn spin(_: libc::c_int) {
        PARKED.store(true, SeqCst);
        while !RELEASE.load(SeqCst) {
            std::hint::spin_loop();
        }
        RELEASE.store(false, SeqCst);
        PARKED.store(false, SeqCst);
    }

    /// Install the handler (once, before the first [`park`]).
    pub fn install() {
        // SAFETY: a handler that touches only atomics (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = spin as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
    }

    /// This thread's handle, for [`park`] from another thread.
    pub fn me() -> libc::pthread_t {
        // SAFETY: no preconditions.
        unsafe { libc::pthread_self() }
    }

    /// Stop `thread` where it is; returns once it is parked.
    pub fn park(thread: libc::pthread_t) {
        // SAFETY: a live thread of this process, with the handler installed.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
        while !PARKED.load(SeqCst) {
            std::hint::spin_loop();
        }
    }

    /// Let the parked thread go on; returns once it has left the handler.
    pub fn release() {
        RELEASE.store(true, SeqCst);
        while PARKED.load(SeqCst) {
            std::hint::spin_loop();
        }
    }
}
