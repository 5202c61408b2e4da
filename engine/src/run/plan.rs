//! Planning a run, which touches no storage: the job's SQL is planned for the date,
//! the determinism guard runs, and the output is checked against the target (its
//! partition and time columns, a change of schema), before anything is staged.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use idem_io::manifest::{ColumnEntry, describe_schema};

use super::report::RunOptions;
use crate::error::{Error, Result};
use crate::job::{Job, OnSchemaChange};
use crate::params::{self};
use crate::window::{Grain, TimeColumnKind, Window};

/// A run that has been planned and validated; nothing has been written yet.
pub struct Planned {
    pub(super) job: Job,
    pub(super) vars: BTreeMap<String, String>,
    pub(super) window: Window,
    pub(super) ctx: SessionContext,
    pub(super) df: DataFrame,
    pub(super) output: SchemaRef,
    pub(super) time: Option<TimeColumn>,
    /// `--rewrite`: publish partitions equal to the live ones too.
    pub(super) rewrite: bool,
    /// The pending commit the run's partitions join instead of committing.
    pub(super) commit_with: Option<String>,
}

impl Planned {
    pub fn window(&self) -> &Window {
        &self.window
    }

    pub fn output_schema(&self) -> &SchemaRef {
        &self.output
    }
}

/// Plans the SQL alone, without binding parameters or any check (for diagnostics).
pub async fn plan_unchecked(job: &Job) -> Result<DataFrame> {
    let ctx = crate::session::context(job).await?;
    ctx.sql(&job.sql).await.map_err(|e| Error::Sql {
        path: job.path.clone(),
        message: sql_message(&e),
    })
}

/// Plans a run: parses the date, plans the SQL with bound parameters, and checks
/// determinism and the output's shape. Touches no storage.
pub async fn plan(job: &Job, opts: &RunOptions) -> Result<Planned> {
    let window = Window::parse(job.target.grain, &opts.date)?.with_lookback(job.lookback);
    if job.target.path.exists() && !job.target.path.is_dir() {
        return Err(Error::JobInvalid {
            path: job.path.clone(),
            message: format!(
                "[target] path {} exists and is not a directory",
                job.target.path.display()
            ),
        });
    }
    let ctx = crate::session::context(job).await?;
    let sql_err = |e: datafusion::error::DataFusionError| Error::Sql {
        path: job.path.clone(),
        message: sql_message(&e),
    };
    let df = ctx.sql(&job.sql).await.map_err(sql_err)?;
    crate::guard::check_answer(&job.path, df.logical_plan())?;
    if !job.allow_nondeterministic {
        crate::guard::check(&job.path, df.logical_plan())?;
    }
    let values = params::values(&window, &opts.vars);
    let bound = params::bind(&job.path, df.logical_plan(), &values)?;
    let df = df.with_param_values(bound).map_err(sql_err)?;
    let mut output: SchemaRef = Arc::new(df.schema().as_arrow().clone());
    if job.target.mode == crate::job::Mode::Merge {
        // A merge writes the table's kept rows beside the output's: that one run's SQL
        // cannot hold a NULL in a column does not mean the table holds none.
        let fields: Vec<_> = output
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        output = Arc::new(
            arrow::datatypes::Schema::new(fields).with_metadata(output.metadata().clone()),
        );
    }
    let time = check_output(job, &window, &output)?;
    // Every column the job names must be in the output.
    let named = job
        .target
        .key
        .iter()
        .map(|k| ("[target] key".to_string(), k.clone()))
        .chain(
            job.checks
                .columns()
                .into_iter()
                .map(|(check, c)| (format!("[checks] {check}"), c)),
        );
    for (by, column) in named {
        if output.field_with_name(&column).is_err() {
            let columns: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(Error::Output {
                path: job.path.clone(),
                message: format!(
                    "has no column `{column}`, which {by} names; its columns are: {}",
                    columns.join(", ")
                ),
            });
        }
    }
    // What the target holds, listed off the async workers.
    let (job2, output2) = (job.clone(), Arc::clone(&output));
    crate::blocking(move || {
        crate::target::check(&job2)?;
        check_schema_change(&job2, &output2)
    })
    .await?;
    Ok(Planned {
        job: job.clone(),
        vars: opts.var_text(),
        window,
        ctx,
        df,
        output,
        time,
        rewrite: opts.rewrite,
        commit_with: opts.commit_with.clone(),
    })
}

pub(super) fn sql_message(e: &datafusion::error::DataFusionError) -> String {
    let s = e.to_string();
    s.strip_prefix("SQL error: ")
        .or_else(|| s.strip_prefix("Error during planning: "))
        .unwrap_or(&s)
        .to_string()
}

pub(super) fn check_output(
    job: &Job,
    window: &Window,
    output: &SchemaRef,
) -> Result<Option<TimeColumn>> {
    let out_err = |message: String| Error::Output {
        path: job.path.clone(),
        message,
    };
    let names: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
    let mut seen = BTreeSet::new();
    for n in &names {
        if !seen.insert(*n) {
            return Err(out_err(format!(
                "has two columns named `{n}`; give them distinct aliases"
            )));
        }
    }
    for c in &job.target.partition_by {
        let Ok(field) = output.field_with_name(c) else {
            return Err(out_err(format!(
                "has no column `{c}`, which [target] partition_by needs; its columns are: {}",
                names.join(", ")
            )));
        };
        if field.data_type().is_nested()
            || matches!(
                field.data_type(),
                DataType::Binary
                    | DataType::LargeBinary
                    | DataType::BinaryView
                    | DataType::FixedSizeBinary(_)
            )
        {
            return Err(out_err(format!(
                "partition column `{c}` has type {}, which cannot be a directory name",
                field.data_type()
            )));
        }
    }
    if names.len() == job.target.partition_by.len() {
        return Err(out_err(
            "has no columns besides the partition columns; nothing would be stored in the files"
                .into(),
        ));
    }
    for f in output.fields() {
        if job.target.partition_by.contains(f.name()) {
            continue;
        }
        idem_io::canonical::check_supported(f.name(), f.data_type())
            .map_err(|e| out_err(e.to_string()))?;
    }
    let kind_of = |c: &str| match output
        .field_with_name(c)
        .expect("checked above")
        .data_type()
    {
        DataType::Date32 | DataType::Date64 => TimeColumnKind::Date,
        DataType::Timestamp(..) => TimeColumnKind::Timestamp,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => TimeColumnKind::Text,
        _ => TimeColumnKind::Other,
    };
    // The time column: as the job says, else the first DATE or TIMESTAMP partition
    // column. A text column is never guessed: its values may not be dates at all
    // (`country`), or not in the grain's format (`20260604`).
    let partition_by = &job.target.partition_by;
    let tc = match &job.target.time_column {
        Some(tc) => tc.clone(),
        None => match partition_by
            .iter()
            .find(|c| matches!(kind_of(c), TimeColumnKind::Date | TimeColumnKind::Timestamp))
        {
            Some(c) => c.clone(),
            None => return Ok(None),
        },
    };
    let kind = kind_of(&tc);
    if window.grain == Grain::Hour && kind == TimeColumnKind::Date {
        return Err(out_err(format!(
            "partition column `{tc}` is a DATE but the job's grain is hour: each hourly run \
             would replace the whole day. Partition by an hour (a timestamp or a \
             YYYY-MM-DDTHH string) or set grain = \"day\""
        )));
    }
    Ok(Some(TimeColumn { name: tc, kind }))
}

/// The partition column that carries the logical date, and what its values look like.
#[derive(Clone, Debug)]
pub(super) struct TimeColumn {
    pub(super) name: String,
    pub(super) kind: TimeColumnKind,
}

/// The live table's schema must be the output's unless the job allows a change: a
/// retyped column would otherwise leave partitions that readers cannot union.
pub(super) fn check_schema_change(job: &Job, output: &SchemaRef) -> Result<()> {
    if job.target.on_schema_change == OnSchemaChange::Allow {
        return Ok(());
    }
    if job.target.format == idem_io::table::Format::Delta {
        check_delta_columns(job, output)?;
    }
    // A table that cannot be opened or read now is not one without a schema: the run
    // fails (and a retry checks again) rather than publish a change unchecked.
    let table = crate::table::open(job)?;
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let mut partitions = table
        .live_partitions(job.target.partition_by.len())
        .map_err(storage)?;
    // The newest partition (last in path order) written by idem speaks for the table.
    partitions.reverse();
    let mut live = None;
    for p in &partitions {
        if let Some(m) = table
            .live_state(p)
            .map_err(storage)?
            .and_then(|s| s.manifest().cloned())
        {
            live = Some((p.clone(), Box::new(m)));
            break;
        }
    }
    let Some((partition, manifest)) = live else {
        return Ok(());
    };
    let new = describe_schema(output, &job.target.partition_by);
    let key = |c: &ColumnEntry| (c.name.clone(), c.data_type.clone(), c.partition);
    if manifest.schema.iter().map(key).eq(new.iter().map(key)) {
        return Ok(());
    }
    let mut names: Vec<&str> = manifest.schema.iter().map(|c| c.name.as_str()).collect();
    for c in &new {
        if !names.contains(&c.name.as_str()) {
            names.push(&c.name);
        }
    }
    let find = |cols: &[ColumnEntry], n: &str| {
        cols.iter()
            .find(|c| c.name == n)
            .map(|c| c.data_type.clone())
    };
    let width = names.iter().map(|n| n.len()).max().unwrap_or(6).max(6);
    let mut table_text = format!("  {:<width$}  {:<24}  output\n", "column", "table");
    for n in names {
        let (old, now) = (find(&manifest.schema, n), find(&new, n));
        let note = match (&old, &now) {
            (None, Some(_)) => "  <- added",
            (Some(_), None) => "  <- dropped",
            (Some(a), Some(b)) if a != b => "  <- retyped",
            _ => "",
        };
        let line = format!(
            "  {:<width$}  {:<24}  {:<24}{note}",
            n,
            old.as_deref().unwrap_or("-"),
            now.as_deref().unwrap_or("-"),
        );
        table_text.push_str(line.trim_end());
        table_text.push('\n');
    }
    Err(Error::Partition {
        path: job.path.clone(),
        partition: partition.to_string(),
        message: format!(
            "the output's schema differs from the table's ({}):\n{table_text}\
             Fix the SQL, or set on_schema_change = \"allow\" in [target] to write the new schema \
             (partitions this run does not replace keep the old one until rewritten)",
            job.target.path.display()
        ),
    })
}

/// A Delta table's columns are all in the output: another writer may have added one
/// (a schema merge), and a commit of the output alone would leave its values to no
/// reader. With `on_schema_change = "allow"` the commit keeps such a column instead.
fn check_delta_columns(job: &Job, output: &SchemaRef) -> Result<()> {
    let path = job.target.path.to_string_lossy();
    let scan = match idem_io::table::delta_scan(&path, &job.storage) {
        Ok(Some(scan)) => scan,
        // No table yet; or one idem refuses, with its reason, when the run opens it.
        Ok(None) | Err(idem_io::Error::DeltaUnsupported { .. }) => return Ok(()),
        // A log that cannot be read now is not one without columns: the run fails.
        Err(source) => {
            return Err(Error::Storage {
                target: job.target.path.clone(),
                source,
            });
        }
    };
    let lacking: Vec<String> = scan
        .data_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .chain(scan.partition_types.iter().map(|(c, _)| c.clone()))
        .filter(|c| output.field_with_name(c).is_err())
        .map(|c| format!("`{c}`"))
        .collect();
    if lacking.is_empty() {
        return Ok(());
    }
    let (them, it) = if lacking.len() == 1 {
        ("column", "it")
    } else {
        ("columns", "them")
    };
    Err(Error::Output {
        path: job.path.clone(),
        message: format!(
            "lacks {them} {} of the Delta table {} (another writer added {it}): a commit \
             of the output would leave {it} to no reader. Select {it} in the SQL, or set \
             on_schema_change = \"allow\" in [target] to keep {it}, NULL in the rows idem \
             writes",
            lacking.join(", "),
            job.target.path.display()
        ),
    })
}

/// The SQL predicate (over the table aliased `t`) of the rows a `delete_missing` merge
/// owns: its window on the time column, or everything in an unpartitioned table.
pub(super) fn delete_scope(
    job: &Job,
    window: &Window,
    time: Option<&TimeColumn>,
) -> Result<String> {
    if job.target.partition_by.is_empty() {
        return Ok("true".into());
    }
    let err = || Error::JobInvalid {
        path: job.path.clone(),
        message: "[target] delete_missing needs a DATE or TIMESTAMP partition column (or \
                  time_column) to define the window it syncs"
            .into(),
    };
    let Some(tc) = time else {
        return Err(err());
    };
    let col = format!("t.{}", crate::sql::ident(&tc.name));
    match tc.kind {
        TimeColumnKind::Date => Ok(format!(
            "({col} >= cast('{}' as date) and {col} < cast('{}' as date))",
            window.start.date(),
            window.end.date()
        )),
        TimeColumnKind::Timestamp => Ok(format!(
            "({col} >= cast('{}' as timestamp) and {col} < cast('{}' as timestamp))",
            window.start.format("%Y-%m-%dT%H:%M:%S"),
            window.end.format("%Y-%m-%dT%H:%M:%S")
        )),
        _ => Err(err()),
    }
}
