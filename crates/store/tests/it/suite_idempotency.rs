//! Creates' idempotency keys (run by `store_tests!` like `suite`): one claim per (team, key),
//! completed or released by its token only, refused for another request, taken over once
//! abandoned, forgotten after its TTL, and won by exactly one of several racing stores.

use std::sync::Arc;
use std::time::Duration;

use bulkhead_store::{ClaimOutcome, IdempotencyClaim, Store};

use crate::harness::Harness;

const T0: i64 = 1_800_000_000_000;
const CLAIM_TTL: Duration = Duration::from_secs(10);
const KEY_TTL: Duration = Duration::from_secs(24 * 3600);

fn claim<'a>(
    team: &'a str,
    key: &'a str,
    fp: &'a str,
    token: &'a str,
    now_ms: i64,
) -> IdempotencyClaim<'a> {
    IdempotencyClaim {
        team_id: team,
        key,
        fingerprint: fp,
        token,
        now_ms,
        claim_ttl: CLAIM_TTL,
        key_ttl: KEY_TTL,
    }
}

pub async fn idempotency_claim_complete_and_mismatch(h: &Harness) {
    let s = &h.store;
    assert_eq!(
        s.claim_idempotency_key(&claim("t1", "k", "fp-a", "tok-1", T0))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let row = s.get_idempotency_key("t1", "k").await.unwrap().unwrap();
    assert_eq!(
        (
            row.token.as_str(),
            row.sandbox_id.as_deref(),
            row.fingerprint.as_str()
        ),
        ("tok-1", None, "fp-a")
    );
    assert_eq!(row.claim_expires_at, T0 + 10_000);
    assert_eq!(row.expires_at, T0 + 24 * 3_600_000);

    // The same request while the first is creating waits; another request is refused.
    assert_eq!(
        s.claim_idempotency_key(&claim("t1", "k", "fp-a", "tok-2", T0 + 1))
            .await
            .unwrap(),
        ClaimOutcome::InProgress {
            claim_expires_at: T0 + 10_000
        }
    );
    assert_eq!(
        s.claim_idempotency_key(&claim("t1", "k", "fp-b", "tok-3", T0 + 1))
            .await
            .unwrap(),
        ClaimOutcome::Mismatch
    );
    // Keys are per team: another team's same key is its own.
    assert_eq!(
        s.claim_idempotency_key(&claim("t2", "k", "fp-b", "tok-4", T0 + 1))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );

    // Only the holder completes.
    assert!(
        !s.complete_idempotency_key("t1", "k", "tok-2", "sbx-wrong")
            .await
            .unwrap()
    );
    assert!(
        s.complete_idempotency_key("t1", "k", "tok-1", "sbx-1")
            .await
            .unwrap()
    );
    // Once: a second completion (or a late release) changes nothing.
    assert!(
        !s.complete_idempotency_key("t1", "k", "tok-1", "sbx-2")
            .await
            .unwrap()
    );
    assert!(!s.release_idempotency_key("t1", "k", "tok-1").await.unwrap());
    for now in [T0 + 2, T0 + 60_000] {
        // Also after the claim's TTL: a completed key is never taken over.
        assert_eq!(
            s.claim_idempotency_key(&claim("t1", "k", "fp-a", "tok-5", now))
                .await
                .unwrap(),
            ClaimOutcome::Completed {
                sandbox_id: "sbx-1".into()
            }
        );
        assert_eq!(
            s.claim_idempotency_key(&claim("t1", "k", "fp-b", "tok-6", now))
                .await
                .unwrap(),
            ClaimOutcome::Mismatch
        );
    }
    let row = s.get_idempotency_key("t1", "k").await.unwrap().unwrap();
    assert_eq!(
        (row.token.as_str(), row.sandbox_id.as_deref()),
        ("tok-1", Some("sbx-1"))
    );
}

pub async fn idempotency_release_and_abandoned_claims(h: &Harness) {
    let s = &h.store;
    // A failed create releases the key: the next attempt claims it, with any request.
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "k", "fp-a", "tok-1", T0))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    assert!(!s.release_idempotency_key("t", "k", "tok-x").await.unwrap());
    assert!(s.release_idempotency_key("t", "k", "tok-1").await.unwrap());
    assert_eq!(s.get_idempotency_key("t", "k").await.unwrap(), None);
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "k", "fp-b", "tok-2", T0 + 1))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );

    // A renewed claim holds past its first deadline; one left alone lapses and is taken over.
    assert!(
        s.renew_idempotency_claim("t", "k", "tok-2", T0 + 15_000)
            .await
            .unwrap()
    );
    assert!(
        !s.renew_idempotency_claim("t", "k", "tok-x", T0 + 99_000)
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "k", "fp-b", "tok-3", T0 + 12_000))
            .await
            .unwrap(),
        ClaimOutcome::InProgress {
            claim_expires_at: T0 + 15_000
        }
    );
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "k", "fp-b", "tok-3", T0 + 15_000))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    // The attempt that lost its claim can neither complete, renew nor release it.
    assert!(
        !s.complete_idempotency_key("t", "k", "tok-2", "sbx-late")
            .await
            .unwrap()
    );
    assert!(
        !s.renew_idempotency_claim("t", "k", "tok-2", T0 + 99_000)
            .await
            .unwrap()
    );
    assert!(!s.release_idempotency_key("t", "k", "tok-2").await.unwrap());
    assert!(
        s.complete_idempotency_key("t", "k", "tok-3", "sbx-3")
            .await
            .unwrap()
    );
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "k", "fp-b", "tok-4", T0 + 16_000))
            .await
            .unwrap(),
        ClaimOutcome::Completed {
            sandbox_id: "sbx-3".into()
        }
    );
}

pub async fn idempotency_keys_expire(h: &Harness) {
    let s = &h.store;
    let day = 24 * 3_600_000;
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        let now = T0 + i as i64 * 1000;
        assert_eq!(
            s.claim_idempotency_key(&claim("t", key, "fp", "tok", now))
                .await
                .unwrap(),
            ClaimOutcome::Claimed
        );
        assert!(
            s.complete_idempotency_key("t", key, "tok", &format!("sbx-{key}"))
                .await
                .unwrap()
        );
    }
    // Until its TTL a key answers with its sandbox; from then on it is free again, even for
    // another request, before any cleanup ran.
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "a", "fp", "tok-2", T0 + day - 1))
            .await
            .unwrap(),
        ClaimOutcome::Completed {
            sandbox_id: "sbx-a".into()
        }
    );
    assert_eq!(
        s.claim_idempotency_key(&claim("t", "a", "fp-new", "tok-2", T0 + day))
            .await
            .unwrap(),
        ClaimOutcome::Claimed
    );
    let row = s.get_idempotency_key("t", "a").await.unwrap().unwrap();
    assert_eq!(
        (row.sandbox_id, row.fingerprint.as_str(), row.expires_at),
        (None, "fp-new", T0 + 2 * day)
    );
    // Cleanup deletes exactly the expired ones: "b" (claimed at T0 + 1 s), not "c" (+2 s).
    assert_eq!(
        s.delete_expired_idempotency_keys(T0 + day).await.unwrap(),
        0
    );
    assert_eq!(
        s.delete_expired_idempotency_keys(T0 + day + 1000)
            .await
            .unwrap(),
        1
    );
    assert_eq!(s.get_idempotency_key("t", "b").await.unwrap(), None);
    assert!(s.get_idempotency_key("t", "c").await.unwrap().is_some());
    assert!(s.get_idempotency_key("t", "a").await.unwrap().is_some());
}

/// Callers on separate pools (as separate replicas) race for one key: one claims it, the
/// others see it in progress.
pub async fn idempotency_race_has_one_winner(h: &Harness) {
    const STORES: usize = 4;
    const PER_STORE: usize = 4;
    let mut stores: Vec<Store> = Vec::new();
    for _ in 0..STORES {
        stores.push(Store::open(&h.url).await.expect("reopen the store"));
    }
    for round in 0..3_i64 {
        let key = format!("race-{round}");
        let n = STORES * PER_STORE;
        let barrier = Arc::new(tokio::sync::Barrier::new(n));
        let mut tasks = Vec::new();
        for i in 0..n {
            let (s, barrier, key) = (stores[i % STORES].clone(), barrier.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                // Connect before the start line, so the race is between queries.
                s.get_idempotency_key("t", "warm-up").await.unwrap();
                barrier.wait().await;
                let token = format!("tok-{i}");
                let got = s
                    .claim_idempotency_key(&claim("t", &key, "fp", &token, T0))
                    .await
                    .unwrap();
                (token, got)
            }));
        }
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap());
        }
        let winners: Vec<_> = got
            .iter()
            .filter(|(_, o)| *o == ClaimOutcome::Claimed)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {got:?}");
        assert!(
            got.iter()
                .all(|(_, o)| matches!(o, ClaimOutcome::Claimed | ClaimOutcome::InProgress { .. })),
            "{got:?}"
        );
        let row = h
            .store
            .get_idempotency_key("t", &key)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.token, winners[0].0);
    }
    for s in stores {
        s.close().await;
    }
}
