//! The URL of a Redlock store: `redlock://[user:pass@]h1:p1,h2:p2,...[/db]`.

use crate::store::StoreError;

/// The masters of `redlock://[user:pass@]h1:p1,h2:p2,...[/db]`, as `redis://` URLs that
/// share the credentials and the database.
pub fn master_urls(url: &str) -> Result<Vec<String>, StoreError> {
    let config = |m: &str| StoreError::Config(m.to_owned());
    let rest = url
        .strip_prefix("redlock://")
        .ok_or_else(|| config("a Redlock URL starts with redlock://"))?;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (format!("{auth}@"), hosts),
        None => (String::new(), rest),
    };
    let (hosts, db) = match rest.split_once('/') {
        Some((hosts, db)) => (hosts, format!("/{db}")),
        None => (rest, String::new()),
    };
    let urls: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("redis://{auth}{h}{db}"))
        .collect();
    if urls.len() < 3 {
        return Err(config(
            "Redlock needs at least 3 independent masters (with fewer, one failure stops all grants)",
        ));
    }
    Ok(urls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_share_credentials_and_database() {
        let urls = master_urls("redlock://u:p@a:1,b:2, c:3/2").expect("valid");
        assert_eq!(
            urls,
            [
                "redis://u:p@a:1/2",
                "redis://u:p@b:2/2",
                "redis://u:p@c:3/2"
            ]
        );
        assert!(
            master_urls("redlock://a:1,b:2").is_err(),
            "two masters are too few"
        );
        assert!(master_urls("redis://a:1").is_err());
    }
}
