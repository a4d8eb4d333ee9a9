//! The checker on made-up histories, before every run (milliseconds): it must find
//! an overlap, a writer beside a reader, a semaphore over its limit, a token
//! regression, a write after `Lost` and a stale write accepted, excuse a paused
//! holder only where it was paused, and find nothing in a clean history.

use std::collections::BTreeMap;

use super::checker::{self, Kind, Phases};
use super::expect::{Allowed, Context};
use super::history::{Event, History};
use super::plan::Topo;
use super::register::Write;
use super::schedule::{Act, Fault};
use super::world::Record;

const MS: u64 = 1_000_000;

fn ev(t: u64, h: &str, ev: &str, key: &str, mode: &str, token: u64) -> Event {
    Event {
        t: t * MS,
        h: h.into(),
        ev: ev.into(),
        key: key.into(),
        mode: mode.into(),
        limit: if mode == "m" { 2 } else { 0 },
        token,
        ..Event::default()
    }
}

/// A holder's whole cycle: asked at `from`, granted, released at `to`.
fn hold(h: &str, key: &str, mode: &str, token: u64, from: u64, to: u64) -> Vec<Event> {
    vec![
        ev(from, h, "acq", key, mode, 0),
        ev(from + 1, h, "granted", key, mode, token),
        ev(to, h, "release", key, mode, token),
    ]
}

fn write(t: u64, h: &str, key: &str, token: u64, accepted: bool) -> Write {
    Write {
        received: t * MS + 1,
        sent: t * MS,
        key: key.into(),
        token,
        holder: h.into(),
        fenced: true,
        accepted,
    }
}

/// The findings of `events` and `writes` (`paused`: process `a#1` stopped from 5 to 40 ms).
fn findings(events: Vec<Event>, writes: &[Write], paused: bool) -> Vec<(Kind, Option<Allowed>)> {
    let records: Vec<Record> = paused
        .then(|| Record {
            fault: Fault {
                id: 1,
                at: Default::default(),
                dur: Default::default(),
                act: Act::ClientStop(0),
            },
            start: 5 * MS,
            end: 40 * MS,
            shard: None,
            port: None,
            sidecar: Some(0),
            process: Some("a#1".into()),
            note: String::new(),
        })
        .into_iter()
        .collect();
    let key_shard = BTreeMap::new();
    let ctx = Context {
        topo: Topo::Rdb,
        acks: 0,
        records: &records,
        changes: &[],
        key_shard: &key_shard,
    };
    let history = History::build(&events, &BTreeMap::new(), 1000 * MS);
    let phases = Phases {
        heal_done: u64::MAX / 2,
        stop: 1000 * MS,
        probes: BTreeMap::new(),
        alive: vec![],
        sidecar_of: BTreeMap::new(),
        deaths: BTreeMap::new(),
    };
    let mut found: Vec<_> = checker::check(&ctx, &history, writes, &phases)
        .into_iter()
        .filter(|f| f.kind != Kind::LostWithoutCause)
        .map(|f| (f.kind, f.allowed))
        .collect();
    found.sort();
    found
}

/// Panics, naming the case, when the checker misses what it must find.
pub fn check() {
    let clean = [
        hold("a#1.0", "x", "x", 1, 0, 10),
        hold("b#1.0", "x", "x", 2, 11, 20),
        hold("c#1.0", "r", "s", 3, 0, 30),
        hold("d#1.0", "r", "s", 4, 5, 25),
    ]
    .concat();
    assert_eq!(
        findings(clean, &[write(5, "a#1.0", "x", 1, true)], false),
        vec![],
        "a clean history"
    );

    let overlap = [
        hold("a#1.0", "x", "x", 1, 0, 20),
        hold("b#1.0", "x", "x", 2, 10, 30),
    ]
    .concat();
    assert_eq!(
        findings(overlap.clone(), &[], false),
        vec![(Kind::Overlap, None)],
        "two holders"
    );
    assert_eq!(
        findings(overlap, &[], true),
        vec![(Kind::Overlap, Some(Allowed::PausedHolder))],
        "a paused holder"
    );

    let writer = [
        hold("a#1.0", "r", "s", 1, 0, 20),
        hold("b#1.0", "r", "w", 2, 10, 30),
    ]
    .concat();
    assert_eq!(
        findings(writer, &[], false),
        vec![(Kind::Overlap, None)],
        "a writer beside a reader"
    );

    let semaphore = [
        hold("a#1.0", "m", "m", 1, 0, 30),
        hold("b#1.0", "m", "m", 2, 5, 30),
        hold("c#1.0", "m", "m", 3, 10, 30),
    ]
    .concat();
    assert_eq!(
        findings(semaphore, &[], false),
        vec![(Kind::OverLimit, None)],
        "three permits of two"
    );

    let regression = [
        hold("a#1.0", "x", "x", 5, 0, 10),
        hold("b#1.0", "x", "x", 4, 11, 20),
    ]
    .concat();
    assert_eq!(
        findings(regression, &[], false),
        vec![(Kind::TokenRegression, None)],
        "a smaller token later"
    );

    // `a` is told Lost at 10 and writes at 15, after `b` was granted at 12: a write
    // outside its use, which overlaps `b`'s use, and (as `b` had not written yet) a
    // stale write the register accepted.
    let mut after_lost = vec![
        ev(0, "a#1.0", "acq", "x", "x", 0),
        ev(1, "a#1.0", "granted", "x", "x", 1),
        ev(10, "a#1.0", "lost", "x", "x", 1),
    ];
    after_lost.extend(hold("b#1.0", "x", "x", 2, 11, 30));
    let writes = [
        write(15, "a#1.0", "x", 1, true),
        write(16, "b#1.0", "x", 2, true),
        write(17, "a#1.0", "x", 1, false),
    ];
    let found = findings(after_lost, &writes, false);
    let want = [Kind::Overlap, Kind::UseOutside, Kind::StaleWrite];
    for kind in want {
        assert!(
            found.contains(&(kind, None)),
            "a write after Lost: {kind:?} missing from {found:?}"
        );
    }
}
