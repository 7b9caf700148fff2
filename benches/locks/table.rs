//! The printed table: one [`Row`] per figure (value with its unit, an optional ratio with
//! its basis, an optional target and verdict) and the markdown it renders to. Formatting
//! only: every number arrives already computed.

use std::fmt::Write as _;

/// How a value is printed.
#[derive(Clone, Copy)]
pub(crate) enum Unit {
    Us,
    Ms,
    PerSec,
    Count,
    Bytes,
    Pct,
    X,
}

fn fmt_value(v: f64, unit: Unit) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    match unit {
        Unit::Us => format!("{v:.1} µs"),
        Unit::Ms => format!("{v:.2} ms"),
        Unit::PerSec => format!("{v:.0}/s"),
        Unit::Count => {
            if v.fract() == 0.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        Unit::Bytes => format!("{v:.0} B"),
        Unit::Pct => format!("{v:.1} %"),
        Unit::X => format!("{v:.2}x"),
    }
}

/// One row of the table; ratio, target and verdict are empty until set.
pub(crate) struct Row {
    workload: String,
    imp: String,
    metric: String,
    value: String,
    ratio: String,
    target: String,
    met: String,
}

impl Row {
    /// The ratio column, printed as `N.NNx` followed by its basis.
    pub(crate) fn ratio(&mut self, r: f64, basis: &str) -> &mut Row {
        self.ratio = if r.is_nan() {
            "n/a".into()
        } else {
            format!("{r:.2}x {basis}")
        };
        self
    }

    /// The target column (text only; the verdict is [`Row::met`]).
    pub(crate) fn target(&mut self, target: &str) -> &mut Row {
        self.target = target.into();
        self
    }

    /// The verdict column: yes or **NO**.
    pub(crate) fn met(&mut self, met: bool) -> &mut Row {
        self.met = if met { "yes" } else { "**NO**" }.into();
        self
    }
}

/// The rows, in the order they print.
#[derive(Default)]
pub(crate) struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// Adds a row with its value; set ratio, target and verdict on the returned row.
    pub(crate) fn row(
        &mut self,
        workload: &str,
        imp: &str,
        metric: &str,
        value: f64,
        unit: Unit,
    ) -> &mut Row {
        self.rows.push(Row {
            workload: workload.into(),
            imp: imp.into(),
            metric: metric.into(),
            value: fmt_value(value, unit),
            ratio: String::new(),
            target: String::new(),
            met: String::new(),
        });
        self.rows.last_mut().expect("a row was just pushed")
    }

    /// The table as markdown, header first.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::from(
            "| workload | implementation | metric | value | ratio | target | met? |\n\
             |---|---|---|---:|---:|---|---|\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.workload, r.imp, r.metric, r.value, r.ratio, r.target, r.met
            );
        }
        s
    }
}
