//! Unit tests of the local backend.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs that start, stage and finish while others clean up after dead runs: no
/// live run ever loses its staging directory (the cleaner holds a dead run's lock
/// until its files and lock file are gone, so a run starting under that id waits).
#[test]
fn cleaners_never_remove_a_live_runs_staging() {
    let dir = tempfile::tempdir().unwrap();
    let table = LocalTable::new(&dir.path().join("t"));
    table.prepare().unwrap();
    let stop = AtomicBool::new(false);
    let lost = std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    table.clean_dead_runs().unwrap();
                }
            });
        }
        let runners: Vec<_> = (0..2)
            .map(|t| {
                let table = &table;
                s.spawn(move || {
                    let mut lost = Vec::new();
                    for i in 0..1000 {
                        let run = format!("run-{t}-{i}");
                        let lock = table.lock_run(&run).unwrap();
                        let staged = table.meta_dir().join("staging").join(&run);
                        let made = durable::create_dir_all(&staged.join("dt=1"));
                        std::thread::yield_now();
                        if made.is_err() || !staged.join("dt=1").is_dir() {
                            lost.push(run.clone());
                        }
                        table.cleanup_run(&run).unwrap();
                        drop(lock);
                    }
                    lost
                })
            })
            .collect();
        let lost: Vec<_> = runners.into_iter().map(|r| r.join()).collect();
        stop.store(true, Ordering::Relaxed);
        lost.into_iter()
            .flat_map(|r| r.expect("a runner panicked"))
            .collect::<Vec<String>>()
    });
    assert!(lost.is_empty(), "live runs lost their staging: {lost:?}");
}

/// The publish by two renames (filesystems without `renameat2` flags) leaves the
/// live directory missing for a moment, which is what a cleaner takes for a dead
/// run's crash between those renames: it must not put a dead run's old copy there.
#[test]
fn cleaners_never_restore_into_a_fallback_swap_in_progress() {
    let dir = tempfile::tempdir().unwrap();
    let table = LocalTable::new(&dir.path().join("t"));
    table.prepare().unwrap();
    let live = table.root().join("dt=1");
    durable::create_dir_all(&live).unwrap();
    std::fs::write(live.join("v1"), "").unwrap();
    // A dead run's copy of the partition, left in its trash by a crash.
    let stale = table.meta_dir().join("trash/dead/dt=1/partition");
    durable::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("v0"), "").unwrap();
    // A live run between the two renames of `fallback_swap`, as it holds them.
    let swapping = table.lock_table("swaps.lock").unwrap();
    let old = dir.path().join("v1-copy");
    std::fs::rename(&live, &old).unwrap();
    std::thread::scope(|s| {
        let cleaner = s.spawn(|| table.clean_dead_runs().unwrap());
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(!live.exists(), "restored over a swap in progress");
        let staged = dir.path().join("v2");
        durable::create_dir_all(&staged).unwrap();
        std::fs::write(staged.join("v2"), "").unwrap();
        std::fs::rename(&staged, &live).unwrap();
        drop(swapping);
        assert_eq!(cleaner.join().unwrap(), ["dead"]);
    });
    let names: Vec<_> = std::fs::read_dir(&live)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["v2"]);
    assert!(!table.meta_dir().join("trash/dead").exists());
}
