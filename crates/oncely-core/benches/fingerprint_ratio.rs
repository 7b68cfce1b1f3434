//! The fingerprint against plain SHA-256 of the same bytes, as ratios measured in one run with
//! the two interleaved round by round, so that both see the same machine load (on a shared
//! machine, absolute throughput moves by 2x between runs; the ratio does not).
//!
//! For each body (the order of `fingerprint.rs` at 1 KiB, 64 KiB and 1 MiB; the same bodies
//! already in canonical form; a raw `application/octet-stream` body), each round times a batch
//! of `Sha256::digest`, then a batch of the fingerprint, then a batch of the version 1
//! fingerprint as it was computed before `oncely_core::jcs` (a `serde_json::Value` tree
//! serialized by `serde_json_canonicalizer`), alternating which goes first. It prints the
//! median over the rounds of each batch's throughput and the ratios to SHA-256.
//!
//! Run: `cargo bench -p oncely-core --bench fingerprint_ratio` (about 30 s). Under `cargo test
//! --benches` it runs one short round as a smoke test. For an instruction count, one body only:
//! `valgrind --tool=callgrind target/release/deps/fingerprint_ratio-* --only 64k-json --iters 100`
//! (`64k-sha` counts plain SHA-256 of the same JSON body).

#![allow(missing_docs)]

use oncely_core::fingerprint::{RequestParts, canonical_json, fingerprint_v1};
use sha2::{Digest, Sha256};
use std::hint::black_box;
use std::time::{Duration, Instant};

#[path = "support/order_body.rs"]
mod order_body;
use order_body::json_body;

fn parts<'a>(content_type: &'a [u8], body: &'a [u8]) -> RequestParts<'a> {
    RequestParts::new("POST", "/v1/orders", body).with_content_type(Some(content_type))
}

fn tree_fingerprint(body: &[u8]) -> [u8; 32] {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap();
    let canonical = serde_json_canonicalizer::to_vec(&value).unwrap();
    let mut h = Sha256::new();
    h.update((canonical.len() as u64).to_be_bytes());
    h.update(&canonical);
    h.finalize().into()
}

/// Seconds per call of `f`, over a batch of `iters` calls.
fn batch(iters: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_secs_f64() / iters as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `--only <body> [--iters N]`: computes N fingerprints (default 100) of one body and prints
/// nothing else, for an instruction count under `valgrind --tool=callgrind`. `<body>` is `1k`,
/// `64k` or `1m`, then `json`, `canonical` or `raw`, e.g. `64k-json`.
fn only(spec: &str, iters: u64) {
    let (size, kind) = spec.split_once('-').expect("<size>-<kind>");
    let size = match size {
        "1k" => 1 << 10,
        "64k" => 64 << 10,
        "1m" => 1 << 20,
        other => panic!("unknown size {other}"),
    };
    let json = json_body(size);
    let (body, ct): (Vec<u8>, &[u8]) = match kind {
        "json" => (json, b"application/json"),
        "canonical" => (canonical_json(&json).unwrap(), b"application/json"),
        "raw" => (
            (0..size).map(|i| (i % 251) as u8).collect(),
            b"application/octet-stream",
        ),
        "sha" => {
            for _ in 0..iters {
                black_box(Sha256::digest(black_box(json.as_slice())));
            }
            return;
        }
        other => panic!("unknown kind {other}"),
    };
    for _ in 0..iters {
        black_box(fingerprint_v1(&parts(ct, black_box(&body))));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--only") {
        let iters = args
            .iter()
            .position(|a| a == "--iters")
            .map_or(100, |j| args[j + 1].parse().expect("--iters N"));
        only(&args[i + 1], iters);
        return;
    }
    let measure = std::env::args().any(|a| a == "--bench");
    let rounds = if measure { 15 } else { 1 };
    let budget = Duration::from_millis(if measure { 150 } else { 1 });
    println!(
        "| body | bytes | SHA-256 MiB/s | fingerprint MiB/s | fingerprint / SHA-256 | before (tree) MiB/s | before / SHA-256 | speed-up |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, size) in [
        ("1 KiB", 1usize << 10),
        ("64 KiB", 64 << 10),
        ("1 MiB", 1 << 20),
    ] {
        let json = json_body(size);
        let canonical = canonical_json(&json).unwrap();
        let raw: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        for (kind, body, ct, tree) in [
            ("JSON", &json, &b"application/json"[..], true),
            (
                "JSON, already canonical",
                &canonical,
                &b"application/json"[..],
                true,
            ),
            ("raw", &raw, &b"application/octet-stream"[..], false),
        ] {
            // Calibrate the batch sizes once.
            let once = |f: &mut dyn FnMut()| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64().max(1e-7)
            };
            let per = |secs: f64| ((budget.as_secs_f64() / secs) as u64).clamp(1, 1_000_000);
            let n_sha = per(once(&mut || {
                black_box(Sha256::digest(black_box(body.as_slice())));
            }));
            let n_fp = per(once(&mut || {
                black_box(fingerprint_v1(&parts(ct, black_box(body))));
            }));
            let n_tree = if tree {
                per(once(&mut || {
                    black_box(tree_fingerprint(black_box(body)));
                }))
            } else {
                0
            };
            let (mut sha, mut fp, mut old) = (Vec::new(), Vec::new(), Vec::new());
            for round in 0..rounds {
                let run_sha = || {
                    batch(n_sha, || {
                        black_box(Sha256::digest(black_box(body.as_slice())));
                    })
                };
                let run_fp = || {
                    batch(n_fp, || {
                        black_box(fingerprint_v1(&parts(ct, black_box(body))));
                    })
                };
                if round % 2 == 0 {
                    sha.push(run_sha());
                    fp.push(run_fp());
                } else {
                    fp.push(run_fp());
                    sha.push(run_sha());
                }
                if tree {
                    old.push(batch(n_tree, || {
                        black_box(tree_fingerprint(black_box(body)));
                    }));
                }
            }
            let mib = |secs: f64| body.len() as f64 / secs / (1024.0 * 1024.0);
            let (s, f) = (median(sha), median(fp));
            let (o_thr, o_ratio, speedup) = if tree {
                let o = median(old);
                (
                    format!("{:.1}", mib(o)),
                    format!("{:.1}%", 100.0 * s / o),
                    format!("{:.1}x", o / f),
                )
            } else {
                ("-".into(), "-".into(), "-".into())
            };
            println!(
                "| {label} {kind} | {} | {:.0} | {:.1} | **{:.1}%** | {o_thr} | {o_ratio} | {speedup} |",
                body.len(),
                mib(s),
                mib(f),
                100.0 * s / f,
            );
        }
    }
}
