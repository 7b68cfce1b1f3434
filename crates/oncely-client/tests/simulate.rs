//! The simulations reproduce the published ranking from the model, not from hard-coded numbers.

use oncely_client::simulate::{
    ContentionConfig, ContentionReport, OutageConfig, Strategy, compare_budget, compare_contention,
    run_outage,
};

fn by(reports: &[ContentionReport], s: Strategy) -> ContentionReport {
    *reports.iter().find(|r| r.strategy == s).unwrap()
}

/// 100 clients, base 5 ms, cap 2 s (AWS Architecture Blog, "Exponential Backoff And Jitter").
#[test]
fn contention_reproduces_the_published_ranking() {
    let started = std::time::Instant::now();
    let reports = compare_contention(&ContentionConfig::new());
    eprintln!("contention simulation took {:?}", started.elapsed());
    for r in &reports {
        eprintln!(
            "{:<13} calls {:>8.1}  completion {:?}",
            r.strategy, r.mean_calls, r.mean_completion
        );
        assert_eq!(r.completed, 100, "OCC always makes progress");
        assert!(r.mean_calls >= 100.0);
    }
    let none = by(&reports, Strategy::NoBackoff);
    let expo = by(&reports, Strategy::Exponential);
    let equal = by(&reports, Strategy::EqualJitter);
    let full = by(&reports, Strategy::FullJitter);
    let decorr = by(&reports, Strategy::Decorrelated);

    // Full jitter does the least work.
    for other in [none, expo, equal, decorr] {
        assert!(full.mean_calls < other.mean_calls, "{full:?} vs {other:?}");
    }
    // No backoff does the most work.
    for other in [expo, equal, full, decorr] {
        assert!(none.mean_calls > other.mean_calls, "{none:?} vs {other:?}");
    }
    // Un-jittered exponential takes the longest.
    for other in [none, equal, full, decorr] {
        assert!(
            expo.mean_completion > other.mean_completion,
            "{expo:?} vs {other:?}"
        );
    }
    // Decorrelated finishes sooner than full jitter, at the price of more work.
    assert!(decorr.mean_completion < full.mean_completion);
    assert!(decorr.mean_calls > full.mean_calls);
    // Equal jitter: more work and more time than full jitter.
    assert!(equal.mean_calls > full.mean_calls);
    assert!(equal.mean_completion > full.mean_completion);
}

#[test]
fn contention_is_deterministic_per_seed() {
    let c = ContentionConfig::new()
        .with_clients(30)
        .with_runs(2)
        .with_seed(42);
    assert_eq!(compare_contention(&c), compare_contention(&c));
    let other = compare_contention(&c.with_seed(43));
    assert_ne!(compare_contention(&c), other);
}

#[test]
fn outage_amplification_with_and_without_budget() {
    // 100 instances x 1,000 calls, 100% failure, 3 attempts.
    let [without, with] = compare_budget(&OutageConfig::new());
    assert!(!without.budget && with.budget);
    eprintln!("{without:?}\n{with:?}");
    assert_eq!(without.logical_calls, 100_000);
    assert!((without.amplification - 3.0).abs() < 1e-9, "{without:?}");
    assert!(with.amplification < 1.2, "{with:?}");
    // Each instance's bucket pays for 500 / 14 = 35 retries, then none.
    assert_eq!(with.retries, 100 * 35);
    assert_eq!(with.succeeded, 0);
}

#[test]
fn budget_lets_retries_through_a_partial_outage_and_after_recovery() {
    // 10% failures: successes keep refilling the bucket, so retries mostly still happen and
    // nearly every call succeeds.
    let partial = run_outage(
        &OutageConfig::new()
            .with_instances(20)
            .with_calls_per_instance(500)
            .with_failure_rate(0.1),
    );
    assert!(
        partial.succeeded as f64 / partial.logical_calls as f64 > 0.98,
        "{partial:?}"
    );
    assert!(partial.amplification < 1.15, "{partial:?}");

    // A total outage for the first 20 s, then recovery: retries are denied during the outage
    // and resume afterwards (the bucket refills from successes).
    let config = OutageConfig::new()
        .with_instances(10)
        .with_calls_per_instance(1000)
        .with_outage_window(
            std::time::Duration::ZERO,
            std::time::Duration::from_secs(20),
        );
    let r = run_outage(&config);
    assert!(r.retries_denied > 0, "{r:?}");
    assert!(r.succeeded >= 10 * 790, "{r:?}");
}
