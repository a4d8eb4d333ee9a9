//! A grant's name inside a session: its key and its holder.
//!
//! Reentrancy is per (session, holder, key): two holders of one session are two
//! grants, as two sessions' would be. The session, the renewer and the journal share
//! one string per grant, its *name*: the key itself for the holder `""` (the session,
//! and every raw client that names no holder: the common case costs nothing more), and
//! `key` NUL `holder` otherwise. Neither a key nor a holder may hold a control
//! character, so the first NUL splits a name without ambiguity. The journal writes
//! names into session records, so a resumed session gets each holder's grants back;
//! stores read a listed name's key with [`key_of`] to re-key the lock. Redis keeps a
//! holder in the same way after the client's name (`client_name` NUL `holder`), so an
//! exclusive lock stays one string whoever holds it.

use std::borrow::Cow;

/// What separates a key from its holder in a name.
const SEPARATOR: char = '\0';

/// The name of `holder`'s grant of `key`.
pub fn name<'a>(key: &'a str, holder: &str) -> Cow<'a, str> {
    if holder.is_empty() {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{key}{SEPARATOR}{holder}"))
    }
}

/// The name of `holder`'s grant of `key`, made of the key's own string for the
/// session itself: no copy on the common path.
pub fn into_name(key: String, holder: &str) -> String {
    if holder.is_empty() {
        key
    } else {
        format!("{key}{SEPARATOR}{holder}")
    }
}

/// A name's key and holder.
pub fn split(name: &str) -> (&str, &str) {
    name.split_once(SEPARATOR).unwrap_or((name, ""))
}

/// A name's key: what the store knows the lock by.
pub fn key_of(name: &str) -> &str {
    split(name).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_splits_back_into_its_key_and_holder() {
        assert_eq!(name("k", ""), "k");
        assert_eq!(into_name("k".into(), "t"), name("k", "t"));
        assert!(matches!(name("k", ""), Cow::Borrowed(_)));
        assert_eq!(split(&name("k", "thread-7")), ("k", "thread-7"));
        assert_eq!(split("k"), ("k", ""));
        assert_eq!(key_of(&name("a:b", "t")), "a:b");
    }
}
