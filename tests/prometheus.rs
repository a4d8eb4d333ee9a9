//! The operator's kit against a real Prometheus (`deploy/observability/`): Prometheus
//! scrapes a live sidecar and evaluates the alert rules; a lock lost under a real
//! `Lease` stream moves the lost series and fires the lost-locks alert; every query of
//! the Grafana dashboard runs on that Prometheus and names only metrics the sidecar
//! exports; the PrometheusRule carries exactly the rules file.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::prometheus::{self, Prometheus};
use common::{PATIENCE, Redis, Sidecar, StoreKind, make_store, namespace, secs};
use lockside::proto::{self, lease_response::Event};
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
    assert_eq!(rules.len(), 7, "{groups}");
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
