//! idem-io through its public interface: generated inputs (partition values and
//! column names, every column type the digest supports) and the commit backends'
//! conformance suite.

mod backends;
mod generated;
