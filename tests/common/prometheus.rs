//! A real Prometheus (Debian's `prometheus` package, which .ci/run installs) on a free
//! loopback port, scraping given targets every 200 ms and evaluating given rule files
//! as often; killed on drop, also when a test panics. Queried through its HTTP API,
//! the way Grafana and alert tooling read it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{PATIENCE, TempDir, free_port};

/// How often targets are scraped and rules evaluated: short, so a test sees a change
/// within a second, and still several samples inside any `rate()` window it uses.
pub const INTERVAL: &str = "200ms";

/// A `prometheus` server, killed on drop.
pub struct Prometheus {
    /// `127.0.0.1:PORT` of its HTTP API.
    pub addr: String,
    child: Option<Child>,
    dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus scraping `targets` (`HOST:PORT` of `/metrics`, job
    /// `lockside`) with `rule_files` loaded, and waits until it is ready.
    pub async fn start(targets: &[&str], rule_files: &[&Path]) -> Self {
        let dir = TempDir::new("prometheus");
        let quoted = |items: Vec<String>| {
            items
                .iter()
                .map(|i| format!("'{i}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let config = format!(
            "global:\n  scrape_interval: {INTERVAL}\n  scrape_timeout: {INTERVAL}\n  \
             evaluation_interval: {INTERVAL}\n\
             rule_files: [{}]\n\
             scrape_configs:\n  - job_name: lockside\n    static_configs:\n      \
             - targets: [{}]\n",
            quoted(rule_files.iter().map(|p| p.display().to_string()).collect()),
            quoted(targets.iter().map(|t| t.to_string()).collect()),
        );
        let config_file = dir.0.join("prometheus.yml");
        std::fs::write(&config_file, config).expect("write prometheus.yml");
        let mut prometheus = Self {
            addr: String::new(),
            child: None,
            dir,
        };
        // A port found free can be taken before Prometheus binds it: retry on failure.
        for _ in 0..5 {
            prometheus.addr = format!("127.0.0.1:{}", free_port());
            if prometheus.spawn(&config_file).await {
                return prometheus;
            }
        }
        panic!("prometheus did not start");
    }

    async fn spawn(&mut self, config_file: &Path) -> bool {
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={}", self.addr))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus must be installed (.ci/run installs Debian's prometheus)");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tokio::time::Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false; // port taken, most likely
            }
            if let Ok((200, _)) = get(&self.addr, "/-/ready").await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.kill();
        false
    }

    /// The `data` of an API answer to `GET path`, or why there is none (HTTP or
    /// PromQL errors, with Prometheus' own message).
    pub async fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = get(&self.addr, path).await?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("HTTP {status}: {e}: {body}"))?;
        match answer["status"].as_str() {
            Some("success") => Ok(answer["data"].clone()),
            _ => Err(format!("HTTP {status}: {body}")),
        }
    }

    /// The result of an instant query: one entry per series.
    pub async fn query(&self, promql: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The value of the single series `promql` selects, if it selects one.
    pub async fn value(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql).await.ok()?;
        match result.as_slice() {
            [series] => series["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Active alerts (pending or firing): (alertname, state).
    pub async fn alerts(&self) -> Vec<(String, String)> {
        let data = self.api("/api/v1/alerts").await.unwrap_or_default();
        data["alerts"]
            .as_array()
            .map(|alerts| {
                alerts
                    .iter()
                    .map(|a| {
                        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                        (text(&a["labels"]["alertname"]), text(&a["state"]))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Percent-encodes a query parameter.
pub fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A plain HTTP/1.0 GET (no chunked answers): (status, body).
pub async fn get(addr: &str, path: &str) -> Result<(u16, String), String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(PATIENCE, exchange)
        .await
        .map_err(|_| format!("GET {path}: no answer in time"))?
        .map_err(|e| format!("GET {path}: {e}"))?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("GET {path}: no status line"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}
