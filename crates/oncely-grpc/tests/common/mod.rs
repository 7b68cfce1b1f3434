//! A real tonic server over TCP running the test Echo service behind the gRPC layer, a raw
//! HTTP/2 client (to compare replays byte for byte), and the stores to run on.
#![allow(dead_code, unreachable_pub)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use oncely_core::{KeyStore, MemoryStore, Policy, Scope, StoreError};
use oncely_grpc::{GrpcDeadline, GrpcIdempotencyLayer, GrpcMethods};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};

pub mod echo {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("oncely.testing.v1");
}
use echo::echo_server::{Echo, EchoServer};
use echo::{SayReply, SayRequest};

pub const SAY: &str = "/oncely.testing.v1.Echo/Say";
pub const REPEAT: &str = "/oncely.testing.v1.Echo/Repeat";

/// The Echo service: counts its executions, remembers the deadlines it saw.
#[derive(Clone, Default)]
pub struct EchoSvc {
    pub executions: Arc<AtomicU64>,
    pub deadlines: Arc<Mutex<Vec<Duration>>>,
}

impl EchoSvc {
    fn run<T>(&self, req: &Request<T>) -> u64 {
        if let Some(d) = req.extensions().get::<GrpcDeadline>() {
            self.deadlines.lock().unwrap().push(d.remaining());
        }
        self.executions.fetch_add(1, Ordering::SeqCst) + 1
    }
}

type ReplyStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<SayReply, Status>> + Send>>;

#[tonic::async_trait]
impl Echo for EchoSvc {
    async fn say(&self, req: Request<SayRequest>) -> Result<Response<SayReply>, Status> {
        let n = self.run(&req);
        let r = req.into_inner();
        tokio::time::sleep(Duration::from_millis(r.delay_ms.into())).await;
        if r.fail_with != 0 {
            return Err(Status::new(
                tonic::Code::from_i32(r.fail_with),
                format!("failed on purpose: {}", r.text),
            ));
        }
        Ok(Response::new(SayReply {
            text: r.text,
            execution: n,
        }))
    }

    type RepeatStream = ReplyStream;

    async fn repeat(&self, req: Request<SayRequest>) -> Result<Response<ReplyStream>, Status> {
        let n = self.run(&req);
        let r = req.into_inner();
        let items = (0..r.count).map(move |i| {
            Ok(SayReply {
                text: format!("{} #{i}", r.text),
                execution: n,
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(
            items.collect::<Vec<_>>(),
        ))))
    }

    async fn collect(
        &self,
        req: Request<Streaming<SayRequest>>,
    ) -> Result<Response<SayReply>, Status> {
        let n = self.run(&req);
        let mut stream = req.into_inner();
        let mut texts = Vec::new();
        while let Some(m) = stream.next().await {
            texts.push(m?.text);
        }
        Ok(Response::new(SayReply {
            text: texts.join(","),
            execution: n,
        }))
    }

    type ChatStream = ReplyStream;

    async fn chat(
        &self,
        req: Request<Streaming<SayRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let n = self.run(&req);
        let stream = req.into_inner().map(move |m| {
            m.map(|m| SayReply {
                text: m.text,
                execution: n,
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// The methods as the tests declare them.
pub fn methods() -> GrpcMethods {
    GrpcMethods::new()
        .require(SAY)
        .require(REPEAT)
        .streaming("/oncely.testing.v1.Echo/Collect")
        .streaming("/oncely.testing.v1.Echo/Chat")
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub svc: EchoSvc,
    pub metrics: Arc<oncely_tower::Metrics>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub fn executions(&self) -> u64 {
        self.svc.executions.load(Ordering::SeqCst)
    }

    pub async fn client(&self) -> echo::echo_client::EchoClient<tonic::transport::Channel> {
        echo::echo_client::EchoClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }
}

/// Authentication for the tests: the `x-account` metadata entry is the caller.
fn authenticate(mut req: http::Request<tonic::body::Body>) -> http::Request<tonic::body::Body> {
    let account = req
        .headers()
        .get("x-account")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(a) = account {
        req.extensions_mut().insert(Scope::new(a));
    }
    req
}

/// Serves Echo on 127.0.0.1 (a free port) over `store` with `policy`.
pub async fn serve(store: Arc<dyn KeyStore>, policy: Policy) -> Server {
    let layer = GrpcIdempotencyLayer::from_layer(
        oncely_tower::IdempotencyLayer::new(store).with_policy(policy),
        methods(),
    )
    .expect("a gRPC policy");
    let metrics = layer.tower().metrics();
    let svc = EchoSvc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let router = tonic::transport::Server::builder()
        .layer(tower::util::MapRequestLayer::new(authenticate))
        .layer(layer)
        .add_service(EchoServer::new(svc.clone()));
    let task = tokio::spawn(async move {
        router.serve_with_incoming(incoming).await.expect("serve");
    });
    Server {
        addr,
        svc,
        metrics,
        task,
    }
}

/// A unary request with the account and key metadata entries.
pub fn keyed<T>(msg: T, key: Option<&str>) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("x-account", "acct_1".parse().unwrap());
    if let Some(k) = key {
        req.metadata_mut()
            .insert("idempotency-key", k.parse().unwrap());
    }
    req
}

pub fn say(text: &str) -> SayRequest {
    SayRequest {
        text: text.into(),
        ..Default::default()
    }
}

/// One raw HTTP/2 exchange, as bytes on the gRPC level.
#[derive(Debug)]
pub struct Raw {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Bytes,
    pub trailers: Vec<(String, Vec<u8>)>,
}

/// Sends one gRPC call over a raw HTTP/2 connection (hyper) and reads every byte back.
pub async fn raw_call(
    addr: SocketAddr,
    path: &str,
    key: &str,
    message: &impl prost::Message,
) -> Raw {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let bytes = message.encode_to_vec();
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(&bytes);
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("x-account", "acct_1")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from(framed)))
        .unwrap();
    let res = send.send_request(req).await.unwrap();
    let (parts, body) = res.into_parts();
    let collected = body.collect().await.unwrap();
    let pairs = |h: &http::HeaderMap| {
        h.iter()
            .filter(|(n, _)| n.as_str() != "date")
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect::<Vec<_>>()
    };
    let trailers = collected.trailers().map(pairs).unwrap_or_default();
    Raw {
        status: parts.status.as_u16(),
        headers: pairs(&parts.headers),
        trailers,
        body: collected.to_bytes(),
    }
}

#[derive(Debug)]
struct Down;
impl std::fmt::Display for Down {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store switched off by the test")
    }
}
impl std::error::Error for Down {}

/// A real store that the test can switch off (every call fails as unavailable) and on again.
pub struct Switch {
    pub inner: Arc<dyn KeyStore>,
    pub down: AtomicBool,
}

impl Switch {
    fn check(&self) -> Result<(), StoreError> {
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::unavailable(Down))
        } else {
            Ok(())
        }
    }
}

/// Every operation fails while the switch is off.
impl oncely_core::StoreWrapper for Switch {
    type Inner = dyn KeyStore;
    fn inner(&self) -> Result<&dyn KeyStore, StoreError> {
        self.check()?;
        Ok(&*self.inner)
    }
}

/// Every store the environment offers: memory and SQLite always, PostgreSQL and Redis when
/// `ONCELY_TEST_POSTGRES_URL` / `ONCELY_TEST_REDIS_URL` are set (skipped with a printed reason
/// otherwise). The temporary directory keeps the SQLite file alive.
pub async fn stores(dir: &tempfile::TempDir) -> Vec<(&'static str, Arc<dyn KeyStore>)> {
    let mut out: Vec<(&'static str, Arc<dyn KeyStore>)> =
        vec![("memory", Arc::new(MemoryStore::new()))];
    let path = dir.path().join("grpc.db");
    let sqlite = oncely_sqlite::SqliteStore::connect(path.to_str().unwrap())
        .await
        .unwrap();
    out.push(("sqlite", Arc::new(sqlite)));
    match std::env::var("ONCELY_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => {
            let pg = oncely_postgres::PostgresStore::connect(&url)
                .await
                .expect("postgres");
            pg.migrate().await.expect("migrate");
            out.push(("postgres", Arc::new(pg)));
        }
        _ => eprintln!("skipping PostgreSQL: ONCELY_TEST_POSTGRES_URL is unset"),
    }
    match std::env::var("ONCELY_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => {
            let url = format!(
                "{url}{}accept_volatile=true",
                if url.contains('?') { '&' } else { '?' }
            );
            let config = oncely_redis::RedisConfig::new()
                .with_namespace(format!("oncely-grpc-test-{}", uuid::Uuid::new_v4()));
            let redis = oncely_redis::RedisStore::connect_with(&url, config)
                .await
                .expect("redis");
            out.push(("redis", Arc::new(redis)));
        }
        _ => eprintln!("skipping Redis: ONCELY_TEST_REDIS_URL is unset"),
    }
    out
}

/// A key nobody used.
pub fn fresh_key() -> String {
    format!("grpc-{}", uuid::Uuid::new_v4())
}
