//! Unit tests of `config.rs`: parsing, defaults, and the errors a bad file gets.
//!
//! Not in the plan's file list: they sit beside `config.rs` only to keep that file under the
//! 800-line limit once its own repetition was removed (a test module cannot live in another listed
//! file).

use super::*;
use crate::model::conversation::Mode;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml(text, Path::new("test.toml"), &|name| match name {
        "TEST_KEY" => Some("sk-test".to_owned()),
        _ => None,
    })
}

const PROVIDER: &str = r#"
        [[providers]]
        name = "p"
        kind = "openai-chat"
        base_url = "http://127.0.0.1:9/v1/"
        api_key_env = "TEST_KEY"
        [[providers.models]]
        id = "m1"
        display_name = "Model One"
        reasoning = true
    "#;

#[test]
fn defaults_apply_and_key_comes_from_env() {
    let config = parse(PROVIDER).expect("valid");
    assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
    assert_eq!(config.default_model, "m1");
    let provider = &config.providers[0];
    assert_eq!(provider.keys.len(), 1);
    assert_eq!(provider.keys[0].secret.expose(), "sk-test");
    assert_eq!(provider.keys[0].source(), "TEST_KEY");
    assert_eq!(provider.base_url, "http://127.0.0.1:9/v1");
    assert!(provider.models[0].reasoning);
    assert_eq!(format!("{:?}", provider.keys[0].secret), "Secret(***)");
}

#[test]
fn the_database_pool_has_defaults_and_takes_its_bounds_from_the_file() {
    let config = parse(PROVIDER).expect("valid");
    assert_eq!(
        config.database_max_connections,
        DEFAULT_DATABASE_MAX_CONNECTIONS
    );
    assert_eq!(config.database_max_connections, 16);
    assert_eq!(config.database_acquire_timeout, Duration::from_millis(5000));
    let config = parse(&format!(
        "database_max_connections = 40\ndatabase_acquire_timeout_ms = 750\n{PROVIDER}"
    ))
    .expect("valid");
    assert_eq!(config.database_max_connections, 40);
    assert_eq!(config.database_acquire_timeout, Duration::from_millis(750));
    let err = parse(&format!("database_max_connections = 0\n{PROVIDER}")).unwrap_err();
    assert!(
        err.to_string().contains("database_max_connections"),
        "{err}"
    );
}

#[test]
fn unknown_kind_is_named() {
    let err = parse(&PROVIDER.replace("openai-chat", "gemini")).unwrap_err();
    assert!(err.to_string().contains("unknown kind \"gemini\""), "{err}");
}

#[test]
fn missing_key_env_is_named() {
    let err = parse(&PROVIDER.replace("TEST_KEY", "NOPE_KEY")).unwrap_err();
    assert!(err.to_string().contains("NOPE_KEY"), "{err}");
}

#[test]
fn duplicate_model_ids_are_rejected_across_providers() {
    let text = format!(
        "{PROVIDER}{}",
        PROVIDER.replace("name = \"p\"", "name = \"q\"")
    );
    let err = parse(&text).unwrap_err();
    assert!(
        matches!(&err, ConfigError::DuplicateModel { model, first, second } if model == "m1" && first == "p" && second == "q"),
        "{err}"
    );
}

#[test]
fn duplicate_model_ids_are_rejected_within_a_provider() {
    let text = format!("{PROVIDER}\n[[providers.models]]\nid = \"m1\"\n");
    let err = parse(&text).unwrap_err();
    assert!(matches!(err, ConfigError::DuplicateModel { .. }), "{err}");
}

#[test]
fn unknown_default_model_lists_configured_ones() {
    let err = parse(&format!("default_model = \"zz\"\n{PROVIDER}")).unwrap_err();
    assert!(err.to_string().contains("configured: m1"), "{err}");
}

#[test]
fn unknown_fields_are_rejected() {
    let err = parse(&format!("lisen = \"x\"\n{PROVIDER}")).unwrap_err();
    assert!(err.to_string().contains("lisen"), "{err}");
}

#[test]
fn the_minimal_config_needs_one_key_and_is_valid() {
    let text = include_str!("../../cursor-byok.minimal.toml");
    let config = Config::from_toml(text, Path::new("minimal"), &|name| {
        (name == "OPENAI_API_KEY").then(|| "sk-x".to_owned())
    })
    .expect("the shipped minimal config must validate with OPENAI_API_KEY alone");
    assert_eq!(config.providers.len(), 1);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn example_config_is_valid() {
    let text = include_str!("../../cursor-byok.example.toml");
    let config = Config::from_toml(text, Path::new("example"), &|name| {
        name.ends_with("_API_KEY").then(|| "sk-x".to_owned())
    })
    .expect("the shipped example config must validate");
    assert!(config.resolve_model(&config.default_model).is_some());
    // Cursor's "Auto" sends the id `default`: it is the configured default model.
    let auto = config.resolve_model(AUTO_MODEL_ID).expect("Auto resolves");
    let default = config.resolve_model(&config.default_model).unwrap();
    assert_eq!(
        (auto.provider, auto.model),
        (default.provider, default.model)
    );
}
#[test]
fn every_example_configuration_in_the_provider_docs_loads() {
    let docs = include_str!("../../../docs/providers.md");
    let blocks: Vec<&str> = docs
        .split("```toml\n")
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default())
        .collect();
    assert!(blocks.len() >= 8, "one example per provider kind");
    for block in blocks {
        let env = |name: &str| {
            name.ends_with("_API_KEY")
                .then(|| "key-from-env".to_owned())
        };
        let config = Config::from_toml(block, Path::new("docs.toml"), &env)
            .unwrap_or_else(|e| panic!("{e} in:\n{block}"));
        assert!(!config.providers[0].models.is_empty());
    }
}

#[test]
fn a_self_hosted_model_without_a_context_window_gets_a_warning() {
    let local = parse(PROVIDER).expect("valid");
    assert_eq!(local.warnings.len(), 1, "{:?}", local.warnings);
    assert!(
        local.warnings[0].contains("\"m1\"") && local.warnings[0].contains("context_window"),
        "{:?}",
        local.warnings
    );
    let set = parse(&PROVIDER.replace(
        "reasoning = true",
        "reasoning = true\ncontext_window = 8192",
    ))
    .expect("valid");
    assert!(set.warnings.is_empty(), "{:?}", set.warnings);
    let cloud = parse(&PROVIDER.replace("http://127.0.0.1:9/v1/", "https://api.openai.com/v1"))
        .expect("valid");
    assert!(cloud.warnings.is_empty(), "{:?}", cloud.warnings);
}

#[test]
fn local_urls_are_loopback_private_and_local_names() {
    for url in [
        "http://127.0.0.1:8080/v1",
        "http://localhost:11434/v1",
        "http://192.168.1.20:8000/v1",
        "http://10.0.0.5/v1",
        "http://[::1]:8080/v1",
        "http://gpu-box.local:8080/v1",
    ] {
        assert!(is_local_url(url), "{url}");
    }
    for url in [
        "https://api.openai.com/v1",
        "http://8.8.8.8/v1",
        "not a url",
    ] {
        assert!(!is_local_url(url), "{url}");
    }
}

#[test]
fn routes_honour_the_providers_proxy_then_local_addresses_then_the_environment() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        }
    };
    let proxied = env(&[
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("http_proxy", "http://p2:8080"),
    ]);
    assert_eq!(
        Route::resolve("http://127.0.0.1:8080/v1", None, &proxied),
        Route::Direct { local: true }
    );
    assert_eq!(
        Route::resolve("https://api.openai.com/v1", None, &proxied),
        Route::Proxy {
            proxy: "http://proxy:3128".to_owned(),
            source: "HTTPS_PROXY".to_owned()
        }
    );
    assert_eq!(
        Route::resolve("http://models.example.com/v1", None, &proxied).proxy(),
        Some("http://p2:8080"),
        "lower-case variables count too"
    );
    let excluded = env(&[
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("NO_PROXY", "localhost,.openai.com"),
    ]);
    assert_eq!(
        Route::resolve("https://api.openai.com/v1", None, &excluded),
        Route::Direct { local: false }
    );
    let own = Route::resolve(
        "http://127.0.0.1:8080/v1",
        Some("socks5://me:secret@gate:1080"),
        &proxied,
    );
    assert_eq!(own.proxy(), Some("socks5://me:secret@gate:1080"));
    let shown = own.shown();
    assert!(
        shown.contains("socks5://gate:1080") && !shown.contains("secret"),
        "{shown}"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let text = r#"
        listen = "not an address"
        heartbeat_interval_ms = 0

        [[providers]]
        name = "a"
        kind = "gemini"
        base_url = "http://127.0.0.1:9/v1"
        api_key = "k"
        [[providers.models]]
        id = "m1"

        [[providers]]
        name = "b"
        kind = "openai-chat"
        base_url = "https://api.example.com/v1"
        api_key_env = "UNSET_VARIABLE"
        [[providers.models]]
        id = "m2"
    "#;
    let error = parse(text).unwrap_err().to_string();
    assert!(error.starts_with("4 problems"), "{error}");
    for part in [
        "invalid listen address",
        "heartbeat_interval_ms must be greater than zero",
        "unknown kind \"gemini\"",
        "UNSET_VARIABLE",
    ] {
        assert!(error.contains(part), "{part} missing from: {error}");
    }
}

#[test]
fn a_key_pasted_as_api_key_env_is_refused_without_being_printed() {
    let key = "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789";
    let error = parse(&PROVIDER.replace("TEST_KEY", key))
        .unwrap_err()
        .to_string();
    assert!(error.contains("looks like a key"), "{error}");
    assert!(
        !error.contains("abcdefghij"),
        "the key is never printed: {error}"
    );
    assert!(
        parse(&PROVIDER.replace("TEST_KEY", "MY_LLM_KEY_2"))
            .is_err_and(|e| !e.to_string().contains("looks like a key"))
    );
}

#[test]
fn several_keys_come_from_a_list_of_variables_or_of_keys_in_order() {
    let env = |name: &str| match name {
        "KEY_1" => Some("sk-one".to_owned()),
        "KEY_2" => Some("sk-two".to_owned()),
        _ => None,
    };
    let text = PROVIDER.replace(
        "api_key_env = \"TEST_KEY\"",
        "api_key_envs = [\"KEY_1\", \"KEY_2\"]",
    );
    let config = Config::from_toml(&text, Path::new("test.toml"), &env).expect("valid");
    let keys = &config.providers[0].keys;
    assert_eq!(
        keys.iter()
            .map(|k| (k.secret.expose(), k.source()))
            .collect::<Vec<_>>(),
        [("sk-one", "KEY_1"), ("sk-two", "KEY_2")]
    );
    let text = PROVIDER.replace("api_key_env = \"TEST_KEY\"", "api_keys = [\"a\", \"b\"]");
    let keys = parse(&text).expect("valid").providers[0].keys.clone();
    assert_eq!(
        keys.iter()
            .map(|k| (k.secret.expose(), k.source()))
            .collect::<Vec<_>>(),
        [("a", "inline"), ("b", "inline")]
    );
    assert_eq!(
        parse(PROVIDER).unwrap().key_cooldown,
        KeyCooldown::default()
    );
    let tuned = format!("key_cooldown_secs = 5\nkey_refused_cooldown_secs = 7\n{PROVIDER}");
    assert_eq!(
        parse(&tuned).unwrap().key_cooldown,
        KeyCooldown {
            rate_limited: Duration::from_secs(5),
            refused: Duration::from_secs(7),
        }
    );
}

#[test]
fn an_empty_key_list_an_unset_variable_in_a_list_and_mixed_forms_are_each_reported() {
    let provider = |name: &str, keys: &str| {
        PROVIDER
            .replace("name = \"p\"", &format!("name = \"{name}\""))
            .replace("id = \"m1\"", &format!("id = \"m-{name}\""))
            .replace("api_key_env = \"TEST_KEY\"", keys)
    };
    let text = [
        provider("empty", "api_key_envs = []"),
        provider(
            "unset",
            "api_key_envs = [\"TEST_KEY\", \"UNSET_1\", \"UNSET_2\"]",
        ),
        provider("mixed", "api_key = \"k\"\napi_keys = [\"k2\"]"),
        provider("empty-inline", "api_keys = []"),
    ]
    .concat();
    let error = parse(&text).unwrap_err().to_string();
    assert!(error.starts_with("5 problems"), "{error}");
    for part in [
        "provider \"empty\": api_key_envs is an empty list",
        "provider \"unset\": environment variable UNSET_1 (api_key_envs) is not set",
        "provider \"unset\": environment variable UNSET_2 (api_key_envs) is not set",
        "provider \"mixed\": the key is given in more than one way (api_key, api_keys)",
        "provider \"empty-inline\": api_keys is an empty list",
    ] {
        assert!(error.contains(part), "{part} missing from: {error}");
    }
}

#[test]
fn the_same_key_listed_twice_is_a_warning_that_does_not_print_it() {
    let cloud = PROVIDER.replace("http://127.0.0.1:9/v1/", "https://api.example.com/v1");
    let once = cloud.replace(
        "api_key_env = \"TEST_KEY\"",
        "api_keys = [\"sk-a\", \"sk-b\"]",
    );
    assert!(parse(&once).expect("valid").warnings.is_empty());
    let twice = cloud.replace(
        "api_key_env = \"TEST_KEY\"",
        "api_keys = [\"sk-a\", \"sk-a\"]",
    );
    let warnings = parse(&twice)
        .expect("valid, but probably not meant")
        .warnings;
    assert!(
        warnings.len() == 1 && warnings[0].contains("the same entry twice in api_keys"),
        "{warnings:?}"
    );
    assert!(!warnings[0].contains("sk-a"), "the key is not printed");
}

const ROUTED: &str = r#"
        default_model = "big"
        [[providers]]
        name = "p"
        kind = "openai-chat"
        base_url = "http://127.0.0.1:9/v1/"
        api_key_env = "TEST_KEY"
        [[providers.models]]
        id = "big"
        aliases = ["composer-*", "gpt-5"]
        fallbacks = ["small"]
        [[providers.models]]
        id = "small"
        context_window = 8000
        aliases = ["*"]
        context_fallback = "big"
        [modes]
        ask = "small"
        [subagents]
        explore = "small"
    "#;

#[test]
fn names_cursor_sends_are_routed_by_alias_pattern_mode_and_subagent() {
    let config = parse(ROUTED).expect("valid");
    let route = |name: &str, mode: Mode, subagent: Option<&str>| {
        let routed = config
            .route(RouteRequest {
                name,
                mode,
                subagent,
            })
            .expect("routed");
        let (_, model) = config.chosen(&routed.choice);
        (model.id.clone(), routed.by, routed.choice.implied)
    };
    assert_eq!(route("big", Mode::Ask, None).0, "big", "an exact id wins");
    assert_eq!(
        route("composer-1", Mode::Agent, None),
        ("big".into(), RoutedBy::Alias("composer-*".into()), vec![])
    );
    assert_eq!(
        route("gpt-5-high", Mode::Agent, None).2,
        vec![("reasoning_effort".to_owned(), "high".to_owned())],
        "an alias keeps its effort suffix as a parameter"
    );
    assert_eq!(
        route("anything", Mode::Agent, None).0,
        "small",
        "the catch-all"
    );
    assert_eq!(
        route("default", Mode::Ask, None),
        ("small".into(), RoutedBy::Mode(Mode::Ask), vec![])
    );
    assert_eq!(
        route("default", Mode::Agent, None),
        ("big".into(), RoutedBy::Auto, vec![])
    );
    assert_eq!(
        route("composer-2", Mode::Agent, Some("explore")).1,
        RoutedBy::Subagent("explore".into())
    );
    assert_eq!(
        route("big", Mode::Agent, Some("explore")).0,
        "big",
        "the subagent's own configured model wins"
    );
    let fallbacks = config.fallbacks_of("big");
    assert_eq!(config.chosen(&fallbacks[0]).1.id, "small");
    let table = config.routing_table().join("\n");
    for line in [
        "alias \"gpt-5\" → big",
        "pattern \"composer-*\" → big",
        "pattern \"*\" → small",
        "mode ask (Auto or an alias) → small",
        "subagent explore (Auto or an alias) → small",
        "fallbacks of big: small",
        "too large for small: big (instead of compacting)",
    ] {
        assert!(table.contains(line), "{line:?} missing in\n{table}");
    }
}

#[test]
fn bad_routing_is_reported_with_every_other_problem() {
    let text = ROUTED
        .replace(
            r#"fallbacks = ["small"]"#,
            r#"fallbacks = ["big", "nowhere"]"#,
        )
        .replace(
            r#"context_fallback = "big""#,
            r#"context_fallback = "small""#,
        )
        .replace(r#"ask = "small""#, r#"ask = "missing""#)
        .replace(r#"aliases = ["*"]"#, r#"aliases = ["gpt-5"]"#);
    let error = parse(&text).expect_err("invalid").to_string();
    for expected in [
        "model \"big\": falls back to itself",
        "model \"big\": fallback \"nowhere\" is not a configured model",
        "not larger than its own",
        "[modes] ask names \"missing\"",
        "alias \"gpt-5\" is claimed by two models",
    ] {
        assert!(
            error.contains(expected),
            "{expected:?} missing in:\n{error}"
        );
    }
}

#[test]
fn a_cluster_table_needs_a_usable_url_and_a_long_enough_secret_from_the_environment() {
    let with = |cluster: &str, secret: Option<&str>| {
        let text = format!("{PROVIDER}\n[cluster]\n{cluster}");
        let secret = secret.map(str::to_owned);
        Config::from_toml(&text, Path::new("test.toml"), &move |name| match name {
            "TEST_KEY" => Some("sk-test".to_owned()),
            "CURSOR_BYOK_CLUSTER_SECRET" => secret.clone(),
            _ => None,
        })
    };
    let good = "node_name = \"a\"\ninternal_url = \"http://10.0.0.5:3000/\"";
    let config = with(good, Some("0123456789abcdef0123")).expect("valid");
    let cluster = config.cluster.expect("[cluster]");
    assert_eq!(cluster.node_name, "a");
    assert_eq!(cluster.internal_url, "http://10.0.0.5:3000");
    assert_eq!(cluster.lease, Duration::from_secs(15));
    assert!(
        !format!("{cluster:?}").contains("0123456789abcdef"),
        "never printed"
    );
    let missing = with(good, None).expect_err("no secret").to_string();
    assert!(missing.contains("CURSOR_BYOK_CLUSTER_SECRET"), "{missing}");
    let short = with(good, Some("short")).expect_err("short").to_string();
    assert!(short.contains("shorter than 16"), "{short}");
    let url = with(
        "node_name = \"a\"\ninternal_url = \"10.0.0.5:3000\"",
        Some("0123456789abcdef"),
    )
    .expect_err("no scheme")
    .to_string();
    assert!(url.contains("internal_url"), "{url}");
    assert!(
        parse(PROVIDER).expect("valid").cluster.is_none(),
        "absent: one node"
    );
}
