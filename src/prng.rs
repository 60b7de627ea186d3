//! weir's one pseudo-random generator: SplitMix64 (Steele, Lea and Flood, "Fast splittable
//! pseudorandom number generators", 2014). Deterministic from its seed on every platform, so
//! a simulation seed, a benchmark's data and a test's schedule all replay bit for bit.
//!
//! May touch: nothing else in the crate.

/// SplitMix64's finaliser: a well-mixed 64-bit hash of `z` (stateless; `mix(i)` is the
/// `i`-th output of the generator seeded with 0).
///
/// ```
/// assert_ne!(weir::prng::mix(1), weir::prng::mix(2));
/// assert_eq!(weir::prng::mix(7), weir::prng::mix(7));
/// ```
#[inline]
pub fn mix(z: u64) -> u64 {
    let mut z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct Prng {
    state: u64,
}

impl Prng {
    /// A generator whose outputs are decided by `seed` alone.
    pub fn new(seed: u64) -> Prng {
        Prng { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let out = mix(self.state);
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out
    }

    /// A number in `0..n` (`n` > 0), by Lemire's multiply-shift (bias below 2^-32 for the
    /// small ranges used here).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "an empty range has no member");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "{lo}..={hi} is empty");
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_follow_the_reference_sequence() {
        // The first outputs of SplitMix64 seeded with 0 (the reference implementation's).
        let mut p = Prng::new(0);
        assert_eq!(p.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(p.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn below_stays_in_range_and_reaches_every_value() {
        let mut p = Prng::new(42);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let v = p.below(7);
            assert!(v < 7);
            seen[v as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert!((0..100).all(|_| (3..=5).contains(&p.between(3, 5))));
    }
}
