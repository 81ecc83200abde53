//! Admission of creates: at most `max_concurrent` run at once, up to `max_queued` more wait
//! their turn in arrival order, and any beyond those are refused at once with
//! [`EngineError::TooManyCreates`] (E2B's 429). A create therefore never times out into a
//! half-made sandbox: it either waits fairly, runs to its end, or is refused before anything
//! starts. Leaf module.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::EngineError;

/// The admission limits (`--max-concurrent-creates`, `--max-queued-creates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Creates doing work at once (claims, cold starts, restores).
    pub max_concurrent: usize,
    /// Creates waiting for a turn; one more is refused.
    pub max_queued: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        Self {
            max_concurrent: 16,
            max_queued: 1024,
        }
    }
}

pub(crate) struct Admission {
    limits: AdmissionLimits,
    running: Arc<Semaphore>,
    /// Admitted creates, waiting or running.
    admitted: Arc<AtomicUsize>,
}

/// An admitted create's place: holds its slot in the queue until dropped.
pub(crate) struct Ticket {
    admitted: Arc<AtomicUsize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running create's turn (and its ticket).
pub(crate) struct Turn {
    _permit: OwnedSemaphorePermit,
    _ticket: Ticket,
}

impl Admission {
    pub(crate) fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            running: Arc::new(Semaphore::new(limits.max_concurrent.max(1))),
            admitted: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Take a place, or be refused now when every running and queued place is taken.
    pub(crate) fn enter(&self) -> Result<Ticket, EngineError> {
        let cap = self.limits.max_concurrent.max(1) + self.limits.max_queued;
        self.admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < cap).then_some(n + 1)
            })
            .map_err(|_| EngineError::TooManyCreates { limit: cap })?;
        Ok(Ticket {
            admitted: self.admitted.clone(),
        })
    }

    /// Wait for a turn (first come, first served: tokio's semaphore is fair).
    pub(crate) async fn turn(&self, ticket: Ticket) -> Turn {
        let permit = self
            .running
            .clone()
            .acquire_owned()
            .await
            .expect("the admission semaphore is never closed");
        Turn {
            _permit: permit,
            _ticket: ticket,
        }
    }

    /// Creates admitted and not finished (waiting or running).
    pub(crate) fn in_flight(&self) -> usize {
        self.admitted.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn beyond_running_and_queued_places_creates_are_refused_at_once() {
        let a = Admission::new(AdmissionLimits {
            max_concurrent: 2,
            max_queued: 1,
        });
        let t1 = a.turn(a.enter().unwrap()).await;
        let _t2 = a.turn(a.enter().unwrap()).await;
        let queued = a.enter().unwrap();
        assert_eq!(a.in_flight(), 3);
        match a.enter() {
            Err(EngineError::TooManyCreates { limit: 3 }) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a fourth create was admitted"),
        }
        // The queued one gets its turn when a running one ends, and a place frees up.
        let waiting = tokio::spawn({
            let sem = a.running.clone();
            async move { sem.acquire_owned().await.unwrap() }
        });
        drop(t1);
        let _p = waiting.await.unwrap();
        drop(queued);
        assert_eq!(a.in_flight(), 1);
        assert!(a.enter().is_ok());
    }
}
