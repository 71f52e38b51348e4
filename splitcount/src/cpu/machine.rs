//! A machine to run on: the host, or a simulated one.
//!
//! Everything in splitcount that depends on "the machine" (how many per-CPU
//! slots, which node a CPU is on, which CPU the caller is on) takes a
//! [`Machine`]. The host machine reads its shape from sysfs and the current
//! CPU from rseq; a simulated machine has any shape up to [`MAX_CPUS`] CPUs,
//! and its "current CPU" is whatever the driver last set with
//! [`Machine::set_current_cpu`] — or is passed explicitly to the `*_on(cpu)`
//! operations of counters and arenas. The lab drives a 4096-CPU machine from
//! one thread this way.
//!
//! [`MAX_CPUS`]: super::MAX_CPUS

use super::current;
use super::topology::{Topology, TopologyError};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The host machine or a simulated one. Cheap to clone.
///
/// ```
/// use splitcount::cpu::Machine;
/// let sim = Machine::simulated(256, 4).unwrap();
/// sim.set_current_cpu(200).unwrap();
/// assert_eq!(sim.current_cpu(), 200);
/// assert_eq!(sim.topology().node_of(200), 3);
///
/// let host = Machine::host();
/// assert!(host.current_cpu() < host.cpus());
/// ```
#[derive(Clone)]
pub struct Machine {
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Host(&'static Topology),
    Simulated(Arc<Simulated>),
}

struct Simulated {
    topology: Topology,
    /// The CPU "everyone" runs on until the driver moves it. Relaxed: it is a
    /// driver-chosen value, not a synchronization point.
    current: AtomicUsize,
}

/// Setting the current CPU of a machine that cannot take it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum MachineError {
    /// The host's current CPU is chosen by the scheduler, not by us.
    NotSimulated,
    /// The CPU index is not below the machine's CPU count.
    NoSuchCpu {
        /// The requested dense CPU index.
        cpu: usize,
        /// The machine's CPU count.
        cpus: usize,
    },
}

impl fmt::Display for MachineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineError::NotSimulated => {
                write!(f, "only a simulated machine's current CPU can be set")
            }
            MachineError::NoSuchCpu { cpu, cpus } => {
                write!(f, "CPU {cpu} does not exist on a machine of {cpus} CPUs")
            }
        }
    }
}

impl std::error::Error for MachineError {}

impl Machine {
    /// The machine this process runs on.
    pub fn host() -> Machine {
        Machine {
            kind: Kind::Host(Topology::host()),
        }
    }

    /// A simulated machine of `cpus` CPUs over `nodes` NUMA nodes
    /// (see [`Topology::simulated`]); its current CPU starts at 0.
    pub fn simulated(cpus: usize, nodes: usize) -> Result<Machine, TopologyError> {
        Ok(Machine::from_topology(Topology::simulated(cpus, nodes)?))
    }

    /// A simulated machine of any shape, e.g. one read from a fake sysfs
    /// tree with [`Topology::from_sysfs`].
    pub fn from_topology(topology: Topology) -> Machine {
        Machine {
            kind: Kind::Simulated(Arc::new(Simulated {
                topology,
                current: AtomicUsize::new(0),
            })),
        }
    }

    /// The machine's shape.
    #[inline]
    pub fn topology(&self) -> &Topology {
        match &self.kind {
            Kind::Host(t) => t,
            Kind::Simulated(s) => &s.topology,
        }
    }

    /// Number of CPUs (the size of per-CPU arrays).
    #[inline]
    pub fn cpus(&self) -> usize {
        self.topology().cpus()
    }

    /// Whether this is a simulated machine.
    pub fn is_simulated(&self) -> bool {
        matches!(self.kind, Kind::Simulated(_))
    }

    /// The dense index of the CPU the caller is on: the scheduler's answer on
    /// the host, the driver's choice on a simulated machine. Always below
    /// [`Machine::cpus`].
    #[inline]
    pub fn current_cpu(&self) -> usize {
        match &self.kind {
            Kind::Host(_) => current::current_cpu(),
            Kind::Simulated(s) => s.current.load(Relaxed),
        }
    }

    /// Move a simulated machine's current CPU.
    pub fn set_current_cpu(&self, cpu: usize) -> Result<(), MachineError> {
        match &self.kind {
            Kind::Host(_) => Err(MachineError::NotSimulated),
            Kind::Simulated(s) if cpu < s.topology.cpus() => {
                s.current.store(cpu, Relaxed);
                Ok(())
            }
            Kind::Simulated(s) => Err(MachineError::NoSuchCpu {
                cpu,
                cpus: s.topology.cpus(),
            }),
        }
    }
}

impl fmt::Debug for Machine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Machine")
            .field("simulated", &self.is_simulated())
            .field("cpus", &self.cpus())
            .field("nodes", &self.topology().nodes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_current_cpu_is_what_the_driver_set() {
        let m = Machine::simulated(4096, 16).unwrap();
        assert_eq!(m.current_cpu(), 0);
        m.set_current_cpu(4095).unwrap();
        assert_eq!(m.current_cpu(), 4095);
        assert_eq!(
            m.set_current_cpu(4096),
            Err(MachineError::NoSuchCpu {
                cpu: 4096,
                cpus: 4096
            })
        );
        assert_eq!(m.current_cpu(), 4095, "a refused move changes nothing");
    }

    #[test]
    fn host_current_cpu_cannot_be_set() {
        assert_eq!(
            Machine::host().set_current_cpu(0),
            Err(MachineError::NotSimulated)
        );
    }

    #[test]
    fn clones_share_the_simulated_current_cpu() {
        let a = Machine::simulated(8, 1).unwrap();
        let b = a.clone();
        a.set_current_cpu(3).unwrap();
        assert_eq!(b.current_cpu(), 3);
    }
}
