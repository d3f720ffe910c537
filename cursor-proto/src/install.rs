//! Where a user's Cursor keeps its protocol, and loading a schema from any place a person may name.
//!
//! Owns the knowledge of Cursor's install layouts (macOS `.app`, Linux packages, an extracted AppImage,
//! Windows), of the bundle that carries the agent protocol (`cursor-always-local/dist/main.js`), of where the
//! version is written (`product.json`, `package.json`), and of telling a schema directory from an install.

use std::path::{Path, PathBuf};

use prost_types::FileDescriptorSet;

use crate::extract::{ExtractError, Extraction, extract_files};

/// The extension whose bundle carries the agent protocol.
pub const EXTENSION: &str = "cursor-always-local";

/// The bundle's path below an `extensions` directory.
const BUNDLE_IN_EXTENSIONS: &str = "cursor-always-local/dist/main.js";

/// Layouts an install may have, from the directory a person names to `resources/app`.
const APP_DIRS: &[&str] = &[
    "",                               // resources/app itself
    "resources/app", // Linux /usr/share/cursor, /opt/Cursor, Windows, AppImage root
    "Contents/Resources/app", // macOS Cursor.app
    "usr/share/cursor/resources/app", // an extracted AppImage (squashfs-root)
    "squashfs-root/usr/share/cursor/resources/app",
    "squashfs-root/resources/app",
];

/// A bundle found for a path, with what is known about its install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The agent extension's bundle (or the file named).
    pub bundle: PathBuf,
    /// Every file to read: `bundle` first, then the other bundles of the install (or of the extension named)
    /// that carry protocol types, such as lazy-loaded chunks and other extensions, in path order.
    pub bundles: Vec<PathBuf>,
    /// `resources/app` of the install, when the bundle sits inside one.
    pub app_dir: Option<PathBuf>,
    /// Cursor's version from the app's `product.json` or `package.json`.
    pub version: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("no Cursor install found; looked in:\n{}\nname one: `cursor-proto extract /path/to/Cursor --out DIR` (or set CURSOR_APP_DIR)", list(.looked))]
    NotFound { looked: Vec<PathBuf> },
    #[error("{path}: no Cursor bundle there (looked for {})", list_inline(.looked))]
    NoBundle { path: PathBuf, looked: Vec<PathBuf> },
    #[error(transparent)]
    Extract(#[from] ExtractError),
    #[error("{dir}: the schema there does not compile: {message}")]
    Compile { dir: PathBuf, message: String },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("  - {}", p.display()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn list_inline(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The standard places for this OS, `CURSOR_APP_DIR` first when set.
pub fn standard_places() -> Vec<PathBuf> {
    let mut places = Vec::new();
    if let Some(dir) = std::env::var_os("CURSOR_APP_DIR") {
        places.push(PathBuf::from(dir));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    if cfg!(target_os = "macos") {
        places.push(PathBuf::from("/Applications/Cursor.app"));
        if let Some(home) = &home {
            places.push(home.join("Applications/Cursor.app"));
        }
    } else if cfg!(windows) {
        if let Some(local) = std::env::var_os("LOCALAPPDATA") {
            places.push(PathBuf::from(local).join("Programs").join("cursor"));
        }
    } else {
        places.push(PathBuf::from("/usr/share/cursor"));
        places.push(PathBuf::from("/opt/Cursor"));
        places.push(PathBuf::from("/opt/cursor"));
        if let Some(home) = &home {
            places.push(home.join("Applications/cursor"));
            places.push(home.join(".local/share/cursor"));
        }
    }
    places
}

/// Finds the protocol bundle: in `path` when given (an install, its `resources/app`, an `extensions`
/// directory, the extension's directory or a `.js` file), else in the standard places.
pub fn locate(path: Option<&Path>) -> Result<Located, InstallError> {
    match path {
        Some(path) => locate_in(path),
        None => {
            let places = standard_places();
            let mut looked = Vec::new();
            for place in &places {
                match locate_in(place) {
                    Ok(found) => return Ok(found),
                    Err(InstallError::NoBundle { .. }) => looked.push(place.clone()),
                    Err(other) => return Err(other),
                }
            }
            Err(InstallError::NotFound { looked })
        }
    }
}

fn locate_in(path: &Path) -> Result<Located, InstallError> {
    if path.is_file() {
        let app_dir = path
            .ancestors()
            .find(|dir| dir.join("product.json").is_file())
            .map(Path::to_path_buf);
        return Ok(Located {
            bundle: path.to_owned(),
            bundles: vec![path.to_owned()],
            version: app_dir.as_deref().and_then(version_of),
            app_dir,
        });
    }
    let mut looked = Vec::new();
    for app in APP_DIRS {
        let app_dir = path.join(app);
        let bundle = app_dir.join("extensions").join(BUNDLE_IN_EXTENSIONS);
        if bundle.is_file() {
            let mut bundles = vec![bundle.clone()];
            bundles.extend(protocol_bundles(&app_dir.join("extensions"), &bundle));
            return Ok(Located {
                bundle,
                bundles,
                version: version_of(&app_dir),
                app_dir: Some(app_dir),
            });
        }
        looked.push(bundle);
    }
    // An `extensions` directory, or the extension's own directory: its bundles (every extension's for an
    // `extensions` directory) are read besides the main one.
    for candidate in [path.join(BUNDLE_IN_EXTENSIONS), path.join("dist/main.js")] {
        if candidate.is_file() {
            let mut found = locate_in(&candidate)?;
            found.bundles.extend(protocol_bundles(path, &found.bundle));
            return Ok(found);
        }
        looked.push(candidate);
    }
    Err(InstallError::NoBundle {
        path: path.to_owned(),
        looked,
    })
}

/// Directories never searched for bundles: dependencies carry no build of Cursor's own protocol.
const SKIPPED_DIRS: &[&str] = &["node_modules", ".git"];

/// Every `.js` file below `root` (other than `main`) that carries protocol types, in path order. Only the
/// text is searched, for the package names as v1 writes them (`"agent.v1.`) or as they appear inside v2's
/// base64 descriptors, so files without the protocol cost one read.
pub fn protocol_bundles(root: &Path, main: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    collect_js(root, &mut files, 0);
    files.sort();
    let needles = protocol_needles();
    files
        .into_iter()
        .filter(|file| file != main)
        .filter(|file| {
            std::fs::read(file).is_ok_and(|bytes| {
                needles
                    .iter()
                    .any(|n| memchr::memmem::find(&bytes, n).is_some())
            })
        })
        .collect()
}

fn collect_js(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    // Extensions keep their bundles a few levels down (`extensions/x/dist/chunks/1.js`).
    if depth > 6 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            let skipped = entry
                .file_name()
                .to_str()
                .is_some_and(|name| SKIPPED_DIRS.contains(&name));
            if !skipped {
                collect_js(&path, out, depth + 1);
            }
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "js") {
            out.push(path);
        }
    }
}

/// The protocol packages as v1 writes them, and as their bytes read in base64 at each of the three
/// alignments (the characters that depend on the bytes around them dropped).
fn protocol_needles() -> Vec<Vec<u8>> {
    let mut needles = Vec::new();
    for package in ["agent.v1", "aiserver.v1"] {
        needles.push(format!("\"{package}.").into_bytes());
        for shift in 0..3 {
            let mut bytes = vec![0u8; shift];
            bytes.extend_from_slice(package.as_bytes());
            let text = base64(&bytes);
            // Character i covers bits 6i..6i+6; keep those inside the package's bits.
            let first = (8 * shift).div_ceil(6);
            let last = (8 * bytes.len()) / 6;
            needles.push(text.as_bytes()[first..last].to_vec());
        }
    }
    needles
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// The file `extract` writes beside the `.proto` files: which Cursor version and files the schema came from,
/// so a server built from the directory later can say it (the `.proto` files themselves cannot).
pub const RECORD_FILE: &str = "SOURCE";

/// The text of [`RECORD_FILE`] for a schema extracted from `found`.
pub fn record(found: &Located, fingerprint: &str) -> String {
    let mut text =
        String::from("# Written by `cursor-proto extract`: where this schema came from.\n");
    if let Some(version) = &found.version {
        text.push_str(&format!("cursor-version {version}\n"));
    }
    text.push_str(&format!("fingerprint {fingerprint}\n"));
    for bundle in &found.bundles {
        text.push_str(&format!("bundle {}\n", bundle.display()));
    }
    text
}

/// The Cursor version a schema directory was extracted from, when its [`RECORD_FILE`] says.
pub fn recorded_version(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(RECORD_FILE)).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("cursor-version "))
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// Cursor's version as the app states it.
pub fn version_of(app_dir: &Path) -> Option<String> {
    for (file, keys) in [
        ("product.json", &["cursorVersion", "version"][..]),
        ("package.json", &["version"][..]),
    ] {
        let Ok(text) = std::fs::read_to_string(app_dir.join(file)) else {
            continue;
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
            continue;
        };
        for key in keys {
            if let Some(version) = json.get(key).and_then(|v| v.as_str()) {
                return Some(version.to_owned());
            }
        }
    }
    None
}

/// Where a loaded schema came from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A directory of `.proto` files.
    SchemaDir(PathBuf),
    /// Extracted from a bundle.
    Bundle(Located),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::SchemaDir(dir) => write!(f, "schema directory {}", dir.display()),
            Origin::Bundle(found) => {
                write!(f, "{}", found.bundle.display())?;
                if let Some(version) = &found.version {
                    write!(f, " (Cursor {version})")?;
                }
                Ok(())
            }
        }
    }
}

/// A schema read from a directory or extracted from an install.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub origin: Origin,
    pub descriptors: FileDescriptorSet,
    /// Present when the schema was extracted.
    pub extraction: Option<Extraction>,
}

/// Reads a schema from anything a person may name: a directory holding `.proto` files (one per package,
/// `agent_v1.proto` and friends), a Cursor install, an `extensions` directory or a bundle.
pub fn load(path: &Path) -> Result<Loaded, InstallError> {
    if path.is_dir() && path.join("agent_v1.proto").is_file() {
        return Ok(Loaded {
            origin: Origin::SchemaDir(path.to_owned()),
            descriptors: compile_dir(path)?,
            extraction: None,
        });
    }
    load_found(locate(Some(path))?)
}

/// Extracts the schema of a located install: every bundle of it that carries protocol types.
pub fn load_found(found: Located) -> Result<Loaded, InstallError> {
    let extraction = extract_files(&found.bundles)?;
    Ok(Loaded {
        descriptors: extraction.descriptors.clone(),
        origin: Origin::Bundle(found),
        extraction: Some(extraction),
    })
}

/// Compiles the package files of a schema directory: every top-level `name.proto` whose stem has no further
/// dot (so a side file such as `agent_v1.cli-client-view.proto` is not mixed in).
pub fn compile_dir(dir: &Path) -> Result<FileDescriptorSet, InstallError> {
    let entries = std::fs::read_dir(dir).map_err(|source| InstallError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let mut files: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| {
            name.strip_suffix(".proto")
                .is_some_and(|stem| !stem.contains('.'))
        })
        .collect();
    files.sort();
    let compile_error = |message: String| InstallError::Compile {
        dir: dir.to_owned(),
        message,
    };
    let mut compiler = protox::Compiler::new([dir]).map_err(|e| compile_error(e.to_string()))?;
    compiler.include_imports(true);
    compiler
        .open_files(&files)
        .map_err(|e| compile_error(e.to_string()))?;
    Ok(compiler.file_descriptor_set())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn every_install_layout_leads_to_the_bundle_and_its_version() {
        let root = tempfile::tempdir().expect("tempdir");
        let layouts = [
            ("mac/Cursor.app", "Contents/Resources/app"),
            ("linux/usr/share/cursor", "resources/app"),
            ("appimage", "squashfs-root/usr/share/cursor/resources/app"),
            ("windows/Programs/cursor", "resources/app"),
        ];
        for (install, app) in layouts {
            let app_dir = root.path().join(install).join(app);
            touch(
                &app_dir.join("extensions").join(BUNDLE_IN_EXTENSIONS),
                "var a;",
            );
            touch(&app_dir.join("product.json"), r#"{"version":"1.2.3"}"#);
            let found = locate(Some(&root.path().join(install))).expect(install);
            assert_eq!(
                found.bundle,
                app_dir.join("extensions").join(BUNDLE_IN_EXTENSIONS),
                "{install}"
            );
            assert_eq!(found.version.as_deref(), Some("1.2.3"), "{install}");
            // The extensions directory, the extension and the file itself work as well.
            let extensions = app_dir.join("extensions");
            for named in [
                extensions.clone(),
                extensions.join(EXTENSION),
                extensions.join(BUNDLE_IN_EXTENSIONS),
            ] {
                let again = locate(Some(&named)).expect("named");
                assert_eq!(again.bundle, found.bundle);
                assert_eq!(again.bundles, vec![found.bundle.clone()]);
                assert_eq!(again.version.as_deref(), Some("1.2.3"));
            }
        }
    }

    #[test]
    fn other_bundles_of_an_install_are_read_when_they_carry_protocol_types() {
        let root = tempfile::tempdir().expect("tempdir");
        let app = root.path().join("resources/app");
        let extensions = app.join("extensions");
        let main = extensions.join(BUNDLE_IN_EXTENSIONS);
        touch(&main, r#"x.typeName="agent.v1.A""#);
        let chunk = extensions.join("cursor-always-local/dist/chunks/7.js");
        touch(&chunk, r#"x.typeName="aiserver.v1.B""#);
        // A v2 descriptor: the package name only inside base64, here at the second alignment.
        let v2 = extensions.join("other/dist/extension.js");
        touch(&v2, &format!("y(\"{}\")", base64(b"\x12\x08agent.v1\x22")));
        touch(
            &extensions.join("other/dist/unrelated.js"),
            "var agent = 1;",
        );
        touch(
            &extensions.join("other/node_modules/dep/index.js"),
            r#""agent.v1.X""#,
        );
        let found = locate(Some(root.path())).expect("install");
        assert_eq!(found.bundles, vec![main, chunk, v2]);
    }

    #[test]
    fn the_record_gives_back_the_version_it_was_written_with() {
        let root = tempfile::tempdir().expect("tempdir");
        let found = Located {
            bundle: root.path().join("main.js"),
            bundles: vec![root.path().join("main.js")],
            app_dir: None,
            version: Some("2.3.4".into()),
        };
        touch(&root.path().join(RECORD_FILE), &record(&found, "abc"));
        assert_eq!(recorded_version(root.path()).as_deref(), Some("2.3.4"));
        touch(
            &root.path().join(RECORD_FILE),
            &record(
                &Located {
                    version: None,
                    ..found
                },
                "abc",
            ),
        );
        assert_eq!(recorded_version(root.path()), None);
    }

    #[test]
    fn a_directory_without_a_bundle_names_the_places_it_looked() {
        let root = tempfile::tempdir().expect("tempdir");
        let error = locate(Some(root.path())).expect_err("nothing there");
        let text = error.to_string();
        assert!(text.contains("no Cursor bundle there"), "{text}");
        assert!(text.contains("Contents/Resources/app/extensions"), "{text}");
    }

    #[test]
    fn product_json_cursor_version_wins_over_the_vs_code_version() {
        let root = tempfile::tempdir().expect("tempdir");
        touch(
            &root.path().join("product.json"),
            r#"{"version":"1.99.0","cursorVersion":"2.1.0"}"#,
        );
        assert_eq!(version_of(root.path()).as_deref(), Some("2.1.0"));
        touch(&root.path().join("product.json"), "not json");
        touch(&root.path().join("package.json"), r#"{"version":"0.9"}"#);
        assert_eq!(version_of(root.path()).as_deref(), Some("0.9"));
    }
}
