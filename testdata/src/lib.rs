//! Deterministic raw data for idem's tests, examples and benchmarks.
//!
//! The same arguments give the same rows in every run and on every machine (ChaCha8
//! seeded per table and day, a documented, value-stable generator), and every day can
//! be regenerated on its own. The layout and columns follow the peer benchmark's
//! generator, so idem can be measured on the same shape of data:
//!
//! `orders/created_date=YYYY-MM-DD/part-0.parquet`: order_id int64 (unique, increasing),
//! customer_id int64, store_id int32, amount_usd decimal(12,2), status string,
//! created_at timestamp[us, UTC] (sorted within the day).
//!
//! `customers/customers.csv`: customer_id, email, country, signup_date.

pub mod servers;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    ArrayRef, Decimal128Builder, Int32Builder, Int64Builder, StringBuilder,
    TimestampMicrosecondBuilder,
};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use arrow::record_batch::RecordBatch;
use chrono::{Duration, NaiveDate};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("{0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Statuses and their weights in percent.
pub const STATUSES: [(&str, u32); 6] = [
    ("placed", 10),
    ("paid", 15),
    ("shipped", 20),
    ("delivered", 45),
    ("cancelled", 5),
    ("returned", 5),
];

pub const COUNTRIES: [&str; 20] = [
    "US", "GB", "DE", "FR", "ES", "IT", "NL", "SE", "PL", "BR", "MX", "CA", "JP", "KR", "IN", "AU",
    "NZ", "ZA", "NG", "EG",
];

/// What to generate.
#[derive(Clone, Debug)]
pub struct OrdersSpec {
    pub start: NaiveDate,
    pub days: u32,
    pub rows_per_day: u64,
    pub customers: u64,
    pub seed: u64,
}

impl Default for OrdersSpec {
    fn default() -> Self {
        Self {
            start: NaiveDate::from_ymd_opt(2026, 6, 1).expect("valid date"),
            days: 7,
            rows_per_day: 1000,
            customers: 1000,
            seed: 42,
        }
    }
}

pub fn orders_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("order_id", DataType::Int64, false),
        Field::new("customer_id", DataType::Int64, false),
        Field::new("store_id", DataType::Int32, false),
        Field::new("amount_usd", DataType::Decimal128(12, 2), false),
        Field::new("status", DataType::Utf8, false),
        Field::new(
            "created_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
    ]))
}

const TABLE_ORDERS: u64 = 1;
const TABLE_CUSTOMERS: u64 = 2;
const BATCH: u64 = 64 * 1024;

fn rng(seed: u64, table: u64, day: u64) -> ChaCha8Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&table.to_le_bytes());
    key[16..24].copy_from_slice(&day.to_le_bytes());
    ChaCha8Rng::from_seed(key)
}

fn props() -> WriterProperties {
    WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by("idem-testdata".into())
        .build()
}

/// Writes `spec.days` days of orders under `dir` (`dir/created_date=…/part-0.parquet`),
/// streaming in batches so any size fits in memory. Returns the files written.
pub fn write_orders(dir: &Path, spec: &OrdersSpec) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for day in 0..spec.days {
        out.push(write_orders_day(dir, spec, day)?);
    }
    Ok(out)
}

/// Writes one day (index from `spec.start`) of orders.
pub fn write_orders_day(dir: &Path, spec: &OrdersSpec, day: u32) -> Result<PathBuf> {
    let date = spec.start + Duration::days(day as i64);
    let part = dir.join(format!("created_date={}", date.format("%Y-%m-%d")));
    std::fs::create_dir_all(&part).map_err(|source| Error::Io {
        path: part.clone(),
        source,
    })?;
    let path = part.join("part-0.parquet");
    let file = File::create(&path).map_err(|source| Error::Io {
        path: path.clone(),
        source,
    })?;
    let perr = |source| Error::Parquet {
        path: path.clone(),
        source,
    };
    let schema = orders_schema();
    let mut writer =
        ArrowWriter::try_new(file, Arc::clone(&schema), Some(props())).map_err(perr)?;
    let mut rng = rng(spec.seed, TABLE_ORDERS, day as u64);
    let day_start_us = date
        .and_hms_opt(0, 0, 0)
        .expect("midnight")
        .and_utc()
        .timestamp_micros();
    let n = spec.rows_per_day;
    let step = 86_400_000_000u64 / n.max(1);
    let mut i = 0;
    while i < n {
        let len = BATCH.min(n - i);
        let mut order_id = Int64Builder::with_capacity(len as usize);
        let mut customer = Int64Builder::with_capacity(len as usize);
        let mut store = Int32Builder::with_capacity(len as usize);
        let mut amount = Decimal128Builder::with_capacity(len as usize);
        let mut status = StringBuilder::with_capacity(len as usize, len as usize * 9);
        let mut created = TimestampMicrosecondBuilder::with_capacity(len as usize);
        for j in i..i + len {
            order_id.append_value((day as u64 * n + j + 1) as i64);
            customer.append_value(rng.random_range(1..=spec.customers) as i64);
            store.append_value(rng.random_range(1..=500));
            // Exponential with mean $50, in cents, at least one cent.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            amount.append_value(((-u.ln() * 5000.0) as i128).max(1));
            let mut pick = rng.random_range(0..100u32);
            let mut chosen = STATUSES[STATUSES.len() - 1].0;
            for (s, w) in STATUSES {
                if pick < w {
                    chosen = s;
                    break;
                }
                pick -= w;
            }
            status.append_value(chosen);
            let jitter = if step > 1 {
                rng.random_range(0..step)
            } else {
                0
            };
            created.append_value(day_start_us + (j * step + jitter) as i64);
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(order_id.finish()),
            Arc::new(customer.finish()),
            Arc::new(store.finish()),
            Arc::new(amount.finish().with_precision_and_scale(12, 2)?),
            Arc::new(status.finish()),
            Arc::new(created.finish().with_timezone("UTC")),
        ];
        writer
            .write(&RecordBatch::try_new(Arc::clone(&schema), columns)?)
            .map_err(perr)?;
        i += len;
    }
    writer.close().map_err(perr)?;
    Ok(path)
}

/// Writes `customers` rows to `dir/customers.csv` (with a header).
pub fn write_customers_csv(dir: &Path, customers: u64, seed: u64) -> Result<PathBuf> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let path = dir.join("customers.csv");
    let ioerr = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let mut f = std::io::BufWriter::new(File::create(&path).map_err(ioerr)?);
    let mut rng = rng(seed, TABLE_CUSTOMERS, 0);
    writeln!(f, "customer_id,email,country,signup_date").map_err(ioerr)?;
    let base = NaiveDate::from_ymd_opt(2015, 1, 1).expect("valid date");
    for id in 1..=customers {
        let country = COUNTRIES[rng.random_range(0..COUNTRIES.len())];
        let signup = base + Duration::days(rng.random_range(0..3287));
        writeln!(
            f,
            "{id},user{id}@example.com,{country},{}",
            signup.format("%Y-%m-%d")
        )
        .map_err(ioerr)?;
    }
    f.flush().map_err(ioerr)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_arguments_same_bytes() {
        let a = tempfile_dir("a");
        let b = tempfile_dir("b");
        let spec = OrdersSpec {
            days: 2,
            rows_per_day: 500,
            ..Default::default()
        };
        let fa = write_orders(&a, &spec).unwrap();
        let fb = write_orders(&b, &spec).unwrap();
        for (x, y) in fa.iter().zip(&fb) {
            assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap());
        }
        let _ = std::fs::remove_dir_all(a);
        let _ = std::fs::remove_dir_all(b);
    }

    fn tempfile_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("idem-testdata-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
