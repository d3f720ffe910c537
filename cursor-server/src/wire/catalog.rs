//! The model catalog: the configured models as Cursor's picker and CLI ask for them
//! (`AvailableModels`, `GetUsableModels`, `GetDefaultModelForCli`), merged with Cursor's own list
//! when the user is signed in.
//!
//! Not in the plan's file list: `handlers.rs` is the plan's "Axum route entry", and this is a
//! protocol translation of the config's models (with its own upstream call) that would otherwise
//! double that file; no other listed file translates configuration into Cursor messages.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Uri, header};
use axum::response::Response;

use crate::config::Config;
use crate::cursor::connect::{self, ConnectCode, ConnectError};
use crate::cursor::proto::agent::{
    GetDefaultModelForCliRequest, GetDefaultModelForCliResponse, GetUsableModelsRequest,
    GetUsableModelsResponse, ModelDetails, ThinkingDetails,
};
use crate::cursor::proto::aiserver::{
    AvailableModelsRequest, AvailableModelsResponse, ai_service_routes, available_models_response,
};
use crate::state::AppState;

/// How long the picker waits for Cursor's own list before answering with the configured models.
const CATALOG_UPSTREAM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `POST /aiserver.v1.AiService/AvailableModels`: the configured models for Cursor's picker —
/// merged into Cursor's own list when the user is signed in and the backend answers, on their own
/// otherwise. Every run comes to this server, so a model it does not configure fails with a clear
/// `not_found` naming the configured ones.
pub async fn available_models_route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    decode_request::<AvailableModelsRequest>(
        &state,
        &headers,
        &body,
        "AvailableModels",
        "aiserver.v1.AvailableModelsRequest",
    )?;
    let ours = available_models(&state.config);
    let upstream = upstream_unary::<AvailableModelsResponse>(
        &state,
        ai_service_routes::AVAILABLE_MODELS,
        &headers,
        &body,
    )
    .await;
    Ok(connect::unary_ok(&match upstream {
        Some(theirs) => merge_available_models(ours, theirs),
        None => ours,
    }))
}

/// `GetUsableModels` (both services): the configured models, then Cursor's own when signed in.
pub async fn usable_models_route(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    decode_request::<GetUsableModelsRequest>(
        &state,
        &headers,
        &body,
        "GetUsableModels",
        "agent.v1.GetUsableModelsRequest",
    )?;
    let mut models: Vec<ModelDetails> = configured_models(&state.config).collect();
    if let Some(theirs) =
        upstream_unary::<GetUsableModelsResponse>(&state, uri.path(), &headers, &body).await
    {
        let ours: Vec<String> = models.iter().map(|m| m.model_id.clone()).collect();
        models.extend(
            theirs
                .models
                .into_iter()
                .filter(|m| !ours.contains(&m.model_id)),
        );
    }
    Ok(connect::unary_ok(&GetUsableModelsResponse { models }))
}

/// `GetDefaultModelForCli` (both services): the configured default model.
pub async fn default_model_route(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConnectError> {
    decode_request::<GetDefaultModelForCliRequest>(
        &state,
        &headers,
        &body,
        "GetDefaultModelForCli",
        "agent.v1.GetDefaultModelForCliRequest",
    )?;
    let default =
        configured_models(&state.config).find(|m| m.model_id == state.config.default_model);
    Ok(connect::unary_ok(&GetDefaultModelForCliResponse {
        model: default,
    }))
}

/// The request message of `route`, or the `invalid_argument` error that names the route.
fn decode_request<M: prost::Message + Default>(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    route: &str,
    message: &'static str,
) -> Result<M, ConnectError> {
    connect::decode_unary(headers, body, state.config.max_frame_bytes, message)
        .map_err(|e| ConnectError::new(ConnectCode::InvalidArgument, format!("{route}: {e}")))
}

/// Asks Cursor's backend the same unary question with the user's own headers, if pass-through is
/// on and the user is signed in (`authorization`); `None` when it cannot answer in time.
async fn upstream_unary<M: prost::Message + Default>(
    state: &AppState,
    path: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Option<M> {
    let (client, upstream) = (state.upstream.as_ref()?, state.config.upstream.as_ref()?);
    headers.get(header::AUTHORIZATION)?;
    let request = client
        .post(format!("{}{path}", upstream.url))
        .timeout(CATALOG_UPSTREAM_TIMEOUT)
        .headers(connect::end_to_end_headers(headers))
        .body(body.clone());
    let answer = async {
        let response = request
            .send()
            .await
            .map_err(|e| e.without_url().to_string())?;
        if !response.status().is_success() {
            return Err(format!("HTTP {}", response.status()));
        }
        let response_headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| e.without_url().to_string())?;
        let payload =
            connect::unary_payload(&response_headers, &bytes, state.config.max_frame_bytes)
                .map_err(|e| e.to_string())?;
        M::decode(payload).map_err(|e| e.to_string())
    };
    match answer.await {
        Ok(message) => Some(message),
        Err(e) => {
            tracing::info!(
                path,
                "Cursor's model list is unavailable ({e}); answering with the configured models only"
            );
            None
        }
    }
}

/// The configured models first (they are what this server runs), then Cursor's other models;
/// Cursor's other settings (feature model configs, ...) are kept, with our default model.
fn merge_available_models(
    ours: AvailableModelsResponse,
    mut theirs: AvailableModelsResponse,
) -> AvailableModelsResponse {
    let mut models = ours.models;
    let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
    models.extend(
        theirs
            .models
            .into_iter()
            .filter(|m| !names.contains(&m.name)),
    );
    theirs.model_names = models.iter().map(|m| m.name.clone()).collect();
    theirs.models = models;
    theirs.composer_model_config = ours.composer_model_config;
    theirs
}

/// The configured models as the CLI's `ModelDetails`.
fn configured_models(config: &Config) -> impl Iterator<Item = ModelDetails> + '_ {
    config
        .providers
        .iter()
        .flat_map(|provider| provider.models.iter())
        .map(|model| ModelDetails {
            model_id: model.id.clone(),
            display_model_id: model.id.clone(),
            display_name: model.display_name.clone(),
            display_name_short: model.display_name.clone(),
            thinking_details: model.reasoning.then(ThinkingDetails::default),
            max_mode: Some(false),
            ..ModelDetails::default()
        })
}

/// The configured models as the IDE picker's `AvailableModelsResponse`, with our default model.
fn available_models(config: &Config) -> AvailableModelsResponse {
    let models: Vec<available_models_response::AvailableModel> = config
        .providers
        .iter()
        .flat_map(|provider| provider.models.iter())
        .map(|model| available_models_response::AvailableModel {
            name: model.id.clone(),
            default_on: true,
            supports_agent: Some(true),
            supports_thinking: Some(model.reasoning),
            supports_max_mode: Some(false),
            supports_non_max_mode: Some(true),
            context_token_limit: Some(i32::try_from(model.context_window).unwrap_or(i32::MAX)),
            client_display_name: Some(model.display_name.clone()),
            server_model_name: Some(model.id.clone()),
            supports_plan_mode: Some(true),
            is_user_added: Some(true),
            inputbox_short_model_name: Some(model.display_name.clone()),
            ..Default::default()
        })
        .collect();
    AvailableModelsResponse {
        model_names: models.iter().map(|m| m.name.clone()).collect(),
        models,
        composer_model_config: Some(available_models_response::FeatureModelConfig {
            default_model: config.default_model.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> available_models_response::AvailableModel {
        available_models_response::AvailableModel {
            name: name.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn merged_models_put_ours_first_once_and_keep_our_default() {
        let ours = AvailableModelsResponse {
            models: vec![model("a"), model("b")],
            composer_model_config: Some(available_models_response::FeatureModelConfig {
                default_model: "a".to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let theirs = AvailableModelsResponse {
            models: vec![model("b"), model("c")],
            ..Default::default()
        };
        let merged = merge_available_models(ours, theirs);
        assert_eq!(merged.model_names, ["a", "b", "c"]);
        assert_eq!(merged.models.len(), 3);
        assert_eq!(
            merged.composer_model_config.map(|c| c.default_model),
            Some("a".to_owned())
        );
    }
}
