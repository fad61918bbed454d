//! probe: eBPF network telemetry for distributed AI training hosts.
//!
//! Data flows one way: kernel maps -> collectors (`collect`, their `Readings`) -> `observe`
//! -> `features` -> `model` -> `fold` -> the tick's `snapshot` -> exporter (`export`), in the
//! order `pipeline` lists; modules import only those below them (tests/architecture.rs).
//! `bpf` loads and attaches; `host` answers questions about the host. Beside the daemon:
//! `record` (to Parquet), `dataset` (`probe features`: replay + labels), `top`.
//!
//! The library holds every stage; `main.rs` is the command line. The split lets the fuzz
//! targets (`fuzz/`) call the parsers the daemon uses.
//!
//! No function outside tests over 100 lines (clippy::too_many_lines, an error in CI): a
//! longer one is split where its steps are.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod analyze;
pub mod apiclient;
pub mod bpf;
pub mod check;
pub mod cli;
pub mod collect;
pub mod config;
pub mod counter;
pub mod dataset;
pub mod duration;
pub mod eval;
pub mod export;
pub mod features;
pub mod fold;
pub mod host;
pub mod lifecycle;
pub mod model;
pub mod observe;
pub mod pathpattern;
pub mod pipeline;
pub mod record;
pub mod run;
pub mod snapshot;
pub mod stats;
pub mod top;
pub mod train;
