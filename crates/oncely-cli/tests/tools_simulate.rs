//! `oncely simulate` as a real process: at 100 clients the published ranking holds (computed
//! from the printed numbers, not from the verdict flags alone), the retry budget keeps a total
//! outage's amplification under 1.2x, the plot is a complete SVG, and bad flags exit 2.

use serde_json::Value;
use std::process::{Command, Output};

fn oncely(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncely"))
        .args(args)
        .output()
        .expect("run oncely")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (mean calls, mean completion in ms) of one strategy in one contention block.
fn get(block: &Value, strategy: &str) -> (f64, f64) {
    let s = block["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["strategy"] == strategy)
        .unwrap_or_else(|| panic!("{strategy} missing: {block}"));
    (
        s["mean_calls"].as_f64().unwrap(),
        s["mean_completion_ms"].as_f64().unwrap(),
    )
}

#[test]
fn at_100_clients_the_published_ranking_holds_and_the_budget_caps_amplification() {
    let out = oncely(&["simulate", "--clients", "100", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    let blocks = report["contention"]["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 1);
    let b = &blocks[0];
    assert_eq!(b["clients"], 100);
    let names: Vec<&str> = b["strategies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["strategy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["none", "exponential", "equal", "full", "decorrelated"]
    );
    for s in b["strategies"].as_array().unwrap() {
        assert_eq!(s["completed"], 100, "OCC always makes progress: {s}");
        assert_eq!(s["runs"], 10);
        assert!(s["mean_calls"].as_f64().unwrap() >= 100.0, "{s}");
    }
    let none = get(b, "none");
    let expo = get(b, "exponential");
    let equal = get(b, "equal");
    let full = get(b, "full");
    let decorr = get(b, "decorrelated");
    // Full jitter the fewest calls.
    for other in [none, expo, equal, decorr] {
        assert!(full.0 < other.0, "full {full:?} vs {other:?}");
    }
    // Decorrelated faster than full jitter, with more calls.
    assert!(decorr.1 < full.1, "{decorr:?} vs {full:?}");
    assert!(decorr.0 > full.0, "{decorr:?} vs {full:?}");
    // Exponential without jitter by far the slowest: more than twice any other.
    for other in [none, equal, full, decorr] {
        assert!(expo.1 > 2.0 * other.1, "exponential {expo:?} vs {other:?}");
    }
    // No backoff the most calls.
    for other in [expo, equal, full, decorr] {
        assert!(none.0 > other.0, "none {none:?} vs {other:?}");
    }
    // The verdict flags agree with the numbers.
    for flag in [
        "full_jitter_least_work",
        "decorrelated_faster_with_more_calls",
        "exponential_slowest",
        "no_backoff_most_calls",
    ] {
        assert_eq!(b["ranking"][flag], true, "{flag}");
    }

    // (b) 100 instances x 1,000 calls, at 10%, 50% and 100% failure.
    let outage = &report["outage"];
    assert_eq!(outage["instances"], 100);
    let rows = outage["rows"].as_array().unwrap();
    let rates: Vec<f64> = rows
        .iter()
        .map(|r| r["failure_rate"].as_f64().unwrap())
        .collect();
    assert_eq!(rates, [0.1, 0.5, 1.0]);
    for r in rows {
        assert_eq!(r["without_budget"]["logical_calls"], 100_000);
        assert_eq!(r["with_budget"]["logical_calls"], 100_000);
        assert_eq!(r["without_budget"]["budget"], false);
        assert_eq!(r["with_budget"]["budget"], true);
        assert_eq!(r["without_budget"]["retries_denied"], 0);
    }
    let total = &rows[2];
    // Without the budget every call uses all 3 attempts: 300,000 requests.
    assert_eq!(total["without_budget"]["requests"], 300_000);
    assert_eq!(total["without_budget"]["amplification"], 3.0);
    let with = total["with_budget"]["amplification"].as_f64().unwrap();
    assert!(with < 1.2, "{total}");
    // Each instance's bucket pays for 500 / 14 = 35 retries, then none.
    assert_eq!(total["with_budget"]["retries"], 100 * 35);
    assert_eq!(total["with_budget"]["succeeded"], 0);
}

#[test]
fn the_text_tables_and_the_verdict_line() {
    let out = oncely(&[
        "simulate",
        "--clients",
        "100",
        "--runs",
        "3",
        "--instances",
        "20",
        "--calls-per-instance",
        "200",
        "--failure-rates",
        "1.0",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for needle in [
        "(a) contention: clients updating one row under optimistic concurrency\n",
        "\n  100 clients\n",
        "  no backoff ",
        "  exponential (no jitter) ",
        "  equal jitter ",
        "  full jitter ",
        "  decorrelated jitter ",
        "full jitter did the least work: yes;",
        "(b) fleet outage: 20 instances x 200 calls",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in\n{stdout}");
    }
    // One outage row: 100% failure, 3.000x without the budget.
    let row = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("100%"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "3.000x", "{row}");
    let with: f64 = cols[2].trim_end_matches('x').parse().unwrap();
    assert!(with < 1.2, "{row}");
}

#[test]
fn a_sweep_and_the_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("sim.svg");
    let args = [
        "simulate",
        "--clients-sweep",
        "10,20",
        "--runs",
        "2",
        "--instances",
        "10",
        "--calls-per-instance",
        "100",
        "--failure-rates",
        "0.5,1.0",
        "--seed",
        "7",
        "--json",
        "--plot",
        svg.to_str().unwrap(),
    ];
    let out = oncely(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let clients: Vec<u64> = report["contention"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["clients"].as_u64().unwrap())
        .collect();
    assert_eq!(clients, [10, 20]);
    assert_eq!(report["contention"]["seed"], 7);

    let doc = std::fs::read_to_string(&svg).unwrap();
    assert!(
        doc.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "{doc}"
    );
    assert!(doc.ends_with("</svg>\n"));
    // One bar (with a tooltip) per strategy per clients value in each of the two contention
    // charts, and one per budget setting per failure rate: 2 x 2 x 5 + 2 x 2 = 24.
    assert_eq!(doc.matches("<title>").count(), 24, "{doc}");
    for label in [
        "no backoff",
        "exponential (no jitter)",
        "equal jitter",
        "full jitter",
        "decorrelated jitter",
        "10 clients",
        "20 clients",
        "50% of requests failing",
        "100% of requests failing",
        "with the retry budget",
    ] {
        assert!(doc.contains(label), "{label:?}");
    }

    // Deterministic: the same flags print the same numbers and draw the same picture.
    let again = oncely(&args);
    assert_eq!(again.stdout, out.stdout);
    assert_eq!(std::fs::read_to_string(&svg).unwrap(), doc);
}

#[test]
fn bad_flags_exit_2() {
    for (args, message) in [
        (
            vec!["--failure-rates", "1.5"],
            "--failure-rates values must be between 0.0 and 1.0, got 1.5",
        ),
        (vec!["--clients", "0"], "must be between 1 and 10000, got 0"),
        (vec!["--plot", "out.png"], "--plot writes SVG"),
        (
            vec!["--base-ms", "10", "--cap-ms", "5"],
            "--cap-ms (5) must be at least --base-ms (10)",
        ),
        (
            vec!["--clients", "5", "--clients-sweep", "1,2"],
            "cannot be used with",
        ),
    ] {
        let mut all = vec!["simulate"];
        all.extend(args.iter().copied());
        let out = oncely(&all);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
