//! Criterion benchmark of a merge end to end (plan, key checks, statistics probe,
//! anti join, write, publish): 100,000 changes, 10% of them new keys, into a table of
//! 1,000,000 orders keyed by `order_id`. Each sample first resets the table with a
//! replace run (not timed). Run with `cargo bench -p idem-benches --bench merge`.

use std::path::Path;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use idem_engine::job::Job;
use idem_engine::run::{Quiet, RunOptions, run};

const ROWS: u64 = 1_000_000;

fn job(dir: &Path, name: &str, mode: &str, sql: &str) -> Job {
    let text = format!(
        r#"
name = "{name}"
[sources.orders]
path = "{raw}/"
[transform]
sql = "{sql}"
[target]
path = "{out}"
{mode}
"#,
        raw = dir.join("raw").display(),
        out = dir.join("out/orders").display(),
    );
    Job::parse(&dir.join(format!("{name}.toml")), &text).unwrap()
}

fn merge(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let spec = idem_testdata::OrdersSpec {
        days: 1,
        rows_per_day: ROWS,
        customers: 1_000_000,
        ..Default::default()
    };
    idem_testdata::write_orders(&dir.path().join("raw"), &spec).unwrap();
    let base = job(
        dir.path(),
        "base",
        "",
        "select order_id, customer_id, amount_usd, status from orders order by order_id",
    );
    // Every tenth order changes; a tenth of those get a new key.
    let changes = job(
        dir.path(),
        "changes",
        "mode = \"merge\"\nkey = [\"order_id\"]",
        "select order_id + case when order_id % 100 = 0 then 100000000 else 0 end as order_id, \
         customer_id, cast(amount_usd * 2 as decimal(12, 2)) as amount_usd, status from orders where order_id % 10 = 0",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = RunOptions {
        date: "2026-06-01".into(),
        vars: Vec::new(),
        skip_fresh: false,
        cluster: None,
        ..Default::default()
    };
    let go = |j: &Job| rt.block_on(run(j, &opts, Arc::new(Quiet))).unwrap();

    let mut group = c.benchmark_group("merge");
    group.throughput(Throughput::Elements(ROWS + ROWS / 10));
    group.sample_size(10);
    group.bench_function("orders_1m_100k_changes_10pct_new", |b| {
        b.iter_batched(|| go(&base), |_| go(&changes), BatchSize::PerIteration)
    });
    group.finish();
}

criterion_group!(benches, merge);
criterion_main!(benches);
