//! Small helpers for the SQL idem writes itself (checks, merges, dedupe views) and for
//! showing query results in error messages.

use arrow::record_batch::RecordBatch;

/// Runs query `q` and collects its rows.
pub async fn query(
    ctx: &datafusion::execution::context::SessionContext,
    q: String,
) -> datafusion::error::Result<Vec<RecordBatch>> {
    ctx.sql(&q).await?.collect().await
}

/// A column name as a quoted SQL identifier.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Batches as a text table, NULL written out (an empty cell would hide it).
pub fn pretty(batches: &[RecordBatch]) -> String {
    let options = arrow::util::display::FormatOptions::default().with_null("NULL");
    arrow::util::pretty::pretty_format_batches_with_options(batches, &options)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The first value of the first non-empty batch, as text ("?" when there is none).
pub fn first_value(batches: &[RecordBatch]) -> String {
    batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .and_then(|b| arrow::util::display::array_value_to_string(b.column(0), 0).ok())
        .unwrap_or_else(|| "?".into())
}
