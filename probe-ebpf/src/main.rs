//! probe's eBPF programs. Built for `bpfel-unknown-none` by probe-user's build.rs (aya-build);
//! on the host this binary is an empty stub so that workspace-wide checks still compile.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// Inline assembly for the BPF atomic add (see maps::atomic_add); the eBPF build uses nightly.
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod select;
#[cfg(target_arch = "bpf")]
mod sockops;
#[cfg(target_arch = "bpf")]
mod tc;
#[cfg(target_arch = "bpf")]
mod tracepoints;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach this; it exists to satisfy no_std.
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}
