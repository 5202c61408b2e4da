//! What a table root may hold: partition directories of the job's layout and Parquet
//! files in them (and the `_SUCCESS` and `.crc` files Hadoop writers leave beside
//! them). A run replaces a partition's directory whole, and an unpartitioned table's
//! root, so a root holding anything else is refused before anything moves: pointing a
//! job at a project folder, a home directory or a source must never destroy it.
//!
//! Backends list what they hold ([`Entry`]: a local directory walk, or an object
//! store's keys) and [`check`] judges it the same way for both.

use crate::hive::unescape;

/// One thing found under a table root, by its path relative to the root.
#[derive(Clone, Debug)]
pub struct Entry {
    /// `/`-separated, as listed (partition names escaped).
    pub rel: String,
    pub kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    /// A symbolic link, socket, device: never part of a table.
    Other,
}

pub use crate::error::LayoutProblem as Problem;

/// How many offending entries a message names.
const SHOWN: usize = 5;

/// Hadoop writers' bookkeeping files, which readers skip and a replace may drop.
pub fn is_marker_file(name: &str) -> bool {
    name == "_SUCCESS" || name.ends_with(".crc")
}

/// The partition column a directory name `col=value` stands for.
pub(crate) fn column_of(name: &str) -> Option<String> {
    name.split_once('=').map(|(c, _)| unescape(c))
}

/// Judges `entries` against `partition_by`; `Ok(())` when the root could be a table of
/// that layout (an empty or missing root is one).
pub fn check(entries: &[Entry], partition_by: &[String]) -> std::result::Result<(), Problem> {
    let depth = partition_by.len();
    // The table's own layout, from the first data file in name order: a job whose
    // partition columns differ would write beside the old data.
    let mut files: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.kind == Kind::File && e.rel.ends_with(".parquet"))
        .collect();
    files.sort_by(|a, b| a.rel.cmp(&b.rel));
    if let Some(first) = files.first() {
        let dirs: Vec<&str> = first.rel.split('/').collect();
        let dirs = &dirs[..dirs.len() - 1];
        if dirs.iter().all(|d| column_of(d).is_some()) {
            let found: Vec<String> = dirs.iter().filter_map(|d| column_of(d)).collect();
            if found != partition_by {
                return Err(Problem::OtherLayout { found });
            }
        }
    }
    let mut bad = std::collections::BTreeSet::new();
    for e in entries {
        let parts: Vec<&str> = e.rel.split('/').filter(|p| !p.is_empty()).collect();
        let Some((last, dirs)) = parts.split_last() else {
            continue;
        };
        // The first directory on the way that is not a partition of the layout is
        // what is reported (an object store lists the files under it, not it).
        let wrong_dir = dirs
            .iter()
            .enumerate()
            .position(|(i, d)| i >= depth || column_of(d).as_deref() != Some(&partition_by[i]));
        if let Some(i) = wrong_dir {
            bad.insert(format!("{}/ (a directory)", dirs[..=i].join("/")));
            continue;
        }
        let level = dirs.len();
        let fine = match e.kind {
            Kind::Dir => level < depth && column_of(last).as_deref() == Some(&partition_by[level]),
            Kind::File => is_marker_file(last) || (level == depth && last.ends_with(".parquet")),
            Kind::Other => false,
        };
        if !fine {
            let shown = match e.kind {
                Kind::Dir => format!("{}/ (a directory)", e.rel),
                Kind::File => format!("{} (a file)", e.rel),
                Kind::Other => format!("{} (neither a file nor a directory)", e.rel),
            };
            bad.insert(shown);
        }
    }
    if bad.is_empty() {
        return Ok(());
    }
    let mut bad: Vec<String> = bad.into_iter().collect();
    let more = bad.len().saturating_sub(SHOWN);
    bad.truncate(SHOWN);
    if more > 0 {
        bad.push(format!("and {more} more"));
    }
    Err(Problem::NotATable { found: bad })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(rel: &str) -> Entry {
        Entry {
            rel: rel.into(),
            kind: Kind::File,
        }
    }
    fn dir(rel: &str) -> Entry {
        Entry {
            rel: rel.into(),
            kind: Kind::Dir,
        }
    }
    fn cols(c: &[&str]) -> Vec<String> {
        c.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_table_of_the_layout_passes() {
        let entries = [
            dir("dt=2026-06-01"),
            file("dt=2026-06-01/part-00000.parquet"),
            file("dt=2026-06-01/_SUCCESS"),
            file("dt=2026-06-01/.part-00000.parquet.crc"),
            dir("dt=2026-06-02"),
            file("_SUCCESS"),
        ];
        assert_eq!(check(&entries, &cols(&["dt"])), Ok(()));
        assert_eq!(check(&[], &cols(&["dt"])), Ok(()));
        let flat = [file("part-0.parquet"), file("_SUCCESS")];
        assert_eq!(check(&flat, &[]), Ok(()));
    }

    #[test]
    fn anything_else_is_named() {
        let home = [
            file("notes.txt"),
            dir("src"),
            file("data.parquet"),
            dir(".git"),
        ];
        assert_eq!(
            check(&home, &[]),
            Err(Problem::NotATable {
                found: vec![
                    ".git/ (a directory)".into(),
                    "notes.txt (a file)".into(),
                    "src/ (a directory)".into()
                ]
            })
        );
        let stray = [
            dir("dt=2026-06-01"),
            file("dt=2026-06-01/part-0.parquet"),
            dir("dt=2026-06-01/backup"),
            file("README.md"),
            file("x.parquet"),
        ];
        assert_eq!(
            check(&stray, &cols(&["dt"])),
            Err(Problem::NotATable {
                found: vec![
                    "README.md (a file)".into(),
                    "dt=2026-06-01/backup/ (a directory)".into(),
                    "x.parquet (a file)".into(),
                ]
            })
        );
    }

    #[test]
    fn an_object_stores_nested_keys_name_their_directory() {
        let keys = [
            file("dt=1/part-0.parquet"),
            file("src/main.rs"),
            file("src/lib.rs"),
            file("dt=1/x/y.parquet"),
        ];
        assert_eq!(
            check(&keys, &cols(&["dt"])),
            Err(Problem::NotATable {
                found: vec!["dt=1/x/ (a directory)".into(), "src/ (a directory)".into()]
            })
        );
    }

    #[test]
    fn another_partition_layout_is_told_apart() {
        let entries = [dir("dt=1"), file("dt=1/part-0.parquet")];
        assert_eq!(
            check(&entries, &cols(&["event_date"])),
            Err(Problem::OtherLayout {
                found: cols(&["dt"])
            })
        );
        assert_eq!(
            check(&entries, &cols(&["dt", "status"])),
            Err(Problem::OtherLayout {
                found: cols(&["dt"])
            })
        );
        assert_eq!(
            check(&entries, &[]),
            Err(Problem::OtherLayout {
                found: cols(&["dt"])
            })
        );
    }
}
