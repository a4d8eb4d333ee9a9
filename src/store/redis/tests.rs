//! Unit tests of the Redis store that need no server.

use super::*;

/// `acquire.lua` and `release.lua` publish on the lock's key with 'n' for its last
/// letter: that must be the channel the sidecar subscribes to.
#[tokio::test]
async fn scripts_make_the_channel_the_sidecar_listens_to() {
    let store = RedisStore::new("redis://127.0.0.1:1", "ns:a", Duration::from_secs(1))
        .expect("a lazy store");
    for key in ["orders/42", "a:b}c", ""] {
        let mut made = store.key(key, "h");
        made.replace_range(made.len() - 1.., "n");
        assert_eq!(made, store.notice_channel(key).0);
        assert_eq!(store.notice(key), format!("0{key}"));
    }
}
