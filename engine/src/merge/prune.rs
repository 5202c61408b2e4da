//! Pruning: which live files may hold a changed key (their key columns' Parquet
//! min/max statistics admit one), and so which partitions a merge affects; the other
//! files of an affected partition are kept as they are.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch};
use arrow::datatypes::{DataType, Schema, SchemaRef};
use arrow::row::{Row, RowConverter, Rows, SortField};
use datafusion::common::Column;
use datafusion::dataframe::DataFrame;
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::Expr;
use idem_io::commit::{CommitBackend, Version};
use idem_io::hive::PartitionPath;
use idem_io::manifest::{LiveState, Manifest};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::file::metadata::ParquetMetaDataReader;

use super::keys::equal_iff_same_bytes;
use crate::error::{Error, Result};
use crate::job::Job;
use crate::route::Router;
use crate::sql::{ident, query};

/// The live files, each tested against the changes' keys (when there are any).
/// Footers are read on local disk; an object store's files are all read.
pub(super) async fn probe_live_files(
    job: &Job,
    table: &Arc<dyn CommitBackend>,
    probe: &KeyProbe,
    local: bool,
) -> Result<Vec<LivePartition>> {
    let storage = |source| Error::Storage {
        target: job.target.path.clone(),
        source,
    };
    let mut files = {
        let (table, depth) = (Arc::clone(table), job.target.partition_by.len());
        crate::blocking(move || {
            let files = live_files(table.as_ref(), depth)?;
            idem_io::failpoint::hit("merge_read")?;
            Ok(files)
        })
        .await
        .map_err(storage)?
    };
    if files.iter().all(|p| p.files.is_empty()) {
        return Ok(files);
    }
    for p in files.iter_mut() {
        if !probe.partition_may_match(&p.path) {
            continue; // every file stays `may_match = false`
        }
        for f in p.files.iter_mut() {
            // A file gone since the listing was replaced by a newer version of its
            // partition: the merge is computed again on top of it.
            f.may_match = !local
                || match probe.may_match(&f.path) {
                    Ok(may) => may,
                    Err(idem_io::Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        return Err(storage(idem_io::Error::Conflict {
                            partition: p.path.to_string(),
                        }));
                    }
                    Err(e) => return Err(storage(e)),
                };
        }
    }
    Ok(files)
}

/// The affected partitions: those the changes go to, and those where a file that may
/// hold a changed key does hold one (the key moves partition, or its row is updated),
/// as `semi_join` tells; every `owned` one; the root of an unpartitioned table.
pub(super) async fn affected_partitions(
    job: &Job,
    ctx: &SessionContext,
    output: &SchemaRef,
    router: &Router,
    files: &[LivePartition],
    owned: &[PartitionPath],
    semi_join: &str,
) -> Result<Vec<PartitionPath>> {
    let exec = |e| Error::execution(&job.path, "merge: ", e);
    let partition_by = &job.target.partition_by;
    let mut affected: Vec<PartitionPath> = owned.to_vec();
    if partition_by.is_empty() {
        affected.push(PartitionPath::root());
        return Ok(affected);
    }
    let columns = |prefix: &str| {
        partition_by
            .iter()
            .map(|c| format!("{prefix}{}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut found = query(
        ctx,
        format!("select distinct {} from __idem_changes", columns("")),
    )
    .await
    .map_err(exec)?;
    let candidates: Vec<(PartitionPath, Vec<PathBuf>)> = files
        .iter()
        .map(|p| {
            let may: Vec<PathBuf> = p
                .files
                .iter()
                .filter(|f| f.may_match)
                .map(|f| f.path.clone())
                .collect();
            (p.path.clone(), may)
        })
        .filter(|(_, may)| !may.is_empty())
        .collect();
    if !candidates.is_empty() {
        let probe = files_frame(ctx, &candidates, output, router.data_schema())
            .await
            .map_err(exec)?;
        ctx.register_table("__idem_probe", probe.into_view())
            .map_err(exec)?;
        found.extend(
            query(
                ctx,
                format!(
                    "select distinct {} from __idem_probe t {semi_join}",
                    columns("t.")
                ),
            )
            .await
            .map_err(exec)?,
        );
    }
    for b in &found {
        affected.extend(router.paths_of(b).map_err(|e| exec(e.into()))?);
    }
    affected.sort();
    affected.dedup();
    Ok(affected)
}

/// A live partition and its data files, each marked by whether it may hold a changed key.
pub(super) struct LivePartition {
    pub(super) path: PartitionPath,
    /// `None` when idem did not write the partition (it is then rewritten whole).
    pub(super) manifest: Option<Manifest>,
    pub(super) files: Vec<LiveFile>,
    /// The version read before the files were.
    pub(super) version: Option<Version>,
}

pub(super) struct LiveFile {
    pub(super) path: PathBuf,
    pub(super) entry: Option<idem_io::manifest::FileEntry>,
    pub(super) may_match: bool,
}

/// The live partitions and their files (none yet marked as possibly matching).
pub(super) fn live_files(
    table: &dyn CommitBackend,
    depth: usize,
) -> idem_io::Result<Vec<LivePartition>> {
    let mut out = Vec::new();
    for path in table.live_partitions(depth)? {
        // The version first: a commit after it makes the publish fail, not go stale.
        let version = table.live_version(&path)?;
        let (manifest, names) = match table.live_state(&path)? {
            None => continue,
            Some(LiveState::Managed(m)) => {
                let listed = m.file_names();
                let names = table
                    .read_locations(&path, &listed)?
                    .into_iter()
                    .zip(&m.files)
                    .map(|(at, f)| (PathBuf::from(at), Some(f.clone())))
                    .collect();
                (Some(*m), names)
            }
            Some(LiveState::Foreign { files }) => (
                None,
                files.into_iter().map(|f| (f, None)).collect::<Vec<_>>(),
            ),
            // The commit's files, and Parquet another tool put beside them (as a
            // foreign partition's are read); not files of other commits of idem's.
            Some(LiveState::Unclean { manifest, extra }) => {
                let listed = manifest.file_names();
                let mut names: Vec<(PathBuf, Option<idem_io::manifest::FileEntry>)> = table
                    .read_locations(&path, &listed)?
                    .into_iter()
                    .map(|at| (PathBuf::from(at), None))
                    .collect();
                names.extend(
                    extra
                        .into_iter()
                        .filter(|f| {
                            let name = f.file_name().unwrap_or_default().to_string_lossy();
                            name.ends_with(".parquet") && !idem_io::manifest::written_by_idem(&name)
                        })
                        .map(|f| (f, None)),
                );
                (None, names)
            }
        };
        let files = names
            .into_iter()
            .map(|(path, entry)| LiveFile {
                path,
                entry,
                may_match: false,
            })
            .collect();
        out.push(LivePartition {
            path,
            manifest,
            files,
            version,
        });
    }
    Ok(out)
}

/// The changes' key values, per key column, sorted, to test a file's min/max
/// statistics against.
pub(super) struct KeyProbe {
    pub(super) columns: Vec<ColumnProbe>,
}

pub(super) struct ColumnProbe {
    name: String,
    data_type: DataType,
    converter: RowConverter,
    /// The non-null values, sorted, in the row format (whose byte order is the
    /// type's order).
    pub(super) values: Rows,
}

impl KeyProbe {
    /// `sorted`: the first key column's non-null values, sorted, when known already.
    pub(super) fn new(
        batches: &[RecordBatch],
        schema: &Schema,
        key: &[String],
        mut sorted: Option<ArrayRef>,
    ) -> arrow::error::Result<Self> {
        let mut columns = Vec::with_capacity(key.len());
        for k in key {
            let index = schema.index_of(k)?;
            let data_type = schema.field(index).data_type().clone();
            let values = match sorted.take() {
                Some(values) => values,
                None => {
                    let arrays: Vec<&dyn Array> =
                        batches.iter().map(|b| b.column(index).as_ref()).collect();
                    let all = if arrays.is_empty() {
                        arrow::array::new_empty_array(&data_type)
                    } else {
                        arrow::compute::concat(&arrays)?
                    };
                    let valid = arrow::compute::is_not_null(&all)?;
                    arrow::compute::sort(&arrow::compute::filter(&all, &valid)?, None)?
                }
            };
            let converter = RowConverter::new(vec![SortField::new(data_type.clone())])?;
            let values = converter.convert_columns(&[values])?;
            columns.push(ColumnProbe {
                name: k.clone(),
                data_type,
                converter,
                values,
            });
        }
        Ok(Self { columns })
    }

    /// Whether a partition may hold a key of the changes, by the values of the key
    /// columns that are partition columns (a key of `[dt, id]` matches only in the
    /// changes' `dt` partitions). A NULL value (the default partition) matches nothing.
    fn partition_may_match(&self, p: &PartitionPath) -> bool {
        self.columns.iter().all(|c| match p.value(&c.name) {
            None => true, // not a partition column
            Some(None) => false,
            Some(Some(v)) => {
                let text: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![v]));
                match c.rows_of(&text) {
                    Some((rows, present)) if present[0] => c.any_between(rows.row(0), rows.row(0)),
                    _ => true,
                }
            }
        })
    }

    /// Whether the file may hold a key of the changes: some row group whose min/max
    /// range, in every key column, contains a changed value of that column. A file
    /// without usable statistics may.
    fn may_match(&self, path: &std::path::Path) -> idem_io::Result<bool> {
        if self
            .columns
            .first()
            .is_some_and(|c| c.values.num_rows() == 0)
        {
            return Ok(false);
        }
        let file = idem_io::fs::open(path).map_err(idem_io::Error::io("open", path))?;
        let meta = ParquetMetaDataReader::new()
            .parse_and_finish(&file)
            .map_err(|source| idem_io::Error::ParquetRead {
                path: path.to_path_buf(),
                source,
            })?;
        let groups = meta.row_groups();
        if groups.is_empty() {
            return Ok(false);
        }
        let Ok(arrow_schema) = parquet::arrow::parquet_to_arrow_schema(
            meta.file_metadata().schema_descr(),
            meta.file_metadata().key_value_metadata(),
        ) else {
            return Ok(true);
        };
        let mut admits = vec![true; groups.len()];
        for c in &self.columns {
            if arrow_schema.column_with_name(&c.name).is_none() {
                continue; // a partition column, tested by the partition's value
            }
            let Ok(conv) = StatisticsConverter::try_new(
                &c.name,
                &arrow_schema,
                meta.file_metadata().schema_descr(),
            ) else {
                return Ok(true);
            };
            let (Ok(mins), Ok(maxes)) = (conv.row_group_mins(groups), conv.row_group_maxes(groups))
            else {
                return Ok(true);
            };
            let (Some((mins, min_ok)), Some((maxes, max_ok))) =
                (c.rows_of(&mins), c.rows_of(&maxes))
            else {
                return Ok(true);
            };
            for (g, admit) in admits.iter_mut().enumerate() {
                if !*admit || !min_ok[g] || !max_ok[g] {
                    continue; // no statistics: the group may hold anything
                }
                *admit = c.any_between(mins.row(g), maxes.row(g));
            }
        }
        Ok(admits.into_iter().any(|a| a))
    }
}

impl ColumnProbe {
    /// Statistics values in the probe's row format, and which of them are present;
    /// `None` when they cannot be compared (then the file is read).
    fn rows_of(&self, stats: &ArrayRef) -> Option<(Rows, Vec<bool>)> {
        let stats = arrow::compute::cast(stats, &self.data_type).ok()?;
        let rows = self.converter.convert_columns(&[Arc::clone(&stats)]).ok()?;
        let present = (0..stats.len()).map(|i| stats.is_valid(i)).collect();
        Some((rows, present))
    }

    /// Whether no value repeats (bytewise equality in the row format, which for floats
    /// is not SQL's: `-0.0 = 0.0`, so they never count as distinct here).
    pub(super) fn distinct(&self) -> bool {
        equal_iff_same_bytes(&self.data_type)
            && (1..self.values.num_rows()).all(|i| self.values.row(i - 1) != self.values.row(i))
    }

    /// Whether some changed value lies in `[min, max]` (a binary search).
    fn any_between(&self, min: Row<'_>, max: Row<'_>) -> bool {
        let (mut lo, mut hi) = (0, self.values.num_rows());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.values.row(mid) < min {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo < self.values.num_rows() && self.values.row(lo) <= max
    }
}

/// The rows of the given files, partition by partition, with the partition columns
/// taken from the paths, in the output's column order.
pub(super) async fn files_frame(
    ctx: &SessionContext,
    groups: &[(PartitionPath, Vec<PathBuf>)],
    output: &SchemaRef,
    data_schema: &SchemaRef,
) -> datafusion::error::Result<DataFrame> {
    let groups: Vec<(&PartitionPath, Vec<String>)> = groups
        .iter()
        .map(|(p, files)| {
            let files = files.iter().map(|f| f.to_string_lossy().into_owned());
            (p, files.collect())
        })
        .collect();
    let typed = |col: &str| {
        output
            .field_with_name(col)
            .map(|f| f.data_type().clone())
            .unwrap_or(DataType::Utf8)
    };
    match crate::session::partition_files_frame(ctx, groups, Some(data_schema), typed).await? {
        Some(frame) => frame.select(
            output
                .fields()
                .iter()
                .map(|f| Expr::Column(Column::new_unqualified(f.name())))
                .collect::<Vec<_>>(),
        ),
        None => ctx.read_batch(RecordBatch::new_empty(Arc::clone(output))),
    }
}
