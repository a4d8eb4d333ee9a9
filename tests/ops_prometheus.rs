//! The operator's kit against a real Prometheus (`deploy/observability/`): Prometheus
//! scrapes a live sidecar and evaluates the alert rules; a lock lost under a real
//! `Lease` stream moves the lost series and fires the lost-locks alert; every query of
//! the Grafana dashboard runs on that Prometheus and names only metrics the sidecar
//! exports; the PrometheusRule carries exactly the rules file. The rules' promtool
//! tests feed only series a sidecar exports, and a sidecar whose renewals are slow at
//! the default TTL, scraped, fires `LocksideRenewalsSlow` in promtool.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::prometheus::{self, Prometheus};
use common::proxy::{Fault, Proxy};
use common::{PATIENCE, Redis, Sidecar, StoreKind, TempDir, make_store, namespace, secs};
use lockside::proto::{self, lease_response::Event};
use lockside::store::redis::{RedisOptions, RedisStore};
use serde_json::Value;

fn kit(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/observability")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(kit(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Polls `check` until it gives a value: Prometheus is the system under test here, and
/// scrapes and evaluates on its own schedule (every 200 ms).
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + 2 * PATIENCE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names a scrape of the sidecar shows: every sample's name (`..._bucket`,
/// `..._total`) and every family's (`# TYPE` lines).
async fn exported_names(admin: &str) -> BTreeSet<String> {
    let (status, text) = prometheus::get(admin, "/metrics").await.expect("scrape");
    assert_eq!(status, 200);
    text.lines()
        .filter_map(|line| match line.strip_prefix("# TYPE ") {
            Some(family) => family.split(' ').next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        })
        .map(str::to_owned)
        .collect()
}

/// Every `lockside_...` metric name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("lockside_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_moves_the_series_and_fires_the_alert() {
    let mut redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let rules = kit("lockside-rules.yaml");
    let prometheus = Prometheus::start(&[&sidecar.admin], &[&rules]).await;
    let deadline_lost = "lockside_lost_total{job=\"lockside\",reason=\"deadline\"}";
    eventually("the sidecar scraped, nothing lost yet", || async {
        (prometheus.value(deadline_lost).await == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(prometheus.value("up{job=\"lockside\"}").await, Some(1.0));
    assert!(prometheus.alerts().await.is_empty());

    // A lock with a 1 s TTL, held through a real Lease stream, and its store killed.
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    let id = lease
        .send_acquire(proto::Acquire {
            ttl: Some(secs(1.0)),
            ..common::acquire("orders")
        })
        .await;
    lease.expect_granted(id).await;
    redis.kill();
    let lost = loop {
        match lease.next().await {
            Event::Jeopardy(_) => continue,
            Event::Lost(lost) => break lost,
            other => panic!("expected Jeopardy then Lost, got {other:?}"),
        }
    };
    assert!(lost.reason.contains("safe deadline"), "{}", lost.reason);

    // Prometheus sees the series move and the alert go off.
    let value = eventually("the lost series moved", || async {
        prometheus.value(deadline_lost).await.filter(|v| *v >= 1.0)
    })
    .await;
    assert_eq!(value, 1.0);
    let alerts = eventually("LocksideLockLost and LocksideStoreUnreachable", || async {
        let alerts = prometheus.alerts().await;
        let has = |name: &str, states: &[&str]| {
            alerts
                .iter()
                .any(|(n, s)| n == name && states.contains(&s.as_str()))
        };
        let both = has("LocksideLockLost", &["pending", "firing"])
            // `for: 1m`: pending for now.
            && has("LocksideStoreUnreachable", &["pending"]);
        both.then_some(alerts)
    })
    .await;
    // Jeopardy came before the loss; nothing else is wrong (the store-error ratio
    // leaves an unreachable store to LocksideStoreUnreachable).
    let expected = [
        "LocksideLockLost",
        "LocksideStoreUnreachable",
        "LocksideRenewalsInJeopardy",
    ];
    assert!(
        alerts
            .iter()
            .all(|(name, _)| expected.contains(&name.as_str())),
        "no other alert: {alerts:?}"
    );

    // Every rule evaluated on real series without an error (vector matching, labels).
    let groups = prometheus.api("/api/v1/rules").await.expect("rules");
    let rules: Vec<&Value> = groups["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(rules.len(), 9, "{groups}");
    for rule in rules {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
}

/// Every panel of the dashboard, those inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn children(panel: &Value) -> impl Iterator<Item = &Value> {
        panel["panels"].as_array().into_iter().flatten()
    }
    let mut todo: Vec<&Value> = children(dashboard).collect();
    let mut all = Vec::new();
    while let Some(panel) = todo.pop() {
        todo.extend(children(panel));
        all.push(panel);
    }
    all
}

/// Every expression of the dashboard, with Grafana's variables as Grafana would set
/// them for "All".
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default().to_owned();
            let expr = target["expr"].as_str().expect("every target has an expr");
            let expr = expr
                .replace("$__rate_interval", "5s")
                .replace("$__range", "1m")
                .replace("$job", ".*")
                .replace("$instance", ".*");
            assert!(!expr.contains('$'), "a variable left in {title}: {expr}");
            queries.push((title, expr));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_the_rules_query_only_what_the_sidecar_exports() {
    let dashboard: Value =
        serde_json::from_str(&read("lockside-dashboard.json")).expect("the dashboard is JSON");
    // Importable as it is: a schema version, a data source variable every panel and
    // query uses, unique panel ids.
    assert!(dashboard["schemaVersion"].as_u64() >= Some(36));
    assert_eq!(dashboard["uid"], "lockside");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(variables.iter().any(|v| v["name"] == "datasource"
        && v["type"] == "datasource"
        && v["query"] == "prometheus"));
    let text = dashboard.to_string();
    assert!(
        !text.contains("DS_PROMETHEUS"),
        "one way to pick the data source"
    );
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "{panel}");
        if panel["type"] != "row" {
            assert_eq!(panel["datasource"]["uid"], "${datasource}", "{panel}");
            for target in panel["targets"].as_array().expect("targets") {
                assert_eq!(target["datasource"]["uid"], "${datasource}");
            }
        }
    }

    let redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let exported = exported_names(&sidecar.admin).await;
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    let used: BTreeSet<String> = queries.iter().flat_map(|(_, q)| names_in(q)).collect();
    let unknown: Vec<_> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard names {unknown:?}, not exported"
    );
    let unknown: Vec<_> = names_in(&read("lockside-rules.yaml"))
        .into_iter()
        .filter(|n| !exported.contains(n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the rules name {unknown:?}, not exported"
    );

    // Some traffic, so that rates and quantiles have something to show.
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    lease.grant("k").await;
    lease.release("k").await;
    let prometheus = Prometheus::start(&[&sidecar.admin], &[]).await;
    eventually("a few scrapes", || async {
        let samples = prometheus
            .value("count_over_time(up{job=\"lockside\"}[1m])")
            .await?;
        (samples >= 5.0).then_some(())
    })
    .await;
    for (title, expr) in &queries {
        let result = prometheus
            .query(expr)
            .await
            .unwrap_or_else(|e| panic!("panel {title:?}: {expr}: {e}"));
        assert!(!result.is_empty(), "panel {title:?}: no series for {expr}");
    }
}

#[test]
fn the_prometheus_rule_carries_the_rules_file() {
    let manifest = read("prometheusrule.yaml");
    let (head, spec) = manifest
        .split_once("\nspec:\n")
        .expect("a PrometheusRule with a spec");
    assert!(head.contains("kind: PrometheusRule"));
    let indented: String = read("lockside-rules.yaml")
        .lines()
        .map(|line| match line {
            "" => "\n".to_owned(),
            line => format!("  {line}\n"),
        })
        .collect();
    assert!(
        spec == indented,
        "prometheusrule.yaml is out of date: regenerate it from lockside-rules.yaml \
         (deploy/observability/README.md, \"Checks\")"
    );
}

/// One series as `name{labels}`, its labels parsed: `{a="1",le="+Inf"}`.
fn parse_series(text: &str) -> (String, BTreeMap<String, String>) {
    let (name, rest) = text.split_once('{').unwrap_or((text, "}"));
    let mut labels = BTreeMap::new();
    let mut rest = rest.trim_end_matches('}');
    while let Some((key, value)) = rest.split_once("=\"") {
        let (value, after) = value.split_once('"').expect("a quoted label value");
        labels.insert(key.trim().to_owned(), value.to_owned());
        rest = after.trim_start_matches(',');
    }
    (name.trim().to_owned(), labels)
}

/// The samples of a scrape: (series, value), in order, and each family's type.
fn samples(scrape: &str) -> (Vec<(String, String)>, BTreeMap<String, String>) {
    let mut samples = Vec::new();
    let mut types = BTreeMap::new();
    for line in scrape.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let (name, kind) = family.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_owned(), kind.to_owned());
        } else if !line.starts_with('#') && !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').expect("a sample");
            samples.push((series.to_owned(), value.to_owned()));
        }
    }
    (samples, types)
}

/// Issue 26: a rule tested on series the sidecar never exports (a bucket it does not
/// have, a label value it never sets) proves nothing. Every input series of the rules'
/// promtool tests is one a scrape shows, `le` and every label included, but the
/// labels a scrape adds (`instance`, `job`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rules_tests_feed_only_series_the_sidecar_exports() {
    let redis = Redis::start();
    let sidecar = Sidecar::start(make_store(&StoreKind::Redis(redis.url()), &namespace())).await;
    let (status, scrape) = prometheus::get(&sidecar.admin, "/metrics")
        .await
        .expect("scrape");
    assert_eq!(status, 200);
    let exported: BTreeSet<_> = (samples(&scrape).0.iter())
        .map(|(series, _)| parse_series(series))
        .collect();
    let tests = std::fs::read_dir(kit("tests")).expect("deploy/observability/tests");
    let mut fed = 0;
    for file in tests {
        let text = std::fs::read_to_string(file.expect("a test file").path()).expect("read");
        for line in text.lines() {
            let Some(series) = line.trim().strip_prefix("- series: '") else {
                continue;
            };
            let (name, mut labels) = parse_series(series.trim_end_matches('\''));
            for scraper in ["instance", "job"] {
                assert!(
                    labels.remove(scraper).is_some(),
                    "a scrape's {scraper}: {line}"
                );
            }
            assert!(
                exported.contains(&(name.clone(), labels.clone())),
                "the rules' tests feed {name}{labels:?}, which no sidecar exports"
            );
            fed += 1;
        }
    }
    assert!(fed >= 30, "{fed} series");
}

/// Issue 26: renewals slower than half their period at the default TTL (10 s: batches
/// of over 1.67 s) fire `LocksideRenewalsSlow`. A sidecar's renewals go through a proxy
/// that delays every byte by a second each way; its scrape becomes promtool's input
/// series (counters growing by their value a minute, gauges as they are), and promtool
/// evaluates the shipped rules on them. Before the renewal buckets reached past the
/// threshold, the p99 stopped at 1.6384 s and the alert could not fire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_renewals_at_the_default_ttl_fire_the_renewals_slow_alert() {
    let redis = Redis::start();
    let proxy = Proxy::start(redis.port).await;
    let options = RedisOptions {
        // Past the slow round trips: they are slow, not failing.
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    };
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let store = RedisStore::with_options(&url, &namespace(), &options).expect("a store");
    let sidecar = Sidecar::start(Arc::new(store)).await;
    let client = sidecar.client().await;
    let mut lease = client.lease().await;
    // The default TTL: renewed every 3.3 s, "slow" above 1.67 s.
    lease.grant("k").await;
    proxy.both(Fault::Latency(Duration::from_secs(1)));
    let scrape = eventually("a renewal observed", || async {
        let (_, text) = prometheus::get(&sidecar.admin, "/metrics").await.ok()?;
        let renewed = text
            .lines()
            .any(|l| l.starts_with("lockside_renewal_seconds_count ") && !l.ends_with(" 0"));
        renewed.then_some(text)
    })
    .await;
    assert!(
        scrape.contains("lockside_renewal_seconds_bucket{le=\"1.6384\"} 0\n"),
        "the renewal took over 1.6 s:\n{scrape}"
    );

    let (samples, types) = samples(&scrape);
    let mut input = String::new();
    for (series, value) in &samples {
        let (name, _) = parse_series(series);
        let family = ["_total", "_bucket", "_count", "_sum", "_created"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .filter(|family| types.contains_key(*family))
            .unwrap_or(&name);
        let cumulative = matches!(
            types.get(family).map(String::as_str),
            Some("counter" | "histogram")
        );
        let labelled = match series.split_once('{') {
            Some((name, labels)) => format!("{name}{{{},", labels.trim_end_matches('}')),
            None => format!("{series}{{"),
        };
        let values = if cumulative {
            format!("0+{value}x40")
        } else {
            format!("{value}x40")
        };
        input.push_str(&format!(
            "      - series: '{labelled}instance=\"sidecar:7421\",job=\"lockside\"}}'\n        values: '{values}'\n"
        ));
    }
    let dir = TempDir::new("promtool");
    let test = dir.0.join("slow-renewals.yaml");
    std::fs::write(
        &test,
        format!(
            "rule_files:\n  - {}\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{input}    promql_expr_test:\n      - expr: count by (alertname, alertstate, instance) (ALERTS{{alertname=\"LocksideRenewalsSlow\"}})\n        eval_time: 30m\n        exp_samples:\n          - labels: '{{alertname=\"LocksideRenewalsSlow\", alertstate=\"firing\", instance=\"sidecar:7421\"}}'\n            value: 1\n",
            kit("lockside-rules.yaml").display()
        ),
    )
    .expect("write the promtool test");
    let out = std::process::Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .expect("promtool (Debian's prometheus package) must be installed");
    assert!(
        out.status.success(),
        "LocksideRenewalsSlow did not fire on the scraped series:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
