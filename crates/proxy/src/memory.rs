//! The proxy's memory given back: buffers past [`LARGE`] are not kept once empty, large
//! allocations take pages of their own, and a worker that freed much trims its allocator.

/// Buffers larger than this are given back once empty, rather than kept for the next burst.
pub const LARGE: usize = 1 << 20;

thread_local! {
    /// Set when this worker freed a large amount of memory (a client that held many replies
    /// went, a connection's buffer shrank after a burst).
    static FREED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Asks the worker to hand memory it freed back to the system at its next pass.
pub fn freed_memory() {
    FREED.with(|f| f.set(true));
}

/// Twice a second, after large frees, hands the allocator's free pages back to the system:
/// glibc's allocator keeps freed memory in its per-thread arenas otherwise, and a proxy that
/// once buffered a gigabyte for clients that never read would keep it for good.
pub async fn give_back_memory() {
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        if FREED.with(|f| f.replace(false)) {
            release_free_pages();
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn release_free_pages() {
    // SAFETY: malloc_trim only walks the allocator's own free lists; it takes no pointers.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn release_free_pages() {}

/// Allocations of this size or more are given their own pages (`mmap`), handed back to the
/// system the moment they are freed.
const OWN_PAGES: usize = 256 << 10;

/// Makes every large allocation (replies of large values, buffers a burst grew) take pages of
/// its own, returned to the system when freed. glibc's default raises that threshold to the
/// size of the largest block freed so far (up to 32 MiB), after which 1 MB replies come from
/// its arenas and stay resident once freed until the next trim: measured, eight clients cut
/// off in turn then left 200-260 MB resident where 70 MB were ever held at once.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn large_allocations_own_pages() {
    // SAFETY: mallopt only sets a tunable of the allocator; it takes no pointers.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_PAGES as libc::c_int);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn large_allocations_own_pages() {}
