//! The Redis servers the bench reads counters from and cleans up: the one server of a
//! `redis://` URL, or the masters among the seed nodes of a `redis+cluster://` URL
//! (replicas would count replicated writes twice and refuse deletes). Cluster figures
//! are summed over those masters, so give every master in the URL.

use deadpool_redis::redis::{self, Value, aio::MultiplexedConnection};

use super::context::err;

/// Plain connections to the data servers (masters) of the bench's store URL.
pub(crate) struct Servers(pub(crate) Vec<MultiplexedConnection>);

/// The plain `redis[s]://` URL of every node a store URL names.
fn node_urls(url: &str) -> Vec<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return vec![url.to_owned()];
    };
    let Some(base) = scheme.strip_suffix("+cluster") else {
        return vec![url.to_owned()];
    };
    let (auth, hosts) = match rest.rfind('@') {
        Some(at) => rest.split_at(at + 1),
        None => ("", rest),
    };
    hosts
        .trim_end_matches('/')
        .split(',')
        .map(|host| format!("{base}://{auth}{host}"))
        .collect()
}

impl Servers {
    /// Connects to every node of `url` and keeps the masters.
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let urls = node_urls(url);
        let cluster = urls.len() > 1 || url.contains("+cluster://");
        let mut masters = Vec::new();
        for node in urls {
            let client = redis::Client::open(node.as_str()).map_err(err("--redis"))?;
            let mut conn = client
                .get_multiplexed_async_connection()
                .await
                .map_err(err("connecting to Redis"))?;
            if cluster {
                let role: Vec<Value> = redis::cmd("ROLE")
                    .query_async(&mut conn)
                    .await
                    .map_err(err("ROLE"))?;
                if !matches!(role.first(), Some(Value::BulkString(r)) if r == b"master") {
                    continue;
                }
            }
            masters.push(conn);
        }
        if masters.is_empty() {
            return Err("--redis names no master".into());
        }
        Ok(Self(masters))
    }

    /// Deletes every key matching `pattern` on every server. One key per UNLINK: a
    /// Cluster refuses multi-key commands across slots.
    pub(crate) async fn unlink_matching(&mut self, pattern: &str) -> Result<(), String> {
        for conn in &mut self.0 {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = scan_page(conn, cursor, pattern).await?;
                if !keys.is_empty() {
                    let mut pipe = redis::pipe();
                    for key in &keys {
                        pipe.cmd("UNLINK").arg(key).ignore();
                    }
                    pipe.query_async::<()>(conn)
                        .await
                        .map_err(err("cleanup UNLINK"))?;
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }

    /// Keys matching `pattern` on every server. Keys whose TTL has passed are not
    /// counted: SCAN drops them when it meets them.
    pub(crate) async fn count_matching(&mut self, pattern: &str) -> Result<u64, String> {
        let mut total = 0;
        for conn in &mut self.0 {
            let mut cursor = 0u64;
            loop {
                let (next, keys) = scan_page(conn, cursor, pattern).await?;
                total += keys.len() as u64;
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(total)
    }
}

/// One page of `SCAN cursor MATCH pattern`: the next cursor (0 at the end) and the keys.
async fn scan_page(
    conn: &mut MultiplexedConnection,
    cursor: u64,
    pattern: &str,
) -> Result<(u64, Vec<String>), String> {
    let page = redis::cmd("SCAN")
        .arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000)
        .query_async(conn)
        .await;
    page.map_err(err("SCAN"))
}

#[cfg(test)]
mod tests {
    // Run by tests/bench_units.rs; the bench target itself has no harness, so there
    // the tests below are compiled out and this import goes unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn cluster_urls_name_every_node() {
        assert_eq!(node_urls("redis://h:1"), ["redis://h:1"]);
        assert_eq!(
            node_urls("rediss+cluster://u:p@a:1,b:2/"),
            ["rediss://u:p@a:1", "rediss://u:p@b:2"]
        );
    }
}
