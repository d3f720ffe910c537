//! The web: WebFetch (approved by the user, then fetched by the client and read as Markdown) and
//! WebSearch (approved by the user, then run by the server's search backend).

use std::fmt::Write as _;

use serde::Deserialize;

use crate::cursor::proto::agent::{
    self as pb, exec_server_message, interaction_query, interaction_response, tool_call,
};
use crate::provider::web_search::SearchHit;
use crate::tools::exec::ExecRequest;
use crate::tools::tool_result::{
    Tool, ToolEnv, ToolOutcome, ToolStep, Transport, card, done, failed, floor_char_boundary,
    non_empty, on_exec_answer, parse_args, reason_suffix, truncate_for_model, unexpected_response,
};

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WebFetchInput {
    pub url: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WebSearchInput {
    pub search_term: String,
}

impl Tool for WebFetchInput {
    type Result = pb::WebFetchResult;

    const NAME: &'static str = "WebFetch";
    // Asks first; once approved the same call becomes a `fetch_args` exec.
    const TRANSPORT: Transport = Transport::Interaction;
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("url", true)];

    fn parse(text: &str) -> Result<WebFetchInput, String> {
        let mut input: WebFetchInput = parse_args("WebFetch", text)?;
        input.url = input.url.trim().to_owned();
        let url = url::Url::parse(&input.url)
            .map_err(|e| format!("invalid arguments for WebFetch: `url` {:?}: {e}", input.url))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "invalid arguments for WebFetch: only http and https URLs can be fetched, not {:?}",
                url.scheme()
            ));
        }
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::WebFetchToolCall(pb::WebFetchToolCall {
            args: args.map(|fetch| web_fetch_args(fetch, call_id)),
            result,
        }))
    }

    fn error(args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::WebFetchResult {
            result: Some(pb::web_fetch_result::Result::Error(pb::WebFetchError {
                url: args.map(|a| a.url.clone()).unwrap_or_default(),
                error: message.to_owned(),
            })),
        }
    }

    /// The user approves every fetch first.
    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::query(interaction_query::Query::WebFetchRequestQuery(
            pb::WebFetchRequestQuery {
                args: Some(web_fetch_args(self, call_id)),
                skip_approval: false,
            },
        ))
    }

    /// An approval is never itself a result: it leads to the client's fetch.
    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        env: &ToolEnv,
    ) -> ToolStep {
        use pb::web_fetch_request_response::Result as W;
        let interaction_response::Result::WebFetchRequestResponse(response) = response else {
            return unexpected_response(self, call_id, response, env);
        };
        match response.result {
            Some(W::Approved(_)) => ToolStep::Exec(fetch_request(&self.url, call_id)),
            Some(W::Rejected(rejected)) => {
                let result = pb::WebFetchResult {
                    result: Some(pb::web_fetch_result::Result::Rejected(
                        pb::WebFetchRejected {
                            reason: rejected.reason.clone(),
                        },
                    )),
                };
                let text = format!(
                    "The user rejected fetching {}{}.",
                    self.url,
                    reason_suffix(&rejected.reason)
                );
                ToolStep::Done(done(self, call_id, result, text, true))
            }
            None => ToolStep::Done(failed(
                self,
                call_id,
                "the client sent an empty response to the fetch request",
            )),
        }
    }

    on_exec_answer!(FetchResult => fetch_outcome);
}

impl Tool for WebSearchInput {
    type Result = pb::WebSearchResult;

    const NAME: &'static str = "WebSearch";
    // Asks first; once approved the server's search backend runs it.
    const TRANSPORT: Transport = Transport::Interaction;
    const ARGUMENTS: &'static [(&'static str, bool)] = &[("search_term", true)];

    fn parse(text: &str) -> Result<WebSearchInput, String> {
        let input: WebSearchInput = parse_args("WebSearch", text)?;
        non_empty("WebSearch", "search_term", &input.search_term)?;
        Ok(input)
    }

    fn card(args: Option<&Self>, call_id: &str, result: Option<Self::Result>) -> pb::ToolCall {
        card(tool_call::Tool::WebSearchToolCall(pb::WebSearchToolCall {
            args: args.map(|search| web_search_args(search, call_id)),
            result,
        }))
    }

    fn error(_args: Option<&Self>, _call_id: &str, message: &str) -> Self::Result {
        pb::WebSearchResult {
            result: Some(pb::web_search_result::Result::Error(pb::WebSearchError {
                error: message.to_owned(),
            })),
        }
    }

    /// The user approves every search first.
    fn start(&self, call_id: &str, _env: &ToolEnv) -> ToolStep {
        ToolStep::query(interaction_query::Query::WebSearchRequestQuery(
            pb::WebSearchRequestQuery {
                args: Some(web_search_args(self, call_id)),
            },
        ))
    }

    /// An approval is never itself a result: it leads to the server's search.
    fn on_response(
        &self,
        call_id: &str,
        response: interaction_response::Result,
        env: &ToolEnv,
    ) -> ToolStep {
        use pb::web_search_request_response::Result as W;
        let interaction_response::Result::WebSearchRequestResponse(response) = response else {
            return unexpected_response(self, call_id, response, env);
        };
        match response.result {
            Some(W::Approved(_)) => ToolStep::Search(self.search_term.clone()),
            Some(W::Rejected(rejected)) => {
                let result = pb::WebSearchResult {
                    result: Some(pb::web_search_result::Result::Rejected(
                        pb::WebSearchRejected {
                            reason: rejected.reason.clone(),
                        },
                    )),
                };
                let text = format!(
                    "The user rejected searching the web for {:?}{}.",
                    self.search_term,
                    reason_suffix(&rejected.reason)
                );
                ToolStep::Done(done(self, call_id, result, text, true))
            }
            None => ToolStep::Done(failed(
                self,
                call_id,
                "the client sent an empty response to the search request",
            )),
        }
    }
}

fn web_search_args(search: &WebSearchInput, call_id: &str) -> pb::WebSearchArgs {
    pb::WebSearchArgs {
        search_term: search.search_term.clone(),
        tool_call_id: call_id.to_owned(),
    }
}

fn web_fetch_args(fetch: &WebFetchInput, call_id: &str) -> pb::WebFetchArgs {
    pb::WebFetchArgs {
        url: fetch.url.clone(),
        tool_call_id: call_id.to_owned(),
    }
}

/// The fetch a WebFetch call runs once the user approved it.
fn fetch_request(url: &str, call_id: &str) -> ExecRequest {
    ExecRequest::new(exec_server_message::Message::FetchArgs(pb::FetchArgs {
        url: url.to_owned(),
        tool_call_id: call_id.to_owned(),
    }))
}

/// A fetched page as the model reads it: HTML becomes Markdown (scripts, styles and navigation
/// chrome dropped), other text is kept as it is; binary content is refused rather than garbled.
fn fetch_outcome(
    fetch: &WebFetchInput,
    call_id: &str,
    result: pb::FetchResult,
    env: &ToolEnv,
) -> ToolOutcome {
    let success = match result.result {
        Some(pb::fetch_result::Result::Success(success)) => success,
        Some(pb::fetch_result::Result::Error(error)) => {
            return failed(
                fetch,
                call_id,
                &format!("fetching {} failed: {}", fetch.url, error.error),
            );
        }
        None => return failed(fetch, call_id, "the client sent an empty fetch result"),
    };
    let url = if success.url.is_empty() {
        fetch.url.clone()
    } else {
        success.url.clone()
    };
    if success.status_code >= 400 {
        return failed(
            fetch,
            call_id,
            &format!("fetching {url} returned HTTP {}", success.status_code),
        );
    }
    let markdown = match page_markdown(&success.content, &success.content_type) {
        Ok(markdown) => markdown,
        Err(message) => return failed(fetch, call_id, &format!("{url}: {message}")),
    };
    let model_text = format!(
        "Contents of {url}:\n\n{}",
        truncate_for_model(&markdown, env.max_output_bytes, 0)
    );
    done(
        fetch,
        call_id,
        pb::WebFetchResult {
            result: Some(pb::web_fetch_result::Result::Success(pb::WebFetchSuccess {
                url,
                markdown,
                output_location: None,
            })),
        },
        model_text,
        false,
    )
}

/// The page's text as Markdown, decided by its content type (and by a sniff when it has none).
fn page_markdown(content: &str, content_type: &str) -> Result<String, String> {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let looks_html = || {
        let head = content.trim_start();
        let head = &head[..floor_char_boundary(head, 512)];
        let lower = head.to_ascii_lowercase();
        lower.starts_with("<!doctype html") || lower.starts_with("<html") || lower.contains("<body")
    };
    match mime.as_str() {
        "text/html" | "application/xhtml+xml" => html_to_markdown(content),
        "" if looks_html() => html_to_markdown(content),
        "" => Ok(content.to_owned()),
        m if m.starts_with("text/")
            || m.ends_with("json")
            || m.ends_with("xml")
            || m.ends_with("javascript")
            || m.ends_with("yaml") =>
        {
            Ok(content.to_owned())
        }
        other => Err(format!(
            "content type {other} is not text and cannot be shown to the model"
        )),
    }
}

fn html_to_markdown(html: &str) -> Result<String, String> {
    let converter = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec![
            "script", "style", "noscript", "svg", "nav", "footer", "iframe", "head",
        ])
        .build();
    converter
        .convert(html)
        .map(|markdown| markdown.trim().to_owned())
        .map_err(|e| format!("the page could not be converted to Markdown: {e}"))
}

/// The search backend's hits as the card's references and the model's numbered list.
pub fn search_outcome(
    search: &WebSearchInput,
    call_id: &str,
    hits: Result<Vec<SearchHit>, String>,
    env: &ToolEnv,
) -> ToolOutcome {
    let hits = match hits {
        Ok(hits) => hits,
        Err(message) => {
            return failed(
                search,
                call_id,
                &format!(
                    "searching the web for {:?} failed: {message}",
                    search.search_term
                ),
            );
        }
    };
    let mut text = if hits.is_empty() {
        format!("No web results for {:?}.", search.search_term)
    } else {
        format!("Web results for {:?}:", search.search_term)
    };
    for (n, hit) in hits.iter().enumerate() {
        let _ = write!(text, "\n\n{}. {}\n{}", n + 1, hit.title, hit.url);
        if !hit.snippet.trim().is_empty() {
            let _ = write!(text, "\n{}", hit.snippet.trim());
        }
    }
    let references = hits
        .into_iter()
        .map(|hit| pb::WebSearchReference {
            title: hit.title,
            url: hit.url,
            chunk: hit.snippet,
        })
        .collect();
    done(
        search,
        call_id,
        pb::WebSearchResult {
            result: Some(pb::web_search_result::Result::Success(
                pb::WebSearchSuccess { references },
            )),
        },
        truncate_for_model(&text, env.max_output_bytes, 0),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::tool_result::testing::{ended_step, env};

    #[test]
    fn a_rejected_search_is_the_tools_result_with_the_reason() {
        let search = WebSearchInput::parse(r#"{"search_term":"rust"}"#).unwrap();
        let response =
            interaction_response::Result::WebSearchRequestResponse(pb::WebSearchRequestResponse {
                result: Some(pb::web_search_request_response::Result::Rejected(
                    pb::web_search_request_response::Rejected {
                        reason: "too broad".into(),
                    },
                )),
            });
        let outcome = ended_step(search.on_response("c1", response, &env()));
        assert!(outcome.is_error);
        assert_eq!(
            outcome.model_text,
            "The user rejected searching the web for \"rust\" (too broad)."
        );
        let Some(tool_call::Tool::WebSearchToolCall(card)) = outcome.card.tool else {
            panic!("a WebSearch card")
        };
        assert!(matches!(
            card.result.and_then(|r| r.result),
            Some(pb::web_search_result::Result::Rejected(_))
        ));
    }

    #[test]
    fn a_failed_fetch_names_its_url_on_the_error_card() {
        let fetch = WebFetchInput::parse(r#"{"url":"https://example.com/"}"#).unwrap();
        let outcome = failed(&fetch, "c1", "HTTP 500");
        assert_eq!(outcome.model_text, "Error: HTTP 500");
        let Some(tool_call::Tool::WebFetchToolCall(card)) = outcome.card.tool else {
            panic!("a WebFetch card")
        };
        assert_eq!(
            card.result.and_then(|r| r.result),
            Some(pb::web_fetch_result::Result::Error(pb::WebFetchError {
                url: "https://example.com/".into(),
                error: "HTTP 500".into()
            }))
        );
    }
}
