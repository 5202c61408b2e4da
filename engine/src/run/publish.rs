//! Publishing a run's checked partitions, under the table's publish fence: each is
//! compared with the live one by digest and discarded when equal (`unchanged`) or
//! made live atomically, restatements are logged, and partitions the window owns that
//! the output left empty are published empty.

use std::collections::BTreeSet;
use std::time::Instant;

use idem_io::commit::{Checked, CommitBackend, PublishMode};
use idem_io::failpoint;
use idem_io::hive::PartitionPath;
use idem_io::manifest::LiveState;

use super::plan::TimeColumn;
use super::report::{Action, Observer, PartitionReport};
use crate::error::{Error, Result};
use crate::job::Job;
use crate::window::{Window, interval_of, window_values};

/// How a run publishes, beyond its partitions.
pub(super) struct Publishing {
    /// Publish partitions equal to the live ones too.
    pub rewrite: bool,
    /// Leave the partitions in this pending commit of the table, not committed.
    pub commit_with: Option<String>,
    /// The sources the transform reads that have no file for the window (name, path):
    /// when there are any, a partition holding rows is not emptied.
    pub missing_input: Vec<(String, String)>,
    /// The run's window, as its logical date names it.
    pub window: String,
}

/// Publishes checked partitions: each is compared with the live one by digest and
/// schema and left alone when equal, else swapped in atomically.
pub(super) fn publish_all(
    job: &Job,
    table: &dyn CommitBackend,
    checked: Vec<Checked>,
    ownership: Option<(Window, Option<TimeColumn>)>,
    mut warnings: Vec<String>,
    observer: &dyn Observer,
    how: &Publishing,
) -> Result<(Vec<PartitionReport>, Vec<String>)> {
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    failpoint::hit("before_publish").map_err(storage)?;
    // From here to the last partition, no other writer of the table publishes (on an
    // object store each partition's commit is its own fence instead): a merge finds
    // every partition it read still at the version it read, or publishes none.
    let fence = table.lock_publish().map_err(storage)?;
    for part in &checked {
        let written = part.partition();
        if let Some(expected) = written.expected()
            && table.live_version(written.partition()).map_err(storage)? != *expected
        {
            return Err(storage(idem_io::Error::Conflict {
                partition: written.partition().to_string(),
            }));
        }
    }
    // The partitions the run's window owns, as they are now: one another run created
    // since this run looked (a table of several partition columns) is owned too, and
    // the run is computed again to empty it.
    if let Some((window, time)) = &ownership {
        let staged: BTreeSet<&PartitionPath> =
            checked.iter().map(|c| c.partition().partition()).collect();
        let owned = owned_partitions(job, table, window, time.as_ref()).map_err(storage)?;
        if let Some(p) = owned.iter().find(|p| !staged.contains(p)) {
            return Err(storage(idem_io::Error::Conflict {
                partition: p.to_string(),
            }));
        }
    }
    // Decide per partition before publishing any, so a bad state aborts cleanly.
    let mut decisions = Vec::with_capacity(checked.len());
    let mut would_empty = Vec::new();
    for part in checked {
        let written = part.partition();
        let live = table.live_state(written.partition()).map_err(storage)?;
        if !how.missing_input.is_empty() && written.manifest().rows == 0 {
            let held = match &live {
                Some(LiveState::Foreign { files }) if !files.is_empty() => Some(None),
                Some(state) => state
                    .manifest()
                    .filter(|m| m.rows > 0)
                    .map(|m| Some(m.rows)),
                None => None,
            };
            if let Some(rows) = held {
                would_empty.push((written.partition().to_string(), rows));
            }
        }
        let unchanged = !how.rewrite
            && matches!(
                &live,
                Some(LiveState::Managed(m))
                    if m.digest == written.manifest().digest
                        && m.schema_fingerprint == written.manifest().schema_fingerprint
            );
        // A partition that had rows and now gets different ones is a restatement.
        let restated = match live.as_ref().and_then(LiveState::manifest) {
            Some(m)
                if m.rows > 0
                    && (m.digest != written.manifest().digest
                        || m.schema_fingerprint != written.manifest().schema_fingerprint) =>
            {
                Some(idem_io::log::Restatement {
                    partition: written.partition().to_string(),
                    old_digest: m.digest.clone(),
                    new_digest: written.manifest().digest.clone(),
                    old_rows: m.rows,
                    new_rows: written.manifest().rows,
                    job: written.manifest().run.job.clone(),
                    job_fingerprint: written.manifest().run.job_fingerprint.clone(),
                    logical_date: written.manifest().run.logical_date.clone(),
                    run_id: written.manifest().run.run_id.clone(),
                    replaced_run_id: m.run.run_id.clone(),
                })
            }
            _ => None,
        };
        // An object-store partition whose listing is not its commit's (extra or missing
        // files) is published again: that finishes the apply and removes the rest.
        let unclean = matches!(live, Some(LiveState::Unclean { .. }));
        decisions.push((part, unchanged, restated, unclean));
    }
    if !would_empty.is_empty() {
        return Err(Error::MissingInput {
            path: job.path.clone(),
            window: how.window.clone(),
            sources: how.missing_input.clone(),
            partitions: would_empty,
        });
    }

    observer.phase("publishing");
    let run_id = decisions
        .first()
        .map(|(part, ..)| part.partition().manifest().run.run_id.clone());
    let mut reports = Vec::with_capacity(decisions.len());
    for (part, unchanged, restated, unclean) in decisions {
        let t = Instant::now();
        let written = part.partition();
        let name = written.partition().to_string();
        let rows = written.manifest().rows;
        let files = written.manifest().files.len();
        let digest = written.manifest().digest.clone();
        let bytes = written.bytes();
        let (action, publish) = if unchanged {
            table.discard(part.into_inner()).map_err(storage)?;
            (Action::Unchanged, None)
        } else {
            let part = if how.rewrite { part.rewritten() } else { part };
            let published = table.publish(part, &fence).map_err(storage)?;
            if published.mode == PublishMode::AlreadyLive && !unclean {
                // Another writer committed these very rows first.
                reports.push(PartitionReport {
                    partition: name,
                    action: Action::Unchanged,
                    rows,
                    bytes,
                    files,
                    digest,
                    publish: Some(published.mode),
                    ms: t.elapsed().as_millis() as u64,
                });
                continue;
            }
            if published.mode == PublishMode::NonAtomicFallback {
                warnings.push(format!(
                    "{name}: the filesystem does not support atomic directory exchange; \
                     published with two renames"
                ));
            }
            // Logged once the new partition is durable; a crash in between loses only
            // the event, and `idem stale` still sees the changed digest.
            if let Some(event) = restated {
                table.append_log(&event).map_err(storage)?;
            }
            failpoint::hit("after_publish_one").map_err(storage)?;
            let action = if rows == 0 {
                Action::Emptied
            } else {
                Action::Written
            };
            let mode = match &how.commit_with {
                Some(_) => PublishMode::Pending,
                None => published.mode,
            };
            (action, Some(mode))
        };
        reports.push(PartitionReport {
            partition: name,
            action,
            rows,
            bytes,
            files,
            digest,
            publish,
            ms: t.elapsed().as_millis() as u64,
        });
    }
    // Where the table commits a run's partitions together (Delta), this is the atomic
    // point of the whole run.
    match (run_id, &how.commit_with) {
        (Some(run_id), None) => {
            table.finish_publish(&run_id, &fence).map_err(storage)?;
        }
        (Some(run_id), Some(batch)) => table.defer_publish(&run_id, batch).map_err(storage)?,
        (None, _) => {}
    }
    Ok((reports, warnings))
}

/// The partitions the run's window owns: live ones whose time value lies in the window,
/// and, for a table partitioned by the time column alone, the window's own values. An
/// unpartitioned table is owned whole by every run.
pub(super) fn owned_partitions(
    job: &Job,
    table: &dyn CommitBackend,
    window: &Window,
    time: Option<&TimeColumn>,
) -> idem_io::Result<Vec<PartitionPath>> {
    if job.target.partition_by.is_empty() {
        return Ok(vec![PartitionPath::root()]);
    }
    let Some(TimeColumn {
        name: tc,
        kind: time_kind,
    }) = time
    else {
        return Ok(Vec::new());
    };
    let (tc, time_kind) = (tc.as_str(), *time_kind);
    let mut owned = BTreeSet::new();
    for p in table.live_partitions(job.target.partition_by.len())? {
        if p.columns()
            .ne(job.target.partition_by.iter().map(String::as_str))
        {
            continue;
        }
        if let Some(Some(v)) = p.value(tc)
            && let Some(iv) = interval_of(v)
            && window.contains(iv)
        {
            owned.insert(p);
        }
    }
    if job.target.partition_by.len() == 1 {
        for v in window_values(window, time_kind) {
            owned.insert(PartitionPath::new(vec![(tc.to_string(), Some(v))]));
        }
    }
    Ok(owned.into_iter().collect())
}
