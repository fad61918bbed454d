//! What the daemon needs to know about the host before it attaches: privileges, where the
//! cgroup v2 and tracefs mounts are, which interfaces exist.
pub mod cgroup;
pub mod cgroup_tree;
pub mod iface;
pub mod jobs;
pub mod privilege;
pub mod tracefs;
