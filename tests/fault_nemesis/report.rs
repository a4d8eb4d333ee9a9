//! What a round prints: its plan and schedule before it runs; after it, each violation
//! with the seed, the two (or more) grants with their segments of use, the faults
//! around it and the holders' events, from the recorded history; the findings the docs
//! allow, counted with their reason; and, for a round with violations, its whole
//! history saved under `target/nemesis/SEED/` for a closer look.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::checker::{Finding, Kind};
use super::history::{Cut, Event, Grant};
use super::plan::RoundPlan;
use super::register::Write;
use super::schedule::Fault;
use super::world::{MasterChange, Record};

/// Everything a round's report reads.
pub struct Round<'a> {
    pub run_seed: u64,
    pub plan: &'a RoundPlan,
    pub t0: u64,
    pub records: &'a [Record],
    pub changes: &'a [MasterChange],
    pub events: &'a [Event],
    pub writes: &'a [Write],
    pub findings: &'a [Finding],
}

/// Seconds since the round's start, signed, for printing.
fn rel(t0: u64, t: u64) -> String {
    if t == u64::MAX {
        return "end".into();
    }
    format!("{:+.3}s", (t as i128 - t0 as i128) as f64 / 1e9)
}

pub fn plan_line(run_seed: u64, plan: &RoundPlan, keys: &str) -> String {
    format!(
        "nemesis round {} ({}): run seed {run_seed}, round seed {}, faults for {} s, \
         --min-replica-acks {}, sidecar clock rates {:?}{}, keys {keys}{}",
        plan.index,
        plan.topo.name(),
        plan.seed,
        plan.window.as_secs(),
        plan.acks,
        plan.rates,
        match plan.topo {
            super::plan::Topo::Cluster =>
                format!(", cluster-node-timeout {} ms", plan.node_timeout),
            _ => String::new(),
        },
        if plan.wrong_client {
            ", with the wrong client"
        } else {
            ""
        },
    )
}

pub fn schedule(faults: &[Fault]) -> String {
    faults.iter().map(|f| format!("  {f}\n")).collect()
}

fn grant_line(t0: u64, g: &Grant) -> String {
    let segments: Vec<String> = g
        .segments
        .iter()
        .map(|s| {
            let cut = match &s.cut {
                Cut::Lost(why) => format!("lost: {why}"),
                other => format!("{other:?}").to_lowercase(),
            };
            format!("{}..{} ({cut})", rel(t0, s.start), rel(t0, s.end))
        })
        .collect();
    format!(
        "{} key {} mode {}{} token {}: asked {}, granted {}, used {}",
        g.holder,
        g.key,
        g.mode,
        if g.limit > 0 {
            format!("/{}", g.limit)
        } else {
            String::new()
        },
        g.token,
        rel(t0, g.asked),
        rel(t0, g.granted),
        segments.join(", ")
    )
}

fn record_line(t0: u64, r: &Record) -> String {
    let mut what = format!(
        "#{} {}..{}  {}",
        r.fault.id,
        rel(t0, r.start),
        rel(t0, r.end),
        r.fault.act
    );
    if let Some(port) = r.port {
        let _ = write!(what, " [node {port}]");
    }
    if let Some(p) = &r.process {
        let _ = write!(what, " [{p}]");
    }
    if !r.note.is_empty() {
        let _ = write!(what, " ({})", r.note);
    }
    what
}

/// The text of one finding, with the faults and events around it.
pub fn finding(round: &Round, f: &Finding) -> String {
    let t0 = round.t0;
    let mut out = String::new();
    let head = match f.allowed {
        None => "VIOLATION",
        Some(_) => "documented",
    };
    let _ = writeln!(
        out,
        "{head} (run seed {}, round {} {}, round seed {}): {:?} on key {:?}: {}",
        round.run_seed,
        round.plan.index,
        round.plan.topo.name(),
        round.plan.seed,
        f.kind,
        f.key,
        f.text
    );
    if let Some(why) = f.allowed {
        let _ = writeln!(out, "  allowed: {}", why.why());
    }
    for g in &f.grants {
        let _ = writeln!(out, "  grant: {}", grant_line(t0, g));
    }
    let (from, to) = (
        f.span.0.saturating_sub(4_000_000_000),
        f.span.1.saturating_add(1_000_000_000),
    );
    let _ = writeln!(out, "  faults around it:");
    for r in round
        .records
        .iter()
        .filter(|r| r.start <= to && r.end >= from)
    {
        let _ = writeln!(out, "    {}", record_line(t0, r));
    }
    for c in round.changes.iter().filter(|c| c.t >= from && c.t <= to) {
        let _ = writeln!(
            out,
            "    {}  shard {} master {:?} -> {:?}",
            rel(t0, c.t),
            c.shard,
            c.from,
            c.to
        );
    }
    let holders: Vec<&str> = f.grants.iter().map(|g| g.holder.as_str()).collect();
    let _ = writeln!(out, "  their events:");
    for e in round
        .events
        .iter()
        .filter(|e| holders.contains(&e.h.as_str()) && e.t >= from && e.t <= to)
    {
        if e.key == f.key || e.ev == "start" {
            let _ = writeln!(
                out,
                "    {} {} {} {} n={} token={} {}",
                rel(t0, e.t),
                e.h,
                e.ev,
                e.key,
                e.n,
                e.token,
                e.why
            );
        }
    }
    let tokens: Vec<u64> = f.grants.iter().map(|g| g.token).collect();
    let writes: Vec<&Write> = round
        .writes
        .iter()
        .filter(|w| w.key == f.key && tokens.contains(&w.token) && w.sent >= from && w.sent <= to)
        .collect();
    let _ = writeln!(out, "  register writes with their tokens: {}", writes.len());
    let shown: Vec<&&Write> = match writes.len() <= 12 {
        true => writes.iter().collect(),
        false => writes
            .iter()
            .take(6)
            .chain(writes.iter().skip(writes.len() - 6))
            .collect(),
    };
    for w in shown {
        let _ = writeln!(
            out,
            "    {} {} token {} {}",
            rel(t0, w.sent),
            w.holder,
            w.token,
            if w.accepted { "accepted" } else { "refused" }
        );
    }
    out
}

/// Prints a round's findings: every violation in full (the first 12), the allowed ones
/// counted by reason (the first of each in full). Returns the number of violations.
pub fn print(round: &Round) -> usize {
    let violations: Vec<&Finding> = round
        .findings
        .iter()
        .filter(|f| f.allowed.is_none())
        .collect();
    for f in violations.iter().take(12) {
        eprint!("{}", finding(round, f));
    }
    if violations.len() > 12 {
        eprintln!(
            "... and {} more violations (saved with the round)",
            violations.len() - 12
        );
    }
    let mut allowed: std::collections::BTreeMap<(Kind, String), Vec<&Finding>> = Default::default();
    for f in round.findings.iter().filter(|f| f.allowed.is_some()) {
        let why = f.allowed.map(|a| a.why()).unwrap_or_default();
        allowed.entry((f.kind, why.to_owned())).or_default().push(f);
    }
    // Why locks were lost, in words (ids and numbers left out), most frequent first.
    let mut lost: std::collections::BTreeMap<String, usize> = Default::default();
    for e in round.events.iter().filter(|e| e.ev == "lost") {
        let words: String = e
            .why
            .split(|c: char| c.is_ascii_digit())
            .collect::<Vec<_>>()
            .join("N");
        *lost.entry(words.chars().take(200).collect()).or_default() += 1;
    }
    let mut lost: Vec<_> = lost.into_iter().collect();
    lost.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    for (why, n) in lost.iter().take(6) {
        eprintln!("  lost x{n}: {why}");
    }
    for ((kind, why), fs) in &allowed {
        eprintln!(
            "documented: {} {kind:?} finding(s), expected as {why}; the first:",
            fs.len()
        );
        eprint!("{}", finding(round, fs[0]));
    }
    violations.len()
}

/// Saves a round's history under `target/nemesis/SEED/round-N-TOPO/`; returns where.
pub fn save(round: &Round, schedule: &str, logs: &[PathBuf]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target/nemesis")
        .join(round.run_seed.to_string())
        .join(format!(
            "round-{}-{}",
            round.plan.index,
            round.plan.topo.name()
        ));
    let _ = std::fs::create_dir_all(&dir);
    let t0 = round.t0;
    let events: String = round
        .events
        .iter()
        .filter_map(|e| serde_json::to_string(e).ok())
        .map(|l| l + "\n")
        .collect();
    let writes: String = round
        .writes
        .iter()
        .map(|w| {
            format!(
                "{} {} {} {} {} {} {}\n",
                rel(t0, w.received),
                rel(t0, w.sent),
                w.key,
                w.token,
                w.holder,
                w.fenced,
                w.accepted
            )
        })
        .collect();
    let mut faults: String = round
        .records
        .iter()
        .map(|r| record_line(t0, r) + "\n")
        .collect();
    for c in round.changes {
        let _ = writeln!(
            faults,
            "{}  shard {} master {:?} -> {:?}",
            rel(t0, c.t),
            c.shard,
            c.from,
            c.to
        );
    }
    let findings: String = round.findings.iter().map(|f| finding(round, f)).collect();
    let _ = std::fs::write(
        dir.join("schedule.txt"),
        format!("t0 = {t0} ns (CLOCK_MONOTONIC)\n{schedule}"),
    );
    let _ = std::fs::write(dir.join("events.jsonl"), events);
    let _ = std::fs::write(dir.join("register.txt"), writes);
    let _ = std::fs::write(dir.join("faults.txt"), faults);
    let _ = std::fs::write(dir.join("findings.txt"), findings);
    for log in logs {
        if let Some(name) = log.file_name() {
            let _ = std::fs::copy(log, dir.join(name));
        }
    }
    dir
}
