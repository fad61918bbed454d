//! Forwards the eBPF programs' aya-log messages (rare conditions such as a full map) into
//! probe's log. Off unless `--bpf-log` is given: reading them costs a wakeup per message.
use anyhow::{Context as _, Result};
use aya::Ebpf;
use tokio::io::unix::AsyncFd;

pub fn spawn(ebpf: &mut Ebpf) -> Result<()> {
    let logger = aya_log::EbpfLogger::init(ebpf).context("starting the eBPF log reader")?;
    // SAFETY: the logger owns the ring buffer's fd and never swaps it; AsyncFd owns the
    // logger, so the fd stays open and the same for the AsyncFd's whole life.
    let mut fd = unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching the eBPF log ring buffer: {e}"))?;
    tokio::spawn(async move {
        loop {
            let Ok(mut guard) = fd.readable_mut().await else {
                break;
            };
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    });
    Ok(())
}
