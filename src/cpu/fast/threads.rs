//! Spreading work items over threads: each thread takes the next item from a
//! shared queue, so uneven items (causal query blocks) balance. The threads
//! are the caller and the process's worker pool (`pool.rs`), or scoped
//! threads where the pool is busy or smaller than asked. On wasm32, and with
//! one thread, everything runs on the calling thread.

use std::sync::{Mutex, PoisonError};

/// Runs `work(item, scratch)` for every item on up to `threads` threads, each
/// with its own scratch from `scratch()`. Items are taken in order.
pub(crate) fn for_each<T: Send, S>(
    items: Vec<T>,
    threads: usize,
    scratch: impl Fn() -> S + Sync,
    work: impl Fn(T, &mut S) + Sync,
) {
    let threads = if cfg!(target_arch = "wasm32") {
        1
    } else {
        threads.clamp(1, items.len().max(1))
    };
    if threads == 1 {
        let mut s = scratch();
        for item in items {
            work(item, &mut s);
        }
        return;
    }
    let queue = Mutex::new(items.into_iter());
    let next = || queue.lock().unwrap_or_else(PoisonError::into_inner).next();
    let share = || {
        let mut s = scratch();
        while let Some(item) = next() {
            work(item, &mut s);
        }
    };
    #[cfg(not(target_arch = "wasm32"))]
    if super::pool::Pool::global().run(threads - 1, &share).is_ok() {
        return;
    }
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(share);
        }
    });
}

/// `f` of every item, in order, on up to `threads` threads.
pub(crate) fn map<T: Send, R: Send>(
    items: Vec<T>,
    threads: usize,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let slots: Vec<(T, &mut Option<R>)> = items.into_iter().zip(out.iter_mut()).collect();
    for_each(
        slots,
        threads,
        || (),
        |(item, slot), _| *slot = Some(f(item)),
    );
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_once_in_order() {
        for threads in [1, 2, 5] {
            let squares = map((0..37).collect(), threads, |x: u64| x * x);
            assert_eq!(squares, (0..37).map(|x| x * x).collect::<Vec<_>>());
        }
        assert!(map(Vec::<u8>::new(), 3, |x| x).is_empty());
    }
}
