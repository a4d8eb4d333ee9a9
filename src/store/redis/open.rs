//! Opening the store: the URL's topology, the shared connection, the subscriptions'
//! tasks and the refresh of the watch registrations, all started here and stopped
//! when the store is dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::link::Link;
use super::options::{RedisOptions, Topology};
use super::restarts::{Restarts, Witnesses};
use super::scripts::Scripts;
use super::subscriptions::Subscriptions;
use super::watchers::Watchers;
use super::{Acks, RedisStore};
use crate::store::StoreError;

/// How many notices a slow sidecar task may fall behind before it resyncs.
const NOTICE_BUFFER: usize = 4096;

impl RedisStore {
    /// Connects lazily to `url`; keys live under `namespace`; every call gives up after
    /// `timeout`. Must be called inside a tokio runtime.
    pub fn new(url: &str, namespace: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::with_options(url, namespace, &RedisOptions::with_timeout(timeout))
    }

    /// Connects lazily to `url` with `options` (certificates, replica acknowledgement).
    /// Must be called inside a tokio runtime.
    pub fn with_options(
        url: &str,
        namespace: &str,
        options: &RedisOptions,
    ) -> Result<Self, StoreError> {
        let topology = Topology::parse(url, options)?;
        if options.min_replica_acks > 0 && options.replica_ack_timeout >= options.timeout {
            return Err(StoreError::Config(
                "the replica acknowledgement timeout must be shorter than the store timeout".into(),
            ));
        }
        let kind = match topology {
            Topology::Standalone(_) => "redis",
            Topology::Sentinel { .. } => "redis_sentinel",
            Topology::Cluster { .. } => "redis_cluster",
        };
        let restarts = Restarts::new(namespace, options.restart_hold_off, options.durable);
        let marker = restarts.marker().to_owned();
        let link = Arc::new(Link::new(topology, options.timeout, restarts)?);
        let witnesses = Arc::new(Witnesses::new(link.cluster_template(), &marker));
        let notices = broadcast::channel(NOTICE_BUFFER).0;
        let (subscriptions, mut tasks) =
            Subscriptions::start(link.clone(), namespace, options.timeout, notices.clone());
        let scripts = Scripts::new();
        let watchers = Arc::new(Watchers::new(
            link.clone(),
            namespace,
            scripts.watch.clone(),
            options.timeout,
        ));
        tasks.push(tokio::spawn(watchers.clone().refresh(notices.subscribe())));
        tasks.push(tokio::spawn(witnesses.clone().watch(link.clone())));
        if link.sentinels().is_some() {
            tasks.push(tokio::spawn(super::sentinel::follow_master(link.clone())));
        }
        Ok(Self {
            kind,
            acks: Acks {
                min: options.min_replica_acks,
                timeout: options.replica_ack_timeout,
            },
            link,
            namespace: namespace.to_owned(),
            subscriptions,
            slot_map: Arc::default(),
            witnesses,
            timeout: options.timeout,
            scripts,
            notices,
            tasks,
            watchers,
            needs: super::checks::Needs {
                cluster: kind == "redis_cluster",
                sentinel: kind == "redis_sentinel",
                acks: options.min_replica_acks > 0,
            },
            checked: Default::default(),
        })
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
