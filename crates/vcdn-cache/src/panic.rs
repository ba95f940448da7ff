//! Panic boundaries of request handling: a panic (a bug, never an input
//! the code expects) costs one request a 500 where the answer has not begun,
//! else its connection; it is counted in `vcdn_cache_panics_total` and
//! logged as one line, and the serving thread goes on. Counts taken per
//! connection or request are released by guards in `Drop`, so unwinding
//! past them cannot leak a connection slot (issue 15: one request line that
//! panicked leaked a slot each time until `max_connections` refused
//! everyone).
//!
//! Boundaries are per request on the epoll loop, per batch of completions
//! on the io_uring front end, per connection task and per upstream fetch.
//! `catch_unwind` costs nothing until something panics.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use crate::metrics::Metrics;

thread_local! {
    /// Boundaries running on this thread: a panic inside one is caught, so
    /// the hook keeps its message for the boundary's log line instead of
    /// printing it (with a backtrace when RUST_BACKTRACE is set).
    static INSIDE: Cell<u32> = const { Cell::new(0) };
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// A panic that a boundary caught: its message and where it happened.
#[derive(Debug)]
pub struct Caught {
    pub what: String,
}

/// Install the process's panic hook (once): a panic inside a boundary is
/// reported by the boundary; any other goes to the previous hook.
pub fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if INSIDE.with(Cell::get) == 0 {
                return previous(info);
            }
            let what = match info.location() {
                Some(l) => format!("{} at {l}", message(info.payload())),
                None => message(info.payload()),
            };
            LAST.with(|l| *l.borrow_mut() = Some(what));
        }));
    });
}

fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// Run `f`, catching a panic.
pub fn catch<R>(f: impl FnOnce() -> R) -> Result<R, Caught> {
    INSIDE.with(|d| d.set(d.get() + 1));
    let r = catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|d| d.set(d.get() - 1));
    r.map_err(|payload| Caught {
        what: LAST
            .with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| message(&*payload)),
    })
}

/// Count and log a caught panic: one line, no backtrace.
pub fn report(metrics: &Metrics, c: &Caught, during: &str, peer: Option<std::net::SocketAddr>) {
    metrics.panics.fetch_add(1, Ordering::Relaxed);
    match peer {
        Some(peer) => tracing::error!(panic = %c.what, %peer, "bug: panic {during}"),
        None => tracing::error!(panic = %c.what, "bug: panic {during}"),
    }
}

/// A future whose polls are boundaries: it ends with `Err` if one panics
/// (the inner future is then dropped with everything it holds).
pub struct Boundary<F> {
    inner: Option<F>,
}

pub fn boundary<F: Future>(f: F) -> Boundary<F> {
    Boundary { inner: Some(f) }
}

impl<F: Future> Future for Boundary<F> {
    type Output = Result<F::Output, Caught>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `inner` is structurally pinned: it is never moved out,
        // only dropped in place (set to None).
        let this = unsafe { self.get_unchecked_mut() };
        let Some(f) = this.inner.as_mut() else {
            return Poll::Pending;
        };
        // SAFETY: as above.
        let f = unsafe { Pin::new_unchecked(f) };
        match catch(|| f.poll(cx)) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(c) => {
                // Drop what the panicking future held (guards release their
                // counts here), also inside the boundary.
                let _ = catch(|| this.inner = None);
                Poll::Ready(Err(c))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Guard<'a>(&'a Cell<u32>);
    impl Drop for Guard<'_> {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }

    #[test]
    fn a_caught_panic_says_what_and_where_and_drops_what_it_held() {
        install_hook();
        let dropped = Cell::new(0);
        let r = catch(|| {
            let _g = Guard(&dropped);
            panic!("boom {}", 42);
        });
        let c = r.unwrap_err();
        assert!(c.what.starts_with("boom 42 at "), "{}", c.what);
        assert!(c.what.contains("panic.rs"), "{}", c.what);
        assert_eq!(dropped.get(), 1);

        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let r = rt.block_on(boundary(async {
            let _g = Guard(&dropped);
            tokio::task::yield_now().await;
            panic!("later");
        }));
        assert!(r.unwrap_err().what.starts_with("later at "));
        assert_eq!(dropped.get(), 2);
        assert_eq!(rt.block_on(boundary(async { 7 })).unwrap(), 7);
    }
}
