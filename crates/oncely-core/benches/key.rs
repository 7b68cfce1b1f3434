//! `Idempotency-Key` parsing: a typical UUID key, the IETF quoted form, a 255-character key,
//! and a rejected one.
//!
//! Run: `cargo bench -p oncely-core --bench key`.

#![allow(missing_docs)]

use criterion::{Criterion, criterion_group, criterion_main};
use oncely_core::IdempotencyKey;
use std::hint::black_box;
use std::time::Duration;

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_parse");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    let long = "k".repeat(255);
    let cases: [(&str, &[u8]); 4] = [
        ("uuid", b"0190f3c2-7b1e-7c4a-9a55-2f0d3c1e8b77"),
        ("quoted", b"\"order-confirm-42\""),
        ("255_chars", long.as_bytes()),
        ("invalid_space", b"order confirm 42"),
    ];
    for (name, raw) in cases {
        group.bench_function(name, |b| b.iter(|| IdempotencyKey::parse(black_box(raw))));
    }
    group.finish();
}

criterion_group!(key, benches);
criterion_main!(key);
