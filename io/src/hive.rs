//! Hive partition paths: `col=value/col2=value2/`, values escaped as Hive does
//! (`FileUtils.escapePathName`), NULL and the empty string written as
//! `__HIVE_DEFAULT_PARTITION__`. Every engine that reads Hive layouts (DuckDB, Spark,
//! Polars, pyarrow, Trino) decodes these names the same way.

use std::fmt;
use std::path::PathBuf;

use crate::error::{Error, Result};

/// The directory name Hive, Spark and idem use for a NULL (or empty) partition value.
pub const DEFAULT_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// The values of one partition, in the table's partition column order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PartitionPath {
    parts: Vec<(String, Option<String>)>,
}

impl PartitionPath {
    pub fn new(parts: Vec<(String, Option<String>)>) -> Self {
        Self { parts }
    }

    /// The unpartitioned table's single "partition": the table root itself.
    pub fn root() -> Self {
        Self { parts: Vec::new() }
    }

    pub fn parts(&self) -> &[(String, Option<String>)] {
        &self.parts
    }

    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().map(|(c, _)| c.as_str())
    }

    /// The value of `column`, `None` when the column is absent, `Some(None)` for NULL.
    pub fn value(&self, column: &str) -> Option<Option<&str>> {
        self.parts
            .iter()
            .find(|(c, _)| c == column)
            .map(|(_, v)| v.as_deref())
    }

    pub fn is_null_anywhere(&self) -> bool {
        self.parts.iter().any(|(_, v)| v.is_none())
    }

    /// Relative path inside the table, escaped: `dt=2026-06-04/region=eu`.
    pub fn rel_path(&self) -> PathBuf {
        let mut p = PathBuf::new();
        for (col, value) in &self.parts {
            p.push(segment(col, value.as_deref()));
        }
        p
    }

    /// Parses a relative path of `col=value` segments.
    pub fn parse(rel: &str) -> Result<Self> {
        let mut parts = Vec::new();
        for seg in rel.split('/').filter(|s| !s.is_empty()) {
            let (col, value) = seg.split_once('=').ok_or_else(|| Error::BadPartitionPath {
                path: rel.to_string(),
                reason: format!("segment `{seg}` is not `column=value`"),
            })?;
            let value = if value == DEFAULT_PARTITION {
                None
            } else {
                Some(unescape(value))
            };
            parts.push((unescape(col), value));
        }
        Ok(Self { parts })
    }
}

impl fmt::Display for PartitionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.parts.is_empty() {
            return f.write_str("(table)");
        }
        for (i, (col, value)) in self.parts.iter().enumerate() {
            if i > 0 {
                f.write_str("/")?;
            }
            f.write_str(&segment(col, value.as_deref()))?;
        }
        Ok(())
    }
}

fn segment(col: &str, value: Option<&str>) -> String {
    let value = match value {
        None | Some("") => DEFAULT_PARTITION.to_string(),
        Some(v) => escape(v),
    };
    format!("{}={}", escape(col), value)
}

fn needs_escape(c: char) -> bool {
    matches!(
        c,
        // Hive escapes 1..=31; NUL too, which no path or key can hold.
        '\u{00}'
            ..='\u{1f}'
                | '"'
                | '#'
                | '%'
                | '\''
                | '*'
                | '/'
                | ':'
                | '='
                | '?'
                | '\\'
                | '\u{7f}'
                | '{'
                | '['
                | ']'
                | '^'
    )
}

/// Escapes a partition column name or value the way Hive does.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if needs_escape(c) {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// Reverses [`escape`]; malformed escapes are kept literally, as Hive does.
pub fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(hex) = std::str::from_utf8(&bytes[i + 1..i + 3])
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_like_hive() {
        assert_eq!(escape("2026-06-04 01:00:00"), "2026-06-04 01%3A00%3A00");
        assert_eq!(escape("a/b=c%"), "a%2Fb%3Dc%25");
        assert_eq!(unescape("a%2Fb%3Dc%25"), "a/b=c%");
        assert_eq!(unescape("100%"), "100%");
    }

    #[test]
    fn paths_round_trip() {
        let p = PartitionPath::new(vec![
            ("dt".into(), Some("2026-06-04".into())),
            ("region".into(), None),
        ]);
        assert_eq!(
            p.rel_path(),
            PathBuf::from("dt=2026-06-04/region=__HIVE_DEFAULT_PARTITION__")
        );
        assert_eq!(
            PartitionPath::parse("dt=2026-06-04/region=__HIVE_DEFAULT_PARTITION__").unwrap(),
            p
        );
    }
}
