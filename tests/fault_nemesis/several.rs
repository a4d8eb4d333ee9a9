//! Several keys at once in the Rust client process: one acquire in four takes every
//! plain exclusive key of the round together (`Client::lock_all_with`, the sidecar's
//! `AcquireAll`). Each key is recorded as a grant of its own, under a holder of its own
//! (`PROCESS.WORKER-KEYINDEX` as the worker number `1000 × (worker + 1) + index`), so
//! the checker holds every key to the same rules as single grants: no overlap, tokens
//! that increase, writes only in use.

use std::sync::Arc;
use std::time::Duration;

use lockside::client::{Client, ClientError, LockOptions, LockState};
use tokio_util::sync::CancellationToken;

use super::client::{Out, Register, failure, watch_states};
use super::common::Rng;
use super::history::Event;
use super::plan::WorkerArgs;

/// One worker of the client process, for one request of several keys.
pub struct Worker<'a> {
    pub w: u32,
    pub n: u64,
    pub client: &'a Client,
    pub out: Arc<Out>,
    pub register: &'a mut Register,
    pub stop: &'a CancellationToken,
    pub holder: &'a str,
}

impl Worker<'_> {
    /// The holder number key `i` of the request is recorded under.
    fn of(&self, i: usize) -> u32 {
        1000 * (self.w + 1) + i as u32
    }

    /// The holder key `i` is recorded under, as `Out::emit` names it.
    fn holder_of(&self, i: usize) -> String {
        let process = self.holder.rsplit_once('.').map_or(self.holder, |(p, _)| p);
        format!("{process}.{}", self.of(i))
    }

    fn emit_each(&self, keys: &[String], f: impl Fn(usize, &str) -> Option<Event>) {
        for (i, key) in keys.iter().enumerate() {
            if let Some(e) = f(i, key) {
                self.out.emit(self.of(i), e);
            }
        }
    }

    /// Takes `keys` together, uses them (a write to each while it is held), releases
    /// them: every step recorded per key.
    pub async fn hold_all(self, keys: &[String], args: &WorkerArgs, long: bool, rng: &mut Rng) {
        let base = |key: &str| Event {
            key: key.to_owned(),
            n: self.n,
            mode: "x".into(),
            limit: 1,
            ..Event::default()
        };
        let with = |ev: &str, key: &str| Event {
            ev: ev.into(),
            ..base(key)
        };
        self.emit_each(keys, |_, k| Some(with("acq", k)));
        let options = LockOptions {
            wait: Some(args.wait),
            ttl: Some(args.ttl),
            ..LockOptions::default()
        };
        let got = tokio::select! {
            got = self.client.lock_all_with(keys, options) => got,
            _ = self.stop.cancelled() => return,
        };
        let locks = match got {
            Ok(locks) => locks,
            Err(e) => {
                let why = failure(&e);
                self.emit_each(keys, |_, k| {
                    Some(Event {
                        why: why.clone(),
                        ..with("fail", k)
                    })
                });
                tokio::time::sleep(Duration::from_millis(30 + rng.below(120))).await;
                return;
            }
        };
        let tokens: Vec<u64> = locks.iter().map(|l| l.fencing_token()).collect();
        let granted = |ev: &str, i: usize, k: &str| Event {
            token: tokens[i],
            ..with(ev, k)
        };
        self.emit_each(keys, |i, k| Some(granted("granted", i, k)));
        let mut watchers = Vec::new();
        for (i, lock) in locks.iter().enumerate() {
            let (states, base) = (lock.states(), granted("", i, &keys[i]));
            let out = self.out.clone();
            watchers.push(tokio::spawn(watch_states(states, out, self.of(i), base)));
        }
        let hold = match long {
            true => Duration::from_millis(1000 + rng.below(2000)),
            false => Duration::from_millis(20 + rng.below(130)),
        };
        let until = tokio::time::Instant::now() + hold;
        while tokio::time::Instant::now() < until && !self.stop.is_cancelled() {
            if locks.iter().any(|l| l.is_lost()) {
                break;
            }
            for (i, lock) in locks.iter().enumerate() {
                if lock.state() == LockState::Held {
                    let holder = self.holder_of(i);
                    self.register
                        .write(true, &keys[i], tokens[i], &holder)
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        // The keys not lost are released; a lost one's watcher has said so.
        let lost: Vec<bool> = locks.iter().map(|l| l.is_lost()).collect();
        self.emit_each(keys, |i, k| (!lost[i]).then(|| granted("release", i, k)));
        for (i, w) in watchers.into_iter().enumerate() {
            match lost[i] {
                true => drop(w.await),
                false => w.abort(),
            }
        }
        let released = tokio::select! {
            r = locks.release() => r,
            _ = tokio::time::sleep(args.ttl * 2) => Err(ClientError::Unavailable("release took too long".into())),
        };
        let (name, why) = match released {
            Ok(()) => ("released", String::new()),
            Err(e) => ("release-failed", failure(&e)),
        };
        self.emit_each(keys, |i, k| {
            (!lost[i]).then(|| Event {
                why: why.clone(),
                ..granted(name, i, k)
            })
        });
    }
}
