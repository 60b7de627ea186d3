//! [`Zipf`]: keys drawn with Zipf's law, the skew of real key access (a few hot keys, a long
//! tail), for the benchmarks' `--zipf S`. The first 4,096 ranks from an alias table (a few
//! nanoseconds a draw: where s ≥ 1 they hold most of the mass), the tail by rejection-inversion
//! sampling (Hörmann and Derflinger, "Rejection-inversion to generate variates from monotone
//! discrete distributions", 1996): constant time and memory per draw whatever the number of
//! keys, where a table of the whole distribution would hold 8 bytes a key (160 MB for 20 M
//! keys). Each draw is a function of the event's index, as the generators' are, so a run
//! replays the same keys.
//!
//! May touch: nothing (pure arithmetic).

/// Zipf's law over `1..=n` with exponent `s` (> 0): rank `k` is drawn with probability
/// proportional to `1 / k^s`.
///
/// ```
/// use weir_jobs::zipf::Zipf;
/// let z = Zipf::new(1000, 1.0);
/// let hot = (0..10_000).filter(|&i| z.rank(i) == 1).count();
/// // Rank 1 takes 1 / H(1000) ≈ 13% of the draws.
/// assert!((1100..1500).contains(&hot), "{hot}");
/// ```
#[derive(Clone, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    /// The head: ranks `1..=HEAD` (or all, when fewer), drawn in constant time from an alias
    /// table (Walker's method): slot `j` is rank `j + 1` with probability `stay[j]`, else rank
    /// `alias[j] + 1`. Where s ≥ 1 most of the mass lies there.
    stay: std::sync::Arc<[f64]>,
    alias: std::sync::Arc<[u32]>,
    /// The head's share of the whole mass.
    head_share: f64,
    /// The tail (ranks above the head) by rejection-inversion: the hat's integral at the
    /// tail's first edge and at `n + 0.5`.
    h_integral_tail: f64,
    h_integral_n: f64,
    /// Below this distance from the inverse, a candidate is accepted without the exact test.
    squeeze: f64,
}

/// Ranks drawn from the alias table (192 KiB): all of the benchmarks' 10,000 keys; of 20 M
/// keys, 59% of the mass at s = 1 and all but 0.5% at s = 1.5.
const HEAD: u64 = 16_384;

impl Zipf {
    /// Zipf's law over `n` ranks (at least 1) with exponent `s`, which must be finite and
    /// above zero (zero is uniform: draw uniformly instead).
    pub fn new(n: u64, s: f64) -> Zipf {
        assert!(s.is_finite() && s > 0.0, "a Zipf exponent is finite and above zero, not {s}");
        let head = n.clamp(1, HEAD);
        let weights: Vec<f64> = (1..=head).map(|k| h(k as f64, s)).collect();
        let head_mass: f64 = weights.iter().sum();
        let n_f = n.max(1) as f64;
        let (h_integral_tail, h_integral_n) = (h_integral(head as f64 + 0.5, s), h_integral(n_f + 0.5, s));
        // The tail's mass by the midpoint rule: relative error about 1 / (24 HEAD^2).
        let tail_mass = if n > head { h_integral_n - h_integral_tail } else { 0.0 };
        let (stay, alias) = alias_table(&weights);
        let squeeze = 2.0 - h_integral_inverse(h_integral(2.5, s) - h(2.0, s), s);
        Zipf {
            n: n_f,
            s,
            stay: stay.into(),
            alias: alias.into(),
            head_share: head_mass / (head_mass + tail_mass),
            h_integral_tail,
            h_integral_n,
            squeeze,
        }
    }

    /// The rank (in `1..=n`) of draw `i`.
    #[inline]
    pub fn rank(&self, i: u64) -> u64 {
        let v = uniform(i, u64::MAX);
        if v < self.head_share {
            // Scaled to the table: the slot, and the fraction within it.
            let x = v / self.head_share * self.stay.len() as f64;
            let j = (x as usize).min(self.stay.len() - 1);
            // Both loaded, one chosen: a select, not a branch the skew makes unpredictable.
            let (stay, other) = (self.stay[j], u64::from(self.alias[j]));
            return 1 + if x - (j as f64) < stay { j as u64 } else { other };
        }
        let first = self.stay.len() as f64 + 1.0;
        for attempt in 0u64.. {
            let u = self.h_integral_n + uniform(i, attempt) * (self.h_integral_tail - self.h_integral_n);
            let x = h_integral_inverse(u, self.s);
            let k = (x + 0.5).floor().clamp(first, self.n);
            if k - x <= self.squeeze || u >= h_integral(k + 0.5, self.s) - h(k, self.s) {
                return k as u64;
            }
        }
        unreachable!("an unbounded loop returns")
    }
}

/// Walker's alias table of `weights`: per slot, the probability of staying, and the slot
/// taken otherwise.
fn alias_table(weights: &[f64]) -> (Vec<f64>, Vec<u32>) {
    let n = weights.len();
    let total: f64 = weights.iter().sum();
    let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
    let mut alias: Vec<u32> = (0..n as u32).collect();
    let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&j| scaled[j] < 1.0);
    while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
        small.pop();
        alias[s] = l as u32;
        scaled[l] -= 1.0 - scaled[s];
        if scaled[l] < 1.0 {
            large.pop();
            small.push(l);
        }
    }
    // What is left stays (rounding leaves them at 1 within an ulp).
    small.into_iter().chain(large).for_each(|j| scaled[j] = 1.0);
    (scaled, alias)
}

/// A uniform draw in [0, 1) from the event's index and the attempt (splitmix64 of both).
#[inline]
fn uniform(i: u64, attempt: u64) -> f64 {
    let mut z = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ attempt.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// `1 / x^s`.
fn h(x: f64, s: f64) -> f64 {
    (-s * x.ln()).exp()
}

/// An antiderivative of `h`: `(x^(1-s) - 1) / (1 - s)`, or `ln x` where `s` is 1.
fn h_integral(x: f64, s: f64) -> f64 {
    let ln_x = x.ln();
    expm1_over((1.0 - s) * ln_x) * ln_x
}

/// The inverse of [`h_integral`].
fn h_integral_inverse(x: f64, s: f64) -> f64 {
    let t = (x * (1.0 - s)).max(-1.0);
    (ln1p_over(t) * x).exp()
}

/// `(e^x - 1) / x`, exact near zero.
fn expm1_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x / 2.0 * (1.0 + x / 3.0 * (1.0 + x / 4.0))
    }
}

/// `ln(1 + x) / x`, exact near zero.
fn ln1p_over(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - x / 4.0))
    }
}
