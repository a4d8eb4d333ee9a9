//! The history checker: holding intervals recorded by clients, checked for overlaps and
//! token regressions, and a small seeded random source for workloads.

/// One holding interval recorded by a client: from the grant's arrival (before first
/// use) to just before the release was sent (after last use).
#[derive(Clone, Debug)]
pub struct Interval {
    pub key: String,
    pub start: tokio::time::Instant,
    pub end: tokio::time::Instant,
    pub token: u64,
}

/// What the checker found in a history.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub intervals: usize,
    pub overlaps: usize,
    pub token_regressions: usize,
}

/// Checks a history of exclusive holds: per key, no interval may start before every
/// earlier one ended, and tokens must strictly increase in grant order.
pub fn check_history(history: &[Interval]) -> Verdict {
    let mut by_key: std::collections::BTreeMap<&str, Vec<&Interval>> = Default::default();
    for i in history {
        by_key.entry(&i.key).or_default().push(i);
    }
    let mut verdict = Verdict {
        intervals: history.len(),
        ..Verdict::default()
    };
    for intervals in by_key.values_mut() {
        intervals.sort_by_key(|i| i.start);
        let mut max_end: Option<tokio::time::Instant> = None;
        let mut last_token = 0;
        for i in intervals.iter() {
            if max_end.is_some_and(|end| i.start < end) {
                verdict.overlaps += 1;
            }
            if i.token <= last_token {
                verdict.token_regressions += 1;
            }
            last_token = i.token;
            max_end = Some(max_end.map_or(i.end, |end| end.max(i.end)));
        }
    }
    verdict
}

/// A small deterministic random source (xorshift), so tests need no extra crate and a
/// failing run can be replayed from its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The most intervals that overlap at any instant (for semaphores: must stay within
/// the limit).
pub fn max_concurrent(history: &[Interval]) -> usize {
    let mut edges: Vec<(tokio::time::Instant, i32)> = history
        .iter()
        .flat_map(|i| [(i.start, 1), (i.end, -1)])
        .collect();
    // At equal instants, ends before starts: touching intervals do not overlap.
    edges.sort_by_key(|&(t, delta)| (t, delta));
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in edges {
        now += delta;
        max = max.max(now);
    }
    max as usize
}
