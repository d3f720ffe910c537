//! This node's lease and the watch on the others': joining at start (ending what this node left
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

/// Joins the cluster as this node: ends the runs it left running when it was last stopped (as a
/// single node does at start, but only its own), then registers with a fresh lease.
pub async fn join(store: &Store, cluster: &Cluster) -> Result<(), StoreError> {
    let orphans = nodes::reconcile_own(store, cluster.node_name()).await?;
    if orphans > 0 {
        tracing::warn!(
            runs = orphans,
            node = cluster.node_name(),
            "runs this node left running when it last stopped were marked failed"
        );
    }
    nodes::register(store, cluster.node_name(), cluster.internal_url()).await?;
    tracing::info!(
        node = cluster.node_name(),
        internal_url = cluster.internal_url(),
        lease_ms = cluster.lease_ms(),
        "joined the cluster"
    );
    Ok(())
}

/// A clean shutdown: the node is marked stopped once its runs have recorded their endings.
pub async fn leave(store: &Store, cluster: &Cluster) {
    match nodes::leave(store, cluster.node_name()).await {
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
/// the store refuses their writes — and joins again.
async fn renew(state: &AppState, cluster: &Cluster) {
    match nodes::renew(&state.store, cluster.node_name()).await {
        Ok(true) => {}
        Ok(false) => {
            let stopped = state.runs.stop_every(nodes::NODE_STOPPED);
            tracing::error!(
                node = cluster.node_name(),
                runs = stopped,
                "another node took this one as stopped (its lease ran out): its runs were ended there and are stopped here; joining again"
            );
            if let Err(e) =
                nodes::register(&state.store, cluster.node_name(), cluster.internal_url()).await
            {
                tracing::error!("joining the cluster again: {e}");
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
