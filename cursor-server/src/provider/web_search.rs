//! The server-side search backend behind the WebSearch tool (SearXNG, Tavily or Brave): one query
//! in, a list of references out.
//!
//! A file of its own because no listed file owns an outbound call that is not an LLM endpoint; it
//! sits beside the LLM adapters because it shares their HTTP client, secret handling and limits.
//! The tool's card and the text the model reads are built in `tools/tool_result.rs`.

use std::time::Duration;

use serde_json::Value;

use crate::config::{WebSearchConfig, WebSearchKind};

/// One search result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchHit {
    pub title: String,
    pub url: String,
    /// The backend's snippet of the page.
    pub snippet: String,
}

/// Why a search produced no results list.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchError {
    #[error("the search backend could not be reached: {0}")]
    Unreachable(String),
    #[error("the search backend answered HTTP {status}: {message}")]
    Status { status: u16, message: String },
    #[error("the search backend's answer could not be read: {0}")]
    Decode(String),
}

/// How long one search may take in all.
const SEARCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Error bodies are read up to this size for the message.
const MAX_ERROR_BODY: usize = 2048;

/// Runs one search for `query` on the configured backend.
pub async fn search(
    http: &reqwest::Client,
    config: &WebSearchConfig,
    query: &str,
) -> Result<Vec<SearchHit>, SearchError> {
    let key = config.api_key.as_ref().map(|k| k.expose()).unwrap_or("");
    let url = |path: &str, params: &[(&str, &str)]| {
        url::Url::parse_with_params(&format!("{}{path}", config.base_url), params)
            .map_err(|e| SearchError::Unreachable(format!("invalid search URL: {e}")))
    };
    let count = config.max_results.to_string();
    let request = match config.kind {
        WebSearchKind::Searxng => http.get(url("/search", &[("q", query), ("format", "json")])?),
        WebSearchKind::Tavily => http
            .post(format!("{}/search", config.base_url))
            .bearer_auth(key)
            .json(&serde_json::json!({
                "query": query,
                "max_results": config.max_results,
            })),
        WebSearchKind::Brave => http
            .get(url("/web/search", &[("q", query), ("count", &count)])?)
            .header("X-Subscription-Token", key),
    };
    let response = request
        .header(reqwest::header::ACCEPT, "application/json")
        .timeout(SEARCH_TIMEOUT)
        .send()
        .await
        .map_err(|e| SearchError::Unreachable(e.without_url().to_string()))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| SearchError::Unreachable(e.without_url().to_string()))?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body[..body.len().min(MAX_ERROR_BODY)]);
        return Err(SearchError::Status {
            status: status.as_u16(),
            message: text.trim().to_owned(),
        });
    }
    let json: Value =
        serde_json::from_slice(&body).map_err(|e| SearchError::Decode(e.to_string()))?;
    parse_hits(config.kind, &json, config.max_results as usize)
}

/// The results of one backend's JSON answer, at most `max` of them.
fn parse_hits(
    kind: WebSearchKind,
    json: &Value,
    max: usize,
) -> Result<Vec<SearchHit>, SearchError> {
    let (results, snippet_field) = match kind {
        WebSearchKind::Searxng | WebSearchKind::Tavily => (&json["results"], "content"),
        WebSearchKind::Brave => (&json["web"]["results"], "description"),
    };
    let Some(results) = results.as_array() else {
        // Brave leaves `web` out when nothing matched.
        if kind == WebSearchKind::Brave && json["web"].is_null() && json.is_object() {
            return Ok(Vec::new());
        }
        return Err(SearchError::Decode(
            "no `results` list in the answer".to_owned(),
        ));
    };
    Ok(results
        .iter()
        .filter_map(|r| {
            let url = r["url"].as_str()?.to_owned();
            Some(SearchHit {
                title: r["title"].as_str().unwrap_or(&url).to_owned(),
                snippet: r[snippet_field].as_str().unwrap_or_default().to_owned(),
                url,
            })
        })
        .take(max)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_shape_gives_title_url_and_snippet() {
        let searx = serde_json::json!({"results": [
            {"title": "Rust", "url": "https://rust-lang.org", "content": "A language"},
            {"url": "https://no-title.example"},
            {"title": "no url"}
        ]});
        let hits = parse_hits(WebSearchKind::Searxng, &searx, 10).unwrap();
        assert_eq!(hits.len(), 2);
        assert_eq!(hits[0].snippet, "A language");
        assert_eq!(hits[1].title, "https://no-title.example");
        let brave = serde_json::json!({"web": {"results": [
            {"title": "T", "url": "https://b.example", "description": "D"}
        ]}});
        assert_eq!(
            parse_hits(WebSearchKind::Brave, &brave, 10).unwrap()[0].snippet,
            "D"
        );
        assert!(
            parse_hits(WebSearchKind::Brave, &serde_json::json!({"query": {}}), 10)
                .unwrap()
                .is_empty()
        );
        assert!(
            parse_hits(
                WebSearchKind::Tavily,
                &serde_json::json!({"error": "x"}),
                10
            )
            .is_err()
        );
        let many = serde_json::json!({"results": (0..9).map(|i| serde_json::json!({"url": format!("https://{i}.example")})).collect::<Vec<_>>()});
        assert_eq!(
            parse_hits(WebSearchKind::Tavily, &many, 3).unwrap().len(),
            3
        );
    }
}
