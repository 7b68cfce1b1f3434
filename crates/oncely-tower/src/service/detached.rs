//! [`Detached`]: a claimed request's execution that runs to its end even when its caller goes
//! away.

/// A future that runs its execution to completion even when it is dropped: polled in place
/// while its owner polls it, and handed to `tokio::spawn` (its output discarded: the layer has
/// already stored or released the record by then) when its owner drops it unfinished, for
/// example because hyper dropped the connection of a client that went away.
///
/// This gives the cancellation safety of running every claimed request on its own task without
/// paying for that task's hand-offs (a spawn, a wake-up of the task and one of the waiting
/// request per execution) on every request: measured as most of what the layer cost beyond its
/// statements (docs/PERFORMANCE.md).
pub(crate) struct Detached<T: Send + 'static>(
    Option<std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>>,
);

impl<T: Send + 'static> Detached<T> {
    pub(super) fn new(
        execution: std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>,
    ) -> Self {
        Self(Some(execution))
    }
}

impl<T: Send + 'static> std::future::Future for Detached<T> {
    type Output = T;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<T> {
        let Some(execution) = self.0.as_mut() else {
            panic!("Detached polled after it completed");
        };
        let out = std::task::ready!(execution.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        let Some(execution) = self.0.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = execution.await;
                });
            }
            // No runtime to finish it on (the runtime itself is shutting down): the claim
            // stays in flight and a retry takes it over when its lease lapses.
            Err(_) => tracing::warn!(
                "a claimed request was dropped unfinished outside a tokio runtime; its key stays in flight until its lease lapses"
            ),
        }
    }
}
