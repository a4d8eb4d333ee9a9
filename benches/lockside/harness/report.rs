//! What the bench prints: latency statistics, the main table (the phases' [`Row`]s)
//! with its targets, tables of their own, notes, and the same as one JSON object.

use std::collections::HashMap;
use std::time::Duration;

use super::args::BenchArgs;
use super::rows::{Figures, Row};

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

/// Everything measured: the main table's figures by line, and the rest.
pub(crate) struct Report {
    /// The main table's lines, in order.
    table: Vec<Row>,
    figures: HashMap<&'static str, Figures>,
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
    /// A report whose main table has the lines of `table`, in that order.
    pub(crate) fn new(table: impl IntoIterator<Item = Row>) -> Self {
        Self {
            table: table.into_iter().collect(),
            figures: HashMap::new(),
            tables: Vec::new(),
            notes: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Records the figures of line `row`; `direct` is `None` where Redis alone has no
    /// counterpart. A line that is not in the table fails the run, so that no figure
    /// goes unprinted unnoticed.
    pub(crate) fn put(&mut self, row: &Row, sidecar: Option<f64>, direct: Option<f64>) {
        if !self.table.iter().any(|line| line.id == row.id) {
            let missing = Err(format!("{} is not a line of the table (main.rs)", row.id));
            return self.check("the report", missing);
        }
        self.figures.insert(row.id, Figures { sidecar, direct });
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

    fn rows(&self) -> impl Iterator<Item = (&Row, Figures)> + '_ {
        self.table
            .iter()
            .map(move |row| (row, self.figures(row.id)))
    }

    /// The target of line `row` and whether its figures meet it, see [`Row::judge`].
    pub(crate) fn target(&self, row: &Row) -> Option<(&'static str, Option<bool>)> {
        let base = row.baseline().and_then(|b| self.figures(b.id).sidecar);
        row.judge(self.figures(row.id), base)
    }

    /// Prints the lines that were measured, the other tables, then the notes.
    pub(crate) fn print(&self) {
        let head = ("phase", "sidecar", "baseline", "ratio");
        let measured = |(_, f): &(&Row, Figures)| f.sidecar.or(f.direct).is_some();
        if self.rows().any(|row| measured(&row)) {
            println!(
                "{:<50} {:>10} {:>10} {:>8}   target",
                head.0, head.1, head.2, head.3
            );
        }
        for (row, f) in self.rows().filter(measured) {
            let ratio = f.ratio().map_or(String::new(), |r| format!("{r:.2}×"));
            let target = self.target(row).map_or(String::new(), |(text, met)| {
                let verdict = met.map_or("n/a", |met| if met { "ok" } else { "MISSED" });
                format!("{text} {verdict}")
            });
            let direct = f.direct.map_or(String::new(), |d| figure(Some(d)));
            let sidecar = figure(f.sidecar);
            let label = row.label;
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
        let result = |(row, f): (&Row, Figures)| {
            let (text, met) = self.target(row).map_or((None, None), |(t, m)| (Some(t), m));
            let text = text.map_or("null".into(), json_str);
            let met = met.map_or("null".into(), |m| m.to_string());
            let (s, d, r) = (json_num(f.sidecar), json_num(f.direct), json_num(f.ratio()));
            let figures = format!("\"sidecar\":{s},\"direct\":{d},\"ratio\":{r}");
            let id = row.id;
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
    fn a_line_not_in_the_table_fails_the_run() {
        const IN: Row = Row::new("in", "a line of the table");
        const OUT: Row = Row::new("out", "a line of no table");
        let mut report = Report::new([IN]);
        report.put(&IN, Some(1.0), None);
        assert!(report.failed.is_empty());
        report.put(&OUT, Some(1.0), None);
        assert_eq!(
            report.failed,
            ["the report: out is not a line of the table (main.rs)"]
        );
        assert_eq!(report.figures("in").sidecar, Some(1.0));
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
