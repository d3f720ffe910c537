//! This node's lease and the watch on the others': joining at start (refused while a live node
//! holds the name, waiting out a dead previous process's lease, then ending what this node left
//! running when it last stopped), renewing every third of the lease, taking a silent node as
//! stopped (one survivor wins the claim in the database and ends that node's runs), leaving at a
//! clean shutdown. A background task: a run never waits on it.

use std::sync::Arc;
use std::time::Duration;

use super::Cluster;
use crate::state::AppState;
use crate::store::{Store, StoreError, nodes};

/// Run claims older than this are forgotten (a request id is not reused; a day covers any run).
const CLAIM_MEMORY_MS: i64 = 24 * 60 * 60 * 1000;
/// Every this many renewals, old claims are forgotten.
const FORGET_EVERY: u32 = 1000;

/// Why this node could not join.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "node name {name:?} is in use by a live node at {internal_url} (it renewed its lease {age_ms} ms ago): every node needs its own [cluster] node_name; if that node is this one, stop the running process first"
    )]
    NameInUse {
        name: String,
        internal_url: String,
        age_ms: i64,
    },
}

/// Joins the cluster as this node. The name is taken only once no live node holds it: a previous
/// process of this node that died without leaving holds it until its lease runs out (this waits
/// for that, at most the lease), while a live process renews it (this sees the renewal within a
/// third of the lease and refuses to start, ending nothing of the live node's). Once the name is
/// this process's, the runs the previous process left running are ended (as a single node does
/// at start, but only its own).
pub async fn join(store: &Store, cluster: &Cluster) -> Result<(), JoinError> {
    let name = cluster.node_name();
    let poll = (cluster.lease() / 6).max(Duration::from_millis(50));
    let mut first_seen: Option<i64> = None;
    let instance = loop {
        match nodes::register_if_free(store, (name, cluster.internal_url()), cluster.lease_ms())
            .await?
        {
            nodes::Joined::Registered { instance } => break instance,
            nodes::Joined::Held {
                internal_url,
                heartbeat_at_ms,
                age_ms,
            } => match first_seen {
                Some(seen) if seen != heartbeat_at_ms => {
                    return Err(JoinError::NameInUse {
                        name: name.to_owned(),
                        internal_url,
                        age_ms,
                    });
                }
                Some(_) => {}
                None => {
                    tracing::warn!(
                        node = name,
                        holder = %internal_url,
                        lease_age_ms = age_ms,
                        lease_ms = cluster.lease_ms(),
                        "this node's name is held by a lease that has not run out: waiting for it to (a previous process of this node that stopped), or for its holder to renew it (another live node: then this one does not start)"
                    );
                    first_seen = Some(heartbeat_at_ms);
                }
            },
        }
        tokio::time::sleep(poll).await;
    };
    cluster.set_instance(instance);
    let orphans = nodes::reconcile_own(store, name).await?;
    if orphans > 0 {
        tracing::warn!(
            runs = orphans,
            node = name,
            "runs this node left running when it last stopped were marked failed"
        );
    }
    tracing::info!(
        node = name,
        internal_url = cluster.internal_url(),
        lease_ms = cluster.lease_ms(),
        "joined the cluster"
    );
    Ok(())
}

/// A clean shutdown: the node is marked stopped once its runs have recorded their endings.
pub async fn leave(store: &Store, cluster: &Cluster) {
    match nodes::leave(store, cluster.node_name(), cluster.instance()).await {
        Ok(()) => tracing::info!(node = cluster.node_name(), "left the cluster"),
        Err(e) => tracing::warn!("marking this node stopped: {e}"),
    }
}

/// Renews this node's lease and watches the others' until shutdown.
pub async fn keep(state: Arc<AppState>) {
    let Some(cluster) = state.cluster.clone() else {
        return;
    };
    let every = (cluster.lease() / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut renewals: u32 = 0;
    loop {
        tokio::select! {
            _ = state.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        renew(&state, &cluster).await;
        watch_others(&state.store, &cluster).await;
        renewals = renewals.wrapping_add(1);
        if renewals.is_multiple_of(FORGET_EVERY)
            && let Err(e) = nodes::forget_claims(&state.store, CLAIM_MEMORY_MS).await
        {
            tracing::warn!("forgetting old run claims: {e}");
        }
    }
}

/// Renews the lease. A node that finds itself taken as stopped (it was silent past its lease: a
/// stall, a network cut) stops its runs — another node has already ended them in the database and
/// the store refuses their writes — and joins again, unless another process took its name
/// meanwhile (then it stays out and is not ready).
async fn renew(state: &AppState, cluster: &Cluster) {
    match nodes::renew(&state.store, cluster.node_name(), cluster.instance()).await {
        Ok(true) => {}
        Ok(false) => {
            let stopped = state.runs.stop_every(nodes::NODE_STOPPED);
            tracing::error!(
                node = cluster.node_name(),
                runs = stopped,
                "this node's lease was taken (it was silent past it): its runs were ended elsewhere and are stopped here; joining again"
            );
            match nodes::register_if_free(
                &state.store,
                (cluster.node_name(), cluster.internal_url()),
                cluster.lease_ms(),
            )
            .await
            {
                Ok(nodes::Joined::Registered { instance }) => cluster.set_instance(instance),
                Ok(nodes::Joined::Held { internal_url, .. }) => tracing::error!(
                    node = cluster.node_name(),
                    holder = %internal_url,
                    "another process holds this node's name now: this one stays out of the cluster (not ready); stop it"
                ),
                Err(e) => tracing::error!("joining the cluster again: {e}"),
            }
        }
        Err(e) => tracing::warn!("renewing this node's lease: {e}"),
    }
}

/// Takes every node silent past the lease as stopped, unless another survivor did first.
async fn watch_others(store: &Store, cluster: &Cluster) {
    let silent = match nodes::silent(store, cluster.node_name(), cluster.lease_ms()).await {
        Ok(silent) => silent,
        Err(e) => {
            tracing::warn!("reading the other nodes' leases: {e}");
            return;
        }
    };
    for node in silent {
        match nodes::take_over_stopped(store, &node, cluster.node_name(), cluster.lease_ms()).await
        {
            Ok(Some(runs)) => tracing::warn!(
                node = %node,
                runs,
                "a node was silent past its lease: taken as stopped, its running runs ended ({}) and their conversations released",
                nodes::NODE_STOPPED
            ),
            Ok(None) => {}
            Err(e) => tracing::warn!(node = %node, "taking a silent node as stopped: {e}"),
        }
    }
}
