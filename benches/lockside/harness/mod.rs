//! The harness: what the phases share, and nothing of any phase. A phase is a file
//! directly under `benches/lockside/`; it may import the harness, never another phase,
//! and the harness imports no phase (`tests/architecture.rs` checks both).
//!
//! - `args.rs`: the flags (`BenchArgs`) and the phases by name (`Phase`);
//! - `context.rs`: the run's namespaces, the main sidecar's [`context::Ctx`], constants
//!   several phases use, error context, the cleanup at the end;
//! - `process.rs`: spawning and stopping sidecars, their CPU and memory from /proc;
//!   `floor.rs`: the floor server (the stack without Lockside) the cost phase measures;
//! - `servers.rs`: plain connections to the Redis data servers; `redis_side.rs`: what
//!   the bench reads from them (process CPU, commandstats, memory);
//!   `notices.rs`: release notices as Redis delivers them; `watchdog.rs`: locks held
//!   and renewed the classic way;
//! - `session.rs`: one `Lease` stream as a client drives it; `load.rs`: sampling loops,
//!   joined tasks, uncontended cycles;
//! - `report.rs`: statistics, the table with its targets, the JSON; `svg.rs`: the
//!   fleet's curves.

pub(crate) mod args;
pub(crate) mod context;
pub(crate) mod floor;
pub(crate) mod load;
pub(crate) mod notices;
pub(crate) mod process;
pub(crate) mod redis_side;
pub(crate) mod report;
pub(crate) mod servers;
pub(crate) mod session;
pub(crate) mod svg;
pub(crate) mod watchdog;
