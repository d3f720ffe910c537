//! write: puts a rendered schema on disk atomically.
//!
//! Owns the swap: all files go into a fresh temporary directory beside the target (same parent, so `rename` is
//! atomic), are fsynced, and the directory is then renamed into place; an existing target is first renamed aside
//! and removed once the new one is in. On failure the temporary directory is removed and the target is left as
//! it was (an existing one is renamed back).

use std::fs::{self, File};
use std::io::{self, Write as _};
use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// Writing the schema failed; every variant names the path concerned.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{}: a schema directory needs a final path component", path.display())]
    BadDirectory { path: PathBuf },
    #[error("{name:?}: schema file names must be relative paths without `..`")]
    BadFileName { name: String },
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is in place but the previous schema could not be removed from {}: {source}", dir.display(), old.display())]
    RemoveOld {
        dir: PathBuf,
        old: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Writes `files` (`(relative name, text)`, names may contain `/`) as the complete content of `dir`,
/// replacing whatever was there. A [`WriteError::RemoveOld`] means the new schema is in place.
pub fn write_schema(dir: &Path, files: &[(String, String)]) -> Result<(), WriteError> {
    let name = dir.file_name().ok_or_else(|| WriteError::BadDirectory {
        path: dir.to_owned(),
    })?;
    let parent = match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).map_err(io_error("create", parent))?;
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let sibling = |tag: &str| {
        parent.join(format!(
            ".{}.{tag}-{}-{stamp}",
            name.to_string_lossy(),
            std::process::id()
        ))
    };
    let mut staging = Staging {
        path: sibling("new"),
        moved: false,
    };
    fs::create_dir(&staging.path).map_err(io_error("create", &staging.path))?;
    fill(&staging.path, files)?;

    let old = sibling("old");
    let had_old = dir.exists();
    if had_old {
        fs::rename(dir, &old).map_err(io_error("move aside", dir))?;
    }
    if let Err(source) = fs::rename(&staging.path, dir) {
        if had_old {
            // Best effort: put the previous schema back; the error reported is the failed swap.
            let _ = fs::rename(&old, dir);
        }
        return Err(WriteError::Io {
            action: "move into place",
            path: dir.to_owned(),
            source,
        });
    }
    staging.moved = true;
    sync_dir(parent)?;
    if had_old {
        fs::remove_dir_all(&old).map_err(|source| WriteError::RemoveOld {
            dir: dir.to_owned(),
            old,
            source,
        })?;
    }
    Ok(())
}

/// A temporary directory that is removed unless it was moved into place.
struct Staging {
    path: PathBuf,
    moved: bool,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.moved {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Writes and fsyncs every file, then fsyncs every directory created for them.
fn fill(root: &Path, files: &[(String, String)]) -> Result<(), WriteError> {
    let mut dirs = vec![root.to_owned()];
    for (name, text) in files {
        let relative = Path::new(name);
        let plain = relative
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
        if name.is_empty() || !plain {
            return Err(WriteError::BadFileName { name: name.clone() });
        }
        let path = root.join(relative);
        if let Some(parent) = path.parent().filter(|p| !dirs.iter().any(|d| d == p)) {
            fs::create_dir_all(parent).map_err(io_error("create", parent))?;
            dirs.extend(
                parent
                    .ancestors()
                    .take_while(|a| *a != root)
                    .map(Path::to_owned),
            );
        }
        let mut file = File::create(&path).map_err(io_error("create", &path))?;
        file.write_all(text.as_bytes())
            .map_err(io_error("write", &path))?;
        file.sync_all().map_err(io_error("fsync", &path))?;
    }
    dirs.sort();
    dirs.dedup();
    dirs.iter().try_for_each(|dir| sync_dir(dir))
}

/// Makes a directory's entries durable (a no-op where directories cannot be opened, e.g. Windows).
fn sync_dir(dir: &Path) -> Result<(), WriteError> {
    if cfg!(unix) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("fsync", dir))?;
    }
    Ok(())
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WriteError {
    let path = path.to_owned();
    move |source| WriteError::Io {
        action,
        path,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(text: &str) -> Vec<(String, String)> {
        vec![
            ("a.proto".into(), text.into()),
            ("google/protobuf/struct.proto".into(), "struct".into()),
        ]
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn writes_nested_files_into_a_new_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("proto");
        write_schema(&dir, &schema("one")).unwrap();
        assert_eq!(fs::read_to_string(dir.join("a.proto")).unwrap(), "one");
        assert_eq!(
            fs::read_to_string(dir.join("google/protobuf/struct.proto")).unwrap(),
            "struct"
        );
        assert_eq!(entries(tmp.path()), ["proto"]);
    }

    #[test]
    fn replaces_an_existing_directory_without_leftovers() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("proto");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("stale.proto"), "stale").unwrap();
        write_schema(&dir, &schema("two")).unwrap();
        assert_eq!(entries(&dir), ["a.proto", "google"]);
        assert_eq!(fs::read_to_string(dir.join("a.proto")).unwrap(), "two");
        assert_eq!(entries(tmp.path()), ["proto"]);
    }

    #[test]
    fn bad_file_name_leaves_the_old_schema_and_no_temp_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("proto");
        write_schema(&dir, &schema("old")).unwrap();
        let mut files = schema("new");
        files.push(("../escape.proto".into(), String::new()));
        let err = write_schema(&dir, &files).unwrap_err();
        assert!(
            matches!(err, WriteError::BadFileName { ref name } if name == "../escape.proto"),
            "{err}"
        );
        assert_eq!(fs::read_to_string(dir.join("a.proto")).unwrap(), "old");
        assert_eq!(entries(tmp.path()), ["proto"]);
    }

    #[test]
    fn io_errors_name_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let blocker = tmp.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = write_schema(&blocker.join("proto"), &schema("x")).unwrap_err();
        assert!(
            err.to_string().contains(&*blocker.to_string_lossy()),
            "{err}"
        );
    }
}
