//! End-to-end tests of the `idem` binary, run as a user would: a directory holding the
//! sample lake and job files, the binary, and independent readers of the result.

mod answers;
mod backfill;
mod checks;
mod cluster;
mod common;
mod concurrent;
mod conformance;
mod corrupt;
mod crash;
mod delta;
mod delta_schedules;
mod deploy;
mod exit_codes;
mod fanout;
mod guard;
mod merge;
mod project;
mod readers;
mod regressions;
mod run;
mod s3;
mod schedules;
mod vanished;
mod wire;
mod workers;
