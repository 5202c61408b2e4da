//! Units of work, as methods of a [`Project`] (a job file alone is a project of one):
//! the (job, logical date) pairs a backfill runs, in its order —
//! dependency order across a project's jobs, newest first within a job — with the
//! upstream units each one reads. `idem dates` lists them for an orchestrator to map
//! over; a worker (`--index`, `--shard`) runs its share of them; a backfill skips a
//! unit whose upstream unit failed.
//!
//! A unit reads an upstream unit when the time it reads of the upstream table — its
//! run's window (with its lookback), extended back by the source's `reads_before` —
//! overlaps the time the upstream run owns (its window, with its own lookback).

use std::collections::{BTreeMap, BTreeSet};

use chrono::NaiveDateTime;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::{Job, ReadsBefore};
use crate::params::Var;
use crate::project::Project;
use crate::run::{RunOptions, fresh::fresh_partitions};
use crate::window::{Window, backfill_dates};

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Unit {
    /// The unit's place in the whole range's list: what `--index` names.
    pub index: usize,
    pub job: String,
    pub job_file: String,
    pub date: String,
    /// The indices of the upstream units this one reads.
    pub after: Vec<usize>,
}

impl Project {
    /// A project of one job file, which reads no other job.
    pub fn one(job: Job) -> Project {
        let upstream = BTreeMap::from([(job.name.clone(), Vec::new())]);
        Project {
            jobs: vec![job],
            upstream,
        }
    }

    pub fn job(&self, name: &str) -> &Job {
        self.jobs
            .iter()
            .find(|j| j.name == name)
            .expect("a unit names a job of its list")
    }

    /// Every unit of a backfill of `from..=to`.
    pub fn units(&self, from: &str, to: &str) -> Result<Vec<Unit>> {
        let mut units: Vec<Unit> = Vec::new();
        let mut spans: Vec<(NaiveDateTime, NaiveDateTime)> = Vec::new();
        let mut by_job: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for job in &self.jobs {
            for date in backfill_dates(job.target.grain, from, to, job.lookback)? {
                let mut after = BTreeSet::new();
                for u in &self.upstream[&job.name] {
                    let read = read_span(job, &date, self.job(u))?;
                    after.extend(
                        by_job
                            .get(u.as_str())
                            .into_iter()
                            .flatten()
                            .copied()
                            .filter(|&i| read.is_none_or(|r| overlap(spans[i], r))),
                    );
                }
                by_job.entry(&job.name).or_default().push(units.len());
                spans.push(span(job, &date)?);
                units.push(Unit {
                    index: units.len(),
                    job: job.name.clone(),
                    job_file: job.path.display().to_string(),
                    date,
                    after: after.into_iter().collect(),
                });
            }
        }
        Ok(units)
    }

    /// The units that are not fresh (see `--skip-fresh`), and every unit that reads
    /// one of those: its input will change when the upstream unit runs.
    pub fn stale_units(&self, units: Vec<Unit>, vars: &[Var]) -> Result<Vec<Unit>> {
        let mut kept = BTreeSet::new();
        let mut out = Vec::new();
        for u in units {
            let opts = RunOptions {
                date: u.date.clone(),
                vars: vars.to_vec(),
                skip_fresh: true,
                cluster: None,
                ..Default::default()
            };
            let needed = u.after.iter().any(|i| kept.contains(i))
                || fresh_partitions(self.job(&u.job), &opts)?.is_none();
            if needed {
                kept.insert(u.index);
                out.push(u);
            }
        }
        Ok(out)
    }

    /// Whether `job`'s run for `date` reads what `upstream`'s run for `up_date` writes.
    pub fn reads(&self, job: &Job, date: &str, upstream: &Job, up_date: &str) -> Result<bool> {
        if !self.upstream[&job.name].contains(&upstream.name) {
            return Ok(false);
        }
        let owned = span(upstream, up_date)?;
        Ok(read_span(job, date, upstream)?.is_none_or(|r| overlap(r, owned)))
    }
}

/// The units a worker runs: the `index`-th, or those of shard `k` of `n` (every n-th,
/// from the k-th).
pub fn select(units: &[Unit], pick: Pick) -> Result<Vec<usize>> {
    match pick {
        Pick::Index(i) if i < units.len() => Ok(vec![i]),
        Pick::Index(i) => Err(Error::Argument {
            message: format!(
                "--index {i} is past the last unit: the range has {} units (0 to {})",
                units.len(),
                units.len().saturating_sub(1)
            ),
        }),
        Pick::Shard(k, n) => Ok((k..units.len()).step_by(n).collect()),
    }
}

/// `--index I` or `--shard K/N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Index(usize),
    Shard(usize, usize),
}

impl Pick {
    /// Parses `--index I`; an empty value (a bare `--index`) reads I from
    /// `JOB_COMPLETION_INDEX`, as Kubernetes Indexed Jobs set it.
    pub fn index(value: &str) -> Result<Pick> {
        let (value, from) = if value.is_empty() {
            let env = std::env::var("JOB_COMPLETION_INDEX").map_err(|_| Error::Argument {
                message: "--index without a value reads JOB_COMPLETION_INDEX, which is not set"
                    .into(),
            })?;
            (env, "JOB_COMPLETION_INDEX")
        } else {
            (value.to_string(), "--index")
        };
        value
            .trim()
            .parse()
            .map(Pick::Index)
            .map_err(|_| Error::Argument {
                message: format!("{from} `{value}` is not a unit's index (0, 1, 2, ...)"),
            })
    }

    /// Parses `--shard K/N` (K from 0 to N-1).
    pub fn shard(value: &str) -> Result<Pick> {
        let bad = |message: &str| Error::Argument {
            message: format!("--shard {value}: {message}"),
        };
        let (k, n) = value
            .split_once('/')
            .ok_or_else(|| bad("is K/N: shard K (from 0) of N"))?;
        let (k, n): (usize, usize) = (
            k.trim().parse().map_err(|_| bad("K is not a number"))?,
            n.trim().parse().map_err(|_| bad("N is not a number"))?,
        );
        if n == 0 || k >= n {
            return Err(bad("needs 0 <= K < N"));
        }
        Ok(Pick::Shard(k, n))
    }
}

/// The selected units and every unit they read, transitively, in list order.
pub fn with_upstream(units: &[Unit], selected: &[usize]) -> Vec<usize> {
    let mut all: BTreeSet<usize> = BTreeSet::new();
    let mut todo: Vec<usize> = selected.to_vec();
    while let Some(i) = todo.pop() {
        if all.insert(i) {
            todo.extend(&units[i].after);
        }
    }
    all.into_iter().collect()
}

/// The time `job`'s run for `date` reads of `upstream`'s table: its window extended
/// back by the `reads_before` of the sources reading that table; `None` for any time.
fn read_span(
    job: &Job,
    date: &str,
    upstream: &Job,
) -> Result<Option<(NaiveDateTime, NaiveDateTime)>> {
    let mut back = 0;
    for s in &job.sources {
        if crate::project::inside(&s.path, &upstream.target.path) {
            match s.reads_before {
                ReadsBefore::All => return Ok(None),
                ReadsBefore::Units(n) => back = back.max(n),
            }
        }
    }
    let w = Window::parse(job.target.grain, date)?.with_lookback(job.lookback + back);
    Ok(Some((w.start, w.end)))
}

/// The time a run of `job` for `date` owns, its lookback included.
fn span(job: &Job, date: &str) -> Result<(NaiveDateTime, NaiveDateTime)> {
    let w = Window::parse(job.target.grain, date)?.with_lookback(job.lookback);
    Ok((w.start, w.end))
}

fn overlap(a: (NaiveDateTime, NaiveDateTime), b: (NaiveDateTime, NaiveDateTime)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(index: usize, after: &[usize]) -> Unit {
        Unit {
            index,
            job: String::new(),
            job_file: String::new(),
            date: String::new(),
            after: after.to_vec(),
        }
    }

    #[test]
    fn shards_split_the_units_round_robin_and_cover_each_once() {
        let units: Vec<Unit> = (0..7).map(|i| unit(i, &[])).collect();
        let mut seen = Vec::new();
        for k in 0..3 {
            seen.extend(select(&units, Pick::Shard(k, 3)).unwrap());
        }
        seen.sort();
        assert_eq!(seen, (0..7).collect::<Vec<_>>());
        assert_eq!(select(&units, Pick::Shard(1, 3)).unwrap(), vec![1, 4]);
    }

    #[test]
    fn an_index_past_the_end_and_bad_shards_are_refused() {
        let units: Vec<Unit> = (0..3).map(|i| unit(i, &[])).collect();
        let e = select(&units, Pick::Index(3)).unwrap_err().to_string();
        assert!(e.contains("--index 3 is past the last unit: the range has 3 units (0 to 2)"));
        for bad in ["3/3", "1", "a/2", "0/0"] {
            assert!(Pick::shard(bad).is_err(), "{bad}");
        }
        assert_eq!(Pick::shard("2/4").unwrap(), Pick::Shard(2, 4));
    }

    #[test]
    fn a_unit_brings_its_upstream_units_transitively() {
        let units = vec![unit(0, &[]), unit(1, &[]), unit(2, &[0]), unit(3, &[2, 1])];
        assert_eq!(with_upstream(&units, &[3]), vec![0, 1, 2, 3]);
        assert_eq!(with_upstream(&units, &[2]), vec![0, 2]);
    }
}
