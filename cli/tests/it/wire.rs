//! Faults on the wire. The fault layer fails calls inside idem; a real store fails on
//! the network. Here `idem` reaches moto through a faulty network
//! (`testdata/py/wire_proxy.py`): connections reset before a request or after it took
//! effect, answers truncated mid-body, bursts of 503 SlowDown, stalls, requests that
//! reach the store twice. With object_store's retries as idem ships them, every run
//! either publishes or exits 1, every partition stays old or new meanwhile, and the
//! next run over a clean network ends in the clean state. A store that stays down ends
//! in exit 1 naming it, with nothing changed.
//!
//! `IDEM_WIRE_RUNS` (default 6) runs through the network, from `IDEM_WIRE_SEED`
//! (default 1), with a fault at one request in `IDEM_WIRE_RATE` (default 12).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::common::*;
use crate::conformance::{Backend, Table};

fn var(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| {
        v.parse().unwrap_or_else(|_| panic!("{name}={v}: a number"))
    })
}

/// What the proxy counted: requests and faults of each kind.
fn counts(stats: &std::path::Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(stats).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
        .collect()
}

#[test]
fn a_faulty_network_keeps_every_partition_old_or_new_and_the_next_run_converges() {
    let (runs, seed, rate) = (
        var("IDEM_WIRE_RUNS", 6),
        var("IDEM_WIRE_SEED", 1),
        var("IDEM_WIRE_RATE", 12).max(1),
    );
    let t = Table::new(Backend::S3, "wire");
    let a = t.reference();
    t.switch_to_b(None);
    let b = t.reference();
    t.switch_to_a();
    t.run_ok(&t.job);
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let proxy =
        idem_testdata::servers::wire_proxy(s3_endpoint(), seed, 1.0 / rate as f64, false, &stats);
    let (mut published, mut failed) = (0, 0);
    for i in 0..runs {
        let (old, new) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        if i % 2 == 0 {
            t.switch_to_b(None);
        } else {
            t.switch_to_a();
        }
        let context = format!("run {i} through the faulty network (IDEM_WIRE_SEED={seed})");
        let out = t.idem(
            &["run", &t.job, "--date", "2026-06", "--json"],
            &[("AWS_ENDPOINT_URL", &proxy)],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => {
                published += 1;
                assert_eq!(&t.committed_digests(), new, "{context}");
            }
            Some(1) => {
                failed += 1;
                assert!(err.contains(&t.bucket), "{context}: not named: {err}");
                for (p, d) in t.committed_digests() {
                    assert!(
                        old.get(&p) == Some(&d) || new.get(&p) == Some(&d),
                        "{context}: {p} is neither old nor new; {err}"
                    );
                }
            }
            code => panic!("{context}: exit {code:?}, not 0 or 1 (retryable): {err}"),
        }
        // Over a clean network: gc settles what a failed run left, the next run
        // publishes the rest.
        t.ok(&["gc", &t.target("crashy")]);
        t.run_ok(&t.job);
        t.assert_clean(new, &context);
    }
    let n = counts(&stats);
    let faults: u64 = n
        .iter()
        .filter(|(k, _)| *k != "requests")
        .map(|(_, v)| v)
        .sum();
    assert!(faults > 0, "the network injected nothing: {n:?}");
    adversary_report(&format!(
        "wire | moto (S3) | {runs} runs from seed {seed}: {published} published, {failed} \
         exit 1 | {} requests, {faults} faults: {}\n",
        n["requests"],
        n.iter()
            .filter(|(k, _)| *k != "requests")
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
}

#[test]
fn a_store_that_stays_down_ends_in_exit_1_naming_it_and_changes_nothing() {
    let t = Table::new(Backend::S3, "down");
    t.run_ok(&t.job);
    let before = t.digests();
    t.switch_to_b(None);
    let dir = tempfile::tempdir().unwrap();
    let proxy =
        idem_testdata::servers::wire_proxy(s3_endpoint(), 1, 0.0, true, &dir.path().join("s"));
    let out = t.idem(
        &["run", &t.job, "--date", "2026-06"],
        &[("AWS_ENDPOINT_URL", &proxy)],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&t.bucket) && err.contains("503"),
        "the store and its answer named: {err}"
    );
    assert_eq!(t.digests(), before);
}
