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

use serde::Serialize;
use serde_json::{Map, Value};

use super::{RequestBody, StreamParser};
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

    /// The family's request body for `request`, serialized once with the model's `extra_body`
    /// set over it (`encode`).
    fn request_body(&self, request: &ModelRequest<'_>) -> RequestBody;

    /// A parser for one streamed call of `provider` (its name, for errors).
    fn parser(&self, provider: &str) -> Box<dyn StreamParser>;

    /// The most the family documents it takes in images.
    fn image_limits(&self) -> ImageLimits;

    /// The smallest non-streamed request `check` probes a model with.
    fn probe(&self, model: &str) -> Value;
}

/// The request body for `kind`.
pub fn project(kind: ProviderKind, request: &ModelRequest<'_>) -> RequestBody {
    kind.family().request_body(request)
}

/// `body` serialized, with `extra` (the model's `extra_body`) set over its top-level keys:
/// printed straight from the typed body when there is nothing to set (the usual case), through a
/// JSON tree only when keys must be replaced. A long conversation's body is hundreds of KB, and
/// building the tree first doubled its cost.
pub fn encode<T: Serialize>(body: &T, extra: &Map<String, Value>) -> RequestBody {
    if extra.is_empty() {
        return RequestBody::from_vec(serde_json::to_vec(body).expect("a request body is JSON"));
    }
    let mut tree = serde_json::to_value(body).expect("a request body is JSON");
    if let Some(object) = tree.as_object_mut() {
        for (key, value) in extra {
            object.insert(key.clone(), value.clone());
        }
    }
    RequestBody::from_json(&tree)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[derive(Serialize)]
    struct Body {
        model: &'static str,
        max_tokens: u32,
        stream: bool,
    }

    fn tree(body: &RequestBody) -> Value {
        serde_json::from_slice(body.as_bytes()).expect("JSON")
    }

    #[test]
    fn extra_body_keys_replace_and_add_top_level_keys_and_none_leaves_the_body_as_typed() {
        let body = Body {
            model: "m",
            max_tokens: 16,
            stream: true,
        };
        let plain = encode(&body, &Map::new());
        assert_eq!(
            plain.as_bytes(),
            br#"{"model":"m","max_tokens":16,"stream":true}"#,
            "printed from the typed body, in its field order"
        );
        let Value::Object(extra) = json!({"max_tokens": 99, "top_k": 20}) else {
            unreachable!()
        };
        assert_eq!(
            tree(&encode(&body, &extra)),
            json!({"model": "m", "max_tokens": 99, "stream": true, "top_k": 20})
        );
    }
}
