//! [`Tree`]: the hierarchical split counter (after the kernel's
//! `percpu_counter_tree`), the default design.
//!
//! Level 0 is one slot per CPU in the per-CPU arena; above it, levels of
//! shared items, each in the region of the CPUs that write it (the tree's
//! stripe set, `percpu/stripe.rs`); the top is the root (see [`TreeShape`]
//! for the picture), split into one accumulator per child (at most
//! [`MAX_ROOT_PARTS`], each in its own region) so that carries from
//! different parts of the machine never meet on one line. Level `l` has the
//! batch `Bₗ = batch · Π fan-outs below l`. A tree's handle is 40 bytes: its
//! slot's row, its stripe set, its batch, and a layout shared by every tree
//! of its shape in its arena.
//!
//! **The carry rule.** Slots and items are *never reset*. An add changes the
//! CPU's slot from `old` to `new`; what moves up is exactly the change in the
//! slot's multiple of `B₀`, `⌊new⌋ − ⌊old⌋` with `⌊x⌋ = x & !(B₀−1)` (floor,
//! also for negative values). An item receiving a carry `c` (always a
//! multiple of the level below's batch) keeps only `r = c mod Bₗ` — the part
//! that can change its residue — and adds it with one atomic; the multiple of
//! `Bₗ` in `c`, plus whatever multiple of `Bₗ` the item's value crossed, goes
//! up. A carry that is already a multiple of `Bₗ` therefore skips the item
//! without touching its cache line. The root takes everything that reaches it.
//!
//! Because slots are never reset, `precise() = Σ slots + bias` needs no upper
//! level, and `approximate() = Σ root accumulators + bias` reads at most 17
//! lines. The root holds nothing back, so splitting it changes no bound. Everything a
//! level holds back is a residue in `[0, Bₗ)`, so the approximate value never
//! runs above the precise one: accuracy is `(under, 0)` with `under` from
//! [`TreeShape::under`].
//!
//! **Races.** Every step is an atomic read-modify-write whose returned value
//! alone decides the carry, and RMWs on one location are totally ordered, so
//! the carries out of a location telescope to `⌊final⌋ − ⌊initial⌋` whatever
//! the interleaving: nothing is lost or counted twice once adds return. A
//! carry in flight is missing from the upper levels, never from `precise()`.

use super::tree_shape::TreeShape;
use super::{
    Accuracy, Config, ConfigError, CounterError, Design, Footprint, Side, SplitCounter, Step,
};
use crate::percpu::{Arena, Row, Stripe, StripeKind};
use crate::sync::{AtomicI64, Ordering::Relaxed};

/// The hierarchical split counter. See the module docs.
///
/// ```
/// use splitcount::counter::{Config, Design, SplitCounter, Tree};
/// use splitcount::cpu::Machine;
///
/// let m = Machine::simulated(4, 1).unwrap();      // binary: 4 → 2 → root
/// let t = Tree::with_config(&Config::new(Design::Tree).machine(&m).batch(4)).unwrap();
/// t.add_on(0, 3).unwrap();                          // residue 3 stays in slot 0
/// assert_eq!((t.approximate(), t.precise()), (0, 3));
/// t.add_on(0, 1).unwrap();                          // crosses 4: carry 4 → level 1 (B₁ = 8) keeps it
/// assert_eq!((t.approximate(), t.precise()), (0, 4));
/// t.add_on(1, 4).unwrap();                          // level 1 reaches 8: 8 moves to the root
/// assert_eq!((t.approximate(), t.precise()), (8, 8));
/// assert_eq!(t.accuracy().bounds(), (4 * 3 + 2 * (8 - 4), 0));
/// ```
pub struct Tree {
    /// Level 0: one slot per CPU.
    row: Row,
    /// Everything above level 0, in one stripe set (see
    /// `percpu/stripe.rs`): member `l − 1` holds level `l`'s items (item `i`
    /// in region `i·2^sₗ`), member `L − 1` the root's accumulators (part `j`
    /// in region `j << root_shift`), member `L` the bias — with the items of
    /// other trees that the same CPUs write, 8 bytes each.
    items: Stripe,
    /// `B₀ − 1` (`B₀` is at most `MAX_BATCH`, 2³²): the slots' batch, kept
    /// here for the hot path.
    batch_mask: u32,
    /// What every tree of this shape in this arena shares.
    layout: std::sync::Arc<Layout>,
}

/// The part of a tree that depends only on its shape and arena, computed
/// once and shared by every tree built alike (as the kernel's
/// `percpu_counter_tree` keeps its level tables global): the handle of each
/// tree is then its row, one stripe pointer, its batch and this pointer —
/// 40 bytes whatever the machine.
struct Layout {
    /// The arena of every tree of this layout (kept alive by it).
    arena: Arena,
    shape: TreeShape,
    /// Levels `1..L` (the intermediate ones).
    levels: Box<[Level]>,
    /// Root accumulators, at most [`MAX_ROOT_PARTS`]: `approximate()` sums
    /// them.
    root_parts: usize,
    /// Position shift from a CPU's position to its root accumulator.
    root_shift: u32,
    /// The stripe set's kinds: the levels', the root's, the bias's.
    kinds: Box<[StripeKind]>,
    /// The arena's regions: one member's part of the set's chunk.
    regions: usize,
}

/// The most root accumulators: `approximate()` reads at most this many
/// slots (and the bias).
pub const MAX_ROOT_PARTS: usize = 16;

/// The bias's stripe: region 0 only, in chunks of slots any CPU writes.
const BIAS_KIND: StripeKind = StripeKind {
    stride: u32::MAX,
    order: 2,
};

struct Level {
    /// `Bₗ − 1`.
    mask: i64,
    /// Position shift to this level's item (`sₗ`).
    shift: u32,
}

impl Layout {
    fn new(arena: Arena, shape: TreeShape) -> Layout {
        let order = shape.order_kind();
        let levels: Box<[Level]> = (1..shape.levels())
            .map(|l| Level {
                mask: shape.level_batch(l) as i64 - 1,
                shift: shape.shift(l),
            })
            .collect();
        // The root's children are the items of level L − 1 (the slots when
        // L = 1): one accumulator each, grouped by position beyond 16.
        let top = shape.levels().saturating_sub(1);
        let children = shape.items_at(top).max(1);
        let grouping = children.div_ceil(MAX_ROOT_PARTS).next_power_of_two();
        let root_shift = shape.shift(top) + grouping.trailing_zeros();
        let kinds = levels
            .iter()
            .map(|l| l.shift)
            .chain([root_shift])
            .map(|stride| StripeKind { stride, order })
            .chain([BIAS_KIND])
            .collect();
        Layout {
            regions: arena.regions(),
            arena,
            shape,
            levels,
            root_parts: children.div_ceil(grouping),
            root_shift,
            kinds,
        }
    }

    /// The layout for `shape` in `arena`: the one trees built alike
    /// already share, else a new one that later trees will share.
    #[cfg(not(loom))]
    fn shared(arena: &Arena, shape: TreeShape) -> std::sync::Arc<Layout> {
        use std::sync::{Arc, Mutex, PoisonError, Weak};
        static LAYOUTS: Mutex<Vec<Weak<Layout>>> = Mutex::new(Vec::new());
        let mut all = LAYOUTS.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|l| l.strong_count() > 0);
        let found = all
            .iter()
            .filter_map(Weak::upgrade)
            .find(|l| l.arena.same(arena) && l.shape == shape);
        found.unwrap_or_else(|| {
            let layout = Arc::new(Layout::new(arena.clone(), shape));
            all.push(Arc::downgrade(&layout));
            layout
        })
    }

    /// Under loom every tree has a layout of its own (a process-wide table
    /// would outlive the model's objects).
    #[cfg(loom)]
    fn shared(arena: &Arena, shape: TreeShape) -> std::sync::Arc<Layout> {
        std::sync::Arc::new(Layout::new(arena.clone(), shape))
    }

    /// The bias's member of the stripe set.
    fn bias_member(&self) -> usize {
        self.levels.len() + 1
    }

    /// The root's member of the stripe set.
    fn root_member(&self) -> usize {
        self.levels.len()
    }
}

// SAFETY (for every `Stripe::at` and `Row` access in this file): a tree's
// row and stripe set come from its layout's arena, which the layout keeps
// alive, are freed only by the tree's `Drop`, and are read only at regions
// their kinds use: member `m`'s region `(pos >> s) << s` for a position
// below the CPUs (= the arena's regions, `Config::arena_for` checks),
// through `Stripe::member`.
impl Tree {
    /// A zero counter on the host: batch 32, fan-outs from the table.
    pub fn new() -> Tree {
        Tree::with_config(&Config::new(Design::Tree))
            .expect("the host defaults are valid unless memory is exhausted")
    }

    /// A zero counter as `config` says (an error budget is resolved first:
    /// see [`Config::max_error`]).
    pub fn with_config(config: &Config) -> Result<Tree, ConfigError> {
        let config = &*config.resolved()?;
        let batch = config.validated_batch()?;
        // `validated_batch` keeps the batch within 2³² (`MAX_BATCH`).
        let batch_mask = u32::try_from(batch - 1).map_err(|_| ConfigError::BatchTooLarge(batch))?;
        let shape = TreeShape::new(
            config.machine.topology(),
            batch,
            &config.arity,
            config.sharing,
        )?;
        let arena = config.arena_for()?;
        let layout = Layout::shared(&arena, shape);
        let row = arena.alloc_row()?;
        let items = match arena.alloc_stripes(&layout.kinds) {
            Ok(items) => items,
            Err(e) => {
                // SAFETY: just allocated by this arena, given back once,
                // never handed out.
                unsafe { arena.free_row(row) };
                return Err(e.into());
            }
        };
        Ok(Tree {
            row,
            items,
            batch_mask,
            layout,
        })
    }

    /// Member `member`'s slot in region `region`.
    #[inline(always)]
    fn item(&self, member: usize, region: usize) -> &AtomicI64 {
        // SAFETY: see the comment above `impl Tree`.
        unsafe {
            self.items
                .at(Stripe::member(member, self.layout.regions, region))
        }
    }

    #[inline(always)]
    fn bias(&self) -> &AtomicI64 {
        self.item(self.layout.bias_member(), 0)
    }

    /// The tree's shape: fan-outs, level batches, items.
    pub fn shape(&self) -> &TreeShape {
        &self.layout.shape
    }

    /// Whether `other` shares this tree's layout (a test hook: trees of one
    /// shape in one arena do, no others).
    #[doc(hidden)]
    pub fn shares_layout_with(&self, other: &Tree) -> bool {
        std::sync::Arc::ptr_eq(&self.layout, &other.layout)
    }

    /// Bytes of the layout this tree shares with every tree of its shape
    /// in its arena (its level table, the shape and its tables, the shared
    /// pointer's counts): taken once per shape and arena, not per tree, so
    /// [`SplitCounter::footprint`] leaves it out.
    ///
    /// ```
    /// use splitcount::counter::{Config, Design, SplitCounter, Tree};
    /// use splitcount::cpu::Machine;
    /// let m = Machine::simulated(64, 1).unwrap();
    /// let config = Config::new(Design::Tree).machine(&m);
    /// let (a, b) = (Tree::with_config(&config).unwrap(), Tree::with_config(&config).unwrap());
    /// assert_eq!(a.footprint().heap, std::mem::size_of::<Tree>());
    /// assert!(a.shared_layout_bytes() > 0);
    /// assert!(a.footprint().per_cpu_bytes(64) <= 12.0);
    /// # drop(b);
    /// ```
    pub fn shared_layout_bytes(&self) -> usize {
        let l = &*self.layout;
        2 * std::mem::size_of::<usize>()
            + std::mem::size_of::<Layout>()
            + std::mem::size_of_val(&*l.levels)
            + std::mem::size_of_val(&*l.kinds)
            + l.shape.heap_bytes()
    }

    /// Carry what CPU `cpu`'s slot crossed when it went from `new − delta`
    /// to `new`.
    #[inline(always)]
    fn after_slot_add(&self, cpu: usize, new: i64, delta: i64) {
        let old = new.wrapping_sub(delta);
        // The slot crossed a multiple of B₀ exactly when `old` and `new`
        // differ in a bit at or above `log2 B₀`, i.e. when `old ^ new`,
        // unsigned, is above `B₀ − 1`: one compare tests it, and the carry
        // itself is worked out of line.
        if (old ^ new) as u64 > u64::from(self.batch_mask) {
            self.carry_from(cpu, old, new);
        }
    }

    /// The carry of a slot that went from `old` to `new`: `⌊new⌋ − ⌊old⌋`
    /// with `⌊x⌋ = x & !(B₀ − 1)`, propagated up. Out of line: one add in
    /// `B₀` on average comes here.
    #[inline(never)]
    fn carry_from(&self, cpu: usize, old: i64, new: i64) {
        let floor = !i64::from(self.batch_mask);
        self.carry(cpu, (new & floor).wrapping_sub(old & floor));
    }

    /// An update that cannot be made on a CPU's slot goes into the bias,
    /// which both `precise()` and `approximate()` include: exact, and the
    /// bound is unchanged.
    #[cold]
    #[inline(never)]
    fn add_to_bias(&self, delta: i64) {
        self.bias().fetch_add(delta, Relaxed);
    }

    /// Propagate `carry` (a multiple of `B₀`) from CPU `cpu`'s slot upwards.
    #[inline]
    fn carry(&self, cpu: usize, mut carry: i64) {
        let layout = &*self.layout;
        let pos = layout.shape.item_of(cpu, 0);
        for (member, level) in layout.levels.iter().enumerate() {
            // The part of the carry below this level's batch changes the
            // item's residue; the rest passes the item untouched.
            let keep = carry & level.mask;
            carry = carry.wrapping_sub(keep);
            if keep != 0 {
                let item = self.item(member, (pos >> level.shift) << level.shift);
                let new = item.fetch_add(keep, Relaxed).wrapping_add(keep);
                let old = new.wrapping_sub(keep);
                carry = carry.wrapping_add((new & !level.mask).wrapping_sub(old & !level.mask));
            }
            if carry == 0 {
                return;
            }
        }
        let part = (pos >> layout.root_shift) << layout.root_shift;
        self.item(layout.root_member(), part)
            .fetch_add(carry, Relaxed);
    }
}

impl Drop for Tree {
    /// The row and the stripes go back to the arena (zeroed where written).
    fn drop(&mut self) {
        let arena = &self.layout.arena;
        // SAFETY: allocated by this arena in `with_config` (the stripes with
        // these kinds), given back once, and nothing borrows the tree now.
        unsafe {
            arena.free_stripes(self.items, &self.layout.kinds);
            arena.free_row(self.row);
        }
    }
}

impl Default for Tree {
    fn default() -> Self {
        Tree::new()
    }
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("cpus", &self.shape().cpus())
            .field("batch", &self.shape().batch())
            .field("fanouts", &self.shape().fanouts())
            .field("approximate", &self.approximate())
            .finish()
    }
}

impl SplitCounter for Tree {
    /// Its slot on every CPU (and the arena's overflow copy); 8 bytes per
    /// intermediate item, root accumulator and the bias, in stripes shared
    /// with other trees (`percpu/stripe.rs`); its handle (40 bytes, no heap
    /// of its own). Not counted: the layout that every tree of the same
    /// shape in the same arena shares (its level table and shape, a few
    /// hundred bytes once — see [`Tree::shared_layout_bytes`]).
    ///
    /// ```
    /// use splitcount::counter::{Config, Design, SplitCounter, Tree};
    /// use splitcount::cpu::Machine;
    /// let m = Machine::simulated(256, 4).unwrap();
    /// let t = Tree::with_config(&Config::new(Design::Tree).machine(&m)).unwrap();
    /// assert!(t.footprint().per_cpu_bytes(256) <= 12.0);
    /// ```
    fn footprint(&self) -> Footprint {
        let shape = self.shape();
        let items: usize = (1..shape.levels()).map(|l| shape.items_at(l)).sum();
        let slot = std::mem::size_of::<i64>();
        Footprint {
            per_cpu: slot * (self.row.regions() + 1),
            shared: slot * (items + self.layout.root_parts + 1),
            heap: std::mem::size_of::<Tree>(),
        }
    }

    fn design(&self) -> Design {
        Design::Tree
    }

    /// One rseq critical section (or `fetch_add`) on this CPU's slot, then
    /// at most one atomic per level whose batch the slot crossed. Always
    /// inlined: a few instructions when nothing carries (the carry and the
    /// bias are out of line), and left to the heuristics a caller in
    /// another crate sometimes got a call with five saved registers instead
    /// (the lab measured 3.0 ns instead of 1.4).
    #[inline(always)]
    fn add(&self, delta: i64) {
        // SAFETY: slot 0 of a one-slot allocation of the layout's arena.
        match unsafe { self.row.add_current(0, delta, || &self.layout.arena) } {
            Some((cpu, new)) => self.after_slot_add(cpu, new, delta),
            None => self.add_to_bias(delta),
        }
    }

    /// On a simulated machine, CPU `cpu`'s slot; on the host with rseq
    /// adds, where another CPU's slot may only be written by critical
    /// sections running there, the bias.
    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError> {
        let cpus = self.shape().cpus();
        if cpu >= cpus {
            return Err(CounterError::NoSuchCpu { cpu, cpus });
        }
        if self.layout.arena.remote_writes_allowed() {
            // SAFETY: `cpu < cpus` (the arena's regions, checked when the
            // tree was built) checked above; slot 0 of a one-slot allocation.
            let new = unsafe { self.row.atomic_add(cpu, 0, delta) };
            self.after_slot_add(cpu, new, delta);
        } else {
            self.add_to_bias(delta);
        }
        Ok(())
    }

    /// The root's accumulators (at most [`MAX_ROOT_PARTS`] lines) and the
    /// bias.
    fn approximate(&self) -> i64 {
        let layout = &*self.layout;
        (0..layout.root_parts).fold(self.bias().load(Relaxed), |sum, j| {
            let part = self.item(layout.root_member(), j << layout.root_shift);
            sum.wrapping_add(part.load(Relaxed))
        })
    }

    fn precise(&self) -> i64 {
        // SAFETY: slot 0 of a one-slot allocation, alive while the tree is.
        unsafe { self.row.sum(0) }.wrapping_add(self.bias().load(Relaxed))
    }

    /// `(under, 0)`: see [`TreeShape::under`].
    fn accuracy(&self) -> Accuracy {
        Accuracy {
            under: self.shape().under(),
            over: 0,
        }
    }

    fn set(&self, v: i64) {
        self.bias()
            .fetch_add(v.wrapping_sub(self.precise()), Relaxed);
    }
}

/// What a critical section written outside Rust needs to add to a
/// [`Tree`]'s slot on its own CPU ([`Tree::inline_add`]): the C ABI's
/// `static inline` add, which must do exactly what [`SplitCounter::add`]
/// does on its common path (see `IMPLEMENTATION.md`, the C ABI's fast
/// path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InlineAdd {
    /// CPU 0's copy of the tree's slot; CPU `c`'s is `c · 4096` bytes on.
    pub slot0: *mut i64,
    /// The CPUs with a copy: an id at or above it (or an unregistered
    /// area's `cpu_id`, −1 or −2 as unsigned) must not be written.
    pub regions: usize,
    /// glibc's `__rseq_offset`: the calling thread's rseq area is at
    /// `fs:[rseq_offset]` (`cpu_id` at +4, `rseq_cs` at +8), registered
    /// with the signature `0x53053053`.
    pub rseq_offset: isize,
    /// The slot's batch `B₀` (a power of two): when an add moves the slot
    /// across a multiple of it, [`Tree::after_inline_add`] must carry.
    pub batch: u64,
}

/// For the C ABI's inline add.
impl Tree {
    /// The layout of this tree's slot for a caller's own rseq sequence,
    /// when the tree's adds are sequences on glibc's areas indexed by CPU
    /// id (the hot path's common case); `None` otherwise (a simulated
    /// machine, atomic adds, concurrency ids, no glibc registration) —
    /// the caller then calls [`SplitCounter::add`].
    ///
    /// The caller's sequence must, on the calling CPU `c` read *inside*
    /// it from `cpu_id`: leave without writing if `c ≥ regions`; else
    /// load `slot0[c · 512]`, add, and commit with one store — then call
    /// [`Tree::after_inline_add`] with `c` and the new value.
    pub fn inline_add(&self) -> Option<InlineAdd> {
        let (slot0, regions, rseq_offset) = self.row.inline_add_layout(0)?;
        Some(InlineAdd {
            slot0,
            regions,
            rseq_offset,
            batch: self.shape().batch(),
        })
    }

    /// The rest of an add that a caller's own sequence made to CPU `cpu`'s
    /// slot (`delta`, leaving it at `new`): the carry to the levels above
    /// when the slot crossed a multiple of the batch. A `cpu` beyond the
    /// tree's CPUs is ignored (no sequence writes there).
    #[inline]
    pub fn after_inline_add(&self, cpu: usize, new: i64, delta: i64) {
        if cpu < self.shape().cpus() {
            self.after_slot_add(cpu, new, delta);
        }
    }
}

/// The test and lab tool [`Config::worst_case_schedule`] builds on.
impl Tree {
    /// Top level first, each intermediate item gets `(aₗ − 1)·Bₗ₋₁` from a
    /// CPU under it (a multiple of every lower batch, so it passes the lower
    /// levels untouched and stays whole in the item), then every slot gets
    /// `B₀ − 1`. Nothing reaches the root, and every residue is at its
    /// maximum. `over` is 0, so the `Over` schedule is empty.
    pub(crate) fn worst_case_schedule(&self, side: Side) -> Vec<Step> {
        if side == Side::Over {
            return Vec::new();
        }
        let s = self.shape();
        let mut steps = Vec::new();
        for l in (1..s.levels()).rev() {
            let delta = (s.level_batch(l) - s.level_batch(l - 1)) as i64;
            for item in 0..s.items_at(l) {
                steps.push(Step {
                    cpu: s.first_cpu_under(l, item),
                    delta,
                });
            }
        }
        let b0 = s.batch() as i64;
        steps.extend((0..s.cpus()).map(|cpu| Step { cpu, delta: b0 - 1 }));
        steps
    }
}
