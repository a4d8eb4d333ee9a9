//! A contended workload for fault scenarios: clients on one or more sidecars take a few
//! keys in turn, use them (writes to a fenced register), and record holding intervals
//! `[t_ack, t_end]` with their tokens for [`super::check_history`]. `t_end` is when the
//! client stopped using the key: the Release was sent, `Lost` arrived, or the stream
//! broke.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockside::proto::{self, lease_response::Event};
use tokio::time::Instant;

use super::{Client, Interval, Rng, acquire, secs};

/// What a workload run saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub history: Vec<Interval>,
    /// Acquires answered UNAVAILABLE (the store could not grant safely).
    pub unavailable: usize,
    /// `Lost` received while holding.
    pub lost: usize,
    /// Writes the fenced register refused (a token lower than one it had seen).
    pub fenced_rejections: usize,
}

/// Per key, the highest token written: a resource that rejects older tokens.
#[derive(Default)]
struct Register {
    highest: BTreeMap<String, u64>,
    rejections: usize,
}

impl Register {
    fn write(&mut self, key: &str, token: u64) {
        let highest = self.highest.entry(key.to_owned()).or_default();
        if token < *highest {
            self.rejections += 1;
        } else {
            *highest = token;
        }
    }
}

/// How the clients behave.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub clients: u64,
    pub keys: u64,
    /// Lock TTL.
    pub ttl: Duration,
    /// Every `long_every`-th hold lasts `long_hold`; the others 20 to 120 ms.
    pub long_every: u64,
    pub long_hold: Duration,
    pub run: Duration,
}

/// Runs `plan` against the sidecars at `addrs` (client i uses `addrs[i % len]`).
pub async fn run(addrs: &[String], plan: Plan) -> Outcome {
    let shared = Arc::new(Mutex::new((Outcome::default(), Register::default())));
    let deadline = Instant::now() + plan.run;
    let tasks: Vec<_> = (0..plan.clients)
        .map(|i| {
            let addr = addrs[i as usize % addrs.len()].clone();
            let shared = shared.clone();
            tokio::spawn(client(addr, i + 1, plan, deadline, shared))
        })
        .collect();
    for task in tasks {
        task.await.expect("workload client");
    }
    let (mut outcome, register) = std::mem::take(&mut *shared.lock().expect("outcome"));
    outcome.fenced_rejections = register.rejections;
    outcome
}

async fn client(
    addr: String,
    seed: u64,
    plan: Plan,
    deadline: Instant,
    shared: Arc<Mutex<(Outcome, Register)>>,
) {
    let mut rng = Rng::new(seed);
    let connection = Client::connect(&addr).await;
    let mut lease = connection.lease().await;
    let ttl = secs(plan.ttl.as_secs_f64());
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        let key = format!("key-{}", rng.below(plan.keys));
        let id = lease
            .send_acquire(proto::Acquire {
                wait_timeout: Some(secs(1.0)),
                ttl: Some(ttl),
                ..acquire(&key)
            })
            .await;
        let granted = loop {
            match lease.try_next().await {
                Ok(Some(Event::Granted(g))) if g.request_id == id => break Some(g),
                Ok(Some(Event::Rejected(r))) if r.request_id == id => {
                    shared.lock().expect("outcome").0.unavailable += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    break None;
                }
                Ok(Some(Event::NotAcquired(a))) if a.request_id == id => break None,
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => {
                    lease = connection.lease().await;
                    break None;
                }
            }
        };
        let Some(granted) = granted else { continue };
        let start = Instant::now();
        let token = granted.fencing_token;
        shared.lock().expect("outcome").1.write(&key, token);
        let hold = if n % plan.long_every == 0 {
            plan.long_hold
        } else {
            Duration::from_millis(20 + rng.below(100))
        };
        let until = start + hold;
        let mut lost = false;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                event = lease.try_next() => match event {
                    Ok(Some(Event::Lost(l))) if l.key == key => {
                        lost = true;
                        break;
                    }
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => {
                        lost = true;
                        break;
                    }
                }
            }
        }
        if !lost {
            // The last use, then the release.
            shared.lock().expect("outcome").1.write(&key, token);
        }
        let end = Instant::now();
        {
            let mut guard = shared.lock().expect("outcome");
            guard.0.lost += usize::from(lost);
            guard.0.history.push(Interval {
                key: key.clone(),
                start,
                end,
                token,
            });
        }
        if !lost {
            lease.send_release(&key).await;
        }
    }
}

/// Percentile of `samples` (0..=100); zero when empty.
pub fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[(samples.len() - 1) * p / 100]
}

/// Per key, the time from `fault` to the first grant after it: how long the key was
/// unavailable.
pub fn takeovers(history: &[Interval], fault: Instant) -> Vec<Duration> {
    let mut first: BTreeMap<&str, Instant> = BTreeMap::new();
    for i in history.iter().filter(|i| i.start >= fault) {
        let t = first.entry(&i.key).or_insert(i.start);
        *t = (*t).min(i.start);
    }
    first.values().map(|t| *t - fault).collect()
}
