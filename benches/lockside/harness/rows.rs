//! The lines of the main table as typed values. Each phase declares the lines it fills
//! as [`Row`] constants, with their targets, and lists them in its `ROWS`; main.rs
//! puts the phases' lists in the table's order. A phase records a figure by its
//! constant, so a misspelt line is a compile error, and a line left out of the table
//! fails the run ([`super::report::Report::put`]) instead of vanishing from it.

/// One line of the main table: its JSON id, its label and, if it has one, its target
/// (the README's Benchmark section).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    pub(crate) id: &'static str,
    pub(crate) label: &'static str,
    pub(crate) target: Option<Target>,
}

/// What a line's figures must meet: the words printed, and the rule that judges them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target {
    pub(crate) text: &'static str,
    pub(crate) rule: Rule,
}

/// How a target judges a line's [`Figures`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Rule {
    /// The sidecar figure over the baseline's is at most this.
    RatioAtMost(f64),
    /// The sidecar figure over the baseline's is at least this.
    RatioAtLeast(f64),
    /// The sidecar figure is at most this.
    AtMost(f64),
    /// The sidecar figure is zero.
    Zero,
    /// The sidecar figure is at most this many times the sidecar figure of that line.
    TimesLine(f64, &'static Row),
}

impl Row {
    /// A line without a target.
    pub(crate) const fn new(id: &'static str, label: &'static str) -> Self {
        Self {
            id,
            label,
            target: None,
        }
    }

    /// This line with a target: `text` is what the table prints, `rule` judges.
    pub(crate) const fn target(self, text: &'static str, rule: Rule) -> Self {
        Self {
            target: Some(Target { text, rule }),
            ..self
        }
    }

    /// The line whose sidecar figure the target is relative to, if it is another's.
    pub(crate) fn baseline(&self) -> Option<&'static Row> {
        match self.target?.rule {
            Rule::TimesLine(_, line) => Some(line),
            _ => None,
        }
    }

    /// The target's words and whether `f` meets it (`None`: nothing measured to
    /// compare); `base` is the sidecar figure of the [`Self::baseline`] line.
    pub(crate) fn judge(
        &self,
        f: Figures,
        base: Option<f64>,
    ) -> Option<(&'static str, Option<bool>)> {
        let target = self.target?;
        let (ratio, v) = (f.ratio(), f.sidecar);
        let met = match target.rule {
            Rule::RatioAtMost(most) => ratio.map(|r| r <= most),
            Rule::RatioAtLeast(least) => ratio.map(|r| r >= least),
            Rule::AtMost(most) => v.map(|v| v <= most),
            Rule::Zero => v.map(|v| v == 0.0),
            Rule::TimesLine(times, _) => v.zip(base).map(|(v, b)| v <= times * b),
        };
        Some((target.text, met))
    }
}

/// One measured line: the sidecar's figure and, where there is one, the baseline's.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Figures {
    pub(crate) sidecar: Option<f64>,
    pub(crate) direct: Option<f64>,
}

impl Figures {
    pub(crate) fn ratio(self) -> Option<f64> {
        self.sidecar
            .zip(self.direct.filter(|d| *d > 0.0))
            .map(|(s, d)| s / d)
    }
}
