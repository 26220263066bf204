//! Which CPUs a thread may run on: the benchmarks' one reading of this process's CPUs and one
//! way to put a thread on a set of them (`tpcb --pin-clients`, the replicated benchmark's round
//! trips across CPUs). A thread started afterwards inherits its starter's set.

use anyhow::Context;

/// The CPUs the calling thread may run on, ascending.
pub(crate) fn allowed_cpus() -> anyhow::Result<Vec<usize>> {
    let allowed = rustix::thread::sched_getaffinity(None).context("read this thread's CPUs")?;
    Ok((0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&cpu| allowed.is_set(cpu))
        .collect())
}

/// Lets the calling thread run on `cpus` only.
pub(crate) fn run_on(cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    for &cpu in cpus {
        set.set(cpu);
    }
    rustix::thread::sched_setaffinity(None, &set)
        .with_context(|| format!("move this thread to CPUs {cpus:?}"))
}
