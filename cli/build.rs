//! Links the `idem` binary as a position-dependent executable on Linux with glibc.
//!
//! The binary carries about 200,000 relative relocations (DataFusion's vtables and
//! function tables), which the dynamic loader applies at every start, copying the
//! 3.7 MB of pages they touch: 4 to 5 ms of every invocation, and tens of
//! milliseconds now and then. A position-dependent executable has them resolved at
//! link time (`idem --version`: 1.4 ms). The price is that the executable itself is
//! not loaded at a random address; its libraries, heap and stacks still are.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}
