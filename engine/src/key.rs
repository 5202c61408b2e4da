//! `idem_key(col, ...)`: a stable surrogate key from natural-key columns.
//!
//! The key is xxh3-128 of the canonical, type-aware encoding of the arguments (see
//! `idem_io::canonical` and docs/format.md), as 32 lowercase hex digits. NULL and the
//! empty string give different keys; widening an integer column or changing a
//! timestamp's unit does not change them. Golden tests pin the output: the same values
//! give the same key in every idem version, so keys can be stored and joined on.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StringBuilder};
use arrow::datatypes::DataType;
use datafusion::common::{Result, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use idem_io::canonical::{check_supported, key_of_row};

#[derive(Debug, PartialEq, Eq, Hash)]
pub struct IdemKey {
    signature: Signature,
}

impl IdemKey {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(IdemKey {
            signature: Signature::variadic_any(Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for IdemKey {
    fn name(&self) -> &str {
        "idem_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        if arg_types.is_empty() {
            return plan_err!("idem_key needs at least one column");
        }
        for (i, t) in arg_types.iter().enumerate() {
            if let Err(e) = check_supported(&format!("argument {}", i + 1), t) {
                return plan_err!("idem_key: {e}");
            }
        }
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = arrays_of(&args)?;
        let cols: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
        let mut out = StringBuilder::with_capacity(rows, rows * 32);
        let mut buf = Vec::with_capacity(64);
        for r in 0..rows {
            out.append_value(key_of_row(&cols, r, &mut buf));
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

/// The error a dedupe tie raises (inside DataFusion's error), so the engine can report
/// it as bad input.
#[derive(Debug, thiserror::Error)]
#[error("dedupe tie: {0}")]
pub struct DedupeTie(String);

/// `idem_dedupe_unique(ok, key, source, latest_by)`: true where `ok`; an execution error
/// naming the key where not. Used by deduplicated sources to refuse ties on
/// `latest_by` instead of keeping an arbitrary row.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct DedupeUnique {
    signature: Signature,
}

impl DedupeUnique {
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(DedupeUnique {
            signature: Signature::any(4, Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for DedupeUnique {
    fn name(&self) -> &str {
        "idem_dedupe_unique"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        use arrow::array::AsArray;
        let rows = args.number_rows;
        let arrays = arrays_of(&args)?;
        let ok = arrays[0].as_boolean();
        for r in 0..rows {
            if ok.is_valid(r) && !ok.value(r) {
                let text = |i: usize| {
                    arrow::util::display::array_value_to_string(&arrays[i], r).unwrap_or_default()
                };
                return Err(datafusion::error::DataFusionError::External(Box::new(
                    DedupeTie(format!(
                        "source `{}` has several rows for {} with the same newest {}; dedupe \
                         cannot choose between them (add a tie-breaker to latest_by's data, or \
                         deduplicate in the SQL)",
                        text(2),
                        text(1),
                        text(3)
                    )),
                )));
            }
        }
        Ok(ColumnarValue::Array(Arc::clone(&arrays[0])))
    }
}

/// The arguments of a call as arrays of the batch's length (scalars expanded).
fn arrays_of(args: &ScalarFunctionArgs) -> Result<Vec<ArrayRef>> {
    args.args
        .iter()
        .map(|a| a.to_array(args.number_rows))
        .collect()
}
