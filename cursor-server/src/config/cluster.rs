//! `[cluster]`: this node's name, where the other nodes reach it, the secret they share (from the
//! environment, never the file) and the lease after which a silent node is taken as stopped.
//! Absent, the server is a single node exactly as before.
//!
//! A file of its own: `config/file.rs` holds the top-level file within 800 lines, and the
//! cluster's rules (a URL other nodes can use, a secret long enough to matter) belong together.

use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Secret};

/// Default lease: a node silent this long is taken as stopped.
pub const DEFAULT_LEASE_SECS: u64 = 15;
/// Default environment variable holding the shared secret.
pub const DEFAULT_SECRET_ENV: &str = "CURSOR_BYOK_CLUSTER_SECRET";
/// A shorter secret is refused: it is all that keeps clients off the internal routes.
const MIN_SECRET_LEN: usize = 16;

/// The `[cluster]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileCluster {
    node_name: String,
    internal_url: String,
    secret_env: Option<String>,
    /// Seconds; fractions allowed (tests use short leases).
    lease_secs: Option<f64>,
}

/// The validated cluster settings.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Unique per node; recorded with each run it starts.
    pub node_name: String,
    /// Where the other nodes reach this one (no trailing slash).
    pub internal_url: String,
    /// Shared by every node; carried by every internal request.
    pub secret: Secret,
    /// A node silent this long is taken as stopped; leases are renewed every third of it.
    pub lease: Duration,
}

impl FileCluster {
    pub(super) fn validate(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ClusterConfig, ConfigError> {
        let invalid = |message: String| ConfigError::Cluster(message);
        let name = self.node_name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(invalid(format!(
                "node_name {:?} must be letters, digits, '-', '_' or '.'",
                self.node_name
            )));
        }
        let url = self.internal_url.trim_end_matches('/').to_owned();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(invalid(format!(
                "internal_url {url:?} is not an http(s) URL other nodes can reach"
            )));
        }
        let var = self
            .secret_env
            .unwrap_or_else(|| DEFAULT_SECRET_ENV.to_owned());
        let secret = env(&var).filter(|s| !s.trim().is_empty()).ok_or_else(|| {
            invalid(format!(
                "the shared secret: environment variable {var} (secret_env) is not set or empty"
            ))
        })?;
        if secret.len() < MIN_SECRET_LEN {
            return Err(invalid(format!(
                "the shared secret in {var} is shorter than {MIN_SECRET_LEN} characters"
            )));
        }
        let lease_secs = self.lease_secs.unwrap_or(DEFAULT_LEASE_SECS as f64);
        if !(lease_secs.is_finite() && lease_secs >= 0.5) {
            return Err(invalid(format!(
                "lease_secs {lease_secs} must be at least 0.5"
            )));
        }
        Ok(ClusterConfig {
            node_name: name.to_owned(),
            internal_url: url,
            secret: Secret::new(secret),
            lease: Duration::from_secs_f64(lease_secs),
        })
    }
}
