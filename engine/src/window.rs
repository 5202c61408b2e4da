//! The logical window a run owns, and which partitions fall inside it.
//!
//! A run for `--date D` owns the half-open window `[run_start, run_end)` of its grain
//! (a day, an hour or a month, in UTC). It replaces every partition its output
//! touches, and every partition whose time value lies inside the window even when the
//! output has no rows for it: such a partition becomes empty instead of keeping stale
//! rows. A partition value denotes an interval at its own resolution (`2026-06` is a
//! month, `2026-06-04` a day); a partition is owned when its interval lies inside
//! the window.

use chrono::{Datelike, Duration, NaiveDate, NaiveDateTime, NaiveTime};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Grain {
    Hour,
    #[default]
    Day,
    Month,
}

impl std::fmt::Display for Grain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Grain::Hour => "hour",
            Grain::Day => "day",
            Grain::Month => "month",
        })
    }
}

/// The window of one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub grain: Grain,
    /// Start of the window the run owns (the logical date's unit, or earlier with a
    /// lookback).
    pub start: NaiveDateTime,
    pub end: NaiveDateTime,
    /// Start of the logical date's own unit.
    pub logical: NaiveDateTime,
}

impl Window {
    /// Parses `--date` for a job of `grain`: `YYYY-MM-DD` for days, `YYYY-MM-DDTHH` for
    /// hours, `YYYY-MM` (or `YYYY-MM-01`) for months.
    pub fn parse(grain: Grain, value: &str) -> Result<Window> {
        let bad = |message: String| Error::BadDate {
            value: value.to_string(),
            message,
        };
        let v = value.trim();
        let start = match grain {
            Grain::Day => {
                let d = NaiveDate::parse_from_str(v, "%Y-%m-%d").map_err(|_| {
                    bad(if v.contains('T') {
                        "this job's grain is day; give the date as YYYY-MM-DD".into()
                    } else {
                        "expected a date as YYYY-MM-DD".into()
                    })
                })?;
                d.and_time(NaiveTime::MIN)
            }
            Grain::Hour => {
                NaiveDateTime::parse_from_str(&format!("{v}:00:00"), "%Y-%m-%dT%H:%M:%S")
                    .map_err(|_| bad("this job's grain is hour; give it as YYYY-MM-DDTHH".into()))?
            }
            Grain::Month => {
                let d = NaiveDate::parse_from_str(&format!("{v}-01"), "%Y-%m-%d")
                    .or_else(|_| NaiveDate::parse_from_str(v, "%Y-%m-%d"))
                    .map_err(|_| bad("this job's grain is month; give it as YYYY-MM".into()))?;
                if d.day() != 1 {
                    return Err(bad(format!(
                        "this job's grain is month; give it as {}",
                        d.format("%Y-%m")
                    )));
                }
                d.and_time(NaiveTime::MIN)
            }
        };
        Ok(Window {
            grain,
            start,
            end: advance(grain, start),
            logical: start,
        })
    }

    /// The window extended `units` grain units back (a job's `lookback`), for rows
    /// that arrive late: the run then owns those earlier units too.
    pub fn with_lookback(mut self, units: u32) -> Window {
        for _ in 0..units {
            self.start = retreat(self.grain, self.start);
        }
        self
    }

    /// The start of every grain unit of the window, oldest first.
    pub fn units(&self) -> Vec<NaiveDateTime> {
        let mut out = Vec::new();
        let mut t = self.start;
        while t < self.end {
            out.push(t);
            t = advance(self.grain, t);
        }
        out
    }

    /// `$run_date`: the date the window starts on.
    pub fn run_date(&self) -> NaiveDate {
        self.logical.date()
    }

    /// The logical date as written in manifests and reports.
    pub fn label(&self) -> String {
        label_of(self.grain, self.logical)
    }

    /// Whether the interval `[a, b)` lies inside the window.
    pub fn contains(&self, (a, b): (NaiveDateTime, NaiveDateTime)) -> bool {
        a >= self.start && b <= self.end
    }
}

fn retreat(grain: Grain, t: NaiveDateTime) -> NaiveDateTime {
    match grain {
        Grain::Hour => t - Duration::hours(1),
        Grain::Day => t - Duration::days(1),
        Grain::Month => {
            let (y, m) = if t.month() == 1 {
                (t.year() - 1, 12)
            } else {
                (t.year(), t.month() - 1)
            };
            NaiveDate::from_ymd_opt(y, m, 1)
                .expect("first of month exists")
                .and_time(NaiveTime::MIN)
        }
    }
}

fn advance(grain: Grain, t: NaiveDateTime) -> NaiveDateTime {
    match grain {
        Grain::Hour => t + Duration::hours(1),
        Grain::Day => t + Duration::days(1),
        Grain::Month => {
            let (y, m) = if t.month() == 12 {
                (t.year() + 1, 1)
            } else {
                (t.year(), t.month() + 1)
            };
            NaiveDate::from_ymd_opt(y, m, 1)
                .expect("first of month exists")
                .and_time(NaiveTime::MIN)
        }
    }
}

/// The interval a partition value denotes, if it reads as a time: `YYYY-MM` (a month),
/// `YYYY-MM-DD` or `YYYYMMDD` (a day), `YYYY-MM-DDTHH` (an hour),
/// `YYYY-MM-DD HH:MM:SS[.f]` (an instant).
pub fn interval_of(value: &str) -> Option<(NaiveDateTime, NaiveDateTime)> {
    let v = value.trim();
    if let Ok(d) = NaiveDate::parse_from_str(v, "%Y-%m-%d") {
        let t = d.and_time(NaiveTime::MIN);
        return Some((t, advance(Grain::Day, t)));
    }
    if v.len() == 8
        && v.bytes().all(|b| b.is_ascii_digit())
        && let Ok(d) = NaiveDate::parse_from_str(v, "%Y%m%d")
    {
        let t = d.and_time(NaiveTime::MIN);
        return Some((t, advance(Grain::Day, t)));
    }
    if let Ok(d) = NaiveDate::parse_from_str(&format!("{v}-01"), "%Y-%m-%d")
        && v.len() == 7
    {
        let t = d.and_time(NaiveTime::MIN);
        return Some((t, advance(Grain::Month, t)));
    }
    if v.len() == 13
        && let Ok(t) = NaiveDateTime::parse_from_str(&format!("{v}:00:00"), "%Y-%m-%dT%H:%M:%S")
    {
        return Some((t, advance(Grain::Hour, t)));
    }
    for fmt in [
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%dT%H:%M:%S",
    ] {
        if let Ok(t) = NaiveDateTime::parse_from_str(v, fmt) {
            return Some((t, t + Duration::nanoseconds(1)));
        }
    }
    None
}

/// The partition value a run creates (empty) when its output has no rows for its own
/// window: the window's start, written the way the time column writes it. Only where
/// the column's resolution is the grain's: a DATE column for daily jobs, a TIMESTAMP for
/// hourly ones, text (`YYYY-MM-DD`, `YYYY-MM-DDTHH`, `YYYY-MM`) for any grain. A DATE
/// column under a monthly job may hold days or months, so nothing is created there
/// (live partitions inside the window are still replaced).
pub fn window_values(window: &Window, kind: TimeColumnKind) -> Vec<String> {
    let units = window.units();
    match (kind, window.grain) {
        (TimeColumnKind::Date, Grain::Day) => units
            .iter()
            .map(|t| t.format("%Y-%m-%d").to_string())
            .collect(),
        (TimeColumnKind::Timestamp, Grain::Hour) => units
            .iter()
            .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .collect(),
        (TimeColumnKind::Text, g) => units.iter().map(|t| label_of(g, *t)).collect(),
        _ => Vec::new(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeColumnKind {
    Date,
    Timestamp,
    Text,
    Other,
}

/// The logical dates a backfill of `from..=to` runs, newest first, for a job with
/// `lookback` units: each run owns its date and the `lookback` units before it, so
/// runs are spaced `lookback + 1` apart and no partition is computed twice needlessly
/// (the oldest run is placed so that it still covers `from`).
pub fn backfill_dates(grain: Grain, from: &str, to: &str, lookback: u32) -> Result<Vec<String>> {
    let all = dates_between(grain, from, to)?;
    if lookback == 0 {
        let mut all = all;
        all.reverse();
        return Ok(all);
    }
    let step = lookback as usize + 1;
    let n = all.len();
    let mut out = Vec::new();
    let mut i = n - 1;
    loop {
        out.push(all[i].clone());
        if i < step + lookback as usize {
            // The next run would own days before `from`: one last run, the earliest
            // whose window starts at `from`, unless this one already covers it.
            let last = (lookback as usize).min(n - 1);
            if i > last && i - lookback as usize > 0 {
                out.push(all[last].clone());
            }
            break;
        }
        i -= step;
    }
    Ok(out)
}

/// Every logical date from `from` to `to` inclusive, at the grain, oldest first.
pub fn dates_between(grain: Grain, from: &str, to: &str) -> Result<Vec<String>> {
    let first = Window::parse(grain, from)?;
    let last = Window::parse(grain, to)?;
    if last.start < first.start {
        return Err(Error::BadDate {
            value: to.to_string(),
            message: format!("--to is before --from ({from})"),
        });
    }
    let mut out = Vec::new();
    let mut w = first;
    while w.start <= last.start {
        out.push(w.label());
        w = Window::parse(grain, &label_of(grain, w.end))?;
    }
    Ok(out)
}

fn label_of(grain: Grain, t: NaiveDateTime) -> String {
    match grain {
        Grain::Hour => t.format("%Y-%m-%dT%H").to_string(),
        Grain::Day => t.format("%Y-%m-%d").to_string(),
        Grain::Month => t.format("%Y-%m").to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_dates_per_grain() {
        let w = Window::parse(Grain::Day, "2026-06-04").unwrap();
        assert_eq!(w.label(), "2026-06-04");
        assert_eq!(w.end.date().to_string(), "2026-06-05");
        let h = Window::parse(Grain::Hour, "2026-06-04T23").unwrap();
        assert_eq!(h.end.to_string(), "2026-06-05 00:00:00");
        let m = Window::parse(Grain::Month, "2026-12").unwrap();
        assert_eq!(m.end.date().to_string(), "2027-01-01");
        assert!(Window::parse(Grain::Day, "2026-13-01").is_err());
        assert!(Window::parse(Grain::Day, "yesterday").is_err());
        assert!(Window::parse(Grain::Month, "2026-06-04").is_err());
    }

    #[test]
    fn lookback_extends_the_window_and_spaces_backfills() {
        let w = Window::parse(Grain::Day, "2026-06-10")
            .unwrap()
            .with_lookback(2);
        assert_eq!(w.start.date().to_string(), "2026-06-08");
        assert_eq!(w.label(), "2026-06-10");
        assert_eq!(w.run_date().to_string(), "2026-06-10");
        assert_eq!(window_values(&w, TimeColumnKind::Date).len(), 3);
        let dates = backfill_dates(Grain::Day, "2026-06-01", "2026-06-10", 2).unwrap();
        assert_eq!(
            dates,
            vec!["2026-06-10", "2026-06-07", "2026-06-04", "2026-06-03"]
        );
        let plain = backfill_dates(Grain::Day, "2026-06-01", "2026-06-03", 0).unwrap();
        assert_eq!(plain, vec!["2026-06-03", "2026-06-02", "2026-06-01"]);
        let m = Window::parse(Grain::Month, "2026-01")
            .unwrap()
            .with_lookback(1);
        assert_eq!(m.start.date().to_string(), "2025-12-01");
    }

    #[test]
    fn ownership_is_by_interval() {
        let day = Window::parse(Grain::Day, "2026-06-01").unwrap();
        assert!(day.contains(interval_of("2026-06-01").unwrap()));
        assert!(!day.contains(interval_of("2026-06").unwrap()));
        assert!(day.contains(interval_of("2026-06-01 13:00:00").unwrap()));
        assert!(!day.contains(interval_of("2026-06-02").unwrap()));
        let month = Window::parse(Grain::Month, "2026-06").unwrap();
        assert!(month.contains(interval_of("2026-06-30").unwrap()));
        assert!(month.contains(interval_of("2026-06").unwrap()));
        assert_eq!(interval_of("eu"), None);
    }
}
