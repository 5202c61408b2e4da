//! A project: a folder of job files. Dependencies between jobs come from paths: a job
//! whose source lies inside another job's target depends on it. `idem plan` prints the
//! DAG; `idem stale` lists downstream partitions whose recorded inputs (in their
//! manifests) no longer match what the upstream table holds.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use idem_io::manifest::LiveState;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::job::Job;

pub struct Project {
    /// In topological order: every job after the jobs it reads from.
    pub jobs: Vec<Job>,
    /// job name -> names of the jobs it reads from.
    pub upstream: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PlanEntry {
    pub job: String,
    pub job_file: String,
    pub target: String,
    pub upstream: Vec<String>,
    pub downstream: Vec<String>,
    /// Whether a date whose sources have no file for its window may empty partitions
    /// that hold rows (`allow_missing_input`); by default such a run is refused.
    pub allow_missing_input: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct StalePartition {
    pub job: String,
    pub partition: String,
    pub logical_date: String,
    /// The upstream table whose files changed since the partition was written.
    pub upstream: String,
    pub changed_input: String,
}

pub(crate) fn inside(path: &str, root: &Path) -> bool {
    let root = root.to_string_lossy();
    path == root || path.starts_with(&format!("{}/", root.trim_end_matches('/')))
}

impl Project {
    /// Loads every `*.toml` job file in `dir` (not recursing) and orders them.
    pub fn load(dir: &Path) -> Result<Project> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|source| Error::JobUnreadable {
                path: dir.to_path_buf(),
                source,
            })?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let jobs: Vec<Job> = files.iter().map(|f| Job::load(f)).collect::<Result<_>>()?;
        let mut names = BTreeMap::new();
        for j in &jobs {
            if let Some(other) = names.insert(j.name.clone(), j.path.clone()) {
                return Err(Error::JobInvalid {
                    path: j.path.clone(),
                    message: format!("job name `{}` is also used by {}", j.name, other.display()),
                });
            }
        }
        let mut upstream: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for j in &jobs {
            let mut ups: Vec<String> = jobs
                .iter()
                .filter(|u| u.name != j.name)
                .filter(|u| j.sources.iter().any(|s| inside(&s.path, &u.target.path)))
                .map(|u| u.name.clone())
                .collect();
            ups.sort();
            upstream.insert(j.name.clone(), ups);
        }
        // Depth-first topological order; a cycle is an error that names it.
        let by_name: BTreeMap<&str, &Job> = jobs.iter().map(|j| (j.name.as_str(), j)).collect();
        let mut order: Vec<String> = Vec::new();
        let mut state: BTreeMap<String, u8> = BTreeMap::new(); // 1 visiting, 2 done
        fn visit(
            name: &str,
            upstream: &BTreeMap<String, Vec<String>>,
            state: &mut BTreeMap<String, u8>,
            stack: &mut Vec<String>,
            order: &mut Vec<String>,
        ) -> std::result::Result<(), Vec<String>> {
            match state.get(name) {
                Some(2) => return Ok(()),
                Some(1) => {
                    let start = stack.iter().position(|n| n == name).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(name.to_string());
                    return Err(cycle);
                }
                _ => {}
            }
            state.insert(name.to_string(), 1);
            stack.push(name.to_string());
            for u in &upstream[name] {
                visit(u, upstream, state, stack, order)?;
            }
            stack.pop();
            state.insert(name.to_string(), 2);
            order.push(name.to_string());
            Ok(())
        }
        for j in &jobs {
            let mut stack = Vec::new();
            if let Err(cycle) = visit(&j.name, &upstream, &mut state, &mut stack, &mut order) {
                return Err(Error::JobInvalid {
                    path: dir.to_path_buf(),
                    message: format!(
                        "the jobs read each other's tables in a cycle: {} (each reads the table the \
                         one before it writes)",
                        cycle.join(" -> ")
                    ),
                });
            }
        }
        let jobs = order
            .iter()
            .map(|n| (*by_name[n.as_str()]).clone())
            .collect();
        Ok(Project { jobs, upstream })
    }

    pub fn plan(&self) -> Vec<PlanEntry> {
        self.jobs
            .iter()
            .map(|j| PlanEntry {
                job: j.name.clone(),
                job_file: j.path.display().to_string(),
                target: j.target.path.display().to_string(),
                upstream: self.upstream[&j.name].clone(),
                downstream: self
                    .upstream
                    .iter()
                    .filter(|(_, ups)| ups.contains(&j.name))
                    .map(|(d, _)| d.clone())
                    .collect(),
                allow_missing_input: j.allow_missing_input,
            })
            .collect()
    }

    /// Downstream partitions whose recorded upstream inputs changed since they were
    /// written.
    pub fn stale(&self) -> Result<Vec<StalePartition>> {
        let mut out = Vec::new();
        for j in &self.jobs {
            let ups: Vec<&Job> = self
                .jobs
                .iter()
                .filter(|u| self.upstream[&j.name].contains(&u.name))
                .collect();
            if ups.is_empty() {
                continue;
            }
            let table = crate::table::open(j)?;
            let storage = |source| Error::Storage {
                target: j.target.path.clone(),
                source,
            };
            for p in table
                .live_partitions(j.target.partition_by.len())
                .map_err(storage)?
            {
                let live = table.live_state(&p).map_err(storage)?;
                let Some(m) = live.as_ref().and_then(LiveState::manifest) else {
                    continue;
                };
                for u in &ups {
                    let recorded: Vec<_> = m
                        .run
                        .inputs
                        .iter()
                        .filter(|f| inside(&f.path, &u.target.path))
                        .cloned()
                        .collect();
                    if let Some(changed) =
                        crate::run::fresh::first_changed(&recorded, &m.run.sources, &|url| {
                            j.storage_for(url).clone()
                        })
                    {
                        out.push(StalePartition {
                            job: j.name.clone(),
                            partition: p.to_string(),
                            logical_date: m.run.logical_date.clone(),
                            upstream: u.name.clone(),
                            changed_input: changed,
                        });
                        break;
                    }
                }
            }
        }
        Ok(out)
    }
}
