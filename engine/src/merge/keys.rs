//! The changed key set. A single integer key whose changed values are dense enough
//! is a bitmap: the anti join against the changes becomes a bit test per row of the
//! table (`KeyTest`), which can also record the rows it drops for the derived digest.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDFImpl, Signature, Volatility,
};
use idem_io::digest::{Difference, digest_columns};

/// The name of the merge's test of a key (`KeyTest::changed_key`).
pub(super) const CHANGED_KEY: &str = "__idem_changed_key";

/// The keys of the changes for a single-column integer key, tested by
/// `__idem_changed_key(k)` (see `KeyTest`). The keys are a bitmap over their range, so
/// each row of the table is tested by one bit instead of probing a hash table built
/// from a copy of the changes. Only built when the range takes at most 64 bits per
/// key, the size of the keys themselves; sparser keys are joined. Setting the bits
/// also finds NULL and repeated keys, and reading them back gives the keys sorted, so
/// the statistics probe needs no sort of its own.
#[derive(Debug)]
pub(super) struct ChangedKeys {
    /// The key column's type.
    data_type: DataType,
    min: i64,
    /// Bit `v - min` is set for each key `v`.
    bits: Vec<u64>,
    /// Whether no key is NULL or repeated (found while the bits are set).
    pub(super) unique_and_present: bool,
}

impl ChangedKeys {
    pub(super) fn new(
        batches: &[RecordBatch],
        schema: &Schema,
        key: &[String],
    ) -> arrow::error::Result<Option<Self>> {
        let [key] = key else { return Ok(None) };
        let data_type = schema.field_with_name(key)?.data_type().clone();
        // The types every value of which is an i64.
        if !matches!(
            data_type,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
        ) {
            return Ok(None);
        }
        let index = schema.index_of(key)?;
        let columns = batches
            .iter()
            .map(|b| arrow::compute::cast(b.column(index), &DataType::Int64))
            .collect::<arrow::error::Result<Vec<_>>>()?;
        let ints = || columns.iter().map(|c| c.as_primitive::<Int64Type>());
        let (Some(min), Some(max)) = (
            ints().filter_map(arrow::compute::min).min(),
            ints().filter_map(arrow::compute::max).max(),
        ) else {
            return Ok(None);
        };
        let keys: usize = columns.iter().map(|c| c.len() - c.null_count()).sum();
        let span = (max as i128 - min as i128 + 1) as u128;
        if span > (keys as u128 * 64).max(1 << 16) {
            return Ok(None);
        }
        let mut bits = vec![0u64; span.div_ceil(64) as usize];
        let mut unique_and_present = columns.iter().all(|c| c.null_count() == 0);
        for c in ints() {
            for v in c.iter().flatten() {
                let d = v.wrapping_sub(min) as u64;
                let (word, bit) = (&mut bits[(d / 64) as usize], 1 << (d % 64));
                unique_and_present &= *word & bit == 0;
                *word |= bit;
            }
        }
        Ok(Some(Self {
            data_type,
            min,
            bits,
            unique_and_present,
        }))
    }

    /// The distinct keys in ascending order, as the key column's type.
    pub(super) fn sorted(&self, schema: &Schema, key: &str) -> arrow::error::Result<ArrayRef> {
        let mut keys = Vec::new();
        for (w, &word) in self.bits.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let bit = word.trailing_zeros() as u64;
                keys.push(self.min.wrapping_add((w as u64 * 64 + bit) as i64));
                word &= word - 1;
            }
        }
        let keys: ArrayRef = Arc::new(arrow::array::Int64Array::from(keys));
        arrow::compute::cast(&keys, schema.field_with_name(key)?.data_type())
    }

    /// Whether each of `keys` is a changed key (never for NULL).
    fn hits(&self, keys: &ArrayRef) -> arrow::error::Result<BooleanArray> {
        let keys = arrow::compute::cast(keys, &DataType::Int64)?;
        let keys = keys.as_primitive::<Int64Type>();
        let values = keys.values();
        let hit = BooleanBuffer::collect_bool(values.len(), |i| self.contains(values[i]));
        let hit = match keys.nulls() {
            Some(valid) => &hit & valid.inner(),
            None => hit,
        };
        Ok(BooleanArray::new(hit, None))
    }

    fn contains(&self, v: i64) -> bool {
        let d = v.wrapping_sub(self.min) as u64;
        usize::try_from(d / 64)
            .ok()
            .and_then(|i| self.bits.get(i))
            .is_some_and(|w| w >> (d % 64) & 1 == 1)
    }
}

/// The name of the merge's test of a row (`KeyTest::dropped_rows`).
pub(super) const DROPPED_ROWS: &str = "__idem_drop_changed";

/// A UDF over `ChangedKeys`, in one of two forms:
///
/// * `__idem_changed_key(k)`: whether `k` is a changed key (never for NULL);
/// * `__idem_drop_changed(c_0, …, c_n)`, over every column of a row of the table: the
///   same test of its key, and the rows it answers `true` for (the rows the merge
///   drops) are recorded as taken out of the files read. With the changes recorded as
///   put in, that gives the digest of the new rows without hashing the rows kept,
///   which are most. Volatile: evaluated once per row read, never folded or
///   repeated; the writer checks that the rows it was given are as many as the files'
///   less those dropped plus those added.
#[derive(Debug)]
pub(super) struct KeyTest {
    name: &'static str,
    signature: Signature,
    keys: Arc<ChangedKeys>,
    /// The key's position among the arguments.
    key: usize,
    /// Where the rows answered `true` are recorded as taken out.
    dropped: Option<Arc<Difference>>,
}

impl KeyTest {
    pub(super) fn changed_key(keys: Arc<ChangedKeys>) -> Self {
        Self {
            name: CHANGED_KEY,
            signature: Signature::exact(vec![keys.data_type.clone()], Volatility::Immutable),
            keys,
            key: 0,
            dropped: None,
        }
    }

    /// Over the columns of `schema`, whose key column is `key`.
    pub(super) fn dropped_rows(
        keys: Arc<ChangedKeys>,
        rows: Arc<Difference>,
        schema: &Schema,
        key: &str,
    ) -> arrow::error::Result<Self> {
        let types = schema.fields().iter().map(|f| f.data_type().clone());
        Ok(Self {
            name: DROPPED_ROWS,
            signature: Signature::exact(types.collect(), Volatility::Volatile),
            keys,
            key: schema.index_of(key)?,
            dropped: Some(rows),
        })
    }
}

// One instance per merge: equal only to itself.
impl PartialEq for KeyTest {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for KeyTest {}

impl std::hash::Hash for KeyTest {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.keys.min.hash(state);
    }
}

impl ScalarUDFImpl for KeyTest {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(
        &self,
        args: ScalarFunctionArgs,
    ) -> datafusion::common::Result<ColumnarValue> {
        let columns = ColumnarValue::values_to_arrays(&args.args)?;
        let hit = self.keys.hits(&columns[self.key])?;
        let dropped = hit.true_count();
        if let Some(rows) = self.dropped.as_ref().filter(|_| dropped > 0) {
            let columns = columns
                .iter()
                .map(|c| arrow::compute::filter(c, &hit))
                .collect::<arrow::error::Result<Vec<_>>>()?;
            rows.remove(digest_columns(&columns, dropped));
        }
        Ok(ColumnarValue::Array(Arc::new(hit)))
    }
}

/// Whether two values of type `t` are equal in SQL exactly when their encodings in the
/// row format are: not for floats (`-0.0 = 0.0`), nested or NULL types.
pub(super) fn equal_iff_same_bytes(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, values) => equal_iff_same_bytes(values),
        t => !t.is_floating() && !t.is_nested() && !t.is_null(),
    }
}
