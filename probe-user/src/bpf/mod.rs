//! Loading the eBPF object and attaching its programs to the kernel.
pub mod load;
pub mod log;
pub mod select;
pub mod tc;

pub use load::{Hooks, Loaded};
pub use tc::TcAttacher;
