//! Fingerprint throughput, in bytes per second, against plain SHA-256 of the same bytes (the
//! floor: the fingerprint hashes at least the body).
//!
//! Groups, each at 1 KiB, 64 KiB and 1 MiB:
//! - `sha256`: `Sha256::digest(body)`, the floor;
//! - `fingerprint_raw`: [`fingerprint_v1`] of an `application/octet-stream` body (framing and
//!   hashing only);
//! - `fingerprint_json`: [`fingerprint_v1`] of an `application/json` body (the streaming RFC
//!   8785 canonicalizer of `oncely_core::jcs` writing into the hash);
//! - `fingerprint_json_canonical`: the same of a body that is already canonical (the same
//!   order, re-serialized in RFC 8785 form: the fast path);
//! - `fingerprint_json_tree`: the version 1 fingerprint as it was computed before `jcs` (a
//!   `serde_json::Value` tree serialized by `serde_json_canonicalizer`, then hashed), measured
//!   in the same run for the before/after ratio;
//! - `canonical_json`: [`canonical_json`] alone (into a `Vec`), to split the JSON cost;
//! - `serde_json_parse`: `serde_json::from_slice::<Value>` alone (what any tree-based design
//!   pays before canonicalizing).
//!
//! Run: `cargo bench -p oncely-core --bench fingerprint`. Short measurement times keep the whole
//! run to about a minute on two cores.

#![allow(missing_docs)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use oncely_core::fingerprint::{RequestParts, canonical_json, fingerprint_v1};
use sha2::{Digest, Sha256};
use std::hint::black_box;
use std::time::Duration;

#[path = "support/order_body.rs"]
mod order_body;
use order_body::json_body;

const SIZES: [(&str, usize); 3] = [("1KiB", 1 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20)];

/// [`json_body`], checked to be JSON.
fn checked_json_body(target: usize) -> Vec<u8> {
    let out = json_body(target);
    assert!(serde_json::from_slice::<serde_json::Value>(&out).is_ok());
    out
}

fn raw_body(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Version 1 before `jcs`: parse into a tree, serialize it canonically, hash it framed.
fn tree_fingerprint(body: &[u8]) -> [u8; 32] {
    let value: serde_json::Value = serde_json::from_slice(body).unwrap();
    let canonical = serde_json_canonicalizer::to_vec(&value).unwrap();
    let mut h = Sha256::new();
    for part in [
        &b"oncely-fingerprint"[..],
        b"POST",
        b"/v1/orders",
        b"application/json",
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update((canonical.len() as u64).to_be_bytes());
    h.update(&canonical);
    h.finalize().into()
}

fn parts<'a>(content_type: &'a [u8], body: &'a [u8]) -> RequestParts<'a> {
    RequestParts::new("POST", "/v1/orders", body).with_content_type(Some(content_type))
}

fn benches(c: &mut Criterion) {
    for (group_name, json) in [
        ("sha256_raw", false),
        ("fingerprint_raw", false),
        ("sha256_json", true),
        ("fingerprint_json", true),
        ("fingerprint_json_canonical", true),
        ("fingerprint_json_tree", true),
        ("canonical_json", true),
        ("serde_json_parse", true),
    ] {
        let mut group = c.benchmark_group(group_name);
        group
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1))
            .sample_size(20);
        for (label, size) in SIZES {
            let body = if group_name == "fingerprint_json_canonical" {
                canonical_json(&checked_json_body(size)).unwrap()
            } else if json {
                checked_json_body(size)
            } else {
                raw_body(size)
            };
            group.throughput(Throughput::Bytes(body.len() as u64));
            group.bench_with_input(BenchmarkId::from_parameter(label), &body, |b, body| {
                match group_name {
                    "sha256_raw" | "sha256_json" => {
                        b.iter(|| Sha256::digest(black_box(body.as_slice())));
                    }
                    "fingerprint_raw" => b.iter(|| {
                        fingerprint_v1(&parts(b"application/octet-stream", black_box(body)))
                    }),
                    "fingerprint_json" => {
                        b.iter(|| fingerprint_v1(&parts(b"application/json", black_box(body))));
                    }
                    "fingerprint_json_canonical" => {
                        b.iter(|| fingerprint_v1(&parts(b"application/json", black_box(body))));
                    }
                    "fingerprint_json_tree" => b.iter(|| tree_fingerprint(black_box(body))),
                    "canonical_json" => b.iter(|| canonical_json(black_box(body))),
                    _ => b.iter(|| {
                        serde_json::from_slice::<serde_json::Value>(black_box(body)).unwrap()
                    }),
                }
            });
        }
        group.finish();
    }
}

criterion_group!(fingerprint, benches);
criterion_main!(fingerprint);
