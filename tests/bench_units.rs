//! The benchmark's own unit tests (percentiles, INFO parsing, the table's ids, ...):
//! the bench target has no test harness, so its modules are compiled here as well.

#[allow(dead_code, unused_imports)]
#[path = "../benches/lockside/main.rs"]
mod bench;
