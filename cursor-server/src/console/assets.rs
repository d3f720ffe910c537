//! The console's static assets, compiled into the binary (the console works offline and fetches
//! nothing from elsewhere): the stylesheet and the overview's live-list script, their route, the
//! content tag in their URLs that lets browsers keep them for a year, and the pages' rendering
//! with the Content-Security-Policy that keeps every page to those assets.

use std::sync::OnceLock;

use askama::Template;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use sha2::{Digest, Sha256};

/// Each asset: its name under `/console/static/`, its content type and its bytes.
const ASSETS: [(&str, &str, &str); 2] = [
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../templates/console/static/console.css"),
    ),
    (
        "live.js",
        "text/javascript; charset=utf-8",
        include_str!("../../templates/console/static/live.js"),
    ),
];

/// What a page may load: its own assets and API only. Nothing inline runs (no script or style
/// in the markup), and no other site may frame it.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'";

/// The first hex digits of the assets' hash: a new build with other assets gets new URLs, so a
/// browser's year-long copy is never stale.
fn tag() -> &'static str {
    static TAG: OnceLock<String> = OnceLock::new();
    TAG.get_or_init(|| {
        let mut hash = Sha256::new();
        for (name, _, body) in ASSETS {
            hash.update(name);
            hash.update(body);
        }
        hex::encode(&hash.finalize()[..6])
    })
}

/// The URL a page links an asset by (`/console/static/console.css?v=…`); the templates call it.
pub fn url(name: &str) -> String {
    format!("/console/static/{name}?v={}", tag())
}

/// `GET /console/static/{name}`.
pub async fn serve(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(known, _, _)| *known == name) {
        Some((_, content_type, body)) => (
            [
                (header::CONTENT_TYPE, *content_type),
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ],
            *body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "no such console asset").into_response(),
    }
}

/// A page rendered from its template, with the status given, never cached (it shows the state
/// now) and held to `CSP`.
pub fn page(status: StatusCode, template: &impl Template) -> Response {
    let mut response = match template.render() {
        Ok(html) => (status, Html(html)).into_response(),
        Err(error) => {
            // Only a failing `Display` gets here; the page cannot be shown, the log says why.
            tracing::error!(%error, "a console page could not be rendered");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "the page could not be rendered; see the server log",
            )
                .into_response()
        }
    };
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    response
}
