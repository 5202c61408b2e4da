//! The canonical, type-aware byte encoding of a value, shared by `idem_key` and the
//! content digest. It is part of idem's on-disk contract (docs/format.md, "Content
//! digest and canonical encoding"): changing it changes every surrogate key and every
//! digest, so golden tests pin it.
//!
//! Each value encodes as one tag byte followed by a payload; every encoding is
//! self-delimiting, so a sequence of values encodes unambiguously by concatenation.
//!
//! | tag | type family | payload |
//! |---|---|---|
//! | 0x00 | NULL (any type) | none |
//! | 0x01 | boolean | 1 byte, 0 or 1 |
//! | 0x02 | integer (Int8..Int64, UInt8..UInt64) | i128, little endian |
//! | 0x03 | float (Float16/32/64) | f64 bits LE; -0.0 as 0.0, every NaN as 0x7ff8000000000000 |
//! | 0x04 | decimal (Decimal32..128) | scale as i8, then i128 LE; trailing zeros stripped (1.50 = 1.5) |
//! | 0x05 | string (Utf8, LargeUtf8, Utf8View) | u64 LE byte length, UTF-8 bytes |
//! | 0x06 | binary (Binary, LargeBinary, BinaryView, FixedSizeBinary) | u64 LE length, bytes |
//! | 0x07 | date (Date32, Date64) | i32 LE days since 1970-01-01 |
//! | 0x08 | timestamp (any unit, any zone) | i128 LE nanoseconds since the epoch (the UTC instant) |
//! | 0x09 | time (Time32, Time64) | i64 LE nanoseconds since midnight |
//! | 0x0a | list (List, LargeList, FixedSizeList, ListView) | u64 LE element count, then each element |
//! | 0x0b | struct | u64 LE field count, then each field in order |
//! | 0x0c | map | u64 LE entry count, then key and value of each entry |
//! | 0x0d | duration (any unit) | i128 LE nanoseconds |
//!
//! Integer widths and timestamp units are normalised, so widening a column does not
//! change keys or digests; dictionary-encoded arrays encode as their values.

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, FixedSizeBinaryArray, FixedSizeListArray, MapArray,
    PrimitiveArray, StructArray,
};
use arrow::datatypes::*;

use crate::error::{Error, Result};

pub const TAG_NULL: u8 = 0x00;
const TAG_BOOL: u8 = 0x01;
const TAG_INT: u8 = 0x02;
const TAG_FLOAT: u8 = 0x03;
const TAG_DECIMAL: u8 = 0x04;
const TAG_STRING: u8 = 0x05;
const TAG_BINARY: u8 = 0x06;
const TAG_DATE: u8 = 0x07;
const TAG_TIMESTAMP: u8 = 0x08;
const TAG_TIME: u8 = 0x09;
const TAG_LIST: u8 = 0x0a;
const TAG_STRUCT: u8 = 0x0b;
const TAG_MAP: u8 = 0x0c;
const TAG_DURATION: u8 = 0x0d;

/// Checks, before any row is seen, that every value of `data_type` can be encoded.
pub fn check_supported(column: &str, data_type: &DataType) -> Result<()> {
    use DataType::*;
    let ok = match data_type {
        Null | Boolean | Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64
        | Float16 | Float32 | Float64 | Decimal32(..) | Decimal64(..) | Decimal128(..) | Utf8
        | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_)
        | Date32 | Date64 | Timestamp(..) | Time32(_) | Time64(_) | Duration(_) => true,
        List(f) | LargeList(f) | FixedSizeList(f, _) | ListView(f) | LargeListView(f) => {
            return check_supported(column, f.data_type());
        }
        Struct(fields) => {
            for f in fields {
                check_supported(column, f.data_type())?;
            }
            true
        }
        Map(f, _) => return check_supported(column, f.data_type()),
        Dictionary(_, v) => return check_supported(column, v),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::UnsupportedType {
            column: column.to_string(),
            data_type: data_type.to_string(),
            what: "hash (idem_key, content digest)",
        })
    }
}

/// `one(value)` of every value of `a`, `null_hash` for its nulls.
fn hash_values<T: ArrowPrimitiveType>(
    a: &PrimitiveArray<T>,
    null_hash: u64,
    mut one: impl FnMut(T::Native) -> u64,
) -> Vec<u64> {
    if a.null_count() == 0 {
        a.values().iter().map(|&v| one(v)).collect()
    } else {
        a.iter().map(|v| v.map_or(null_hash, &mut one)).collect()
    }
}

/// A decimal's unscaled value and scale with trailing fractional zeros removed (zero
/// has scale 0): 1.50 and 1.5 encode alike. In 64-bit arithmetic when the value fits,
/// which is nearly always (128-bit division is several times slower).
fn strip_zeros(v: i128, scale: i8) -> (i128, i8) {
    let mut s = scale;
    if v == 0 {
        return (0, 0);
    }
    if let Ok(mut small) = i64::try_from(v) {
        while s > 0 && small % 10 == 0 {
            small /= 10;
            s -= 1;
        }
        return (small as i128, s);
    }
    let mut v = v;
    while s > 0 && v % 10 == 0 {
        v /= 10;
        s -= 1;
    }
    (v, s)
}

/// Hashes every value of a column (xxh3-64 of its canonical encoding, seeded), with
/// fast paths for the common flat types. Produces exactly the hashes that hashing
/// [`encode_value`]'s bytes would: the golden tests hold both to the same values.
pub fn hash_column(col: &dyn Array, seed: u64) -> Vec<u64> {
    use xxhash_rust::xxh3::xxh3_64_with_seed as h;
    let null_hash = h(&[TAG_NULL], seed);
    use crate::xxh3::{tag_i32, tag_i128, tag_u8_i128};
    macro_rules! ints {
        ($t:ty) => {
            hash_values(col.as_primitive::<$t>(), null_hash, |v| {
                tag_i128(TAG_INT, v as i128, seed)
            })
        };
    }
    macro_rules! timestamps {
        ($t:ty, $unit:expr) => {
            hash_values(col.as_primitive::<$t>(), null_hash, |v| {
                tag_i128(TAG_TIMESTAMP, to_nanos(v, $unit), seed)
            })
        };
    }
    macro_rules! decimals {
        ($t:ty, $scale:expr) => {{
            let scale = *$scale;
            hash_values(col.as_primitive::<$t>(), null_hash, |v| {
                let (v, s) = strip_zeros(v as i128, scale);
                tag_u8_i128(TAG_DECIMAL, s as u8, v, seed)
            })
        }};
    }
    use DataType::*;
    match col.data_type() {
        Int64 => ints!(Int64Type),
        Int32 => ints!(Int32Type),
        Int16 => ints!(Int16Type),
        Int8 => ints!(Int8Type),
        UInt64 => ints!(UInt64Type),
        UInt32 => ints!(UInt32Type),
        UInt16 => ints!(UInt16Type),
        UInt8 => ints!(UInt8Type),
        Date32 => hash_values(col.as_primitive::<Date32Type>(), null_hash, |v| {
            tag_i32(TAG_DATE, v, seed)
        }),
        Decimal128(_, scale) => decimals!(Decimal128Type, scale),
        Decimal64(_, scale) => decimals!(Decimal64Type, scale),
        Decimal32(_, scale) => decimals!(Decimal32Type, scale),
        Timestamp(TimeUnit::Second, _) => timestamps!(TimestampSecondType, TimeUnit::Second),
        Timestamp(TimeUnit::Millisecond, _) => {
            timestamps!(TimestampMillisecondType, TimeUnit::Millisecond)
        }
        Timestamp(TimeUnit::Microsecond, _) => {
            timestamps!(TimestampMicrosecondType, TimeUnit::Microsecond)
        }
        Timestamp(TimeUnit::Nanosecond, _) => {
            timestamps!(TimestampNanosecondType, TimeUnit::Nanosecond)
        }
        Utf8 | LargeUtf8 => {
            let mut short = ShortStrings::new(seed);
            let one = |v: Option<&str>| v.map_or(null_hash, |v| short.hash(v.as_bytes()));
            match col.data_type() {
                Utf8 => col.as_string::<i32>().iter().map(one).collect(),
                _ => col.as_string::<i64>().iter().map(one).collect(),
            }
        }
        Utf8View => {
            let a = col.as_string_view();
            let mut short = ShortStrings::new(seed);
            (0..a.len())
                .map(|r| {
                    if a.is_null(r) {
                        null_hash
                    } else {
                        short.hash_view(a.views()[r], || a.value(r).as_bytes())
                    }
                })
                .collect()
        }
        // The values' hashes, gathered by key; a dictionary larger than the rows (a
        // slice, or the dictionary of a whole column chunk shared by its batches) has
        // only the values of the rows hashed.
        Dictionary(..) => {
            let a = col.as_any_dictionary();
            if a.values().is_empty() {
                // No values: every row is null.
                return vec![null_hash; col.len()];
            }
            if a.values().len() > col.len() {
                let taken = arrow::compute::take(a.values().as_ref(), a.keys(), None)
                    .expect("keys within the dictionary");
                return hash_column(taken.as_ref(), seed);
            }
            let hashes = hash_column(a.values().as_ref(), seed);
            let keys = a.normalized_keys();
            match col.nulls() {
                None => keys.iter().map(|&k| hashes[k]).collect(),
                Some(nulls) => keys
                    .iter()
                    .zip(nulls.iter())
                    .map(|(&k, valid)| if valid { hashes[k] } else { null_hash })
                    .collect(),
            }
        }
        _ => {
            let mut buf = Vec::with_capacity(32);
            (0..col.len())
                .map(|r| {
                    buf.clear();
                    encode_value(col, r, &mut buf);
                    h(&buf, seed)
                })
                .collect()
        }
    }
}

/// The hashes of a string column's short values (at most 12 bytes), remembered by
/// value: columns of statuses, codes and countries repeat a few values on every row,
/// and a lookup costs a fraction of hashing. The value itself is the key (its length
/// and bytes, laid out as Arrow's string views lay out an inline value), so a hash
/// found is the value's own. A column whose short values rarely repeat stops looking
/// after its first rows.
struct ShortStrings {
    seed: u64,
    slots: [(u128, u64); 64],
    looked: u32,
    found: u32,
}

impl ShortStrings {
    /// Rows after which a column that found fewer than a quarter of its short values
    /// stops looking them up.
    const TRIAL: u32 = 512;

    fn new(seed: u64) -> Self {
        // No value has the key u128::MAX: its length would be 2^32 - 1.
        Self {
            seed,
            slots: [(u128::MAX, 0); 64],
            looked: 0,
            found: 0,
        }
    }

    fn hash(&mut self, v: &[u8]) -> u64 {
        if v.len() > 12 {
            return crate::xxh3::tag_len_bytes(TAG_STRING, v, self.seed);
        }
        let mut inline = [0u8; 16];
        inline[..4].copy_from_slice(&(v.len() as u32).to_le_bytes());
        inline[4..4 + v.len()].copy_from_slice(v);
        self.hash_view(u128::from_le_bytes(inline), || v)
    }

    /// `view` as Arrow lays it out: the length in its low 32 bits, then the bytes of a
    /// value of at most 12 (else a prefix and where the rest is: not a key).
    fn hash_view<'a>(&mut self, view: u128, value: impl FnOnce() -> &'a [u8]) -> u64 {
        let seed = self.seed;
        let tag_len_bytes = |v: &[u8]| crate::xxh3::tag_len_bytes(TAG_STRING, v, seed);
        if view as u32 > 12 || (self.looked >= Self::TRIAL && self.found < Self::TRIAL / 4) {
            return tag_len_bytes(value());
        }
        self.looked = self.looked.saturating_add(1);
        let mixed = ((view as u64) ^ (view >> 64) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let slot = &mut self.slots[(mixed >> 58) as usize];
        if slot.0 == view {
            self.found = self.found.saturating_add(1);
            return slot.1;
        }
        let h = tag_len_bytes(value());
        *slot = (view, h);
        h
    }
}

/// Appends the canonical encoding of `array[row]` to `out`.
///
/// The caller must have checked the type with [`check_supported`]; an unsupported
/// type panics here rather than silently hashing something unspecified.
pub fn encode_value(array: &dyn Array, row: usize, out: &mut Vec<u8>) {
    if array.is_null(row) {
        out.push(TAG_NULL);
        return;
    }
    use DataType::*;
    match array.data_type() {
        Null => out.push(TAG_NULL),
        Boolean => {
            let a: &BooleanArray = array.as_boolean();
            out.push(TAG_BOOL);
            out.push(a.value(row) as u8);
        }
        Int8 => int(out, array.as_primitive::<Int8Type>().value(row) as i128),
        Int16 => int(out, array.as_primitive::<Int16Type>().value(row) as i128),
        Int32 => int(out, array.as_primitive::<Int32Type>().value(row) as i128),
        Int64 => int(out, array.as_primitive::<Int64Type>().value(row) as i128),
        UInt8 => int(out, array.as_primitive::<UInt8Type>().value(row) as i128),
        UInt16 => int(out, array.as_primitive::<UInt16Type>().value(row) as i128),
        UInt32 => int(out, array.as_primitive::<UInt32Type>().value(row) as i128),
        UInt64 => int(out, array.as_primitive::<UInt64Type>().value(row) as i128),
        Float16 => float(out, array.as_primitive::<Float16Type>().value(row).to_f64()),
        Float32 => float(out, array.as_primitive::<Float32Type>().value(row) as f64),
        Float64 => float(out, array.as_primitive::<Float64Type>().value(row)),
        Decimal32(_, s) => decimal(
            out,
            array.as_primitive::<Decimal32Type>().value(row) as i128,
            *s,
        ),
        Decimal64(_, s) => decimal(
            out,
            array.as_primitive::<Decimal64Type>().value(row) as i128,
            *s,
        ),
        Decimal128(_, s) => decimal(out, array.as_primitive::<Decimal128Type>().value(row), *s),
        Utf8 => bytes(
            out,
            TAG_STRING,
            array.as_string::<i32>().value(row).as_bytes(),
        ),
        LargeUtf8 => bytes(
            out,
            TAG_STRING,
            array.as_string::<i64>().value(row).as_bytes(),
        ),
        Utf8View => bytes(
            out,
            TAG_STRING,
            array.as_string_view().value(row).as_bytes(),
        ),
        Binary => bytes(out, TAG_BINARY, array.as_binary::<i32>().value(row)),
        LargeBinary => bytes(out, TAG_BINARY, array.as_binary::<i64>().value(row)),
        BinaryView => bytes(out, TAG_BINARY, array.as_binary_view().value(row)),
        FixedSizeBinary(_) => {
            let a: &FixedSizeBinaryArray = array.as_fixed_size_binary();
            bytes(out, TAG_BINARY, a.value(row))
        }
        Date32 => date(out, array.as_primitive::<Date32Type>().value(row)),
        Date64 => date(
            out,
            array
                .as_primitive::<Date64Type>()
                .value(row)
                .div_euclid(86_400_000) as i32,
        ),
        Timestamp(unit, _) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<TimestampSecondType>().value(row),
                TimeUnit::Millisecond => {
                    array.as_primitive::<TimestampMillisecondType>().value(row)
                }
                TimeUnit::Microsecond => {
                    array.as_primitive::<TimestampMicrosecondType>().value(row)
                }
                TimeUnit::Nanosecond => array.as_primitive::<TimestampNanosecondType>().value(row),
            };
            out.push(TAG_TIMESTAMP);
            out.extend_from_slice(&to_nanos(v, *unit).to_le_bytes());
        }
        Time32(unit) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<Time32SecondType>().value(row) as i64,
                _ => array.as_primitive::<Time32MillisecondType>().value(row) as i64,
            };
            out.push(TAG_TIME);
            out.extend_from_slice(&(to_nanos(v, *unit) as i64).to_le_bytes());
        }
        Time64(unit) => {
            let v = match unit {
                TimeUnit::Microsecond => array.as_primitive::<Time64MicrosecondType>().value(row),
                _ => array.as_primitive::<Time64NanosecondType>().value(row),
            };
            out.push(TAG_TIME);
            out.extend_from_slice(&(to_nanos(v, *unit) as i64).to_le_bytes());
        }
        Duration(unit) => {
            let v = match unit {
                TimeUnit::Second => array.as_primitive::<DurationSecondType>().value(row),
                TimeUnit::Millisecond => array.as_primitive::<DurationMillisecondType>().value(row),
                TimeUnit::Microsecond => array.as_primitive::<DurationMicrosecondType>().value(row),
                TimeUnit::Nanosecond => array.as_primitive::<DurationNanosecondType>().value(row),
            };
            out.push(TAG_DURATION);
            out.extend_from_slice(&to_nanos(v, *unit).to_le_bytes());
        }
        List(_) => list(out, &array.as_list::<i32>().value(row)),
        LargeList(_) => list(out, &array.as_list::<i64>().value(row)),
        ListView(_) => list(out, &array.as_list_view::<i32>().value(row)),
        LargeListView(_) => list(out, &array.as_list_view::<i64>().value(row)),
        FixedSizeList(..) => {
            let a: &FixedSizeListArray = array.as_fixed_size_list();
            list(out, &a.value(row))
        }
        Struct(_) => {
            let a: &StructArray = array.as_struct();
            out.push(TAG_STRUCT);
            out.extend_from_slice(&(a.num_columns() as u64).to_le_bytes());
            for c in a.columns() {
                encode_value(c.as_ref(), row, out);
            }
        }
        Map(..) => {
            let a: &MapArray = array.as_map();
            let entries = a.value(row);
            out.push(TAG_MAP);
            out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
            for i in 0..entries.len() {
                encode_value(entries.column(0).as_ref(), i, out);
                encode_value(entries.column(1).as_ref(), i, out);
            }
        }
        Dictionary(..) => arrow::downcast_dictionary_array!(
            array => {
                let key = array.keys().value(row).as_usize();
                encode_value(array.values().as_ref(), key, out)
            }
            other => unreachable!("{other} is not a dictionary"),
        ),
        other => unreachable!("canonical encoding of {other} was not checked"),
    }
}

fn int(out: &mut Vec<u8>, v: i128) {
    out.push(TAG_INT);
    out.extend_from_slice(&v.to_le_bytes());
}

fn float(out: &mut Vec<u8>, v: f64) {
    let bits = if v.is_nan() {
        0x7ff8_0000_0000_0000u64
    } else if v == 0.0 {
        0
    } else {
        v.to_bits()
    };
    out.push(TAG_FLOAT);
    out.extend_from_slice(&bits.to_le_bytes());
}

fn decimal(out: &mut Vec<u8>, v: i128, scale: i8) {
    let (v, scale) = strip_zeros(v, scale);
    out.push(TAG_DECIMAL);
    out.push(scale as u8);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, tag: u8, b: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn date(out: &mut Vec<u8>, days: i32) {
    out.push(TAG_DATE);
    out.extend_from_slice(&days.to_le_bytes());
}

fn list(out: &mut Vec<u8>, values: &ArrayRef) {
    out.push(TAG_LIST);
    out.extend_from_slice(&(values.len() as u64).to_le_bytes());
    for i in 0..values.len() {
        encode_value(values.as_ref(), i, out);
    }
}

fn to_nanos(v: i64, unit: TimeUnit) -> i128 {
    let v = v as i128;
    match unit {
        TimeUnit::Second => v * 1_000_000_000,
        TimeUnit::Millisecond => v * 1_000_000,
        TimeUnit::Microsecond => v * 1_000,
        TimeUnit::Nanosecond => v,
    }
}

/// The surrogate key of one row: xxh3-128 of the concatenated canonical encodings of
/// `columns[..][row]`, as 32 lowercase hex digits.
pub fn key_of_row(columns: &[&dyn Array], row: usize, buf: &mut Vec<u8>) -> String {
    buf.clear();
    for c in columns {
        encode_value(*c, row, buf);
    }
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::*;
    use std::sync::Arc;

    fn enc(a: &dyn Array, row: usize) -> Vec<u8> {
        let mut v = Vec::new();
        encode_value(a, row, &mut v);
        v
    }

    #[test]
    fn null_is_distinct_from_empty_string() {
        let a = StringArray::from(vec![None, Some("")]);
        assert_eq!(enc(&a, 0), vec![TAG_NULL]);
        assert_eq!(enc(&a, 1), vec![TAG_STRING, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn integer_widths_and_string_kinds_are_normalised() {
        let a = Int32Array::from(vec![7]);
        let b = Int64Array::from(vec![7]);
        assert_eq!(enc(&a, 0), enc(&b, 0));
        let s = StringArray::from(vec!["x"]);
        let l = LargeStringArray::from(vec!["x"]);
        let v = StringViewArray::from(vec!["x"]);
        assert_eq!(enc(&s, 0), enc(&l, 0));
        assert_eq!(enc(&s, 0), enc(&v, 0));
    }

    #[test]
    fn decimals_compare_by_value() {
        let a = Decimal128Array::from(vec![150])
            .with_precision_and_scale(12, 2)
            .unwrap();
        let b = Decimal128Array::from(vec![15])
            .with_precision_and_scale(10, 1)
            .unwrap();
        assert_eq!(enc(&a, 0), enc(&b, 0));
    }

    #[test]
    fn timestamps_are_instants() {
        let us = TimestampMicrosecondArray::from(vec![1_000_000]).with_timezone("UTC");
        let s = TimestampSecondArray::from(vec![1]);
        assert_eq!(enc(&us, 0), enc(&s, 0));
    }

    #[test]
    fn dictionary_encodes_as_values() {
        let d: DictionaryArray<Int32Type> = vec!["a", "b", "a"].into_iter().collect();
        let s = StringArray::from(vec!["a"]);
        assert_eq!(enc(&d, 2), enc(&s, 0));
    }

    #[test]
    fn concatenation_is_unambiguous() {
        let a = StringArray::from(vec!["ab", "a"]);
        let b = StringArray::from(vec!["", "b"]);
        let cols: [&dyn Array; 2] = [&a, &b];
        let mut buf = Vec::new();
        assert_ne!(
            key_of_row(&cols, 0, &mut buf),
            key_of_row(&cols, 1, &mut buf)
        );
    }

    /// Golden keys: `idem_key` output is stored in tables and joined on, so it must
    /// never change. Do not update these values; add a new function instead.
    #[test]
    fn golden_keys() {
        let ids = Int64Array::from(vec![Some(42), Some(42), None]);
        let names = StringArray::from(vec![Some("abc"), None, Some("")]);
        let day = Date32Array::from(vec![20000, 20000, 20000]);
        let amount = Decimal128Array::from(vec![1250, 1250, 1250])
            .with_precision_and_scale(12, 2)
            .unwrap();
        let cols: [&dyn Array; 4] = [&ids, &names, &day, &amount];
        let mut buf = Vec::new();
        let keys: Vec<String> = (0..3).map(|r| key_of_row(&cols, r, &mut buf)).collect();
        assert_eq!(keys, GOLDEN_KEYS);
        assert_eq!(
            enc(&amount, 0),
            [vec![TAG_DECIMAL, 1], 125i128.to_le_bytes().to_vec()].concat()
        );
    }

    const GOLDEN_KEYS: [&str; 3] = [
        "0aa65aff2f0ae37e2f198bd61b347162",
        "4da8f8934fe70c2066dc952412de8b04",
        "5a241c5b1db175778bd1ae0b7ebdc0c3",
    ];

    #[test]
    fn fast_column_hashes_equal_the_generic_encoding() {
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![Some(1), None, Some(-7)])),
            Arc::new(Int32Array::from(vec![Some(1), Some(2), None])),
            Arc::new(Int16Array::from(vec![Some(i16::MIN), None, Some(-1)])),
            Arc::new(Int8Array::from(vec![Some(i8::MIN), Some(0), Some(i8::MAX)])),
            Arc::new(UInt64Array::from(vec![Some(u64::MAX), None, Some(3)])),
            Arc::new(UInt32Array::from(vec![Some(u32::MAX), Some(0), None])),
            Arc::new(UInt16Array::from(vec![Some(u16::MAX), None, Some(1)])),
            Arc::new(UInt8Array::from(vec![Some(u8::MAX), Some(7), None])),
            Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX, 0])),
            Arc::new(
                Decimal128Array::from(vec![
                    Some(i128::MAX),
                    Some(-10_000_000_000_000_000_000_000),
                    None,
                ])
                .with_precision_and_scale(38, 10)
                .unwrap(),
            ),
            Arc::new(
                Decimal64Array::from(vec![Some(-1200), Some(i64::MIN), None])
                    .with_precision_and_scale(18, 3)
                    .unwrap(),
            ),
            Arc::new(
                Decimal32Array::from(vec![Some(100), None, Some(-7)])
                    .with_precision_and_scale(9, 2)
                    .unwrap(),
            ),
            Arc::new(TimestampSecondArray::from(vec![
                Some(i64::MIN),
                None,
                Some(i64::MAX),
            ])),
            Arc::new(TimestampMillisecondArray::from(vec![
                Some(-1),
                Some(1),
                None,
            ])),
            Arc::new(TimestampNanosecondArray::from(vec![
                Some(i64::MIN),
                Some(7),
                None,
            ])),
            Arc::new(Date32Array::from(vec![Some(20000), None, Some(-3)])),
            Arc::new(
                Decimal128Array::from(vec![Some(1250), Some(0), None])
                    .with_precision_and_scale(12, 2)
                    .unwrap(),
            ),
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(5), None, Some(-1)]).with_timezone("UTC"),
            ),
            Arc::new(StringArray::from(vec![Some("a"), None, Some("")])),
            Arc::new(StringViewArray::from(vec![
                Some("a long string over twelve bytes"),
                None,
                Some(""),
            ])),
            Arc::new(Float64Array::from(vec![Some(-0.0), None, Some(f64::NAN)])),
            // A null key, a key of a null value, and a dictionary larger than its rows.
            Arc::new(DictionaryArray::new(
                Int32Array::from(vec![Some(2), None, Some(1), Some(0), Some(2)]),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("b")])),
            )),
            Arc::new(DictionaryArray::new(
                UInt8Array::from(vec![Some(4), Some(0), None]),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5, 6, 7])),
            )),
            Arc::new(DictionaryArray::new(
                Int32Array::from(vec![None, None]),
                Arc::new(StringArray::from(Vec::<&str>::new())),
            )),
            Arc::new(
                DictionaryArray::new(
                    Int16Array::from(vec![0, 1, 1, 0, 1]),
                    Arc::new(StringViewArray::from(vec![
                        "x",
                        "a value over twelve bytes",
                    ])),
                )
                .slice(3, 2),
            ),
        ];
        for col in cols {
            let generic: Vec<u64> = (0..col.len())
                .map(|r| {
                    let mut buf = Vec::new();
                    encode_value(col.as_ref(), r, &mut buf);
                    xxhash_rust::xxh3::xxh3_64_with_seed(&buf, 9)
                })
                .collect();
            assert_eq!(hash_column(col.as_ref(), 9), generic, "{}", col.data_type());
        }
    }

    #[test]
    fn remembered_short_strings_hash_as_their_encoding_does() {
        // Repeated short values (remembered), values differing only in length or a NUL,
        // long values, and a column of distinct short values that stops looking.
        let mut values: Vec<Option<String>> = Vec::new();
        for i in 0..3000 {
            values.push(match i % 7 {
                0 => None,
                1 => Some("a".into()),
                2 => Some("a\0".into()),
                3 => Some(String::new()),
                4 => Some("twelve bytes".into()),
                5 => Some(format!("thirteen byte{}", i % 3)),
                _ => Some(format!("{i}")),
            });
        }
        let distinct: Vec<Option<String>> = (0..3000).map(|i| Some(format!("k{i}"))).collect();
        for values in [values, distinct] {
            let cols: Vec<ArrayRef> = vec![
                Arc::new(StringArray::from(values.clone())),
                Arc::new(LargeStringArray::from(values.clone())),
                Arc::new(StringViewArray::from(values.clone())),
                Arc::new(StringViewArray::from(values).slice(5, 2000)),
            ];
            for col in cols {
                let generic: Vec<u64> = (0..col.len())
                    .map(|r| {
                        let mut buf = Vec::new();
                        encode_value(col.as_ref(), r, &mut buf);
                        xxhash_rust::xxh3::xxh3_64_with_seed(&buf, 3)
                    })
                    .collect();
                assert_eq!(hash_column(col.as_ref(), 3), generic, "{}", col.data_type());
            }
        }
    }

    /// A dictionary column costs a lookup per row, not a pass over its keys: 100,000
    /// rows take milliseconds (a pass per row took minutes).
    #[test]
    fn dictionary_columns_hash_in_linear_time() {
        let rows = 100_000;
        let keys = Int32Array::from_iter_values((0..rows).map(|i| i % 4));
        let values = StringArray::from(vec!["placed", "paid", "shipped", "cancelled"]);
        let d = DictionaryArray::new(keys, Arc::new(values));
        let started = std::time::Instant::now();
        let hashes = hash_column(&d, 1);
        let cols: [&dyn Array; 1] = [&d];
        let mut buf = Vec::new();
        let last = key_of_row(&cols, rows as usize - 1, &mut buf);
        let keys: usize = (0..rows as usize)
            .map(|r| key_of_row(&cols, r, &mut buf).len())
            .sum();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(hashes.len(), rows as usize);
        assert_eq!(hashes[3], hashes[rows as usize - 1]);
        assert_eq!(keys, 32 * rows as usize);
        let plain = StringArray::from(vec!["cancelled"]);
        assert_eq!(last, key_of_row(&[&plain], 0, &mut buf));
    }

    #[test]
    fn unsupported_types_are_reported() {
        let err = check_supported("x", &DataType::Interval(IntervalUnit::DayTime)).unwrap_err();
        assert!(err.to_string().contains("column `x`"), "{err}");
        let nested = DataType::List(Arc::new(Field::new("item", DataType::Int64, true)));
        check_supported("l", &nested).unwrap();
    }
}
