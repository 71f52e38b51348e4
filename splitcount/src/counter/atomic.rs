//! [`Atomic`]: one shared atomic — exact, and the baseline that collapses
//! under contention (every add from every CPU writes the same cache line).

use super::{
    Accuracy, Config, ConfigError, CounterError, Design, Footprint, Side, SplitCounter, Step,
};
use crate::sync::{
    AtomicI64,
    Ordering::{Relaxed, SeqCst},
};
use crossbeam_utils::CachePadded;

/// One shared atomic. Accuracy `(0, 0)`.
///
/// ```
/// use splitcount::counter::{Atomic, SplitCounter};
/// let c = Atomic::new();
/// c.add(3);
/// assert_eq!(c.approximate(), 3);
/// assert_eq!(c.accuracy().bounds(), (0, 0));
/// ```
#[derive(Debug)]
pub struct Atomic {
    value: CachePadded<AtomicI64>,
    cpus: usize,
}

impl Atomic {
    /// A zero counter on the host.
    pub fn new() -> Atomic {
        Atomic::with_config(&Config::new(Design::Atomic))
            .expect("the atomic design has nothing to validate")
    }

    /// A zero counter for `config`'s machine (the batch is ignored; every
    /// error budget is met).
    pub fn with_config(config: &Config) -> Result<Atomic, ConfigError> {
        let config = &*config.resolved()?;
        config.validated_batch()?;
        Ok(Atomic {
            value: CachePadded::new(AtomicI64::new(0)),
            cpus: config.machine.cpus(),
        })
    }
}

impl Default for Atomic {
    fn default() -> Self {
        Atomic::new()
    }
}

impl SplitCounter for Atomic {
    fn design(&self) -> Design {
        Design::Atomic
    }

    /// One padded line: the handle.
    fn footprint(&self) -> Footprint {
        Footprint {
            heap: std::mem::size_of::<Atomic>(),
            ..Footprint::default()
        }
    }

    #[inline]
    fn add(&self, delta: i64) {
        // Relaxed: a counter orders nothing else.
        self.value.fetch_add(delta, Relaxed);
    }

    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError> {
        if cpu >= self.cpus {
            return Err(CounterError::NoSuchCpu {
                cpu,
                cpus: self.cpus,
            });
        }
        self.add(delta);
        Ok(())
    }

    fn approximate(&self) -> i64 {
        self.value.load(Relaxed)
    }

    fn precise(&self) -> i64 {
        self.value.load(Relaxed)
    }

    fn accuracy(&self) -> Accuracy {
        Accuracy::default()
    }

    fn set(&self, v: i64) {
        // A swap, not a store: it is ordered with every add (one location,
        // read-modify-writes) and done before `set` returns, so adds that
        // start afterwards count on top of `v`. SeqCst: a plain store could
        // still sit in this CPU's store buffer when `set` returns.
        self.value.swap(v, SeqCst);
    }
}

/// The test and lab tool [`Config::worst_case_schedule`] builds on.
impl Atomic {
    pub(crate) fn worst_case_schedule(&self, _side: Side) -> Vec<Step> {
        Vec::new()
    }
}
