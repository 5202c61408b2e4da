//! Run parameters, bound as typed SQL values (never pasted into the SQL text):
//! `$run_date` (DATE), `$run_start` and `$run_end` (TIMESTAMP in UTC, the half-open
//! window the run owns), and `--var name=value` (a string, or typed with
//! `name:int=`, `name:float=`, `name:bool=`, `name:date=`, `name:timestamp=`).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use chrono::{NaiveDate, NaiveDateTime};
use datafusion::common::ParamValues;
use datafusion::common::ScalarValue;
use datafusion::common::metadata::ScalarAndMetadata;
use datafusion::logical_expr::LogicalPlan;

use crate::error::{Error, Result};
use crate::window::Window;

/// Names bound by idem itself; `--var` may not shadow them.
pub const BUILTIN: [&str; 3] = ["run_date", "run_start", "run_end"];

/// A `--var` given on the command line.
#[derive(Clone, Debug, PartialEq)]
pub struct Var {
    pub name: String,
    pub value: ScalarValue,
}

impl Var {
    /// Parses `name=value` or `name:type=value`.
    pub fn parse(arg: &str) -> Result<Var> {
        let bad = |message: &str| Error::BadVar {
            value: arg.to_string(),
            message: message.to_string(),
        };
        let (lhs, value) = arg
            .split_once('=')
            .ok_or_else(|| bad("expected name=value (or name:type=value)"))?;
        let (name, ty) = match lhs.split_once(':') {
            Some((n, t)) => (n, Some(t)),
            None => (lhs, None),
        };
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            return Err(bad("the name must be letters, digits and _"));
        }
        if BUILTIN.contains(&name) {
            return Err(bad("this name is bound by idem from --date"));
        }
        let value = match ty.map(str::to_ascii_lowercase).as_deref() {
            None | Some("string") | Some("str") => ScalarValue::Utf8(Some(value.to_string())),
            Some("int") | Some("bigint") => {
                ScalarValue::Int64(Some(value.parse().map_err(|_| bad("not an integer"))?))
            }
            Some("float") | Some("double") => {
                ScalarValue::Float64(Some(value.parse().map_err(|_| bad("not a number"))?))
            }
            Some("bool") | Some("boolean") => {
                ScalarValue::Boolean(Some(value.parse().map_err(|_| bad("not true or false"))?))
            }
            Some("date") => date_scalar(
                NaiveDate::parse_from_str(value, "%Y-%m-%d").map_err(|_| bad("not YYYY-MM-DD"))?,
            ),
            Some("timestamp") => timestamp_scalar(
                NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M:%S")
                    .or_else(|_| NaiveDateTime::parse_from_str(value, "%Y-%m-%d %H:%M:%S"))
                    .map_err(|_| bad("not YYYY-MM-DDTHH:MM:SS"))?,
            ),
            Some(_) => {
                return Err(bad(
                    "unknown type (use string, int, float, bool, date or timestamp)",
                ));
            }
        };
        Ok(Var {
            name: name.to_string(),
            value,
        })
    }
}

fn date_scalar(d: NaiveDate) -> ScalarValue {
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
    ScalarValue::Date32(Some((d - epoch).num_days() as i32))
}

fn timestamp_scalar(t: NaiveDateTime) -> ScalarValue {
    ScalarValue::TimestampMicrosecond(Some(t.and_utc().timestamp_micros()), Some(Arc::from("UTC")))
}

/// Every parameter of a run, by name.
pub fn values(window: &Window, vars: &[Var]) -> BTreeMap<String, ScalarValue> {
    let mut out = BTreeMap::new();
    out.insert("run_date".into(), date_scalar(window.run_date()));
    out.insert("run_start".into(), timestamp_scalar(window.start));
    out.insert("run_end".into(), timestamp_scalar(window.end));
    for v in vars {
        out.insert(v.name.clone(), v.value.clone());
    }
    out
}

/// Checks that every placeholder in `plan` has a value and returns the bindings.
pub fn bind(
    job: &Path,
    plan: &LogicalPlan,
    values: &BTreeMap<String, ScalarValue>,
) -> Result<ParamValues> {
    let used = plan.get_parameter_names().map_err(|e| Error::Sql {
        path: job.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut missing: Vec<_> = used
        .iter()
        .map(|n| n.trim_start_matches('$'))
        .filter(|n| !values.contains_key(*n))
        .collect();
    missing.sort_unstable();
    if let Some(first) = missing.first() {
        let known: Vec<String> = values.keys().map(|k| format!("${k}")).collect();
        let hint = if first.chars().all(|c| c.is_ascii_digit()) {
            "positional parameters are not supported; use named ones".to_string()
        } else {
            format!("pass it with --var {first}=VALUE")
        };
        return Err(Error::Parameter {
            path: job.to_path_buf(),
            message: format!(
                "the SQL uses ${first}, which has no value ({hint}); bound here: {}",
                known.join(", ")
            ),
        });
    }
    let map: HashMap<String, ScalarAndMetadata> = values
        .iter()
        .map(|(k, v)| (k.clone(), ScalarAndMetadata::from(v.clone())))
        .collect();
    Ok(ParamValues::Map(map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vars_are_typed() {
        assert_eq!(
            Var::parse("region=eu").unwrap().value,
            ScalarValue::Utf8(Some("eu".into()))
        );
        assert_eq!(
            Var::parse("n:int=5").unwrap().value,
            ScalarValue::Int64(Some(5))
        );
        assert!(Var::parse("n:int=five").is_err());
        assert!(Var::parse("run_date=2026-01-01").is_err());
        assert!(Var::parse("novalue").is_err());
    }
}
