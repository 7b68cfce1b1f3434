//! The testbench at the socket level: raw TCP clients check that each fault is what it says (a
//! reset is a RST, a cut-off body is short and then a FIN, a hang never answers) and that the
//! report counts and times what arrived.

use std::time::{Duration, Instant, SystemTime};

use oncely_testbench::scenario::ScenarioFile;
use oncely_testbench::{Answer, RunReport, Testbench};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FILE: &str = r#"{
  "format": 1,
  "scenarios": [
    {"id": "steps", "kind": "http", "rule": "r", "sources": [], "calls": [
      {"method": "POST", "path": "/p", "key": "auto",
       "server": [{"status": 503, "headers": {"retry-after": "1"}}, {"status": 201, "body": {"json": {"id": 1}}}],
       "expect": {"attempts": 2, "key": "minted", "result": {"status": 201}}},
      {"method": "GET", "path": "/g", "key": "auto", "server": [{"status": 204}],
       "expect": {"attempts": 1, "key": "none", "result": {"status": 204}}}]},
    {"id": "faults", "kind": "http", "rule": "r", "sources": [], "calls": [
      {"method": "POST", "path": "/reset", "key": "auto", "server": [{"fault": "reset"}],
       "expect": {"attempts": 1, "key": "minted", "result": {"status": 200}}},
      {"method": "POST", "path": "/cut", "key": "auto",
       "server": [{"status": 503, "body": {"text": "0123456789abcdefghij"}, "fault": {"cut_off_after_bytes": 7}}],
       "expect": {"attempts": 1, "key": "minted", "result": {"status": 503}}},
      {"method": "POST", "path": "/hang", "key": "auto", "server": [{"fault": "hang"}],
       "expect": {"attempts": 1, "key": "minted", "result": {"status": 200}}},
      {"method": "GET", "path": "/slow", "key": "auto",
       "server": [{"status": 200, "body": {"text": "aaaabbbbcccc"}, "fault": {"slow_body": {"chunk_bytes": 4, "interval_ms": 100}}}],
       "expect": {"attempts": 1, "key": "none", "result": {"status": 200}}},
      {"method": "GET", "path": "/delay", "key": "auto", "server": [{"status": 200, "delay_ms": 1000}],
       "expect": {"attempts": 1, "key": "none", "result": {"status": 200}}},
      {"method": "GET", "path": "/date", "key": "auto", "server": [{"status": 503, "headers": {
         "a": {"http_date": {"in_ms": 3000, "form": "imf-fixdate"}},
         "b": {"http_date": {"in_ms": 3000, "form": "rfc850"}},
         "c": {"http_date": {"in_ms": 3000, "form": "asctime"}}}}],
       "expect": {"attempts": 1, "key": "none", "result": {"status": 503}}}]}
  ]
}"#;

async fn bench() -> Testbench {
    let file = ScenarioFile::from_json(FILE).unwrap();
    Testbench::start("127.0.0.1:0".parse().unwrap(), &file)
        .await
        .unwrap()
}

fn request(method: &str, path: &str, scenario: &str, run: &str, call: u32, extra: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\nx-oncely-scenario: {scenario}\r\nx-oncely-run: {run}\r\nx-oncely-call: {call}\r\n{extra}\r\n"
    )
}

/// Reads one response: (status, headers, body); the body as far as it arrived before
/// content-length was satisfied or the connection ended.
async fn read_response(
    s: &mut TcpStream,
) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut slots);
        if let Ok(httparse::Status::Complete(n)) = r.parse(&buf) {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_ascii_lowercase(),
                        String::from_utf8_lossy(h.value).into(),
                    )
                })
                .collect();
            let status = r.code.unwrap();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .map_or(0, |(_, v)| v.parse().unwrap());
            let mut body = buf[n..].to_vec();
            while body.len() < len {
                match s.read(&mut chunk).await? {
                    0 => break,
                    k => body.extend_from_slice(&chunk[..k]),
                }
            }
            return Ok((status, headers, body));
        }
        match s.read(&mut chunk).await? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            k => buf.extend_from_slice(&chunk[..k]),
        }
    }
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

async fn report(url: &str, run: &str) -> RunReport {
    let addr = url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET /_testbench/runs/{run} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200);
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn steps_play_in_order_per_run_and_call_over_keep_alive() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    let body = "{\"amount\":1}";
    let post = |run: &str| {
        request(
            "POST",
            "/p",
            "steps",
            run,
            0,
            &format!("idempotency-key: k-1\r\ncontent-length: {}\r\n", body.len()),
        ) + body
    };
    // Three attempts of call 0 of run A on one connection: 503, 201, then the last step again.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        s.write_all(post("A").as_bytes()).await.unwrap();
        let (status, headers, got) = read_response(&mut s).await.unwrap();
        statuses.push(status);
        if status == 503 {
            assert_eq!(header(&headers, "retry-after"), Some("1"));
            assert_eq!(header(&headers, "x-oncely-attempt"), Some("1"));
        } else {
            assert_eq!(got, br#"{"id":1}"#);
            assert_eq!(header(&headers, "content-type"), Some("application/json"));
        }
    }
    assert_eq!(statuses, [503, 201, 201]);
    // Another run starts over; call 1 counts on its own.
    s.write_all(post("B").as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 503);
    s.write_all(request("GET", "/g", "steps", "A", 1, "").as_bytes())
        .await
        .unwrap();
    let (status, headers, _) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 204);
    assert_eq!(
        header(&headers, "content-length"),
        None,
        "no length on a 204"
    );

    let r = report(b.url(), "A").await;
    assert_eq!(r.scenario.as_deref(), Some("steps"));
    let calls: Vec<(u32, u32, usize)> = r
        .attempts
        .iter()
        .map(|a| (a.call, a.attempt, a.step))
        .collect();
    assert_eq!(calls, [(0, 1, 0), (0, 2, 1), (0, 3, 1), (1, 1, 0)]);
    let first = &r.attempts[0];
    assert_eq!(first.arrived_ms, 0.0);
    assert_eq!(first.idempotency_key.as_deref(), Some("k-1"));
    assert_eq!(first.idempotency_key_count, 1);
    assert_eq!(first.body_len, body.len());
    assert_eq!(first.body_sha256, sha256_hex(body.as_bytes()));
    assert_eq!(first.method, "POST");
    assert!(
        first
            .headers
            .iter()
            .any(|(k, v)| k == "x-oncely-run" && v == "A")
    );
    for a in &r.attempts {
        assert_eq!(a.answer, Answer::Complete);
        assert!(a.ended_ms.unwrap() >= a.arrived_ms);
    }
    assert!(
        r.attempts
            .windows(2)
            .all(|w| w[0].arrived_ms <= w[1].arrived_ms)
    );
    assert_eq!(report(b.url(), "B").await.attempts.len(), 1);
    let unseen = report(b.url(), "never").await;
    assert_eq!((unseen.scenario, unseen.attempts.len()), (None, 0));
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test]
async fn a_reset_is_a_tcp_reset_after_the_request_was_read() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    s.write_all(request("POST", "/reset", "faults", "R", 0, "content-length: 3\r\n").as_bytes())
        .await
        .unwrap();
    s.write_all(b"abc").await.unwrap();
    let mut buf = [0u8; 64];
    let err = s
        .read(&mut buf)
        .await
        .expect_err("a reset, not an EOF or bytes");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    let r = report(b.url(), "R").await;
    assert_eq!(r.attempts[0].answer, Answer::Reset);
    assert_eq!(
        r.attempts[0].body_len, 3,
        "the whole request was read first"
    );
}

#[tokio::test]
async fn a_cut_off_body_declares_the_full_length_then_closes_cleanly() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    s.write_all(request("POST", "/cut", "faults", "C", 1, "").as_bytes())
        .await
        .unwrap();
    let (status, headers, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 503);
    assert_eq!(header(&headers, "content-length"), Some("20"));
    assert_eq!(body, b"0123456");
    let mut rest = [0u8; 8];
    assert_eq!(s.read(&mut rest).await.unwrap(), 0, "a FIN, not a reset");
    assert_eq!(
        report(b.url(), "C").await.attempts[0].answer,
        Answer::CutOff
    );
}

#[tokio::test]
async fn a_hang_never_answers_and_its_end_is_the_clients_close() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    s.write_all(request("POST", "/hang", "faults", "H", 2, "").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let waited = tokio::time::timeout(Duration::from_millis(400), s.read(&mut buf)).await;
    assert!(waited.is_err(), "nothing arrives: {waited:?}");
    let r = report(b.url(), "H").await;
    assert_eq!(r.attempts[0].answer, Answer::InProgress);
    assert_eq!(r.attempts[0].ended_ms, None);
    drop(s);
    // Noticed at once (a bounded wait for "it eventually happened").
    let deadline = Instant::now() + Duration::from_secs(5);
    let a = loop {
        let r = report(b.url(), "H").await;
        if r.attempts[0].answer != Answer::InProgress || Instant::now() > deadline {
            break r.attempts[0].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(a.answer, Answer::ClientClosed);
    assert!(a.ended_ms.unwrap() - a.arrived_ms >= 400.0, "{a:?}");
}

#[tokio::test]
async fn a_slow_body_arrives_in_chunks_apart_in_time() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    let t = Instant::now();
    s.write_all(request("GET", "/slow", "faults", "S", 3, "").as_bytes())
        .await
        .unwrap();
    let (status, headers, body) = read_response(&mut s).await.unwrap();
    assert_eq!(
        (status, header(&headers, "content-length")),
        (200, Some("12"))
    );
    assert_eq!(body, b"aaaabbbbcccc");
    // Three chunks, two intervals of 100 ms between them: a lower bound of the rule itself.
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    let a = &report(b.url(), "S").await.attempts[0];
    assert_eq!(a.answer, Answer::Complete);
    assert!(a.ended_ms.unwrap() - a.arrived_ms >= 195.0, "{a:?}");
}

#[tokio::test]
async fn a_client_that_gives_up_during_a_delay_is_noticed() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    s.write_all(request("GET", "/delay", "faults", "D", 4, "").as_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(s);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = &report(b.url(), "D").await.attempts[0];
    assert_eq!(a.answer, Answer::ClientClosed);
    let held = a.ended_ms.unwrap() - a.arrived_ms;
    assert!(
        (40.0..900.0).contains(&held),
        "ended at the close, not after the delay: {held}"
    );

    // Waited out, the delay is a lower bound on the answer.
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    let t = Instant::now();
    s.write_all(request("GET", "/delay", "faults", "D2", 4, "").as_bytes())
        .await
        .unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    assert!(t.elapsed() >= Duration::from_millis(1000));
}

#[tokio::test]
async fn http_date_templates_give_a_whole_second_ahead_in_all_three_forms() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    let before = SystemTime::now();
    s.write_all(request("GET", "/date", "faults", "T", 5, "").as_bytes())
        .await
        .unwrap();
    let (_, headers, _) = read_response(&mut s).await.unwrap();
    let after = SystemTime::now();
    let a = header(&headers, "a").unwrap();
    assert!(a.ends_with(" GMT") && a.contains(", "), "{a}");
    assert!(header(&headers, "b").unwrap().contains('-'));
    let parsed: Vec<SystemTime> = ["a", "b", "c"]
        .iter()
        .map(|n| httpdate::parse_http_date(header(&headers, n).unwrap()).unwrap())
        .collect();
    assert!(parsed.iter().all(|t| *t == parsed[0]), "{headers:?}");
    let at = parsed[0];
    assert!(at >= before + Duration::from_secs(3));
    assert!(at <= after + Duration::from_secs(4));
}

#[tokio::test]
async fn requests_without_a_known_scenario_are_refused_and_not_recorded() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    for raw in [
        "GET /x HTTP/1.1\r\nhost: t\r\n\r\n".to_owned(),
        request("GET", "/x", "nope", "U", 0, ""),
        request("GET", "/x", "steps", "U", 9, ""),
        request("GET", "/x", "steps", "bad/run", 0, ""),
    ] {
        s.write_all(raw.as_bytes()).await.unwrap();
        let (status, headers, body) = read_response(&mut s).await.unwrap();
        assert_eq!(status, 400, "{raw}");
        assert_eq!(
            header(&headers, "content-type"),
            Some("application/problem+json")
        );
        assert!(!body.is_empty());
    }
    assert!(report(b.url(), "U").await.attempts.is_empty());
}

#[tokio::test]
async fn chunked_request_bodies_are_recorded_whole() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    let raw = request(
        "POST",
        "/p",
        "steps",
        "K",
        0,
        "transfer-encoding: chunked\r\n",
    ) + "4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n";
    s.write_all(raw.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 503);
    let a = &report(b.url(), "K").await.attempts[0];
    assert_eq!(
        (a.body_len, a.body_sha256.clone()),
        (6, sha256_hex(b"abcdef"))
    );
}

#[tokio::test]
async fn info_and_the_refused_port() {
    let b = bench().await;
    let mut s = TcpStream::connect(b.addr()).await.unwrap();
    s.write_all(b"GET /_testbench/info HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let (status, _, body) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(info["format"], 1);
    assert_eq!(info["scenarios"], 2);
    assert_eq!(info["refused_url"], b.refused_url());
    let refused = b.refused_url().trim_start_matches("http://");
    let err = TcpStream::connect(refused)
        .await
        .expect_err("nothing listens");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}
