//! [`Tree`]: the hierarchical split counter (after the kernel's
//! `percpu_counter_tree`), the default design.
//!
//! Level 0 is one slot per CPU in the per-CPU arena; above it, levels of
//! shared items, each on its own cache line; the top is the root (see
//! [`TreeShape`] for the picture), split into one accumulator per child
//! (at most [`MAX_ROOT_PARTS`], each on its own line) so that carries from
//! different parts of the machine never meet on one line. Level `l` has the batch
//! `Bₗ = batch · Π fan-outs below l`.
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
use crate::percpu::{Arena, PerCpu, Stripe, StripeKind};
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
    slots: PerCpu,
    /// Levels `1..L` (the intermediate ones): each a stripe, item `i` in
    /// region `i·2^sₗ` — with the items of other trees that the same CPUs
    /// write, 8 bytes each (see `percpu/stripe.rs`).
    levels: Box<[Level]>,
    /// The root, split: one accumulator per child of the root, at most
    /// [`MAX_ROOT_PARTS`], part `j` in region `j << root_shift` of this
    /// stripe; `approximate()` sums them.
    root: Stripe,
    /// Root accumulators.
    root_parts: usize,
    /// Position shift from a CPU's position to its root accumulator.
    root_shift: u32,
    /// What could not go on a CPU's slot (`add_on` from elsewhere, a thread
    /// without rseq) and `set()`'s correction: in `precise()` and
    /// `approximate()` alike. Region 0 of its stripe.
    bias: Stripe,
    shape: TreeShape,
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
    /// The items: the one of position `pos` is in region
    /// `(pos >> shift) << shift`.
    items: Stripe,
}

/// The stripes of a tree under construction: given back if a later one
/// cannot be had.
struct Stripes<'a> {
    arena: &'a Arena,
    made: Vec<(Stripe, StripeKind)>,
}

impl Stripes<'_> {
    fn take(&mut self, kind: StripeKind) -> Result<Stripe, ConfigError> {
        let stripe = self.arena.alloc_stripe(kind)?;
        self.made.push((stripe, kind));
        Ok(stripe)
    }

    /// Keep every stripe made (the tree owns them now).
    fn keep(mut self) {
        self.made.clear();
    }
}

impl Drop for Stripes<'_> {
    fn drop(&mut self) {
        for &(stripe, kind) in &self.made {
            // SAFETY: made by this arena with this kind, not handed to a
            // tree, freed once.
            unsafe { self.arena.free_stripe(stripe, kind) };
        }
    }
}

// SAFETY (for every `Stripe::at` in this file): a tree's stripes come from
// its own arena (`slots.arena()`), which the tree keeps alive, are freed
// only by its `Drop`, and are read only at regions their kinds use:
// `(pos >> s) << s` for a position below the CPUs (= the arena's regions).
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
        let shape = TreeShape::new(
            config.machine.topology(),
            batch,
            &config.arity,
            config.sharing,
        )?;
        let slots = config.arena_for()?.alloc(1)?;
        let mut stripes = Stripes {
            arena: slots.arena(),
            made: Vec::new(),
        };
        let order = shape.order_kind();
        let levels = (1..shape.levels())
            .map(|l| {
                let shift = shape.shift(l);
                Ok(Level {
                    mask: shape.level_batch(l) as i64 - 1,
                    shift,
                    items: stripes.take(StripeKind {
                        stride: shift,
                        order,
                    })?,
                })
            })
            .collect::<Result<Box<[Level]>, ConfigError>>()?;
        // The root's children are the items of level L − 1 (the slots when
        // L = 1): one accumulator each, grouped by position beyond 16.
        let top = shape.levels().saturating_sub(1);
        let children = shape.items_at(top).max(1);
        let grouping = children.div_ceil(MAX_ROOT_PARTS).next_power_of_two();
        let root_shift = shape.shift(top) + grouping.trailing_zeros();
        let root = stripes.take(StripeKind {
            stride: root_shift,
            order,
        })?;
        let bias = stripes.take(BIAS_KIND)?;
        stripes.keep();
        Ok(Tree {
            slots,
            levels,
            root,
            root_parts: children.div_ceil(grouping),
            root_shift,
            bias,
            shape,
        })
    }

    #[inline(always)]
    fn bias(&self) -> &AtomicI64 {
        // SAFETY: see the comment above `impl Tree`.
        unsafe { self.bias.at(0) }
    }

    /// The tree's shape: fan-outs, level batches, items.
    pub fn shape(&self) -> &TreeShape {
        &self.shape
    }

    /// Carry what CPU `cpu`'s slot crossed when it went from `new − delta`
    /// to `new`.
    #[inline(always)]
    fn after_slot_add(&self, cpu: usize, new: i64, delta: i64) {
        let floor = !(self.shape.batch() as i64 - 1);
        let old = new.wrapping_sub(delta);
        let carry = (new & floor).wrapping_sub(old & floor);
        if carry != 0 {
            self.carry(cpu, carry);
        }
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
    /// Out of line: one add in `B₀` on average comes here.
    #[inline(never)]
    fn carry(&self, cpu: usize, mut carry: i64) {
        let pos = self.shape.item_of(cpu, 0);
        for level in self.levels.iter() {
            // The part of the carry below this level's batch changes the
            // item's residue; the rest passes the item untouched.
            let keep = carry & level.mask;
            carry = carry.wrapping_sub(keep);
            if keep != 0 {
                // SAFETY: see the comment above `impl Tree`.
                let item = unsafe { level.items.at((pos >> level.shift) << level.shift) };
                let new = item.fetch_add(keep, Relaxed).wrapping_add(keep);
                let old = new.wrapping_sub(keep);
                carry = carry.wrapping_add((new & !level.mask).wrapping_sub(old & !level.mask));
            }
            if carry == 0 {
                return;
            }
        }
        // SAFETY: see the comment above `impl Tree`.
        let part = (pos >> self.root_shift) << self.root_shift;
        // SAFETY: see the comment above `impl Tree`.
        unsafe { self.root.at(part) }.fetch_add(carry, Relaxed);
    }
}

impl Drop for Tree {
    /// The stripes go back to the arena (zeroed where written).
    fn drop(&mut self) {
        let arena = self.slots.arena();
        let order = self.shape.order_kind();
        let levels = self.levels.iter().map(|l| {
            let kind = StripeKind {
                stride: l.shift,
                order,
            };
            (l.items, kind)
        });
        let root = StripeKind {
            stride: self.root_shift,
            order,
        };
        for (stripe, kind) in levels.chain([(self.root, root), (self.bias, BIAS_KIND)]) {
            // SAFETY: allocated by this arena with this kind in
            // `with_config`, freed once, and nothing borrows the tree now.
            unsafe { arena.free_stripe(stripe, kind) };
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
            .field("cpus", &self.shape.cpus())
            .field("batch", &self.shape.batch())
            .field("fanouts", &self.shape.fanouts())
            .field("approximate", &self.approximate())
            .finish()
    }
}

impl SplitCounter for Tree {
    /// Its slot on every CPU (and the arena's overflow copy); 8 bytes per
    /// intermediate item, root accumulator and the bias, in stripes shared
    /// with other trees (`percpu/stripe.rs`); its handle and heap.
    ///
    /// ```
    /// use splitcount::counter::{Config, Design, SplitCounter, Tree};
    /// use splitcount::cpu::Machine;
    /// let m = Machine::simulated(256, 4).unwrap();
    /// let t = Tree::with_config(&Config::new(Design::Tree).machine(&m)).unwrap();
    /// assert!(t.footprint().per_cpu_bytes(256) <= 12.0);
    /// ```
    fn footprint(&self) -> Footprint {
        let items: usize = (1..self.shape.levels())
            .map(|l| self.shape.items_at(l))
            .sum();
        let slot = std::mem::size_of::<i64>();
        Footprint {
            per_cpu: slot * (self.slots.cpus() + 1),
            shared: slot * (items + self.root_parts + 1),
            heap: std::mem::size_of::<Tree>()
                + std::mem::size_of::<Level>() * self.levels.len()
                + self.shape.heap_bytes(),
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
        // SAFETY: slot 0 of a one-slot allocation.
        match unsafe { self.slots.add_current(0, delta) } {
            Some((cpu, new)) => self.after_slot_add(cpu, new, delta),
            None => self.add_to_bias(delta),
        }
    }

    /// On a simulated machine, CPU `cpu`'s slot; on the host with rseq
    /// adds, where another CPU's slot may only be written by critical
    /// sections running there, the bias.
    fn add_on(&self, cpu: usize, delta: i64) -> Result<(), CounterError> {
        let cpus = self.shape.cpus();
        if cpu >= cpus {
            return Err(CounterError::NoSuchCpu { cpu, cpus });
        }
        if self.slots.remote_writes_allowed() {
            // SAFETY: `cpu < cpus` (the arena's regions, checked when the
            // tree was built) checked above; slot 0 of a one-slot allocation.
            let new = unsafe { self.slots.atomic_add(cpu, 0, delta) };
            self.after_slot_add(cpu, new, delta);
        } else {
            self.add_to_bias(delta);
        }
        Ok(())
    }

    /// The root's accumulators (at most [`MAX_ROOT_PARTS`] lines) and the
    /// bias.
    fn approximate(&self) -> i64 {
        (0..self.root_parts).fold(self.bias().load(Relaxed), |sum, j| {
            // SAFETY: see the comment above `impl Tree`.
            sum.wrapping_add(unsafe { self.root.at(j << self.root_shift) }.load(Relaxed))
        })
    }

    fn precise(&self) -> i64 {
        // SAFETY: slot 0 of a one-slot allocation.
        unsafe { self.slots.sum_unchecked(0) }.wrapping_add(self.bias().load(Relaxed))
    }

    /// `(under, 0)`: see [`TreeShape::under`].
    fn accuracy(&self) -> Accuracy {
        Accuracy {
            under: self.shape.under(),
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
        let (slot0, regions, rseq_offset) = self.slots.inline_add_layout(0)?;
        Some(InlineAdd {
            slot0,
            regions,
            rseq_offset,
            batch: self.shape.batch(),
        })
    }

    /// The rest of an add that a caller's own sequence made to CPU `cpu`'s
    /// slot (`delta`, leaving it at `new`): the carry to the levels above
    /// when the slot crossed a multiple of the batch. A `cpu` beyond the
    /// tree's CPUs is ignored (no sequence writes there).
    #[inline]
    pub fn after_inline_add(&self, cpu: usize, new: i64, delta: i64) {
        if cpu < self.shape.cpus() {
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
        let s = &self.shape;
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
