//! Several `cursor-server` nodes on one database (`[cluster]`): where a request for a run is
//! served (the node that claimed its request id first), forwarding it there over the internal
//! channel (HTTP between nodes, authenticated by the shared secret), and telling another node to
//! stop a run whose conversation a new message took over. `lease.rs` keeps this node's lease and
//! watches the others'.
//!
//! Nothing here runs without `[cluster]`: a single node never reads the cluster tables, and a
//! run's hot path (its events, its appends once placed) is the same on every node — a request is
//! placed once per node per request id, from the registry, the runs of other nodes placed here
//! before (`Placed`), or one read of `run_claims`.

pub mod lease;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq as _;

use crate::config::cluster::ClusterConfig;
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::run::registry::RunRegistry;
use crate::store::{Store, nodes};

/// The header carrying the shared secret on every internal request.
pub const SECRET_HEADER: &str = "x-cursor-byok-cluster-secret";
/// The header naming the node a forwarded request comes from (for the owner's log).
pub const FORWARDED_BY_HEADER: &str = "x-cursor-byok-forwarded-by";
/// The internal routes: a client's RunSSE and BidiAppend forwarded to the run's node, and a
/// request to stop a run another node's new message took over.
pub const INTERNAL_RUN_SSE: &str = "/internal/cluster/v1/RunSSE";
pub const INTERNAL_BIDI_APPEND: &str = "/internal/cluster/v1/BidiAppend";
pub const INTERNAL_STOP_RUN: &str = "/internal/cluster/v1/StopRun";

/// How long a node may take to accept a forwarded request's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How many other nodes' runs a node remembers where it forwarded them (a run's requests come
/// within minutes; the oldest is forgotten first, and read again from the database if needed).
const PLACED_MEMORY: usize = 4096;

/// This node in the cluster: its settings and the client it reaches the others with.
pub struct Cluster {
    config: ClusterConfig,
    /// This process's registration under the node's name (`nodes::Joined::Registered`), set when
    /// it joins: its lease is renewed and left only under it.
    instance: AtomicI64,
    /// Direct (no proxy: nodes talk on the internal network), HTTP/1.1 (a RunSSE is one long
    /// chunked response), no overall timeout (it lasts as long as the run).
    client: reqwest::Client,
    /// Other nodes' runs whose requests reached this node, and where they run: a run's node
    /// never changes (the first claim holds), so its later BidiAppends are forwarded without
    /// reading `run_claims` again. A forward that fails forgets the run's entry (its node may
    /// have stopped: the next request reads the database, which says so).
    placed: Mutex<Placed>,
}

/// Request id → (node, internal URL), the oldest forgotten past `PLACED_MEMORY`.
#[derive(Default)]
struct Placed {
    runs: HashMap<String, (String, String)>,
    order: VecDeque<String>,
}

impl Placed {
    fn insert(&mut self, request_id: &str, node: &str, url: &str) {
        let entry = (node.to_owned(), url.to_owned());
        if self.runs.insert(request_id.to_owned(), entry).is_none() {
            self.order.push_back(request_id.to_owned());
        }
        while self.order.len() > PLACED_MEMORY {
            if let Some(old) = self.order.pop_front() {
                self.runs.remove(&old);
            }
        }
    }
}

/// Who sent a request: a client (through any load balancer) or another node forwarding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Client,
    Peer,
}

/// Where a request for a run is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Here: this node owns the run (or claimed it just now).
    Local,
    /// On `node`, reached at `url`.
    Forward { node: String, url: String },
}

/// The body of `INTERNAL_STOP_RUN`.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct StopRun {
    pub request_id: String,
    /// The run that took the conversation over.
    pub by: String,
}

impl Cluster {
    pub fn new(config: ClusterConfig) -> Result<Cluster, String> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .http1_only()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("the cluster's HTTP client: {e}"))?;
        Ok(Cluster {
            config,
            client,
            instance: AtomicI64::new(0),
            placed: Mutex::default(),
        })
    }

    pub fn instance(&self) -> i64 {
        self.instance.load(Ordering::Relaxed)
    }

    pub(crate) fn set_instance(&self, instance: i64) {
        self.instance.store(instance, Ordering::Relaxed);
    }

    pub fn node_name(&self) -> &str {
        &self.config.node_name
    }

    pub fn internal_url(&self) -> &str {
        &self.config.internal_url
    }

    pub fn lease(&self) -> Duration {
        self.config.lease
    }

    /// The lease in milliseconds, as the store compares it.
    pub fn lease_ms(&self) -> i64 {
        i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Whether this node holds its lease (for readiness): registered, not taken as stopped, renewed
    /// within the lease.
    pub async fn own_lease(&self, store: &Store) -> Result<String, String> {
        let nodes = nodes::list(store)
            .await
            .map_err(|e| format!("the node registry could not be read: {e}"))?;
        let Some(me) = nodes.iter().find(|n| n.name == self.node_name()) else {
            return Err(format!("node {} is not registered", self.node_name()));
        };
        match &me.stopped {
            _ if me.instance != self.instance() => Err(format!(
                "node {}'s name is held by another process (this one's lease was taken)",
                me.name
            )),
            Some(why) => Err(format!("node {} is marked stopped ({why})", me.name)),
            None if me.lease_age_ms > self.lease_ms() => Err(format!(
                "node {}'s lease is {} ms old (lease {} ms)",
                me.name,
                me.lease_age_ms,
                self.lease_ms()
            )),
            None => Ok(format!(
                "node {} renewed its lease {} ms ago; {} other node(s) live",
                me.name,
                me.lease_age_ms,
                nodes
                    .iter()
                    .filter(|n| n.name != me.name && n.stopped.is_none())
                    .count()
            )),
        }
    }

    /// Whether an internal request carries the shared secret (compared in constant time):
    /// missing is `unauthenticated`, wrong is `permission_denied` (403).
    pub fn authorize(&self, headers: &HeaderMap) -> Result<(), ConnectError> {
        let Some(given) = headers.get(SECRET_HEADER) else {
            return Err(ConnectError::new(
                ConnectCode::Unauthenticated,
                "internal cluster route: the shared secret is missing",
            ));
        };
        let expected = self.config.secret.expose().as_bytes();
        if bool::from(given.as_bytes().ct_eq(expected)) {
            return Ok(());
        }
        tracing::warn!(
            from = connect::header_str(headers, FORWARDED_BY_HEADER).unwrap_or("?"),
            "an internal cluster request with a wrong secret was refused"
        );
        Err(ConnectError::new(
            ConnectCode::PermissionDenied,
            "internal cluster route: the shared secret is wrong",
        ))
    }

    /// Where a request for run `request_id` is served. A client's request for a run nobody owns
    /// claims it for this node (the first claimer wins); a peer's is served here only if this node
    /// owns the run — anything else is `not_found` (never a new run opened on a forward).
    pub async fn place(
        &self,
        store: &Store,
        runs: &RunRegistry,
        request_id: &str,
        via: Via,
    ) -> Result<Placement, ConnectError> {
        if runs.knows(request_id) {
            return Ok(Placement::Local);
        }
        if via == Via::Client
            && let Some((node, url)) = self.placed().runs.get(request_id).cloned()
        {
            return Ok(Placement::Forward { node, url });
        }
        let me = self.node_name();
        let unavailable = |e: crate::store::StoreError| {
            tracing::error!(request_id, "placing a run: {e}");
            ConnectError::new(
                ConnectCode::Unavailable,
                "the database could not say which node runs this request",
            )
        };
        let mut owner = nodes::run_owner(store, request_id, self.lease_ms())
            .await
            .map_err(unavailable)?;
        if owner.is_none() && via == Via::Client {
            let claimed = nodes::claim_run(store, request_id, me)
                .await
                .map_err(unavailable)?;
            if claimed == me {
                return Ok(Placement::Local);
            }
            owner = nodes::run_owner(store, request_id, self.lease_ms())
                .await
                .map_err(unavailable)?;
        }
        match (owner, via) {
            (Some(owner), _) if owner.node == me => Ok(Placement::Local),
            (None, _) | (Some(_), Via::Peer) => Err(ConnectError::new(
                ConnectCode::NotFound,
                format!("request {request_id} is not a run of node {me}"),
            )),
            (
                Some(nodes::RunOwner {
                    node,
                    internal_url: Some(url),
                    live: true,
                }),
                Via::Client,
            ) => {
                self.placed().insert(request_id, &node, &url);
                Ok(Placement::Forward { node, url })
            }
            (Some(owner), Via::Client) => Err(ConnectError::new(
                ConnectCode::NotFound,
                format!(
                    "request {request_id} ran on node {}, which stopped ({})",
                    owner.node,
                    nodes::NODE_STOPPED
                ),
            )),
        }
    }

    fn placed(&self) -> std::sync::MutexGuard<'_, Placed> {
        self.placed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets where run `request_id` was placed (forwarding it failed).
    pub fn forget_placement(&self, request_id: &str) {
        self.placed().runs.remove(request_id);
    }

    /// Sends a client's request (`headers`, `body`, the query string) to `node` at its internal
    /// `route` and streams the answer back as it comes (a RunSSE's frames, a BidiAppend's
    /// acknowledgement: its 200 is the owner's).
    pub async fn forward(
        &self,
        (node, url): (&str, &str),
        route: &str,
        (headers, query): (&HeaderMap, Option<&str>),
        body: Bytes,
    ) -> Result<Response, ConnectError> {
        let target = match query {
            Some(query) => format!("{url}{route}?{query}"),
            None => format!("{url}{route}"),
        };
        let mut outbound = connect::end_to_end_headers(headers);
        outbound.remove(header::CONTENT_LENGTH);
        outbound.remove(SECRET_HEADER);
        outbound.insert(SECRET_HEADER, self.secret_header()?);
        if let Ok(me) = HeaderValue::from_str(self.node_name()) {
            outbound.insert(FORWARDED_BY_HEADER, me);
        }
        let response = self
            .client
            .post(target)
            .headers(outbound)
            .body(body)
            .send()
            .await
            .map_err(|e| {
                let e = e.without_url();
                tracing::warn!(node, route, "forwarding to the run's node failed: {e}");
                ConnectError::new(
                    ConnectCode::Unavailable,
                    format!("the node running this request ({node}) could not be reached: {e}"),
                )
            })?;
        tracing::debug!(
            node,
            route,
            status = response.status().as_u16(),
            "forwarded"
        );
        let status = response.status();
        let headers = connect::end_to_end_headers(response.headers());
        let mut reply = Body::from_stream(response.bytes_stream()).into_response();
        *reply.status_mut() = status;
        *reply.headers_mut() = headers;
        Ok(reply)
    }

    fn secret_header(&self) -> Result<HeaderValue, ConnectError> {
        HeaderValue::from_str(self.config.secret.expose()).map_err(|_| {
            ConnectError::new(
                ConnectCode::Internal,
                "the cluster secret is not a valid header value",
            )
        })
    }

    /// Stops the run still running on `conversation_id` on another node, for run `by` that takes
    /// the conversation over here, and waits (up to `wait`) for that node to say it ended. Should
    /// the node not answer, `by` goes on: its run start makes it the conversation's owner, and the
    /// store refuses the old run's appends from then on.
    pub async fn stop_elsewhere(
        &self,
        store: &Store,
        conversation_id: &str,
        by: &str,
        wait: Duration,
    ) {
        let found =
            match nodes::conversation_run_elsewhere(store, conversation_id, self.node_name()).await
            {
                Ok(found) => found,
                Err(e) => {
                    tracing::warn!(
                        conversation_id,
                        "finding the conversation's run on other nodes: {e}"
                    );
                    return;
                }
            };
        let Some((request_id, node, url)) = found else {
            return;
        };
        tracing::info!(conversation_id, previous = %request_id, node = %node, "interrupting the conversation's running request on another node");
        let Ok(secret) = self.secret_header() else {
            return;
        };
        let sent = self
            .client
            .post(format!("{url}{INTERNAL_STOP_RUN}"))
            .header(SECRET_HEADER, secret)
            .header(FORWARDED_BY_HEADER, self.node_name())
            .timeout(wait + CONNECT_TIMEOUT)
            .json(&StopRun {
                request_id: request_id.clone(),
                by: by.to_owned(),
            })
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => {
                tracing::warn!(previous = %request_id, node = %node, status = response.status().as_u16(), "the other node did not stop the run; going on (the store refuses its appends)")
            }
            Err(e) => {
                tracing::warn!(previous = %request_id, node = %node, "the other node could not be told to stop the run: {}; going on (the store refuses its appends)", e.without_url())
            }
        }
    }
}
