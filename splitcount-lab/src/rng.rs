//! The lab's deterministic random numbers: xorshift64*, seeded explicitly,
//! so every simulation is reproducible from its seed.

/// xorshift64* (Vigna): fast, 64 bits of state, good enough for workloads.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; 0 is mapped to a nonzero state).
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
