//! What the client processes record, and the history the checker reads from it.
//!
//! Every client process (the Rust one in `client.rs`, the Python one in
//! `tests/fixtures/clients/nemesis.py`) prints one JSON [`Event`] per line on stdout,
//! stamped with `CLOCK_MONOTONIC` in nanoseconds: all processes run on this machine, so
//! the stamps of clients, the register and the nemesis share one clock. From the events
//! of each holder (one worker of one process) [`History::build`] makes its grants and
//! their *segments of use*: from `granted` (or `restored`) to the first of `suspended`,
//! `lost`, `release` or the process's death.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `CLOCK_MONOTONIC` now, in nanoseconds (the clock every process of the run shares).
pub fn now_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// One line a client process prints.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Event {
    /// `CLOCK_MONOTONIC`, ns.
    pub t: u64,
    /// The holder: `PROCESS.WORKER` (e.g. `r2#1.0`: Rust process 2, first run, worker 0).
    pub h: String,
    /// `acq` (an acquire is sent), `granted`, `fail` (the acquire's other answers),
    /// `suspended`, `restored`, `lost`, `release` (sent: use ends), `released`,
    /// `start`, `exit`.
    pub ev: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// The holder's acquire number.
    #[serde(default)]
    pub n: u64,
    /// `x` exclusive, `f` fair exclusive, `s` shared (a reader), `w` exclusive on the
    /// shared key (a writer), `m` a semaphore permit (`limit`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(default)]
    pub limit: u32,
    #[serde(default)]
    pub token: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

impl Event {
    /// The process part of the holder (`r2#1` of `r2#1.0`).
    pub fn process(&self) -> &str {
        self.h.rsplit_once('.').map_or(&self.h, |(p, _)| p)
    }
}

/// How a segment of use ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cut {
    Suspended,
    Lost(String),
    Released,
    /// The process died (killed) or the run ended with the grant still open.
    Died,
}

/// A span of time in which a holder used a lock.
#[derive(Clone, Debug)]
pub struct Segment {
    pub start: u64,
    pub end: u64,
    pub cut: Cut,
}

/// One grant and what its holder did with it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub holder: String,
    pub key: String,
    pub mode: String,
    pub limit: u32,
    pub token: u64,
    /// When the acquire was sent and when the grant arrived.
    pub asked: u64,
    pub granted: u64,
    pub segments: Vec<Segment>,
}

impl Grant {
    pub fn process(&self) -> &str {
        self.holder
            .rsplit_once('.')
            .map_or(&self.holder, |(p, _)| p)
    }

    /// Whether `t` falls in a segment of use.
    pub fn in_use_at(&self, t: u64) -> bool {
        self.segments.iter().any(|s| s.start <= t && t <= s.end)
    }

    /// The end of its last segment.
    pub fn last_use(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| s.end)
            .max()
            .unwrap_or(self.granted)
    }

    /// Whether this mode excludes every other holder (all but shared readers and
    /// semaphore permits).
    pub fn exclusive(&self) -> bool {
        matches!(self.mode.as_str(), "x" | "f" | "w")
    }
}

/// An acquire and when it was answered (`None`: never).
#[derive(Clone, Debug)]
pub struct Asked {
    pub holder: String,
    pub key: String,
    pub asked: u64,
    pub answered: Option<u64>,
}

impl Asked {
    pub fn process(&self) -> &str {
        self.holder
            .rsplit_once('.')
            .map_or(&self.holder, |(p, _)| p)
    }
}

/// Every grant of a round, by key, and the acquires left unanswered.
#[derive(Debug, Default)]
pub struct History {
    pub grants: BTreeMap<String, Vec<Grant>>,
    /// Every acquire, answered or not.
    pub asked: Vec<Asked>,
    /// Every `lost` event (the holder's, at its time, with the reason).
    pub lost: Vec<Event>,
    /// The last grant's arrival per process.
    pub last_grant: BTreeMap<String, u64>,
}

impl History {
    /// Builds the history from the events in the order each process printed them;
    /// `deaths` gives when a process was killed (its open segments end there) and `end`
    /// closes whatever is still open.
    pub fn build(events: &[Event], deaths: &BTreeMap<String, u64>, end: u64) -> Self {
        let mut open: BTreeMap<&str, Grant> = BTreeMap::new();
        let mut asked: BTreeMap<&str, (u64, &str)> = BTreeMap::new();
        let mut history = History::default();
        let done = |g: Grant, history: &mut History| {
            history.grants.entry(g.key.clone()).or_default().push(g);
        };
        for e in events {
            match e.ev.as_str() {
                "acq" => {
                    asked.insert(&e.h, (e.t, &e.key));
                }
                "fail" => {
                    if let Some((t, key)) = asked.remove(e.h.as_str()) {
                        history.asked.push(answered(&e.h, key, t, Some(e.t)));
                    }
                }
                "granted" => {
                    let at = asked.remove(e.h.as_str()).map_or(e.t, |(t, _)| t);
                    history.asked.push(answered(&e.h, &e.key, at, Some(e.t)));
                    if let Some(g) = open.remove(e.h.as_str()) {
                        done(close(g, e.t, Cut::Died), &mut history);
                    }
                    history.last_grant.insert(e.process().to_owned(), e.t);
                    let grant = Grant {
                        holder: e.h.clone(),
                        key: e.key.clone(),
                        mode: e.mode.clone(),
                        limit: e.limit,
                        token: e.token,
                        asked: at,
                        granted: e.t,
                        segments: vec![Segment {
                            start: e.t,
                            end: u64::MAX,
                            cut: Cut::Died,
                        }],
                    };
                    open.insert(&e.h, grant);
                }
                "suspended" => {
                    if let Some(g) = open.get_mut(e.h.as_str()) {
                        cut(g, e.t, Cut::Suspended);
                    }
                }
                "restored" => {
                    if let Some(g) = open.get_mut(e.h.as_str()) {
                        // A quick suspend-restore may reach the client as one change.
                        cut(g, e.t, Cut::Suspended);
                        g.segments.push(Segment {
                            start: e.t,
                            end: u64::MAX,
                            cut: Cut::Died,
                        });
                    }
                }
                "lost" | "release" => {
                    if e.ev == "lost" {
                        history.lost.push(e.clone());
                    }
                    if let Some(g) = open.remove(e.h.as_str()) {
                        let how = match e.ev.as_str() {
                            "lost" => Cut::Lost(e.why.clone()),
                            _ => Cut::Released,
                        };
                        done(close(g, e.t, how), &mut history);
                    }
                }
                _ => {}
            }
        }
        for (holder, g) in open {
            let process = holder.rsplit_once('.').map_or(holder, |(p, _)| p);
            let at = deaths.get(process).copied().unwrap_or(end);
            done(close(g, at, Cut::Died), &mut history);
        }
        for (holder, (t, key)) in asked {
            history.asked.push(answered(holder, key, t, None));
        }
        for grants in history.grants.values_mut() {
            grants.sort_by_key(|g| g.granted);
        }
        history
    }
}

fn answered(holder: &str, key: &str, asked: u64, answered: Option<u64>) -> Asked {
    Asked {
        holder: holder.to_owned(),
        key: key.to_owned(),
        asked,
        answered,
    }
}

/// Ends the open segment of `g` at `t`, if one is open.
fn cut(g: &mut Grant, t: u64, how: Cut) {
    if let Some(last) = g.segments.last_mut()
        && last.end == u64::MAX
    {
        last.end = t.max(last.start);
        last.cut = how;
    }
}

fn close(mut g: Grant, t: u64, how: Cut) -> Grant {
    cut(&mut g, t, how);
    g
}
