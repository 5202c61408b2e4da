//! The derived digest: an unpartitioned table's new digest computed from the sums
//! its files' manifests carry, less the rows the merge drops, plus those it adds,
//! without hashing every row written.

use std::path::PathBuf;

use arrow::datatypes::Schema;
use idem_io::digest::DigestState;
use idem_io::hive::PartitionPath;

use super::prune::LivePartition;

/// The digest state of the unpartitioned table's files the merge rewrites, from their
/// manifest sums; `None` unless every one has a sum and was written with the output's
/// schema, as its footer's manifest says (a row read back then hashes as it did when
/// written; a file kept across a schema change carries its old schema). The footers
/// are read on local disk only: on an object store every row is hashed.
pub(super) fn rewritten_sum(
    files: &[LivePartition],
    read: &[(PartitionPath, Vec<PathBuf>)],
    output: &Schema,
    local: bool,
) -> Option<DigestState> {
    if !local {
        return None;
    }
    let [(root, paths)] = read else {
        return None;
    };
    let live = files.iter().find(|p| &p.path == root)?;
    let fingerprint =
        idem_io::manifest::schema_fingerprint(&idem_io::manifest::describe_schema(output, &[]));
    if live.manifest.as_ref()?.schema_fingerprint != fingerprint {
        return None;
    }
    let mut sum = DigestState::default();
    for path in paths {
        let entry = live
            .files
            .iter()
            .find(|f| &f.path == path)?
            .entry
            .as_ref()?;
        let written = idem_io::manifest::read_from_file(path).ok()??;
        if written.schema_fingerprint != fingerprint {
            return None;
        }
        sum.merge(DigestState::from_parts(entry.rows, entry.sum.as_deref()?)?);
    }
    Some(sum)
}
