//! Write-audit-publish: checks run on the staged output; a failing check publishes
//! nothing, leaves the live partition's bytes as they were and removes the staging.

use crate::common::*;

const BASE: &str = r#"
name = "checked"
[sources.orders]
path = "testdata/lake/raw/orders/"
partitioned_by = ["created_date"]
[transform]
sql = """
select order_id, customer_id, amount_usd, status, cast(created_at as date) as dt
from orders where created_date = $run_date
"""
[target]
path = "out/checked"
partition_by = ["dt"]
[checks]
"#;

#[test]
fn passing_checks_publish() {
    let lake = Lake::new();
    let job = lake.job(
        "checked",
        &format!(
            "{BASE}unique = [\"order_id\"]\nnot_null = [\"order_id\", \"dt\"]\nmin_rows = 1\nmax_rows = 5000\n\
             accepted_values = {{ status = [\"placed\", \"paid\", \"shipped\", \"delivered\", \"cancelled\", \"returned\"] }}\n\
             assert = [\"select count(*) = 0 from output where amount_usd <= 0\"]\n"
        ),
    );
    let report = lake.idem_ok(&["run", &job, "--date", "2026-06-02", "--json"]);
    assert_eq!(
        actions(&report),
        vec![("dt=2026-06-02".into(), "written".into())]
    );
}

#[test]
fn a_failing_check_publishes_nothing() {
    let cases: Vec<(&str, &str, Vec<&str>)> = vec![
        (
            "unique = [\"customer_id\"]",
            "",
            vec!["check `unique: customer_id`", "dt=2026-06-02", "copies"],
        ),
        (
            "not_null = [\"customer_id\"]",
            "case when status = 'placed' then null else customer_id end as customer_id",
            vec![
                "check `not_null: customer_id`",
                "dt=2026-06-02",
                "rows have NULL",
                "placed",
            ],
        ),
        (
            "accepted_values = { status = [\"placed\", \"paid\", \"shipped\", \"delivered\", \"cancelled\"] }",
            "",
            vec!["check `accepted_values: status`", "returned"],
        ),
        (
            "min_rows = 5000",
            "",
            vec!["check `min_rows = 5000`", "dt=2026-06-02", "has 1000 rows"],
        ),
        (
            "assert = [\"select max(amount_usd) < 100 from output\"]",
            "",
            vec![
                "check `assert: select max(amount_usd) < 100 from output`",
                "false",
            ],
        ),
    ];
    for (check, replace_customer, needles) in cases {
        let lake = Lake::new();
        // A live partition from a run without checks.
        let plain = lake.job("checked", BASE);
        lake.idem_ok(&["run", &plain, "--date", "2026-06-02"]);
        let table = lake.join("out/checked");
        let before = snapshot(&table);

        // New rows (another seed) that would replace it, and a check they fail.
        let spec = idem_testdata::OrdersSpec {
            seed: 5,
            ..Default::default()
        };
        idem_testdata::write_orders_day(&lake.join("testdata/lake/raw/orders"), &spec, 1).unwrap();
        let mut text = format!("{BASE}{check}\n");
        if !replace_customer.is_empty() {
            text = text.replace("customer_id,", &format!("{replace_customer},"));
        }
        let job = lake.job("checked", &text);
        let out = lake.idem(&["run", &job, "--date", "2026-06-02"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{check}: {err}");
        for n in needles {
            assert!(err.contains(n), "{check}: `{n}` not in {err}");
        }
        assert_eq!(
            before,
            snapshot(&table),
            "{check}: the live partition changed"
        );
        let staging = lake.join("out/_idem/checked/staging");
        assert_eq!(
            std::fs::read_dir(&staging).unwrap().count(),
            0,
            "{check}: staging left"
        );
    }
}

#[test]
fn a_check_naming_a_missing_column_is_bad_input() {
    let lake = Lake::new();
    let job = lake.job("checked", &format!("{BASE}not_null = [\"order_key\"]\n"));
    let out = lake.idem(&["run", &job, "--date", "2026-06-02"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("order_key") && err.contains("not_null"),
        "{err}"
    );
    assert!(!lake.join("out/checked").exists());
}
