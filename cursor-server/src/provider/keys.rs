//! A provider's keys at run time: which key each call attempt uses (the fewest calls in flight
//! among the keys not cooling down), how long a key the provider turned away (HTTP 429, 401) is
//! left out, and the lease that counts a call in flight until the call ends.
//!
//! One pool per provider, built once at start (`KeyPools`, in `AppState`) and shared by every run,
//! so that concurrent runs spread over the keys and all see a key's cooldown. Choosing a key is
//! O(keys) under one short lock, once per call attempt; nothing here runs per streamed event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use crate::config::{Config, KeyCooldown, ProviderConfig, Secret};

/// Every configured provider's pool, by provider name.
pub struct KeyPools {
    pools: HashMap<String, Arc<KeyPool>>,
    cooldown: KeyCooldown,
}

impl KeyPools {
    pub fn new(config: &Config) -> KeyPools {
        let pools = config
            .providers
            .iter()
            .map(|p| (p.name.clone(), KeyPool::new(p, config.key_cooldown)))
            .collect();
        KeyPools {
            pools,
            cooldown: config.key_cooldown,
        }
    }

    /// How many keys of each provider are cooling down now (for `/metrics`).
    pub fn cooling(&self) -> Vec<(String, usize)> {
        let mut cooling: Vec<(String, usize)> = self
            .pools
            .iter()
            .map(|(name, pool)| {
                let count = pool.status().iter().filter(|k| k.cooling.is_some()).count();
                (name.clone(), count)
            })
            .collect();
        cooling.sort();
        cooling
    }

    /// The pool of `provider`. A provider the server was not started with (none today) gets a
    /// pool of its own, so a call never goes without a key.
    pub fn get(&self, provider: &ProviderConfig) -> Arc<KeyPool> {
        match self.pools.get(&provider.name) {
            Some(pool) => Arc::clone(pool),
            None => KeyPool::new(provider, self.cooldown),
        }
    }
}

/// The keys of one provider and what each is doing.
pub struct KeyPool {
    provider: String,
    secrets: Vec<Secret>,
    cooldown: KeyCooldown,
    state: Mutex<PoolState>,
}

struct PoolState {
    keys: Vec<KeyState>,
    /// Where the next tie-break starts: equal loads go round-robin, so sequential calls alternate.
    next: usize,
}

#[derive(Clone, Copy, Default)]
struct KeyState {
    in_flight: u32,
    /// Until when the key is left out, and the status that put it there.
    cooling: Option<(Instant, u16)>,
}

/// One key as the console and `/metrics` show it (never the key itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyStatus {
    pub in_flight: u32,
    /// Time left in the cooldown, and the HTTP status that caused it.
    pub cooling: Option<(Duration, u16)>,
}

impl KeyPool {
    pub fn new(provider: &ProviderConfig, cooldown: KeyCooldown) -> Arc<KeyPool> {
        Arc::new(KeyPool {
            provider: provider.name.clone(),
            secrets: provider.keys.iter().map(|k| k.secret.clone()).collect(),
            cooldown,
            state: Mutex::new(PoolState {
                keys: vec![KeyState::default(); provider.keys.len()],
                next: 0,
            }),
        })
    }

    pub fn len(&self) -> usize {
        self.secrets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key with the fewest calls in flight among those not cooling down (ties: the next one
    /// round-robin), counted in flight until the lease drops; `None` when every key is cooling.
    pub fn acquire_free(self: &Arc<Self>) -> Option<KeyLease> {
        let now = Instant::now();
        let mut state = self.lock();
        let n = state.keys.len();
        let mut best: Option<(usize, u32)> = None;
        for offset in 0..n {
            let index = (state.next + offset) % n;
            let key = &mut state.keys[index];
            if key.cooling.is_some_and(|(until, _)| until <= now) {
                key.cooling = None;
            }
            if key.cooling.is_some() {
                continue;
            }
            if best.is_none_or(|(_, load)| key.in_flight < load) {
                best = Some((index, key.in_flight));
            }
        }
        let (index, _) = best?;
        state.next = (index + 1) % n;
        Some(self.lease(&mut state, index))
    }

    /// A free key if there is one, else the key whose cooldown ends first (a call that has waited
    /// for it, or the only key of a provider: one key is always tried, as before keys had pools).
    pub fn acquire_any(self: &Arc<Self>) -> KeyLease {
        if let Some(lease) = self.acquire_free() {
            return lease;
        }
        let index = self.earliest().map_or(0, |(index, _)| index);
        let mut state = self.lock();
        self.lease(&mut state, index)
    }

    fn lease(self: &Arc<Self>, state: &mut PoolState, index: usize) -> KeyLease {
        state.keys[index].in_flight += 1;
        KeyLease {
            pool: Arc::clone(self),
            index,
        }
    }

    /// The key back soonest, and how long until it is.
    pub fn earliest(&self) -> Option<(usize, Duration)> {
        let now = Instant::now();
        self.lock()
            .keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                k.cooling
                    .map(|(until, _)| (i, until.saturating_duration_since(now)))
            })
            .min_by_key(|(_, wait)| *wait)
    }

    /// Whether no key may be chosen now.
    pub fn all_cooling(&self) -> bool {
        let now = Instant::now();
        self.lock()
            .keys
            .iter()
            .all(|k| k.cooling.is_some_and(|(until, _)| until > now))
    }

    /// Leaves key `index` out after the provider answered `status` (429 or 401): for `retry_after`
    /// when the provider said, else the configured default. Returns the cooldown.
    pub fn cool(&self, index: usize, status: u16, retry_after: Option<Duration>) -> Duration {
        let default = if status == 401 {
            self.cooldown.refused
        } else {
            self.cooldown.rate_limited
        };
        let cooldown = retry_after.unwrap_or(default);
        let until = Instant::now() + cooldown;
        let mut state = self.lock();
        let key = &mut state.keys[index];
        // A shorter answer does not shorten a longer cooldown another call set.
        if key.cooling.is_none_or(|(current, _)| current < until) {
            key.cooling = Some((until, status));
        }
        tracing::warn!(provider = %self.provider, key = index + 1, status, cooldown_secs = cooldown.as_secs(), "provider key cooling down");
        cooldown
    }

    /// Key `index` answered: whatever cooled it is over.
    pub fn succeeded(&self, index: usize) {
        self.lock().keys[index].cooling = None;
    }

    /// The error of a call that found every key cooling down: when the first is back.
    pub fn cooling_error(&self) -> super::ProviderError {
        let wait = self.earliest().map_or(Duration::ZERO, |(_, wait)| wait);
        // Whole seconds, rounded up: "in 0 s" would invite a retry that fails again.
        let retry_in_secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        super::ProviderError::KeysCoolingDown {
            provider: self.provider.clone(),
            keys: self.len(),
            retry_in_secs,
            retry_at: httpdate::fmt_http_date(
                SystemTime::now() + Duration::from_secs(retry_in_secs),
            ),
        }
    }

    /// Each key's load and cooldown, in the configured order.
    pub fn status(&self) -> Vec<KeyStatus> {
        let now = Instant::now();
        self.lock()
            .keys
            .iter()
            .map(|k| KeyStatus {
                in_flight: k.in_flight,
                cooling: k
                    .cooling
                    .filter(|(until, _)| *until > now)
                    .map(|(until, status)| (until - now, status)),
            })
            .collect()
    }
}

/// One call's use of one key: counted in flight until dropped (the call's end, its cancel, or a
/// retry on another key).
pub struct KeyLease {
    pool: Arc<KeyPool>,
    index: usize,
}

impl KeyLease {
    /// The key's position in the provider's list, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    pub fn secret(&self) -> &Secret {
        &self.pool.secrets[self.index]
    }
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        let key = &mut state.keys[self.index];
        key.in_flight = key.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ProviderKey, ProviderKind, Route};

    fn pool(keys: usize) -> Arc<KeyPool> {
        let provider = ProviderConfig {
            name: "p".to_owned(),
            kind: ProviderKind::OpenAiChat,
            base_url: "http://127.0.0.1:9/v1".to_owned(),
            keys: (0..keys)
                .map(|i| ProviderKey {
                    secret: Secret::new(format!("k{i}")),
                    env: None,
                })
                .collect(),
            models: Vec::new(),
            route: Route::Direct { local: true },
        };
        KeyPool::new(&provider, KeyCooldown::default())
    }

    #[test]
    fn concurrent_calls_go_to_the_least_loaded_key_and_leases_release_it() {
        let pool = pool(3);
        let a = pool.acquire_free().unwrap();
        let b = pool.acquire_free().unwrap();
        let c = pool.acquire_free().unwrap();
        assert_eq!([a.index(), b.index(), c.index()], [0, 1, 2]);
        drop(b);
        // Key 1 has nothing in flight now; the others have one each.
        assert_eq!(pool.acquire_free().unwrap().index(), 1);
        assert_eq!(
            pool.status()
                .iter()
                .map(|s| s.in_flight)
                .collect::<Vec<_>>(),
            [1, 0, 1]
        );
    }

    #[test]
    fn a_cooling_key_is_skipped_until_every_key_cools_then_the_first_back_is_named() {
        let pool = pool(2);
        pool.cool(0, 429, Some(Duration::from_secs(5)));
        for _ in 0..4 {
            assert_eq!(pool.acquire_free().unwrap().index(), 1);
        }
        pool.cool(1, 401, None);
        assert!(pool.acquire_free().is_none());
        assert_eq!(pool.earliest().unwrap().0, 0);
        assert_eq!(pool.acquire_any().index(), 0);
        match pool.cooling_error() {
            super::super::ProviderError::KeysCoolingDown {
                keys,
                retry_in_secs,
                ..
            } => assert_eq!((keys, retry_in_secs), (2, 5)),
            other => panic!("{other:?}"),
        }
        pool.succeeded(1);
        assert_eq!(pool.acquire_free().unwrap().index(), 1);
    }
}
