//! A provider family (an endpoint shape: OpenAI Chat Completions, OpenAI Responses, Anthropic
//! Messages) behind one trait. Everything that differs between families is a method of `Family`,
//! implemented once in the family's module (`provider/<family>.rs`): where it is called and how a
//! key is sent, its request body, its stream parser, its image limits and its probe. The registry
//! (`ProviderKind::family`, beside the modules' declarations in `provider/mod.rs`) is the only match
//! on the kind; `project` is the one way a run gets a body.
//!
//! (added) `provider/mod.rs` owns one call's HTTP, retries and keys, the same for every family; the
//! trait is what the families implement and what `prompting/` callers and `ops/check.rs` ask, and
//! the request body it builds is prompting's output, which `mod.rs` (the transport) never reads.

use serde_json::Value;

use super::StreamParser;
use crate::config::{ProviderKind, Secret};
use crate::prompting::compiler::ModelRequest;
use crate::prompting::images::ImageLimits;

/// What one provider family does differently from the others.
pub trait Family: Sync {
    /// The path after `base_url` the family's endpoint is called at.
    fn endpoint_path(&self) -> &'static str;

    /// Sets one of the provider's keys on `request` the way the family expects it (a bearer token
    /// unless the family says otherwise).
    fn authorize(&self, request: reqwest::RequestBuilder, key: &Secret) -> reqwest::RequestBuilder {
        request.bearer_auth(key.expose())
    }

    /// The family's request body for `request` (before the model's `extra_body`).
    fn request_body(&self, request: &ModelRequest<'_>) -> Value;

    /// A parser for one streamed call of `provider` (its name, for errors).
    fn parser(&self, provider: &str) -> Box<dyn StreamParser>;

    /// The most the family documents it takes in images.
    fn image_limits(&self) -> ImageLimits;

    /// The smallest non-streamed request `check` probes a model with.
    fn probe(&self, model: &str) -> Value;
}

/// The request body for `kind`: the family's body with the model's `extra_body` keys set over it.
pub fn project(kind: ProviderKind, request: &ModelRequest<'_>) -> Value {
    let mut body = kind.family().request_body(request);
    if let Some(object) = body.as_object_mut() {
        for (key, value) in &request.model.quirks.extra_body {
            object.insert(key.clone(), value.clone());
        }
    }
    body
}
