//! Shared test helpers: an authenticating app, request builders, and store wrappers that fail,
//! hang, slow down or stop renewing (never a mock of a database: they wrap the real
//! `MemoryStore`, or script a claim outcome to test the layer's mapping alone).
#![allow(dead_code, unreachable_pub)]

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, MemoryStore, Record, RecordKey, Scope,
    StoreError, StoredResponse, UnixMillis,
};

use std::time::Duration;
use tower::ServiceExt;

/// The test's authentication: `x-account` names the scope (a real server would verify a
/// credential; what matters here is that the scope comes from the server side of the layer).
pub async fn authenticate(mut req: Request, next: Next) -> Response {
    let account = req
        .headers()
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(a) = account {
        req.extensions_mut().insert(Scope::new(a));
    }
    next.run(req).await
}

/// `routes` behind the idempotency layer, behind authentication.
pub fn app(layer: oncely_tower::IdempotencyLayer, routes: Router) -> Router {
    routes.layer(layer).layer(middleware::from_fn(authenticate))
}

/// A JSON POST from `account` with an optional key.
pub fn post_req(path: &str, account: &str, key: Option<&str>, body: &str) -> Request {
    let mut b = http::Request::post(path)
        .header("content-type", "application/json")
        .header("x-account", account);
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// A whole response.
#[derive(Debug, Clone)]
pub struct Got {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Got {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    /// The problem `code` of a problem+json answer (asserting the media type).
    pub fn code(&self) -> String {
        assert_eq!(
            self.headers["content-type"], "application/problem+json",
            "not a problem: {self:?}"
        );
        let v = self.json();
        assert_eq!(v["status"], self.status.as_u16(), "status member");
        v["code"].as_str().unwrap().to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }
}

pub async fn send(app: &Router, req: Request) -> Got {
    let res = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = res.into_parts();
    Got {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// What a [`FaultStore`] does wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing: a plain pass-through.
    None,
    /// Every call fails with `Unavailable`.
    FailAll,
    /// `claim` never answers.
    HangClaim,
    /// `claim` is recorded by the store, then its answer never arrives (a store that applied
    /// a queued write after its client stopped waiting, as Redis does under `CLIENT PAUSE`).
    RecordThenHang,
    /// `claim` answers after this delay.
    SlowClaim(Duration),
    /// `renew` fails (the owner's heartbeats never reach the store).
    NoRenew,
    /// `renew` answers after this delay (a slow store).
    SlowRenew(Duration),
    /// Of every four `renew` calls, the first three fail and the fourth goes through (a
    /// flaky network between the server and its store).
    FlakyRenew,
    /// `complete` fails with `Unavailable` (the store went down after the claim).
    FailComplete,
}

#[derive(Debug)]
struct Down;
impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store down (test fault)")
    }
}
impl std::error::Error for Down {}

/// A real `MemoryStore` behind an injected fault.
pub struct FaultStore {
    pub inner: MemoryStore,
    pub fault: Fault,
    /// How many times `renew` was called.
    pub renews: std::sync::atomic::AtomicUsize,
}

impl FaultStore {
    pub fn new(inner: MemoryStore, fault: Fault) -> Self {
        Self {
            inner,
            fault,
            renews: Default::default(),
        }
    }
    fn check(&self) -> Result<(), StoreError> {
        if self.fault == Fault::FailAll {
            Err(StoreError::unavailable(Down))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl oncely_core::StoreWrapper for FaultStore {
    type Inner = MemoryStore;
    /// Every call fails under [`Fault::FailAll`].
    fn inner(&self) -> Result<&MemoryStore, StoreError> {
        self.check()?;
        Ok(&self.inner)
    }
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let inner = self.inner()?;
        match self.fault {
            Fault::HangClaim => std::future::pending::<()>().await,
            Fault::SlowClaim(d) => tokio::time::sleep(d).await,
            Fault::RecordThenHang => {
                inner.claim(req).await?;
                return std::future::pending().await;
            }
            _ => {}
        }
        inner.claim(req).await
    }
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let inner = self.inner()?;
        let n = self
            .renews
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        match self.fault {
            Fault::NoRenew => return Err(StoreError::unavailable(Down)),
            Fault::FlakyRenew if n % 4 != 3 => return Err(StoreError::unavailable(Down)),
            Fault::SlowRenew(d) => tokio::time::sleep(d).await,
            _ => {}
        }
        inner.renew(id, token, lease).await
    }
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let inner = self.inner()?;
        if self.fault == Fault::FailComplete {
            return Err(StoreError::unavailable(Down));
        }
        inner.complete(id, token, response, retention).await
    }
}

/// A store whose `claim` answers a scripted outcome, to test the layer's mapping of every
/// `ClaimOutcome` alone; its writes succeed and are recorded.
pub struct ScriptedStore {
    pub outcome: ClaimOutcome,
    pub writes: std::sync::Mutex<Vec<&'static str>>,
}

impl ScriptedStore {
    pub fn new(outcome: ClaimOutcome) -> Self {
        Self {
            outcome,
            writes: std::sync::Mutex::default(),
        }
    }
    pub fn writes(&self) -> Vec<&'static str> {
        self.writes.lock().unwrap().clone()
    }
}

#[async_trait]
impl KeyStore for ScriptedStore {
    async fn claim(&self, _: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.writes.lock().unwrap().push("claim");
        Ok(self.outcome.clone())
    }
    async fn renew(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.writes.lock().unwrap().push("renew");
        Ok(0)
    }
    async fn checkpoint(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: &str,
        _: Duration,
    ) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push("checkpoint");
        Ok(())
    }
    async fn complete(
        &self,
        _: &RecordKey,
        _: FencingToken,
        _: StoredResponse,
        _: Duration,
    ) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push("complete");
        Ok(())
    }
    async fn release(&self, _: &RecordKey, _: FencingToken) -> Result<(), StoreError> {
        self.writes.lock().unwrap().push("release");
        Ok(())
    }
    async fn get(&self, _: &RecordKey) -> Result<Option<Record>, StoreError> {
        Ok(None)
    }
}

/// Headers of a response other than those that legitimately differ between an original and
/// its replay (`date`, and the replay marker), as `(name, value)` pairs in order.
pub fn comparable_headers(h: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    h.iter()
        .filter(|(n, _)| *n != "date" && *n != "idempotent-replayed")
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect()
}
