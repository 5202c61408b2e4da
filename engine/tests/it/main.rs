//! The engine driven in-process, with every storage call under test control: the
//! exhaustive single-fault search over runs, merges, backfills and gc, on local disk,
//! object_store's in-memory store and an S3-compatible server (moto).

mod faults;
mod generated;
mod world;
