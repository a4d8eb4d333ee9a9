//! How the masters' answers add up: the count a majority still has, a renewal a
//! majority made, one view of a lock from every master's view. Pure functions of the
//! answers, unit-tested here.

use crate::store::{HolderState, KeyState, Renewed, StoreError};

/// What the masters' answers to a hold or release of one grant decide so far.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Vote {
    /// Masters still to answer could change the outcome.
    Open,
    /// The answer: `Some(n > 0)`, the hold count a majority has; `Some(0)`, a majority
    /// had the grant and released it; `None`, fewer than a majority have it.
    Decided(Option<u32>),
    /// Too few masters answered, or can still answer, to tell (the number that did).
    NoQuorum(usize),
}

/// Counts the masters' answers to a hold or release of one grant (`answers` so far, of
/// `masters`). The count is the quorum-th largest of the per-master counts, a master
/// without the grant (`None`) or that failed counting 0: the largest count a majority
/// has. Never the maximum: one master's count (say 1, when the other masters answered
/// 0) is not a majority's, and answering it would let the session keep a grant the
/// majority no longer has while someone else is granted the key. Decided when the
/// masters still out cannot change the answer whatever they say.
pub(super) fn vote(
    answers: &[Result<Option<u32>, StoreError>],
    masters: usize,
    quorum: usize,
) -> Vote {
    let pending = masters.saturating_sub(answers.len());
    let ok = answers.iter().filter(|a| a.is_ok()).count();
    if ok + pending < quorum {
        return Vote::NoQuorum(ok);
    }
    let counts = || {
        answers.iter().map(|a| match a {
            Ok(Some(c)) => *c,
            Ok(None) | Err(_) => 0,
        })
    };
    let with_pending = |rest: u32| {
        quorum_th(counts().chain(std::iter::repeat_n(rest, pending)), quorum).unwrap_or(0)
    };
    let count = with_pending(0);
    if count != with_pending(u32::MAX) || ok < quorum {
        return Vote::Open;
    }
    if count > 0 {
        return Vote::Decided(Some(count));
    }
    let had = answers.iter().filter(|a| matches!(a, Ok(Some(_)))).count();
    if had >= quorum {
        Vote::Decided(Some(0))
    } else if had + pending < quorum {
        Vote::Decided(None)
    } else {
        Vote::Open
    }
}

/// What the masters' answers to a renewal batch mean for its grant `i`: `Some(true)`
/// when a majority extended it, `Some(false)` when the masters that did not refuse it
/// (including those that failed or have not answered) are fewer than a majority, so
/// none can exist, and `None` while too few answered to tell.
pub(super) fn renewal_vote(
    answers: &[Result<Vec<Renewed>, StoreError>],
    masters: usize,
    quorum: usize,
    i: usize,
) -> Option<bool> {
    let (mut extended, mut refused) = (0, 0);
    for answer in answers.iter().flatten() {
        match answer.get(i) {
            Some(Renewed::Extended) => extended += 1,
            Some(Renewed::NotHeld) => refused += 1,
            Some(Renewed::Failed(_)) | None => {}
        }
    }
    if extended >= quorum {
        Some(true)
    } else if masters - refused < quorum {
        Some(false)
    } else {
        None
    }
}

/// The `quorum`-th largest of the masters' values: what a majority has at least.
fn quorum_th<T: Ord>(values: impl Iterator<Item = T>, quorum: usize) -> Option<T> {
    let mut all: Vec<T> = values.collect();
    all.sort_unstable_by(|a, b| b.cmp(a));
    all.into_iter().nth(quorum.saturating_sub(1))
}

/// One view of a lock from the masters' views: the holders a majority knows (with the
/// token, the hold count and the value a majority has),
/// the largest counter, the first master's queue.
pub(super) fn merge(states: Vec<KeyState>, quorum: usize) -> KeyState {
    // A grant is one holder of one session: two holders of a session are two grants.
    let same =
        |a: &HolderState, b: &HolderState| a.session_id == b.session_id && a.holder == b.holder;
    let mut holders: Vec<HolderState> = Vec::new();
    for state in &states {
        for h in &state.holders {
            let known = states
                .iter()
                .filter(|s| s.holders.iter().any(|o| same(o, h)))
                .count();
            if known < quorum || holders.iter().any(|o| same(o, h)) {
                continue;
            }
            // The token a majority has (the quorum-th largest), which is the one the
            // grant answered: it was written back to the masters before the answer.
            // A master the acquire reached late made its own, larger one; it does not
            // decide (Describe and Watch would show a token the holder never got).
            let views = || {
                states
                    .iter()
                    .flat_map(|s| &s.holders)
                    .filter(|o| same(o, h))
            };
            let fence = quorum_th(views().map(|o| o.fence), quorum).unwrap_or(h.fence);
            // The value most masters have: a proclaim that reached a majority wins
            // over a master it has not reached yet.
            let mut values: Vec<(&Vec<u8>, usize)> = Vec::new();
            for o in views() {
                match values.iter_mut().find(|(v, _)| *v == &o.value) {
                    Some((_, n)) => *n += 1,
                    None => values.push((&o.value, 1)),
                }
            }
            let value = values
                .iter()
                .max_by_key(|(_, n)| *n)
                .map_or_else(|| h.value.clone(), |(v, _)| (*v).clone());
            // The hold count a majority has (the quorum-th largest), as holds and
            // releases answer it: a master a background call has not reached yet does
            // not decide.
            let hold_count =
                quorum_th(views().map(|o| o.hold_count), quorum).unwrap_or(h.hold_count);
            holders.push(HolderState {
                fence,
                value,
                hold_count,
                ..h.clone()
            });
        }
    }
    let fence = states.iter().map(|s| s.fence).max().unwrap_or_default();
    let first = states.into_iter().next().unwrap_or_default();
    KeyState {
        sharing: if holders.is_empty() {
            None
        } else {
            first.sharing
        },
        limit: if holders.is_empty() { 0 } else { first.limit },
        holders,
        fence,
        ..first
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn ok(count: Option<u32>) -> Result<Option<u32>, StoreError> {
        Ok(count)
    }

    fn down() -> Result<Option<u32>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }

    /// The vote on 3 masters (quorum 2) after `answers`.
    fn vote3(answers: Vec<Result<Option<u32>, StoreError>>) -> Vote {
        vote(&answers, 3, 2)
    }

    /// Issue 11: a reentrant hold reached master 0 only (count 2 there, 1 elsewhere) and
    /// the session releases its one hold with the old "one less" call: master 0 answers
    /// 1, master 1 answers 0. One master's 1 is not a majority's: the vote waits for
    /// master 2, and answers 0 unless master 2 also still has a hold.
    #[test]
    fn one_masters_count_is_not_a_majoritys() {
        assert_eq!(vote3(vec![ok(Some(1)), ok(Some(0))]), Vote::Open);
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), ok(Some(0))]),
            Vote::Decided(Some(0))
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), down()]),
            Vote::Decided(Some(0)),
            "a failed master does not count as holding"
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(Some(0)), ok(Some(1))]),
            Vote::Decided(Some(1))
        );
        assert_eq!(
            vote3(vec![ok(Some(1)), ok(None), down()]),
            Vote::Decided(None),
            "a majority answered and only one has the grant"
        );
    }

    /// Issue 11: holds that answer counts 3, 2, 2 leave 2 on a majority, not 3.
    #[test]
    fn the_count_is_the_quorum_th_largest() {
        assert_eq!(
            vote3(vec![ok(Some(3)), ok(Some(2)), ok(Some(2))]),
            Vote::Decided(Some(2))
        );
        assert_eq!(
            vote3(vec![ok(Some(3)), ok(Some(2))]),
            Vote::Open,
            "master 2 decides between 2 and 3"
        );
        assert_eq!(
            vote3(vec![ok(Some(2)), ok(Some(2))]),
            Vote::Decided(Some(2)),
            "nothing master 2 says changes the second largest"
        );
        assert_eq!(
            vote(
                &[ok(Some(3)), ok(Some(2)), ok(Some(2)), ok(Some(1)), ok(None)],
                5,
                3
            ),
            Vote::Decided(Some(2))
        );
    }

    /// Issue 11: with a master down, the two others decide; with two down, nothing is
    /// decided, and Some(0) is "released" only when a majority says so.
    #[test]
    fn a_master_down() {
        assert_eq!(
            vote3(vec![ok(Some(2)), down(), ok(Some(2))]),
            Vote::Decided(Some(2))
        );
        assert_eq!(vote3(vec![down(), ok(Some(2))]), Vote::Open);
        assert_eq!(vote3(vec![ok(Some(2)), down(), down()]), Vote::NoQuorum(1));
        assert_eq!(vote3(vec![down(), down()]), Vote::NoQuorum(0));
        assert_eq!(
            vote3(vec![ok(Some(0)), ok(Some(0))]),
            Vote::Decided(Some(0)),
            "released on a majority: no need to wait for the third"
        );
        assert_eq!(vote3(vec![ok(Some(0)), ok(None)]), Vote::Open);
        assert_eq!(vote3(vec![ok(None), ok(None)]), Vote::Decided(None));
        assert_eq!(
            vote3(vec![ok(Some(0)), ok(None), down()]),
            Vote::Decided(None)
        );
        assert_eq!(vote3(vec![ok(None), down()]), Vote::Open);
    }

    #[test]
    fn a_renewal_counts_per_grant() {
        let down = || Err(StoreError::Unavailable("down".into()));
        let failed = || Renewed::Failed(Arc::new(StoreError::Unavailable("node".into())));
        let (yes, no) = (Renewed::Extended, Renewed::NotHeld);
        // Three masters, quorum 2; per grant: [a, b, c, d].
        let answers = vec![
            Ok(vec![yes.clone(), no.clone(), yes.clone(), failed()]),
            Ok(vec![yes.clone(), no.clone(), no.clone(), yes.clone()]),
            down(),
        ];
        let vote = |i| renewal_vote(&answers, 3, 2, i);
        assert_eq!(vote(0), Some(true), "a majority renewed it");
        assert_eq!(vote(1), Some(false), "a majority refused it");
        assert_eq!(
            vote(2),
            None,
            "one each, the third unknown: too few to tell"
        );
        assert_eq!(
            vote(3),
            None,
            "one node of a master failed: too few to tell"
        );
        assert_eq!(renewal_vote(&[down(), down()], 3, 2, 0), None);
    }

    /// A reentrant hold or a proclaim answered by a majority may not have reached the
    /// last master yet: Describe shows what the majority has, whichever master answers
    /// first.
    #[test]
    fn a_view_shows_what_the_majority_has() {
        let state = |count: u32, value: &[u8]| KeyState {
            holders: vec![HolderState {
                session_id: "s".into(),
                client_name: String::new(),
                holder: String::new(),
                hold_count: count,
                ttl_remaining: std::time::Duration::from_secs(1),
                fence: 7,
                value: value.to_vec(),
            }],
            ..KeyState::default()
        };
        let merged = merge(
            vec![state(2, b"old"), state(3, b"new"), state(3, b"new")],
            2,
        );
        assert_eq!(merged.holders[0].hold_count, 3);
        assert_eq!(merged.holders[0].value, b"new");
        let merged = merge(
            vec![state(3, b"new"), state(2, b"old"), state(2, b"old")],
            2,
        );
        assert_eq!(
            merged.holders[0].hold_count, 2,
            "one master's count is not a majority's"
        );
    }

    /// The grant answered the token written back to a majority; a master the acquire
    /// reached after that made a larger one of its own, which Describe must not show.
    #[test]
    fn a_view_shows_the_token_the_grant_answered() {
        let state = |fence: u64| KeyState {
            holders: vec![HolderState {
                session_id: "s".into(),
                client_name: String::new(),
                holder: String::new(),
                hold_count: 1,
                ttl_remaining: std::time::Duration::from_secs(1),
                fence,
                value: Vec::new(),
            }],
            fence,
            ..KeyState::default()
        };
        let merged = merge(vec![state(9_000), state(7_000), state(7_000)], 2);
        assert_eq!(merged.holders[0].fence, 7_000);
    }
}
