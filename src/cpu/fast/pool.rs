//! A process-wide pool of worker threads, started once, that runs one
//! borrowed job at a time on the caller and up to `helpers` workers.
//!
//! Starting threads for every call cost a decoder step on the CPU engine half
//! its time (three products a step, two threads each: `clone3`, stacks, task
//! switches). The pool's workers wait on a condition variable between jobs.
//! A job borrows the caller's closure; the caller does not return (or
//! unwind) before every worker that took the job has finished it, which is
//! what makes handing the workers a borrowed closure sound. When the pool is
//! busy (a concurrent call, or a job that calls back into it) the caller is
//! told so and runs its job on scoped threads instead.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// A job as the workers see it: the caller's closure with its lifetime
/// erased (see [`Pool::run`] for why that holds).
#[derive(Clone, Copy)]
struct Job(&'static (dyn Fn() + Sync));

#[derive(Default)]
struct State {
    /// The job of the current generation, while it runs.
    job: Option<Job>,
    /// Bumped for every job: a worker runs each generation at most once.
    generation: u64,
    /// Places left for workers on the current job.
    tickets: usize,
    /// Workers that took the current job and have not finished it.
    running: usize,
    /// Whether a worker's share of the current job panicked.
    panicked: bool,
}

/// The pool: its state, the signal for a new job, the signal for a job done.
pub(crate) struct Pool {
    state: Mutex<State>,
    posted: Condvar,
    finished: Condvar,
    /// Held by the one caller whose job the pool runs.
    caller: Mutex<()>,
    workers: AtomicUsize,
}

impl Pool {
    /// The pool of this process, with a worker per available core but one (the
    /// caller is the other), started at its first use.
    pub(crate) fn global() -> &'static Pool {
        static POOL: OnceLock<&'static Pool> = OnceLock::new();
        POOL.get_or_init(|| {
            let planned = super::default_threads().saturating_sub(1);
            let pool: &'static Pool = Box::leak(Box::new(Pool {
                state: Mutex::new(State::default()),
                posted: Condvar::new(),
                finished: Condvar::new(),
                caller: Mutex::new(()),
                workers: AtomicUsize::new(0),
            }));
            // Where the system refuses a thread, the pool has the ones it got.
            for i in 0..planned {
                let spawned = std::thread::Builder::new()
                    .name(format!("webattn-cpu-{i}"))
                    .spawn(move || pool.work());
                if spawned.is_err() {
                    break;
                }
                pool.workers.fetch_add(1, Ordering::Relaxed);
            }
            pool
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker's life: wait for a generation it has not seen, take a ticket
    /// if one is left, run the job, report.
    fn work(&self) {
        let mut seen = 0;
        let mut state = self.lock();
        loop {
            while state.generation == seen || state.tickets == 0 {
                state = self
                    .posted
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            seen = state.generation;
            let Some(job) = state.job else {
                continue;
            };
            state.tickets -= 1;
            state.running += 1;
            drop(state);
            let outcome = catch_unwind(AssertUnwindSafe(job.0));
            state = self.lock();
            state.panicked |= outcome.is_err();
            state.running -= 1;
            if state.running == 0 && state.tickets == 0 {
                self.finished.notify_all();
            }
        }
    }

    /// Runs `job` on the calling thread and on up to `helpers` workers at
    /// once, returning when all have finished it (a panic in any is resumed
    /// here). `Err(())` without running anything where the pool cannot take
    /// it now: busy, or fewer workers than `helpers`.
    pub(crate) fn run(&self, helpers: usize, job: &(dyn Fn() + Sync)) -> Result<(), ()> {
        if helpers > self.workers.load(Ordering::Relaxed) {
            return Err(());
        }
        let Ok(_caller) = self.caller.try_lock() else {
            return Err(());
        };
        // SAFETY: the erased borrow is used by workers only between the
        // posting below and `running == 0 && tickets == 0`, and this function
        // does not return or unwind before then (the caller's own share runs
        // under catch_unwind), so `job` outlives every use.
        let erased: &'static (dyn Fn() + Sync) = unsafe { std::mem::transmute(job) };
        {
            let mut state = self.lock();
            state.job = Some(Job(erased));
            state.generation += 1;
            state.tickets = helpers;
            state.running = 0;
            state.panicked = false;
        }
        self.posted.notify_all();
        let own = catch_unwind(AssertUnwindSafe(job));
        let mut state = self.lock();
        // Tickets not taken yet are withdrawn: those workers never start.
        state.tickets = 0;
        while state.running > 0 {
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.job = None;
        let helper_panicked = state.panicked;
        drop(state);
        if let Err(payload) = own {
            resume_unwind(payload);
        }
        if helper_panicked {
            panic!("a webattn CPU worker panicked");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_on_the_caller_and_the_helpers_and_borrow_the_caller_s_data() {
        let pool = Pool::global();
        let workers = pool.workers.load(Ordering::Relaxed);
        let helpers = workers.min(3);
        for _ in 0..200 {
            let ran = AtomicUsize::new(0);
            let data = [1usize; 10];
            let job = || {
                ran.fetch_add(data.iter().sum::<usize>() / 10, Ordering::Relaxed);
            };
            // Other tests of this binary use the process's pool at the same
            // time: a busy pool refuses without running, so wait for it.
            while pool.run(helpers, &job).is_err() {
                std::thread::yield_now();
            }
            // The caller always runs its share; helpers only where a ticket was
            // taken before the caller finished.
            let n = ran.load(Ordering::Relaxed);
            assert!((1..=helpers + 1).contains(&n), "{n}");
        }
        assert!(pool.run(workers + 1, &|| {}).is_err());
    }
}
