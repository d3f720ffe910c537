//! A headless Chromium driven through chromedriver (fantoccini) for the pages' browser tests: the
//! console's and the capture debugger's. Skipped where the machine has neither, unless
//! `CURSOR_BYOK_BROWSER_TESTS=1` (as `.ci/run` sets) makes their absence a failure.
#![allow(dead_code)]

/// A headless Chromium driven through chromedriver, or `None` (with the reason printed) where the
/// machine has neither — unless `CURSOR_BYOK_BROWSER_TESTS=1` (as `.ci/run` sets), which makes
/// their absence a failure.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: tokio::process::Child,
    driver_url: String,
}

impl Browser {
    pub async fn start() -> Option<Browser> {
        let required = std::env::var("CURSOR_BYOK_BROWSER_TESTS").is_ok_and(|v| v == "1");
        let found = |name: &str| {
            std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| dir.join(name).is_file())
            })
        };
        if !found("chromedriver") || !found("chromium") {
            assert!(!required, "chromium and chromedriver are required here");
            eprintln!("skipped: chromium or chromedriver is not installed");
            return None;
        }
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let driver = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromedriver starts");
        let driver_url = format!("http://127.0.0.1:{port}");
        // Wait for chromedriver to answer (bounded), not for a guessed delay.
        let ready = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                if reqwest::get(format!("{driver_url}/status")).await.is_ok() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(ready.is_ok(), "chromedriver answers");
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".to_owned(),
            serde_json::json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--window-size=1280,900"]}),
        );
        capabilities.insert(
            "goog:loggingPrefs".to_owned(),
            serde_json::json!({"browser": "ALL"}),
        );
        let client = fantoccini::ClientBuilder::rustls()
            .expect("a WebDriver client")
            .capabilities(capabilities)
            .connect(&driver_url)
            .await
            .expect("a Chromium session");
        Some(Browser {
            client,
            driver,
            driver_url,
        })
    }

    /// Opens `url`, checks the browser logged no error, and saves a screenshot as `name` when
    /// `CURSOR_BYOK_SCREENSHOTS` names a directory (how docs/console/ is made).
    pub async fn open(&self, url: &str, name: &str) {
        self.client.goto(url).await.expect("page loads");
        let errors = self.console_errors().await;
        assert!(errors.is_empty(), "{url}: console errors {errors:#?}");
        self.screenshot(name).await;
    }

    /// Saves a screenshot of the page as `name` when `CURSOR_BYOK_SCREENSHOTS` names a directory.
    pub async fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("CURSOR_BYOK_SCREENSHOTS") {
            let png = self.client.screenshot().await.expect("screenshot");
            std::fs::write(std::path::Path::new(&dir).join(format!("{name}.png")), png)
                .expect("screenshot written");
        }
    }

    /// The visible text of the first element `locator` finds.
    pub async fn text_of(&self, locator: fantoccini::Locator<'_>) -> String {
        self.client
            .find(locator)
            .await
            .expect("the element")
            .text()
            .await
            .expect("its text")
    }

    /// The browser's log entries of level SEVERE since the last call (chromedriver's log API).
    pub async fn console_errors(&self) -> Vec<String> {
        let session = self
            .client
            .session_id()
            .await
            .unwrap()
            .expect("a session id");
        let logs: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/session/{session}/se/log", self.driver_url))
            .json(&serde_json::json!({"type": "browser"}))
            .send()
            .await
            .expect("log request")
            .json()
            .await
            .expect("log JSON");
        logs["value"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|entry| entry["level"] == "SEVERE")
            .map(|entry| entry["message"].to_string())
            .collect()
    }

    pub async fn count(&self, css: &str) -> usize {
        self.client
            .find_all(fantoccini::Locator::Css(css))
            .await
            .expect("query")
            .len()
    }

    pub async fn close(mut self) {
        let _ = self.client.close().await;
        let _ = self.driver.kill().await;
    }
}
