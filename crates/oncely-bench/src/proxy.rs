//! A TCP proxy that adds a fixed one-way delay in each direction, and counts round trips: what
//! a database or Redis on another host costs, simulated on loopback (`ONCELY_BENCH_RTT_MS` of
//! `benches/stores.rs` and `benches/transactional.rs`, and of `scripts/http.sh`;
//! docs/PERFORMANCE.md, "Over a network: the latency proxy").
//!
//! Every chunk read from one side is delivered to the other side `one_way` after it arrived, in
//! the order it arrived. Each direction of a connection has a reader task, which timestamps the
//! chunks it reads and queues them, and a writer task, which waits until each chunk's due time
//! and writes it: the delay is a latency, never a limit on throughput (a chunk that arrives
//! while another waits is not held back further). The wait is a Linux `timerfd` on
//! `CLOCK_MONOTONIC` with an absolute deadline (nanosecond resolution), because tokio's timer
//! rounds every sleep up to whole milliseconds, which would turn a 0.5 millisecond delay into
//! one of 1 to 2 milliseconds.
//!
//! # Calibration
//!
//! Forwarding costs time of its own: two more loopback hops and the wake-ups of the proxy's
//! tasks, about 0.1 milliseconds per round trip on this project's 2-core machine, and a timer
//! fires some microseconds after its deadline. So that a round trip through the proxy costs
//! `2 * one_way` more than the direct path, and not that plus the proxy's own cost, a proxy
//! with a delay calibrates itself when it starts: it times 200 small echoes direct and through a
//! proxy of its own to a private echo server, and takes half the excess off each one-way delay
//! (three passes, each correcting the last; never more than the delay itself). The correction
//! is [`LatencyProxy::compensation`]; `examples/proxy_check.rs` checks the result against a
//! bare `SELECT 1` on PostgreSQL.
//!
//! # Round trips
//!
//! A round trip is a client-to-server flight answered by a server-to-client flight. The proxy
//! counts one each time bytes arrive from the server after the last bytes seen on the
//! connection came from the client (a flight being any run of chunks in one direction), per
//! connection and in total. A server greeting before the client spoke and a client's last
//! message that is never answered (PostgreSQL's `Terminate`) are thus not round trips. The count
//! is taken when the answer reaches the proxy, before it is delivered, so once a client has
//! its answer the count includes it. Pipelined requests sent in one flight count once: that is
//! the point of pipelining.
//!
//! What it does not simulate: the TCP handshake of a new upstream connection is not delayed
//! (pools keep their connections, so steady-state requests never pay it), nor bandwidth, loss
//! or jitter.

use bytes::{Bytes, BytesMut};
use rustix::time::{
    ClockId, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec, clock_gettime,
    timerfd_create, timerfd_settime,
};
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

/// The most a reader reads at once, in bytes.
const CHUNK: usize = 64 * 1024;

/// The round trips a [`LatencyProxy`] has seen (see the module documentation for what counts),
/// shared between the proxy and whoever reads them. Counts only grow; take a difference of two
/// readings to count a span of work.
#[derive(Debug, Default)]
pub struct RoundTrips {
    total: AtomicU64,
    connections: Mutex<Vec<Arc<AtomicU64>>>,
}

impl RoundTrips {
    /// Round trips over every connection since the proxy started.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// Connections the proxy has accepted since it started (closed ones included).
    pub fn connections(&self) -> usize {
        self.lock().len()
    }

    /// Round trips per connection, in the order the connections were accepted (closed ones
    /// included).
    pub fn per_connection(&self) -> Vec<u64> {
        self.lock()
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<AtomicU64>>> {
        self.connections.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open(&self) -> Arc<AtomicU64> {
        let c = Arc::new(AtomicU64::new(0));
        self.lock().push(Arc::clone(&c));
        c
    }
}

/// A running proxy: accepts on [`LatencyProxy::local_addr`] and forwards each connection to
/// the upstream address, with [`LatencyProxy::one_way`] added in each direction. Dropping it
/// stops accepting and closes every connection it forwards.
#[derive(Debug)]
pub struct LatencyProxy {
    local_addr: SocketAddr,
    upstream: String,
    one_way: Duration,
    compensation: Duration,
    round_trips: Arc<RoundTrips>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl LatencyProxy {
    /// Starts a proxy on `127.0.0.1` (a port the system picks) to `upstream` (`host:port`),
    /// adding `one_way` in each direction (a round trip thus costs `2 * one_way` more; zero
    /// forwards without delay, still counting). With a delay it first calibrates itself, which
    /// takes about `1200 * one_way` (module documentation, "Calibration").
    ///
    /// # Errors
    ///
    /// Binding the listening socket failed, or the calibration's loopback echo did.
    pub async fn start(upstream: &str, one_way: Duration) -> io::Result<Self> {
        Self::bind(
            "127.0.0.1:0".parse().expect("a socket address"),
            upstream,
            one_way,
        )
        .await
    }

    /// [`LatencyProxy::start`] on the address `listen` (port 0: one the system picks).
    ///
    /// # Errors
    ///
    /// As [`LatencyProxy::start`].
    pub async fn bind(listen: SocketAddr, upstream: &str, one_way: Duration) -> io::Result<Self> {
        let compensation = if one_way.is_zero() {
            Duration::ZERO
        } else {
            calibrate(one_way).await?
        };
        Self::bind_compensated(listen, upstream, one_way, compensation).await
    }

    /// [`LatencyProxy::bind`] with a given [`LatencyProxy::compensation`] (no calibration).
    async fn bind_compensated(
        listen: SocketAddr,
        upstream: &str,
        one_way: Duration,
        compensation: Duration,
    ) -> io::Result<Self> {
        let delay = one_way.saturating_sub(compensation);
        let listener = TcpListener::bind(listen).await?;
        let local_addr = listener.local_addr()?;
        let round_trips = Arc::new(RoundTrips::default());
        let tasks: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = {
            let (upstream, round_trips, tasks) = (
                upstream.to_owned(),
                Arc::clone(&round_trips),
                Arc::clone(&tasks),
            );
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let counter = round_trips.open();
                    let (upstream, round_trips) = (upstream.clone(), Arc::clone(&round_trips));
                    let task = tokio::spawn(async move {
                        if let Ok(server) = TcpStream::connect(&upstream).await {
                            forward(client, server, delay, &counter, &round_trips).await;
                        }
                    });
                    let mut tasks = tasks.lock().unwrap_or_else(|p| p.into_inner());
                    tasks.retain(|t| !t.is_finished());
                    tasks.push(task.abort_handle());
                }
            })
        };
        tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(accept.abort_handle());
        Ok(Self {
            local_addr,
            upstream: upstream.to_owned(),
            one_way,
            compensation,
            round_trips,
            tasks,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The upstream address (`host:port`) connections are forwarded to.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The delay added in each direction.
    pub fn one_way(&self) -> Duration {
        self.one_way
    }

    /// What the proxy takes off each one-way delay for its own forwarding cost, found when it
    /// started (see the module documentation, "Calibration"); zero without a delay.
    pub fn compensation(&self) -> Duration {
        self.compensation
    }

    /// The round-trip counter (shared: it keeps counting while the proxy runs).
    pub fn round_trips(&self) -> Arc<RoundTrips> {
        Arc::clone(&self.round_trips)
    }

    /// `url` (`postgres://`, `redis://`, any URL with a host) with its host and port replaced
    /// by this proxy's address, everything else (user, database, query) kept.
    ///
    /// # Errors
    ///
    /// `url` does not parse, or has no host that can be replaced.
    pub fn url(&self, url: &str) -> Result<String, String> {
        let mut u = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
        u.set_ip_host(self.local_addr.ip())
            .map_err(|()| format!("{url}: the host cannot be replaced"))?;
        u.set_port(Some(self.local_addr.port()))
            .map_err(|()| format!("{url}: the port cannot be replaced"))?;
        Ok(u.into())
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// The `host:port` of a URL (`postgres://user@host:5432/db` gives `host:5432`), with the
/// scheme's default port when the URL names none (PostgreSQL 5432, Redis 6379, MySQL 3306).
///
/// # Errors
///
/// `url` does not parse, or names no host.
pub fn upstream_of(url: &str) -> Result<String, String> {
    let u = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    let host = u.host_str().ok_or_else(|| format!("{url}: no host"))?;
    let port = u.port().unwrap_or(match u.scheme() {
        "postgres" | "postgresql" => 5432,
        "mysql" | "mariadb" => 3306,
        _ => 6379,
    });
    Ok(format!("{host}:{port}"))
}

/// Small echoes timed when calibrating, per pass (after 20 not timed).
const CALIBRATION_ECHOES: usize = 200;

/// The compensation that makes a round trip through a proxy with `one_way` cost `2 * one_way`
/// more than a direct one (module documentation, "Calibration").
async fn calibrate(one_way: Duration) -> io::Result<Duration> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let echo = listener.local_addr()?;
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = [0_u8; 64];
                while let Ok(n @ 1..) = s.read(&mut buf).await {
                    if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let result = async {
        let direct = median_echo(echo).await?;
        let mut compensation = Duration::ZERO;
        for _ in 0..3 {
            let proxy = LatencyProxy::bind_compensated(
                "127.0.0.1:0".parse().expect("a socket address"),
                &echo.to_string(),
                one_way,
                compensation,
            )
            .await?;
            let through = median_echo(proxy.local_addr()).await?;
            let excess = through.as_secs_f64() - direct.as_secs_f64() - 2.0 * one_way.as_secs_f64();
            compensation = Duration::from_secs_f64(
                (compensation.as_secs_f64() + excess / 2.0).clamp(0.0, one_way.as_secs_f64()),
            );
        }
        Ok(compensation)
    }
    .await;
    server.abort();
    result
}

/// The median time of [`CALIBRATION_ECHOES`] 16-byte echoes over one connection to `addr`.
async fn median_echo(addr: SocketAddr) -> io::Result<Duration> {
    let mut s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    let mut times = Vec::with_capacity(CALIBRATION_ECHOES);
    let mut buf = [0_u8; 16];
    for i in 0..CALIBRATION_ECHOES + 20 {
        let start = std::time::Instant::now();
        s.write_all(&[0x5a; 16]).await?;
        s.read_exact(&mut buf).await?;
        if i >= 20 {
            times.push(start.elapsed());
        }
    }
    times.sort();
    Ok(times[times.len() / 2])
}

/// Which side the last bytes came from (per connection).
const NONE: u8 = 0;
const CLIENT: u8 = 1;
const SERVER: u8 = 2;

async fn forward(
    client: TcpStream,
    server: TcpStream,
    one_way: Duration,
    counter: &AtomicU64,
    total: &RoundTrips,
) {
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let last = AtomicU8::new(NONE);
    let (client_rd, client_wr) = client.into_split();
    let (server_rd, server_wr) = server.into_split();
    let count = |from: u8| {
        // A flight from the server that follows one from the client answers it.
        if last.swap(from, Ordering::SeqCst) == CLIENT && from == SERVER {
            counter.fetch_add(1, Ordering::SeqCst);
            total.total.fetch_add(1, Ordering::SeqCst);
        }
    };
    tokio::join!(
        pump(client_rd, server_wr, one_way, || count(CLIENT)),
        pump(server_rd, client_wr, one_way, || count(SERVER)),
    );
}

/// One direction: reads chunks, stamps each with its due time, and writes it then; at the end
/// of the stream (or a read error), shuts the write side down at the due time of the end.
async fn pump(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    one_way: Duration,
    mut arrived: impl FnMut(),
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Timespec, Bytes)>();
    let read = async move {
        loop {
            let mut buf = BytesMut::with_capacity(CHUNK);
            let n = rd.read_buf(&mut buf).await.unwrap_or(0);
            let due = add(now(), one_way);
            if n == 0 {
                // The empty chunk: the end of the stream.
                let _ = tx.send((due, Bytes::new()));
                return;
            }
            arrived();
            if tx.send((due, buf.freeze())).is_err() {
                return;
            }
        }
    };
    let write = async move {
        let mut timer = if one_way.is_zero() {
            None
        } else {
            Timer::new().ok()
        };
        while let Some((due, chunk)) = rx.recv().await {
            if let Some(t) = timer.as_mut()
                && t.wait_until(due).await.is_err()
            {
                // No timer (cannot happen on Linux once created): deliver at once.
                timer = None;
            }
            if chunk.is_empty() {
                let _ = wr.shutdown().await;
                return;
            }
            if wr.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(read, write);
}

fn now() -> Timespec {
    clock_gettime(ClockId::Monotonic)
}

fn add(t: Timespec, d: Duration) -> Timespec {
    let nanos = i64::from(d.subsec_nanos()) + t.tv_nsec;
    Timespec {
        tv_sec: t.tv_sec
            + i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2)
            + nanos / 1_000_000_000,
        tv_nsec: nanos % 1_000_000_000,
    }
}

fn reached(due: Timespec) -> bool {
    let n = now();
    (n.tv_sec, n.tv_nsec) >= (due.tv_sec, due.tv_nsec)
}

/// A `timerfd` on `CLOCK_MONOTONIC`, registered with tokio's reactor.
struct Timer(AsyncFd<OwnedFd>);

impl Timer {
    fn new() -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // `AsyncFd::new` is deprecated for types whose `as_raw_fd` may change or close under
        // it (tokio#8587); an `OwnedFd` owned by the `AsyncFd` for its whole life cannot, and
        // the safe constructor keeps this crate free of `unsafe` (the workspace forbids it).
        #[allow(deprecated)]
        let fd = AsyncFd::new(fd)?;
        Ok(Self(fd))
    }

    /// Waits until `CLOCK_MONOTONIC` reaches `due` (at once if it has).
    async fn wait_until(&mut self, due: Timespec) -> io::Result<()> {
        if reached(due) {
            return Ok(());
        }
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: due,
        };
        timerfd_settime(self.0.get_ref(), TimerfdTimerFlags::ABSTIME, &spec)?;
        loop {
            let mut guard = self.0.readable().await?;
            let mut expirations = [0_u8; 8];
            match rustix::io::read(self.0.get_ref(), &mut expirations) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) => guard.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server that answers each read with the same bytes, prefixed by `>`.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0; 4096];
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        let mut out = b">".to_vec();
                        out.extend_from_slice(&buf[..n]);
                        if s.write_all(&out).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn read_exactly(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0; n];
        s.read_exact(&mut buf).await.unwrap();
        buf
    }

    /// Each request answered in turn is one round trip; the bytes arrive whole and in order,
    /// with and without a delay; a second connection is counted on its own.
    #[tokio::test]
    async fn delivers_in_order_and_counts_one_round_trip_per_answered_flight() {
        let upstream = echo().await.to_string();
        for one_way in [Duration::ZERO, Duration::from_micros(500)] {
            let proxy = LatencyProxy::start(&upstream, one_way).await.unwrap();
            let rt = proxy.round_trips();
            let mut c = TcpStream::connect(proxy.local_addr()).await.unwrap();
            for i in 0..5_u8 {
                c.write_all(&[b'a' + i; 3]).await.unwrap();
                assert_eq!(
                    read_exactly(&mut c, 4).await,
                    [b'>', b'a' + i, b'a' + i, b'a' + i]
                );
            }
            assert_eq!(rt.total(), 5, "{one_way:?}");
            let mut c2 = TcpStream::connect(proxy.local_addr()).await.unwrap();
            c2.write_all(b"z").await.unwrap();
            assert_eq!(read_exactly(&mut c2, 2).await, b">z");
            assert_eq!(rt.total(), 6);
            assert_eq!(rt.per_connection(), [5, 1]);
            assert_eq!(rt.connections(), 2);
            // A last message never answered is no round trip.
            drop(c);
            drop(c2);
        }
    }

    /// A large stream sent in many writes arrives byte for byte in order through the delay.
    #[tokio::test]
    async fn a_large_stream_arrives_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = l.local_addr().unwrap().to_string();
        let sink = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut all = Vec::new();
            s.read_to_end(&mut all).await.unwrap();
            s.write_all(b"done").await.unwrap();
            all
        });
        let proxy = LatencyProxy::start(&upstream, Duration::from_micros(200))
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.local_addr()).await.unwrap();
        let data: Vec<u8> = (0..1_000_000_u32).map(|i| (i % 251) as u8).collect();
        for part in data.chunks(7_919) {
            c.write_all(part).await.unwrap();
        }
        c.shutdown().await.unwrap();
        let mut answer = Vec::new();
        c.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"done");
        assert_eq!(sink.await.unwrap(), data);
        // Many client chunks, one answer: one round trip.
        assert_eq!(proxy.round_trips().total(), 1);
    }

    /// Pipelined requests sent in one flight, answered together, are one round trip.
    #[tokio::test]
    async fn a_pipelined_flight_is_one_round_trip() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let got = read_exactly(&mut s, 6).await;
            s.write_all(&got).await.unwrap();
            s.write_all(b"!").await.unwrap();
            let mut rest = Vec::new();
            s.read_to_end(&mut rest).await.unwrap();
        });
        let proxy = LatencyProxy::start(&upstream, Duration::from_micros(300))
            .await
            .unwrap();
        let mut c = TcpStream::connect(proxy.local_addr()).await.unwrap();
        c.write_all(b"one").await.unwrap();
        c.write_all(b"two").await.unwrap();
        assert_eq!(read_exactly(&mut c, 7).await, b"onetwo!");
        assert_eq!(proxy.round_trips().total(), 1);
    }

    #[test]
    fn urls_point_at_the_proxy() {
        assert_eq!(
            upstream_of("postgres://postgres@127.0.0.1:5432/db").unwrap(),
            "127.0.0.1:5432"
        );
        assert_eq!(upstream_of("redis://localhost").unwrap(), "localhost:6379");
        assert_eq!(
            upstream_of("redis://127.0.0.1:6379?accept_volatile=true").unwrap(),
            "127.0.0.1:6379"
        );
    }

    #[tokio::test]
    async fn url_keeps_everything_but_the_address() {
        let proxy = LatencyProxy::start("127.0.0.1:9", Duration::ZERO)
            .await
            .unwrap();
        let port = proxy.local_addr().port();
        assert_eq!(
            proxy
                .url("postgres://postgres@localhost:5432/db?sslmode=disable")
                .unwrap(),
            format!("postgres://postgres@127.0.0.1:{port}/db?sslmode=disable")
        );
        assert_eq!(
            proxy.url("redis://127.0.0.1:6379/0").unwrap(),
            format!("redis://127.0.0.1:{port}/0")
        );
    }
}
