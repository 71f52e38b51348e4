//! The machine's shape: which CPUs exist, which are online, which NUMA node
//! each belongs to, and which CPUs share each level of cache.
//!
//! Kernel CPU ids can be sparse (`0-3,8-11` on a machine with holes, or with
//! CPUs that may be hot-plugged later). Everything in splitcount indexes
//! per-CPU memory by a *dense* index `0..cpus()`, never by the raw id; the
//! mapping lives here and is checked, so a surprising id from the kernel can
//! never index out of bounds.
//!
//! Detection reads sysfs and tolerates its absence (containers, sandboxes,
//! non-Linux systems): without `/sys/devices/system/cpu/possible` the shape
//! falls back to `std::thread::available_parallelism()` CPUs on one node.

use super::cpulist::{parse_cpu_list, CpuListError};
use std::fmt;
use std::fs;
use std::path::Path;

/// Largest machine a [`Topology`] may describe, simulated or real.
pub const MAX_CPUS: usize = 1 << 20;

/// Largest number of NUMA nodes a [`Topology`] may describe.
pub const MAX_NODES: usize = 1 << 16;

/// Where a [`Topology`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
#[non_exhaustive]
pub enum TopologySource {
    /// Read from sysfs.
    Sysfs,
    /// sysfs was missing or unreadable: `available_parallelism` CPUs, one node.
    Fallback,
    /// Built by [`Topology::simulated`].
    Simulated,
}

/// One level of cache and how the CPUs share it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CacheLevel {
    /// Cache level as the kernel numbers it (1, 2, 3, ...).
    pub level: u32,
    /// `Data`, `Instruction` or `Unified`.
    pub kind: String,
    /// The groups of dense CPU indices that share one cache of this level,
    /// sorted by their first CPU.
    pub domains: Vec<Vec<usize>>,
}

/// A shape that cannot describe a machine.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TopologyError {
    /// A simulated machine needs at least one CPU and at most [`MAX_CPUS`].
    BadCpuCount(usize),
    /// A simulated machine needs between 1 and `min(cpus, MAX_NODES)` nodes.
    BadNodeCount {
        /// Requested nodes.
        nodes: usize,
        /// Requested CPUs.
        cpus: usize,
    },
    /// A sysfs CPU list was malformed.
    CpuList(CpuListError),
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TopologyError::BadCpuCount(n) => {
                write!(f, "a machine needs between 1 and {MAX_CPUS} CPUs, not {n}")
            }
            TopologyError::BadNodeCount { nodes, cpus } => write!(
                f,
                "a machine of {cpus} CPUs needs between 1 and {} NUMA nodes, not {nodes}",
                (*cpus).min(MAX_NODES)
            ),
            TopologyError::CpuList(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TopologyError {}

impl From<CpuListError> for TopologyError {
    fn from(e: CpuListError) -> Self {
        TopologyError::CpuList(e)
    }
}

/// The shape of a machine: possible and online CPUs, NUMA nodes, caches.
///
/// CPUs are known by their dense index `0..cpus()`; [`Topology::cpu_id`] and
/// [`Topology::dense_index`] convert to and from the kernel's ids.
///
/// ```
/// use splitcount::cpu::Topology;
/// let t = Topology::simulated(8, 2).unwrap();
/// assert_eq!(t.cpus(), 8);
/// assert_eq!(t.nodes(), 2);
/// assert_eq!(t.node_of(5), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "serde_form::TopologyData"))]
pub struct Topology {
    /// Kernel ids of the possible CPUs, ascending; position = dense index.
    possible: Vec<u32>,
    /// Dense indices of the CPUs online at detection time.
    online: Vec<usize>,
    /// Dense NUMA node index of each dense CPU index.
    node_of: Vec<usize>,
    /// Number of distinct (dense) NUMA nodes.
    nodes: usize,
    /// Kernel id of each dense NUMA node (what `mbind` wants).
    node_ids: Vec<u32>,
    /// Cache sharing, one entry per (level, kind).
    caches: Vec<CacheLevel>,
    /// Kernel id -> dense index (`u32::MAX` for an id that is not possible).
    #[cfg_attr(feature = "serde", serde(skip))]
    dense_of_id: Vec<u32>,
    source: TopologySource,
}

/// What a serialized [`Topology`] holds, checked and completed on the way
/// back in: a topology that cannot describe a machine is an error, never a
/// panic later (`node_of` with no nodes divided by zero), and the index of
/// kernel ids, which is not serialized, is rebuilt (a deserialized topology
/// compared unequal and knew no CPU by its id).
#[cfg(feature = "serde")]
mod serde_form {
    use super::{CacheLevel, Topology, TopologySource, MAX_CPUS};

    #[derive(serde::Deserialize)]
    pub(super) struct TopologyData {
        possible: Vec<u32>,
        online: Vec<usize>,
        node_of: Vec<usize>,
        nodes: usize,
        node_ids: Vec<u32>,
        caches: Vec<CacheLevel>,
        source: TopologySource,
    }

    impl TryFrom<TopologyData> for Topology {
        type Error = String;

        fn try_from(d: TopologyData) -> Result<Topology, String> {
            let cpus = d.possible.len();
            if cpus == 0 || cpus > MAX_CPUS {
                return Err(format!("{cpus} possible CPUs: 1 to {MAX_CPUS}"));
            }
            if d.possible.windows(2).any(|w| w[0] >= w[1]) {
                return Err("possible CPU ids are not strictly ascending".into());
            }
            if d.node_of.len() != cpus {
                return Err(format!(
                    "node_of has {} entries for {cpus} CPUs",
                    d.node_of.len()
                ));
            }
            if d.nodes == 0 || d.nodes > cpus || d.node_ids.len() != d.nodes {
                return Err(format!(
                    "{} nodes with {} node ids for {cpus} CPUs",
                    d.nodes,
                    d.node_ids.len()
                ));
            }
            if let Some(n) = d.node_of.iter().find(|&&n| n >= d.nodes) {
                return Err(format!("a CPU on node {n} of {}", d.nodes));
            }
            let beyond = |i: &usize| *i >= cpus;
            if d.online.iter().any(beyond)
                || d.caches
                    .iter()
                    .flat_map(|c| &c.domains)
                    .flatten()
                    .any(beyond)
            {
                return Err(format!("a CPU index beyond the {cpus} CPUs"));
            }
            let max_id = *d.possible.last().expect("checked non-empty") as usize;
            if max_id >= MAX_CPUS {
                return Err(format!("CPU id {max_id}: at most {}", MAX_CPUS - 1));
            }
            let mut dense_of_id = vec![u32::MAX; max_id + 1];
            for (dense, &id) in d.possible.iter().enumerate() {
                dense_of_id[id as usize] = dense as u32;
            }
            Ok(Topology {
                possible: d.possible,
                online: d.online,
                node_of: d.node_of,
                nodes: d.nodes,
                node_ids: d.node_ids,
                caches: d.caches,
                dense_of_id,
                source: d.source,
            })
        }
    }
}

impl Topology {
    /// The topology of the machine this process runs on, read once and cached.
    pub fn host() -> &'static Topology {
        static HOST: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
        HOST.get_or_init(Topology::detect)
    }

    /// Read the machine's shape from `/sys`, falling back to
    /// `available_parallelism` CPUs on one node when sysfs is unusable.
    pub fn detect() -> Topology {
        Topology::from_sysfs(Path::new("/sys/devices/system"))
            .unwrap_or_else(|_| Topology::fallback())
    }

    /// The shape used when sysfs cannot be read: `available_parallelism` CPUs,
    /// all online, one node, no cache information.
    pub fn fallback() -> Topology {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_CPUS);
        let mut t = Topology::uniform(n, 1);
        t.source = TopologySource::Fallback;
        t
    }

    /// A simulated machine of `cpus` CPUs (ids `0..cpus`, all online) spread
    /// over `nodes` NUMA nodes in contiguous blocks whose sizes differ by at
    /// most one (so every node has CPUs), with one shared cache per node at
    /// level 3. Usable wherever the host topology is; built in
    /// `O(cpus + nodes)`, so a machine of 2²⁰ CPUs on 2¹⁶ nodes is instant.
    pub fn simulated(cpus: usize, nodes: usize) -> Result<Topology, TopologyError> {
        if cpus == 0 || cpus > MAX_CPUS {
            return Err(TopologyError::BadCpuCount(cpus));
        }
        if nodes == 0 || nodes > cpus || nodes > MAX_NODES {
            return Err(TopologyError::BadNodeCount { nodes, cpus });
        }
        let mut t = Topology::uniform(cpus, nodes);
        let mut domains: Vec<Vec<usize>> = vec![Vec::new(); nodes];
        for (cpu, &node) in t.node_of.iter().enumerate() {
            domains[node].push(cpu);
        }
        t.caches = vec![CacheLevel {
            level: 3,
            kind: "Unified".to_owned(),
            domains,
        }];
        t.source = TopologySource::Simulated;
        Ok(t)
    }

    /// `cpus` CPUs numbered densely, `nodes ≤ cpus` contiguous blocks of them
    /// (CPU `c` on node `⌊c · nodes / cpus⌋`: every node gets `⌊cpus/nodes⌋`
    /// or one more).
    fn uniform(cpus: usize, nodes: usize) -> Topology {
        Topology {
            possible: (0..cpus as u32).collect(),
            online: (0..cpus).collect(),
            node_of: (0..cpus)
                .map(|c| (c as u128 * nodes as u128 / cpus as u128) as usize)
                .collect(),
            nodes,
            node_ids: (0..nodes as u32).collect(),
            caches: Vec::new(),
            dense_of_id: (0..cpus as u32).collect(),
            source: TopologySource::Fallback,
        }
    }

    /// Read the shape from a sysfs tree rooted at `root` (normally
    /// `/sys/devices/system`). `cpu/possible` must exist; node and cache
    /// information is optional and missing pieces are filled conservatively
    /// (every CPU on node 0; no cache domains).
    pub fn from_sysfs(root: &Path) -> Result<Topology, TopologyError> {
        let read = |rel: &str| fs::read_to_string(root.join(rel)).ok();
        let possible_text = read("cpu/possible").ok_or(TopologyError::BadCpuCount(0))?;
        let possible = parse_cpu_list(&possible_text)?;
        if possible.is_empty() || possible.len() > MAX_CPUS {
            return Err(TopologyError::BadCpuCount(possible.len()));
        }
        let max_id = *possible.last().expect("non-empty") as usize;
        let mut dense_of_id = vec![u32::MAX; max_id + 1];
        for (dense, &id) in possible.iter().enumerate() {
            dense_of_id[id as usize] = dense as u32;
        }
        let to_dense = |ids: Vec<u32>| -> Vec<usize> {
            ids.into_iter()
                .filter_map(|id| dense_of_id.get(id as usize).copied())
                .filter(|&d| d != u32::MAX)
                .map(|d| d as usize)
                .collect()
        };

        let online = match read("cpu/online") {
            Some(text) => to_dense(parse_cpu_list(&text)?),
            None => (0..possible.len()).collect(),
        };

        // NUMA nodes: node ids may be sparse too; number them densely.
        let mut node_of = vec![0usize; possible.len()];
        let mut node_ids = vec![0];
        if let Some(text) = read("node/possible").or_else(|| read("node/online")) {
            let mut ids = Vec::new();
            for nid in parse_cpu_list(&text)? {
                let Some(list) = read(&format!("node/node{nid}/cpulist")) else {
                    continue;
                };
                let cpus = to_dense(parse_cpu_list(&list)?);
                if cpus.is_empty() {
                    continue; // memory-only node: no CPU lives there
                }
                for c in cpus {
                    node_of[c] = ids.len();
                }
                ids.push(nid);
            }
            if !ids.is_empty() {
                node_ids = ids;
            }
        }

        let caches = read_caches(root, &possible, &to_dense);
        Ok(Topology {
            possible,
            online,
            node_of,
            nodes: node_ids.len(),
            node_ids,
            caches,
            dense_of_id,
            source: TopologySource::Sysfs,
        })
    }

    /// Number of possible CPUs: the size of every per-CPU array.
    #[inline]
    pub fn cpus(&self) -> usize {
        self.possible.len()
    }

    /// Number of NUMA nodes that have CPUs.
    #[inline]
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Dense indices of the CPUs that were online when the shape was read.
    pub fn online(&self) -> &[usize] {
        &self.online
    }

    /// Kernel ids of the possible CPUs, in dense order.
    pub fn possible_ids(&self) -> &[u32] {
        &self.possible
    }

    /// The kernel id of dense CPU `cpu`, if it exists.
    pub fn cpu_id(&self, cpu: usize) -> Option<u32> {
        self.possible.get(cpu).copied()
    }

    /// The dense index of kernel CPU id `id`, if that CPU is possible.
    #[inline]
    pub fn dense_index(&self, id: u32) -> Option<usize> {
        match self.dense_of_id.get(id as usize) {
            Some(&d) if d != u32::MAX => Some(d as usize),
            _ => None,
        }
    }

    /// NUMA node (dense) of dense CPU `cpu`; CPUs beyond the machine fold
    /// modulo its size rather than panic.
    #[inline]
    pub fn node_of(&self, cpu: usize) -> usize {
        self.node_of[cpu % self.node_of.len()]
    }

    /// The kernel id of dense NUMA node `node`, if it exists.
    pub fn node_id(&self, node: usize) -> Option<u32> {
        self.node_ids.get(node).copied()
    }

    /// Dense CPU indices on NUMA node `node`.
    pub fn cpus_of_node(&self, node: usize) -> Vec<usize> {
        (0..self.cpus())
            .filter(|&c| self.node_of[c] == node)
            .collect()
    }

    /// The cache levels, as read from sysfs (empty when unknown).
    pub fn caches(&self) -> &[CacheLevel] {
        &self.caches
    }

    /// Where this shape came from.
    pub fn source(&self) -> TopologySource {
        self.source
    }
}

/// Cache sharing from `cpu/cpuN/cache/index*/{level,type,shared_cpu_list}`.
fn read_caches(
    root: &Path,
    possible: &[u32],
    to_dense: &dyn Fn(Vec<u32>) -> Vec<usize>,
) -> Vec<CacheLevel> {
    let mut levels: Vec<CacheLevel> = Vec::new();
    for &id in possible {
        let dir = root.join(format!("cpu/cpu{id}/cache"));
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !name.to_string_lossy().starts_with("index") {
                continue;
            }
            let p = entry.path();
            let read = |f: &str| fs::read_to_string(p.join(f)).ok();
            let (Some(level), Some(kind), Some(shared)) =
                (read("level"), read("type"), read("shared_cpu_list"))
            else {
                continue;
            };
            let (Ok(level), Ok(shared)) = (level.trim().parse::<u32>(), parse_cpu_list(&shared))
            else {
                continue;
            };
            let domain = to_dense(shared);
            if domain.is_empty() {
                continue;
            }
            let kind = kind.trim().to_owned();
            let idx = match levels
                .iter()
                .position(|l| l.level == level && l.kind == kind)
            {
                Some(i) => i,
                None => {
                    levels.push(CacheLevel {
                        level,
                        kind,
                        domains: Vec::new(),
                    });
                    levels.len() - 1
                }
            };
            if !levels[idx].domains.contains(&domain) {
                levels[idx].domains.push(domain);
            }
        }
    }
    for l in &mut levels {
        l.domains.sort();
    }
    levels.sort_by(|a, b| (a.level, &a.kind).cmp(&(b.level, &b.kind)));
    levels
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A scratch sysfs tree that removes itself.
    struct FakeSysfs(PathBuf);

    impl FakeSysfs {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("splitcount-sysfs-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            FakeSysfs(dir)
        }
        fn write(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn sparse_cpu_ids_map_to_dense_indices() {
        let fs = FakeSysfs::new("sparse");
        fs.write("cpu/possible", "0-3,8-11\n");
        fs.write("cpu/online", "0-3,8-9\n");
        let t = Topology::from_sysfs(&fs.0).unwrap();
        assert_eq!(t.cpus(), 8);
        assert_eq!(t.dense_index(8), Some(4));
        assert_eq!(t.dense_index(11), Some(7));
        assert_eq!(t.dense_index(5), None, "a hole is not a CPU");
        assert_eq!(t.dense_index(4096), None, "an id past the end is not a CPU");
        assert_eq!(t.cpu_id(4), Some(8));
        assert_eq!(t.online(), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(t.source(), TopologySource::Sysfs);
    }

    #[test]
    fn numa_nodes_and_caches_are_read_and_numbered_densely() {
        let fs = FakeSysfs::new("numa");
        fs.write("cpu/possible", "0-3");
        fs.write("node/possible", "0,2-3");
        fs.write("node/node0/cpulist", "0-1");
        fs.write("node/node2/cpulist", "2-3");
        fs.write("node/node3/cpulist", "\n"); // memory-only node
        for cpu in 0..4 {
            let l3 = if cpu < 2 { "0-1" } else { "2-3" };
            fs.write(&format!("cpu/cpu{cpu}/cache/index0/level"), "1");
            fs.write(&format!("cpu/cpu{cpu}/cache/index0/type"), "Data");
            fs.write(
                &format!("cpu/cpu{cpu}/cache/index0/shared_cpu_list"),
                &cpu.to_string(),
            );
            fs.write(&format!("cpu/cpu{cpu}/cache/index3/level"), "3");
            fs.write(&format!("cpu/cpu{cpu}/cache/index3/type"), "Unified");
            fs.write(&format!("cpu/cpu{cpu}/cache/index3/shared_cpu_list"), l3);
        }
        let t = Topology::from_sysfs(&fs.0).unwrap();
        assert_eq!(t.nodes(), 2);
        assert_eq!(
            (0..4).map(|c| t.node_of(c)).collect::<Vec<_>>(),
            [0, 0, 1, 1]
        );
        assert_eq!(t.node_id(1), Some(2), "dense node 1 is kernel node 2");
        assert_eq!(t.caches().len(), 2);
        assert_eq!(
            t.caches()[0].domains,
            vec![vec![0], vec![1], vec![2], vec![3]]
        );
        assert_eq!(t.caches()[1].level, 3);
        assert_eq!(t.caches()[1].domains, vec![vec![0, 1], vec![2, 3]]);
    }

    #[test]
    fn missing_optional_files_default_to_one_node_all_online() {
        let fs = FakeSysfs::new("minimal");
        fs.write("cpu/possible", "0-5");
        let t = Topology::from_sysfs(&fs.0).unwrap();
        assert_eq!(t.cpus(), 6);
        assert_eq!(t.nodes(), 1);
        assert_eq!(t.online().len(), 6);
        assert!(t.caches().is_empty());
    }

    #[test]
    fn missing_sysfs_is_an_error_and_detect_falls_back() {
        let fs = FakeSysfs::new("empty");
        assert!(Topology::from_sysfs(&fs.0).is_err());
        let f = Topology::fallback();
        assert!(f.cpus() >= 1);
        assert_eq!(f.nodes(), 1);
        assert_eq!(f.source(), TopologySource::Fallback);
    }

    #[test]
    fn corrupt_possible_list_is_an_error() {
        let fs = FakeSysfs::new("corrupt");
        fs.write("cpu/possible", "zero-three");
        assert!(matches!(
            Topology::from_sysfs(&fs.0),
            Err(TopologyError::CpuList(_))
        ));
    }

    #[test]
    fn simulated_machines_spread_nodes_in_blocks() {
        let t = Topology::simulated(4096, 8).unwrap();
        assert_eq!(t.cpus(), 4096);
        assert_eq!(t.node_of(0), 0);
        assert_eq!(t.node_of(511), 0);
        assert_eq!(t.node_of(512), 1);
        assert_eq!(t.node_of(4095), 7);
        assert_eq!(t.cpus_of_node(7).len(), 512);
        let t = Topology::simulated(3, 2).unwrap();
        assert_eq!((0..3).map(|c| t.node_of(c)).collect::<Vec<_>>(), [0, 0, 1]);
        let t = Topology::simulated(4, 3).unwrap();
        assert_eq!(
            (0..4).map(|c| t.node_of(c)).collect::<Vec<_>>(),
            [0, 0, 1, 2],
            "every node has CPUs"
        );
    }

    #[test]
    fn huge_simulated_machines_are_built_in_linear_time() {
        // A quadratic build (2³⁶ steps) would not finish; this takes well
        // under a second.
        let t = Topology::simulated(MAX_CPUS, MAX_NODES).unwrap();
        assert_eq!((t.cpus(), t.nodes()), (MAX_CPUS, MAX_NODES));
        assert_eq!(t.caches()[0].domains.len(), MAX_NODES);
        assert!(t.caches()[0]
            .domains
            .iter()
            .all(|d| d.len() == MAX_CPUS / MAX_NODES));
    }

    #[test]
    fn simulated_machine_rejects_impossible_shapes() {
        assert_eq!(
            Topology::simulated(0, 1),
            Err(TopologyError::BadCpuCount(0))
        );
        assert!(matches!(
            Topology::simulated(4, 0),
            Err(TopologyError::BadNodeCount { .. })
        ));
        assert!(matches!(
            Topology::simulated(4, 5),
            Err(TopologyError::BadNodeCount { .. })
        ));
        assert!(Topology::simulated(MAX_CPUS + 1, 1).is_err());
    }

    #[test]
    fn host_topology_is_consistent() {
        let t = Topology::host();
        assert!(t.cpus() >= 1);
        assert!(t.online().iter().all(|&c| c < t.cpus()));
        assert!((0..t.cpus()).all(|c| t.node_of(c) < t.nodes()));
        for (dense, &id) in t.possible_ids().iter().enumerate() {
            assert_eq!(t.dense_index(id), Some(dense));
        }
    }
}
