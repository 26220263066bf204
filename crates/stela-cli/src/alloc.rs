//! How the `stela` and `stela-bench` binaries tune their allocator (mimalloc, each binary's
//! `#[global_allocator]`): one place, so the benchmarks run the product's setting.

/// mimalloc's `mi_option_purge_delay`, by its number in mimalloc's header: libmimalloc-sys
/// names no constant for it, and mimalloc keeps the numbers of retired options so that the
/// others never move. A test checks it by its default.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Has mimalloc keep the memory this process frees for its own reuse instead of handing it
/// back to the OS a second later ("purging"). The store's services free and allocate again
/// tens of MiB every round (the log records they release, the page images they replay onto,
/// the tables they build); purged, each reuse faults the memory back in and the kernel zeroes
/// it, a 2 MiB huge page at a time, on the thread that touches it first, often a
/// transaction's. `stela-bench tpcb` at `buffered` with 2 clients and checkpoints every
/// millisecond, purging against not, taking turns: 3-10 % more transactions a second without
/// it (`bench/results/tpcb.txt`). The cost: the process stays at its peak footprint.
///
/// Called first thing in `main`; it only has an effect in a binary whose global allocator is
/// mimalloc.
pub fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's options, a plain store of an integer that mimalloc reads
    // when it next decides whether to purge; valid from any thread at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// For the log daemon (`stela serve`): its memory follows what untrusted clients make it hold
/// (answers they do not read, frames they do not finish), so what it frees once they are gone
/// must go back to the system rather than stay at the attack's peak. Puts mimalloc's purge
/// delay back to its default (1 s: memory still free a second after it was freed is purged;
/// memory reused before then, the daemon's steady state, is not), undoing
/// [`keep_freed_memory`] for this process. With it, [`release_freed_memory`] can purge at once.
pub fn give_freed_memory_back() {
    // SAFETY: as in `keep_freed_memory`.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1000) };
}

/// Purges now, in every arena of the process, the memory mimalloc holds free (the daemon
/// calls it, on a worker thread, after closed connections freed enough: `DaemonConfig::
/// release_memory`). Only memory freed while purging was allowed ([`give_freed_memory_back`])
/// is purged.
pub fn release_freed_memory() {
    // SAFETY: mi_collect takes no pointer; it collects the calling thread's heap and, forced,
    // purges the free slices of all arenas under mimalloc's own synchronisation.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_option_set_is_mimallocs_purge_delay() {
        // Its default, 1000 ms in mimalloc 3, is no other option's (nothing in the tests calls
        // `keep_freed_memory`).
        // SAFETY: reads one of mimalloc's options.
        let value = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(value, 1000, "option 15 is not mimalloc's purge delay");
    }
}
