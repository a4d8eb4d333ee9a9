//! Unit tests of the metrics: names, labels and what a scrape shows.
use super::*;

fn render() -> String {
    let metrics = Metrics::new(Sidecar {
        store_kind: "memory",
        default_ttl: Duration::from_secs(10),
        max_sessions: 10,
    });
    metrics.render(true).expect("render")
}

#[test]
fn every_metric_has_help_and_every_label_value_is_snake_case() {
    let text = render();
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).expect("a name");
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "{name} has no HELP"
        );
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((_, labels)) = line.split_once('{') else {
            continue;
        };
        let labels = labels.split('}').next().unwrap_or_default();
        for pair in labels.split(',') {
            let (key, value) = pair.split_once('=').expect("key=value");
            let value = value.trim_matches('"');
            if key == "le" || key == "version" {
                continue;
            }
            assert!(
                value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{line}"
            );
        }
    }
}

#[test]
fn labelled_series_exist_at_zero_from_the_start() {
    let text = render();
    for series in [
        "lockside_acquires_total{outcome=\"timeout\"} 0",
        "lockside_renewals_total{result=\"not_held\"} 0",
        "lockside_lost_total{reason=\"deadline\"} 0",
        "lockside_store_calls_total{operation=\"unwait\",result=\"protocol\"} 0",
        "lockside_store_call_seconds_count{operation=\"ping\"} 0",
        "lockside_build_info{version=\"",
        "lockside_default_ttl_seconds 10.0",
        "lockside_sessions_limit 10",
        "lockside_ready 1",
        "# UNIT lockside_acquire_wait_seconds seconds",
    ] {
        assert!(text.contains(series), "no {series} in\n{text}");
    }
}

#[test]
fn a_store_call_is_counted_by_operation_and_result() {
    let metrics = Metrics::new(Sidecar {
        store_kind: "memory",
        default_ttl: Duration::from_secs(10),
        max_sessions: 10,
    });
    let calls = metrics.store_calls();
    calls.record(Operation::Renew, Duration::from_millis(3), None);
    calls.record(
        Operation::Renew,
        Duration::from_millis(3),
        Some("unavailable"),
    );
    calls.record(
        Operation::Renew,
        Duration::from_millis(3),
        Some("something new"),
    );
    let text = metrics.render(false).expect("render");
    for series in [
        "lockside_store_calls_total{operation=\"renew\",result=\"ok\"} 1",
        "lockside_store_calls_total{operation=\"renew\",result=\"unavailable\"} 2",
        "lockside_store_call_seconds_count{operation=\"renew\"} 3",
        "lockside_ready 0",
    ] {
        assert!(text.contains(series), "no {series} in\n{text}");
    }
}

/// The largest finite bound of a histogram in a scrape.
fn top_bucket(text: &str, histogram: &str) -> f64 {
    let prefix = format!("{histogram}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            l.strip_prefix(&prefix)?
                .split('"')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .filter(|le| le.is_finite())
        .fold(0.0, f64::max)
}

/// Issue 26: a quantile never exceeds the largest finite bucket, so the buckets must
/// reach past every threshold the alert rules use: half the renewal period (TTL/6) at
/// the default TTL and at the longest (1 h), and the longest wait a client may ask
/// for, but for its last hours.
#[test]
fn histograms_reach_past_the_thresholds_of_the_alert_rules() {
    let text = render();
    let renewal = top_bucket(&text, "lockside_renewal_seconds");
    for ttl in [10.0, 3600.0] {
        assert!(
            renewal > ttl / 6.0,
            "renewals: {renewal} s for a {ttl} s TTL"
        );
    }
    let wait = top_bucket(&text, "lockside_acquire_wait_seconds");
    assert!(wait > 3600.0, "acquire waits: {wait} s");
}
