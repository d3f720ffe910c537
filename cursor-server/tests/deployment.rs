//! The container image and the systemd unit: the Dockerfile builds in stages with the Cursor schema
//! mounted (never copied into a layer), runs as a non-root user with the database on a volume, and
//! sets only variables the binary reads; the unit starts the binary with a config and keeps keys in
//! an environment file. With a Docker daemon and the base images already present, the image is
//! built and run; otherwise that part says why it did not run (CI has no registry for images). The
//! team's compose file is read as YAML and each node's configuration checked by the server's own
//! validation; `docker compose config` checks it where Docker has compose. The HAProxy example in
//! `docs/deployment.md` streams RunSSE frames as they come.

use std::path::PathBuf;

fn repo_file(path: &str) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn help() -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cursor-server"))
        .arg("--help")
        .output()
        .expect("cursor-server --help");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_dockerfile_mounts_the_schema_and_runs_unprivileged_with_the_database_on_a_volume() {
    let dockerfile = repo_file("Dockerfile");
    let stages = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .count();
    assert!(stages >= 2, "a build stage and a runtime stage");
    assert!(
        dockerfile.contains("--mount=type=bind,from=schema"),
        "the schema is mounted from a build context"
    );
    let copies: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY"))
        .collect();
    assert!(
        copies
            .iter()
            .all(|l| !l.contains("proto") && !l.contains("schema")),
        "no schema is copied into a layer: {copies:?}"
    );
    let ignored = repo_file(".dockerignore");
    assert!(ignored.lines().any(|l| l.trim() == "cursor-proto/proto"));
    assert!(
        ignored.lines().any(|l| l.trim() == "cursor-byok.toml"),
        "no local config with keys"
    );
    let user = dockerfile
        .lines()
        .rev()
        .find(|l| l.starts_with("USER "))
        .expect("a USER line");
    assert!(!user.contains("root"), "{user}");
    assert!(dockerfile.contains("VOLUME [\"/data\"]"));
    assert!(
        dockerfile.contains("sqlite:///data/"),
        "the database is on the volume"
    );
    let help = help();
    for line in dockerfile.lines() {
        for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("CURSOR_BYOK_") {
                assert!(help.contains(word), "{word} is not read by cursor-server");
            }
        }
    }
}

#[test]
fn the_systemd_unit_starts_the_server_with_a_config_and_keys_from_a_private_file() {
    let unit = repo_file("deploy/cursor-byok.service");
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .expect("ExecStart");
    assert!(exec.contains("cursor-server --config "), "{exec}");
    assert!(
        unit.contains("EnvironmentFile="),
        "keys come from an environment file"
    );
    assert!(
        !unit.contains("sk-") || unit.contains("sk-..."),
        "no key in the unit"
    );
    assert!(unit.contains("WantedBy=default.target"), "a user unit");
    for line in unit.lines().filter(|l| l.starts_with("Environment=")) {
        let name = line["Environment=".len()..].split('=').next().unwrap();
        assert!(
            name == "NO_COLOR" || help().contains(name),
            "{name} is not read by cursor-server"
        );
    }
}

/// Builds and runs the image when Docker can do it here without a network.
#[test]
fn the_image_builds_and_runs_where_docker_and_its_base_images_are_present() {
    let docker = |args: &[&str]| {
        std::process::Command::new("docker")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !docker(&["info"]) {
        eprintln!("skipped: no Docker daemon here");
        return;
    }
    if !docker(&["image", "inspect", "rust:1.95-bookworm"])
        || !docker(&["image", "inspect", "debian:bookworm-slim"])
    {
        eprintln!("skipped: the base images are not present and may not be pulled here");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let schema = std::env::var("CURSOR_PROTO_DIR").expect("CURSOR_PROTO_DIR for the image build");
    let tag = "cursor-byok-test:latest";
    let built = std::process::Command::new("docker")
        .current_dir(&root)
        .args(["build", "--build-context"])
        .arg(format!("schema={schema}"))
        .args(["-t", tag, "."])
        .status()
        .expect("docker build");
    assert!(built.success(), "the image builds");
    let run = std::process::Command::new("docker")
        .args(["run", "--rm", tag, "--help"])
        .output()
        .expect("docker run");
    assert!(run.status.success());
    assert!(String::from_utf8_lossy(&run.stdout).contains("CURSOR_BYOK_CONFIG"));
}

/// The team's compose file: PostgreSQL and two nodes of one image, each with its own node name and
/// internal address, the secret and the database password from the environment (never a value in
/// the file), nginx in front on the host's loopback streaming RunSSE unbuffered and passing h2c,
/// and the nodes' internal routes kept from clients. Where Docker is present, `docker compose
/// config` accepts it.
#[test]
fn the_compose_file_runs_postgres_and_two_nodes_with_the_secret_from_the_environment() {
    let compose = repo_file("deploy/compose.yaml");
    assert!(compose.contains("image: postgres:"), "PostgreSQL");
    for node in ["node-a", "node-b"] {
        assert!(compose.contains(&format!("  {node}:\n")), "{node}");
        assert!(
            compose.contains(&format!("NODE_NAME: {node}")),
            "{node}'s name"
        );
    }
    assert!(compose.contains("[cluster]") && compose.contains("internal_url = \"http://%s:3000\""));
    assert!(compose.contains("CURSOR_BYOK_CLUSTER_SECRET: ${CURSOR_BYOK_CLUSTER_SECRET:?"));
    assert!(compose.contains("CURSOR_BYOK_DATABASE_URL: postgres://"));
    assert!(
        !compose.contains("POSTGRES_PASSWORD: ") || compose.contains("POSTGRES_PASSWORD: ${"),
        "no password in the file"
    );
    assert!(compose.contains("\"127.0.0.1:3000:3000\""), "loopback only");
    assert!(compose.contains("proxy_buffering off"), "RunSSE unbuffered");
    assert!(
        compose.contains("grpc_pass") && compose.contains("http2 on"),
        "h2c"
    );
    assert!(compose.contains("location /internal/ { return 404; }"));
    assert!(
        compose.contains("schema: ${CURSOR_PROTO_DIR"),
        "the schema mounted at build"
    );
    let help = help();
    for word in compose.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("CURSOR_BYOK_") && word != "CURSOR_BYOK_CLUSTER_SECRET" {
            assert!(help.contains(word), "{word} is not read by cursor-server");
        }
    }
    let docker_compose = std::process::Command::new("docker")
        .args(["compose", "version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !docker_compose {
        eprintln!("skipped `docker compose config`: no docker compose here");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let config = std::process::Command::new("docker")
        .current_dir(&root)
        .args(["compose", "-f", "deploy/compose.yaml", "config", "--quiet"])
        .env("CURSOR_PROTO_DIR", "/nonexistent-schema")
        .env("CURSOR_BYOK_CLUSTER_SECRET", "a-test-secret-0123456789")
        .env("POSTGRES_PASSWORD", "test")
        .output()
        .expect("docker compose config");
    assert!(
        config.status.success(),
        "{}",
        String::from_utf8_lossy(&config.stderr)
    );
}

/// deploy/compose.yaml read as YAML (Python's PyYAML, which resolves the file's anchors and merge
/// keys as Docker Compose does), as JSON; `None` where Python or PyYAML is missing.
fn compose_as_json() -> Option<serde_json::Value> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(root.join("deploy/compose.yaml"))
        .output()
        .ok()?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("No module named"),
            "deploy/compose.yaml is not valid YAML: {stderr}"
        );
        return None;
    }
    Some(serde_json::from_slice(&output.stdout).expect("JSON from the YAML"))
}

/// The compose file parsed: PostgreSQL healthy before either node starts, each node of the one
/// image on the database and secret of the environment, and the configuration each node's command
/// writes (the shared file plus its `[cluster]` table) accepted by the server's own validation
/// with the settings the README documents; nginx sends to both nodes. Where a Docker daemon with
/// compose exists, `docker compose config` (in the test above) checks it as Docker reads it.
#[test]
fn the_compose_file_parses_and_each_node_writes_a_configuration_the_server_accepts() {
    let Some(compose) = compose_as_json() else {
        eprintln!(
            "skipped: python3 with PyYAML (Debian's python3-yaml) is needed to read deploy/compose.yaml as YAML"
        );
        return;
    };
    let services = &compose["services"];
    assert!(
        services["postgres"]["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("postgres:"))
    );
    let readme = repo_file("README.md");
    let minimal = repo_file("cursor-server/cursor-byok.minimal.toml");
    for name in ["node-a", "node-b"] {
        let node = &services[name];
        assert_eq!(node["image"], "cursor-byok", "{name}");
        assert_eq!(
            node["depends_on"]["postgres"]["condition"], "service_healthy",
            "{name}"
        );
        let env = &node["environment"];
        assert_eq!(env["NODE_NAME"], name);
        let url = env["CURSOR_BYOK_DATABASE_URL"]
            .as_str()
            .expect("a database URL");
        assert!(url.starts_with("postgres://"), "{url}");
        assert!(
            env["CURSOR_BYOK_CLUSTER_SECRET"]
                .as_str()
                .is_some_and(|s| s.starts_with("${CURSOR_BYOK_CLUSTER_SECRET:?")),
            "the secret comes from the environment"
        );
        assert!(readme.contains("CURSOR_BYOK_DATABASE_URL"), "documented");
        assert!(
            repo_file("docs/deployment.md").contains("CURSOR_BYOK_CLUSTER_SECRET"),
            "documented"
        );
        // What the command appends to the shared file, with this node's name filled in.
        let script = node["command"][0].as_str().expect("the node's command");
        let printf = script
            .lines()
            .find(|l| l.trim_start().starts_with("printf"))
            .expect("the [cluster] table is appended");
        let format = printf
            .split('\'')
            .nth(1)
            .expect("printf's format")
            .replace("\\n", "\n")
            .replacen("%s", name, 2);
        for key in ["node_name", "internal_url", "lease_secs"] {
            assert!(format.contains(key), "{key}");
            assert!(readme.contains(&format!("`{key}`")), "{key} is documented");
        }
        let text = format!("{minimal}\n{format}");
        let config = cursor_server::config::Config::from_toml(
            &text,
            std::path::Path::new("node.toml"),
            &|var| match var {
                "OPENAI_API_KEY" => Some("sk-compose".to_owned()),
                "CURSOR_BYOK_CLUSTER_SECRET" => Some("a-compose-secret-0123456789".to_owned()),
                _ => None,
            },
        )
        .unwrap_or_else(|e| panic!("{name}'s configuration is refused: {e}"));
        let cluster = config.cluster.expect("a [cluster] table");
        assert_eq!(cluster.node_name, name);
        assert_eq!(cluster.internal_url, format!("http://{name}:3000"));
    }
    let nginx = compose["configs"]["nginx"]["content"]
        .as_str()
        .expect("nginx's configuration");
    assert!(nginx.contains("server node-a:3000;") && nginx.contains("server node-b:3000;"));
    assert_eq!(services["nginx"]["ports"][0], "127.0.0.1:3000:3000");
}

/// The sections of an HAProxy configuration: each `frontend`/`backend`/`defaults` line with the
/// indented lines under it.
fn haproxy_sections(config: &str) -> Vec<(String, Vec<String>)> {
    let mut sections: Vec<(String, Vec<String>)> = Vec::new();
    for line in config.lines() {
        let line = line.split('#').next().unwrap_or("").trim_end();
        if line.trim().is_empty() {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            if let Some((_, body)) = sections.last_mut() {
                body.push(line.trim().to_owned());
            }
        } else {
            sections.push((line.trim().to_owned(), Vec::new()));
        }
    }
    sections
}

/// The HAProxy example an operator copies: RunSSE and BidiAppend go to the HTTP/1.1 backend, and
/// unless that backend or the frontend sets `option http-no-delay`, HAProxy sends a streaming
/// response's data with `MSG_MORE` and the kernel holds each frame up to 200 ms (the load
/// generator measured more than half of all RunSSE events over 100 ms late through it).
#[test]
fn the_haproxy_example_streams_run_sse_frames_without_delay() {
    let document = repo_file("docs/deployment.md");
    let start = document
        .find("```haproxy\n")
        .expect("docs/deployment.md has an HAProxy example");
    let block = &document[start + "```haproxy\n".len()..];
    let block = &block[..block.find("```").expect("the example block ends")];
    let sections = haproxy_sections(block);
    let section = |name: &str| {
        sections
            .iter()
            .find(|(head, _)| head == name)
            .map(|(_, body)| body)
            .unwrap_or_else(|| panic!("the example has no `{name}` section"))
    };
    let frontend = section("frontend cursor");
    let default_backend = frontend
        .iter()
        .find_map(|line| line.strip_prefix("default_backend "))
        .expect("the frontend names the backend RunSSE goes to")
        .trim();
    let backend = section(&format!("backend {default_backend}"));
    let no_delay = |body: &Vec<String>| body.iter().any(|l| l == "option http-no-delay");
    assert!(
        no_delay(frontend) || no_delay(backend),
        "the HTTP/1.1 path ({default_backend}) needs `option http-no-delay`"
    );
    assert!(
        !backend.iter().any(|l| l.starts_with("proto h2")),
        "RunSSE's backend speaks HTTP/1.1"
    );
}
