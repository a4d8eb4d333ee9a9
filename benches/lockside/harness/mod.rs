//! The harness: what the phases share, and nothing of any phase. A phase is a file
//! directly under `benches/lockside/`; it may import the harness, never another phase,
//! and the harness imports no phase (`tests/layout_architecture.rs` checks both).
//!
//! - `args.rs`: the flags (`BenchArgs`) and the phases by name (`Phase`);
//! - `context.rs`: the run's namespaces, the main sidecar's `Ctx`, constants several
//!   phases use, error context, the cleanup at the end;
//! - `process.rs`: spawning and stopping sidecars, their CPU and memory from /proc;
//!   `floor.rs`: the floor server (the stack without Lockside) and its CPU per cycle;
//! - `servers.rs`: plain connections to the Redis data servers; `redis_side.rs`: what
//!   the bench reads from them (process CPU, commandstats, memory, one `Sample` of
//!   the counters); `meter.rs`: Redis' and a sidecar's CPU and commands around a run,
//!   per cycle; `notices.rs`: release notices as Redis delivers them;
//!   `classic.rs`: the classic recipe (`SET NX PX`, compare-and-delete, the watchdog's
//!   renewals), the yardstick of the cost and scale phases;
//! - `session.rs`: one `Lease` stream as a client drives it;
//! - `load.rs`: joined tasks, sampling loops, uncontended cycles, a process's CPU per
//!   cycle; `contention.rs`: sessions taking turns on one key and what a grant cost
//!   Redis; `locks.rs`: many locks taken, then held while measuring;
//! - `rows.rs`: a line of the main table as a typed value (`Row`: JSON id, label,
//!   target); each phase declares its own, main.rs orders the phases' lists;
//!   `report.rs`: statistics, the tables, the notes, the JSON; `svg.rs`: the fleet's
//!   curves.

pub(crate) mod args;
pub(crate) mod classic;
pub(crate) mod contention;
pub(crate) mod context;
pub(crate) mod floor;
pub(crate) mod load;
pub(crate) mod locks;
pub(crate) mod meter;
pub(crate) mod notices;
pub(crate) mod process;
pub(crate) mod redis_side;
pub(crate) mod report;
pub(crate) mod rows;
pub(crate) mod servers;
pub(crate) mod session;
pub(crate) mod svg;
