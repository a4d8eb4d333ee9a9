//! One round, start to end: start the world, print the plan and the schedule, let the
//! clients warm up, run the nemesis for the fault window, heal, give the calmed
//! workload hold-off + TTL to show that every key and every client works again, stop
//! the clients, probe every key, check the history, print what was found.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lockside::client::{Client, LockOptions};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::checker::{self, Finding, Kind, Phases};
use super::expect::Context;
use super::history::{History, now_ns};
use super::nemesis;
use super::plan::{HOLD_OFF, KeySpec, RoundPlan, SLACK, TTL};
use super::report;
use super::schedule::{self, Act, Fault, Link, LinkFault, Targets};
use super::world::{PYTHON_CLIENTS, RUST_CLIENTS, SIDECARS, World};

/// What a round counted.
#[derive(Debug, Default)]
pub struct Summary {
    pub faults: usize,
    pub grants: usize,
    pub overlaps: usize,
    pub regressions: usize,
    pub stale: usize,
    pub stuck: usize,
    /// Violations of other kinds: writes outside use, a broken register, a `Lost`
    /// without a cause.
    pub other: usize,
    pub documented: usize,
    /// Violations that involve the self-check's wrong client.
    pub wrong_flagged: usize,
}

pub async fn run(run_seed: u64, plan: &RoundPlan) -> Summary {
    let began = Instant::now();
    let world = Arc::new(World::start(plan).await);
    eprintln!(
        "{}",
        report::plan_line(run_seed, plan, &KeySpec::list(&world.keys))
    );
    let targets = Targets {
        sidecars: SIDECARS,
        clients: RUST_CLIENTS + PYTHON_CLIENTS,
    };
    let faults = match plan.wrong_client {
        false => schedule::generate(plan, &targets),
        // The self-check: one fault only. The wrong client holds its key when its
        // sidecar loses the store: it hears `Lost` and keeps writing while another
        // sidecar's client is granted the key.
        true => vec![Fault {
            id: 1,
            at: Duration::from_millis(2500),
            dur: Duration::from_secs(6),
            act: Act::Link(Link::Store(0, 0), LinkFault::Blackhole),
        }],
    };
    let text = report::schedule(&faults);
    eprint!("{text}");

    // Every client process up (Python takes a moment to import grpc).
    let processes = world.clients.len();
    let up = super::common::topology::wait_until(Duration::from_secs(20), || {
        world.events().iter().filter(|e| e.ev == "start").count() >= processes
    })
    .await;
    assert!(
        up,
        "every client process started (see their logs in {})",
        world.dir.0.display()
    );
    let (start, t0) = (Instant::now(), now_ns());
    let set_up = began.elapsed();
    let stop_polling = CancellationToken::new();
    // Also when this round panics: the poller holds the world.
    let _polling = stop_polling.clone().drop_guard();
    let poller = tokio::spawn(nemesis::watch_masters(world.clone(), stop_polling.clone()));
    nemesis::run(world.clone(), faults.clone(), start).await;
    tokio::time::sleep_until(start + plan.window).await;

    let healer = world.clone();
    tokio::task::spawn_blocking(move || healer.heal())
        .await
        .expect("heal");
    if let Err(why) = world.topology.ready(Duration::from_secs(30)).await {
        eprintln!("warning: the topology did not serve again within 30 s of healing: {why}");
    }
    let heal_done = now_ns();
    let healed = start.elapsed().saturating_sub(plan.window);
    let alive: Vec<(String, usize)> = world
        .clients
        .iter()
        .zip(&world.client_sidecar)
        .map(|(c, s)| {
            let mut c = c.lock().expect("client");
            c.calm();
            (c.id(), *s)
        })
        // The self-check's wrong client is judged on its use only: it holds for long.
        .filter(|(id, _)| !id.starts_with("wrong"))
        .collect();
    let settling = Instant::now();
    settle(&world, heal_done, &alive).await;
    let settled = settling.elapsed();

    let stopping: Vec<_> = (0..world.clients.len())
        .map(|i| {
            let w = world.clone();
            tokio::task::spawn_blocking(move || {
                w.clients[i]
                    .lock()
                    .expect("client")
                    .stop(Duration::from_secs(6))
            })
        })
        .collect();
    for s in stopping {
        s.await.expect("stop a client");
    }
    let stop = now_ns();
    stop_polling.cancel();
    poller.await.expect("poller");
    let probing = Instant::now();
    let probes = probe(&world).await;
    let probed = probing.elapsed();

    let events = world.events();
    let writes = world.register.log();
    let records = world.records.lock().expect("records").clone();
    let changes = world.changes.lock().expect("changes").clone();
    let deaths = world.deaths.lock().expect("deaths").clone();
    let mut history = History::build(&events, &deaths, stop);
    history.asked.retain(|a| !a.holder.starts_with("wrong"));
    let names: BTreeMap<String, usize> = world
        .clients
        .iter()
        .zip(&world.client_sidecar)
        .map(|(c, s)| (c.lock().expect("client").name.clone(), *s))
        .collect();
    let sidecar_of = events
        .iter()
        .map(|e| e.process().to_owned())
        .filter_map(|p| Some((p.clone(), *names.get(p.split('#').next()?)?)))
        .collect();
    let ctx = Context {
        topo: plan.topo,
        acks: plan.acks,
        records: &records,
        changes: &changes,
        key_shard: &world.key_shard,
    };
    let phases = Phases {
        heal_done,
        stop,
        probes,
        alive,
        sidecar_of,
        deaths,
    };
    let findings = checker::check(&ctx, &history, &writes, &phases);
    let round = report::Round {
        run_seed,
        plan,
        t0,
        records: &records,
        changes: &changes,
        events: &events,
        writes: &writes,
        findings: &findings,
    };
    let violations = report::print(&round);
    if violations > 0 {
        let logs: Vec<_> = world
            .sidecars
            .iter()
            .map(|s| s.lock().expect("sidecar").log().to_owned())
            .collect();
        let saved = report::save(&round, &text, &logs);
        eprintln!("round {} saved in {}", plan.index, saved.display());
    }
    let summary = summarize(
        &findings,
        &history,
        records
            .iter()
            .filter(|r| r.note.starts_with("skipped"))
            .count(),
        records.len(),
    );
    eprintln!(
        "round {} ({}) done in {:.1} s (start {:.1}, heal {:.1}, settle {:.1}, probe {:.1}): {} faults, {} grants, {} violations, {} documented, {} failovers seen",
        plan.index,
        plan.topo.name(),
        began.elapsed().as_secs_f64(),
        set_up.as_secs_f64(),
        healed.as_secs_f64(),
        settled.as_secs_f64(),
        probed.as_secs_f64(),
        summary.faults,
        summary.grants,
        violations,
        summary.documented,
        changes.len()
    );
    summary
}

/// Waits until every key and every client process has been granted something since
/// `heal_done`, then a little more; at most hold-off + TTL + slack.
async fn settle(world: &World, heal_done: u64, alive: &[(String, usize)]) {
    let limit = Duration::from_nanos(0) + HOLD_OFF + TTL + SLACK;
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let events = world.events();
        let granted = |f: &dyn Fn(&super::history::Event) -> bool| {
            events
                .iter()
                .any(|e| e.ev == "granted" && e.t >= heal_done && f(e))
        };
        let keys = world.keys.iter().all(|k| granted(&|e| e.key == k.name));
        let clients = alive.iter().all(|(p, _)| granted(&|e| e.process() == p));
        if keys && clients {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// After the clients stopped: every key, taken in its own mode through sidecar s0.
async fn probe(world: &World) -> BTreeMap<String, Option<u64>> {
    let addr = world.sidecars[0].lock().expect("sidecar").addr();
    let mut probes = BTreeMap::new();
    let client = Client::connect(&addr).await.ok();
    for k in &world.keys {
        let options = LockOptions {
            wait: Some(HOLD_OFF + TTL + SLACK),
            limit: if k.kind == 'm' { k.limit } else { 0 },
            fair: k.kind == 'f',
            ..LockOptions::default()
        };
        let granted = match &client {
            Some(c) => match tokio::time::timeout(
                HOLD_OFF + TTL + SLACK * 2,
                c.lock_with(&k.name, options),
            )
            .await
            {
                Ok(Ok(lock)) => {
                    let at = now_ns();
                    let _ = lock.release().await;
                    Some(at)
                }
                _ => None,
            },
            None => None,
        };
        probes.insert(k.name.clone(), granted);
    }
    probes
}

fn summarize(findings: &[Finding], history: &History, skipped: usize, records: usize) -> Summary {
    let mut s = Summary {
        faults: records - skipped,
        grants: history.grants.values().map(Vec::len).sum(),
        ..Summary::default()
    };
    for f in findings {
        if f.allowed.is_some() {
            s.documented += 1;
            continue;
        }
        if f.grants.iter().any(|g| g.holder.starts_with("wrong")) {
            s.wrong_flagged += 1;
        }
        match f.kind {
            Kind::Overlap | Kind::OverLimit => s.overlaps += 1,
            Kind::TokenRegression => s.regressions += 1,
            Kind::StaleWrite => s.stale += 1,
            Kind::Stuck => s.stuck += 1,
            Kind::UseOutside | Kind::RegisterBroken | Kind::LostWithoutCause => s.other += 1,
        }
    }
    s
}
