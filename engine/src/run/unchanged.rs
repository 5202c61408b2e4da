//! The fast path of a re-run: when the output's digests can be computed without
//! staging (nothing in the job needs the staged files), a run whose every owned
//! partition's digest equals the live one is confirmed unchanged and writes nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use idem_io::digest::DigestState;
use idem_io::hive::PartitionPath;
use idem_io::manifest::{LiveState, describe_schema, schema_fingerprint};

use super::explain::read_files_still_there;
use super::lifecycle::{begin_run, end_run};
use super::plan::{Planned, plan};
use super::publish::owned_partitions;
use super::report::{Action, Observer, PartitionReport, RunOptions, RunReport};
use super::stage::drive;
use crate::error::{Error, Result};
use crate::job::{Job, Mode};
use crate::route::Router;
use crate::session::inputs_of;

/// Whether a run may first be computed without staging (see [`confirm_unchanged`]):
/// not for a merge (it rewrites what it reads), a job that allows nondeterministic
/// functions (its rows differ every run), or a job with checks (they run on staged
/// files, every run).
pub(super) fn may_confirm_unchanged(job: &Job) -> bool {
    job.target.mode == Mode::ReplacePartitions
        && !job.allow_nondeterministic
        && job.checks.is_empty()
}

/// A re-run of a date whose live partitions were all written by this job from inputs
/// that have not changed since (what `--skip-fresh` trusts without reading anything)
/// is computed once without staging: the output is routed and digested, and when
/// every partition the run owns is live, fresh and equal to the output (digest and
/// schema; no rows counts as empty), the run is `unchanged` without encoding, staging
/// or fsyncing a byte. Same rows, same verdict as the run proper, at the cost of the
/// query and the digest. `None` when any partition differs (an order-dependent query,
/// say), an owned one is missing, or the output has rows outside the owned ones: the
/// run then goes the normal way.
pub(super) async fn confirm_unchanged(
    job: &Job,
    opts: &RunOptions,
    fresh: &[PartitionReport],
    observer: Arc<dyn Observer>,
) -> Result<Option<RunReport>> {
    let started = Instant::now();
    let planned = plan(job, opts).await?;
    observer.phase("verifying");
    let Planned {
        job,
        window,
        ctx,
        df,
        output,
        time,
        ..
    } = planned;
    let plan = df
        .create_physical_plan()
        .await
        .and_then(|plan| super::on_this_machine(&job, plan))
        .map_err(|e| Error::execution(&job.path, "", e))?;
    let (table, run_id, _lock) = begin_run(&job).await?;
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let root = table.location();
    let inputs: Vec<_> = inputs_of(&plan, &job)
        .await
        .into_iter()
        .filter(|f| !f.path.starts_with(&root))
        .collect();
    if idem_io::profile::enabled() {
        let bytes = inputs.iter().map(|f| f.size).sum();
        idem_io::profile::set(idem_io::profile::Counter::InputBytes, bytes);
    }
    let inputs = inputs.len();
    let compared = async {
        // What the full run would replace: every partition the window owns (the live
        // ones, and the window's own, created empty when missing), taken after the
        // dead-run cleanup as the full run takes it. Unless each is live and fresh, the
        // full run has something to write whatever the output: no query here.
        let fresh: std::collections::HashSet<String> =
            fresh.iter().map(|f| f.partition.clone()).collect();
        let (job2, table2, window2, time2) =
            (job.clone(), Arc::clone(&table), window, time.clone());
        let found = crate::blocking(move || {
            let owned = owned_partitions(&job2, table2.as_ref(), &window2, time2.as_ref())?;
            let mut live = Vec::with_capacity(owned.len());
            for p in &owned {
                match table2.live_state(p)? {
                    Some(LiveState::Managed(m)) if fresh.contains(&p.to_string()) => {
                        // Measured here: a table may read its log to tell.
                        let bytes = table2.live_bytes(p, &m.file_names());
                        live.push((m, bytes))
                    }
                    _ => return Ok(None),
                }
            }
            Ok::<_, idem_io::Error>(Some((owned, live)))
        })
        .await
        .map_err(storage)?;
        let Some((owned, live)) = found.filter(|(owned, _)| !owned.is_empty()) else {
            return Ok(None);
        };
        let schema = schema_fingerprint(&describe_schema(&output, &job.target.partition_by));
        let router = Arc::new(Router::new(&output, &job.target.partition_by));
        let rows_read = super::profile::RowsRead::watch(&plan);
        let digests = drive(
            &job,
            &ctx,
            plan,
            router,
            observer.as_ref(),
            |rx, rows_seen| {
                let mut digests: BTreeMap<PartitionPath, DigestState> = BTreeMap::new();
                while let Some(parts) = rx.blocking_recv() {
                    for (p, batch) in parts {
                        digests.entry(p).or_default().update(&batch);
                        rows_seen.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
                    }
                }
                Ok(digests)
            },
        )
        .await?;
        rows_read.record();
        // Rows outside the owned partitions are the full run's to warn about; a file
        // read by name that is gone may have read as no rows: the full run decides.
        if digests.keys().any(|p| owned.binary_search(p).is_err())
            || read_files_still_there(&ctx, &job).await.is_err()
        {
            return Ok(None);
        }
        let mut partitions = Vec::with_capacity(owned.len());
        for (p, (m, bytes)) in owned.into_iter().zip(live) {
            // An owned partition the output has no rows for is written with none.
            let digest = digests.get(&p).copied().unwrap_or_default();
            if m.digest != digest.finish() || m.schema_fingerprint != schema {
                return Ok(None);
            }
            let bytes = bytes.unwrap_or(m.data_bytes);
            partitions.push(PartitionReport {
                partition: p.to_string(),
                action: Action::Unchanged,
                rows: m.rows,
                bytes,
                files: m.files.len(),
                digest: m.digest,
                publish: None,
                ms: 0,
            });
        }
        Ok::<_, Error>(Some(partitions))
    }
    .await;
    end_run(&table, &run_id, _lock).await;
    let Some(partitions) = compared? else {
        return Ok(None);
    };
    tracing::info!(
        partitions = partitions.len(),
        ms = started.elapsed().as_millis() as u64,
        "the output equals the live partitions; nothing staged"
    );
    Ok(Some(RunReport::of(
        &job, &window, run_id, inputs, partitions,
    )))
}
