//! What the bench prints: latency statistics, the table with its targets, and the same
//! figures as one JSON object.

use std::collections::HashMap;
use std::time::Duration;

use super::super::cost::MAIN_MEMORY_CYCLE_US;
use super::args::BenchArgs;

/// Latency percentiles and a rate.
pub(crate) struct Stats {
    pub(crate) p50: Duration,
    pub(crate) p99: Duration,
    pub(crate) max: Duration,
    /// Samples per second of `elapsed`.
    pub(crate) rate: f64,
}

impl Stats {
    /// Statistics of `samples` taken over `elapsed`; no sample at all is an error named
    /// by `what`.
    pub(crate) fn new(
        mut samples: Vec<Duration>,
        elapsed: Duration,
        what: &str,
    ) -> Result<Self, String> {
        if samples.is_empty() {
            return Err(format!("{what}: not one sample in {elapsed:?}"));
        }
        samples.sort_unstable();
        let rate = samples.len() as f64 / elapsed.as_secs_f64();
        let (p50, p99) = (percentile(&samples, 0.50), percentile(&samples, 0.99));
        Ok(Self {
            p50,
            p99,
            max: percentile(&samples, 1.0),
            rate,
        })
    }
}

/// Nearest-rank percentile of a sorted slice (zero when empty).
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied().unwrap_or_default()
}

/// A duration as a figure in microseconds.
pub(crate) fn us(d: Duration) -> Option<f64> {
    Some(d.as_secs_f64() * 1e6)
}

/// A duration as a figure in milliseconds.
pub(crate) fn ms(d: Duration) -> Option<f64> {
    Some(d.as_secs_f64() * 1e3)
}

/// kB as MB.
pub(crate) fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// The table, in order: JSON id and label. Handoff figures are grouped by measure, so
/// that 8 and 64 waiters of the same fairness sit on adjacent lines; "N waiters" are
/// N + 1 sessions on one key, "16 on 1 key" is 15 waiters. A label that names a
/// yardstick ("vs ...") has it in the baseline column, measured in the same run; the
/// other lines with a baseline have the same scripts called directly there.
#[rustfmt::skip]
const TABLE: &[(&str, &str)] = &[
    ("cycle1_p50_us", "cycle, 1 session: p50 (µs)"),
    ("cycle1_p99_us", "cycle, 1 session: p99 (µs)"),
    ("cycle1_per_s", "cycle, 1 session: cycles/s"),
    ("cycle64_p50_us", "cycle, 64 sessions: p50 (µs)"),
    ("cycle64_p99_us", "cycle, 64 sessions: p99 (µs)"),
    ("cycle64_per_s", "cycle, 64 sessions: cycles/s"),
    ("handoff8_p50_us", "handoff, 8 waiters: p50 (µs)"),
    ("handoff_p50_us", "handoff, 16 on 1 key: p50 (µs)"),
    ("handoff64_p50_us", "handoff, 64 waiters: p50 (µs)"),
    ("handoff8_fair_p50_us", "handoff, 8 waiters fair: p50 (µs)"),
    ("handoff64_fair_p50_us", "handoff, 64 waiters fair: p50 (µs)"),
    ("handoff8_p99_us", "handoff, 8 waiters: p99 (µs)"),
    ("handoff_p99_us", "handoff, 16 on 1 key: p99 (µs)"),
    ("handoff64_p99_us", "handoff, 64 waiters: p99 (µs)"),
    ("handoff8_fair_p99_us", "handoff, 8 waiters fair: p99 (µs)"),
    ("handoff64_fair_p99_us", "handoff, 64 waiters fair: p99 (µs)"),
    ("handoff8_per_s", "handoff, 8 waiters: grants/s"),
    ("handoff_per_s", "handoff, 16 on 1 key: grants/s"),
    ("handoff64_per_s", "handoff, 64 waiters: grants/s"),
    ("handoff8_fair_per_s", "handoff, 8 waiters fair: grants/s"),
    ("handoff64_fair_per_s", "handoff, 64 waiters fair: grants/s"),
    ("handoff8_commands", "handoff, 8 waiters: Redis commands/handoff"),
    ("handoff_commands", "handoff, 16 on 1 key: Redis commands/handoff"),
    ("handoff64_commands", "handoff, 64 waiters: Redis commands/handoff"),
    ("handoff8_fair_commands", "handoff, 8 waiters fair: Redis commands/handoff"),
    ("handoff64_fair_commands", "handoff, 64 waiters fair: Redis commands/handoff"),
    ("handoff8_evalsha", "handoff, 8 waiters: EVALSHA/handoff"),
    ("handoff_evalsha", "handoff, 16 on 1 key: EVALSHA/handoff"),
    ("handoff64_evalsha", "handoff, 64 waiters: EVALSHA/handoff"),
    ("handoff8_fair_evalsha", "handoff, 8 waiters fair: EVALSHA/handoff"),
    ("handoff64_fair_evalsha", "handoff, 64 waiters fair: EVALSHA/handoff"),
    ("handoff8_script_us", "handoff, 8 waiters: Redis script µs/handoff"),
    ("handoff_script_us", "handoff, 16 on 1 key: Redis script µs/handoff"),
    ("handoff64_script_us", "handoff, 64 waiters: Redis script µs/handoff"),
    ("handoff8_fair_script_us", "handoff, 8 waiters fair: Redis script µs/handoff"),
    ("handoff64_fair_script_us", "handoff, 64 waiters fair: Redis script µs/handoff"),
    ("sem_per_s", "semaphore, 4 of 32: grants/s"),
    ("sem_wait_p50_us", "semaphore, 4 of 32: acquire wait p50 (µs)"),
    ("sem_wait_p99_us", "semaphore, 4 of 32: acquire wait p99 (µs)"),
    ("sem_max_held", "semaphore, 4 of 32: most held at once"),
    ("sem_commands", "semaphore, 4 of 32: Redis commands/grant"),
    ("sem_script_us", "semaphore, 4 of 32: Redis script µs/grant"),
    ("death_p50_ms", "death to grant: p50 (ms)"),
    ("death_max_ms", "death to grant: max (ms)"),
    ("hold_commands_per_s", "locks held: Redis commands/s"),
    ("hold_evalsha_per_s", "locks held: EVALSHA/s"),
    ("hold_redis_cpu_percent", "locks held: Redis CPU (% core)"),
    ("hold_evalsha_per_s_1k", "locks held: EVALSHA/s per 1k"),
    ("hold_cpu_percent", "locks held: sidecar CPU (% core)"),
    ("hold_rss_before_mb", "locks held: RSS before taking (MB)"),
    ("hold_rss_mb", "locks held: sidecar RSS (MB)"),
    ("observe_p50_us", "cycle, traces+metrics on (vs off): p50 (µs)"),
    ("observe_p99_us", "cycle, traces+metrics on (vs off): p99 (µs)"),
    ("observe_per_s", "cycle, traces+metrics on (vs off): cycles/s"),
    ("observe_spans", "traces on: spans received by the OTLP sink"),
    ("cost_redis_cpu_us", "Redis CPU/cycle (µs) vs SET NX PX + script, same pace"),
    ("cost_redis_cpu_b2b_us", "Redis CPU/cycle (µs) vs the same, back to back"),
    ("cost_redis_commands", "Redis commands/cycle vs SET NX PX + script"),
    ("cost_sidecar_cpu_us", "sidecar CPU/cycle, Redis (µs) vs Redis' classic"),
    ("cost_memory_store_cpu_us", "sidecar CPU/cycle, memory (µs) vs Redis' classic"),
    ("cost_floor_cpu_us", "sidecar CPU/cycle, Redis (µs) vs tonic+redis-rs floor"),
    ("cost_memory_floor_cpu_us", "sidecar CPU/cycle, memory (µs) vs tonic floor"),
    ("cost_kernel_us", "  of it in the kernel, Redis (µs) vs the floor's"),
    ("cost_memory_kernel_us", "  of it in the kernel, memory (µs) vs the floor's"),
    ("cost_memory_bytes", "Redis bytes per held lock vs SET PX"),
    ("cost_memory_keys", "Redis keys per held lock vs SET PX"),
    ("cost_keys_left", "keys left after release and TTL vs classic"),
    ("idle_cpu_ms", "idle sidecars' CPU (ms) vs the busy one's"),
    ("idle_quiet_cpu_ms", "idle sidecars' CPU (ms) vs theirs, no contention"),
    ("idle_notices_per_release", "notices delivered per release"),
    ("idle_redis_cpu_us", "Redis CPU per release (µs), idle sidecars on"),
    ("idle_releases_per_s", "busy sidecar: releases/s"),
    ("scale_locks_take_s", "many locks: seconds to take them all"),
    ("scale_locks_failed", "many locks: refused or Lost while taking"),
    ("scale_locks_cpu_percent", "many locks held: sidecar CPU (% core)"),
    ("scale_locks_rss_mb", "many locks held: sidecar RSS (MB)"),
    ("scale_locks_evalsha_per_s", "many locks held: EVALSHA/s"),
    ("scale_locks_redis_cpu_percent", "many locks held: Redis CPU (% core)"),
    ("scale_locks_events", "many locks held: Lost (or other events)"),
    ("scale_sessions_open_s", "many sessions: seconds to open and lock"),
    ("scale_sessions_cpu_percent", "many sessions, 1 lock each: CPU (% core)"),
    ("scale_sessions_rss_mb", "many sessions, 1 lock each: RSS (MB)"),
    ("scale_sessions_events", "many sessions: Lost (or other events)"),
    ("watch_seen_p50_ms", "election: grant → watcher: p50 (ms)"),
    ("watch_seen_p99_ms", "election: grant → watcher: p99 (ms)"),
    ("takeover_p50_ms", "election: leader killed → next grant: p50 (ms)"),
    ("takeover_max_ms", "election: leader killed → next grant: max (ms)"),
    ("takeover_seen_p50_ms", "election: leader killed → watcher: p50 (ms)"),
    ("takeover_seen_max_ms", "election: leader killed → watcher: max (ms)"),
];

/// The figure that the target of `id` is relative to, when it is another line's.
fn baseline(id: &str) -> Option<&'static str> {
    match id {
        "handoff64_commands" => Some("handoff8_commands"),
        "handoff64_fair_commands" => Some("handoff8_fair_commands"),
        _ => None,
    }
}

/// The target of figure `id` (the README's Benchmark section) and whether `f` meets
/// it (`None`: nothing measured to compare); `base` is the sidecar figure of the
/// [`baseline`] line.
fn target(id: &str, f: Figures, base: Option<f64>) -> Option<(&'static str, Option<bool>)> {
    let (ratio, v) = (f.ratio(), f.sidecar);
    let within = |times: f64| v.zip(base).map(|(v, b)| v <= times * b);
    Some(match id {
        "cycle1_p50_us" | "cycle64_p50_us" => ("≤ 2× direct", ratio.map(|r| r <= 2.0)),
        "cycle1_per_s" | "cycle64_per_s" => ("≥ 0.5× direct", ratio.map(|r| r >= 0.5)),
        "handoff_p50_us" => ("≤ 1 ms", v.map(|v| v <= 1000.0)),
        "handoff64_p50_us" | "handoff64_fair_p50_us" => ("≤ 2 ms", v.map(|v| v <= 2000.0)),
        // Constant in the number of waiters, with room for noise and waiter refreshes.
        "handoff64_commands" | "handoff64_fair_commands" => ("≤ 1.5× 8 waiters", within(1.5)),
        "sem_max_held" => ("≤ 4 permits", v.map(|v| v <= 4.0)),
        "death_p50_ms" => ("≤ 50 ms", v.map(|v| v <= 50.0)),
        "hold_cpu_percent" => ("≤ 1% of a core", v.map(|v| v <= 1.0)),
        "hold_rss_mb" => ("≤ 50 MB", v.map(|v| v <= 50.0)),
        "observe_p50_us" => ("≤ 1.10× off", ratio.map(|r| r <= 1.10)),
        "cost_redis_cpu_us" | "cost_memory_bytes" => ("≤ 1.5×", ratio.map(|r| r <= 1.5)),
        "cost_sidecar_cpu_us" => ("≤ 2.5×", ratio.map(|r| r <= 2.5)),
        "cost_memory_store_cpu_us" => ("≤ ½ main's", v.map(|v| v <= MAIN_MEMORY_CYCLE_US / 2.0)),
        "cost_keys_left" => ("0", v.map(|v| v == 0.0)),
        "idle_cpu_ms" => ("≤ 0.1×", ratio.map(|r| r <= 0.1)),
        "idle_notices_per_release" => ("≤ 1", v.map(|v| v <= 1.0)),
        "scale_locks_cpu_percent" => ("≤ 3% of a core", v.map(|v| v <= 3.0)),
        "scale_locks_rss_mb" => ("≤ 100 MB", v.map(|v| v <= 100.0)),
        "scale_locks_failed" | "scale_locks_events" | "scale_sessions_events" => {
            ("0", v.map(|v| v == 0.0))
        }
        // Milliseconds where etcd and ZooKeeper wait out a session timeout (seconds).
        "watch_seen_p50_ms" => ("≤ 10 ms", v.map(|v| v <= 10.0)),
        "takeover_p50_ms" | "takeover_seen_p50_ms" => ("≤ 50 ms", v.map(|v| v <= 50.0)),
        _ => return None,
    })
}

/// One measured line: the sidecar's figure and, where there is one, the direct figure.
#[derive(Clone, Copy, Default)]
struct Figures {
    sidecar: Option<f64>,
    direct: Option<f64>,
}

impl Figures {
    fn ratio(self) -> Option<f64> {
        self.sidecar
            .zip(self.direct.filter(|d| *d > 0.0))
            .map(|(s, d)| s / d)
    }
}

/// Everything measured, by JSON id.
#[derive(Default)]
pub(crate) struct Report {
    figures: HashMap<String, Figures>,
    /// Tables of their own (commandstats per cycle, the fleet), printed after the main
    /// one and listed in the JSON.
    pub(crate) tables: Vec<Table>,
    /// Printed under the tables and listed in the JSON.
    pub(crate) notes: Vec<String>,
    /// Phases that failed, with their errors (also in the notes).
    pub(crate) failed: Vec<String>,
}

/// A table of figures with its own columns: one labelled row per item.
pub(crate) struct Table {
    pub(crate) title: String,
    pub(crate) columns: Vec<String>,
    pub(crate) rows: Vec<(String, Vec<Option<f64>>)>,
}

impl Table {
    pub(crate) fn new(title: &str, columns: &[&str]) -> Self {
        Self {
            title: title.into(),
            columns: columns.iter().map(|c| (*c).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; `cells` go with [`Self::columns`] in order.
    pub(crate) fn row(&mut self, label: impl Into<String>, cells: Vec<Option<f64>>) {
        self.rows.push((label.into(), cells));
    }

    fn print(&self) {
        println!();
        println!("{}", self.title);
        let width = self.rows.iter().map(|(l, _)| l.chars().count()).max();
        let width = width.unwrap_or(0).max(8);
        let heads: Vec<String> = self.columns.iter().map(|c| format!("{c:>14}")).collect();
        println!("{:<width$} {}", "", heads.join(" "));
        for (label, cells) in &self.rows {
            let cells: Vec<String> = cells
                .iter()
                .map(|c| format!("{:>14}", figure(*c)))
                .collect();
            println!("{label:<width$} {}", cells.join(" "));
        }
    }

    fn json(&self) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| json_str(c)).collect();
        let rows: Vec<String> = self
            .rows
            .iter()
            .map(|(label, cells)| {
                let cells: Vec<String> = cells.iter().map(|c| json_num(*c)).collect();
                format!("[{},{}]", json_str(label), cells.join(","))
            })
            .collect();
        format!(
            "{{\"title\":{},\"columns\":[{}],\"rows\":[{}]}}",
            json_str(&self.title),
            columns.join(","),
            rows.join(",")
        )
    }
}

impl Report {
    /// Records figure `id`; `direct` is `None` where Redis alone has no counterpart.
    pub(crate) fn put(&mut self, id: impl Into<String>, sidecar: Option<f64>, direct: Option<f64>) {
        self.figures.insert(id.into(), Figures { sidecar, direct });
    }

    /// Records a phase's failure, if it failed, as a note and in [`Self::failed`].
    pub(crate) fn check(&mut self, phase: &str, result: Result<(), String>) {
        if let Err(e) = result {
            eprintln!("bench: {phase} FAILED: {e}");
            self.notes.push(format!("{phase} FAILED: {e}"));
            self.failed.push(format!("{phase}: {e}"));
        }
    }

    fn figures(&self, id: &str) -> Figures {
        self.figures.get(id).copied().unwrap_or_default()
    }

    fn rows(&self) -> impl Iterator<Item = (&'static str, &'static str, Figures)> + '_ {
        TABLE
            .iter()
            .map(move |&(id, label)| (id, label, self.figures(id)))
    }

    /// The target of line `id` and whether `f` meets it, see [`target`].
    fn target(&self, id: &str, f: Figures) -> Option<(&'static str, Option<bool>)> {
        let base = baseline(id).and_then(|b| self.figures(b).sidecar);
        target(id, f, base)
    }

    /// Prints the lines that were measured, the other tables, then the notes.
    pub(crate) fn print(&self) {
        let head = ("phase", "sidecar", "baseline", "ratio");
        let measured = |(_, _, f): &(&str, &str, Figures)| f.sidecar.or(f.direct).is_some();
        if self.rows().any(|row| measured(&row)) {
            println!(
                "{:<50} {:>10} {:>10} {:>8}   target",
                head.0, head.1, head.2, head.3
            );
        }
        for (id, label, f) in self.rows().filter(measured) {
            let ratio = f.ratio().map_or(String::new(), |r| format!("{r:.2}×"));
            let target = self.target(id, f).map_or(String::new(), |(text, met)| {
                let verdict = met.map_or("n/a", |met| if met { "ok" } else { "MISSED" });
                format!("{text} {verdict}")
            });
            let direct = f.direct.map_or(String::new(), |d| figure(Some(d)));
            let sidecar = figure(f.sidecar);
            println!("{label:<50} {sidecar:>10} {direct:>10} {ratio:>8}   {target}");
        }
        for table in &self.tables {
            table.print();
        }
        println!();
        for note in &self.notes {
            println!("note: {note}");
        }
    }

    /// The whole result as one line of JSON, with the flags that shaped it.
    pub(crate) fn json(&self, args: &BenchArgs) -> String {
        let result = |(id, _, f): (&str, &str, Figures)| {
            let (text, met) = self
                .target(id, f)
                .map_or((None, None), |(t, m)| (Some(t), m));
            let text = text.map_or("null".into(), json_str);
            let met = met.map_or("null".into(), |m| m.to_string());
            let (s, d, r) = (json_num(f.sidecar), json_num(f.direct), json_num(f.ratio()));
            let figures = format!("\"sidecar\":{s},\"direct\":{d},\"ratio\":{r}");
            format!("\"{id}\":{{{figures},\"target\":{text},\"met\":{met}}}")
        };
        let results: Vec<String> = self.rows().map(result).collect();
        let tables: Vec<String> = self.tables.iter().map(Table::json).collect();
        let notes: Vec<String> = self.notes.iter().map(|n| json_str(n)).collect();
        let sidecar = args.sidecar.as_deref().map_or("null".into(), json_str);
        let phases: Vec<String> = args.phases.iter().map(|p| json_str(p.name())).collect();
        format!(
            "{{\"lockside_version\":\"{}\",\"seconds\":{},\"locks\":{},\"sidecar\":{sidecar},\
             \"phases\":[{}],\"failed\":{},\"results\":{{{}}},\"tables\":[{}],\"notes\":[{}]}}",
            env!("CARGO_PKG_VERSION"),
            args.seconds,
            args.locks,
            phases.join(","),
            !self.failed.is_empty(),
            results.join(","),
            tables.join(","),
            notes.join(",")
        )
    }
}

/// A table cell: three significant digits or so, "n/a" when nothing was measured.
fn figure(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// A JSON number; `null` for nothing measured, and for NaN and infinities, which JSON
/// cannot carry.
fn json_num(v: Option<f64>) -> String {
    v.filter(|v| v.is_finite())
        .map_or("null".into(), |v| format!("{v:.3}"))
}

/// A JSON string literal, escaped by hand: one flat object does not earn a JSON crate.
fn json_str(s: &str) -> String {
    let escaped: String = s
        .chars()
        .map(|c| match c {
            '"' => "\\\"".into(),
            '\\' => "\\\\".into(),
            c if c.is_control() => format!("\\u{:04x}", u32::from(c)),
            c => c.to_string(),
        })
        .collect();
    format!("\"{escaped}\"")
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 0.50), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples[..1], 0.99), Duration::from_millis(1));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn commands_per_handoff_are_judged_against_8_waiters() {
        let mut report = Report::default();
        report.put("handoff8_commands", Some(40.0), None);
        report.put("handoff64_commands", Some(59.0), None);
        report.put("handoff8_fair_commands", Some(40.0), None);
        report.put("handoff64_fair_commands", Some(61.0), None);
        let met = |id| report.target(id, report.figures(id)).and_then(|(_, m)| m);
        assert_eq!(met("handoff64_commands"), Some(true));
        assert_eq!(met("handoff64_fair_commands"), Some(false));
        assert_eq!(met("handoff64_p50_us"), None, "nothing measured");
    }

    #[test]
    fn table_ids_are_unique() {
        let mut ids: Vec<&str> = TABLE.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), TABLE.len());
    }

    #[test]
    fn every_target_names_a_line_of_the_table() {
        let ids: Vec<&str> = TABLE.iter().map(|(id, _)| *id).collect();
        let f = Figures {
            sidecar: Some(1.0),
            direct: Some(1.0),
        };
        for id in [
            "cost_redis_cpu_us",
            "idle_notices_per_release",
            "scale_locks_rss_mb",
        ] {
            assert!(ids.contains(&id), "{id}");
            assert!(target(id, f, None).is_some(), "{id}");
        }
    }

    #[test]
    fn cost_targets_are_ratios_to_the_yardstick() {
        let judge = |id, sidecar, direct| {
            let f = Figures {
                sidecar: Some(sidecar),
                direct: Some(direct),
            };
            target(id, f, None).and_then(|(_, met)| met)
        };
        assert_eq!(judge("cost_redis_cpu_us", 150.0, 45.0), Some(false));
        assert_eq!(judge("cost_redis_cpu_us", 60.0, 45.0), Some(true));
        assert_eq!(judge("cost_memory_bytes", 563.0, 195.0), Some(false));
        assert_eq!(judge("cost_sidecar_cpu_us", 110.0, 45.0), Some(true));
        assert_eq!(judge("cost_keys_left", 2000.0, 0.0), Some(false));
        assert_eq!(judge("cost_keys_left", 0.0, 0.0), Some(true));
    }

    #[test]
    fn tables_become_json() {
        let mut table = Table::new("t \"1\"", &["a", "b"]);
        table.row("SET", vec![Some(1.0), None]);
        assert_eq!(
            table.json(),
            "{\"title\":\"t \\\"1\\\"\",\"columns\":[\"a\",\"b\"],\"rows\":[[\"SET\",1.000,null]]}"
        );
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
