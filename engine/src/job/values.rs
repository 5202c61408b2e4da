//! Parsing a job file's values: partition column types, codecs, byte sizes,
//! identifiers and `${NAME}` expansion.

use std::path::{Path, PathBuf};

use arrow::datatypes::DataType;
use parquet::basic::{Compression, GzipLevel, ZstdLevel};

use super::file::ByteSize;

pub(super) fn partition_type(name: &str) -> std::result::Result<DataType, String> {
    Ok(match name.to_ascii_lowercase().as_str() {
        "string" | "varchar" | "utf8" => DataType::Utf8,
        "date" => DataType::Date32,
        "int" | "integer" | "int32" => DataType::Int32,
        "bigint" | "int64" | "long" => DataType::Int64,
        "boolean" | "bool" => DataType::Boolean,
        other => {
            return Err(format!(
                "unknown type `{other}` (use string, date, int, bigint or boolean)"
            ));
        }
    })
}

/// The text [`compression`] parses back into `c`.
pub(crate) fn compression_text(c: Compression) -> String {
    match c {
        Compression::UNCOMPRESSED => "none".into(),
        Compression::LZ4_RAW | Compression::LZ4 => "lz4".into(),
        Compression::ZSTD(l) => format!("zstd({})", l.compression_level()),
        Compression::GZIP(l) => format!("gzip({})", l.compression_level()),
        _ => "snappy".into(),
    }
}

pub(crate) fn compression(s: &str) -> std::result::Result<Compression, String> {
    let lower = s.to_ascii_lowercase();
    let (name, level) = match lower.split_once('(') {
        Some((n, rest)) => (
            n.trim().to_string(),
            Some(
                rest.trim_end_matches(')')
                    .trim()
                    .parse::<i32>()
                    .map_err(|_| format!("bad level in `{s}`"))?,
            ),
        ),
        None => (lower.trim().to_string(), None),
    };
    Ok(match (name.as_str(), level) {
        ("snappy", None) => Compression::SNAPPY,
        ("none" | "uncompressed", None) => Compression::UNCOMPRESSED,
        ("lz4", None) => Compression::LZ4_RAW,
        ("zstd", l) => Compression::ZSTD(
            ZstdLevel::try_new(l.unwrap_or(3)).map_err(|e| format!("`{s}`: {e}"))?,
        ),
        ("gzip", l) => Compression::GZIP(
            GzipLevel::try_new(l.unwrap_or(6) as u32).map_err(|e| format!("`{s}`: {e}"))?,
        ),
        _ => {
            return Err(format!(
                "unknown codec `{s}` (use snappy, zstd, zstd(N), gzip, lz4 or none)"
            ));
        }
    })
}

pub(super) fn byte_size(size: &ByteSize) -> std::result::Result<u64, String> {
    let bytes = match size {
        ByteSize::Bytes(b) => *b,
        ByteSize::Text(t) => {
            let t = t.trim();
            let split = t
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(t.len());
            let (num, unit) = t.split_at(split);
            let num: f64 = num.parse().map_err(|_| format!("`{t}` is not a size"))?;
            let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
                "" | "b" => 1,
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                u => return Err(format!("unknown unit `{u}` (use KiB, MiB or GiB)")),
            };
            (num * mult as f64) as u64
        }
    };
    if bytes < 1024 {
        return Err(format!("{bytes} bytes is too small for a file"));
    }
    Ok(bytes)
}

pub(super) fn toml_message(e: &toml::de::Error) -> String {
    // toml's message already names the key and shows the line.
    e.to_string()
        .trim_end()
        .replace("TOML parse error", "TOML error")
}

pub(super) fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Replaces `${NAME}` with the environment variable NAME.
pub(super) fn expand(s: &str) -> std::result::Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed `${{` in `{s}`"))?;
        let name = &after[..end];
        let value = std::env::var(name)
            .map_err(|_| format!("environment variable `{name}` (used in `{s}`) is not set"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

pub(super) fn absolute(p: impl AsRef<Path>) -> PathBuf {
    std::path::absolute(p.as_ref()).unwrap_or_else(|_| p.as_ref().to_path_buf())
}
