//! Generated bad input files, not hand-picked ones: a real raw file of the sample lake
//! truncated at every interesting length, its magic and footer length broken, bytes
//! flipped at random offsets of its footer, its first pages and anywhere, a stretch
//! overwritten, a CSV file under a Parquet name and the reverse. Whatever the damage,
//! a run never crashes and never exits 1 (a retry cannot help); when it fails it names
//! the file and leaves the table as it was. (The Parquet decoder panics on some
//! damages; idem catches it, and its message may show on stderr above idem's error.) (A flip the format cannot notice, in a
//! plain-encoded value without a page checksum, may run through: that is the file's
//! content.)
//!
//! `IDEM_CORRUPT_CASES` sets how many random damages are tried (CI: 40) and
//! `IDEM_CORRUPT_SEED` where they start.

use crate::common::*;

const FCT: &str = "testdata/jobs/fct_orders.toml";
const DAY: &str = "2026-06-02";

/// splitmix64: a seeded sequence for the damages, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: a number")))
        .unwrap_or(default)
}

/// The damaged versions of the Parquet file `good`, each with what was done to it.
fn damages(good: &[u8], rng: &mut Rng, random: u64) -> Vec<(String, Vec<u8>)> {
    let len = good.len();
    let footer_len = u32::from_le_bytes(good[len - 8..len - 4].try_into().unwrap()) as usize;
    let footer_start = len - 8 - footer_len;
    let mut out = Vec::new();
    for cut in [
        0,
        3,
        4,
        7,
        8,
        len / 3,
        footer_start,
        len - 8,
        len - 5,
        len - 1,
    ] {
        out.push((format!("truncated to {cut} bytes"), good[..cut].to_vec()));
    }
    let mut head = good.to_vec();
    head[..4].copy_from_slice(b"PAR0");
    out.push(("first magic PAR0".into(), head));
    let mut tail = good.to_vec();
    tail[len - 4..].copy_from_slice(b"PAR0");
    out.push(("last magic PAR0".into(), tail));
    for (what, n) in [
        ("zero", 0u32),
        ("one", 1),
        ("huge", u32::MAX),
        ("too long", len as u32),
    ] {
        let mut b = good.to_vec();
        b[len - 8..len - 4].copy_from_slice(&n.to_le_bytes());
        out.push((format!("footer length {what}"), b));
    }
    out.push((
        "a CSV file under a Parquet name".into(),
        b"order_id,customer_id\n1,2\n".to_vec(),
    ));
    for i in 0..random {
        let mut b = good.to_vec();
        let (region, from, to) = match i % 4 {
            0 => ("footer", footer_start, len - 8),
            1 => ("first pages", 4, (len / 5).max(5)),
            2 => ("anywhere", 0, len),
            _ => ("overwritten", 4, len - 8 - 256),
        };
        let what = if region == "overwritten" {
            let at = from + rng.below(to - from);
            b[at..at + 256].fill(0xA5);
            format!("256 bytes at {at} overwritten")
        } else {
            let flips = 1 + rng.below(16);
            let mut at = Vec::with_capacity(flips);
            for _ in 0..flips {
                let o = from + rng.below(to - from);
                b[o] ^= 1 + rng.below(255) as u8;
                at.push(o);
            }
            format!("{flips} bytes flipped in the {region} at {at:?}")
        };
        out.push((what, b));
    }
    out
}

/// What went wrong with one damage, if anything: `out` is the run over it, `table` the
/// table before it.
fn judge(
    out: &std::process::Output,
    table: &std::path::Path,
    before: &std::collections::BTreeMap<String, (u64, u64, i64, i64, u64)>,
    file: &str,
    what: &str,
) -> Option<String> {
    let err = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    let problem = match code {
        Some(0) => None,
        Some(2 | 5) if !err.contains(file) => Some("the error does not name the file"),
        Some(2 | 5) if &snapshot(table) != before => Some("the table changed"),
        Some(2 | 5) => None,
        Some(1) => Some("exit 1 (retryable) on a file that will not change"),
        _ => Some("an exit outside the contract (a panic or a signal)"),
    };
    problem.map(|p| format!("{what}: {p} (exit {code:?}): {}", err.trim()))
}

#[test]
fn generated_damage_to_a_parquet_source_fails_cleanly_and_names_the_file() {
    let lake = Lake::new();
    let table = "lake/analytics/fct_orders";
    let path = lake.join(&format!(
        "testdata/lake/raw/orders/created_date={DAY}/part-0.parquet"
    ));
    let file = format!("created_date={DAY}/part-0.parquet");
    let good = std::fs::read(&path).unwrap();
    lake.idem_ok(&["run", FCT, "--date", DAY]);
    let seed = env_or("IDEM_CORRUPT_SEED", 1);
    let mut rng = Rng(seed);
    let cases = damages(&good, &mut rng, env_or("IDEM_CORRUPT_CASES", 40));
    let tried = cases.len();
    let mut wrong = Vec::new();
    for (what, bytes) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let before = snapshot(&lake.join(table));
        let out = lake.idem(&["run", FCT, "--date", DAY, "--json"]);
        wrong.extend(judge(&out, &lake.join(table), &before, &file, &what));
    }
    std::fs::write(&path, &good).unwrap();
    assert!(
        wrong.is_empty(),
        "{} of {tried} damages (IDEM_CORRUPT_SEED={seed}) went wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A Parquet file under a CSV name in a CSV source: refused, the file named.
#[test]
fn a_parquet_file_under_a_csv_name_is_refused_by_name() {
    let lake = Lake::new();
    let dir = lake.join("csv");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.csv"), "id,v\n1,x\n2,y\n").unwrap();
    let parquet = only_file(&lake.join(&format!("testdata/lake/raw/orders/created_date={DAY}")));
    std::fs::copy(parquet, dir.join("b.csv")).unwrap();
    let job = lake.job(
        "csv",
        r#"
name = "csv"
[sources.rows]
path = "csv/"
format = "csv"
[transform]
sql = "select id, v from rows"
[target]
path = "out/csv"
partition_by = []
"#,
    );
    let out = lake.idem(&["run", &job, "--date", DAY]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("b.csv"), "{err}");
    assert!(!lake.join("out/csv").exists());
}

/// Damages to an object of a source on an object store (moto), a few by hand (a
/// stretch overwritten, truncated, the magic or the footer broken, zero bytes) and the
/// generated ones (`IDEM_CORRUPT_S3_CASES` random, CI: 4): named by its URL, never
/// exit 1, the table as it was.
#[test]
fn a_damaged_object_of_a_source_on_s3_is_named() {
    let lake = Lake::new();
    let bucket = crate::s3::bucket("bad");
    let url = format!("s3://{bucket}/raw/orders/");
    idem_testdata::servers::create_bucket(s3_endpoint(), &format!("s3://{bucket}/"));
    let raw = lake.join("testdata/lake/raw/orders");
    let file = format!("created_date={DAY}/part-0.parquet");
    let good = std::fs::read(raw.join(&file)).unwrap();
    let job = lake.job(
        "remote",
        &std::fs::read_to_string(lake.join(FCT))
            .unwrap()
            .replace("testdata/lake/raw/orders/", &url)
            .replace("lake/analytics/fct_orders/", "out/remote/"),
    );
    let put = |bytes: &[u8]| {
        std::fs::write(raw.join(&file), bytes).unwrap();
        readers(&["put", s3_endpoint(), raw.to_str().unwrap(), &url]);
    };
    put(&good);
    let ok = crate::s3::idem_s3(&lake, &["run", &job, "--date", DAY], &[]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let before = snapshot(&lake.join("out/remote"));
    let fifth = good.len() / 5;
    let mut overwritten = good.clone();
    overwritten[fifth..fifth + 256].fill(0xA5);
    let mut bad_magic = good.clone();
    let n = bad_magic.len();
    bad_magic[n - 4..].copy_from_slice(b"PAR2");
    let mut footer = good.clone();
    let footer_len = u32::from_le_bytes(good[n - 8..n - 4].try_into().unwrap()) as usize;
    footer[n - 8 - footer_len / 2..n - 8].fill(0xA5);
    for (what, bytes) in [
        ("256 bytes overwritten at a fifth", overwritten),
        ("truncated to half", good[..good.len() / 2].to_vec()),
        ("its closing magic broken", bad_magic),
        ("its footer overwritten", footer),
        ("zero bytes", Vec::new()),
    ] {
        put(&bytes);
        let out = crate::s3::idem_s3(&lake, &["run", &job, "--date", DAY], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(2 | 5)),
            "{what}: exit {:?}: {err}",
            out.status.code()
        );
        assert!(
            err.contains(&format!("{url}{file}")),
            "{what}: not named: {err}"
        );
        assert_eq!(snapshot(&lake.join("out/remote")), before, "{what}");
    }
    // The generated damages, as on disk.
    let seed = env_or("IDEM_CORRUPT_SEED", 1);
    let cases = damages(&good, &mut Rng(seed), env_or("IDEM_CORRUPT_S3_CASES", 4));
    let tried = cases.len();
    let mut wrong = Vec::new();
    for (what, bytes) in cases {
        put(&bytes);
        // (A damage the format cannot notice runs through: the table before is the
        // last run's.)
        let before = snapshot(&lake.join("out/remote"));
        let out = crate::s3::idem_s3(&lake, &["run", &job, "--date", DAY], &[]);
        let named = format!("{url}{file}");
        wrong.extend(judge(
            &out,
            &lake.join("out/remote"),
            &before,
            &named,
            &what,
        ));
    }
    put(&good);
    assert!(
        wrong.is_empty(),
        "{} of {tried} damages on S3 (IDEM_CORRUPT_SEED={seed}) went wrong:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
