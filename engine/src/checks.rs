//! Checks on the staged output, before anything is published (write-audit-publish).
//!
//! The staged partitions are read back as a table named `output` (data columns plus the
//! partition columns, in the transform's column order). A failing check aborts the
//! run: the staging area is removed and every live partition is left as it was. The
//! error names the check and the partition and shows up to five example rows.

use arrow::datatypes::SchemaRef;
use arrow::record_batch::RecordBatch;
use datafusion::common::ScalarValue;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::{ParquetReadOptions, lit};
use idem_io::writer::WrittenPartition;

use crate::error::{Error, Result};
use crate::job::{Checks, Job};
use crate::sql::{first_value, ident, pretty};

fn failed(job: &Job, check: String, partition: String, details: String) -> Error {
    Error::CheckFailed {
        path: job.path.clone(),
        check,
        partition,
        details,
    }
}

fn sql_literal(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("'{}'", s.replace('\'', "''")),
        toml::Value::Datetime(d) => format!("'{d}'"),
        other => other.to_string(),
    }
}

async fn rows(ctx: &SessionContext, job: &Job, sql: &str) -> Result<Vec<RecordBatch>> {
    let exec = |e| Error::execution(&job.path, format!("running check `{sql}`: "), e);
    ctx.sql(sql)
        .await
        .map_err(exec)?
        .collect()
        .await
        .map_err(exec)
}

fn count(batches: &[RecordBatch]) -> usize {
    batches.iter().map(|b| b.num_rows()).sum()
}

/// Registers the staged partitions as the table `output`.
async fn register_output(
    ctx: &SessionContext,
    job: &Job,
    output: &SchemaRef,
    staged: &[WrittenPartition],
) -> Result<()> {
    let exec = |e| Error::execution(&job.path, "reading the staged output back for checks: ", e);
    let names: Vec<&str> = output.fields().iter().map(|f| f.name().as_str()).collect();
    let mut union: Option<DataFrame> = None;
    for part in staged {
        let mut df = match part.uploaded() {
            // Staged on the object store by a cluster's executor: exactly the files it
            // described (a retried task may have left others beside them).
            Some(up) => {
                let store = idem_io::store::object_store(&up.url, job.storage_for(&up.url))
                    .map_err(|e| Error::Storage {
                        target: job.target.path.clone(),
                        source: e,
                    })?;
                let base = datafusion::datasource::listing::ListingTableUrl::parse(&up.url)
                    .map_err(exec)?
                    .object_store();
                ctx.register_object_store(base.as_ref(), store);
                let files: Vec<String> = up
                    .files
                    .iter()
                    .map(|(name, _)| idem_io::store::datafusion_url(&format!("{}/{name}", up.url)))
                    .collect();
                ctx.read_parquet(files, ParquetReadOptions::default())
                    .await
                    .map_err(exec)?
            }
            None => ctx
                .read_parquet(
                    format!("{}/", part.dir().display()),
                    ParquetReadOptions::default(),
                )
                .await
                .map_err(exec)?,
        };
        for (col, value) in part.partition().parts() {
            let field = output
                .field_with_name(col)
                .expect("partition column in output");
            let scalar = match value {
                Some(v) => ScalarValue::try_from_string(v.clone(), field.data_type()),
                None => ScalarValue::try_from(field.data_type()),
            }
            .map_err(exec)?;
            df = df.with_column(col, lit(scalar)).map_err(exec)?;
        }
        let df = df.select_columns(&names).map_err(exec)?;
        union = Some(match union {
            None => df,
            Some(u) => u.union(df).map_err(exec)?,
        });
    }
    if let Some(df) = union {
        ctx.register_table("output", df.into_view()).map_err(exec)?;
    }
    Ok(())
}

/// Runs every check of the job on the staged partitions.
pub async fn run(
    job: &Job,
    checks: &Checks,
    output: &SchemaRef,
    staged: &[WrittenPartition],
) -> Result<()> {
    if checks.is_empty() {
        return Ok(());
    }
    for part in staged {
        let rows = part.manifest().rows;
        if let Some(min) = checks.min_rows
            && rows < min
        {
            return Err(failed(
                job,
                format!("min_rows = {min}"),
                part.partition().to_string(),
                format!("the partition has {rows} rows"),
            ));
        }
        if let Some(max) = checks.max_rows
            && rows > max
        {
            return Err(failed(
                job,
                format!("max_rows = {max}"),
                part.partition().to_string(),
                format!("the partition has {rows} rows"),
            ));
        }
    }
    if staged.is_empty() {
        return Ok(());
    }
    let ctx = crate::session::guarded(Default::default(), Default::default());
    ctx.register_udf(crate::key::IdemKey::udf());
    register_output(&ctx, job, output, staged).await?;
    let partition_cols: Vec<String> = job.target.partition_by.iter().map(|c| ident(c)).collect();
    let partition_of = |batches: &[RecordBatch]| -> String {
        let Some(b) = batches.iter().find(|b| b.num_rows() > 0) else {
            return "(none)".into();
        };
        if job.target.partition_by.is_empty() {
            return "(table)".into();
        }
        let mut parts = Vec::new();
        for c in &job.target.partition_by {
            let col = b.column_by_name(c).expect("partition column selected");
            let v = arrow::util::display::array_value_to_string(col, 0).unwrap_or_default();
            parts.push(format!("{c}={v}"));
        }
        parts.join("/")
    };
    let with_partition = |cols: &str| {
        if partition_cols.is_empty() {
            cols.to_string()
        } else {
            format!("{}, {cols}", partition_cols.join(", "))
        }
    };

    for c in &checks.not_null {
        let sql = format!("select * from output where {} is null limit 5", ident(c));
        let found = rows(&ctx, job, &sql).await?;
        if count(&found) > 0 {
            let n = rows(
                &ctx,
                job,
                &format!("select count(*) from output where {} is null", ident(c)),
            )
            .await?;
            return Err(failed(
                job,
                format!("not_null: {c}"),
                partition_of(&found),
                format!(
                    "{} rows have NULL in `{c}`; for example:\n{}",
                    first_value(&n),
                    pretty(&found)
                ),
            ));
        }
    }
    for key in checks.unique_keys() {
        let cols: Vec<String> = key.iter().map(|c| ident(c)).collect();
        let sql = format!(
            "select {}, count(*) as copies from output group by {} having count(*) > 1 order by copies desc limit 5",
            cols.join(", "),
            cols.join(", ")
        );
        let found = rows(&ctx, job, &sql).await?;
        if count(&found) > 0 {
            let where_dup = format!(
                "select {} from output where ({}) in (select {} from output group by {} having count(*) > 1) limit 5",
                with_partition(&cols.join(", ")),
                cols.join(", "),
                cols.join(", "),
                cols.join(", ")
            );
            let example = rows(&ctx, job, &where_dup).await.unwrap_or_default();
            return Err(failed(
                job,
                format!("unique: {}", key.join(", ")),
                partition_of(&example),
                format!(
                    "duplicate keys (with their number of copies):\n{}",
                    pretty(&found)
                ),
            ));
        }
    }
    for (c, values) in &checks.accepted_values {
        let list: Vec<String> = values.iter().map(sql_literal).collect();
        let sql = format!(
            "select * from output where {} not in ({}) limit 5",
            ident(c),
            list.join(", ")
        );
        let found = rows(&ctx, job, &sql).await?;
        if count(&found) > 0 {
            return Err(failed(
                job,
                format!("accepted_values: {c}"),
                partition_of(&found),
                format!(
                    "rows with a value outside [{}]; for example:\n{}",
                    list.join(", "),
                    pretty(&found)
                ),
            ));
        }
    }
    for sql in &checks.assert {
        let result = rows(&ctx, job, sql).await?;
        let ok = result.len() == 1
            && result[0].num_rows() == 1
            && result[0].num_columns() == 1
            && matches!(
                ScalarValue::try_from_array(result[0].column(0), 0),
                Ok(ScalarValue::Boolean(Some(true)))
            );
        if !ok {
            return Err(failed(
                job,
                format!("assert: {sql}"),
                "(output)".into(),
                format!(
                    "it returned (expected one row holding true):\n{}",
                    pretty(&result)
                ),
            ));
        }
    }
    Ok(())
}
